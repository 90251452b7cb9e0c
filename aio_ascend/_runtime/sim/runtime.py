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
:meth:`SimRuntime.live_resources`, :attr:`SimRuntime.counters`.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import struct
import threading
from collections.abc import Callable
from time import monotonic
from typing import Any, ClassVar, Final

from ..._errors import InvalidParamError, RuntimeAPIError
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_ERROR_RT_CONTEXT_NULL,
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
    ACL_ERROR_RT_MEMORY_ALLOCATION,
    ACL_ERROR_RT_STREAM_ABORT,
    ACL_ERROR_RT_SYMBOL_NOT_FOUND,
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    check_args,
    check_num_blocks,
    check_placeholder_count,
    check_placeholder_entries,
    check_table_addr,
    is_bytes_like,
    launch_fields_fit,
    param_error,
)
from ..abi import hex_or_repr as _hex
from ..emulation import Fault
from .executor import (
    BINARY_HANDLE,
    COPY,
    COPY_WAITER,
    CURRENT,
    DEFAULT_MAX_QUEUE_DEPTH,
    EVENT_HANDLE,
    FREED_UNDER_CALLERS,
    FUNCTION_HANDLE,
    GRAPH,
    GRAPH_HANDLE,
    KERNEL,
    LIVE_CONTEXTS,
    MEMSET,
    PRIORITY_GREATEST,
    PRIORITY_LEAST,
    RECORD,
    STREAM_HANDLE,
    WAIT,
    WAIT_SLICE_S,
    DeviceExecutor,
    PageableCopy,
    Recording,
    SimBinary,
    SimEvent,
    SimGraph,
    SimStream,
    new_handle,
    release_all,
)
from .kernels import BUILTIN_LIBRARY, KernelLibrary, KernelSpec
from .memory import DEFAULT_MEMORY_BYTES, U8Array, is_device_address

__all__ = ["DEFAULT_MAX_QUEUE_DEPTH", "SimRuntime", "open_sim_runtime"]

log = logging.getLogger("aio_ascend")

#: how long a close joins a device thread that is still running tasks (see close())
_LEAVE_RUNNING_S: Final = 0.05

_U64 = struct.Struct("<Q")
_PLACEHOLDER = struct.Struct("<II")


