"""``Task`` and ``Event``: the awaitable results of stream operations (event-loop side)."""

from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError
from .._runtime.abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_SYNC,
    ACL_EVENT_TIME_LINE,
)

if TYPE_CHECKING:
    from .._device import Device
    from .._stream import Stream

__all__ = ["Event", "Task"]


def _event_flags(timing: bool) -> int:
    """The Ex event flags of a user event: SYNC (others wait on it), TIME_LINE if timed."""
    return ACL_EVENT_SYNC | (ACL_EVENT_TIME_LINE if timing else 0)


class Task:
    """One submitted operation: a kernel launch, a copy, an event record or wait.

    ``await task`` returns ``None`` once the device has finished the work, or raises its typed
    error (``DeviceFaultError``, ``TaskTimeoutError``, a ``RuntimeAPIError`` if the runtime
    refused the submission, ``ClosedError`` if ``aclose(cancel=True)`` dropped it).

    Cancellation: cancelling an ``await task`` only stops that waiter. The work itself cannot be
    recalled: it runs to the end, everything it uses stays alive until then, and other waiters
    and :meth:`done` are unaffected. Any number of coroutines may await the same task.
    """

    __slots__ = ("__weakref__", "_device", "_done", "_exc", "_waiters", "kind", "stream")

    def __init__(self, device: Device, stream: Stream, kind: str) -> None:
        self._device = device
        self.stream = stream
        self.kind = kind
        self._done = False
        self._exc: BaseException | None = None
        self._waiters: list[Any] | None = None

    def done(self) -> bool:
        """Whether the task has finished (successfully or not)."""
        return self._done

    def exception(self) -> BaseException | None:
        """The task's error, or ``None`` if it succeeded.

        :raises RuntimeError: if the task is not done yet
        """
        if not self._done:
            raise RuntimeError("Task.exception(): the task is not done yet")
        return self._exc

    def __await__(self) -> Generator[Any, None, None]:
        return self._wait().__await__()

    async def _wait(self) -> None:
        if not self._done:
            adapter = self._device._adapter
            if not adapter.is_current():
                raise RuntimeError("this Task belongs to a device opened in a different event loop")
            waiter = adapter.new_waiter()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            try:
                await adapter.wait(waiter)
            finally:
                if not self._done and self._waiters is not None:
                    try:
                        self._waiters.remove(waiter)
                    except ValueError:
                        pass
        if self._exc is not None:
            raise self._exc

    def _resolve(self, exc: BaseException | None) -> int:
        # Loop thread only. Returns how many waiters it woke.
        if self._done:
            return 0
        self._done = True
        self._exc = exc
        waiters = self._waiters
        if not waiters:
            return 0
        self._waiters = None
        wake = self._device._adapter.wake
        for waiter in waiters:
            wake(waiter)
        return len(waiters)

    def __repr__(self) -> str:
        if not self._done:
            state = "pending"
        elif self._exc is None:
            state = "done"
        else:
            state = f"failed: {type(self._exc).__name__}"
        return f"<Task {self.kind} {state}>"


class Event:
    """A point in a stream's work, for cross-stream dependencies and timing.

    Created by ``await stream.record_event(timing=False)``. ``await event`` waits until the
    work recorded before it is done; ``other.wait_event(event)`` makes another stream wait for
    it on the device, without the host in between. With ``timing=True``,
    ``start.elapsed_ms(end)`` gives the device time between two events.
    """

    __slots__ = (
        "__weakref__",
        "_device",
        "_record_error",
        "_record_task",
        "_recorded_on_device",
        "handle",
        "stream",
        "timing",
    )

    def __init__(
        self, device: Device, stream: Stream, handle: int, timing: bool, record_task: Task
    ) -> None:
        self._device = device
        self.stream = stream
        self.handle = handle
        self.timing = timing
        self._record_task = record_task
        self._recorded_on_device = False
        self._record_error: BaseException | None = None
        weakref.finalize(self, device._retire_user_event, handle, _event_flags(timing))

    def __await__(self) -> Generator[Any, None, None]:
        return self._record_task._wait().__await__()

    def done(self) -> bool:
        """Whether the recorded work has been observed complete."""
        return self._record_task.done()

    def query(self) -> bool:
        """Whether the work before the event is complete, asking the runtime if needed."""
        if self._record_task.done():
            return self._record_task._exc is None
        if not self._recorded_on_device:
            return False
        self._device._check_open()
        status = self._device._rt().query_event_status(self.handle)
        return status == ACL_EVENT_RECORDED_STATUS_COMPLETE

    def elapsed_ms(self, end: Event) -> float:
        """Device milliseconds from this event to ``end`` (both recorded with ``timing=True``).

        :raises ValueError: if either event was recorded without timing or is not complete yet
        """
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_ms() takes an Event, got {type(end).__name__}")
        if end._device is not self._device:
            raise ValueError("elapsed_ms(): the events belong to different devices")
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms() needs both events recorded with timing=True")
        if not (self.done() and end.done()):
            raise ValueError("elapsed_ms() needs both events complete (await them first)")
        for event in (self, end):
            if event._record_task._exc is not None:
                raise ValueError("elapsed_ms(): an event failed") from event._record_task._exc
        if self._device._state == "closed":
            raise ClosedError("elapsed_ms(): the device is closed")
        return self._device._rt().event_elapsed_time(self.handle, end.handle)

    def __repr__(self) -> str:
        return f"<Event {self.handle:#x} {'done' if self.done() else 'pending'}>"
