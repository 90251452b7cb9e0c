"""``Event``: a point in a stream's work, for cross-stream dependencies and timing."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ._errors import ClosedError
from ._runtime.abi import ACL_EVENT_RECORDED_STATUS_COMPLETE, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE
from ._sched.events import EventRecord
from ._sched.scheduler import DeviceState, Scheduler
from ._sched.task import Task
from ._unique import Unique

#: how long elapsed_ms() waits on each of its two events, which are complete already (ms)
ELAPSED_SYNC_MS = 1000

__all__ = ["Event", "event_flags"]


def event_flags(timing: bool) -> int:
    """The Ex event flags of a user event: SYNC (others wait on it), TIME_LINE if timed."""
    return ACL_EVENT_SYNC | (ACL_EVENT_TIME_LINE if timing else 0)


class Event(EventRecord, Unique):
    """A point in a stream's work, for cross-stream dependencies and timing.

    Created by ``await stream.record_event(timing=False)``. ``await event`` waits until the
    work recorded before it is done; ``other.wait_event(event)`` makes another stream wait for
    it on the device, without the host in between. With ``timing=True``,
    ``start.elapsed_ms(end)`` gives the device time between two events.

    :ivar stream: the stream it was recorded on
    :ivar device: the device
    :ivar timing: whether it was recorded with timing
    """

    __slots__ = ("__weakref__", "_record_task", "_scheduler", "device", "stream", "timing")

    def __init__(
        self,
        device: object,
        scheduler: Scheduler,
        stream: object,
        handle: int,
        timing: bool,
        record_task: Task,
    ) -> None:
        super().__init__(handle, event_flags(timing))
        self.device = device
        self.stream = stream
        self.timing = timing
        self._scheduler = scheduler
        self._record_task = record_task
        device._object_finalizers.finalize(self, scheduler.retire_event, handle, self.flags)  # type: ignore[attr-defined]  # noqa: SLF001

    def __await__(self) -> Generator[Any, None, None]:
        return self._record_task.wait().__await__()

    def done(self) -> bool:
        """Whether the recorded work has been observed complete."""
        return self._record_task.done()

    def query(self) -> bool:
        """Whether the work before the event is complete, asking the runtime if needed.

        :raises RuntimeError: called from another thread than the device's event loop's
        """
        self._scheduler.adapter.check_thread()
        if self._record_task.done():
            return self.failure() is None
        if not self.recorded:
            return False
        self._scheduler.check_open()
        status = self._scheduler.bound().query_event_status(self.handle)
        return status == ACL_EVENT_RECORDED_STATUS_COMPLETE

    def elapsed_ms(self, end: Event) -> float:
        """Device milliseconds from this event to ``end`` (both recorded with ``timing=True``).

        :raises ValueError: if either event was recorded without timing or is not complete yet
        :raises RuntimeError: called from another thread than the device's event loop's
        """
        self._scheduler.adapter.check_thread()
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_ms() takes an Event, got {type(end).__name__}")
        if end.device is not self.device:
            raise ValueError("elapsed_ms(): the events belong to different devices")
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms() needs both events recorded with timing=True")
        if not (self.done() and end.done()):
            raise ValueError("elapsed_ms() needs both events complete (await them first)")
        for event in (self, end):
            failure = event.failure()
            if failure is not None:
                raise ValueError("elapsed_ms(): an event failed") from failure
        if self._scheduler.state is DeviceState.CLOSED:
            raise ClosedError("elapsed_ms(): the device is closed")
        runtime = self._scheduler.bound()
        for event in (self, end):
            # The real runtime sets a time-line event's timestamp when it reads that record's
            # completion, which only a wait on (or a query of) the event itself does
            # (hicann/runtime event.cc:896-905); the library knew both complete from its own
            # later event, so without this the elapsed time is 107006, timestamp invalid
            # (event.cc:1264-1269). Both are complete: this returns at once.
            runtime.synchronize_event(event.handle, ELAPSED_SYNC_MS)
        return runtime.event_elapsed_time(self.handle, end.handle)

    def failure(self) -> BaseException | None:
        """Why the recording failed, once it is done (``None`` if it succeeded or is pending)."""
        task = self._record_task
        return task.exception() if task.done() else None

    def __repr__(self) -> str:
        return f"<Event {self.handle:#x} {'done' if self.done() else 'pending'}>"
