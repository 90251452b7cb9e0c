"""``Task``: the awaitable result of one stream operation (event-loop side)."""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Generator
from typing import Any, Protocol

import anyio

from .._unique import Unique
from .admission import ENTRIES_PER_REQUEST
from .hooks import HOOKS
from .loop import LoopAdapter

__all__ = [
    "MAX_WAKES_PER_TURN",
    "READY_AWAITS_PER_CHECKPOINT",
    "FailureSink",
    "HostFunctionTask",
    "Task",
    "TaskOwner",
    "resolve_task",
]

#: awaits of already finished tasks (on one loop) between two checkpoints
READY_AWAITS_PER_CHECKPOINT = 128
#: coroutine wake-ups per loop turn, however they are spread over tasks (the deliveries' budget
#: too). 256, not 128: at saturation (256 launchers) half the loop turns, -25 % host CPU per
#: launch, with the loop's lag unchanged within noise (3 alternating runs each)
MAX_WAKES_PER_TURN = 256

_now = time.perf_counter


class FailureSink(Protocol):
    """Where a failed task's error waits until it is retrieved (``unseen.FailureLog``)."""

    def note(self, task: Task, exc: BaseException, kind: str, stream_ref: Any, waited: bool) -> Any:
        """``task`` failed (``waited``: coroutines were awaiting it, to raise its error): a
        record to hand back to :meth:`retrieved`, or None."""
        ...

    def retrieved(self, record: Any) -> None:
        """The error of ``record`` has been seen."""
        ...


class TaskOwner(Protocol):
    """What a task needs of its device (the ``Scheduler``): the loop it belongs to, where
    its failure waits until retrieved, and its timeouts' count."""

    adapter: LoopAdapter
    failures: FailureSink | None

    def count_timeout(self) -> None:
        """One more task failed with ``TaskTimeoutError`` outside the delivery queue."""


class TaskLane(Protocol):
    """What a task needs of its stream (``lane.Lane``)."""

    owner: TaskOwner
    stream_ref: Callable[[], Any]
    last: Any
    flushed: Any


