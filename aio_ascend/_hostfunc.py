"""Host functions in stream order (``Stream.launch_host_func``), emulated on every backend.

``aclrtLaunchHostFunc`` and ``aclrtLaunchCallback`` exist, but the first stalls the stream on
every launch through a runtime-owned thread, the second needs a thread subscribed per stream
(``aclrtSubscribeReport``), neither exists on CANN releases before 8.0's successors in the
same form, the sim and the cuda backend have neither, and a callback must not call the
runtime. So one mechanism serves every backend, built on the operations the scheduler already
has:

1. an event is recorded on the stream after the work queued so far;
2. once the poller has seen it complete, ``fn()`` runs on the device's host-function thread
   (``aio_ascend-hostfunc-<id>``: one per device, started with the first host function, so
   host functions of one device run one at a time, in the order their events completed, as
   ``aclrtLaunchHostFunc``'s per-context thread runs them);
3. meanwhile the stream is *held*: later operations on it wait (as a full stream makes them
   wait) until ``fn`` has returned, so work queued after the host function starts after it,
   as in CUDA's ``cuLaunchHostFunc``. Other streams are not held.

The price of the hold is one round trip device -> poller -> loop -> host-function thread ->
loop before the stream's next work is submitted (the same stall ``aclrtLaunchHostFunc`` has).

Observers (tracing, metrics) are told of each finished host function as a delivery of its
stream (a :class:`~aio_ascend._sched.hooks.HostCall`: handed to the thread -> returned), by
the runner, not by the scheduler's delivery queue: plain launches pay nothing for it.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from ._errors import ClosedError, TaskTimeoutError, derived_error
from ._sched.forcing import gave_up
from ._sched.hooks import HOOKS, HostCall, Source
from ._sched.loop import LoopAdapter
from ._sched.shutdown import IdleWait, join
from ._sched.task import HostFunctionTask, resolve_task
from ._sched.work import Outcome

if TYPE_CHECKING:
    from ._event import Event

__all__ = ["ASYNC_FN", "HostFuncs", "host_funcs", "observed_as", "spawn"]

log = logging.getLogger("aio_ascend")

#: the error of a host function that is a coroutine function (its coroutine would never run)
ASYNC_FN = (
    "launch_host_func() runs fn() on a thread and cannot await it: pass a plain function (for "
    "async work after the stream's work, await a record_event() of the stream on the loop)"
)

#: how long a close waits for a host function still running once the device's own work is done
#: (a callback cannot be interrupted): past it the thread is abandoned, logged at ERROR
STUCK_AFTER_S = 2.0

_RUNNERS: weakref.WeakKeyDictionary[object, HostFuncs] = weakref.WeakKeyDictionary()
_SOURCES: weakref.WeakKeyDictionary[object, Source] = weakref.WeakKeyDictionary()
_BACKGROUND: set[Any] = set()  # asyncio tasks of spawn(), kept alive until they finish


def spawn(adapter: LoopAdapter, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``start()`` in the background on the adapter's loop (loop thread).

    The coroutine must not raise: it reports through the tasks it resolves. On trio it is a
    system task (cancelled when the run ends); on asyncio a task kept referenced until done.
    """
    if adapter.name == "trio":
        import trio

        trio.lowlevel.spawn_system_task(start)
        return
    import asyncio

    task = asyncio.get_running_loop().create_task(start())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


