"""The close's steps outside the scheduler, and the order :meth:`Scheduler.aclose` runs them in.

The helpers here (waiting for threads without blocking the loop, destroying the streams left,
releasing everything, the close's log lines) are the parts of a close that need no scheduler
state. Their order is the subtle part, so here it is, with the reason for each step.

A device's close (``Scheduler.aclose``, through ``LoopAdapter.shielded``: cancelling the caller
does not stop a close half-way, asyncio's own cancellation and ``asyncio.run``'s shutdown
included, so its waits keep their deadlines with timers, never with a cancellation;
``Device.__aexit__`` left by an exception closes with ``cancel=True, timeout=close_timeout``):

1. The state becomes ``CLOSING``: ``check_usable`` refuses new work from here on. (From another
   event loop, a close goes on only once the opening loop has finished, on the new loop.)
2. Pending requests not yet flushed are dropped (``cancel=True``: their tasks fail with
   ``ClosedError``, nothing reached the device) or flushed to the submitter; every admission
   waiter is turned away.
3. Wait for ``unsettled == 0`` (every admitted request resolved) up to ``timeout``
   (:class:`IdleWait`; another close's shorter timeout brings the deadline nearer). Past it the
   close is *forced*: a WARNING (:func:`log_forced`), and the streams will go by force. Then
   wait, up to the same deadline, for the module loads under way (``aload_module``'s threads,
   and the unload of a cancelled one: ``Binaries.settled``); one still running is joined in step
   6 as the other threads are.
4. Ask the submitter, the poller and (block mode) the waiter to stop, and join the **poller
   first**: once it is gone nothing done to the streams below can be reported as a completion (a
   stream destroyed by force may read complete, or fail every query).
5. When forced, faulted, or with the poller still alive: mark every stream ``forced`` (a submitter
   still running submits nothing more to any of them) and destroy the streams by force
   (:func:`destroy_lanes`), which ends their queued work and stops a hung kernel, except a stream a
   library thread still alive may be inside a call on: the streams of the hop the submitter is in
   (``Submitter.underway.streams()``), and the stream of a stall probe under way, which is
   destroyed once its probe has returned (``Prober.retire``, the one door every stream destroy
   goes through; the stopped prober leaves it to step 7: ``Prober.take_left``). The real runtime
   frees a stream destroyed by force under a thread synchronizing on it, or waiting in a launch
   or an event record for room in its queue, and that thread then crashes the process (SIGSEGV,
   seen on ``tests/realrt`` both ways: a 1 ms probe can wait seconds in the runtime's timeout
   snapshot, and a submitting call spins without a timeout until room appears;
   ``docs/cann-support.md`` §13.3 cites the lines). Those streams are leaked with the rest of
   what a stuck thread may touch (step 9), and the thread is left to return when its stream
   moves. When forced, what the threads post from then on is held back: a refusal by a
   destroyed stream must not stand for the task's outcome, so a failure posted then is resolved
   in step 7 as the forced close's ``TaskTimeoutError``, caused by it (a success stays one).
6. Join the other threads. All joins share one deadline, ``JOIN_TIMEOUT_S`` (2 s) after step 4;
   a thread still alive then is *stuck* in a runtime call.
7. Destroy the streams left, then fail what never completed: hops nobody took, parked and
   carried requests (:meth:`Submitter.unsubmitted`), batches never seen complete
   (:meth:`Poller.leftover_batches`): released (unless a thread is stuck), their tasks failed
   with ``TaskTimeoutError`` when forced or stuck, else ``ClosedError``. Then resolve what was
   held back (and the poller's staging thread's last copy-outs, ``Poller.at_exit``), and drain
   the delivery queue without a budget.
8. Release everything (:func:`release_everything`): only now, with the threads gone and the
   streams destroyed, can nothing on the device touch the memory. Graphs, orphans, events,
   allocations and the pool's cached blocks, modules, the host pool, and last the runtime, whose
   close waits for the last of the users' pinned arrays to be collected (``PinnedArrays.close``:
   it would free their memory under them). On acl, after a stream with unfinished work was
   destroyed by force, the device is first given time to settle, in a worker thread so that the
   loop keeps running.
9. With a stuck thread, step 8 is skipped: an ERROR (:func:`log_stuck`), and nothing the stuck
   call may still touch is freed under it; returning on time wins. A thread of its own
   (``aio_ascend-close-<id>``, :func:`close_once_returned`) closes the runtime once the stuck
   threads have exited, which frees what the runtime gave (memory, streams, events, binaries);
   if the call never returns, that goes with the process.
   Either way the unretrieved failures are logged (``FailureLog.report_at_close``), the state
   becomes ``CLOSED``, and other callers waiting in ``aclose()`` are woken.

Waiting never blocks the loop: a thread's exit and a ``threading.Event`` cannot be awaited, so
:func:`join` and :func:`wait_set` poll them every millisecond with ``anyio.sleep``.

One stream's forced close (``Scheduler.close_lane`` past its timeout, :mod:`.forcing`) uses
:func:`log_forced` and :func:`wait_set`: it waits up to 2 s for the poller to report the stream
destroyed, and gives up early if the device starts closing (its close then handles the stream).

A device collected without ``aclose()`` (``Scheduler.abandon``, from a finalizer on any thread)
cannot wait at all: it asks the threads to stop, and the poller, on its way out, runs
:func:`close_after` (blocking joins, however long a stuck call takes, then the runtime's
close); tasks still outstanding are never resolved.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Container, Iterable
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel

from .._host.pinned import PinnedArrays
from .._host.pool import HostBufferPool
from .._runtime import Runtime
from .events import BatchEvents, UserEvents
from .graphs import GraphBook
from .lane import Lane
from .lifetimes import Lifetimes
from .loop import LoopAdapter, current_loop_adapter
from .stalls import Prober
from .work import Request

T = TypeVar("T")

#: seconds aclose() waits for its threads to exit before it abandons one stuck in a runtime call
JOIN_TIMEOUT_S = 2.0

__all__ = [
    "SETTLE_AFTER_FORCE_S",
    "IdleWait",
    "call_off_loop",
    "close_after",
    "destroy_lanes",
    "drain",
    "join",
    "log_forced",
    "log_stuck",
    "release_everything",
    "wait_set",
]

log = logging.getLogger("aio_ascend")

#: how long a close forced by its timeout (so past its deadline) lets the device settle before
#: it leaks what a forced stream's work may still touch: its caller was promised a return
SETTLE_AFTER_FORCE_S = 0.01


class IdleWait:
    """A close's wait until nothing is left unsettled (the device's admitted requests, its
    host functions), up to a deadline that a later close's shorter timeout brings nearer
    (loop thread).

    :ivar timeout: the timeout that set the deadline (what a forced close logs)
    :ivar deadline: the nearest deadline asked for, kept after :meth:`until_idle` has ended
    :ivar adapter: the device's loop (replaced when another loop adopts the device)
    """

    __slots__ = ("_due", "_waiters", "adapter", "deadline", "timeout")

    def __init__(self, adapter: LoopAdapter) -> None:
        self.adapter = adapter
        self._due = math.inf
        self._waiters: list[object] = []
        self.timeout: float | None = None
        #: the nearest deadline any close asked for (``anyio.current_time()``'s clock; inf:
        #: none), also once :meth:`until_idle` has ended: what else a close waits for (module
        #: loads) is held to it
        self.deadline = math.inf

    def bound(self, timeout: float | None) -> None:
        """Stop waiting ``timeout`` seconds from now, if that is sooner (None: no change)."""
        if timeout is None:
            return
        due = anyio.current_time() + timeout
        self.deadline = min(self.deadline, due)  # (what the close waits for after: see below)
        if due < self._due:
            self._due, self.timeout = due, timeout
            self.wake()  # (a wait under way looks at its deadline again)

    async def until_idle(self, unsettled: Callable[[], int]) -> bool:
        """Wait until ``unsettled()`` is 0 (True) or the deadline passes (False); woken by
        :meth:`wake`. Later :meth:`bound` calls change nothing."""
        try:
            while unsettled() > 0:
                if anyio.current_time() >= self._due:
                    return False
                waiter = self.adapter.new_waiter()
                self._waiters.append(waiter)
                await self.adapter.wait_until(waiter, self._due)
            return True
        finally:
            self._due = -math.inf

    def wake(self) -> None:
        """Let the wait look again (the count changed, or the deadline moved)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self.adapter.wake(waiter)