class Task(Unique):
    """One submitted operation: a kernel launch, a copy, an event record or wait.

    ``await task`` returns ``None`` once the device has finished the work, or raises its typed
    error (``DeviceFaultError``, ``TaskTimeoutError``, a ``RuntimeAPIError`` if the runtime
    refused the submission, ``ClosedError`` if ``aclose(cancel=True)`` dropped it).

    Cancellation: cancelling an ``await task`` only stops that waiter. The work itself cannot be
    recalled: it runs to the end, everything it uses stays alive until then, and other waiters
    and :meth:`done` are unaffected. Any number of coroutines may await the same task.
    Awaiting a finished task returns at once, except that every 128th such await on a loop
    yields to the loop once (a checkpoint, where a cancellation can be delivered), so that
    awaiting thousands of finished tasks in a row does not hold the loop.

    An error nobody retrieves (no ``await``, no :meth:`exception`, no ``synchronize()`` that
    raised it) is logged at ERROR on the ``aio_ascend`` logger when the task is collected, or
    when its device closes.

    Timestamps, all ``time.perf_counter()`` seconds, ``None`` until known (read them; the
    scheduler writes each once):

    :ivar admitted_at: the request was admitted on its stream (the ``Task`` was created)
    :ivar submitted_at: its batch had been handed to the runtime (the submitter thread's last
        call for the batch, its completion event, returned): one value for every task of a
        batch; the device may start the batch's first tasks a little earlier. ``None`` if it
        was never submitted (refused, dropped, timed out before submission)
    :ivar completed_at: the poller observed it finished on the device (the batch's completion
        event; one poll round stamps all it completes). ``None`` if it failed without
        finishing (a fault, a timeout, a refusal)
    :ivar resumed_at: the first coroutine that was *waiting* for it resumed after it finished
        (so ``resumed_at - completed_at`` is the library's wake-up). ``None`` if nobody was
        waiting when it finished (an ``await`` of a finished task returns at once)
    :ivar captured: what active observers (``aio_ascend.tracing``, ``aio_ascend.metrics``)
        captured from the creating code; ``None`` when none was active
    :ivar kind: ``"launch"``, ``"copy_to_device"``, ``"copy_to_host"``, ``"copy_device"``,
        ``"memset"``, ``"record_event"``, ``"wait_event"`` or ``"host_func"`` (a host
        function: no batch, resolved when the function returned; ``submitted_at`` and
        ``completed_at`` stay ``None``)
    """

    # The scheduler's request objects (``work.Request``) are Tasks themselves: one object per
    # operation, the one a user awaits. Each kind is a subclass with its ``kind``.
    #
    # The scheduler's fields of a request are declared and set here too (``host``,
    # ``buffers``, ``entries``, ``closes_batch``, ``position``: see ``work.Request``), so that
    # making a request is one ``__init__`` call, not a chain of three (a launch is made for
    # every ``Stream.launch``: each Python call level costs about 0.1 us there).
    public_name = "Task"  # (its subclasses are the library's own)
    __slots__ = (
        "__weakref__",
        "_done",
        "_exc",
        "_retrievers",
        "_tb",
        "_unseen",
        "_waiters",
        "admitted_at",
        "buffers",
        "captured",
        "closes_batch",
        "completed_at",
        "entries",
        "host",
        "lane",
        "position",
        "resumed_at",
        "submitted_at",
    )
    kind = "task"
    #: the error's traceback when the task failed (set with ``_exc`` only: not on every launch)
    _tb: types.TracebackType | None
    #: a task of the library's own whose failure reaches the user through another task:
    #: never noted as unretrieved, never counted as a timeout of its own
    quiet = False

    def __init__(self, lane: TaskLane, host: Any = None, buffers: tuple[Any, ...] = ()) -> None:
        # its stream: through it the device's loop (``lane.owner.adapter``: the loop that
        # closes the device, if another one adopted it), where a failure is noted until its
        # error is retrieved (``lane.owner.failures``: see unseen.py), and the public stream
        # object (``lane.stream_ref``, a weak reference: the scheduler keeps tasks and must
        # not keep the public objects alive through them)
        self.lane = lane
        self._unseen: Any = None
        self._done = False
        self._exc: BaseException | None = None
        self._waiters: Any = None  # None, one waiter, or a list of them
        self._retrievers = 0  # waiters that will raise its error (``await``, not wait_finished)
        # one clock call per task: this runs for every launch (the four timestamps together
        # cost about 0.1 us per launch: docs/guide/observability.md, "What tracing costs")
        self.admitted_at: float = _now()
        self.submitted_at: float | None = None
        self.completed_at: float | None = None
        self.resumed_at: float | None = None
        capture = HOOKS.capture  # None unless an observer wants context (tracing, otel)
        self.captured: dict[Any, object] | None = None if capture is None else capture()
        # the request's (``work.Request`` documents them)
        self.host = host
        self.buffers = buffers
        self.entries = ENTRIES_PER_REQUEST  # until its batch is formed
        self.closes_batch = False
        self.position = -1

    @property
    def stream(self) -> Any:
        """The stream it was queued on (``None`` once that stream object is gone)."""
        return self.lane.stream_ref()

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
        failures = self.lane.owner.failures
        if unseen is not None and failures is not None:
            failures.retrieved(unseen)

    def __await__(self) -> Generator[Any, None, None]:
        # A generator, not ``wait().__await__()``: one coroutine object and frame less per
        # ``await task`` (the request-handler shape awaits every launch)
        if self._done:
            # Awaiting a finished task does not suspend; a coroutine that awaits thousands in
            # a row would hold the loop for tens of ms. Every READY_AWAITS_PER_CHECKPOINT-th
            # such await on a loop lets the loop run once (the loop lag this bounds is what
            # ``aio-ascend bench --only producer_lag`` reports).
            adapter = self.lane.owner.adapter
            adapter.ready_awaits += 1
            if adapter.ready_awaits >= READY_AWAITS_PER_CHECKPOINT:
                adapter.ready_awaits = 0
                yield from adapter.checkpoint().__await__()
        else:
            self._retrievers += 1
            try:
                yield from self._finished()
            finally:
                self._retrievers -= 1
        if self._exc is not None:
            if self._unseen is not None:
                self._retrieved()
            # with its traceback as it was when the task failed, as asyncio's futures do: a
            # raise adds the awaiting frames to it, and awaited again and again it would grow
            # without end, keeping every awaiter's frames (and their locals) alive
            raise self._exc.with_traceback(self._tb)

    async def wait(self) -> None:
        """The same as ``await task``."""
        await self

    async def wait_finished(self) -> None:
        """Wait until the task is done, successfully or not, without raising its error (a
        failure stays unretrieved: see the class docstring)."""
        if not self._done:
            await self._finished()

    @types.coroutine
    def _finished(self) -> Generator[Any, None, None]:
        # The one wait for the task to finish (``await task`` and ``wait_finished``).
        adapter = self.lane.owner.adapter
        if not adapter.is_current():
            raise adapter.foreign()
        waiter = adapter.new_waiter()
        # ``_waiters``: None, the one waiter (the usual case: no list made), or a list
        waiters = self._waiters
        if waiters is None:
            self._waiters = waiter
        elif type(waiters) is list:
            waiters.append(waiter)
        else:
            self._waiters = [waiters, waiter]
        try:
            yield from adapter.wait(waiter).__await__()
            if self.resumed_at is None:  # the first waiter to resume after the wake
                self.resumed_at = _now()
                if HOOKS.observers:
                    HOOKS.resumed(self)
        finally:
            if not self._done:  # cancelled: it waits no more
                waiters = self._waiters
                if waiters is waiter:
                    self._waiters = None
                elif type(waiters) is list:
                    with contextlib.suppress(ValueError):
                        waiters.remove(waiter)

    def _resolve(self, exc: BaseException | None) -> int:
        # Loop thread only, through resolve_task. Returns how many waiters it woke.
        if self._done:
            return 0
        self._done = True
        self._exc = exc
        if exc is not None:
            self._tb = exc.__traceback__
            lane = self.lane
            # The stream's latest task is kept for its waits only while unfinished: a failed
            # one's traceback may reach the user's frames (and the stream, and its device),
            # which the lane (the scheduler's, for as long as the device is open) would keep
            if lane.last is self:
                lane.last = None
            if lane.flushed is self:
                lane.flushed = None
            failures = lane.owner.failures
            if failures is not None and not self.quiet:
                self._unseen = failures.note(
                    self, exc, self.kind, lane.stream_ref, self._retrievers > 0
                )
        waiters = self._waiters
        if waiters is None:
            return 0
        self._waiters = None
        adapter = self.lane.owner.adapter
        wake = adapter.wake
        if type(waiters) is not list:
            wake(waiters)
            return 1
        if len(waiters) > MAX_WAKES_PER_TURN:
            # Thousands of coroutines awaiting one task (or Event): waking them all in this
            # callback would hold the loop for tens of ms. The rest go a chunk per loop turn.
            adapter.call_soon(_wake_rest, adapter, waiters, MAX_WAKES_PER_TURN)
            waiters = waiters[:MAX_WAKES_PER_TURN]
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


