"""Completions into the loop: queued as they arrive, resolved in bounded chunks per loop turn.

What it is for. The poller (and the submitter, for requests it refused or let expire) posts each
round's outcomes with one ``call_soon_threadsafe(DeliveryQueue.deliver, items)``
(``Posting.post``). On the loop, :meth:`DeliveryQueue.deliver` tells the active observers
(tracing, metrics: once per round, never per task, and nothing when none is active), appends the
items, and drains at once unless a drain is already scheduled. Each item is one request's
``(request, error, Outcome)`` or a whole finished :class:`~.work.Batch` (the poller's usual
delivery: no per-request work on its thread). Resolving an item finishes its task
(:func:`~.task.resolve_task`) and gives back its stream's admission.

Why chunks. Waking coroutines is loop work: resuming thousands in one callback stalls the loop.
What costs is the coroutines each resolution wakes (awaiters of the task, a launch waiting for
the freed slot), so a drain stops after :data:`MAX_WAKES_PER_TURN` (256) wake-ups, or after
:data:`MAX_RESOLVED_PER_TURN` (1024) resolutions however few they wake, and schedules the rest
for the next loop turn (``call_soon``). A batch is resumed mid-way (``Batch.delivered``); a task
with more than 256 awaiters wakes the rest itself, a chunk per later turn. The close drains with
``budget=False``: everything, at once.

What each outcome does:

- ``FINISHED``: resolve the task (with its error, if any) and give back its slot and entries.
- ``TIMED_OUT`` (the watchdog): resolve the task with ``TaskTimeoutError`` but keep its slot:
  the device may still be running it, and its stream's budget must keep counting it.
- ``FINISHED_LATE``: timed-out work the device has now finished: only the slot goes back.

Slots go back a stream's run of consecutive items at a time (one ``Admission.release`` for the
run instead of one per request), and that release admits the oldest waiters that now fit, each
with several slots at once (see :mod:`.admission`).

Settling. After every drain, ``settled(count)`` (``Scheduler._on_settled``) hears how many
requests stopped counting towards ``aclose()``'s wait: each request counts once, when it is
first resolved (finished, failed or timed out); one resolved earlier (dropped by a close, or
timed out before its late completion) is not counted again. The scheduler also beats the loop's
heartbeat there (``LoopPulse``), so library threads know the loop is running.

Threads and order. Everything here runs on the loop thread; library threads reach it only
through ``call_soon_threadsafe``, one call per round, so items arrive in the order they were
posted (the poller's, per stream, in submission order). A new round queued while a drain is
scheduled goes behind what is left. :meth:`rebind` moves delivery to another loop when the
device is closed from there (the opening loop having finished).

The inner loops are written flat on purpose: they run for every request, and a method call per
item on top of them cost 1 ms of loop-lag p99 (``aio-ascend bench --only loop_lag``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import TaskTimeoutError
from .counters import Counters
from .hooks import HOOKS, Source
from .task import MAX_WAKES_PER_TURN, resolve_task
from .work import Arrival, Batch, Outcome, Request, expand

__all__ = ["MAX_RESOLVED_PER_TURN", "MAX_WAKES_PER_TURN", "DeliveryQueue"]

MAX_RESOLVED_PER_TURN = 1024

# enum members as module globals: a member read through the enum class costs 0.2 us on
# CPython 3.11, and the drain compares each delivery's outcome
_FINISHED_LATE = Outcome.FINISHED_LATE
_TIMED_OUT = Outcome.TIMED_OUT


class DeliveryQueue:
    """Delivered completions not yet resolved.

    Resolving one finishes its task (unless the watchdog did already) and gives back its
    admission (unless the device is still running timed-out work), admitting the oldest
    waiters that then fit.

    :param wake: wakes an admission waiter (the loop adapter's ``wake``)
    :param call_soon: schedules a callback on a later loop turn
    :param settled: called after each drain with how many requests it settled
    :param source: the device, as observers (tracing, metrics) are told of it
    :ivar counters: the loop side's counters: ``wakeups`` (each delivery into the loop), and
        ``timeouts`` (each task failed with ``TaskTimeoutError``, the watchdog's or a forced
        close's, once, when it is resolved)
    """

    def __init__(
        self,
        wake: Callable[[Any], None],
        call_soon: Callable[[Callable[[], None]], None],
        settled: Callable[[int], None],
        source: Source | None = None,
    ) -> None:
        self._source = source or Source(-1, "?")
        self.counters = Counters()
        self._wake = wake
        self._call_soon = call_soon
        self._settled = settled
        self._queue: deque[Arrival] = deque()
        self._drain_scheduled = False

    def rebind(
        self, wake: Callable[[Any], None], call_soon: Callable[[Callable[[], None]], None]
    ) -> None:
        """Deliver into another loop from now on (the first one has finished)."""
        self._wake = wake
        self._call_soon = call_soon
        self._drain_scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def deliver(self, items: Sequence[Arrival]) -> None:
        """The poller's (or submitter's) one hop: queue, and drain now unless a drain is due."""
        self.counters.wakeups += 1  # (counted before any task it resolves runs)
        if HOOKS.observers:  # tracing or metrics on: once per round, never per task
            HOOKS.delivered(self._source, expand(items))
        self._queue.extend(items)
        if not self._drain_scheduled:
            self.drain()

    def resolve_outside(self, outcomes: Sequence[tuple[Request, BaseException | None]]) -> None:
        """Resolve requests that never came through the queue (dropped before the hand-over,
        or left over by a close; their slots and holdings are the caller's to give back),
        telling observers first, as :meth:`deliver` does: a task failed by a close is traced
        and counted as any other (once: one the watchdog failed already is not told again)."""
        if HOOKS.observers:
            told = [(r, e, Outcome.FINISHED) for r, e in outcomes if not r._done]  # noqa: SLF001
            HOOKS.delivered(self._source, told)
        timeouts = 0
        for request, error in outcomes:
            if not request._done and _a_timeout(request, error):  # noqa: SLF001
                timeouts += 1
            resolve_task(request, error)
        self.counters.timeouts += timeouts

    def _release(self, lane: Any, entries: int, count: int) -> int:
        # ``count`` finished requests of ``lane`` give back their admission: wake who now fits
        woken = lane.admission.release(entries, count)
        for waiter in woken:
            self._wake(waiter)
        return len(woken)

    def drain(self, *, budget: bool = True) -> None:
        """Resolve up to one turn's budget; schedule the next turn if any is left."""
        self._drain_scheduled = False
        completed = self._queue
        popleft = completed.popleft
        limit = MAX_RESOLVED_PER_TURN if budget else 1 << 62
        wake_limit = MAX_WAKES_PER_TURN if budget else 1 << 62
        wakes = settled = resolved = timeouts = 0
        # Slots go back a stream's run of completions at a time (one release, and one grant
        # of several slots per waiter, instead of one per request: see admission.py).
        lane: Any = None
        count = entries = 0
        # Tight loops: they run for every request (loop lag p99 +1 ms with a method call per
        # item on top of these: ``aio-ascend bench --only loop_lag``).
        while completed and resolved < limit and wakes < wake_limit:
            item = popleft()
            if isinstance(item, Batch):
                # a batch that finished, all of it (the poller's usual delivery): its
                # requests in order, from where an earlier turn's budget stopped
                if item.lane is not lane:
                    if count:
                        wakes += self._release(lane, entries, count)
                    lane = item.lane
                    count = entries = 0
                requests = item.requests
                submitted, finished = item.submitted, item.completed
                index, end = item.delivered, len(requests)
                while index < end:
                    request = requests[index]
                    index += 1
                    request.submitted_at = submitted
                    request.completed_at = finished
                    if not request._done:  # noqa: SLF001 - the scheduler's own object
                        settled += 1
                    wakes += resolve_task(request, None)
                    entries += request.entries
                    if wakes >= wake_limit:
                        break
                count += index - item.delivered
                resolved += index - item.delivered
                if index < end:  # the rest on a later turn
                    item.delivered = index
                    completed.appendleft(item)
                continue
            request, error, outcome = item
            resolved += 1
            if outcome is not _FINISHED_LATE:
                # resolved here (finished or timed out) is when a request stops counting
                # towards aclose()'s wait; one resolved already (dropped) was counted then
                if not request._done:  # noqa: SLF001 - the scheduler's own object
                    settled += 1
                    if _a_timeout(request, error):
                        timeouts += 1  # (the watchdog's or a forced close's: one per task)
                wakes += resolve_task(request, error)
            else:
                request.lane.admission.finished_late()
            if outcome is _TIMED_OUT:
                for waiter in request.lane.admission.time_out():  # (a stalled stream's)
                    self._wake(waiter)
            else:
                if request.lane is not lane:
                    if count:
                        wakes += self._release(lane, entries, count)
                    lane = request.lane
                    count = entries = 0
                count += 1
                entries += request.entries
        if count:
            self._release(lane, entries, count)
        if completed and not self._drain_scheduled:
            self._drain_scheduled = True
            self._call_soon(self.drain)
        if timeouts:
            self.counters.timeouts += timeouts
        self._settled(settled)


def _a_timeout(request: Request, error: BaseException | None) -> bool:
    # Whether resolving ``request`` (not done yet) with ``error`` is one more of the device's
    # ``timeouts``: a task of the user's failing with TaskTimeoutError (a quiet one is not).
    return isinstance(error, TaskTimeoutError) and not request.quiet
