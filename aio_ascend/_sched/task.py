"""``Task``: the awaitable result of one stream operation (event-loop side)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

from .loop import LoopAdapter

__all__ = ["FailureSink", "Task", "resolve_task"]


class FailureSink(Protocol):
    """Where a failed task's error waits until it is retrieved (``unseen.FailureLog``)."""

    def note(self, task: Task, exc: BaseException, kind: str, stream_ref: Any) -> Any:
        """``task`` failed: a record to hand back to :meth:`retrieved`, or None."""
        ...

    def retrieved(self, record: Any) -> None:
        """The error of ``record`` has been seen."""
        ...


class Task:
    """One submitted operation: a kernel launch, a copy, an event record or wait.

    ``await task`` returns ``None`` once the device has finished the work, or raises its typed
    error (``DeviceFaultError``, ``TaskTimeoutError``, a ``RuntimeAPIError`` if the runtime
    refused the submission, ``ClosedError`` if ``aclose(cancel=True)`` dropped it).

    Cancellation: cancelling an ``await task`` only stops that waiter. The work itself cannot be
    recalled: it runs to the end, everything it uses stays alive until then, and other waiters
    and :meth:`done` are unaffected. Any number of coroutines may await the same task.

    An error nobody retrieves (no ``await``, no :meth:`exception`, no ``synchronize()`` that
    raised it) is logged at ERROR on the ``aio_ascend`` logger when the task is collected, or
    when its device closes.

    :ivar kind: ``"launch"``, ``"copy_to_device"``, ``"copy_to_host"``, ``"copy_device"``,
        ``"memset"``, ``"record_event"`` or ``"wait_event"``
    """

    __slots__ = (
        "__weakref__",
        "_adapter",
        "_done",
        "_exc",
        "_failures",
        "_stream_ref",
        "_unseen",
        "_waiters",
        "kind",
    )

    def __init__(
        self,
        adapter: LoopAdapter,
        stream_ref: Callable[[], Any],
        kind: str,
        failures: FailureSink | None = None,
    ) -> None:
        self._adapter = adapter
        # where a failure is noted until its error is retrieved (see unseen.py)
        self._failures = failures
        self._unseen: Any = None
        # a weak reference: the scheduler keeps tasks (a stream's latest) and must not keep
        # the public objects alive through them
        self._stream_ref = stream_ref
        self.kind = kind
        self._done = False
        self._exc: BaseException | None = None
        self._waiters: list[Any] | None = None

    @property
    def stream(self) -> Any:
        """The stream it was queued on (``None`` once that stream object is gone)."""
        return self._stream_ref()

    def done(self) -> bool:
        """Whether the task has finished (successfully or not)."""
        return self._done

    def exception(self) -> BaseException | None:
        """The task's error, or ``None`` if it succeeded.

        :raises RuntimeError: if the task is not done yet
        """
        if not self._done:
            raise RuntimeError("Task.exception(): the task is not done yet")
        if self._unseen is not None:
            self._retrieved()
        return self._exc

    def _retrieved(self) -> None:
        unseen, self._unseen = self._unseen, None
        if unseen is not None and self._failures is not None:
            self._failures.retrieved(unseen)

    def __await__(self) -> Generator[Any, None, None]:
        return self.wait().__await__()

    async def wait(self) -> None:
        """The same as ``await task``."""
        await self.wait_finished()
        if self._exc is not None:
            if self._unseen is not None:
                self._retrieved()
            raise self._exc

    async def wait_finished(self) -> None:
        """Wait until the task is done, successfully or not, without raising its error (a
        failure stays unretrieved: see the class docstring)."""
        if self._done:
            return
        adapter = self._adapter
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

    def _resolve(self, exc: BaseException | None) -> int:
        # Loop thread only, through resolve_task. Returns how many waiters it woke.
        if self._done:
            return 0
        self._done = True
        self._exc = exc
        if exc is not None and self._failures is not None:
            self._unseen = self._failures.note(self, exc, self.kind, self._stream_ref)
        waiters = self._waiters
        if not waiters:
            return 0
        self._waiters = None
        wake = self._adapter.wake
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


#: Finish a task with an error or ``None``; returns how many waiters it woke (loop thread).
#: The scheduler's one way to complete a Task: users get no ``set_result`` to misuse.
resolve_task: Callable[[Task, BaseException | None], int] = Task._resolve  # noqa: SLF001 - the one sanctioned way in; see the comment above