def log_forced(device_id: int, busy: str, timeout: float | None, action: str) -> None:
    """The WARNING of a close that gave up waiting for ``busy`` work, saying what it does now
    (``action``: "destroying it by force")."""
    log.warning("device %d: %s after aclose(timeout=%s); %s", device_id, busy, timeout, action)


def log_stuck(device_id: int, stuck: list[str], waited: float) -> None:
    """The ERROR of a close that abandons threads stuck in a runtime call."""
    log.error(
        "device %d: %s still inside a runtime call %.0f s after aclose() forced the streams; "
        "the close returns, and the runtime is closed (with the device's buffers and events) "
        "only once the call has returned, not under it",
        device_id,
        " and ".join(stuck),
        waited,
    )


def close_once_returned(
    device_id: int,
    stuck: list[str],
    threads: Callable[[], list[threading.Thread]],
    runtime: Runtime,
    pinned: PinnedArrays,
) -> None:
    """A close gave up waiting for the ``stuck`` threads (by name) of ``threads()``, inside
    runtime calls: log it, and close ``runtime`` once they have exited, from a thread of its
    own (``aio_ascend-close-<id>``). Closing it under a call would free what the call uses (a
    crash on the real runtime); what the close did not release goes with the runtime's close
    (its memory, streams, events and binaries), or with the process if the call never ends."""
    log_stuck(device_id, stuck, JOIN_TIMEOUT_S)
    closer = threading.Thread(
        target=close_after, args=(threads, runtime, pinned), name=f"aio_ascend-close-{device_id}"
    )
    closer.daemon = True
    closer.start()


