"""The completion poller thread: observes finished batches and hands them to the loop.

Streams are FIFO, so it only asks about the oldest outstanding batch event of each stream. It
waits only in GIL-releasing calls (a timed queue get with backoff between queries, or, in
block mode, a synchronize with a timeout slice), and sends each round's results into the loop
with one hop, however many tasks finished in it.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._errors import InternalError
from .._runtime import Runtime
from .._runtime.abi import ACL_EVENT_RECORDED_STATUS_COMPLETE
from .._runtime.threads import GilTurns, LoopPulse, reduce_timer_slack
from .counters import Counters
from .events import BatchEvents
from .faults import FaultState, as_device_fault, fail_batches
from .forcing import LaneForce, give_up
from .lifetimes import Lifetimes
from .watchdog import expire, log_expired
from .work import Batch, Delivery, Outcome, Request

__all__ = ["POKE", "CompletionMode", "Poller"]

_STOP = object()
#: put into the poller's inbox to make it look now (block mode's waiter does)
POKE = object()
#: requests completed per poll round at most (bounds the poller's time holding the GIL)
ROUND_BUDGET = 1024
#: how often the watchdog looks at deadlines (it works in seconds)
WATCHDOG_PERIOD_S = 0.01
#: how often an idle poller (no batch outstanding) looks at hops waiting for the submitter
IDLE_WATCHDOG_S = 0.05


class CompletionMode(enum.Enum):
    """How the poller waits: short sleeps between queries, or a blocking event sync."""

    POLL = "poll"
    BLOCK = "block"


class Poller:
    """The thread ``aio_ascend-poll-<device>`` and the outstanding batches only it touches.

    :param post: hands deliveries to the loop (non-blocking; counts a wake-up when it did)
    :param inbox: where the submitter puts recorded batches
    :param expire_waiting: the watchdog's look at hops the submitter has not taken yet
    :param watch: block mode: told the oldest outstanding batch event after every round
    :param pulse: the loop's heartbeat: when to hand it the GIL
    """

    def __init__(
        self,
        *,
        runtime: Runtime,
        device_id: int,
        faults: FaultState,
        lifetimes: Lifetimes,
        batch_events: BatchEvents,
        post: Callable[[list[Delivery], Counters], None],
        inbox: queue.SimpleQueue[Any],
        expire_waiting: Callable[[float], tuple[int, list[Delivery]]],
        watch: Callable[[int | None], None] | None,
        task_timeout: float,
        poll_min_interval: float = 5e-6,
        poll_max_interval: float = 1e-3,
        pulse: LoopPulse | None = None,
    ) -> None:
        self._runtime = runtime
        #: when to hand the loop the GIL: rounds that follow each other add up (see LoopPulse)
        self._turns = GilTurns(pulse or LoopPulse())
        self._faults = faults
        self._lifetimes = lifetimes
        self._events = batch_events
        self._post = post
        self._watch = watch
        self._task_timeout = task_timeout
        self._device_id = device_id
        self._min_interval = poll_min_interval
        self._max_interval = poll_max_interval
        self.counters = Counters()
        #: work of a broken context, never observed complete: released at close
        self.orphans: list[Request] = []
        self._inbox = inbox  # recorded batches, from the submitter
        self._expire_waiting = expire_waiting
        self._on_exit: Callable[[], None] | None = None
        self._outstanding: dict[int, deque[Batch]] = {}  # by stream handle
        self._pending = 0  # batches in _outstanding
        self._interval = poll_min_interval
        self._next_deadline_check = 0.0
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-poll-{device_id}", daemon=True
        )

    # --- any thread ------------------------------------------------------------------------

    def stop(self, *, then: Callable[[], None] | None = None) -> None:
        """Ask the thread to exit after its current round (and to call ``then`` on its way)."""
        self._on_exit = then
        self._inbox.put(_STOP)

    def leftover_batches(self) -> list[Batch]:
        """Batches never seen complete (after the thread exited, or was abandoned)."""
        leftovers = [batch for batches in self._outstanding.values() for batch in batches]
        self._outstanding.clear()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                leftovers.append(item)
        self._inbox.put(_STOP)  # taken out too; an abandoned thread still needs it
        return leftovers

    # --- the thread ------------------------------------------------------------------------

    def _main(self) -> None:
        self._runtime.set_current_context()
        reduce_timer_slack()
        self._loop()
        if self._on_exit is not None:
            self._on_exit()

    def _loop(self) -> None:
        while True:
            # Wait for new work only when nothing is outstanding; no reference to past work
            # is held in this frame meanwhile (see Submitter._main). The watchdog still looks
            # at the hops waiting for the submitter now and then.
            if not self._pending and not self._idle_wait():
                return
            if not self._round():
                return

    def _idle_wait(self) -> bool:
        try:
            item = self._inbox.get(timeout=IDLE_WATCHDOG_S)
        except queue.Empty:
            never_started, deliveries = self._expire_waiting(time.monotonic())
            self.counters.timeouts += never_started
            log_expired(self._device_id, deliveries, self._task_timeout)
            self._post(deliveries, self.counters)
            return True
        return self._file(item)

    def _file(self, item: object) -> bool:
        """File a batch from the inbox; False on the stop sentinel."""
        if item is _STOP:
            return False
        if item is POKE:
            return True
        if type(item) is LaneForce:
            self._destroy(item)
            return True
        assert isinstance(item, Batch)
        self._outstanding.setdefault(item.lane.handle, deque()).append(item)
        self._pending += 1
        return True

    def _round(self) -> bool:
        """One round: file new batches, complete what finished, else wait a little."""
        inbox = self._inbox
        while True:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if not self._file(item):
                return False
        try:
            done = self._collect_completed()
        except BaseException as exc:
            # In stop-on-failure mode a failing query means the device context is broken.
            self._fail_all(exc)
            return True
        if done:
            self._pending -= len(done)
            self._complete(done)
            if self._watch is not None:
                self._watch_oldest()
            self._interval = self._min_interval
            self._turns.offer()  # rounds that complete work follow each other without a wait
            return True
        now = time.monotonic()
        if now >= self._next_deadline_check:
            self._next_deadline_check = now + WATCHDOG_PERIOD_S
            expired, deliveries = expire(self._outstanding.values(), now, self._task_timeout)
            never_started, more = self._expire_waiting(now)
            self.counters.timeouts += expired + never_started
            log_expired(self._device_id, deliveries + more, self._task_timeout)
            self._post(deliveries + more, self.counters)
        if self._watch is not None:
            self._watch_oldest()
        # Nothing finished: wait (GIL released) for the interval or for new work.
        try:
            item = inbox.get(timeout=self._interval)
        except queue.Empty:  # waited out, GIL released
            self._turns.waited()
            self._interval = min(self._interval * 2, self._max_interval)
            return True
        self._interval = self._min_interval
        return self._file(item)

    def _destroy(self, force: LaneForce) -> None:
        # Every batch of the stream is here already (it came behind them): none is reported
        # complete from now on, the stream is destroyed, and what the batches hold waits for
        # the device's close (a kernel or copy of theirs may still be running).
        lane = force.lane
        batches = self._outstanding.pop(lane.handle, None) or deque()
        self._pending -= len(batches)
        deliveries, held = give_up(batches)
        self.orphans.extend(held)
        if not lane.external:
            with contextlib.suppress(Exception):
                self._runtime.destroy_stream_force(lane.handle)
            lane.destroyed = True
        if self._watch is not None:
            self._watch_oldest()
        self._post(deliveries, self.counters)
        force.done.set()

    def _watch_oldest(self) -> None:
        # Block mode: the waiter sleeps on the batch with the earliest deadline.
        heads = [batches[0] for batches in self._outstanding.values() if batches]
        oldest = min(heads, key=lambda batch: batch.deadline) if heads else None
        assert self._watch is not None
        self._watch(oldest.event if oldest is not None else None)

    def _collect_completed(self) -> list[Batch]:
        query = self._runtime.query_event_status
        done: list[Batch] = []
        budget = ROUND_BUDGET
        for batches in self._outstanding.values():
            while batches and budget > 0:
                if query(batches[0].event) != ACL_EVENT_RECORDED_STATUS_COMPLETE:
                    break
                batch = batches.popleft()
                done.append(batch)
                budget -= len(batch.requests)
        return done

    def _complete(self, done: list[Batch]) -> None:
        deliveries: list[Delivery] = []
        finished: list[Request] = []
        now = time.perf_counter()  # one clock call per round: completed_at of all it completes
        for batch in done:
            if batch.timed_out:  # its tasks failed already: their timestamps stay as they are
                outcome = Outcome.FINISHED_LATE
                submitted = completed = None
            else:
                outcome = Outcome.FINISHED
                submitted, completed = batch.submitted, now
            for req in batch.requests:
                if completed is not None:
                    task = req.task
                    task.submitted_at = submitted
                    task.completed_at = completed
                error: BaseException | None = None
                # A timed-out task has failed already: its copy never lands in user memory.
                if req.needs_completion and not batch.timed_out:
                    try:
                        req.on_complete()
                    except BaseException as exc:
                        error = InternalError(f"completing {req.kind} failed: {exc!r}")
                deliveries.append((req, error, outcome))
            finished.extend(batch.requests)
            self._events.give_back(batch.event)
        self._lifetimes.release(finished)
        self._post(deliveries, self.counters)

    def _fail_all(self, exc: BaseException) -> None:
        # A query that fails in stop-on-failure mode reports a broken device context,
        # whatever its code: it becomes the device's (sticky) fault.
        fault = as_device_fault(exc)
        first = self._faults.note(fault)
        batches = [batch for queued in self._outstanding.values() for batch in queued]
        self._outstanding.clear()
        self._pending = 0
        for batch in batches:
            self.orphans.extend(batch.requests)
        try:
            site = self._runtime.fault_site()
        except Exception:
            site = None
        deliveries = fail_batches(batches, fault, first, site)
        now = time.perf_counter()
        for batch in batches:
            for req in batch.requests:
                req.task.submitted_at = batch.submitted
        for index, (req, error, outcome) in enumerate(deliveries):
            if error is None:  # finished before the fault
                req.task.completed_at = now
                if req.needs_completion:
                    try:
                        req.on_complete()
                    except BaseException as err:  # (not `exc`: the argument's name)
                        error = InternalError(f"completing failed: {err!r}")
                        deliveries[index] = (req, error, outcome)
        self._post(deliveries, self.counters)
