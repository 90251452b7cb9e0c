"""Working beside torch_npu: its streams kept in order with ours, and events made elsewhere.

torch_npu (Ascend/pytorch) does not launch an op when Python calls it: with its task queue on
(``TASK_QUEUE_ENABLE``, the default) the op goes into a queue that a torch_npu thread empties
onto the runtime stream later (``torch_npu/csrc/core/npu/NPUQueue.cpp``). Reading a stream's
``npu_stream`` calls ``NPUStream::stream()`` (``torch_npu/csrc/core/npu/NPUStream.cpp``), which
first waits until that queue is empty (``Repository::MakeSureQueueEmpty``; the queue of the
stream, or the device's one queue without per-stream queues); a ``SyncLaunchStream``
(``is_sync_launch``) has no queue and returns at once.

So two things order aio_ascend's work with torch's on the same runtime stream, and
:class:`TorchOrder` does both for every operation of a stream opened with
``dev.external_stream(torch_stream)``:

- *torch's earlier ops before ours*: ``npu_stream`` is read again just before the operation is
  queued, so everything torch had queued is on the runtime stream before our submitter adds
  to it;
- *our op before torch's later ones*: the call returns only once the operation has been handed
  to the runtime (the submitter thread reports it: ``_sched/handover.py``), so a torch op
  issued after the call returns is launched by torch's thread after it.

The drain blocks the event loop's thread while torch_npu's queue empties, GIL held (see
:meth:`TorchOrder.before`): a torch queue that cannot empty (its runtime stream full behind a
kernel that never ends) stops the loop as any blocking torch call made on it would.
"""

from __future__ import annotations

import operator
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import anyio

from ._errors import ClosedError
from ._runtime.abi import ACL_EVENT_RECORDED_STATUS_COMPLETE, PTR_MAX
from ._sched.events import EventRecord
from ._sched.handover import Handover
from ._sched.scheduler import DeviceState, Scheduler

if TYPE_CHECKING:
    from ._sched.loop import LoopAdapter
    from ._sched.task import Task
    from ._sched.work import Request

__all__ = ["ExternalEvent", "TorchOrder", "event_handle", "stream_handle"]

_HANDLE_ATTRS = ("npu_stream", "cuda_stream")
#: host polling of a foreign event: from 50 us, doubling up to 2 ms
_POLL_FIRST_S = 50e-6
_POLL_MAX_S = 2e-3


def stream_handle(stream: object) -> tuple[int, object | None]:
    """``external_stream``'s argument: (the runtime handle, the stream object or ``None`` for
    a plain handle). An object with ``npu_stream`` (torch_npu) or ``cuda_stream`` (torch.cuda,
    CuPy) is read for its handle, which drains a torch_npu stream's task queue."""
    if isinstance(stream, bool):
        raise TypeError("external_stream(): a bool is not a stream handle")
    if not isinstance(stream, int):
        for attr in _HANDLE_ATTRS:
            value = getattr(stream, attr, None)
            if value is not None:
                try:
                    handle = operator.index(value)
                except TypeError:
                    raise TypeError(
                        f"external_stream(): {type(stream).__name__}.{attr} is not an int"
                    ) from None
                return _checked_handle("external_stream", handle, "a stream"), stream
    try:
        handle = operator.index(stream)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            "external_stream() takes a stream handle (an int) or a stream object with an "
            f"npu_stream or cuda_stream attribute, got {type(stream).__name__}"
        ) from None
    return _checked_handle("external_stream", handle, "a stream"), None


def _checked_handle(call: str, handle: int, what: str) -> int:
    # A runtime handle is a pointer: 1..PTR_MAX (checked here, before anything is queued)
    if not 0 < handle <= PTR_MAX:
        raise ValueError(f"{call}(): {handle} is not {what} handle (1..{PTR_MAX:#x})")
    return handle


def event_handle(event: object) -> int:
    """``external_event``'s argument: a runtime event handle, or an object with ``npu_event``
    (torch_npu) or ``cuda_event`` (torch.cuda) read for it."""
    if isinstance(event, bool):
        raise TypeError("external_event(): a bool is not an event handle")
    value = event
    if not isinstance(event, int):
        for attr in ("npu_event", "cuda_event"):
            if hasattr(event, attr):
                value = getattr(event, attr)
                break
    try:
        handle = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            "external_event() takes an event handle (an int) or an event object with an "
            f"npu_event or cuda_event attribute, got {type(event).__name__}"
        ) from None
    if handle <= 0:
        raise ValueError(
            f"external_event(): {handle} is not an event handle (a torch event has none until "
            "it is first recorded)"
        )
    return _checked_handle("external_event", handle, "an event")


