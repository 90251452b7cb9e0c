"""The sim's device: streams as FIFO task queues, and the device thread that executes them.

One device thread per runtime (``aio_ascend-sim-<device>``) serves every stream round-robin and
idles in GIL-releasing waits. :class:`DeviceExecutor` owns that thread and the device-side state
(streams, the sticky fault, the pause control, the counters); :class:`~.runtime.SimRuntime`
builds the ACL API surface on it. Tasks are plain tuples (cheap to build on the launch path)
tagged with a :class:`TaskKind`.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections import deque
from collections.abc import Iterable
from enum import IntEnum
from time import monotonic, perf_counter, sleep
from typing import Any, Final

from ..._errors import RuntimeAPIError, error_class_for_code
from ..abi import (
    ACL_CONTINUE_ON_FAILURE,
    ACL_ERROR_RT_AICORE_EXCEPTION,
    ACL_ERROR_RT_AICORE_TIMEOUT,
    ACL_ERROR_RT_CONTEXT_NULL,
    ACL_ERROR_RT_STREAM_ABORT,
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    check_device_id,
)
from ..emulation import AclEmulation, Fault
from ..threads import GIL_SLICE_S, yield_gil
from .kernels import KernelContext, KernelSpec, describe_exception
from .memory import DEFAULT_MEMORY_BYTES, DeviceFault, DeviceMemory, PinnedMemory

__all__ = [
    "BINARY_HANDLE",
    "CONTEXT_HANDLE",
    "COPY",
    "COPY_WAITER",
    "CURRENT",
    "LIVE_CONTEXTS",
    "check_sim_options",
    "DEFAULT_MAX_QUEUE_DEPTH",
    "EVENT_HANDLE",
    "FUNCTION_HANDLE",
    "GRAPH",
    "GRAPH_HANDLE",
    "KERNEL",
    "MEMSET",
    "PRIORITY_GREATEST",
    "PRIORITY_LEAST",
    "RECORD",
    "STREAM_HANDLE",
    "WAIT",
    "WAIT_SLICE_S",
    "CLOSED_DURING_COPY",
    "DeviceExecutor",
    "PageableCopy",
    "Recording",
    "SimBinary",
    "SimEvent",
    "SimGraph",
    "SimStream",
    "TaskKind",
    "new_handle",
    "release_all",
]

#: why a pageable copy still queued at close fails
CLOSED_DURING_COPY: Final = "the runtime was closed while the copy was queued"

#: tasks a stream holds before a submitting call blocks (the real runtime's ~2013-entry queue)
DEFAULT_MAX_QUEUE_DEPTH: Final = 2013
#: how long a close waits (off the event loop) for a kernel the device thread still runs, at
#: most; then the close goes on and the thread ends once the kernel returns
SETTLE_LIMIT_S: Final = 0.5


class TaskKind(IntEnum):
    """What a queued task does; its tuple's first item."""

    KERNEL = 0  # (KERNEL, spec, blocks, args source, source offset, args_size, region, timeout)
    RECORD = 1  # (RECORD, recording)
    WAIT = 2  # (WAIT, recording)
    COPY = 3  # (COPY, kind, dst, src, count, host array | None, host offset, waiter | None)
    MEMSET = 4  # (MEMSET, dst, value, count)
    GRAPH = 5  # (GRAPH, SimGraph): a captured task list, run as one task


#: where a COPY task keeps its caller blocked on pageable memory (None: pinned or device)
COPY_WAITER: Final = 7

# module-level aliases: the drain loop compares them for every task
KERNEL: Final = TaskKind.KERNEL
RECORD: Final = TaskKind.RECORD
WAIT: Final = TaskKind.WAIT
COPY: Final = TaskKind.COPY
MEMSET: Final = TaskKind.MEMSET
GRAPH: Final = TaskKind.GRAPH

#: stream priorities as ACL numbers them: 0 is the most urgent, 7 the least (the default)
PRIORITY_GREATEST: Final = 0
PRIORITY_LEAST: Final = 7


