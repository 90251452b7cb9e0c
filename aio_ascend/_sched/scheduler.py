"""``Scheduler``: one device's scheduling core, on the event-loop side.

What it is for. The public facades validate user input and call it; it decides when work goes
out and carries that out through what it creates and wires together: the submitter and poller
threads (and block mode's waiter), the host buffer pool, the lifetimes of device allocations,
event handles, the delivery queue, the failure log. It owns the pending requests of the current
loop tick, flush scheduling, ``unsettled`` (requests admitted and not yet resolved), the idle
and close waiters, the lanes, and the lanes of dropped streams.

One request's way through it, all on the loop thread: :meth:`try_admit` (no wait) or
:meth:`admit` (FIFO wait) checks :meth:`check_usable` (one flat test: stream and device open,
this loop's thread, no fault), takes a slot on the stream's admission and counts the request in
``unsettled``; :meth:`enqueue` (the one way in for every operation) takes its pinned staging
buffer (a big copy's is taken by its staging thread later), retains its device memory, makes it
the stream's latest task and appends it to the pending list; :meth:`flush`, once per loop tick
(``call_soon``) or at once at ``min(batch_cap, 256)`` pending requests (then ``yield_due`` makes
the next admission yield to the loop once, so a tight launch loop cannot hold it), forms the
batches, stamps the hop's deadline (the watchdog's clock starts within a tick of admission) and
hands the hop to the submitter. The flush also beats the loop's heartbeat (``LoopPulse``) and
does the loop's deferred chores (recycling collected events, reaping collected allocations,
retiring dropped streams). The outcomes come back through ``Posting.post``; the delivery queue
resolves them and reports to :meth:`_on_settled`, which takes them off ``unsettled`` and wakes a
close waiting for idle.

Which thread touches what. Everything is the loop thread's (the one that opened the device; the
calls that queue work refuse other threads with ``RuntimeError``), except ``Posting.post`` (the
library threads: one non-blocking ``call_soon_threadsafe`` per round, under its lock);
:meth:`retire_event`, :meth:`drop_record`, :meth:`drop_lane` and :meth:`abandon` (finalizers, on
any thread: they only append, hand the work to the loop with ``call_soon_threadsafe``, or ask
the threads to stop); and :meth:`bound`, which binds the device's context around each call on
whichever thread makes it. The threads have no other way in than their inboxes and ``post``,
and none of them ever waits for the loop.

Invariants.

- The scheduler holds lanes, never ``Stream`` objects, and public objects hold the scheduler,
  not the reverse: a dropped ``Stream`` or ``Device`` is collected, and its finalizer calls
  :meth:`drop_lane` / :meth:`abandon`.
- ``unsettled`` counts each admitted request until it is first resolved (finished, failed, timed
  out or dropped); :meth:`aclose` waits for it to reach 0, up to its timeout.
- A fault is sticky: once ``FaultState.first`` is set, every :meth:`check_usable` refuses with
  an error caused by it, until the device is closed and reopened.

Posting. The threads' outcomes reach the loop through :class:`~.posting.Posting`, which keeps
those the loop never took (it finished) until an :meth:`aclose` from another loop adopts the
device; a forced close holds them back the same way (:mod:`.shutdown`; :mod:`.forcing`).

Cancellation. A coroutine cancelled while waiting in :meth:`admit` is admitted to nothing; an
enqueued request runs and holds what it uses until the device is done with it. :meth:`aclose`
runs shielded, and so does the forcing part of :meth:`close_lane`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import threading
import time
from typing import Any

import anyio

from .._errors import ClosedError, TaskTimeoutError, WrongLoopError, derived_error
from .._host.pinned import PinnedArrays
from .._host.pool import HostBufferPool
from .._runtime import Runtime
from .._runtime.abi import ACL_STOP_ON_FAILURE
from .._runtime.threads import LoopPulse
from .admission import ENTRIES_PER_REQUEST
from .batching import Hop, flush_now, form_batches
from .binding import ContextBinding
from .counters import POOL_STATS, total
from .delivery import DeliveryQueue
from .devpool import device_pool
from .dropped import DroppedLanes
from .events import BatchEvents, UserEvents
from .faults import FaultState
from .forcing import LaneForce, gave_up
from .graphs import GraphBook, GraphRecord
from .hooks import Source
from .lane import Lane
from .lifetimes import FreedError, Lifetimes
from .loop import LoopAdapter, current_loop_adapter
from .modules import Binaries, ModuleRecord
from .plans import PlanRecord
from .poller import POKE, CompletionMode, Poller
from .posting import Posting
from .shutdown import (
    JOIN_TIMEOUT_S,
    SETTLE_AFTER_FORCE_S,
    IdleWait,
    close_after,
    close_once_returned,
    destroy_lanes,
    drain,
    join,
    log_forced,
    release_everything,
    settle_off_loop,
    wait_set,
)
from .submitter import Submitter
from .task import HostFunctionTask, Task
from .unseen import FailureLog
from .waiter import Waiter
from .watchdog import STALLED
from .work import Request, expand

__all__ = ["DeviceState", "Scheduler", "flush_now"]

log = logging.getLogger("aio_ascend")

#: pending requests that make a batch go out at once instead of at the end of the tick
FLUSH_AT = 256


class DeviceState(enum.Enum):
    """Where a device is in its life."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# (a module global: reading DeviceState.OPEN costs 0.2 us, and check_usable reads it always)
