"""The device's two library threads: the submitter and the completion poller.

Both are plain threads that bind the device context first and then only ever wait in
GIL-releasing calls (a ``SimpleQueue`` get, ``time.sleep``-like timed waits, runtime calls).
Neither ever blocks on the event loop: results go back with one non-blocking
``call_soon_threadsafe`` per round, however many tasks finished in it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .._errors import (
    DeviceFaultError,
    EventSyncTimeoutError,
    InternalError,
    RuntimeAPIError,
    TaskTimeoutError,
    derived_error,
)
from .._runtime.abi import ACL_EVENT_CAPTURE_STREAM_PROGRESS, ACL_EVENT_RECORDED_STATUS_COMPLETE
from .._runtime.threads import GIL_SLICE_S, reduce_timer_slack, yield_gil
from .work import Batch, Launch, Request

if TYPE_CHECKING:
    from .._host.pool import HostBufferPool
    from .._runtime import Runtime
    from .._stream import Stream
    from .loop import LoopAdapter

__all__ = ["DONE", "LATE", "TIMEOUT", "Engine"]

#: delivery modes: resolve the task and free its stream slot / resolve only / free only
DONE: Final = 0
TIMEOUT: Final = 1
LATE: Final = 2

Delivery = tuple[Request, BaseException | None, int]

_STOP = object()
#: requests completed per poll round at most (bounds the poller's time holding the GIL)
_ROUND_BUDGET = 1024


def as_device_fault(exc: BaseException) -> DeviceFaultError:
    """``exc`` (a failure that means the device context is broken) as a DeviceFaultError."""
    fault = DeviceFaultError(
        f"device context failed: {getattr(exc, 'message', '') or exc!r}",
        code=getattr(exc, "code", None),
        func=getattr(exc, "func", None),
    )
    fault.__cause__ = exc
    return fault


class Engine:
    """Everything the threads share with the loop side of one device.

    Loop-side code calls :meth:`submit` (one hop per loop tick) and receives results through
    ``deliver`` (a loop callback). ``fault`` is the first device fault, sticky.
    """

    def __init__(
        self,
        *,
        runtime: Runtime,
        pool: HostBufferPool,
        adapter: LoopAdapter,
        deliver: Callable[[list[Delivery]], None],
        device_id: int,
        task_timeout: float,
        completion: str,
        batch_cap: int = 512,
        poll_min_interval: float = 5e-6,
        poll_max_interval: float = 1e-3,
        block_slice_ms: int = 5,
    ) -> None:
        self.runtime = runtime
        self.pool = pool
        self.adapter = adapter
        self._deliver = deliver
        self.task_timeout = task_timeout
        self.completion = completion
        self.batch_cap = batch_cap
        self.poll_min_interval = poll_min_interval
        self.poll_max_interval = poll_max_interval
        self.block_slice_ms = block_slice_ms
        self.fault: BaseException | None = None
        self._fault_lock = threading.Lock()
        # resources of work whose completion can no longer be observed (faulted device, failed
        # record): released at close, after the streams are destroyed
        self.orphans: list[Request] = []
        self._free_events: deque[int] = deque()
        self.all_batch_events: list[int] = []
        self.counters = {"launches": 0, "copies": 0, "batches": 0, "wakeups": 0, "timeouts": 0}
        self._submit_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._poll_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._outstanding: dict[int, deque[Batch]] = {}
        self._pending_batches = 0  # batches in _outstanding (poller thread only)
        self._probe_event: int | None = None  # never recorded: see _context_is_healthy
        self._interval = poll_min_interval
        self._next_deadline_check = 0.0
        self.submitter = threading.Thread(
            target=self._submitter_main, name=f"aio_ascend-submit-{device_id}", daemon=True
        )
        self.poller = threading.Thread(
            target=self._poller_main, name=f"aio_ascend-poll-{device_id}", daemon=True
        )
        self.release_hook: Callable[[list[Request]], None] = self._release_resources

    def start(self) -> None:
        self.submitter.start()
        self.poller.start()

    # --- loop side -----------------------------------------------------------------------

    def submit(self, requests: list[Request]) -> None:
        """Hand one tick's requests to the submitter (non-blocking)."""
        self._submit_queue.put(requests)

    def stop(self) -> None:
        """Ask both threads to exit (they finish the call they are in)."""
        self._submit_queue.put(_STOP)
        self._poll_queue.put(_STOP)

    def join(self, timeout: float | None = None) -> bool:
        """Join both threads; True if both have exited."""
        for thread in (self.submitter, self.poller):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout)
        return not (self.submitter.is_alive() or self.poller.is_alive())

    def leftover_batches(self) -> list[Batch]:
        """Batches the poller never saw complete (call only after the poller has exited)."""
        while True:
            try:
                item = self._poll_queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Batch):
                self._outstanding.setdefault(item.stream.handle, deque()).append(item)
        leftovers = [batch for batches in self._outstanding.values() for batch in batches]
        self._outstanding.clear()
        return leftovers

    def unsubmitted(self) -> list[Request]:
        """Requests still queued for the submitter (call only after it has exited)."""
        out: list[Request] = []
        while True:
            try:
                item = self._submit_queue.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, list):
                out.extend(item)

    # --- shared helpers ------------------------------------------------------------------

    def note_fault(self, exc: BaseException) -> BaseException:
        """Record ``exc`` as the device's fault if it is the first; return the first fault."""
        with self._fault_lock:
            if self.fault is None:
                self.fault = exc
            return self.fault

    def _release_resources(self, requests: list[Request]) -> None:
        raise InternalError("Engine.release_hook was not installed")

    def _post(self, deliveries: list[Delivery]) -> None:
        if deliveries and self.adapter.call_soon_threadsafe(self._deliver, deliveries):
            self.counters["wakeups"] += 1

    # --- submitter thread ----------------------------------------------------------------

    def _submitter_main(self) -> None:
        self.runtime.set_current_context()
        get = self._submit_queue.get
        while True:
            # No reference to past work may survive in this frame while it blocks: it would
            # keep the requests' streams, and so an unclosed Device, from being collected.
            item = get()
            if item is _STOP:
                return
            try:
                self._submit_hop(item)
            except BaseException as exc:  # pragma: no cover - defensive: never lose a request
                failures: list[Delivery] = [
                    (req, InternalError(f"submitter failed: {exc!r}"), DONE) for req in item
                ]
                self._post(failures)
                del failures
            del item

    def _submit_hop(self, requests: list[Request]) -> None:
        runtime = self.runtime
        launch = runtime.launch_kernel_with_host_args
        counters = self.counters
        cap = self.batch_cap
        open_batches: dict[Stream, list[Request]] = {}
        broken: dict[Stream, BaseException] = {}
        failures: list[Delivery] = []
        slice_end = time.perf_counter() + GIL_SLICE_S
        for index, req in enumerate(requests):
            if index & 31 == 31 and time.perf_counter() > slice_end:
                yield_gil()
                slice_end = time.perf_counter() + GIL_SLICE_S
            stream = req.stream
            error = broken.get(stream)
            if error is None and self.fault is not None:
                error = derived_error(self.fault, "device faulted earlier")
            elif error is not None:
                error = derived_error(error, "not submitted: an earlier request was refused")
            if error is None:
                try:
                    if type(req) is Launch:  # the hot path, without a method call
                        addr = req.host.addr  # type: ignore[union-attr]
                        count = req.placeholder_count
                        launch(
                            req.func,
                            req.blocks,
                            stream.handle,
                            req.cfg,
                            addr,
                            req.nbytes,
                            addr + req.table_offset if count else 0,
                            count,
                        )
                    else:
                        req.submit(runtime, stream.handle)
                except BaseException as exc:
                    exc = self._classify_refusal(exc)
                    broken[stream] = exc
                    error = exc
            if error is not None:
                req.on_refused(error)
                self.release_hook([req])
                failures.append((req, error, DONE))
                continue
            if req.counter:
                counters[req.counter] += 1
            batch = open_batches.get(stream)
            if batch is None:
                batch = open_batches[stream] = []
            batch.append(req)
            if len(batch) >= cap:
                self._close_batch(stream, batch, failures)
                open_batches[stream] = []
        for stream, batch in open_batches.items():
            if batch:
                self._close_batch(stream, batch, failures)
        self._post(failures)

    def _classify_refusal(self, exc: BaseException) -> BaseException:
        """The error a refused submission stands for: the device fault, or a plain refusal.

        A refusal whose code is no known fault code may still come from a faulted context
        (stop-on-failure refuses all new work with the fault's code): ask the runtime about an
        event that was never recorded, which only fails when the context is broken.
        """
        if not isinstance(exc, DeviceFaultError):
            if not isinstance(exc, RuntimeAPIError) or self._context_is_healthy():
                return exc
            exc = as_device_fault(exc)
        first = self.note_fault(exc)
        return exc if first is exc else derived_error(first, "device faulted earlier")

    def _context_is_healthy(self) -> bool:
        try:
            if self._probe_event is None:
                self._probe_event = self.runtime.create_event(ACL_EVENT_CAPTURE_STREAM_PROGRESS)
                self.all_batch_events.append(self._probe_event)
            self.runtime.query_event_status(self._probe_event)
        except RuntimeAPIError:
            return False
        return True

    def _acquire_event(self) -> int:
        try:
            return self._free_events.pop()
        except IndexError:
            event = self.runtime.create_event(ACL_EVENT_CAPTURE_STREAM_PROGRESS)
            self.all_batch_events.append(event)
            return event

    def _close_batch(
        self, stream: Stream, requests: list[Request], failures: list[Delivery]
    ) -> None:
        try:
            event = self._acquire_event()
            self.runtime.record_event(event, stream.handle)
        except BaseException as exc:
            # Submitted work we cannot track: fail its tasks, keep its resources until close.
            exc = self._classify_refusal(exc)
            self.orphans.extend(requests)
            failures.extend((req, exc, DONE) for req in requests)
            return
        self.counters["batches"] += 1
        self._poll_queue.put(Batch(stream, requests, event, time.monotonic() + self.task_timeout))

    # --- poller thread -------------------------------------------------------------------

    def _poller_main(self) -> None:
        self.runtime.set_current_context()
        reduce_timer_slack()
        self._interval = self.poll_min_interval
        self._next_deadline_check = 0.0
        while True:
            # Block for new work only when nothing is outstanding; no reference to past work
            # is held in this frame meanwhile (see _submitter_main).
            if not self._pending_batches and not self._take(self._poll_queue.get()):
                return
            if not self._poll_round():
                return

    def _take(self, item: object) -> bool:
        """File a batch from the inbox; False on the stop sentinel."""
        if item is _STOP:
            return False
        assert isinstance(item, Batch)
        self._outstanding.setdefault(item.stream.handle, deque()).append(item)
        self._pending_batches += 1
        return True

    def _poll_round(self) -> bool:
        """One round: collect new batches, complete what finished, else wait a little."""
        inbox = self._poll_queue
        while True:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if not self._take(item):
                return False
        if self.completion == "block":
            self._block_on_oldest()
        started = time.perf_counter()
        try:
            done = self._collect_completed()
        except BaseException as exc:
            # In stop-on-failure mode a failing query means the device context is broken.
            self._fail_all_outstanding(exc)
            return True
        if done:
            self._pending_batches -= len(done)
            self._complete(done)
            self._interval = self.poll_min_interval
            if time.perf_counter() - started > GIL_SLICE_S:
                yield_gil()  # a big round: let the loop take the GIL before the next
            return True
        now = time.monotonic()
        if now >= self._next_deadline_check:  # the watchdog works in seconds: every 10 ms
            self._next_deadline_check = now + 0.01
            self._check_deadlines()
        if self.completion == "block":
            return True
        # Nothing finished: wait (GIL released) for the interval or for new work.
        try:
            item = inbox.get(timeout=self._interval)
        except queue.Empty:
            self._interval = min(self._interval * 2, self.poll_max_interval)
            return True
        self._interval = self.poll_min_interval
        return self._take(item)

    def _block_on_oldest(self) -> None:
        heads = [batches[0] for batches in self._outstanding.values() if batches]
        if not heads:
            return
        oldest = min(heads, key=lambda batch: batch.deadline)
        try:
            self.runtime.synchronize_event(oldest.event, self.block_slice_ms)
        except (EventSyncTimeoutError, RuntimeAPIError):
            pass  # a timeout is the slice ending; a fault is picked up by the query round

    def _collect_completed(self) -> list[Batch]:
        query = self.runtime.query_event_status
        done: list[Batch] = []
        budget = _ROUND_BUDGET
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
        for batch in done:
            mode = LATE if batch.timed_out else DONE
            for req in batch.requests:
                error: BaseException | None = None
                if req.needs_completion:
                    try:
                        req.on_complete()
                    except BaseException as exc:
                        error = InternalError(f"completing {req.kind} failed: {exc!r}")
                deliveries.append((req, error, mode))
            finished.extend(batch.requests)
            self._free_events.append(batch.event)
        self.release_hook(finished)
        self._post(deliveries)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        deliveries: list[Delivery] = []
        for batches in self._outstanding.values():
            for batch in batches:
                if batch.deadline > now:
                    break
                if batch.timed_out:
                    continue
                batch.timed_out = True
                self.counters["timeouts"] += 1
                for req in batch.requests:
                    error = TaskTimeoutError(
                        f"{req.kind} did not finish within task_timeout="
                        f"{self.task_timeout:g}s (the device may still be running it)"
                    )
                    deliveries.append((req, error, TIMEOUT))
        self._post(deliveries)

    def _fail_all_outstanding(self, exc: BaseException) -> None:
        # A query that fails in stop-on-failure mode reports a broken device context,
        # whatever its code: it becomes the device's (sticky) fault.
        if not isinstance(exc, DeviceFaultError):
            exc = as_device_fault(exc)
        first = self.note_fault(exc)
        deliveries: list[Delivery] = []
        given_first = first is not exc
        for batches in self._outstanding.values():
            while batches:
                batch = batches.popleft()
                self.orphans.extend(batch.requests)
                for req in batch.requests:
                    if not given_first:
                        error: BaseException = first
                        given_first = True
                    else:
                        error = derived_error(first, "device faulted")
                    deliveries.append((req, error, DONE))
        self._pending_batches = 0
        self._post(deliveries)