def close_after(
    threads: Callable[[], list[threading.Thread]], runtime: Runtime, pinned: PinnedArrays
) -> None:
    """Wait (blocking) for the ``threads()`` (asked again until none is alive: one may start
    meanwhile, the unload of a cancelled module load), then close ``runtime`` (once the last
    pinned array alive is collected: see ``PinnedArrays.close``). Nobody waits for this close,
    so a thread stuck in a runtime call is waited for however long it takes: closing the
    runtime under the call would free what it uses (a crash on the real runtime), not end it."""
    while True:  # (a thread that starts with its first job may not have started: no ident)
        alive = [t for t in threads() if t.ident is not None and t.is_alive()]
        if not alive:
            break
        for thread in alive:
            thread.join()
    with contextlib.suppress(Exception):
        pinned.close(runtime.close)


async def join(thread: threading.Thread, deadline: float) -> None:
    """Wait until ``thread`` has exited or ``deadline`` (``time.monotonic()``) has passed."""
    while thread.is_alive() and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.001)  # a thread join cannot be awaited: poll it briefly


async def call_off_loop(
    name: str,
    call: Callable[[], T],
    *,
    discard: Callable[[T], None] | None = None,
    threads: list[threading.Thread] | None = None,
) -> T:
    """``call()`` on a thread of its own named ``name``, joined before this returns: the loop
    keeps running meanwhile (an idle worker of anyio's would outlive the device's close, and
    keep its last job's references until it takes another).

    A thread cannot be interrupted: a cancellation (asyncio's own included) waits for
    ``call()`` to return, as anyio's ``to_thread`` does, then is raised; what ``call()``
    returned is handed to ``discard`` first (the opener closes a runtime nobody will use).
    So nothing is left running, or open, once this has returned or raised. ``threads``: where
    the threads it starts are listed (for a close that must wait for them however this ends).
    """
    outcome: list[tuple[bool, Any]] = []  # (True, result) or (False, exception)

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # raised on the loop, below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    if threads is not None:
        threads.append(thread)
    thread.start()
    try:
        await current_loop_adapter().shielded(join, thread, math.inf)
        await anyio.lowlevel.checkpoint_if_cancelled()  # (anyio's and trio's, held off so far)
    except BaseException:
        if outcome and outcome[0][0] and discard is not None:
            # off the loop too (closing a runtime takes as long as opening one)
            result = outcome[0][1]
            closer = threading.Thread(target=discard, args=(result,), name=name, daemon=True)
            if threads is not None:
                threads.append(closer)
            closer.start()
            await current_loop_adapter().shielded(join, closer, math.inf)
        raise
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast("T", value)