_OPEN = DeviceState.OPEN
DROPPED = "was dropped when the device closed"  # (a request left over by a plain close)


class Scheduler:
    """The scheduling core of one open device (use from the loop that opened it).

    :param runtime: the backend, already opened; closed by :meth:`aclose` or :meth:`abandon`
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        adapter: LoopAdapter,
        completion: CompletionMode,
        task_timeout: float,
        debug: bool,
        batch_cap: int,
        pinned_pool_bytes: int,
        pool_limit_bytes: int | None = None,
    ) -> None:
        self.adapter = adapter
        self.runtime = runtime
        self.device_id = runtime.device_id
        self.state = DeviceState.OPEN
        #: closed by :meth:`abandon` (collected without ``aclose()``), not by :meth:`aclose`
        self.abandoned = False
        self._binding = binding = ContextBinding(runtime)
        binding.bound()
        self.pool = HostBufferPool(
            binding.wrap(runtime.malloc_host),
            binding.freeing(runtime.free_host, "free_host"),
            debug=debug,
            retained_bytes=pinned_pool_bytes,
        )
        memory = device_pool(binding, pool_limit_bytes)
        self.lifetimes = Lifetimes(
            memory, self.pool, adapter.check_thread, self.device_id, self._reap_soon
        )
        self.pinned = PinnedArrays(binding.bound(), lambda f: self.adapter.call_soon_threadsafe(f))
        self.graphs = GraphBook(
            self.pool, self.lifetimes, lambda handle: binding.bound().destroy_graph(handle)
        )
        self.faults = FaultState()
        #: failed tasks whose errors nobody retrieved yet
        self.failures = FailureLog(self.device_id, self.faults)
        self.user_events = UserEvents(
            lambda flags: self.bound().create_event(flags),
            lambda handle: self.bound().destroy_event(handle),
        )
        self._batch_events = BatchEvents(runtime)
        #: this device as observers (tracing, metrics) see it
        self.source = source = Source(self.device_id, runtime.name)
        self._delivery = DeliveryQueue(adapter.wake, adapter.call_soon, self._on_settled, source)
        self._posting = Posting(adapter, self._delivery.deliver)
        self.lanes: list[Lane] = []
        #: lanes of streams collected without aclose() (their finalizers hand them over)
        self.dropped_lanes = DroppedLanes(self.device_id)
        #: the binaries loaded and not unloaded yet (the close unloads what is left)
        self.binaries = Binaries(self.lifetimes, self.pool, binding)
        self._pending: list[Request] = []
        self._flush_scheduled = False
        self._flush_at = min(batch_cap, FLUSH_AT)
        self._batch_cap = batch_cap
        self.task_timeout = task_timeout  #: the watchdog's, seconds
        #: a full batch went out inside a call: the next admission yields to the loop once
        self.yield_due = False
        self.unsettled = 0  # admitted requests aclose() still waits for
        self.peak_in_flight = 0
        self._close_waiters: list[Any] = []
        self._close_broken = False  # the close stopped half way: no caller can wait for it
        self._idle = IdleWait(self.adapter)  # a close's wait for the outstanding work
        batches: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pulse = pulse = LoopPulse()  # beats in flush() and after each drain
        self._submitter = Submitter(
            runtime=runtime,
            device_id=self.device_id,
            faults=self.faults,
            lifetimes=self.lifetimes,
            batch_events=self._batch_events,
            post=self._posting.post,
            stage=self.pool.acquire,
            to_poller=batches.put,
            task_timeout=task_timeout,
            pulse=pulse,
        )
        self._waiter: Waiter | None = None
        if completion is CompletionMode.BLOCK:
            self._waiter = Waiter(
                runtime=runtime, device_id=self.device_id, poke=lambda: batches.put(POKE)
            )
        self._poller = Poller(
            runtime=runtime,
            device_id=self.device_id,
            faults=self.faults,
            lifetimes=self.lifetimes,
            batch_events=self._batch_events,
            post=self._posting.post,
            inbox=batches,
            expire_waiting=self._submitter.expire_waiting,
            watch=None if self._waiter is None else self._waiter.watch,
            task_timeout=task_timeout,
            # block mode: the waiter catches the oldest work at once, so the others can be
            # polled less often (idle CPU) without one long task delaying them
            poll_max_interval=1e-3 if self._waiter is None else 4e-3,
            pulse=pulse,
        )
        self._submitter.thread.start()
        self._poller.thread.start()
        if self._waiter is not None:
            self._waiter.thread.start()

    # --- state checks ----------------------------------------------------------------------

    def bound(self) -> Runtime:
        """The runtime, with the calling thread bound to this device's context first."""
        return self._binding.bound()

    def check_open(self, lane: Lane | None = None) -> None:
        """Raise ClosedError unless the device (then ``lane``'s stream: it closes them) is open."""
        if self.state is not _OPEN:
            raise ClosedError(f"the device is {self.state.value}")
        if lane is not None and lane.closed:
            raise ClosedError("the stream is closed")

    def check_usable(self, lane: Lane | None = None) -> None:
        """Raise unless new work may be queued (on ``lane``): the stream open (``ClosedError``)
        and not stranded (``TaskTimeoutError``), the device open (``ClosedError``), its loop
        (``RuntimeError``), no fault (the fault's error). Every request checks it."""
        # One flat test: every launch makes it (the error is worked out only on a refusal)
        if (
            (lane is not None and (lane.closed or lane.stranded is not None))
            or self.state is not _OPEN
            or self.faults.first is not None
            or not self.adapter.is_current()
        ):
            raise self._refusal(lane)

    def _refusal(self, lane: Lane | None) -> BaseException:
        # Why check_usable refused, in this order
        try:
            self.check_open(lane)
        except ClosedError as closed:
            return closed
        if not self.adapter.is_current():
            return self.adapter.foreign()
        if self.faults.first is None and lane is not None and lane.stranded is not None:
            return derived_error(lane.stranded, "refused")
        return self.fault_error()

    def fault_error(self) -> BaseException:
        """The error for work refused because the device has faulted (caused by the fault)."""
        fault = self.faults.first
        assert fault is not None
        return derived_error(fault, "the device has faulted; close and reopen it")

    # --- resources -------------------------------------------------------------------------

    def open_lane(
        self, max_in_flight: int, *, priority: int | None = None, external: int | None = None
    ) -> Lane:
        """A new runtime stream in stop-on-failure mode, or (``external``) someone else's
        stream handle: scheduled alike, its failure mode left as it is, never destroyed here."""
        self.check_usable()
        if self.dropped_lanes.collected:
            self.retire_dropped()
        if external is not None:
            lane = Lane(external, max_in_flight, self.runtime.stream_capacity, external=True)
            lane.owner = self
            self.lanes.append(lane)
            return lane
        runtime = self.bound()
        handle = runtime.create_stream() if priority is None else runtime.create_stream(priority)
        try:
            runtime.set_stream_failure_mode(handle, ACL_STOP_ON_FAILURE)
        except BaseException:
            runtime.destroy_stream_force(handle)
            raise
        lane = Lane(handle, max_in_flight, self.runtime.stream_capacity)
        lane.owner = self
        self.lanes.append(lane)
        return lane

    def loader(self) -> Runtime:
        """The runtime to load a binary with (``binaries.load``), the device found open."""
        self.check_open()
        if self.faults.first is not None:  # (it would never run: refused before the runtime)
            raise self.fault_error()
        return self.bound()

    def retire_event(self, handle: int, flags: int) -> None:
        """The public Event of ``handle`` is gone (a finalizer: any thread)."""
        self.user_events.retire(handle, flags)

    # --- admission (loop thread) -----------------------------------------------------------

    def try_admit(self, lane: Lane) -> bool:
        """Admit a request on ``lane`` at once if it fits and nobody waits ahead of it; False
        when it must wait (:meth:`admit`). Raises as :meth:`check_usable` does."""
        if self.yield_due:
            return False  # admit() lets the loop run first
        self.check_usable(lane)
        admission = lane.admission
        if not admission.try_enter():
            return False
        self._admitted(admission.in_flight)
        return True

    async def admit(self, lane: Lane) -> None:
        """Admit a request on ``lane``, waiting for a slot (FIFO) when full (cancelled while
        waiting: nothing admitted). Raises as :meth:`check_usable` (again after the wait)."""
        if self.yield_due:
            # A tight launch loop never suspends otherwise: once per flushed batch, let the
            # loop run (this bounds loop lag at a few ms however fast the caller launches).
            self.yield_due = False
            await self.adapter.checkpoint()
        self.check_usable(lane)
        admission = lane.admission
        if not admission.try_enter():
            await self._wait_for_slot(lane)
        self._admitted(admission.in_flight)

    def _admitted(self, in_flight: int) -> None:
        if in_flight > self.peak_in_flight:
            self.peak_in_flight = in_flight
        self.unsettled += 1

    async def _wait_for_slot(self, lane: Lane) -> None:
        adapter = self.adapter
        admission = lane.admission
        if admission.stalled():  # (a wait could last for good: see admission.py)
            raise TaskTimeoutError(STALLED)
        ticket = admission.enqueue(adapter.new_waiter())
        try:
            await adapter.wait(ticket.waiter)
            if self.faults.first is not None:  # (the fault would have failed it: its error)
                raise self.fault_error()
            if ticket.refused:  # closed (or stalled) while waiting: nothing is held
                self.check_usable()
                if ticket.hung:
                    raise TaskTimeoutError(STALLED)
                raise ClosedError("the stream was closed while waiting for admission")
            self.check_usable(lane)
        except BaseException:  # (a granted ticket passes its slots on, prepaid ones too)
            for waiter in admission.withdraw(ticket):
                adapter.wake(waiter)
            raise
        if ticket.extra:  # slots for this coroutine's next calls, until it next suspends
            current = adapter.current_task
            for waiter in admission.adopt(ticket, current(), current):
                adapter.wake(waiter)
            adapter.call_soon(self._expire_prepaid, lane, admission.generation)

    def _expire_prepaid(self, lane: Lane, generation: int) -> None:
        # A turn after a waiter resumed with prepaid slots: what it did not use goes on.
        for waiter in lane.admission.expire(generation):
            self.adapter.wake(waiter)

    def unadmit(self, lane: Lane) -> None:
        """Take back an admission whose request could not be built."""
        self.unsettled -= 1
        self._release_slot(lane)

    def _release_slot(self, lane: Lane, entries: int = ENTRIES_PER_REQUEST) -> None:
        # A request of `lane` is done with its admission: waiters that now fit are admitted.
        for waiter in lane.admission.release(entries):
            self.adapter.wake(waiter)

    # --- requests (loop thread, after admission) -------------------------------------------

    def enqueue(self, request: Request) -> Task:
        """Queue an admitted request (every operation comes here): take its staging buffer,
        retain the device memory it uses, make it its stream's latest task. If that fails,
        its admission is given back."""
        buffers = request.buffers
        if buffers:  # (most launches point to none: no iterator made for them)
            try:
                self.lifetimes.retain(buffers)
            except FreedError as exc:  # freed (a graph, a plan, a module: closed) meanwhile
                self.unadmit(request.lane)
                raise exc.allocation._refusal(request.kind) from None  # noqa: SLF001
        if request.host is None and request.staged:
            try:
                request.stage(self.pool)
            except BaseException:
                if buffers:
                    self.lifetimes.unuse(buffers)
                self.unadmit(request.lane)
                raise
        request.lane.last = request
        pending = self._pending
        pending.append(request)
        if len(pending) >= self._flush_at or not self._flush_scheduled:
            self._schedule_flush()
        return request

    def _schedule_flush(self) -> None:
        if flush_now(len(self._pending), self._flush_at):
            self.flush()
            self.yield_due = True
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.adapter.call_soon(self._on_tick)

    def _on_tick(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand the pending requests to the submitter in one hop."""
        self._pulse.beat()
        if self._pending:
            pending, self._pending = self._pending, []
            for lane, entries in form_batches(pending, self._batch_cap).items():
                for waiter in lane.admission.refund(entries):
                    self.adapter.wake(waiter)
            # The watchdog's clock starts now, within a loop tick of admission.
            deadline = time.monotonic() + self.task_timeout
            self._submitter.submit(Hop(pending, deadline))
        if self.user_events.retired:
            self.user_events.recycle()
        if self.lifetimes.dropped:
            self.lifetimes.reap()
        if self.dropped_lanes.collected:
            self.retire_dropped()

    def _reap_soon(self) -> None:
        # A buffer was collected unfreed (any thread): its block goes back on the loop, soon
        self.adapter.call_soon_threadsafe(self._reap)

    def _reap(self) -> None:
        # (a loop callback: an error here would end a trio run; a close gives back the rest)
        if self.state is _OPEN:
            try:
                self.lifetimes.reap()
            except Exception:
                log.exception("device %d: giving back collected buffers", self.device_id)

    def drop_record(self, record: PlanRecord | GraphRecord | ModuleRecord) -> None:
        """A ``LaunchPlan``, ``Graph`` or ``Module`` was collected (any thread): on the loop,
        it is closed as ``close()`` does (``record.dropped``: a plan or a graph warns)."""
        self.adapter.call_soon_threadsafe(record.dropped, self.device_id)

    def drop_lane(self, lane: Lane) -> None:
        """A ``Stream`` was collected (any thread): the loop retires it soon, work or not."""
        self.dropped_lanes.drop(lane)
        self.adapter.call_soon_threadsafe(self.retire_dropped)

    def retire_dropped(self) -> None:
        """Destroy the dropped streams whose work is done (a faulted device: at its close)."""
        if self.state is _OPEN and self.faults.first is None:
            self.dropped_lanes.retire(self.lanes, self._destroy_stream)

    def _destroy_stream(self, lane: Lane) -> None:
        # (a stream whose stall probe is under way goes after the probe: see stalls.py)
        self._poller.prober.retire(lane, self.bound().destroy_stream)

    # --- completions (loop thread) ---------------------------------------------------------

    def _adopt_loop(self) -> None:
        # aclose() from another loop, the opening one having finished: continue on this one.
        adapter = current_loop_adapter()
        self.adapter = self._idle.adapter = adapter
        self.lifetimes.check_thread = adapter.check_thread
        self._delivery.rebind(adapter.wake, adapter.call_soon)
        undelivered = self._posting.adopt(adapter)
        log.info("device %d: closing from another loop (the first one finished)", self.device_id)
        if undelivered:
            self._delivery.deliver(undelivered)

    def _on_settled(self, count: int) -> None:
        # After each drain: `count` requests no longer count towards aclose()'s wait.
        self._pulse.beat()
        self.unsettled -= count
        if self.dropped_lanes.retiring or self.dropped_lanes.collected:
            self.retire_dropped()
        if self.unsettled == 0:
            self._idle.wake()

    async def close_lane(
        self,
        lane: Lane,
        *,
        cancel: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the stream's work
    ) -> None:
        """Drain ``lane`` (dropping its unsubmitted requests with ``cancel``), refuse new work
        on it and destroy its runtime stream; past ``timeout``, destroy it by force and fail
        what never finished (see :mod:`.forcing`).

        A call while another close of the lane waits (or after one whose wait was cancelled)
        waits as that one does, with its own arguments: the first deadline to pass forces the
        stream, once. Once the lane is gone (or left to the device's close), nothing."""
        if not lane.closed:
            lane.closed = True  # no new admission from here on
            for waiter in lane.admission.refuse_all():
                self.adapter.wake(waiter)
        elif lane not in self.lanes or self.state is not _OPEN:
            return
        if cancel:
            self._drop_pending(lane, "Stream.aclose(cancel=True)")
        with anyio.move_on_after(timeout):  # (and past it, work the watchdog failed is forced)
            await drain(lane, late=timeout is not None)
        late = timeout is not None and lane.admission.timed_out  # (watchdog-failed, running)
        if self.state is _OPEN and (late or (lane.last is not None and not lane.last.done())):
            with anyio.CancelScope(shield=True):
                await self._force_lane(lane, timeout)
        if lane not in self.lanes or self.state is not _OPEN:
            return
        if self.faults.first is not None:
            return  # its work can no longer be observed normally: aclose destroys it by force
        if lane.admission.in_flight:  # work the watchdog failed, still on the device
            self.dropped_lanes.retire_when_done(lane)
            return
        self.lanes.remove(lane)
        if not lane.external:
            self._destroy_stream(lane)

    async def _force_lane(self, lane: Lane, waited: float | None) -> None:
        force = lane.force
        if force is None:  # (else another close of it is forcing it: wait for that one)
            n = lane.admission.unsettled()  # (+ a host function still running)
            n += isinstance(lane.last, HostFunctionTask) and not lane.last.done()
            busy = f"stream {lane.handle:#x}: {n} task(s) unfinished"
            action = "destroying it by force"
            if lane.external:  # (its owner's: only our use of it ends)
                action = "failing that work (the stream is its owner's: not destroyed)"
            log_forced(self.device_id, busy, waited, action)
            self.flush()  # its pending requests go first: the submitter fails them
            lane.forced = True
            force = lane.force = LaneForce(lane)
            self._submitter.force(force)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        if not await wait_set(force.done, deadline, lambda: self.state is not _OPEN):
            return  # the device is closing, or a thread is stuck: left to the device's close
        if lane in self.lanes:
            self.lanes.remove(lane)
        last = lane.last
        if isinstance(last, HostFunctionTask):
            last.give_up(gave_up(last.kind))
        if last is not None:  # the poller's deliveries fail its tasks
            await last.wait_finished()
        while lane.admission.unsettled() and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.001)  # (its elders' and the watchdog-failed work's deliveries)

    # --- stats -----------------------------------------------------------------------------

    def count_timeout(self) -> None:
        """See ``TaskOwner`` (a host function's: ``HostFunctionTask.time_out``)."""
        self._delivery.counters.timeouts += 1

    def stats(self) -> dict[str, int]:
        """The device's counters (see ``Device.stats``)."""
        parts = [self._delivery.counters, self._submitter.counters, self._poller.counters]
        counters = total(*parts, *([] if self._waiter is None else [self._waiter.counters]))
        pool = self.pool.stats()
        return {
            **{key: counters[key] for key in ("launches", "copies", "batches", "wakeups")},
            "in_flight": sum(lane.admission.unsettled() for lane in self.lanes),
            "peak_in_flight": self.peak_in_flight,
            **{key: counters[key] for key in ("timeouts", "sync_timeouts")},
            "streams": len(self.lanes),
            "device_buffers": self.lifetimes.live_count,
            "graphs": len(self.graphs),
            **{key: pool[name] for key, name in POOL_STATS.items()},
            "faulted": int(self.faults.first is not None),
        }

    # --- shutdown --------------------------------------------------------------------------

    async def aclose(
        self,
        *,
        cancel: bool,
        timeout: float | None,  # noqa: ASYNC109 - bounds the work
    ) -> None:
        """Finish or drop outstanding work, stop the threads, release everything (shielded
        from any cancellation). From another event loop: allowed once the opening loop has
        finished (the device continues on this one); else RuntimeError and nothing changes."""
        if not self.adapter.is_current():
            if self.adapter.forked:  # (its threads and runtime are the parent's)
                raise self.adapter.foreign()
            if not self.adapter.is_closed():
                raise WrongLoopError(
                    "aclose() was called from another event loop (or thread) while the loop "
                    "that opened the device is still running: close it from that loop"
                )
            if self.state is not DeviceState.CLOSED:
                # (a close under way ran on the finished loop: it can never end now)
                self._close_broken |= self.state is DeviceState.CLOSING
                self._adopt_loop()
        if self.state is not _OPEN:
            if self.state is DeviceState.CLOSING:  # another caller is closing: wait for it,
                # held to this call's arguments too (a timeout only brings the force nearer)
                if cancel:
                    self._drop_pending(None, "aclose(cancel=True)")
                self._idle.bound(timeout)
                if not self._close_broken:
                    waiter = self.adapter.new_waiter()
                    self._close_waiters.append(waiter)
                    await self.adapter.wait(waiter)
            if self.state is not DeviceState.CLOSED:
                self.abandon()  # (the threads stop, then the runtime closes: nothing waits)
                raise RuntimeError(
                    "the device's close stopped half way (its event loop was closed under it, "
                    "or it failed: see the log): its threads are stopped and its runtime "
                    "closed without waiting for its work; its tasks are never resolved"
                )
            return
        self.state = DeviceState.CLOSING
        if cancel:  # (at once: before the loop runs the tick's flush)
            self._drop_pending(None, "aclose(cancel=True)")
        else:
            self.flush()
        for lane in self.lanes:
            for waiter in lane.admission.refuse_all():
                self.adapter.wake(waiter)
        await self.adapter.shielded(self._close, timeout)

    async def _close(self, timeout: float | None) -> None:  # noqa: ASYNC109
        try:
            self._idle.bound(timeout)
            forced = not await self._idle.until_idle(lambda: self.unsettled)
            await self.binaries.settled(lambda: self._idle.deadline)  # (else: stuck, below)
            if forced:
                busy = f"{self.unsettled} task(s) still unfinished"
                streams = "destroying the streams by force"
                log_forced(self.device_id, busy, self._idle.timeout, streams)
            await self._shutdown(forced=forced)
        finally:  # (stopped half way: its loop closed with it pending, or a failure)
            self._close_broken = self.state is not DeviceState.CLOSED
            waiters, self._close_waiters = self._close_waiters, []
            for waiter in waiters:
                with contextlib.suppress(RuntimeError):  # (a loop closed under the close)
                    self.adapter.wake(waiter)

    def _drop_pending(self, lane: Lane | None, by: str) -> None:
        # Requests not yet handed to the submitter (`lane`'s, all for None): ClosedError.
        dropped = [r for r in self._pending if lane is None or r.lane is lane]
        if not dropped:
            return
        self._pending = [r for r in self._pending if lane is not None and r.lane is not lane]
        if lane is not None:
            lane.last = lane.flushed  # what is left to wait for
        faulted = self.faults.first is not None  # (then the fault would have failed them)
        errors = [
            self.fault_error() if faulted else ClosedError(f"dropped by {by}") for _ in dropped
        ]
        for request, error in zip(dropped, errors, strict=True):
            # (before the release lets go of it) a dropped event record marks its event
            # never recorded: another stream's wait on it is refused, not passed unrecorded
            request.on_refused(error)
        self.lifetimes.release(dropped)
        for request in dropped:
            self.unsettled -= 1
            self._release_slot(request.lane, request.entries)
        self._delivery.resolve_outside(list(zip(dropped, errors, strict=True)))

    async def _shutdown(self, *, forced: bool) -> None:
        runtime = self.bound()
        self._submitter.stop()
        self._poller.stop()
        if self._waiter is not None:
            self._waiter.stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        # The poller goes first (it never waits on the device for long): once it is gone,
        # nothing done to the streams below can be reported as a completion (a stream
        # destroyed by force may read complete, or fail every query).
        await join(self._poller.thread, deadline)
        if forced or self.faults.first is not None or self._poller.thread.is_alive():
            # Unblock a thread stuck in a runtime call (a full queue, a hung stream). What
            # the threads report from now on is about streams destroyed under them: held
            # back, so that a refusal of a destroyed stream never stands for the outcome.
            self._posting.hold_back(forced)
            self._destroy_lanes()
        threads = [self._poller.thread, *self._other_threads()]
        for thread in threads:
            await join(thread, deadline)
        stuck = [thread.name for thread in threads if thread.is_alive()]
        # What is left never completed. Once the streams are gone nothing on the device can
        # touch its memory: fail the tasks and release everything.
        self._destroy_lanes()
        leftovers = self._submitter.unsubmitted()
        leftovers.extend(self._pending)
        self._pending = []
        for batch in self._poller.leftover_batches():
            leftovers.extend(batch.requests)
        if stuck:
            leftovers.extend(self._submitter.underway.requests())
        else:
            self.lifetimes.release(leftovers)
            self.lifetimes.release(self._submitter.take_abandoned())  # (failed already)
        outcomes: list[tuple[Request, BaseException | None]] = [
            (r, gave_up(r.kind) if forced or stuck else ClosedError(f"{r.kind} {DROPPED}"))
            for r in leftovers
        ]
        held = self._posting.take_held() + self._poller.at_exit
        for request, error, _ in expand(held):
            if error is not None:
                timeout = gave_up(request.kind)
                timeout.__cause__ = error
                error = timeout
            outcomes.append((request, error))
        self._delivery.resolve_outside(outcomes)
        self._delivery.drain(budget=False)  # completions delivered but not yet resolved
        self.unsettled = 0
        if stuck:  # returning on time wins: nothing is freed under the stuck call, nor after
            self.lifetimes.leave_to_runtime()  # (the runtime's close frees it all)
            self.binaries.leave_to_runtime()
            threads_now = lambda: [self._poller.thread, *self._other_threads()]  # noqa: E731
            close_once_returned(self.device_id, stuck, threads_now, self.runtime, self.pinned)
        else:
            if runtime.must_settle():  # a forced stream's kernel may still run: wait off-loop
                limit = SETTLE_AFTER_FORCE_S if forced else None  # (past the close's deadline)
                await settle_off_loop(runtime, limit, self.device_id)
            release_everything(
                runtime,
                graphs=self.graphs,
                lifetimes=self.lifetimes,
                orphans=(self._submitter.orphans, self._poller.orphans),
                batch_events=self._batch_events,
                user_events=self.user_events,
                unload_binaries=self.binaries.unload_all,
                pool=self.pool,
                pinned=self.pinned,
            )
        self._binding.let_go()  # (the runtime's close may come later, on another thread)
        self.failures.report_at_close()
        self.state = DeviceState.CLOSED

    def _destroy_lanes(self) -> None:
        # never a stream a library thread still running may be inside a call on (shutdown.py,
        # step 5): the submitter's hop (and the stall probe's stream, which the prober
        # destroys after its probe). The streams are marked forced before the hop is read: a
        # submitter that looks at a stream after this refuses its work, and one that looked
        # before is inside the hop read below.
        prober = self._poller.prober
        lanes = [*self.lanes, *prober.take_left()]
        for lane in lanes:
            lane.forced = True
        busy = self._submitter.underway.streams() if self._submitter.thread.is_alive() else set()
        destroy_lanes(self.bound(), lanes, prober, busy)
        self.lanes[:] = [lane for lane in lanes if lane.handle in busy]  # (for a later call)

    def abandon(self) -> None:
        """The device was collected without ``aclose()``: stop the threads, close the runtime.

        From a finalizer (any thread, during a collection): it does not wait. The poller closes
        the runtime once both threads have exited; outstanding tasks are never resolved.
        """
        if self.state is DeviceState.CLOSED:
            return
        self.state = DeviceState.CLOSED
        self.abandoned = True
        self.failures.report_at_close()
        self._binding.let_go()  # (the collecting thread's: the loop's, most often)
        if self._waiter is not None:
            self._waiter.stop()
        self._submitter.stop()
        self._poller.stop(then=self._close_after_threads)

    def _close_after_threads(self) -> None:
        # The poller thread, exiting after abandon(): wait for the others, then close.
        close_after(self._other_threads, self.runtime, self.pinned)

    def _other_threads(self) -> list[threading.Thread]:
        # All but the poller: the submitter, its staging thread, the prober, module loads, waiter
        threads = [self._submitter.thread, self._submitter.stage_thread, self._poller.prober.thread]
        threads += self.binaries.threads
        return threads if self._waiter is None else [*threads, self._waiter.thread]
