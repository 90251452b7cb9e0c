"""Device faults: the first one is sticky, and who gets which error.

In stop-on-failure mode one fault halts the device context: the first fault is kept for the
device; every other unfinished or later task fails with a :class:`DeviceFaultError` whose
cause is that first fault. The functions here decide which error each request gets; the
threads only carry that out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .._errors import DeviceFaultError, RuntimeAPIError, derived_error
from .work import Batch, Delivery, Outcome, Request

__all__ = ["FaultState", "as_device_fault", "classify_refusal", "fail_batches"]


def as_device_fault(exc: BaseException) -> DeviceFaultError:
    """``exc`` (a failure that means the device context is broken) as a DeviceFaultError."""
    if isinstance(exc, DeviceFaultError):
        return exc
    fault = DeviceFaultError(
        f"device context failed: {getattr(exc, 'message', '') or exc!r}",
        code=getattr(exc, "code", None),
        func=getattr(exc, "func", None),
    )
    fault.__cause__ = exc
    return fault


class FaultState:
    """The device's first fault, shared by the loop and the library threads."""

    __slots__ = ("_lock", "first")

    def __init__(self) -> None:
        self.first: BaseException | None = None
        self._lock = threading.Lock()

    def note(self, exc: BaseException) -> BaseException:
        """Record ``exc`` as the fault if it is the first; return the first fault."""
        with self._lock:
            if self.first is None:
                self.first = exc
            return self.first


def classify_refusal(
    exc: BaseException, faults: FaultState, context_is_healthy: Callable[[], bool]
) -> BaseException:
    """The error a refused submission stands for: the device fault, or a plain refusal.

    A refusal whose code is no known fault code may still come from a faulted context
    (stop-on-failure refuses all new work with the fault's code): ``context_is_healthy`` asks
    the runtime. A fault that is not the first is reported as caused by the first.
    """
    if not isinstance(exc, DeviceFaultError):
        if not isinstance(exc, RuntimeAPIError) or context_is_healthy():
            return exc
        exc = as_device_fault(exc)
    first = faults.note(exc)
    return exc if first is exc else derived_error(first, "device faulted earlier")


#: a task id no report names (the runtime's "no task", and ours for "not known")
NO_TASK = 0xFFFFFFFF


def fail_batches(
    batches: Iterable[Batch],
    fault: BaseException,
    first: BaseException,
    site: tuple[int, int] | None = None,
    *,
    ordered: bool = False,
) -> list[Delivery]:
    """Deliveries for every request of ``batches`` after ``fault`` broke the context.

    None of them is a success: a fault report says which task failed, never which finished
    (the runtime's ids wrap and count its own tasks too); what finished was delivered by the
    event queries before. Only where the ids are ``ordered`` (each stream's tasks counted in
    submission order: the sim) are the stream's requests before the reported one finished.
    With a report ``site`` (stream handle, task id): the request whose
    recorded runtime id (``position``) is exactly that id gets the device's first fault; if the
    stream's requests carry no ids (the runtime cannot tell: CANN 8.0), the first of that
    stream's requests gets it. Without a report: the first request gets the first fault when
    ``fault`` is it. Everybody else gets a DeviceFaultError caused by the first fault.
    """
    batches = list(batches)
    requests = [request for batch in batches for request in batch.requests]
    # work the watchdog failed already: only its slot goes back (as the device finishing it)
    late = {request for batch in batches if batch.timed_out for request in batch.requests}
    blamed: object | None = None
    if site is not None and site[1] != NO_TASK:
        on_stream = [request for request in requests if request.lane.handle == site[0]]
        exact = [request for request in on_stream if request.position == site[1]]
        if exact:
            blamed = exact[0]
        elif on_stream and all(request.position < 0 for request in on_stream):
            blamed = on_stream[0]  # no ids to match: the first fault for the stream
    elif site is None and first is fault and requests:
        blamed = requests[0]
    deliveries: list[Delivery] = []
    for request in requests:
        error: BaseException | None
        if request is blamed:
            error = first
        elif ordered and site is not None and _before(request, site):
            error = None  # finished before the fault, on a FIFO stream
        else:
            error = derived_error(first, "device faulted")
        outcome = Outcome.FINISHED_LATE if request in late else Outcome.FINISHED
        deliveries.append((request, error, outcome))
    return deliveries


def _before(request: Request, site: tuple[int, int]) -> bool:
    return request.lane.handle == site[0] and 0 <= request.position < site[1]