class HostFunctionTask(Task):
    """A host function's task (``Stream.launch_host_func``): no batch, resolved when ``fn``
    returned, or earlier when it runs past ``task_timeout`` or a close gives up on it.

    :ivar returned: set once ``fn`` has returned (or will never run, or its stream or device
        was closed under it): the stream's later work waits for this, not for the task, so a
        host function failed by the watchdog while it still runs keeps its place in order
    """

    __slots__ = ("returned",)
    kind = "host_func"

    def __init__(self, lane: TaskLane) -> None:
        super().__init__(lane)
        self.returned = anyio.Event()

    def time_out(self, error: BaseException) -> None:
        """Fail it with ``error``, a ``TaskTimeoutError`` (``task_timeout``'s, or a close
        that gives up on it), counted once as the device's timeouts are, unless it is done;
        ``fn`` may run on (a thread cannot be stopped)."""
        if not self._done:
            self.lane.owner.count_timeout()
            self._resolve(error)

    def give_up(self, error: BaseException) -> None:
        """Its stream's forced close gives up on it (unless it is done): timed out with
        ``error`` and no longer holding the stream (the device's close waits for ``fn``)."""
        if not self._done:
            self.time_out(error)
            self.returned.set()


def _wake_rest(adapter: LoopAdapter, waiters: list[Any], start: int) -> None:
    # A later loop turn: the next chunk of a task's waiters (a cancelled one is skipped).
    end = start + MAX_WAKES_PER_TURN
    if end < len(waiters):
        adapter.call_soon(_wake_rest, adapter, waiters, end)
    wake = adapter.wake
    for waiter in waiters[start:end]:
        wake(waiter)


#: Finish a task with an error or ``None``; returns how many waiters it woke (loop thread).
#: The scheduler's one way to complete a Task: users get no ``set_result`` to misuse.
resolve_task: Callable[[Task, BaseException | None], int] = Task._resolve  # noqa: SLF001 - the one sanctioned way in; see the comment above
