"""The submitter thread (``aio_ascend-submit-<device>``): the one thread that queues work on the
device's streams.

What it is for. The loop never makes a submitting runtime call itself: once per loop tick
``Scheduler.flush`` hands it the tick's requests as one :class:`~.batching.Hop` (with the
deadline of their tasks), and this thread submits them in call order, records a batch event
after each request that closes a batch (:func:`~.batching.form_batches` marked them) and passes
each recorded :class:`~.work.Batch` to the poller. Consecutive plain launches (no launch config)
go to the runtime in one ``launch_batch`` call: the backend's own where it has one, else
:class:`~aio_ascend._runtime.pybatch.PythonBatch`; where that call stops (a refusal, or a launch
it leaves to the per-launch method), the per-request loop goes on from there.

Invariants.

- Call order per stream: requests reach the runtime in the order they were enqueued, and a
  batch's event is recorded after its last request, so "the event completed" means "the whole
  batch completed" (streams are FIFO).
- A hop is taken by this thread or expired by the poller's watchdog, never both
  (:meth:`Hop.take` / :meth:`Hop.expire` race for one token). A hop this thread reaches only
  after its deadline is not submitted: its tasks fail with ``TaskTimeoutError`` and what they
  held is released at once (the device never saw them).
- Admission keeps every stream's queued entries within the backend's stream capacity, so a
  submitting call should never wait for queue space. Should one block anyway (a hung device; an
  external stream that someone else's work fills too; a ``stream_capacity`` above the real
  queue's depth), the device's close abandons the thread 2 s later (``JOIN_TIMEOUT_S``) and
  never destroys a stream it may be inside a call on (``underway.streams()``): the real runtime
  frees a stream destroyed by force under a thread waiting for room on it, and that thread then
  crashes the process (``docs/cann-support.md`` §13.3). The close marks every stream ``forced``
  first, so a call that returns later is the last one this thread makes on them.
- Who fails how: a runtime refusal (``AscendError``) fails its request and, with it as the
  cause, the rest of that stream's hop (``broken``: what follows may rely on it); any other
  exception raised submitting a request (a bug of ours) does the same as an ``InternalError``,
  and one raised anywhere else in a hop fails what nobody settled (:mod:`.underway`), the thread
  going on either way. Once the device has faulted (``FaultState.first``), every later request
  fails with an error caused directly by that first fault. A stream marked ``forced`` (its close
  gave up waiting) gets nothing submitted: its requests fail as the forced close's.
- Submitted work whose batch event could not be recorded (or a ``launch_batch`` call that raised
  part-way, or a hop a defect of ours cut short: maybe never submitted) can never be observed
  complete: its tasks fail, and its requests go to :attr:`Submitter.orphans`, released only at
  the device's close, after the streams are gone.

Who touches what. The loop thread calls :meth:`submit` (appends to :attr:`waiting`, puts the hop
in the inbox), :meth:`force` and :meth:`stop`; after the thread has exited (or been abandoned)
it reads :meth:`unsubmitted`, ``underway.requests()`` and :attr:`orphans`, and a close that
finds it alive reads ``underway.streams()`` (:mod:`.underway`). The poller thread calls
:meth:`expire_waiting` (the watchdog over hops not taken yet; it only reads ``waiting``). A
staging thread runs :meth:`_prepare` and reports back through the inbox. Every other attribute
(the parked streams, the carried batches, ``Lane.submitted``, ``Request.position``, the
counters) is this thread's alone.

Big copies (over ``STAGE_AT_HAND_BYTES``, 1 MiB): allocating and filling their pinned buffer
takes tens to hundreds of milliseconds, so it is done by this thread's staging thread (a
:class:`~.stager.CopyWorker`). Meanwhile the copy's stream is *parked*: its later requests, from
this hop and the next ones, wait in order (each with its hop's deadline), and the batch it had
open is *carried* (submitted, its event not recorded yet); the other streams go on. The staging
thread's ``_Staged`` report comes back through the inbox, behind the hops queued meanwhile, and
resumes the stream; what waited past its deadline is not submitted.

Parks end by their deadlines. A report may never come (a staging call that hangs in the runtime,
a record parked behind one), so while anything is parked this thread waits for its inbox only
until the first parked deadline. The request a stream is parked at that is still unresolved
then is given up on (:meth:`Submitter._give_up`): a wait fails at once; a big copy fails as
timed out (``TIMED_OUT``) but keeps its buffer and slot until the staging thread's report, which
is late now (:meth:`Submitter._late_report`): the staging thread may still be writing into that
buffer. The stream then goes on as a resume does. A stream forced while parked is given up on
the same way at once, when its ``LaneForce`` comes through, with the forced close's error (its
copy's slot goes back then: the stream admits nothing more, and its close waits for its slots).
A device close that finds the staging call still running waits for it with the submitter, and
leaks rather than free under it (a collected device's delayed close waits for it to return).

Waits across streams. A stream's ``wait_event`` whose event's record is parked on another
stream would not wait if submitted first: an event never recorded reads complete
(``docs/acl-runtime.md``, "Unrecorded events"), so the wait's work would run before what it
waits for. Its stream is parked too, at that wait, until the record has reached the runtime or
failed (:meth:`_unblock`, whose report resumes it through the inbox like a staging report).
Records precede their waits in loop order, so such parks never wait on each other in a cycle.

Ordering in the inbox (one FIFO): a ``LaneForce`` is passed on to the poller only after every
hop handed over before it, so it reaches the poller behind every batch those hops gave its
stream (a stream parked at that moment is the exception: the poller may destroy it before the
staging report arrives, so its carried batch is never recorded: it fails as the forced close's,
and what it holds waits for the device's close). The stop request is seen after every hop queued
before it, which is therefore handled (submitted, or failed past its deadline) first.

GIL: every 32 requests and after each hop the thread offers the GIL
(:class:`~aio_ascend._runtime.threads.GilTurns`), but only to a loop that has not run for
``LOOP_STARVED_S``. Memory: no reference to finished work may outlive a hop in this thread's
frames while it blocks on the inbox (it would keep tasks, and through them public objects,
alive); ``forget_frames`` clears the frames that the tracebacks of caught errors hold.

Cancellation: cancelling a coroutine that awaits a task does not take its request back: once
enqueued it is submitted (unless its stream is forced or its deadline has passed), and it holds
its buffers until the device is done with it. Dropping unsubmitted work is the loop's
(``aclose(cancel=True)`` drops requests not yet flushed). On the way out (``_STOP``) the staging
thread finishes its current job and drops the others; parked and carried requests are handed
back by :meth:`unsubmitted`, and their tasks fail at the close.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .._errors import AscendError, InternalError, RuntimeAPIError, TaskTimeoutError, derived_error
from .._host.pool import HostBuffer
from .._runtime import Runtime
from .._runtime.base import LaunchBatch
from .._runtime.pybatch import PythonBatch
from .._runtime.threads import GilTurns, LoopPulse
from .batching import Hop
from .binding import bound_for_life
from .counters import Counters
from .events import BatchEvents, EventRecord
from .faults import FaultState, classify_refusal
from .forcing import LaneForce, gave_up
from .frames import forget_frames
from .lane import Lane
from .lifetimes import Lifetimes
from .stager import CopyWorker
from .underway import Underway
from .watchdog import log_expired
from .work import Arrival, Batch, Delivery, Launch, Outcome, RecordEvent, Request, WaitEvent

__all__ = ["Submitter"]

_STOP = object()
#: nothing came in before a parked request's deadline (see _get_or_expire)
_EXPIRED = object()
#: how long after its record a batch recorded past its deadline is given to be seen complete
_LATE_BATCH_GRACE_S = 0.1
#: the longest single wait for the inbox while a stream is parked (a deadline may be far off)
_LONGEST_GET_S = 3600.0
#: a request whose stream waits for a big copy's staging (not an error: it is queued)
_PARKED = InternalError("parked")


class _Staged:
    """The report that ``request``, at which its stream is parked, may go on: the big copy is
    staged (or failed to be, with ``error``), or the record the wait waits for has been made.
    A report for a request the thread has given up on meanwhile (:meth:`Submitter._give_up`)
    is late: its stream has moved on."""

    __slots__ = ("error", "lane", "request")

    def __init__(self, request: Request, error: BaseException | None) -> None:
        self.request = request
        self.lane = request.lane
        self.error = error


class Submitter:
    """The thread ``aio_ascend-submit-<device>`` and what only it touches.

    :param post: hands deliveries to the loop (non-blocking; counts a wake-up when it did)
    :param stage: a pooled staging buffer for a big copy (taken by the staging thread)
    :param to_poller: passes a recorded batch to the poller
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
        stage: Callable[[int], HostBuffer],
        to_poller: Callable[[Batch | LaneForce], None],
        task_timeout: float,
        pulse: LoopPulse | None = None,
    ) -> None:
        self._runtime = runtime
        #: when to hand the loop the GIL: hops that follow each other add up (see LoopPulse)
        self._turns = GilTurns(pulse or LoopPulse())
        self._faults = faults
        self._lifetimes = lifetimes
        self._events = batch_events
        self._post = post
        self._stage = stage
        self._to_poller = to_poller
        self._task_timeout = task_timeout
        self._device_id = device_id
        self.counters = Counters()
        #: submitted work whose completion can never be observed (its batch event could not be
        #: recorded): its resources are released at close, after the streams are destroyed
        self.orphans: list[Request] = []
        self._probe_event: int | None = None  # never recorded: see _context_is_healthy
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: hops handed over and not yet taken, oldest first (read by the watchdog)
        self.waiting: deque[Hop] = deque()
        #: the hop or parked stream's resume the thread is in (for a close that abandons it)
        self.underway = Underway()
        #: streams waiting for a big copy's staging: their requests in order (with the
        #: deadline of the hop each came in), the first one being staged
        self._parked: dict[Lane, list[tuple[Request, float]]] = {}
        #: the batch a parked stream had open: submitted, its event not yet recorded
        self._carried: dict[Lane, list[Request]] = {}
        #: the waits parked until the event's record (parked on another stream) reaches the
        #: runtime: by event
        self._blocked: dict[EventRecord, list[WaitEvent]] = {}
        #: big copies given up on while the staging thread had them, each with whether its
        #: slot is still taken (TIMED_OUT): failed, what they hold kept until the staging
        #: thread's report says it is done with them
        self._abandoned: list[tuple[Request, bool]] = []
        self._blocked_lock = threading.Lock()  # (the poller's watchdog fails records too)
        self._stager = CopyWorker(f"aio_ascend-stage-{device_id}")
        #: runtime errors caught in the hop being submitted (see .frames)
        self._caught: list[BaseException] = []
        #: the runs of launches of a runtime without a native batch call
        self._python_batch = PythonBatch(runtime)
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-submit-{device_id}", daemon=True
        )

    @property
    def stage_thread(self) -> threading.Thread:
        """The staging thread (not started until the first big copy): the submitter waits
        for its job in progress on its way out."""
        return self._stager.thread

    # --- any thread ------------------------------------------------------------------------

    def submit(self, hop: Hop) -> None:
        """Hand one tick's requests over (loop thread, non-blocking)."""
        self.waiting.append(hop)
        self._inbox.put(hop)

    def force(self, force: LaneForce) -> None:
        """Pass ``force`` on to the poller after the hops handed over so far (loop thread):
        its stream, marked ``forced`` before, gets nothing submitted from then on."""
        self._inbox.put(force)

    def stop(self) -> None:
        """Ask the thread to exit once it has finished the hop it is in."""
        self._inbox.put(_STOP)

    def unsubmitted(self) -> list[Request]:
        """Requests of hops nobody took (after the thread exited, or was abandoned)."""
        out: list[Request] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Hop) and item.take():
                out.extend(item.requests)
        # Parked requests never reached the runtime; a carried batch did, without its event
        # (the streams are destroyed before any of this is released).
        for queued in self._parked.values():
            out.extend(req for req, _ in queued)
        for batch in self._carried.values():
            out.extend(batch)
        self._parked.clear()
        self._carried.clear()
        self.stop()  # the stop request was taken out too; an abandoned thread still needs it
        return out

    def take_abandoned(self) -> list[Request]:
        """Big copies given up on whose staging report was not handled (after the thread
        exited): failed already (their failure may still be on its way to the loop), so only
        what they hold is left to release (by the close: never resolved again)."""
        out, self._abandoned = self._abandoned, []
        return [req for req, _ in out]

    def expire_waiting(self, now: float) -> list[Delivery]:
        """The watchdog (poller thread): fail the hops still waiting past their deadline.

        Their requests never reach the runtime; what they held is released at once.
        """
        deliveries: list[Delivery] = []
        for hop in list(self.waiting):
            if hop.deadline > now:
                break
            if hop.expire():
                deliveries.extend(self._never_started(hop))
        return deliveries

    def _never_started(self, hop: Hop) -> list[Delivery]:
        deliveries: list[Delivery] = []
        for req in hop.requests:
            self._refuse(req, self._not_submitted(req), deliveries)
        return deliveries

    # --- the thread ------------------------------------------------------------------------

    def _main(self) -> None:
        with bound_for_life(self._runtime):
            self._serve()

    def _serve(self) -> None:
        get = self._inbox.get
        parked = self._parked
        while True:
            # No reference to past work may survive in this frame while it blocks: it would
            # keep finished requests (and through their tasks the public objects) alive.
            if self._caught:
                forget_frames(self._caught)
            try:
                item = self._get_or_expire() if parked else get()
                if item is _STOP:
                    self._stager.finish()  # its reports stay in the inbox: see unsubmitted()
                    return
                self._take(item)
            except BaseException as exc:  # pragma: no cover - defensive: never lose a request
                self._lost(exc)
            item = None

    def _take(self, item: Any) -> None:
        # one message of the inbox: a staging report, a forced stream, or a hop
        parked = self._parked
        if type(item) is _Staged:
            queued = parked.get(item.lane)
            if queued is not None and queued[0][0] is item.request:
                self._resume(item.lane, item.error)
            else:
                self._late_report(item.request)
            return
        if item is _EXPIRED:
            return
        if type(item) is LaneForce:
            self._to_poller(item)  # behind every batch its stream got
            if item.lane in parked:  # nothing of a forced stream waits for its report
                self._resume(item.lane, None, overdue=True)
            self._free_slots(item.lane)
            return
        waiting = self.waiting
        while waiting and waiting[0] is not item:
            waiting.popleft()  # expired by the watchdog
        if waiting:
            waiting.popleft()
        if not item.take():
            return
        if time.monotonic() >= item.deadline:
            expired = self._never_started(item)
            log_expired(self._device_id, expired, self._task_timeout)
            self._post(expired)
        else:
            self.underway.hop = item
            self._hop(item)
            self.underway.hop = None
            self._turns.offer()  # hops of a few requests add up too

    def _lost(self, exc: BaseException) -> None:
        # A defect of ours in the middle of a hop or a resume: its requests fail (once: see
        # Underway) rather than wait for good, and the thread goes on.
        parked = (req for queued in self._parked.values() for req, _ in queued)
        carried = (req for batch in self._carried.values() for req in batch)
        failures, lost = self.underway.lost([*parked, *carried])
        self.orphans.extend(lost)
        self._caught.append(exc)  # (its traceback's frames hold the hop: see .frames)
        error = InternalError(f"submitter failed: {type(exc).__name__} (the cause)")
        error.__cause__ = exc  # (not its repr in the message: that may raise too)
        for req in lost:
            if type(req) is RecordEvent:  # a wait for it must not wait for good
                if not req.event.recorded:
                    req.on_refused(error)
                if self._blocked:
                    self._unblock(req.event)
        self._post([*failures, *((req, error, Outcome.FINISHED) for req in lost)])

    def _hop(self, hop: Hop) -> None:
        open_batches: dict[Lane, list[Request]] = {}
        failures = self.underway.begin()
        self._submit(hop.requests, hop.deadline, open_batches, {}, failures)
        for lane, batch in open_batches.items():  # only if batches were not marked
            if batch:
                self._close_batch(lane, batch, hop.deadline, failures)
        self.underway.end()
        self._post(failures)

    def _submit(
        self,
        requests: list[Request],
        deadline: float,
        open_batches: dict[Lane, list[Request]],
        broken: dict[Lane, BaseException],
        failures: list[Delivery],
    ) -> None:
        runtime = self._runtime
        task_id = runtime.last_task_id  # the runtime's id of what this thread just submitted
        #: the runtime's one call for a run of plain launches; None: launches go one by one
        launch_batch: LaunchBatch = getattr(runtime, "launch_batch", None) or self._python_batch
        counters = self.counters
        faults = self._faults
        parked = self._parked
        #: plain launches that passed their checks, submitted together by one launch_batch
        #: call when the run ends: before anything else is looked at, and after a launch that
        #: closes a batch (its event must follow it)
        run: list[Request] = []
        slow = -1  # the index of a launch the batch call left to the per-launch method
        index = 0
        total = len(requests)
        while index < total or run:
            if run and (index == total or run[-1].closes_batch):
                index, slow = self._flush(
                    launch_batch, run, index, open_batches, broken, failures, deadline, slow
                )
                continue
            req = requests[index]
            if index & 31 == 31:
                self._turns.offer()
            lane = req.lane
            if parked and lane in parked:  # behind a big copy being staged: in order
                error: BaseException | None = _PARKED
            else:
                error = broken.get(lane)
                first = faults.first
                if first is not None:
                    # the device fault is every later task's cause, directly: also when the
                    # refusal that broke this stream's hop was that fault noted by the poller
                    # in between
                    error = derived_error(first, "device faulted earlier")
                elif error is not None:
                    error = derived_error(error, "not submitted: an earlier request was refused")
                elif lane.forced:  # its stream is being destroyed by force
                    error = gave_up(req.kind)
                elif type(req) is Launch and req.spec.cfg is None and index != slow:
                    run.append(req)  # submitted with its run (its position set there)
                    index += 1
                    continue
            if run:  # the run goes first; this one is looked at again after it
                index, slow = self._flush(
                    launch_batch, run, index, open_batches, broken, failures, deadline, slow
                )
                continue
            index += 1
            if error is _PARKED:
                parked[lane].append((req, deadline))
                continue
            if error is None:
                try:
                    if type(req) is Launch:
                        req.submit(runtime, lane.handle)
                        counters.launches += 1
                    else:
                        if req.host is None and req.staged:  # a big copy: staged aside
                            self._park(req, deadline, open_batches)
                            continue
                        if type(req) is WaitEvent and req.record_pending():  # its record is
                            self._hold(req, deadline, open_batches)  # parked: so is this stream
                            self._block(req)
                            continue
                        req.submit(runtime, lane.handle)
                        if req.is_copy:
                            counters.copies += 1
                except AscendError as exc:  # the runtime refused: the rest of the stream's hop
                    self._caught.append(exc)
                    error = broken[lane] = self._classify(exc)  # fails with it as cause
                except Exception as exc:  # a bug of ours: so does the rest (what follows may
                    # rely on it: a wait's order, a copy's data), and the thread goes on
                    self._caught.append(exc)
                    error = broken[lane] = InternalError(
                        f"submitting {req.kind} failed: {type(exc).__name__}"
                    )
                    error.__cause__ = exc
                else:
                    tid = task_id()
                    req.position = -1 if tid is None else tid
            self._place((req,), error, open_batches, deadline, failures)

    def _flush(
        self,
        launch_batch: LaunchBatch,
        run: list[Request],
        index: int,
        open_batches: dict[Lane, list[Request]],
        broken: dict[Lane, BaseException],
        failures: list[Delivery],
        deadline: float,
        slow: int,
    ) -> tuple[int, int]:
        """Submit ``run`` (the plain launches just before ``requests[index]``) with one
        ``launch_batch`` call. Returns where to go on from, and the index of the launch left to
        the per-launch method (else ``slow`` as it was): ``index``; or where the run stopped,
        the request after a refused launch (its stream's later requests are refused from it
        on), or a launch that the per-launch method must submit."""
        try:
            submitted, refusal = launch_batch(run)
        except Exception as exc:
            # The native loop may have launched any part of the run (a bug of ours, or no
            # memory left for its result): submitted work we cannot track, as in _close_batch.
            # Its tasks fail, what they hold stays until the device closes, and their streams'
            # later requests in this hop are refused; nothing already placed is touched.
            self._caught.append(exc)
            lost = InternalError(f"submitting a run of launches failed: {exc!r}")
            lost.__cause__ = exc
            self.orphans.extend(run)
            for req in run:
                broken[req.lane] = lost
                failures.append((req, lost, Outcome.FINISHED))
            run.clear()
            return index, slow
        self.counters.launches += submitted
        self._place_run(run[:submitted], open_batches, deadline, failures)
        rest = len(run) - submitted
        if rest:
            stopped = run[submitted]
            index -= rest
            if refusal is None:
                slow = index
            else:
                self._caught.append(refusal)
                error = broken[stopped.lane] = self._classify(refusal)
                self._place((stopped,), error, open_batches, deadline, failures)
                index += 1
        run.clear()
        return index, slow

    def _place_run(
        self,
        run: list[Request],
        open_batches: dict[Lane, list[Request]],
        deadline: float,
        failures: list[Delivery],
    ) -> None:
        """A run of launches was submitted: :meth:`_place`, the whole run at once where it is
        one stream's (the usual case). Only its last launch can close a batch: a run is
        submitted as soon as one does."""
        if not run:
            return
        lane = run[0].lane
        if not all(req.lane is lane for req in run):
            self._place(run, None, open_batches, deadline, failures)
            return
        lane.submitted += len(run)  # (a launch is one runtime task)
        if lane.handover is not None:
            for req in run:
                lane.handover.decided(req)
        batch = open_batches.get(lane)
        if batch is None:
            open_batches[lane] = batch = run
        else:
            batch.extend(run)
        if run[-1].closes_batch:
            del open_batches[lane]
            self._close_batch(lane, batch, deadline, failures)

    def _place(
        self,
        requests: Sequence[Request],
        error: BaseException | None,
        open_batches: dict[Lane, list[Request]],
        deadline: float,
        failures: list[Delivery],
    ) -> None:
        """Requests were submitted (``error`` None) or refused: into their stream's open
        batch, or their failure; a batch is closed after the request that closes it."""
        for req in requests:
            lane = req.lane
            if error is not None:
                self._refuse(req, error, failures)
            else:
                lane.submitted += req.runtime_tasks
                if lane.handover is not None:
                    lane.handover.decided(req)
                batch = open_batches.get(lane)
                if batch is None:
                    open_batches[lane] = [req]
                else:
                    batch.append(req)
                if self._blocked and type(req) is RecordEvent:
                    self._unblock(req.event)
            if req.closes_batch:
                batch = open_batches.pop(lane, None)
                if batch:
                    self._close_batch(lane, batch, deadline, failures)

    # --- big copies: staged aside while their stream waits ----------------------------------

    def _park(self, req: Request, deadline: float, open_batches: dict[Lane, list[Request]]) -> None:
        self._hold(req, deadline, open_batches)
        self._stager.put(partial(self._prepare, req, deadline))  # (no frame of its own)

    def _hold(self, req: Request, deadline: float, open_batches: dict[Lane, list[Request]]) -> None:
        # Park ``req``'s stream at ``req``: its later requests queue behind it, in order.
        lane = req.lane
        self._parked[lane] = [(req, deadline)]
        batch = open_batches.pop(lane, None)
        if batch:  # its event is recorded after the stream resumes, with the rest
            self._carried[lane] = batch

    def _block(self, wait: WaitEvent) -> None:
        # ``wait``'s stream is parked until its event's record is made (or fails). The record
        # may be failed on the poller's thread meanwhile (its hop expired by the watchdog):
        # registered first, then looked at again, so that one side resumes the stream.
        with self._blocked_lock:
            self._blocked.setdefault(wait.event, []).append(wait)
        if not wait.record_pending():
            self._unblock(wait.event)

    def _unblock(self, event: EventRecord) -> None:
        # ``event``'s record reached the runtime (or failed; any thread): the streams parked
        # at a wait for it resume, after the hops already in the inbox (whose requests queue
        # behind). Whoever takes the entry resumes them: once.
        with self._blocked_lock:
            waits = self._blocked.pop(event, ())
        for wait in waits:
            self._inbox.put(_Staged(wait, None))

    def _prepare(self, req: Request, deadline: float) -> None:
        # The staging thread: allocate and fill (an upload) the copy's pinned buffer. Never
        # raises: the stream resumes on every report.
        error: BaseException | None = None
        if time.monotonic() < deadline and not req.lane.forced:  # else it is never submitted
            try:
                req.prepare(self._stage)
            except BaseException as exc:
                error = exc
                forget_frames([exc])  # (the finished frames below this one hold the copy)
        self._inbox.put(_Staged(req, error))
        del req, error  # (nor may this one, which the error's traceback holds)

    def _get_or_expire(self) -> Any:
        # A stream is parked: its report may never come (a staging call that hangs, a record
        # stuck behind one), and its requests must still end by their deadlines. So the inbox
        # is waited on only until the first parked deadline, and what is parked past its
        # deadline is given up on first.
        self._resume_overdue()
        if self._caught:
            forget_frames(self._caught)
        if not self._parked:
            return self._inbox.get()
        wait = min(queued[0][1] for queued in self._parked.values()) - time.monotonic()
        try:
            return self._inbox.get(timeout=min(max(wait, 0.0), _LONGEST_GET_S))
        except queue.Empty:
            return _EXPIRED

    def _resume_overdue(self) -> None:
        # (not in _get_or_expire: no lane may stay in that frame while it blocks)
        now = time.monotonic()
        for lane in [lane for lane, queued in self._parked.items() if queued[0][1] <= now]:
            self._resume(lane, None, overdue=True)

    def _late_report(self, request: Request) -> None:
        # The report of a request given up on (_give_up): a wait's needs nothing; a staged
        # copy's buffer is the staging thread's no longer, so what it holds goes back now.
        for index, (abandoned, slot_taken) in enumerate(self._abandoned):
            if abandoned is request:
                del self._abandoned[index]
                self._lifetimes.release((request,))
                if slot_taken:
                    self._post([(request, None, Outcome.FINISHED_LATE)])
                return

    def _free_slots(self, lane: Lane) -> None:
        # ``lane`` is forced: its copies given up on earlier (TIMED_OUT) give their slots back
        # now, as the poller's timed-out batches do (its close waits for them); their buffers
        # still wait for the staging thread's report (_late_report).
        late = [req for req, taken in self._abandoned if taken and req.lane is lane]
        if late:
            self._abandoned = [(r, t and r.lane is not lane) for r, t in self._abandoned]
            self._post([(req, None, Outcome.FINISHED_LATE) for req in late])

    def _give_up(self, holder: Request, failures: list[Delivery]) -> None:
        # The request ``holder``'s stream is parked at passed its deadline before its report
        # came, or its stream was forced: it fails, and the stream goes on without it.
        if holder.lane.forced:  # (the forced close's error; it logged its own line)
            error: BaseException = gave_up(holder.kind)
        else:
            is_wait = type(holder) is WaitEvent
            why = (
                "the event it waits for was not recorded" if is_wait else "its staging did not end"
            )
            error = self._not_submitted(holder, why + " in time")
            log_expired(self._device_id, [(holder, error, Outcome.TIMED_OUT)], self._task_timeout)
        if type(holder) is WaitEvent:
            with self._blocked_lock:  # (its report is late now if the record comes after all)
                waits = self._blocked.get(holder.event, [])
                if holder in waits:
                    waits.remove(holder)
                    if not waits:
                        del self._blocked[holder.event]
            self._refuse(holder, error, failures)
        else:
            # A big copy the staging thread may be filling: its buffer is not ours to give
            # back until the report (_late_report); its slot stays taken meanwhile, as for
            # timed-out work the device may still run, unless its stream was forced (which
            # admits nothing more, and whose close waits for its slots).
            slot_taken = not holder.lane.forced
            self._abandoned.append((holder, slot_taken))
            outcome = Outcome.TIMED_OUT if slot_taken else Outcome.FINISHED
            failures.append((holder, error, outcome))
            if holder.lane.handover is not None:
                holder.lane.handover.decided(holder)

    def _not_submitted(self, req: Request, why: str = "") -> TaskTimeoutError:
        return TaskTimeoutError(
            f"{req.kind} was not submitted within task_timeout={self._task_timeout:g}s "
            f"({why + ': ' if why else ''}it never reached the device)"
        )

    def _resume(self, lane: Lane, error: BaseException | None, *, overdue: bool = False) -> None:
        """The request ``lane`` is parked at may go on (``error``: its staging failed), or
        (``overdue``) passed its deadline first: then the stream's parked requests are
        submitted (up to the next big copy), in order, hop by hop; what waited past its
        deadline is never submitted."""
        self.underway.resuming = (lane, self._resumes(lane))
        queued = self._parked.pop(lane)
        carried = self._carried.pop(lane, None)
        broken: dict[Lane, BaseException] = {}
        failures = self.underway.begin()
        if carried and lane.forced:
            # Forced while parked: the poller may have destroyed the stream already (its
            # LaneForce did not wait for this report), so no event may be recorded on it. The
            # carried work was submitted: its tasks fail as the forced close's, and what it
            # holds waits for the device's close, as the poller does with a forced batch.
            self.orphans.extend(carried)
            failures.extend((req, gave_up(req.kind), Outcome.FINISHED) for req in carried)
            carried = None
        open_batches = {lane: carried} if carried else {}
        # the carried batch's deadline when nothing else joins it: the one it was parked at
        # (the latest of its requests'), never none at all (the watchdog would fail it at once)
        last = queued[0][1]
        if overdue:
            self._give_up(queued.pop(0)[0], failures)
        elif error is not None:
            first, _ = queued.pop(0)
            exc = error
            if isinstance(exc, AscendError):  # the rest of the stream fails with it as cause
                error = broken[lane] = self._classify(exc)
            else:
                error = InternalError(f"staging {first.kind} failed: {exc!r}")
                error.__cause__ = exc
            self._refuse(first, error, failures)
        while queued:
            deadline = queued[0][1]
            count = next((i for i, (_, d) in enumerate(queued) if d != deadline), len(queued))
            group = [req for req, _ in queued[:count]]
            del queued[:count]
            last = deadline
            if time.monotonic() >= deadline and lane not in self._parked:
                expired = self._never_started(Hop(group, deadline))
                log_expired(self._device_id, expired, self._task_timeout)
                failures.extend(expired)
                continue
            self._submit(group, deadline, open_batches, broken, failures)
        # A batch recorded only now, past its deadline (carried through a park that ended
        # overdue, nothing in time behind it): the watchdog would fail it before its first
        # query could see it complete, work the device finished long ago included.
        last = max(last, time.monotonic() + _LATE_BATCH_GRACE_S)
        for open_lane, batch in open_batches.items():
            if batch:
                self._close_batch(open_lane, batch, last, failures)
        self.underway.end()
        self._post(failures)
        self.underway.resuming = None

    def _resumes(self, lane: Lane) -> list[Request]:
        # what resuming ``lane`` may submit: its carried batch, then its parked requests
        return [*self._carried.get(lane, ()), *(req for req, _ in self._parked[lane])]

    def _refuse(self, req: Request, error: BaseException, failures: list[Delivery]) -> None:
        # never reaching the device: what it holds goes back now, and its task fails
        req.on_refused(error)
        if self._blocked and type(req) is RecordEvent:
            self._unblock(req.event)  # (a wait for it fails: the event was never recorded)
        self._lifetimes.release((req,))
        failures.append((req, error, Outcome.FINISHED))
        if req.lane.handover is not None:
            req.lane.handover.decided(req)

    def _classify(self, exc: BaseException) -> BaseException:
        return classify_refusal(exc, self._faults, self._context_is_healthy)

    def _context_is_healthy(self) -> bool:
        # Querying an event that was never recorded fails only on a broken context.
        try:
            if self._probe_event is None:
                self._probe_event = self._events.create()
            self._runtime.query_event_status(self._probe_event)
        except RuntimeAPIError:
            return False
        return True

    def _close_batch(
        self, lane: Lane, requests: list[Request], deadline: float, failures: list[Delivery]
    ) -> None:
        try:
            event = self._events.take()
            self._runtime.record_event(event, lane.handle)
        except BaseException as exc:
            # Submitted work we cannot track: fail its tasks, keep its resources until close.
            self._caught.append(exc)
            error = self._classify(exc)
            self.orphans.extend(requests)
            failures.extend((req, error, Outcome.FINISHED) for req in requests)
            return
        lane.submitted += 1  # the event record is a task of the stream too
        self.counters.batches += 1
        # one clock call per batch: its tasks' submitted_at (stamped by the poller)
        self._to_poller(Batch(lane, requests, event, deadline, time.perf_counter()))
        self.underway.handed.append(requests)