async def settle_off_loop(runtime: Runtime, limit: float | None, device_id: int) -> None:
    """``runtime.wait_settled(limit)`` on a thread of its own that ends with it."""
    held = [runtime]
    await call_off_loop(f"aio_ascend-settle-{device_id}", lambda: held.pop().wait_settled(limit))


async def drain(lane: Lane, *, late: bool = False) -> None:
    """Wait until the work queued on ``lane`` so far has finished (errors not raised); with
    ``late``, until the device has also finished the work the watchdog failed.

    The stream's latest task is the one to wait for (the stream is FIFO). A failed one is let
    go of (``Task._resolve``: its traceback may reach the caller's frames), and work queued
    before it may still run: then the stream's unresolved requests are watched (no wake tells
    of them) until they are done or newer work is queued, whose task is then waited for.
    """
    admission = lane.admission
    last = lane.last
    while last is None and admission.live():
        await anyio.sleep(0.001)
        last = lane.last
    if last is not None and not last.done():
        await last.wait_finished()
    while late and admission.timed_out:  # noqa: ASYNC110 - a late finish wakes no one
        await anyio.sleep(0.005)


async def wait_set(
    event: threading.Event, deadline: float, give_up: Callable[[], bool] | None = None
) -> bool:
    """Wait until a thread sets ``event``, ``deadline`` has passed or ``give_up()`` is true;
    whether it was set."""
    while not event.is_set() and time.monotonic() < deadline:
        if give_up is not None and give_up():
            break
        await anyio.sleep(0.001)  # nor can a threading.Event be: poll it briefly
    return event.is_set()


def destroy_lanes(
    runtime: Runtime, lanes: Iterable[Lane], prober: Prober, spared: Container[int] = ()
) -> None:
    """Close ``lanes`` and destroy their runtime streams by force through ``prober`` (one
    destroyed already is left alone, one being probed goes after its probe), not someone
    else's, nor one in ``spared``: a stream the submitter, still alive, may be inside a call
    on, which the real runtime would free under it. The caller has marked them ``forced``
    before it worked out ``spared`` (see ``Scheduler._destroy_lanes``)."""
    for lane in lanes:
        lane.closed = True
        lane.admission.reset()
        if not lane.external and lane.handle not in spared:
            prober.retire_by_force(lane, runtime)


def release_everything(
    runtime: Runtime,
    *,
    graphs: GraphBook,
    lifetimes: Lifetimes,
    orphans: Iterable[list[Request]],
    batch_events: BatchEvents,
    user_events: UserEvents,
    unload_binaries: Callable[[Runtime], None],
    pool: HostBufferPool,
    pinned: PinnedArrays,
) -> None:
    """Release and free what the device holds, then close the runtime: only after the
    threads have exited and the streams are gone (nothing can touch these any more).
    ``orphans``: lists of requests whose resources waited for this (emptied). The runtime
    closes once the users' pinned arrays are gone (its close would free their memory)."""
    graphs.close_all()
    for requests in orphans:
        lifetimes.release(requests)
        requests.clear()
    for handle in batch_events.created + user_events.take_all():
        with contextlib.suppress(Exception):
            runtime.destroy_event(handle)
    batch_events.created.clear()
    lifetimes.close()  # buffers still alive and cached blocks: all back to the runtime
    unload_binaries(runtime)
    pool.close()
    pinned.close(runtime.close)
