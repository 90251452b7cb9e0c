"""``SimRuntime``: an in-process model of the ACL runtime, implementing the ``Runtime`` protocol.

One device thread per runtime (``aio_ascend-sim-<device>``) serves every stream round-robin and
idles in GIL-releasing waits. Streams are FIFO task queues (kernels, event records, stream waits,
copies). The model is strict where the real runtime is, and a little stricter:

* placeholder device addresses are written into the caller's args buffer during the launch call;
* pinned args buffers and pinned copy sources are read when the task *executes*, never earlier
  (a buffer reused too early shows up as a wrong result, never as a crash);
* a copy from/to host memory the sim did not allocate (pageable) blocks the caller until the
  stream reaches it, and is done while the caller is still blocked;
* a device fault (the ``fault`` kernel, an out-of-bounds access, an exception in a kernel body)
  halts the whole device until :meth:`SimRuntime.close`;
* every call except ``close`` and ``get_recent_error_message`` needs a context bound to the
  calling thread (107002 otherwise).

Test controls (not part of the ``Runtime`` protocol): :meth:`SimRuntime.pause`,
:meth:`SimRuntime.resume`, :meth:`SimRuntime.inject_launch_error`,
:meth:`SimRuntime.live_resources`, :attr:`SimRuntime.counters`, :attr:`SimRuntime.is_faulted`.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable
from time import monotonic, perf_counter
from typing import Any, Final

from ..._errors import RuntimeAPIError, error_for_code
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_CONTINUE_ON_FAILURE,
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_STOP_ON_FAILURE,
    MAX_NUM_BLOCKS,
    UINT32_MAX,
)
from ..threads import GIL_SLICE_S, yield_gil
from .kernels import BUILTIN_LIBRARY, KernelContext, KernelLibrary, KernelSpec, describe_exception
from .memory import DeviceFault, DeviceMemory, PinnedMemory, U8Array, is_device_address

__all__ = ["DEFAULT_MAX_QUEUE_DEPTH", "SimRuntime", "open_sim_runtime"]

#: tasks a stream holds before a submitting call blocks (the real runtime's ~2013-entry queue)
DEFAULT_MAX_QUEUE_DEPTH: Final = 2013

# ACL codes
_PARAM_INVALID: Final = 107000
_CONTEXT_NULL: Final = 107002
_INVALID_HANDLE: Final = 107017
_STREAM_ABORT: Final = 107023
_SYMBOL_NOT_FOUND: Final = 107042
_STREAM_SYNC_TIMEOUT: Final = 507046
_EVENT_SYNC_TIMEOUT: Final = 507047
_MEMORY_ALLOCATION: Final = 207001

# task kinds (tasks are plain tuples: cheap to build on the launch path)
_KERNEL: Final = 0  # (_KERNEL, spec, blocks, args source, source offset, args_size, region)
_RECORD: Final = 1  # (_RECORD, recording)
_WAIT: Final = 2  # (_WAIT, recording)
_COPY: Final = 3  # (_COPY, kind, dst, src, count, host array | None, host offset, waiter | None)

#: tasks one stream runs before the device thread moves on to the next stream
_ROUND_BUDGET: Final = 64
#: a busy stream whose device time ends within this many seconds is treated as free (the
#: time model keeps accounting in device time; this only avoids sub-wakeup-sized waits)
_SLACK_S: Final = 20e-6
#: longest single GIL-releasing wait (waits are sliced so that close() is always noticed)
_WAIT_SLICE_S: Final = 0.5

#: sanity cap on ``placeHolderNum`` (the sim reads the whole table during the call)
_MAX_PLACEHOLDERS: Final = 65535

_U64 = struct.Struct("<Q")
_PLACEHOLDER = struct.Struct("<II")

_handles = itertools.count(1)  # process-wide, so a handle of a closed runtime is never valid


def _new_handle(kind: int) -> int:
    return (kind << 32) | next(_handles)


_STREAM_HANDLE, _EVENT_HANDLE, _BINARY_HANDLE, _FUNCTION_HANDLE = 0x5151, 0x5E5E, 0x5B5B, 0x5F5F


def _release_all(locks: Iterable[threading.Lock]) -> None:
    for lock in list(locks):
        try:
            lock.release()
        except RuntimeError:  # already released: a wake-up is pending anyway
            pass


class _Recording:
    """One ``record_event`` call: done once the device reaches it."""

    __slots__ = ("done", "timeline", "timestamp", "waiters")

    def __init__(self, timeline: bool) -> None:
        self.done = False
        self.timeline = timeline
        self.timestamp = 0.0
        #: locks of threads blocked in synchronize_event on this recording (released when done)
        self.waiters: list[threading.Lock] | None = None


class _Event:
    __slots__ = ("current", "flags", "handle")

    def __init__(self, handle: int, flags: int) -> None:
        self.handle = handle
        self.flags = flags
        #: the latest recording (None: never recorded, reads COMPLETE as an Ex event)
        self.current: _Recording | None = None


class _Stream:
    __slots__ = (
        "busy_until",
        "completed",
        "destroyed",
        "failure_mode",
        "handle",
        "hung",
        "occupied",
        "queue",
        "submitted",
    )

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.queue: deque[tuple[Any, ...]] = deque()
        self.submitted = 0  # written by submitting threads, under the runtime lock
        self.completed = 0  # written by the device thread only
        self.occupied = False  # a popped kernel still occupies the stream (busy/hang)
        self.hung = False
        self.busy_until = 0.0  # perf_counter() time until which the stream is occupied
        self.destroyed = False
        self.failure_mode = ACL_CONTINUE_ON_FAILURE


class _PageableCopy:
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


class _Binary:
    __slots__ = ("functions", "kernels")

    def __init__(self, kernels: dict[str, KernelSpec]) -> None:
        self.kernels = kernels
        self.functions: dict[str, int] = {}


class SimRuntime:
    """The simulated ACL runtime for one device (see the module docstring).

    Open it with :func:`open_sim_runtime` (or ``open_runtime("sim", device_id)``).

    :param device_id: the device number (only used in names and messages)
    :param time_model: charge each kernel its registered ``cost`` in device time, so that work
        on different streams overlaps realistically (off by default)
    :param max_queue_depth: unfinished tasks a stream holds before a submitting call blocks
    """

    name = "sim"

    def __init__(
        self,
        device_id: int,
        *,
        time_model: bool = False,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    ) -> None:
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise ValueError(f"device_id must be a non-negative int, got {device_id!r}")
        if isinstance(max_queue_depth, bool) or not isinstance(max_queue_depth, int):
            raise TypeError("max_queue_depth must be an int")
        if max_queue_depth < 1:
            raise ValueError(f"max_queue_depth={max_queue_depth} must be >= 1")
        self.device_id = device_id
        self.time_model = bool(time_model)
        self.max_queue_depth = max_queue_depth

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tls = threading.local()
        self._memory = DeviceMemory()
        self._pinned = PinnedMemory()
        self._pinned_views = self._pinned.views  # fast path: args buffers by base address

        self._streams: dict[int, _Stream] = {}
        self._stream_list: tuple[_Stream, ...] = ()
        self._events: dict[int, _Event] = {}
        self._binaries: dict[int, _Binary] = {}
        self._functions: dict[int, KernelSpec] = {}
        self._pageable: set[_PageableCopy] = set()

        self._fault: tuple[int, str] | None = None
        self._closed = False
        self._paused = False
        self._pause_ack = False
        self._idle = False
        self._work_seq = 0
        self._stream_waiters = 0  # threads waiting for stream progress (sync, full queue)
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

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("faulted" if self._fault else "open")
        return f"<SimRuntime device={self.device_id} {state}>"

    # --- errors ----------------------------------------------------------------------------

    def _error(self, code: int, func: str, message: str) -> RuntimeAPIError:
        """Build the typed error and remember its text as this thread's recent error."""
        self._tls.last_error = f"{func} [{code}]: {message}" if message else f"{func} [{code}]"
        return error_for_code(code, func, message)

    def _param(self, func: str, message: str) -> RuntimeAPIError:
        return self._error(_PARAM_INVALID, func, message)

    def _context_error(self, func: str) -> RuntimeAPIError:
        if self._closed:
            return self._error(_CONTEXT_NULL, func, "the runtime was closed (context destroyed)")
        return self._error(
            _CONTEXT_NULL,
            func,
            f"no context is bound to thread {threading.current_thread().name!r}: call "
            "set_current_context() first",
        )

    def _fault_error(self, func: str) -> RuntimeAPIError:
        fault = self._fault
        assert fault is not None
        return self._error(fault[0], func, fault[1])

    def _check(self, func: str) -> None:
        """Context bound and device not closed."""
        if self._closed or not getattr(self._tls, "bound", False):
            raise self._context_error(func)

    def _check_live(self, func: str) -> None:
        """Context bound, and the device has not faulted (calls that submit or observe work)."""
        if self._closed or not getattr(self._tls, "bound", False):
            raise self._context_error(func)
        if self._fault is not None:
            raise self._fault_error(func)

    def _stream(self, stream: int, func: str) -> _Stream:
        s = self._streams.get(stream)
        if s is None:
            raise self._error(
                _INVALID_HANDLE, func, f"stream handle {stream!r} is not a live stream"
            )
        return s

    def _event(self, event: int, func: str) -> _Event:
        ev = self._events.get(event)
        if ev is None:
            raise self._error(_INVALID_HANDLE, func, f"event handle {event!r} is not a live event")
        return ev

    # --- context and lifecycle -------------------------------------------------------------

    def set_current_context(self) -> None:
        """``aclrtSetCurrentContext``: bind this runtime's context to the calling thread."""
        if self._closed:
            raise self._context_error("aclrtSetCurrentContext")
        self._tls.bound = True

    def get_recent_error_message(self) -> str:
        """``aclGetRecentErrMsg``: the latest error text of the calling thread ('' if none)."""
        message: str = getattr(self._tls, "last_error", "")
        return message

    def close(self) -> None:
        """Stop and join the device thread and release everything. Idempotent, any thread.

        :meth:`live_resources` keeps reporting what was still live when ``close`` was called.
        """
        with self._cond:
            if self._closed:
                return
            self._final_resources = self._live_counts()
            self._closed = True
            self._cond.notify_all()
            _release_all(self._sync_locks)
            waiters = list(self._pageable)
        for waiter in waiters:
            waiter.fail(_CONTEXT_NULL, "the runtime was closed while the copy was queued")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        with self._cond:
            for s in self._stream_list:
                s.destroyed = True
                s.queue.clear()
            self._streams.clear()
            self._stream_list = ()
            self._events.clear()
            self._binaries.clear()
            self._functions.clear()
            self._pageable.clear()
            self._fault = None
            self._cond.notify_all()
        self._memory.clear()
        self._pinned.clear()

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
                self._cond.wait(_WAIT_SLICE_S)

    def resume(self) -> None:
        """Let the device execute tasks again (test control)."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def inject_launch_error(self, code: int, after: int = 0) -> None:
        """Make the ``after + 1``-th future launch call raise ``error_for_code(code)``, queuing
        nothing (test control, for "batch partly refused" tests). The device does not fault."""
        if isinstance(code, bool) or not isinstance(code, int) or code == 0:
            raise ValueError(f"code must be a non-zero int, got {code!r}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be an int >= 0, got {after!r}")
        self._inject = (after, code)

    def _live_counts(self) -> dict[str, int]:
        return {
            "device_allocations": self._memory.user_count(),
            "host_allocations": self._pinned.count(),
            "streams": len(self._streams),
            "events": len(self._events),
            "binaries": len(self._binaries),
        }

    def live_resources(self) -> dict[str, int]:
        """Live user resources: ``device_allocations``, ``host_allocations``, ``streams``,
        ``events``, ``binaries``. After :meth:`close`: the counts live when close was called."""
        final = self._final_resources
        if final is not None:
            return dict(final)
        return self._live_counts()

    @property
    def counters(self) -> dict[str, int]:
        """``launches`` and ``copies`` submitted, ``kernels_executed``, ``events_recorded``."""
        return {
            "launches": self._launches,
            "kernels_executed": self._kernels_executed,
            "copies": self._copies,
            "events_recorded": self._events_recorded,
        }

    @property
    def is_faulted(self) -> bool:
        """Whether the device has faulted (sticky until close)."""
        return self._fault is not None

    @property
    def device_thread(self) -> threading.Thread:
        """The thread that executes device work."""
        return self._thread

    # --- streams ---------------------------------------------------------------------------

    def create_stream(self) -> int:
        """``aclrtCreateStream``."""
        self._check("aclrtCreateStream")
        handle = _new_handle(_STREAM_HANDLE)
        with self._lock:
            self._streams[handle] = _Stream(handle)
            self._stream_list = tuple(self._streams.values())
        return handle

    def _remove_stream(self, s: _Stream) -> list[tuple[Any, ...]]:
        with self._cond:
            s.destroyed = True
            self._streams.pop(s.handle, None)
            self._stream_list = tuple(self._streams.values())
            dropped = list(s.queue)
            s.queue.clear()
            s.occupied = False
            s.hung = False
            self._work_seq += 1
            self._cond.notify_all()
        return dropped

    def destroy_stream(self, stream: int) -> None:
        """``aclrtDestroyStream``: wait for the queued work (unless faulted), then destroy."""
        func = "aclrtDestroyStream"
        self._check(func)
        s = self._stream(stream, func)
        target = s.submitted
        if self._fault is None:
            try:
                self._wait_stream(s, target, -1, func)
            except RuntimeAPIError as exc:
                if self._fault is None or not _is_fault_of(exc, self._fault):
                    raise
        self._fail_pageable(self._remove_stream(s), _STREAM_ABORT, "the stream was destroyed")

    def destroy_stream_force(self, stream: int) -> None:
        """``aclrtDestroyStreamForce``: destroy at once, discarding queued and running work."""
        func = "aclrtDestroyStreamForce"
        self._check(func)
        s = self._stream(stream, func)
        self._fail_pageable(self._remove_stream(s), _STREAM_ABORT, "the stream was force-destroyed")

    def _fail_pageable(self, tasks: list[tuple[Any, ...]], code: int, message: str) -> None:
        for task in tasks:
            if task[0] == _COPY and task[7] is not None:
                task[7].fail(code, message)

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        """``aclrtSetStreamFailureMode``. The sim halts the whole device on any kernel fault
        (as stop-on-failure does); the mode is validated and stored."""
        func = "aclrtSetStreamFailureMode"
        self._check(func)
        s = self._stream(stream, func)
        if mode not in (ACL_CONTINUE_ON_FAILURE, ACL_STOP_ON_FAILURE):
            raise self._param(func, f"mode={mode!r}: expected 0 (continue) or 1 (stop on failure)")
        s.failure_mode = mode

    def _check_timeout(self, timeout_ms: int, func: str) -> None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
            raise self._param(func, f"timeout={timeout_ms!r}: expected an int (ms)")
        if timeout_ms == 0 or timeout_ms < -1:
            raise self._param(func, f"timeout={timeout_ms}: expected -1 (forever) or > 0 ms")

    def _wait_stream(self, s: _Stream, target: int, timeout_ms: int, func: str) -> None:
        """Block until ``target`` tasks of ``s`` completed (GIL-releasing waits)."""
        if s.completed >= target and self._fault is None:
            return
        deadline = None if timeout_ms < 0 else monotonic() + timeout_ms / 1000.0
        cond = self._cond
        with cond:
            self._stream_waiters += 1
            try:
                while True:
                    if self._fault is not None:
                        raise self._fault_error(func)
                    if self._closed:
                        raise self._context_error(func)
                    if s.completed >= target:
                        return
                    if s.destroyed:
                        raise self._error(_STREAM_ABORT, func, "the stream was destroyed")
                    slice_s = _WAIT_SLICE_S
                    if deadline is not None:
                        remaining = deadline - monotonic()
                        if remaining <= 0:
                            raise self._error(
                                _STREAM_SYNC_TIMEOUT,
                                func,
                                f"stream not idle after {timeout_ms} ms "
                                f"({target - s.completed} tasks unfinished)",
                            )
                        slice_s = min(slice_s, remaining)
                    cond.wait(slice_s)
            finally:
                self._stream_waiters -= 1

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        """``aclrtSynchronizeStreamWithTimeout``: block until the stream's work so far is done."""
        func = "aclrtSynchronizeStreamWithTimeout"
        self._check_live(func)
        s = self._stream(stream, func)
        self._check_timeout(timeout_ms, func)
        self._wait_stream(s, s.submitted, timeout_ms, func)

    # --- submission ------------------------------------------------------------------------

    def _wait_for_room(self, s: _Stream, func: str) -> None:
        with self._cond:
            self._stream_waiters += 1
            try:
                while s.submitted - s.completed >= self.max_queue_depth:
                    if self._fault is not None:
                        raise self._fault_error(func)
                    if self._closed:
                        raise self._context_error(func)
                    if s.destroyed:
                        raise self._error(_STREAM_ABORT, func, "the stream was destroyed")
                    self._cond.wait(_WAIT_SLICE_S)
            finally:
                self._stream_waiters -= 1

    def _enqueue(self, s: _Stream, task: tuple[Any, ...], func: str) -> None:
        if s.submitted - s.completed >= self.max_queue_depth:
            self._wait_for_room(s, func)  # the real runtime blocks on a full task queue too
        with self._lock:
            if s.destroyed:
                raise self._error(_INVALID_HANDLE, func, "the stream was destroyed")
            s.queue.append(task)
            s.submitted += 1
            self._work_seq += 1
            if task[0] == _COPY:
                self._copies += 1
            elif task[0] == _RECORD:
                self._events_recorded += 1
            if self._idle:  # wake the device thread once, not on every submission
                self._idle = False
                self._cond.notify()

    # --- events ----------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        """``aclrtCreateEventExWithFlag``."""
        func = "aclrtCreateEventExWithFlag"
        self._check(func)
        if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags <= 0x7F:
            raise self._param(func, f"flag={flags!r}: expected a combination of ACL_EVENT_* bits")
        handle = _new_handle(_EVENT_HANDLE)
        self._events[handle] = _Event(handle, flags)
        return handle

    def destroy_event(self, event: int) -> None:
        """``aclrtDestroyEvent`` (queued records and waits of it still complete)."""
        func = "aclrtDestroyEvent"
        self._check(func)
        if self._events.pop(event, None) is None:
            raise self._error(_INVALID_HANDLE, func, f"event handle {event!r} is not a live event")

    def record_event(self, event: int, stream: int) -> None:
        """``aclrtRecordEvent``: NOT_READY from the end of this call until the device reaches it."""
        func = "aclrtRecordEvent"
        self._check_live(func)
        ev = self._event(event, func)
        s = self._stream(stream, func)
        rec = _Recording(bool(ev.flags & ACL_EVENT_TIME_LINE))
        self._enqueue(s, (_RECORD, rec), func)
        # Only now does the event refer to the new recording: a query racing with this call
        # on another thread still sees the previous status, as on the real runtime.
        ev.current = rec

    def query_event_status(self, event: int) -> int:
        """``aclrtQueryEventStatus``: 1 (COMPLETE) or 0 (NOT_READY); never blocks."""
        func = "aclrtQueryEventStatus"
        self._check_live(func)
        ev = self._events.get(event)
        if ev is None:
            raise self._error(_INVALID_HANDLE, func, f"event handle {event!r} is not a live event")
        rec = ev.current
        if rec is None or rec.done:
            return ACL_EVENT_RECORDED_STATUS_COMPLETE
        return ACL_EVENT_RECORDED_STATUS_NOT_READY

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        """``aclrtSynchronizeEventWithTimeout``: block until the event's recording completes."""
        func = "aclrtSynchronizeEventWithTimeout"
        self._check_live(func)
        ev = self._event(event, func)
        self._check_timeout(timeout_ms, func)
        rec = ev.current
        if rec is None or rec.done:
            return
        deadline = None if timeout_ms < 0 else monotonic() + timeout_ms / 1000.0
        # Each waiter blocks on a lock of its own that the device thread releases when this
        # recording completes (or a fault/close happens): only that waiter wakes up, as with
        # the real runtime, instead of every thread blocked in a synchronize call.
        wake = threading.Lock()
        wake.acquire()
        with self._cond:
            if rec.waiters is None:
                rec.waiters = []
            rec.waiters.append(wake)
            self._sync_locks.add(wake)
        try:
            while True:
                if self._fault is not None:
                    raise self._fault_error(func)
                if self._closed:
                    raise self._context_error(func)
                if rec.done:
                    return
                slice_s = _WAIT_SLICE_S
                if deadline is not None:
                    remaining = deadline - monotonic()
                    if remaining <= 0:
                        raise self._error(
                            _EVENT_SYNC_TIMEOUT,
                            func,
                            f"event not complete after {timeout_ms} ms",
                        )
                    slice_s = min(slice_s, remaining)
                wake.acquire(timeout=slice_s)
        finally:
            with self._cond:
                self._sync_locks.discard(wake)

    def stream_wait_event(self, stream: int, event: int) -> None:
        """``aclrtStreamWaitEvent``: later work on ``stream`` waits for the event's recording
        as of this call; a never-recorded event does not wait."""
        func = "aclrtStreamWaitEvent"
        self._check_live(func)
        s = self._stream(stream, func)
        ev = self._event(event, func)
        rec = ev.current
        if rec is None or rec.done:
            return
        self._enqueue(s, (_WAIT, rec), func)

    def event_elapsed_time(self, start: int, end: int) -> float:
        """``aclrtEventElapsedTime``: ms between two completed ``ACL_EVENT_TIME_LINE`` events."""
        func = "aclrtEventElapsedTime"
        self._check_live(func)
        recs = []
        for name, handle in (("startEvent", start), ("endEvent", end)):
            ev = self._event(handle, func)
            if not ev.flags & ACL_EVENT_TIME_LINE:
                raise self._param(func, f"{name} was not created with ACL_EVENT_TIME_LINE")
            rec = ev.current
            if rec is None:
                raise self._param(func, f"{name} was never recorded")
            if not rec.done:
                raise self._param(func, f"{name} is not complete yet")
            recs.append(rec)
        return (recs[1].timestamp - recs[0].timestamp) * 1000.0

    # --- memory ----------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """``aclrtMalloc``: zero-filled device memory at a 64-byte aligned address."""
        return self._allocate("aclrtMalloc", size, self._memory.malloc)

    def free(self, ptr: int) -> None:
        """``aclrtFree``: at once, even if queued work still uses it (that work then faults)."""
        func = "aclrtFree"
        self._check(func)
        if not self._memory.free(ptr):
            raise self._param(func, f"devPtr={_hex(ptr)} is not a live device allocation")

    def malloc_host(self, size: int) -> int:
        """``aclrtMallocHost``: zero-filled, 64-byte aligned pinned host memory."""
        return self._allocate("aclrtMallocHost", size, self._pinned.malloc)

    def _allocate(self, func: str, size: int, allocate: Callable[[int], int]) -> int:
        self._check(func)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise self._param(func, f"size={size!r}: expected an int > 0")
        try:
            return allocate(size)
        except MemoryError as exc:
            raise self._error(
                _MEMORY_ALLOCATION, func, f"cannot allocate {size} bytes: {exc}"
            ) from None

    def free_host(self, ptr: int) -> None:
        """``aclrtFreeHost``: at once; queued work that still reads it sees poison bytes."""
        func = "aclrtFreeHost"
        self._check(func)
        if not self._pinned.free(ptr):
            raise self._param(func, f"hostPtr={_hex(ptr)} is not a live pinned host allocation")

    def _host_side(self, addr: int, count: int, name: str, func: str) -> tuple[U8Array, int] | None:
        """Pinned ``(array, offset)`` for a host address, or None if it is pageable."""
        if isinstance(addr, bool) or not isinstance(addr, int) or addr <= 0:
            raise self._param(func, f"{name}={addr!r} is not a valid host address")
        try:
            found = self._pinned.find(addr, count)
        except ValueError as exc:
            raise self._param(func, f"{name}: {exc}") from None
        if found is None and is_device_address(addr):
            raise self._param(
                func, f"{name}={addr:#x} is a device address, but the copy kind expects host memory"
            )
        return found

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """``aclrtMemcpyAsync``: queue a copy; pageable host memory makes the call synchronous."""
        func = "aclrtMemcpyAsync"
        self._check_live(func)
        s = self._stream(stream, func)
        for name, value in (("destMax", dst_max), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self._param(func, f"{name}={value!r}: expected an int >= 0")
        if count > dst_max:
            raise self._param(func, f"count={count} is larger than destMax={dst_max}")
        for name, value in (("dst", dst), ("src", src)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise self._param(func, f"{name}={value!r} is a NULL or invalid pointer")
        host: tuple[U8Array, int] | None = None
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            host = self._host_side(src, count, "src", func)
        elif kind == ACL_MEMCPY_DEVICE_TO_HOST:
            host = self._host_side(dst, count, "dst", func)
        elif kind != ACL_MEMCPY_DEVICE_TO_DEVICE:
            raise self._param(
                func,
                f"kind={kind!r}: expected 1 (host to device), 2 (device to host) or 3 "
                "(device to device)",
            )
        if kind == ACL_MEMCPY_DEVICE_TO_DEVICE or host is not None:
            array, offset = host if host is not None else (None, 0)
            self._enqueue(s, (_COPY, kind, dst, src, count, array, offset, None), func)
            return
        # Pageable: the caller blocks until the stream reaches the copy, which the device thread
        # performs while the caller is still blocked (the memory is valid for that long).
        waiter = _PageableCopy()
        with self._lock:
            self._pageable.add(waiter)
        try:
            self._enqueue(s, (_COPY, kind, dst, src, count, None, 0, waiter), func)
            while not waiter.done.wait(_WAIT_SLICE_S):
                if self._closed:
                    waiter.fail(_CONTEXT_NULL, "the runtime was closed while the copy was queued")
        finally:
            with waiter.lock:  # never return while the device thread touches our memory
                waiter.cancelled = True
            with self._lock:
                self._pageable.discard(waiter)
        if waiter.error is not None:
            if self._fault is not None:
                raise self._fault_error(func)
            raise self._error(waiter.error[0], func, waiter.error[1])

    # --- kernels ---------------------------------------------------------------------------

    def load_binary(self, source: object) -> int:
        """Load a :class:`KernelLibrary` (snapshotted now), or the built-ins for ``None``."""
        func = "aclrtBinaryLoadFromData"
        self._check(func)
        if source is None:
            library = BUILTIN_LIBRARY
        elif isinstance(source, KernelLibrary):
            library = source
        else:
            raise self._param(
                func,
                f"the sim backend loads an aio_ascend.sim.KernelLibrary (or None for the built-in "
                f"kernels), got {type(source).__name__}",
            )
        handle = _new_handle(_BINARY_HANDLE)
        self._binaries[handle] = _Binary(library.snapshot())
        return handle

    def unload_binary(self, binary: int) -> None:
        """``aclrtBinaryUnLoad``: its function handles become invalid (queued launches run)."""
        func = "aclrtBinaryUnLoad"
        self._check(func)
        b = self._binaries.pop(binary, None)
        if b is None:
            raise self._error(_INVALID_HANDLE, func, f"binary handle {binary!r} is not loaded")
        for handle in b.functions.values():
            self._functions.pop(handle, None)

    def get_function(self, binary: int, name: str) -> int:
        """``aclrtBinaryGetFunction``: unknown name -> 107042 (symbol not found)."""
        func = "aclrtBinaryGetFunction"
        self._check(func)
        b = self._binaries.get(binary)
        if b is None:
            raise self._error(_INVALID_HANDLE, func, f"binary handle {binary!r} is not loaded")
        handle = b.functions.get(name)
        if handle is not None:
            return handle
        spec = b.kernels.get(name)
        if spec is None:
            raise self._error(
                _SYMBOL_NOT_FOUND,
                func,
                f"kernel {name!r} not found in the binary (it has {sorted(b.kernels)})",
            )
        handle = _new_handle(_FUNCTION_HANDLE)
        b.functions[name] = handle
        self._functions[handle] = spec
        return handle

    def launch_kernel_with_host_args(
        self,
        func: int,
        num_blocks: int,
        stream: int,
        cfg: LaunchConfig | None,
        args_addr: int,
        args_size: int,
        placeholders_addr: int,
        placeholder_count: int,
    ) -> None:
        """``aclrtLaunchKernelWithHostArgs`` (see the protocol). Validates every field, patches
        placeholder addresses into the caller's buffer, and queues the kernel; pinned args are
        read when the kernel executes, pageable args are snapshotted now."""
        name = "aclrtLaunchKernelWithHostArgs"
        if self._closed or not getattr(self._tls, "bound", False):
            raise self._context_error(name)
        if self._fault is not None:
            raise self._fault_error(name)
        inject = self._inject
        if inject is not None:
            if inject[0] == 0:
                self._inject = None
                raise self._error(
                    inject[1], name, "injected launch error (SimRuntime.inject_launch_error)"
                )
            self._inject = (inject[0] - 1, inject[1])
        spec = self._functions.get(func)
        if spec is None:
            raise self._error(
                _INVALID_HANDLE, name, f"funcHandle {func!r} is not a function of a loaded binary"
            )
        s = self._streams.get(stream)
        if s is None:
            raise self._error(_INVALID_HANDLE, name, f"stream {stream!r} is not a live stream")
        if type(num_blocks) is not int or not 1 <= num_blocks <= MAX_NUM_BLOCKS:
            raise self._param(
                name, f"numBlocks={num_blocks!r}: expected an int in 1..{MAX_NUM_BLOCKS}"
            )
        if cfg is not None and not isinstance(cfg, LaunchConfig):
            raise self._param(name, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}")
        if type(args_addr) is not int or args_addr <= 0:
            raise self._param(name, f"hostArgs={args_addr!r}: the args buffer address is NULL")
        if type(args_size) is not int or not 1 <= args_size <= UINT32_MAX:
            raise self._param(name, f"argsSize={args_size!r}: expected an int in 1..{UINT32_MAX}")
        # the caller's args buffer: pinned (read when the kernel runs) or pageable
        view = self._pinned_views.get(args_addr)
        offset = 0
        if view is None or len(view) < args_size:
            found = self._host_side(args_addr, args_size, "hostArgs", name)
            if found is not None:
                view, offset = found[0].data, found[1]
            else:
                view = None
        if placeholder_count:
            entries = self._placeholders(
                name, args_size, placeholders_addr, placeholder_count, view, args_addr - offset
            )
        elif type(placeholder_count) is not int or placeholder_count < 0:
            raise self._param(name, f"placeHolderNum={placeholder_count!r}: expected an int >= 0")
        else:
            entries = None
        if s.submitted - s.completed >= self.max_queue_depth:
            self._wait_for_room(s, name)
        region = 0
        if entries is not None:
            region = self._memory.reserve_region()
            if view is not None:
                for addr_offset, data_offset in entries:
                    _U64.pack_into(view, offset + addr_offset, region + data_offset)
            else:
                for addr_offset, data_offset in entries:
                    ctypes.memmove(args_addr + addr_offset, _U64.pack(region + data_offset), 8)
        task: tuple[Any, ...]
        if view is None:  # pageable: snapshot now, after patching
            task = (
                _KERNEL,
                spec,
                num_blocks,
                ctypes.string_at(args_addr, args_size),
                0,
                args_size,
                region,
            )
        else:  # pinned: read when the kernel executes
            task = (_KERNEL, spec, num_blocks, view, offset, args_size, region)
        with self._lock:
            if s.destroyed:
                raise self._error(_INVALID_HANDLE, name, "the stream was destroyed")
            s.queue.append(task)
            s.submitted += 1
            self._work_seq += 1
            self._launches += 1
            if self._idle:  # wake the device thread once, not on every submission
                self._idle = False
                self._cond.notify()

    def _placeholders(
        self,
        name: str,
        args_size: int,
        table_addr: int,
        count: int,
        args_view: memoryview | None,
        args_base: int,
    ) -> list[tuple[int, int]]:
        """Read and validate the ``aclrtPlaceHolderInfo`` table (during the call).

        ``args_view``/``args_base``: the pinned allocation holding the args, where the table
        usually sits too (the scheduler packs it right after the args).
        """
        if type(count) is not int or not 0 <= count <= _MAX_PLACEHOLDERS:
            raise self._param(
                name, f"placeHolderNum={count!r}: expected an int in 0..{_MAX_PLACEHOLDERS}"
            )
        if type(table_addr) is not int or table_addr <= 0:
            raise self._param(name, f"placeHolderArray is NULL while placeHolderNum={count}")
        nbytes = count * _PLACEHOLDER.size
        unpack = _PLACEHOLDER.unpack_from
        table_offset = table_addr - args_base
        found: tuple[U8Array, int] | None
        if args_view is not None and 0 <= table_offset <= len(args_view) - nbytes:
            entries = [unpack(args_view, table_offset + 8 * i) for i in range(count)]
        elif (found := self._pinned_table(table_addr, nbytes)) is not None:
            view, offset = found[0].data, found[1]
            entries = [unpack(view, offset + 8 * i) for i in range(count)]
        else:  # pageable (or invalid: _host_side raises)
            self._host_side(table_addr, nbytes, "placeHolderArray", name)
            raw = ctypes.string_at(table_addr, nbytes)
            entries = list(_PLACEHOLDER.iter_unpack(raw))
        for addr_offset, data_offset in entries:
            if (
                (addr_offset | data_offset) & 7
                or addr_offset + 8 > args_size
                or (data_offset >= args_size)
            ):
                raise self._bad_placeholder(name, args_size, entries)
        return entries

    def _pinned_table(self, addr: int, nbytes: int) -> tuple[U8Array, int] | None:
        try:
            return self._pinned.find(addr, nbytes)
        except ValueError:
            return None

    def _bad_placeholder(
        self, name: str, args_size: int, entries: list[tuple[int, int]]
    ) -> RuntimeAPIError:
        """The error naming the first invalid placeholder field."""
        for index, (addr_offset, data_offset) in enumerate(entries):
            where = f"placeHolderArray[{index}]"
            if addr_offset % 8:
                return self._param(name, f"{where}.addrOffset={addr_offset} is not 8-aligned")
            if addr_offset + 8 > args_size:
                return self._param(
                    name,
                    f"{where}.addrOffset={addr_offset}: the 8-byte slot ends past "
                    f"argsSize={args_size}",
                )
            if data_offset % 8:
                return self._param(name, f"{where}.dataOffset={data_offset} is not 8-aligned")
            if data_offset >= args_size:
                return self._param(
                    name, f"{where}.dataOffset={data_offset} is not below argsSize={args_size}"
                )
        raise AssertionError("no invalid placeholder entry")

    # --- the device thread -----------------------------------------------------------------

    def _device_main(self) -> None:
        cond = self._cond
        while not self._closed:
            seq = self._work_seq
            if self._paused or self._fault is not None:
                with cond:
                    while (self._paused or self._fault is not None) and not self._closed:
                        if self._paused and not self._pause_ack:
                            self._pause_ack = True
                            cond.notify_all()
                        cond.wait(_WAIT_SLICE_S)
                    self._pause_ack = False
                continue
            started = perf_counter()
            progressed, records_done, deadline = self._drain()
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
                timeout = _WAIT_SLICE_S
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
        start = self._rr = (self._rr + 1) % n
        progressed = False
        records_done = False
        deadline: float | None = None
        now = perf_counter()
        for s in streams[start:] + streams[:start]:
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
                if kind == _WAIT:
                    if not task[1].done:
                        break
                    queue.popleft()
                elif kind == _KERNEL:
                    queue.popleft()
                    if self._run_kernel(s, task):
                        if self._fault is not None:
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
                elif kind == _RECORD:
                    queue.popleft()
                    rec = task[1]
                    if rec.timeline:
                        rec.timestamp = max(perf_counter(), s.busy_until)
                    rec.done = True
                    records_done = True
                    if rec.waiters:
                        _release_all(rec.waiters)
                else:
                    queue.popleft()
                    self._run_copy(task)
                    if self._fault is not None:
                        return True, records_done, None
                s.completed += 1
                progressed = True
                budget -= 1
                if not budget:
                    deadline = now  # more to do: come back right away
                    break
        return progressed, records_done, deadline

    def _run_kernel(self, s: _Stream, task: tuple[Any, ...]) -> bool:
        """Execute a kernel task. Returns True when the stream stays occupied (sleep, time
        model, hang) or the device faulted; the caller then leaves the task uncounted."""
        _, spec, blocks, source, offset, size, region = task
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
            busy = ctx._busy
            if self.time_model and spec.cost is not None:
                busy += float(spec.cost(ctx))
        except DeviceFault as exc:
            fault = exc
        except Exception as exc:
            fault = DeviceFault(507015, describe_exception(spec.name, exc))
        finally:
            if region:
                memory.unmap_region(region)
        self._kernels_executed += 1
        if not busy and fault is None and ctx._fault is None and not ctx._hung:
            return False  # the common case: done at once
        fault = ctx._fault or fault
        if fault is not None:
            self._set_fault(fault.code, fault.message)
            return True
        s.occupied = True
        if ctx._hung or not math.isfinite(busy):
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

    def _pageable_copy(self, kind: int, dst: int, src: int, count: int) -> None:
        if count == 0:
            return
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            device = self._memory.view(dst, count, "memcpy destination")
            ctypes.memmove(device.ctypes.data, src, count)
        else:
            device = self._memory.view(src, count, "memcpy source")
            ctypes.memmove(dst, device.ctypes.data, count)

    def _set_fault(self, code: int, message: str) -> None:
        with self._cond:
            if self._fault is None:
                self._fault = (code, message)
            self._cond.notify_all()
            _release_all(self._sync_locks)
            waiters = list(self._pageable)
        for waiter in waiters:
            waiter.fail(code, message)


def _is_fault_of(exc: RuntimeAPIError, fault: tuple[int, str]) -> bool:
    return exc.code == fault[0] and exc.message == fault[1]


def _hex(value: object) -> str:
    return f"{value:#x}" if isinstance(value, int) else repr(value)


def open_sim_runtime(
    device_id: int,
    *,
    time_model: bool = False,
    max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
) -> SimRuntime:
    """Open the simulator on ``device_id`` and bind its context to the calling thread."""
    runtime = SimRuntime(device_id, time_model=time_model, max_queue_depth=max_queue_depth)
    runtime.set_current_context()
    return runtime
