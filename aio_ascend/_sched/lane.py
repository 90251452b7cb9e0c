"""``Lane``: the scheduler's side of one stream (its handle, admission and latest task)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .admission import Admission

if TYPE_CHECKING:
    from .handover import Handover
    from .task import Task

__all__ = ["Lane"]


class Lane:
    """One runtime stream as the scheduler sees it.

    :ivar handle: the runtime stream
    :ivar admission: the stream's bounds (requests, runtime queue entries) and its waiters
    :ivar closed: no new request is admitted
    :ivar last: the latest task queued on it (``synchronize`` waits for it)
    :ivar flushed: the latest task handed to the submitter (``last`` once its unsubmitted
        requests are dropped)
    :ivar external: the runtime stream belongs to someone else (never destroyed here)
    :ivar forced: closed by force: the submitter fails its requests instead of submitting them
    :ivar stranded: ``None``, or why its queue can run nothing more (it waits for an event whose
        record a forced close dropped: ``forcing.strand``, on the poller thread): new requests
        are refused with it as cause
    :ivar force: the forced close of the stream alone under way (``Scheduler.close_lane``)
    :ivar destroyed: its runtime stream was destroyed, or is to be by the prober after its
        probe (``Prober.retire``, the one place that sets it)
    :ivar owner: the device's scheduler (its tasks' loop and failure log: ``task.TaskOwner``)
    :ivar stream_ref: a weak reference to the public stream object (``None`` when it is gone)
    :ivar handover: told by the submitter as each request is submitted or refused, where
        callers wait for that (a stream shared with torch_npu: ``handover.Handover``)
    """

    __slots__ = (
        "admission",
        "closed",
        "destroyed",
        "external",
        "flushed",
        "force",
        "forced",
        "handle",
        "handover",
        "last",
        "owner",
        "stranded",
        "stream_ref",
        "submitted",
    )

    def __init__(
        self, handle: int, max_in_flight: int, entry_budget: int, *, external: bool = False
    ) -> None:
        self.handle = handle
        self.external = external
        self.admission = Admission(max_in_flight, entry_budget)
        self.closed = False
        self.forced = False
        self.stranded: BaseException | None = None
        self.force: Any = None  # a forcing.LaneForce (forcing.py imports this module)
        self.destroyed = False
        self.last: Task | None = None
        self.flushed: Task | None = None
        self.owner: Any = None  # set by the scheduler that opens it
        self.stream_ref: Callable[[], Any] = _no_stream  # set by its public stream
        #: runtime tasks submitted to the stream so far (the submitter thread's count)
        self.submitted = 0
        self.handover: Handover | None = None

    def hold_for(self, task: Task) -> None:
        """``task`` (a host function, resolved outside the threads) is the stream's latest:
        ``synchronize``, ``query`` and the stream's close wait for it (loop thread)."""
        self.last = task

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Lane {self.handle:#x} {state} {self.admission!r}>"


def _no_stream() -> None:
    return None