#: tasks one stream runs before the device thread moves on to the next stream
_ROUND_BUDGET: Final = 64
#: a busy stream whose device time ends within this many seconds is treated as free (the
#: time model keeps accounting in device time; this only avoids sub-wakeup-sized waits)
_SLACK_S: Final = 20e-6
#: longest single GIL-releasing wait (waits are sliced so that close() is always noticed)
WAIT_SLICE_S: Final = 0.5


_handles = itertools.count(1)  # process-wide, so a handle of a closed runtime is never valid


#: every sim runtime's ``freed_under_callers``, in this process (read by the tests)
FREED_UNDER_CALLERS: list[str] = []


def new_handle(kind: int) -> int:
    return (kind << 32) | next(_handles)


STREAM_HANDLE, EVENT_HANDLE, BINARY_HANDLE, FUNCTION_HANDLE = 0x5151, 0x5E5E, 0x5B5B, 0x5F5F
GRAPH_HANDLE = 0x5A5A
CONTEXT_HANDLE = 0x5C5C

#: each thread's current context (``.context``): one per thread across every sim runtime, as in
#: ACL, so binding one device's context unbinds the previous one's
CURRENT = threading.local()
#: the contexts of open sim runtimes (what ``set_current_context(handle)`` may bind)
LIVE_CONTEXTS: set[int] = set()


def release_all(locks: Iterable[threading.Lock]) -> None:
    for lock in list(locks):
        try:
            lock.release()
        except RuntimeError:  # already released: a wake-up is pending anyway
            pass


class Recording:
    """One ``record_event`` call: done once the device reaches it."""

    __slots__ = ("aborted", "done", "timeline", "timestamp", "waiters")

    def __init__(self, timeline: bool) -> None:
        self.done = False
        #: its stream was destroyed before the device reached it: it never completes
        self.aborted = False
        self.timeline = timeline
        self.timestamp = 0.0
        #: locks of threads blocked in synchronize_event on this recording (released when done)
        self.waiters: list[threading.Lock] | None = None


class SimEvent:
    __slots__ = ("current", "handle", "timed")

    def __init__(self, handle: int, timed: bool) -> None:
        self.handle = handle
        #: created with ACL_EVENT_TIME_LINE: its recordings keep a timestamp
        self.timed = timed
        #: the latest recording (None: never recorded, reads COMPLETE as an Ex event)
        self.current: Recording | None = None


class SimGraph:
    """A captured task list (``aclmdlRICaptureEnd``'s model); replayed as one task."""

    __slots__ = ("handle", "tasks")

    def __init__(self, handle: int, tasks: list[tuple[Any, ...]]) -> None:
        self.handle = handle
        self.tasks = tasks


class SimStream:
    __slots__ = (
        "busy_until",
        "callers",
        "capture",
        "completed",
        "destroyed",
        "failure_mode",
        "handle",
        "hung",
        "occupied",
        "priority",
        "queue",
        "submitted",
        "timed_out",
    )

    def __init__(self, handle: int, priority: int = PRIORITY_LEAST) -> None:
        self.handle = handle
        self.priority = priority
        self.queue: deque[tuple[Any, ...]] = deque()
        self.submitted = 0  # written by submitting threads, under the runtime lock
        self.completed = 0  # written by the device thread only
        self.occupied = False  # a popped kernel still occupies the stream (busy/hang)
        self.hung = False
        self.busy_until = 0.0  # perf_counter() time until which the stream is occupied
        #: the occupying kernel runs past its kernel timeout: the fault it raises at busy_until
        self.timed_out: tuple[int, str] | None = None
        self.destroyed = False
        #: host threads inside a blocking call on the stream (waiting for room, synchronizing)
        self.callers = 0
        self.failure_mode = ACL_CONTINUE_ON_FAILURE
        #: while capturing: the tasks recorded instead of queued
        self.capture: list[tuple[Any, ...]] | None = None


