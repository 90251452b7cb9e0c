"""The poller thread (``aio_ascend-poll-<device>``): observes finished batches, runs the
watchdog, and hands each round's completions to the loop.

What it is for. The submitter records one event after each batch and passes the
:class:`~.work.Batch` here. Streams are FIFO, so a round only asks about the oldest outstanding
batch event of each stream (``query_event_status``), popping batches while their events read
complete (until about ``ROUND_BUDGET`` requests a round, which bounds how long one round holds
the GIL). What a round finished is released (:meth:`Lifetimes.release`: host buffers, device
memory, user arrays, once for the whole round) and posted to the loop with one
``call_soon_threadsafe``, however many tasks finished in it. A batch with nothing to do on the
host goes whole (the loop stamps and resolves its requests); a batch with a download copies it
out of the staging buffer into the user's array here, before the release.

Invariants.

- Nothing the device may still touch is released: a request is released, and delivered as
  finished, only after the event recorded after its batch has read complete (in a fault: see
  below). Work failed without that (timed out, dropped) keeps what it holds.
- Per stream, completions are delivered in submission order. A finished batch with a download
  over ``STAGE_AT_HAND_BYTES`` (1 MiB) goes to this thread's staging thread (a
  :class:`~.stager.CopyWorker`) to be copied out, and so do its stream's later finished batches
  while it is there, to keep their order; the other streams' completions never wait for it. The
  staging thread reports in order (``_unstaged``) and pokes the inbox.
- Every batch event goes back to :class:`~.events.BatchEvents` once its batch is seen complete,
  never before (the submitter may record it again at once).

Waiting. The thread blocks only in GIL-releasing calls: with nothing outstanding, a timed inbox
get (``IDLE_WATCHDOG_S``, after which the watchdog looks at the hops the submitter has not
taken); with work outstanding and nothing finished, a timed inbox get whose timeout doubles from
``poll_min_interval`` (5 us) to ``poll_max_interval`` (1 ms; 4 ms in block mode, where the
:class:`~.waiter.Waiter` sleeps on the oldest batch event and puts ``POKE`` in the inbox when it
completes). New work or a poke ends the wait at once; a round that finished something starts the
next round without waiting, offering the GIL to a starved loop first
(:class:`~aio_ascend._runtime.threads.GilTurns`). The poller itself never waits on the device:
the stall probes below run on its prober's thread.

Every ``WATCHDOG_PERIOD_S`` (10 ms) without completions: the watchdog
(:func:`~.watchdog.expire`) fails the batches past their deadline with ``TaskTimeoutError``
(their slots stay taken, and their buffers held, until the device really finishes them: they
arrive later as ``FINISHED_LATE``), the hops still waiting for the submitter past theirs
(:meth:`Submitter.expire_waiting`), and :class:`~.stalls.StallProbes` names the streams whose
oldest batch has been outstanding long enough to be probed with a short ``synchronize_stream``
(on the real runtime a failed task is reported only there): the :class:`~.stalls.Prober`
thread runs one probe at a time and reports through the inbox.

Faults. A query (or a probe) that raises means the device context is broken (stop-on-failure
mode): the error becomes the device's sticky fault (:class:`~.faults.FaultState`), batches whose
events still read complete (the FIFO prefix of each stream) are delivered as successes, and the
rest fail by :func:`~.faults.fail_batches` (the runtime's fault report picks the task that gets
the first fault; the others get a ``DeviceFaultError`` caused by it, except, on a backend whose
task ids are stream positions, those before the faulted one, which finished). Their requests
become :attr:`orphans`: released only at the device's close, since nothing says the device is
done with them.

Who touches what. The submitter puts batches and forced closes (``LaneForce``) in the inbox, the
loop (or the finalizer of a device collected unclosed) puts the stop request (:meth:`stop`), the
waiter and the staging thread put ``POKE``, the prober its reports (``Probed``). Everything
else (``_outstanding``, the stall probes, the unstaging queue, the counters) is this thread's;
the loop reads :meth:`leftover_batches`, :attr:`at_exit` and :attr:`orphans` only after the
thread has exited (or been abandoned).

A forced stream close (``LaneForce``, :mod:`.forcing`) arrives behind every batch of its stream
(see the submitter for a parked stream's carried batch): the poller drops those batches (their
tasks fail as the forced close's, their requests become orphans), destroys the runtime stream by
force (through ``Prober.retire``: after its stall probe, if one is out) and sets ``done``; no
completion is ever reported for a stream destroyed under its work.

Shutdown. The stop request ends the thread at the next round, whatever is still outstanding
(``aclose`` waits for the work first, up to its timeout); the staging thread finishes the copy
in progress, what it finished is :attr:`at_exit` (resolved by the close), and the batches never
seen complete are :meth:`leftover_batches`. The device's close joins this thread first, before
any stream is destroyed, so nothing done to the streams can be reported as a completion (the
poller makes no call that waits on the device; a stall probe still under way is on the
prober's thread, which the close joins too, and whose stream is destroyed only after it). After
``Scheduler.abandon`` (a device collected unclosed), ``then`` closes the runtime from this
thread once the other threads have exited (however long a stuck call keeps one).
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import InternalError
from .._runtime import Runtime
from .._runtime.abi import ACL_EVENT_RECORDED_STATUS_COMPLETE
from .._runtime.threads import GilTurns, LoopPulse, reduce_timer_slack
from .binding import bound_for_life
from .counters import Counters
from .events import BatchEvents
from .faults import FaultState, as_device_fault, fail_batches
from .forcing import (
    STRANDED,
    STRANDED_RECORD,
    LaneForce,
    give_up,
    lost_records,
    strand,
    stranded_by,
    waits_on,
)
from .lifetimes import Lifetimes
from .stager import CopyWorker
from .stalls import Probed, Prober, StallProbes
from .watchdog import expire, log_expired, time_out
from .work import STAGE_AT_HAND_BYTES, Arrival, Batch, Delivery, Outcome, Request

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
        post: Callable[[Sequence[Arrival]], None],
        inbox: queue.SimpleQueue[Any],
        expire_waiting: Callable[[float], list[Delivery]],
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
        self._exit_lock = threading.Lock()
        #: by stream handle, only the streams with batches outstanding
        self._outstanding: dict[int, deque[Batch]] = {}
        self._pending = 0  # batches in _outstanding
        self._interval = poll_min_interval
        self._next_deadline_check = 0.0
        #: streams whose oldest batch does not complete are asked directly, by the prober's
        #: thread, one at a time (see stalls.py)
        self._stalls = StallProbes()
        self.prober = Prober(runtime, device_id, inbox.put)
        self._probe_out: int | None = None  # the stream of the probe not reported yet
        self._stop_asked = False  # set by stop(), from any thread
        self._unstager = CopyWorker(f"aio_ascend-unstage-{device_id}")
        #: finished batches handed to the staging thread, oldest first, and per stream handle
        #: how many (the stream's later batches follow them there, to stay in order)
        self._unstaging: deque[Batch] = deque()
        self._unstaging_streams: dict[int, int] = {}
        #: the staging thread's reports, one per batch, in order: each request's error
        self._unstaged: queue.SimpleQueue[list[BaseException | None]] = queue.SimpleQueue()
        #: what the staging thread finished while the poller was on its way out
        self.at_exit: list[Delivery] = []
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-poll-{device_id}", daemon=True
        )

    # --- any thread ------------------------------------------------------------------------

    def stop(self, *, then: Callable[[], None] | None = None) -> None:
        """Ask the thread to exit after its current round (and to call ``then`` on its way:
        once, from a thread of its own if it has exited already, as after a close that
        stopped half way)."""
        self._on_exit = then
        self._stop_asked = True
        self.prober.stop()
        self._inbox.put(_STOP)
        if then is not None and not self.thread.is_alive():
            threading.Thread(target=self._exit_hook, name=self.thread.name, daemon=True).start()

    def _exit_hook(self) -> None:
        with self._exit_lock:  # (once: the thread's way out may race a late stop)
            hook, self._on_exit = self._on_exit, None
        if hook is not None:
            hook()

    def leftover_batches(self) -> list[Batch]:
        """Batches never seen complete (after the thread exited, or was abandoned)."""
        leftovers = [batch for batches in self._outstanding.values() for batch in batches]
        self._outstanding.clear()
        leftovers.extend(self._unstaging)  # never copied into the user's arrays
        self._unstaging.clear()
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
        with bound_for_life(self._runtime):  # (let go of before the hook may close it)
            reduce_timer_slack()
            self._loop()
            self.prober.stop()  # (a probe under way goes on: the close joins, or abandons, it)
            self._unstager.finish()
            # What it copied out is done (resolved by the close, which no longer counts on the
            # loop for deliveries by then); what it never started is a leftover batch.
            self.at_exit = self._take_unstaged()
        self._exit_hook()

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
            deliveries = self._expire_waiting(time.monotonic())
            log_expired(self._device_id, deliveries, self._task_timeout)
            self._post(deliveries)
            return True
        return self._file(item)

    def _file(self, item: object) -> bool:
        """File a batch from the inbox; False on the stop sentinel."""
        if item is _STOP:
            return False
        if item is POKE:
            return True
        if type(item) is Probed:
            self._probed(item)
            return True
        if type(item) is LaneForce:
            self._destroy(item)
            return True
        assert isinstance(item, Batch)
        self._outstanding.setdefault(item.lane.handle, deque()).append(item)
        self._pending += 1
        if item.lane.stranded is not None or waits_on(item):
            self._strand_late(item)
        return True

    def _strand_late(self, batch: Batch) -> None:
        # Filed after its stream was stranded (queued behind a wait that never ends), or with
        # a wait submitted just before its event was found lost: it fails now, and the records
        # it holds are lost in turn (forcing.py)
        strand(batch.lane)
        deliveries = time_out(batch, STRANDED)
        lost = lost_records(self._runtime, (batch,), STRANDED_RECORD)
        if lost:
            deliveries.extend(stranded_by(lost, self._outstanding.values(), self._runtime))
        self._post(deliveries)

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
        if self._unstaging:
            self._post(self._take_unstaged())
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
            deliveries = expire(self._outstanding.values(), now, self._task_timeout)
            more = self._expire_waiting(now)
            log_expired(self._device_id, deliveries + more, self._task_timeout)
            self._post(deliveries + more)
            self._probe_stalled(now)
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

    def _probe_stalled(self, now: float) -> None:
        # A failed task the event queries cannot see (see stalls.py): the prober asks the
        # stream, one probe at a time; its report comes back through the inbox (_probed).
        due = self._stalls.due(self._outstanding, now)
        if due and self._probe_out is None and not self._stop_asked:
            # (a close may be destroying the streams once the stop is asked: no new probe)
            self._probe_out = due[0]
            self.prober.probe(due[0])

    def _probed(self, probed: Probed) -> None:
        self._probe_out = None
        if probed.error is not None:
            # a failure the probe found is the device's fault, as a failing query's is
            self._fail_all(probed.error)

    def _destroy(self, force: LaneForce) -> None:
        # Every batch of the stream is here already (it came behind them): none is reported
        # complete from now on, the stream is destroyed, and what the batches hold waits for
        # the device's close (a kernel or copy of theirs may still be running).
        lane = force.lane
        batches = self._outstanding.pop(lane.handle, None) or deque()
        self._stalls.forget((lane.handle,))
        self._pending -= len(batches)
        deliveries, held = give_up(batches)
        self.orphans.extend(held)
        # (looked at just before the destroy, not after: see forcing.py. A record that runs
        # between the two, or while the destroy waits for a stall probe, is taken as dropped)
        lost = lost_records(self._runtime, batches)
        if not lane.external:
            # (a stream being probed is destroyed after the probe: see stalls.py. Its work is
            # given up on now all the same)
            self.prober.retire_by_force(lane, self._runtime)
        if lost:
            deliveries.extend(stranded_by(lost, self._outstanding.values(), self._runtime))
        if self._watch is not None:
            self._watch_oldest()
        self._post(deliveries)
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
        idle: list[int] = []
        for handle, batches in self._outstanding.items():
            while batches and budget > 0:
                if query(batches[0].event) != ACL_EVENT_RECORDED_STATUS_COMPLETE:
                    break
                batch = batches.popleft()
                done.append(batch)
                budget -= len(batch.requests)
            if not batches:
                idle.append(handle)
        # Only streams with work outstanding stay: a round's cost must not grow with the
        # number of streams that ever had work (thousands of short-lived ones)
        for handle in idle:
            del self._outstanding[handle]
        if idle:
            self._stalls.forget(idle)
        return done

    def _complete(self, done: list[Batch]) -> None:
        arrivals: list[Arrival] = []
        finished: list[Request] = []
        unstaging = self._unstaging_streams
        now = time.perf_counter()  # one clock call per round: completed_at of all it completes
        for batch in done:
            self._events.give_back(batch.event)
            requests = batch.requests
            if batch.timed_out:  # its tasks failed already: their timestamps stay as they are
                # (and a timed-out copy never lands in user memory)
                arrivals.extend((req, None, Outcome.FINISHED_LATE) for req in requests)
                finished.extend(requests)
                continue
            if not unstaging and not any(req.needs_completion for req in requests):
                # nothing to finish on the host: the batch goes to the loop whole, which
                # stamps and resolves its requests (no per-request work on this thread)
                batch.completed = now
                arrivals.append(batch)
                finished.extend(requests)
                continue
            # a download to copy out here (or the stream's earlier ones being copied out by
            # the staging thread): request by request
            deliveries: list[Delivery] = []
            submitted = batch.submitted
            completing: list[int] = []
            for req in requests:
                req.submitted_at = submitted
                req.completed_at = now
                if req.needs_completion:
                    completing.append(len(deliveries))
                deliveries.append((req, None, Outcome.FINISHED))
            if batch.lane.handle in unstaging or any(
                deliveries[index][0].unstaged_bytes() > STAGE_AT_HAND_BYTES for index in completing
            ):
                self._unstage(batch)  # the staging thread's, in order with its stream's
                continue
            for index in completing:
                req = deliveries[index][0]
                error = _completed_on_host(req)
                if error is not None:
                    deliveries[index] = (req, error, Outcome.FINISHED)
            arrivals.extend(deliveries)
            finished.extend(requests)
        self._lifetimes.release(finished)
        self._post(arrivals)

    def _unstage(self, batch: Batch) -> None:
        handle = batch.lane.handle
        self._unstaging_streams[handle] = self._unstaging_streams.get(handle, 0) + 1
        self._unstaging.append(batch)
        self._unstager.put(lambda: self._copy_out(batch))

    def _copy_out(self, batch: Batch) -> None:
        # The staging thread: the batch's downloads into the users' arrays. Never raises.
        errors = [
            _completed_on_host(req) if req.needs_completion else None for req in batch.requests
        ]
        self._unstaged.put(errors)
        self._inbox.put(POKE)

    def _take_unstaged(self) -> list[Delivery]:
        # The staging thread's reports answer the oldest batches handed to it, in order.
        deliveries: list[Delivery] = []
        finished: list[Request] = []
        while self._unstaging:
            try:
                errors = self._unstaged.get_nowait()
            except queue.Empty:
                break
            batch = self._unstaging.popleft()
            handle = batch.lane.handle
            left = self._unstaging_streams.pop(handle) - 1
            if left:
                self._unstaging_streams[handle] = left
            for req, error in zip(batch.requests, errors, strict=True):
                deliveries.append((req, error, Outcome.FINISHED))
            finished.extend(batch.requests)
        self._lifetimes.release(finished)
        return deliveries

    def _fail_all(self, exc: BaseException) -> None:
        # A query that fails in stop-on-failure mode reports a broken device context,
        # whatever its code: it becomes the device's (sticky) fault.
        fault = as_device_fault(exc)
        first = self._faults.note(fault)
        # What finished is what an event query still says completed (a batch the fault's round
        # had not reached yet); a fault report never says it.
        done: list[Batch] = []
        batches: list[Batch] = []
        for queued in self._outstanding.values():
            finished = True
            for batch in queued:  # FIFO: nothing after a stream's unfinished batch finished
                finished = finished and self._still_completes(batch)
                (done if finished else batches).append(batch)
        self._outstanding.clear()
        self._stalls.clear()
        self._pending = 0
        if done:
            self._complete(done)
        for batch in batches:
            self.orphans.extend(batch.requests)
        try:
            site = self._runtime.fault_site()
        except Exception:
            site = None
        ordered = self._runtime.ordered_task_ids
        deliveries = fail_batches(batches, fault, first, site, ordered=ordered)
        now = time.perf_counter()
        for batch in batches:
            for req in batch.requests:
                req.submitted_at = batch.submitted
        for index, (req, error, outcome) in enumerate(deliveries):
            if error is None:  # finished before the fault (ordered ids only)
                req.completed_at = now
                if req.needs_completion:
                    error = _completed_on_host(req)
                    if error is not None:
                        deliveries[index] = (req, error, outcome)
        self._post(deliveries)

    def _still_completes(self, batch: Batch) -> bool:
        try:
            status = self._runtime.query_event_status(batch.event)
        except Exception:
            return False  # a halted context answers with the fault: nothing more is known
        return status == ACL_EVENT_RECORDED_STATUS_COMPLETE


def _completed_on_host(req: Request) -> BaseException | None:
    """Run ``req``'s host-side completion (a download's copy into the user's array); the error
    its task gets instead if that fails (a bug of ours), else None."""
    try:
        req.on_complete()
    except BaseException as exc:
        return InternalError(f"completing {req.kind} failed: {exc!r}")
    return None