def _read_handle(owner: object) -> object:
    # Reading it is the drain: NPUStream::stream() empties torch_npu's task queue first
    for attr in _HANDLE_ATTRS:
        value = getattr(owner, attr, None)
        if value is not None:
            return value
    return None


class TorchOrder:
    """The handshake of one external stream with the framework that owns it (see the module
    docstring): :meth:`before` each operation is admitted, :meth:`queue` to queue it."""

    def __init__(self, owner: object, handle: int, adapter: LoopAdapter) -> None:
        self._owner = owner
        self.handle = handle
        #: what the submitter tells of this stream's requests (``Lane.handover``)
        self.handover = Handover(adapter)

    def before(self) -> None:
        """Drain the owner's queue: its ops queued so far reach the runtime stream now.

        This blocks the calling thread (the loop's) until torch_npu's queue thread has
        launched them, and torch_npu keeps the GIL meanwhile (``Repository::
        MakeSureQueueEmpty`` in ``NPUQueue.cpp`` lets it go only for aclop compilation), so
        another thread would not spare the loop the wait: the drain is done here, where its
        cost is visible."""
        handle = _read_handle(self._owner)
        if handle != self.handle:
            raise RuntimeError(
                f"external stream {self.handle:#x}: its owner now reports {handle!r}; open a "
                "new external_stream for it"
            )

    async def queue(self, request: Request, scheduler: Scheduler) -> Task:
        """Queue the admitted ``request`` and return its Task once the submitter has handed it
        to the runtime (or refused it): a torch op the caller issues next cannot overtake it.

        The wait runs to its end whatever cancels the caller, asyncio's own cancellation
        included: the operation is queued and will run. A cancellation by an anyio or trio
        scope is held off by the shield until the caller's next checkpoint (the call returns
        the Task); asyncio's own (``Task.cancel``, ``asyncio.timeout``, ``wait_for``) is
        raised from the call once the wait is over, and the Task is not returned: deferring
        it to the next await instead would outlive the scope that asked for it on CPython
        before 3.13 (``uncancel`` leaves the request pending there). The wait normally ends
        within a hop of the submitter; while the submitter is inside a runtime call that
        blocks (the runtime stream full of torch's work behind a long kernel), it lasts as
        long as that call."""
        handover = self.handover
        expected = handover.expect(request)
        try:
            task = scheduler.enqueue(request)
        except BaseException:
            handover.forget(request)
            raise
        return await scheduler.adapter.shielded(handover.wait, expected, task)


class ExternalEvent(EventRecord):
    """A runtime event created and recorded elsewhere (torch_npu, another library), made
    usable here: ``await stream.wait_event(ext)`` makes a stream wait for it on the device
    (the returned Task completes once the stream is past it), ``ext.query()`` asks the
    runtime whether it has completed, and ``await ext`` waits for that on the host.

    Made by ``dev.external_event(handle_or_event, *, after=None)``. It is never destroyed
    here. A runtime wait is for the event's latest record *when the wait is submitted*: a
    record still queued in torch_npu's task queue is not seen yet, so pass ``after=`` the
    torch stream the event is recorded on (it is drained before every use).

    :ivar handle: the runtime event handle
    :ivar device: the device
    """

    __slots__ = ("__weakref__", "_after", "_scheduler", "device")

    def __init__(
        self, device: object, scheduler: Scheduler, handle: int, after: object | None
    ) -> None:
        super().__init__(handle, 0)
        self.recorded = True  # someone else records it: a wait is always submitted
        self.device = device
        self._scheduler = scheduler
        self._after = after

    def drain(self) -> None:
        """Make the owner's queued record reach the runtime first (see ``after=``)."""
        if self._after is not None:
            _read_handle(self._after)

    def query(self) -> bool:
        """Whether the event's latest record has completed on the device (a runtime call).

        :raises RuntimeError: called from another thread than the device's event loop's
        """
        self._check()
        self.drain()
        return self._complete()

    def _check(self) -> None:
        scheduler = self._scheduler
        scheduler.adapter.check_thread()
        scheduler.check_open()

    def _complete(self) -> bool:
        status = self._scheduler.bound().query_event_status(self.handle)
        return status == ACL_EVENT_RECORDED_STATUS_COMPLETE

    def __await__(self) -> Generator[Any, None, None]:
        return self._wait().__await__()

    async def _wait(self) -> None:
        # Host polling with backoff: an event of someone else's has no batch in our poller.
        # Drained once: the wait is for the record queued before it, not for later ones.
        delay = _POLL_FIRST_S
        if self.query():
            return
        while True:
            await anyio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
            if self._scheduler.state is not DeviceState.OPEN:
                raise ClosedError("the device closed while waiting for an external event")
            if self._complete():
                return

    def __repr__(self) -> str:
        return f"<ExternalEvent {self.handle:#x}>"