class PageableCopy:
    """A caller blocked in ``memcpy_async`` on pageable host memory."""

    __slots__ = ("cancelled", "done", "error", "lock")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.lock = threading.Lock()  # held by the device thread while it touches host memory
        self.cancelled = False
        self.error: tuple[int, str] | None = None

    def fail(self, code: int, message: str) -> None:
        if self.error is None:
            self.error = (code, message)
        self.done.set()


class SimBinary:
    __slots__ = ("functions", "kernels")

    def __init__(self, kernels: dict[str, KernelSpec]) -> None:
        self.kernels = kernels
        self.functions: dict[str, int] = {}


def check_sim_options(
    *,
    max_queue_depth: object = DEFAULT_MAX_QUEUE_DEPTH,
    memory_bytes: object = DEFAULT_MEMORY_BYTES,
    **_: object,
) -> None:
    """The values of the sim's numeric options (``open_device`` checks them in its call too;
    the flags are used as given)."""
    for name, value in (("memory_bytes", memory_bytes), ("max_queue_depth", max_queue_depth)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int")
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")


class DeviceExecutor(AclEmulation[SimStream, SimEvent, SimGraph, SimBinary, KernelSpec]):
    """The device of one sim runtime: its state, its streams, and the thread executing them.

    Subclassed by :class:`~.runtime.SimRuntime` (the API surface); this part never validates
    user input, it runs what the API queued.

    ``unread_faults`` models the real runtime on STARS chips (A2/A3): a failed task stops its
    stream's queue, but the runtime learns of it only when it reads the task's error
    completion, which only a stream synchronize does (``aclrtSynchronizeStream*``:
    stream.cc:4438, stars_engine.cc:1398-1470 of the pinned runtime; event queries read the
    queue head alone: npu_driver_res.cc:861-878). Until then event queries say NOT_READY,
    event synchronizes wait, and other calls succeed; the device runs nothing more. Off, a
    fault is seen by every call at once (the sim's default, and the acl double's).
    """

    def __init__(
        self,
        device_id: int,
        *,
        time_model: bool = False,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
        unread_faults: bool = False,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        check_sim_options(max_queue_depth=max_queue_depth, memory_bytes=memory_bytes)
        check_device_id(device_id)
        self.device_id = device_id
        self.time_model = bool(time_model)
        self.max_queue_depth = max_queue_depth
        self.stream_capacity = max_queue_depth
        self.ordered_task_ids = True  # last_task_id: the index on the stream

        super().__init__()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._context = new_handle(CONTEXT_HANDLE)
        LIVE_CONTEXTS.add(self._context)
        self._memory = DeviceMemory(memory_bytes)
        self._pinned = PinnedMemory()
        self._pinned_views = self._pinned.views  # fast path: args buffers by base address

        self._stream_list: tuple[SimStream, ...] = ()
        self._prioritised = False
        self._pageable: set[PageableCopy] = set()

        self.unread_faults = bool(unread_faults)
        #: a fault no stream synchronize has read yet (``unread_faults``)
        self._unread: Fault | None = None
        #: (stream, index of the task in submission order) that faulted the device
        self.faulted_task: tuple[int, int] | None = None
        self._paused = False
        self._pause_ack = False
        self._idle = False
        #: the device thread is running tasks (a close must not wait for a long kernel on the
        #: event loop: :meth:`must_settle`)
        self._draining = False
        self._work_seq = 0
        self._stream_waiters = 0  # threads waiting for stream progress (sync, full queue)
        #: what the real runtime would crash on: a stream destroyed while a host thread was
        #: inside a blocking call on it (the sim fails that call instead; tests check this stays
        #: empty, and FREED_UNDER_CALLERS, every runtime's, too)
        self.freed_under_callers: list[str] = []
        self._event_waiters = 0  # threads waiting for a recording to complete
        self._sync_locks: set[threading.Lock] = set()  # see synchronize_event
        self._rr = 0
        self._inject: tuple[int, int] | None = None  # (launch calls to let through, code)
        self._final_resources: dict[str, int] | None = None

        self._launches = 0
        self._kernels_executed = 0
        self._copies = 0
        self._events_recorded = 0

        self._thread = threading.Thread(
            target=self._device_main, name=f"aio_ascend-sim-{device_id}", daemon=True
        )
        self._thread.start()

    # --- the emulation's hooks and errors -------------------------------------------------

    def _bound(self) -> bool:
        return getattr(CURRENT, "context", None) == self._context

    def _stream_gone(self, func: str) -> RuntimeAPIError:
        return self._error(ACL_ERROR_RT_STREAM_ABORT, func, "the stream was destroyed")

    def _context_error(self, func: str) -> RuntimeAPIError:
        if self._closed:
            why = "the runtime was closed (context destroyed)"
        elif getattr(CURRENT, "context", None) is not None:
            why = (
                f"thread {threading.current_thread().name!r} has another context bound (another "
                "device's, or another library's): call set_current_context() first"
            )
        else:
            why = (
                f"no context is bound to thread {threading.current_thread().name!r}: call "
                "set_current_context() first"
            )
        return self._error(ACL_ERROR_RT_CONTEXT_NULL, func, why)

    # --- closing -------------------------------------------------------------------------

    def must_settle(self) -> bool:
        """See the protocol: while the device thread runs tasks. A kernel of the sim is a
        Python call that may take seconds (a big ``matmul``, a kernel of yours); the close
        waits for it off the event loop (:meth:`wait_settled`), and past that lets it run
        out on its own."""
        return self._draining and self._thread.is_alive()

    def wait_settled(self, limit_s: float | None = None) -> None:
        """See the protocol: until the device thread has finished what it runs, up to
        ``limit_s`` (:data:`SETTLE_LIMIT_S` at most)."""
        limit = SETTLE_LIMIT_S if limit_s is None else min(limit_s, SETTLE_LIMIT_S)
        deadline = perf_counter() + limit
        while self.must_settle() and perf_counter() < deadline:
            sleep(0.001)

    # --- test controls ---------------------------------------------------------------------

    def pause(self) -> None:
        """Stop the device from executing tasks (test control). Returns once it has stopped:
        no task starts or finishes until :meth:`resume`. Submitting still works."""
        with self._cond:
            self._paused = True
            self._cond.notify_all()
            if threading.current_thread() is self._thread:
                return
            while not self._pause_ack and not self._closed and self._thread.is_alive():
                self._cond.wait(WAIT_SLICE_S)

    def resume(self) -> None:
        """Let the device execute tasks again (test control)."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # --- waiting and submission ------------------------------------------------------------

    def _wait_stream(self, s: SimStream, target: int, timeout_ms: int, func: str) -> None:
        """Block until ``target`` tasks of ``s`` completed (GIL-releasing waits)."""
        if s.completed >= target and self._fault is None:
            return
        deadline = None if timeout_ms < 0 else monotonic() + timeout_ms / 1000.0
        cond = self._cond
        with cond:
            self._stream_waiters += 1
            s.callers += 1
            try:
                while True:
                    if self._unread is not None:  # a stream synchronize reads the failure
                        self._fault, self._unread = self._unread, None
                        release_all(self._sync_locks)
                    if self._fault is not None:
                        raise self._fault_error(func)
                    if self._closed:
                        raise self._context_error(func)
                    if s.completed >= target:
                        return
                    if s.destroyed:
                        raise self._stream_gone(func)
                    slice_s = WAIT_SLICE_S
                    if deadline is not None:
                        remaining = deadline - monotonic()
                        if remaining <= 0:
                            raise self._error(
                                ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                                func,
                                f"stream not idle after {timeout_ms} ms "
                                f"({target - s.completed} tasks unfinished)",
                            )
                        slice_s = min(slice_s, remaining)
                    cond.wait(slice_s)
            finally:
                self._stream_waiters -= 1
                s.callers -= 1

    # --- submission ------------------------------------------------------------------------

    def _wait_for_room(self, s: SimStream, func: str) -> None:
        with self._cond:
            self._stream_waiters += 1
            s.callers += 1
            try:
                while s.submitted - s.completed >= self.max_queue_depth:
                    if self._fault is not None:
                        raise self._fault_error(func)
                    if self._closed:
                        raise self._context_error(func)
                    if s.destroyed:
                        raise self._stream_gone(func)
                    self._cond.wait(WAIT_SLICE_S)
            finally:
                self._stream_waiters -= 1
                s.callers -= 1

    def _enqueue(self, s: SimStream, task: tuple[Any, ...], func: str) -> None:
        if s.capture is not None:  # recorded, not run (the caller checked the kind)
            s.capture.append(task)
            return
        if s.submitted - s.completed >= self.max_queue_depth:
            # the real runtime waits for room too, with no timeout, until room appears or the
            # stream is aborted (hicann/runtime task_submit.cc:478-506)
            self._wait_for_room(s, func)
        with self._lock:
            if s.destroyed:
                raise self._bad_handle(func, "the stream was destroyed")
            s.queue.append(task)
            s.submitted += 1
            self._tls.last_task = s.submitted - 1  # the sim's task id: the index on the stream
            self._work_seq += 1
            if task[0] == COPY:
                self._copies += 1
            elif task[0] == RECORD:
                self._events_recorded += 1
            if self._idle:  # wake the device thread once, not on every submission
                self._idle = False
                # all: a host thread in a synchronize waits on the same condition, and a
                # notify() that woke it instead left the device asleep for WAIT_SLICE_S
                self._cond.notify_all()

    # --- the device thread -----------------------------------------------------------------

    def _device_main(self) -> None:
        cond = self._cond
        while not self._closed:
            seq = self._work_seq
            if self._paused or self._fault is not None or self._unread is not None:
                with cond:
                    while (
                        self._paused or self._fault is not None or self._unread is not None
                    ) and not self._closed:
                        if self._paused and not self._pause_ack:
                            self._pause_ack = True
                            cond.notify_all()
                        cond.wait(WAIT_SLICE_S)
                    self._pause_ack = False
                continue
            started = perf_counter()
            self._draining = True
            try:
                progressed, records_done, deadline = self._drain()
            finally:
                self._draining = False
            if progressed:
                if (records_done and self._event_waiters) or self._stream_waiters:
                    with cond:
                        cond.notify_all()
                if perf_counter() - started > GIL_SLICE_S:
                    yield_gil()  # the device shares the GIL with the host: take turns
                continue
            with cond:
                if self._work_seq != seq or self._closed or self._paused:
                    continue
                timeout = WAIT_SLICE_S
                if deadline is not None:
                    timeout = min(timeout, max(deadline - perf_counter(), 0.0))
                self._idle = True
                cond.wait(timeout)
                self._idle = False

    def _drain(self) -> tuple[bool, bool, float | None]:
        """One round over all streams: run what can run. -> (progressed, records done, next
        time a busy stream frees up)."""
        streams = self._stream_list
        n = len(streams)
        if not n:
            return False, False, None
        if self._prioritised:
            order = streams  # sorted, most urgent first (see _set_stream_list)
        else:
            start = self._rr = (self._rr + 1) % n
            order = streams[start:] + streams[:start]
        progressed = False
        records_done = False
        deadline: float | None = None
        now = perf_counter()
        for s in order:
            if s.destroyed:
                continue
            if s.occupied:
                if s.hung:
                    continue
                free_at = s.busy_until - _SLACK_S
                if free_at > now:
                    if deadline is None or free_at < deadline:
                        deadline = free_at
                    continue
                if s.timed_out is not None:  # its kernel timeout ran out: a device fault
                    self._note_fault_site(s)
                    self._set_fault(*s.timed_out)
                    s.timed_out = None
                    return True, records_done, None
                s.occupied = False
                s.completed += 1
                progressed = True
            queue = s.queue
            budget = _ROUND_BUDGET
            while queue:
                if self._paused or self._closed:
                    return True, records_done, None
                task = queue[0]
                kind = task[0]
                if kind == WAIT:
                    if not task[1].done:
                        break
                    queue.popleft()
                elif kind in (KERNEL, GRAPH):
                    queue.popleft()
                    if self._run_kernel(s, task) if kind == KERNEL else self._run_graph(s, task):
                        if self._fault is not None or self._unread is not None:
                            self._note_fault_site(s)
                            return True, records_done, None
                        progressed = True
                        if s.hung:
                            break
                        free_at = s.busy_until - _SLACK_S
                        if free_at > perf_counter():
                            if deadline is None or free_at < deadline:
                                deadline = free_at
                            break
                        s.occupied = False
                elif kind == RECORD:
                    queue.popleft()
                    rec = task[1]
                    if rec.timeline:
                        rec.timestamp = max(perf_counter(), s.busy_until)
                    rec.done = True
                    records_done = True
                    if rec.waiters:
                        release_all(rec.waiters)
                elif kind == MEMSET:
                    queue.popleft()
                    self._run_memset(task)
                    if self._fault is not None or self._unread is not None:
                        self._note_fault_site(s)
                        return True, records_done, None
                else:
                    queue.popleft()
                    self._run_copy(task)
                    if self._fault is not None or self._unread is not None:
                        self._note_fault_site(s)
                        return True, records_done, None
                s.completed += 1
                progressed = True
                budget -= 1
                if not budget:
                    deadline = now  # more to do: come back right away
                    break
        return progressed, records_done, deadline

    def _run_kernel(self, s: SimStream, task: tuple[Any, ...]) -> bool:
        """Execute a kernel task. Returns True when the stream stays occupied (sleep, time
        model, hang) or the device faulted; the caller then leaves the task uncounted."""
        _, spec, blocks, source, offset, size, region, timeout = task
        # pinned args are read now, at execution; pageable ones were snapshotted at launch
        args = source if type(source) is bytes else source[offset : offset + size].tobytes()
        memory = self._memory
        if region:
            memory.map_region(region, args)  # the H2D copy of [0, argsSize)
        ctx = KernelContext(memory, spec.name, blocks, args, region)
        fault: DeviceFault | None = None
        busy = 0.0
        try:
            spec.fn(ctx)
            busy = ctx.busy_seconds
            if self.time_model and spec.cost is not None:
                cost = float(spec.cost(ctx))
                if not cost >= 0:  # (inf is a kernel that never ends: the model's hang)
                    raise ValueError(f"its cost returned {cost!r}: expected seconds >= 0")
                busy += cost
        except DeviceFault as exc:
            fault = exc
        except BaseException as exc:
            # thread is the device, and a device outlives its kernels (the fault reports it)
            fault = DeviceFault(ACL_ERROR_RT_AICORE_EXCEPTION, describe_exception(spec.name, exc))
        finally:
            if region:
                memory.unmap_region(region)
        self._kernels_executed += 1
        if not busy and fault is None and ctx.raised_fault is None and not ctx.is_hung:
            return False  # the common case: done at once
        fault = ctx.raised_fault or fault
        if fault is not None:
            self._set_fault(fault.code, fault.message)
            return True
        s.occupied = True
        hung = ctx.is_hung or not math.isfinite(busy)
        if timeout is not None and (hung or busy > timeout):
            # LaunchConfig(timeout_s/timeout_us): the runtime stops the kernel at its timeout
            # and the device faults with ACL_ERROR_RT_AICORE_TIMEOUT (acl-runtime.md §1.4, §5.2)
            s.busy_until = max(s.busy_until, perf_counter()) + timeout
            s.timed_out = (
                ACL_ERROR_RT_AICORE_TIMEOUT,
                f"kernel {spec.name!r} ran past its kernel timeout of {timeout:g} s "
                "(LaunchConfig timeout_s/timeout_us)",
            )
        elif hung:
            s.hung = True
        else:
            s.busy_until = max(s.busy_until, perf_counter()) + busy
        return True

    def _run_copy(self, task: tuple[Any, ...]) -> None:
        _, kind, dst, src, count, host, host_offset, waiter = task
        try:
            if waiter is not None:
                with waiter.lock:
                    if not waiter.cancelled:
                        self._pageable_copy(kind, dst, src, count)
                waiter.done.set()
                return
            if count == 0:
                return
            memory = self._memory
            if kind == ACL_MEMCPY_HOST_TO_DEVICE:
                assert host is not None
                memory.view(dst, count, "memcpy destination")[:] = host[
                    host_offset : host_offset + count
                ]
            elif kind == ACL_MEMCPY_DEVICE_TO_HOST:
                assert host is not None
                host[host_offset : host_offset + count] = memory.view(src, count, "memcpy source")
            else:
                source = memory.view(src, count, "memcpy source")
                memory.view(dst, count, "memcpy destination")[:] = source
        except DeviceFault as fault:
            self._set_fault(fault.code, fault.message)
            if waiter is not None:
                waiter.fail(fault.code, fault.message)

    def _run_graph(self, s: SimStream, task: tuple[Any, ...]) -> bool:
        """Replay a captured task list in order, as one task (like ``_run_kernel``: True when
        the stream stays occupied or the device faulted)."""
        for inner in task[1].tasks:
            kind = inner[0]
            if kind == KERNEL:
                self._run_kernel(s, inner)
            elif kind == MEMSET:
                self._run_memset(inner)
            else:
                self._run_copy(inner)
            if self._fault is not None or s.hung:
                return True
        return s.occupied

    def _run_memset(self, task: tuple[Any, ...]) -> None:
        _, dst, value, count = task
        try:
            self._memory.view(dst, count, "memset destination")[:] = value
        except DeviceFault as fault:
            self._set_fault(fault.code, fault.message)

    def _set_stream_list(self) -> None:
        # (lock held) Streams of several priorities: served most urgent first in every round
        # (a stable sort keeps creation order within a priority); otherwise round-robin.
        streams = tuple(self._streams.values())
        self._prioritised = len({s.priority for s in streams}) > 1
        if self._prioritised:
            streams = tuple(sorted(streams, key=lambda s: s.priority))
        self._stream_list = streams

    def _pageable_copy(self, kind: int, dst: int, src: int, count: int) -> None:
        if count == 0:
            return
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            device = self._memory.view(dst, count, "memcpy destination")
            ctypes.memmove(device.ctypes.data, src, count)
        else:
            device = self._memory.view(src, count, "memcpy source")
            ctypes.memmove(dst, device.ctypes.data, count)

    def last_task_id(self) -> int | None:
        """See the protocol: the sim numbers a stream's tasks 0, 1, ... (its fault site's id)."""
        last: int | None = getattr(self._tls, "last_task", None)
        return last

    def _note_fault_site(self, s: SimStream) -> None:
        # The task that faulted is the one after the `completed` finished ones (FIFO).
        with self._cond:
            if self.faulted_task is None:
                self.faulted_task = (s.handle, s.completed)

    def _set_fault(self, code: int, message: str) -> None:
        with self._cond:
            if self.unread_faults and self._fault is None:
                # (a stream synchronize reads it; a pageable copy, which synchronizes, fails)
                if self._unread is None:
                    self._unread = Fault(error_class_for_code(code), code, message)
            elif self._fault is None:
                self._fault = Fault(error_class_for_code(code), code, message)
            self._cond.notify_all()
            if self._unread is None:
                release_all(self._sync_locks)
            waiters = list(self._pageable)
        for waiter in waiters:
            waiter.fail(code, message)