class SimRuntime(DeviceExecutor):
    """The simulated ACL runtime for one device (see the module docstring).

    Open it with :func:`open_sim_runtime` (or ``open_runtime("sim", device_id)``).

    :param device_id: the device number (only used in names and messages)
    :param time_model: charge each kernel its registered ``cost`` in device time, so that work
        on different streams overlaps realistically (off by default)
    :param max_queue_depth: unfinished tasks a stream holds before a submitting call blocks
    """

    name = "sim"
    #: the sim models ``aclrtLaunchKernelWithHostArgs`` (``Device.info["launch_path"]``)
    launch_path = "host_args"

    #: the ACL function each call of the seam stands for (what its errors name)
    CALLS: ClassVar[dict[str, str]] = {
        "stream_priority_range": "aclrtDeviceGetStreamPriorityRange",
        "create_stream": "aclrtCreateStream",
        "stream_priority": "aclrtSetStreamAttribute",
        "destroy_stream": "aclrtDestroyStream",
        "destroy_stream_force": "aclrtDestroyStreamForce",
        "set_stream_failure_mode": "aclrtSetStreamFailureMode",
        "synchronize_stream": "aclrtSynchronizeStreamWithTimeout",
        "create_event": "aclrtCreateEventExWithFlag",
        "destroy_event": "aclrtDestroyEvent",
        "record_event": "aclrtRecordEvent",
        "query_event_status": "aclrtQueryEventStatus",
        "synchronize_event": "aclrtSynchronizeEventWithTimeout",
        "stream_wait_event": "aclrtStreamWaitEvent",
        "event_elapsed_time": "aclrtEventElapsedTime",
        "malloc": "aclrtMalloc",
        "malloc_host": "aclrtMallocHost",
        "free": "aclrtFree",
        "free_host": "aclrtFreeHost",
        "memcpy_async": "aclrtMemcpyAsync",
        "load_binary": "aclrtBinaryLoadFromData",
        "unload_binary": "aclrtBinaryUnLoad",
        "get_function": "aclrtBinaryGetFunction",
        "begin_capture": "aclmdlRICaptureBegin",
        "end_capture": "aclmdlRICaptureEnd",
        "launch_graph": "aclmdlRIExecuteAsync",
        "destroy_graph": "aclmdlRIDestroy",
    }

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("faulted" if self._fault else "open")
        return f"<SimRuntime device={self.device_id} {state}>"

    # --- context and lifecycle -------------------------------------------------------------

    def release_thread(self) -> None:
        """See the protocol: the calling thread has no current context afterwards, if it had
        this one (the sim's contexts hold no per-thread reference)."""
        if getattr(CURRENT, "context", None) == self._context:
            CURRENT.context = None

    def set_current_context(self, context: int | None = None) -> None:
        """``aclrtSetCurrentContext``: bind this runtime's context to the calling thread (one
        current context per thread across every sim runtime, as in ACL), or ``context``: the
        context of another open sim runtime (works after :meth:`close` too)."""
        func = "aclrtSetCurrentContext"
        if context is None or context == self._context:
            if self._closed:
                raise self._context_error(func)
            CURRENT.context = self._context
            return
        if context not in LIVE_CONTEXTS:
            raise self._bad_handle(func, f"context {context!r} is not a live context")
        CURRENT.context = context

    def get_current_context(self) -> int | None:
        """``aclrtGetCurrentContext``: the calling thread's context (``None``: none)."""
        context: int | None = getattr(CURRENT, "context", None)
        return context if context in LIVE_CONTEXTS else None  # a destroyed one reads as none

    @property
    def context(self) -> int:
        """This runtime's context handle."""
        return self._context

    def close(self) -> None:
        """Stop and join the device thread and release everything. Idempotent, any thread.

        :meth:`live_resources` keeps reporting what was still live when ``close`` was called.
        """
        with self._cond:
            if self._closed:
                return
            self._final_resources = self._live_counts()
            self._closed = True
            LIVE_CONTEXTS.discard(self._context)
            self._cond.notify_all()
            release_all(self._sync_locks)
            waiters = list(self._pageable)
        for waiter in waiters:
            waiter.fail(
                ACL_ERROR_RT_CONTEXT_NULL, "the runtime was closed while the copy was queued"
            )
        if threading.current_thread() is not self._thread:
            # A kernel still running (its wait_settled ran out, or was not asked: this may be
            # the event loop's thread) is not waited for: the thread ends once it returns, as
            # a real device runs out a kernel whose context was destroyed
            self._thread.join(timeout=_LEAVE_RUNNING_S if self._draining else 30)
            if self._thread.is_alive():
                log.warning(
                    "device %d: the sim is still running a kernel at close; its thread ends "
                    "when the kernel returns",
                    self.device_id,
                )
        with self._cond:
            for s in self._stream_list:
                s.destroyed = True
                s.queue.clear()
            self._streams.clear()
            self._stream_list = ()
            self._events.clear()
            self._binaries.clear()
            self._functions.clear()
            self._graphs.clear()
            self._pageable.clear()
            self._fault = None
            self._cond.notify_all()
        self._memory.clear()
        self._pinned.clear()

    # --- test controls ---------------------------------------------------------------------

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
            "graphs": len(self._graphs),
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

    # --- streams ---------------------------------------------------------------------------

    def _device_priority_range(self, func: str) -> tuple[int, int]:
        return PRIORITY_LEAST, PRIORITY_GREATEST  # (7, 0) as on Ascend: 0 most urgent

    def _device_create_stream(self, priority: int | None, func: str) -> SimStream:
        # The device thread serves streams of more urgent priority first in each of its rounds
        # (round-robin among equals); like the real runtime, it never pre-empts a running task.
        s = SimStream(new_handle(STREAM_HANDLE), PRIORITY_LEAST if priority is None else priority)
        with self._lock:
            self._streams[s.handle] = s
            self._set_stream_list()
        return s

    def _remove_stream(self, s: SimStream) -> list[tuple[Any, ...]]:
        with self._cond:
            if s.callers:
                # The real runtime frees the Stream here (stream.cc:4682-4686) under the
                # waiting thread, which goes on using it: a launch or record waiting for room
                # (task_submit.cc:478-506, then event.cc:563-569), a synchronize
                # (stream.cc:1947-2000). That thread gets an error from the sim instead, and
                # the misuse is kept for the tests to see (docs/cann-support.md §13.3).
                misuse = (
                    f"stream {s.handle:#x} destroyed while {s.callers} host thread(s) were "
                    "inside a blocking call on it"
                )
                self.freed_under_callers.append(misuse)
                FREED_UNDER_CALLERS.append(misuse)
            s.destroyed = True
            self._streams.pop(s.handle, None)
            self._set_stream_list()
            dropped = list(s.queue)
            s.queue.clear()
            for task in dropped:
                if task[0] == RECORD:  # a thread synchronizing on it returns now, failing
                    task[1].aborted = True
                    if task[1].waiters:
                        release_all(task[1].waiters)
            s.occupied = False
            s.hung = False
            self._work_seq += 1
            self._cond.notify_all()
        return dropped

    def _device_destroy_stream(self, s: SimStream, force: bool, func: str) -> None:
        # aclrtDestroyStream waits for the queued work (unless faulted); the force variant
        # discards queued and running work at once
        if not force and self._fault is None:
            try:
                self._wait_stream(s, s.submitted, -1, func)
            except RuntimeAPIError as exc:
                if self._fault is None or not _is_fault_of(exc, self._fault):
                    raise
        dropped = self._remove_stream(s)
        why = "the stream was force-destroyed" if force else "the stream was destroyed"
        for task in dropped:
            if task[0] == COPY and task[COPY_WAITER] is not None:
                task[COPY_WAITER].fail(ACL_ERROR_RT_STREAM_ABORT, why)

    def _device_sync_stream(self, s: SimStream, timeout_ms: int, func: str) -> None:
        self._wait_stream(s, s.submitted, timeout_ms, func)

    # --- events ----------------------------------------------------------------------------

    def _device_create_event(self, timed: bool, func: str) -> SimEvent:
        return SimEvent(new_handle(EVENT_HANDLE), timed)

    def _device_destroy_event(self, ev: SimEvent, func: str) -> None:
        pass  # queued records and waits hold their recording, not the event

    def _device_record(self, ev: SimEvent, s: SimStream, func: str) -> None:
        rec = Recording(ev.timed)
        self._enqueue(s, (RECORD, rec), func)
        # Only now does the event refer to the new recording: a query racing with this call
        # on another thread still sees the previous status, as on the real runtime.
        ev.current = rec

    def _device_query(self, ev: SimEvent, func: str) -> int:
        rec = ev.current
        if rec is None or rec.done:
            return ACL_EVENT_RECORDED_STATUS_COMPLETE
        return ACL_EVENT_RECORDED_STATUS_NOT_READY

    def _device_sync_event(self, ev: SimEvent, timeout_ms: int, func: str) -> None:
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
                if rec.aborted:
                    raise self._error(
                        ACL_ERROR_RT_STREAM_ABORT,
                        func,
                        "the stream the event was recorded on was destroyed",
                    )
                slice_s = WAIT_SLICE_S
                if deadline is not None:
                    remaining = deadline - monotonic()
                    if remaining <= 0:
                        raise self._error(
                            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                            func,
                            f"event not complete after {timeout_ms} ms",
                        )
                    slice_s = min(slice_s, remaining)
                wake.acquire(timeout=slice_s)
        finally:
            with self._cond:
                self._sync_locks.discard(wake)

    def fault_site(self) -> tuple[int, int] | None:
        """See the protocol."""
        return self.faulted_task

    def _device_wait_event(self, s: SimStream, ev: SimEvent, func: str) -> None:
        rec = ev.current
        if rec is None or rec.done:
            return  # a never-recorded (or completed) event does not wait
        self._enqueue(s, (WAIT, rec), func)

    def _device_elapsed(self, start: SimEvent, end: SimEvent, func: str) -> float:
        recs = []
        for name, ev in (("startEvent", start), ("endEvent", end)):
            rec = ev.current
            if rec is None:
                raise self._param(func, f"{name} was never recorded")
            if not rec.done:
                raise self._param(func, f"{name} is not complete yet")
            recs.append(rec)
        return (recs[1].timestamp - recs[0].timestamp) * 1000.0

    # --- memory ----------------------------------------------------------------------------

    def _device_malloc(self, size: int, func: str) -> int:
        # zero-filled device memory at a 64-byte aligned address
        return self._allocate(func, size, self._memory.malloc)

    def _device_malloc_host(self, size: int, func: str) -> int:
        # zero-filled, 64-byte aligned pinned host memory
        return self._allocate(func, size, self._pinned.malloc)

    def _allocate(self, func: str, size: int, allocate: Callable[[int], int]) -> int:
        try:
            return allocate(size)
        except MemoryError as exc:
            raise self._error(
                ACL_ERROR_RT_MEMORY_ALLOCATION, func, f"cannot allocate {size} bytes: {exc}"
            ) from None

    def _device_free(self, ptr: int, func: str) -> bool:
        # at once, even if queued work still uses it (that work then faults)
        return self._memory.free(ptr)

    def _device_free_host(self, ptr: int, func: str) -> bool:
        # at once; queued work that still reads it sees poison bytes
        return self._pinned.free(ptr)

    def poison_device(self, ptr: int) -> None:
        """Fill the device allocation at ``ptr`` with ``0xCD`` (a sim control, no ACL call):
        the library's pool poisons every block it takes back for reuse, so that a kernel or
        copy reading it through a stale address sees the pattern."""
        if not self._memory.poison(ptr):
            raise self._param("poison_device", f"devPtr={_hex(ptr)} is not a live allocation")

    def limit_device(self, ptr: int, nbytes: int) -> None:
        """Let kernels and copies reach only the first ``nbytes`` of the allocation at ``ptr``
        (a sim control): the library's pool limits its larger blocks to the request."""
        if not self._memory.limit(ptr, nbytes):
            raise self._param("limit_device", f"devPtr={_hex(ptr)} is not a live allocation")

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

    def _device_memcpy(
        self, s: SimStream, dst: int, src: int, count: int, kind: int, func: str
    ) -> None:
        # pageable host memory makes the call synchronous
        host: tuple[U8Array, int] | None = None
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            host = self._host_side(src, count, "src", func)
        elif kind == ACL_MEMCPY_DEVICE_TO_HOST:
            host = self._host_side(dst, count, "dst", func)
        if kind == ACL_MEMCPY_DEVICE_TO_DEVICE or host is not None:
            array, offset = host if host is not None else (None, 0)
            if s.capture is not None:
                with self._lock:
                    s.capture.append((COPY, kind, dst, src, count, array, offset, None))
                return
            self._enqueue(s, (COPY, kind, dst, src, count, array, offset, None), func)
            return
        self._not_capturing(s, func)  # a pageable copy cannot be captured (it runs in the call)
        # Pageable: the caller blocks until the stream reaches the copy, which the device thread
        # performs while the caller is still blocked (the memory is valid for that long).
        waiter = PageableCopy()
        with self._lock:
            self._pageable.add(waiter)
        try:
            self._enqueue(s, (COPY, kind, dst, src, count, None, 0, waiter), func)
            while not waiter.done.wait(WAIT_SLICE_S):
                if self._closed:
                    waiter.fail(
                        ACL_ERROR_RT_CONTEXT_NULL,
                        "the runtime was closed while the copy was queued",
                    )
        finally:
            with waiter.lock:  # never return while the device thread touches our memory
                waiter.cancelled = True
            with self._lock:
                self._pageable.discard(waiter)
        if waiter.error is not None:
            if self._fault is not None:
                raise self._fault_error(func)
            raise self._error(waiter.error[0], func, waiter.error[1])

    def memset_async(self, ptr: int, dst_max: int, value: int, count: int, stream: int) -> None:
        """``aclrtMemsetAsync``: queue setting ``count`` bytes at ``ptr`` to ``value``'s low byte.

        The range is checked when the task executes (outside a live allocation: a device
        fault), as for device-to-device copies.
        """
        func = "aclrtMemsetAsync"
        self._enter_live(func)
        s = self._stream(stream, func)
        for name, number in (("maxCount", dst_max), ("count", count), ("devPtr", ptr)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise self._param(func, f"{name}={number!r} is not a valid size or address")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._param(func, f"value={value!r} is not an int")
        if count > dst_max:
            raise self._param(func, f"count={count} > maxCount={dst_max}")
        if not is_device_address(ptr):
            raise self._param(func, f"devPtr={_hex(ptr)} is not a device address")
        self._enqueue(s, (MEMSET, ptr, value & 0xFF, count), func)

    # --- kernels ---------------------------------------------------------------------------

    def _device_load(self, source: object, func: str) -> tuple[int, SimBinary]:
        # a KernelLibrary (snapshotted now), or the built-ins for None: the sim's kernels are
        # Python functions, whose arguments no runtime rewrites
        if source is None:
            library = BUILTIN_LIBRARY
        elif isinstance(source, KernelLibrary):
            library = source
        else:
            why = (
                "the sim backend loads an aio_ascend.sim.KernelLibrary (or None for the built-in "
                f"kernels), got {type(source).__name__}"
            )
            if not (isinstance(source, str | os.PathLike) or is_bytes_like(source)):
                raise TypeError(why)  # no backend loads it: a TypeError, as on acl and cuda
            raise self._param(func, why)  # a binary the runtime would read: it refuses it
        return new_handle(BINARY_HANDLE), SimBinary(library.snapshot())

    def _device_unload(self, b: SimBinary, func: str) -> None:
        pass  # queued launches hold their kernel, not the binary

    def _device_get_function(
        self, handle: int, b: SimBinary, name: str, encoded: bytes, func: str
    ) -> tuple[int, KernelSpec]:
        spec = b.kernels.get(name)
        if spec is None:
            raise self._error(
                ACL_ERROR_RT_SYMBOL_NOT_FOUND,
                func,
                f"kernel {name!r} not found in the binary (it has {sorted(b.kernels)})",
            )
        return new_handle(FUNCTION_HANDLE), spec

    # --- graphs (model-RI capture): a capturing stream records its tasks instead of queueing
    # them; a replay is one task that runs the recorded list in order (DeviceExecutor) -------

    def _device_begin_capture(self, s: SimStream, func: str) -> None:
        with self._lock:
            s.capture = []

    def _device_end_capture(self, s: SimStream, func: str) -> SimGraph:
        with self._lock:
            tasks, s.capture = s.capture or [], None
        return SimGraph(new_handle(GRAPH_HANDLE), tasks)

    def _device_launch_graph(self, g: SimGraph, s: SimStream, func: str) -> None:
        self._enqueue(s, (GRAPH, g), func)

    def _device_destroy_graph(self, g: SimGraph, func: str) -> None:
        pass  # queued replays keep the task list they hold

    def info(self) -> dict[str, object]:
        """The sim's facts: its version, memory (``aclrtGetMemInfo``), priority range."""
        self._enter("aclrtGetMemInfo")
        memory = self._memory
        return {
            "runtime_version": f"sim-{_package_version()}",
            "soc_name": "sim",
            "memory_total": memory.capacity,
            "memory_free": memory.capacity - memory.used,
            "stream_priority_least": PRIORITY_LEAST,
            "stream_priority_greatest": PRIORITY_GREATEST,
            "time_model": self.time_model,
            "stream_capacity": self.stream_capacity,
        }

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
        if self._closed or getattr(CURRENT, "context", None) != self._context:
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
            raise self._bad_handle(
                name, f"funcHandle {func!r} is not a function of a loaded binary"
            )
        s = self._streams.get(stream)
        if s is None:
            raise self._bad_handle(name, f"stream {stream!r} is not a live stream")
        if not launch_fields_fit(
            func, num_blocks, stream, args_addr, args_size, placeholders_addr, placeholder_count
        ) or (cfg is not None and type(cfg) is not LaunchConfig):
            try:  # the checks that word the refusal
                check_num_blocks(name, num_blocks)
                if cfg is not None and not isinstance(cfg, LaunchConfig):
                    raise param_error(
                        name, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}"
                    )
                check_args(name, args_addr, args_size)
                check_placeholder_count(name, placeholder_count)
            except InvalidParamError as exc:
                raise self._noted(exc) from None
        # the caller's args buffer: pinned (read when the kernel runs) or pageable
        view = self._pinned_views.get(args_addr)
        offset = 0
        if view is None or len(view) < args_size:
            # inside the pinned slab looked up last (the scheduler's pooled args buffers):
            # O(1), the same answer as PinnedMemory.find
            last = self._pinned.last_hit
            if last is not None and last.start <= args_addr and args_addr + args_size <= last.end:
                view, offset = last.view, args_addr - last.start
        if view is None or len(view) < args_size + offset:
            offset = 0
            found = self._host_side(args_addr, args_size, "hostArgs", name)
            if found is not None:
                view, offset = found[0].data, found[1]
            else:
                view = None
        if placeholder_count:
            entries = self._placeholders(
                name, args_size, placeholders_addr, placeholder_count, view, args_addr - offset
            )
        else:
            entries = None
        if s.submitted - s.completed >= self.max_queue_depth and s.capture is None:
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
        timeout = None if cfg is None else cfg.kernel_timeout
        if view is None:  # pageable: snapshot now, after patching
            task = (
                KERNEL,
                spec,
                num_blocks,
                ctypes.string_at(args_addr, args_size),
                0,
                args_size,
                region,
                timeout,
            )
        else:  # pinned: read when the kernel executes (at every replay, if captured)
            task = (KERNEL, spec, num_blocks, view, offset, args_size, region, timeout)
        with self._lock:
            if s.destroyed:
                raise self._bad_handle(name, "the stream was destroyed")
            if s.capture is not None:
                s.capture.append(task)
                return
            s.queue.append(task)
            s.submitted += 1
            self._tls.last_task = s.submitted - 1  # the sim's task id: the index on the stream
            self._work_seq += 1
            self._launches += 1
            if self._idle:  # wake the device thread once, not on every submission
                self._idle = False
                # all: a host thread in a synchronize waits on the same condition, and a
                # notify() that woke it instead left the device asleep for WAIT_SLICE_S
                self._cond.notify_all()

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
        try:
            check_table_addr(name, table_addr, count)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
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
        try:
            check_placeholder_entries(name, entries, args_size)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        return entries

    def _pinned_table(self, addr: int, nbytes: int) -> tuple[U8Array, int] | None:
        try:
            return self._pinned.find(addr, nbytes)
        except ValueError:
            return None


def _is_fault_of(exc: RuntimeAPIError, fault: Fault) -> bool:
    return exc.code == fault.code and exc.message == fault.message


def _package_version() -> str:
    try:
        return importlib.metadata.version("aio_ascend")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "unknown"


def open_sim_runtime(
    device_id: int,
    *,
    time_model: bool = False,
    max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    unread_faults: bool = False,
) -> SimRuntime:
    """Open the simulator on ``device_id`` and bind its context to the calling thread.

    :param memory_bytes: device memory the sim offers (``malloc`` fails beyond it)
    :param unread_faults: a failed task is reported only by a stream synchronize (see
        ``DeviceExecutor``)
    """
    runtime = SimRuntime(
        device_id,
        time_model=time_model,
        max_queue_depth=max_queue_depth,
        memory_bytes=memory_bytes,
        unread_faults=unread_faults,
    )
    runtime.set_current_context()
    return runtime