class HostFuncs:
    """One device's host functions: the thread that runs them, and those not finished yet.

    :param source: the device as observers know it (None: observers are not told)
    """

    def __init__(
        self,
        device_id: int,
        adapter: LoopAdapter,
        task_timeout: float,
        source: Source | None = None,
    ) -> None:
        self._adapter = adapter
        self._task_timeout = task_timeout
        self._source = source
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._main, name=f"aio_ascend-hostfunc-{device_id}", daemon=True
        )
        # host functions not returned yet -> their stream's handle (loop thread)
        self.pending: dict[HostFunctionTask, int] = {}
        self._running: list[anyio.Event] = []  # set when a function handed over returns
        self.closed = False
        self._abandoned = False  # a close gave up on a running function
        self._idle = IdleWait(adapter)  # the close's wait for the functions handed over

    def start(self, recorded: Event, task: HostFunctionTask, fn: Callable[[], object]) -> None:
        """Run ``fn`` once ``recorded`` has completed, then resolve ``task`` (loop thread)."""
        stream: Any = recorded.stream
        self.pending[task] = stream.handle
        spawn(self._adapter, lambda: self._run(recorded, task, fn))

    async def _run(self, recorded: Event, task: HostFunctionTask, fn: Callable[[], object]) -> None:
        error: BaseException | None = None
        stamps: list[float] = []  # handed to the thread, returned
        try:
            try:
                await recorded
            except BaseException as exc:  # reported through the task
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise
                error = derived_error(exc, "the work queued before the host function failed")
            else:
                if self.closed:
                    error = ClosedError("the device closed before the host function ran")
                elif not task.done():  # (else its stream's forced close gave up on it)
                    error = await self._call(task, fn, stamps)
        except BaseException:  # the loop is ending (trio cancels its system tasks)
            error = ClosedError("the event loop ended before the host function finished")
        self._finish(task, error, stamps)

    async def _call(
        self, task: HostFunctionTask, fn: Callable[[], object], stamps: list[float]
    ) -> BaseException | None:
        adapter = self._adapter
        returned = anyio.Event()
        outcome: list[BaseException | None] = []

        def job() -> None:
            try:
                result = fn()
                if inspect.iscoroutine(result):  # an async callable: nothing would await it
                    result.close()
                    raise TypeError(ASYNC_FN)
                outcome.append(None)
            except BaseException as exc:  # fails the task, not the thread
                outcome.append(exc)
            stamps.append(time.perf_counter())
            adapter.call_soon_threadsafe(returned.set)

        if self._thread.ident is None:
            self._thread.start()
        stamps.append(time.perf_counter())
        self._jobs.put(job)
        self._running.append(returned)
        try:
            with anyio.CancelScope(shield=True):  # fn runs whatever happens: wait for it
                with anyio.move_on_after(self._task_timeout):
                    await returned.wait()
                if not returned.is_set():
                    # The watchdog's rule for device work: the task fails now; the stream
                    # stays held until fn returns (it cannot be interrupted).
                    task.time_out(
                        TaskTimeoutError(
                            f"host_func did not return within task_timeout={self._task_timeout:g}s "
                            "(it cannot be stopped: the stream's later work waits for it)"
                        ),
                    )
                    await returned.wait()
        finally:
            self._running.remove(returned)
        if not outcome:  # abandoned by the close: it still runs, unobserved
            return ClosedError("the device closed while the host function ran")
        return outcome[0]

    def _finish(
        self, task: HostFunctionTask, error: BaseException | None, stamps: list[float]
    ) -> None:
        handle = self.pending.pop(task, None)
        if HOOKS.observers and handle is not None and self._source is not None:
            ran = len(stamps) == 2  # (an abandoned one is still running: not yet returned)
            call = HostCall(task, handle, *(stamps if ran else (None, None)))
            # the task's outcome: a timeout that failed it earlier, not what fn did after
            outcome = task._exc if task.done() else error  # noqa: SLF001
            HOOKS.delivered(self._source, [(call, outcome, Outcome.FINISHED)])
        if isinstance(error, TaskTimeoutError):  # (a close's, or the earlier work's)
            task.time_out(error)
        resolve_task(task, error)  # (nothing if the watchdog or a close failed it already)
        task.returned.set()
        if not self.pending:
            self._idle.wake()

    def _main(self) -> None:
        get = self._jobs.get
        while True:
            job = get()
            if job is None:
                return
            job()
            del job  # nothing of a finished job is kept while the thread waits

    async def aclose(self, timeout: float | None) -> None:  # noqa: ASYNC109 - bounds fn, not us
        """Wait for the host functions queued so far (after the device's own close), then stop
        the thread; past ``timeout`` (or :data:`STUCK_AFTER_S` with none) a host function still
        running is abandoned with an ERROR log, its task fails with ``TaskTimeoutError`` as the
        tasks a forced close gives up on do, and its thread is left to exit when it returns
        (a callback cannot be interrupted: the close does not wait for it)."""
        self.closed = True
        self._idle.bound(STUCK_AFTER_S if timeout is None else max(timeout, 0.0))
        await self._idle.until_idle(lambda: len(self.pending))
        # (kept, not worked out per call: a patient close woken by an escalated one's
        # abandonment must not then join the thread the abandoned function holds)
        self._abandoned |= bool(self._running)
        if self.pending:
            log.error("a host function did not return when its device closed; it is abandoned")
            for returned in self._running:  # their coroutines end (a trio run can then end)
                returned.set()
            for task in list(self.pending):
                self._finish(task, gave_up(task.kind), [])
        self.stop()
        if self._thread.ident is not None and not self._abandoned:
            await join(self._thread, time.monotonic() + STUCK_AFTER_S)

    def stop(self) -> None:
        """Let the thread exit once its current job is done (any thread; idempotent)."""
        self.closed = True
        self._jobs.put(None)


def host_funcs(
    device: object, device_id: int, adapter: LoopAdapter, task_timeout: float
) -> HostFuncs:
    """The host-function runner of ``device``, created with its first host function; it stops
    when the device closes, or when the device is collected without a close."""
    runner = _RUNNERS.get(device)
    if runner is None:
        runner = HostFuncs(device_id, adapter, task_timeout, _SOURCES.get(device))
        _RUNNERS[device] = runner
        weakref.finalize(device, runner.stop).atexit = False
    return runner


def observed_as(device: object, source: Source) -> None:
    """``device`` is ``source`` to observers (the device's open): its host functions'
    deliveries name it."""
    _SOURCES[device] = source


async def close_host_funcs(device: object, timeout: float | None) -> None:  # noqa: ASYNC109
    """At a device's close: its host functions (if it ever had any) finish or are abandoned."""
    runner = _RUNNERS.get(device)
    if runner is not None:
        # shielded, as the device's own close: cancelled half-way, the thread would outlive it
        with anyio.CancelScope(shield=True):
            await runner.aclose(timeout)
