"""The context-level part of the ``cuda`` backend: driver objects, errors, polling, fences,
memory and close (see :mod:`.runtime` for the backend as a whole)."""

from __future__ import annotations

import bisect
import ctypes
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..._errors import (
    AscendError,
    ClosedError,
    ContextNullError,
    DeviceFaultError,
    InternalError,
    RuntimeAPIError,
    error_class_for_code,
)
from ..abi import ACL_ERROR_RT_CONTEXT_NULL, ACL_STOP_ON_FAILURE
from ..base import PLAIN_FUNCTION, FunctionInfo
from ..emulation import AclEmulation, Fault
from ..staging import DEFAULT_STAGING_BYTES, CaptureStaging, StagingRing
from .errors import CUDA_ERROR_NOT_READY, CUDA_FAULT_CODES, CUDA_SUCCESS, cuda_error
from .kernels import CONTROL_FAULT_OFFSET, CONTROL_RELEASE_OFFSET, CONTROL_SIZE
from .launch import LaunchExtra, apply_patches, placeholder_patches
from .nvrtc import compile_cuda_source

__all__ = [
    "DEFAULT_BLOCK_DIM",
    "CudaBinary",
    "CudaCore",
    "CudaEvent",
    "CudaFunction",
    "CudaGraph",
    "CudaStream",
    "CudaTls",
    "StreamRingOps",
]

CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DISABLE_TIMING = 0x2
CU_MEMHOSTALLOC_PORTABLE = 0x1
CU_MEMHOSTALLOC_DEVICEMAP = 0x2
#: threads per block when ``cfg.block_dim`` is not set
DEFAULT_BLOCK_DIM = 256
#: GIL-releasing sleeps between polls of a synchronize call
POLL_FIRST_S = 20e-6
POLL_MAX_S = 1e-3
#: longest close() waits for queued work before releasing what it uses
CLOSE_DRAIN_S = 2.0


class CudaTls(threading.local):
    """Per-thread state: context binding, the launch ``extra`` array, the latest error text."""

    def __init__(self) -> None:
        self.bound = False
        self.extra = LaunchExtra()
        self.last_error = ""


class CudaStream:
    __slots__ = ("capture", "cu", "failure_mode", "handle", "lock", "ring")

    def __init__(self, handle: int, cu: Any) -> None:
        self.handle = handle
        self.cu = cu
        self.lock = threading.Lock()
        self.ring: StagingRing | None = None
        self.failure_mode = ACL_STOP_ON_FAILURE
        #: while the stream is capturing (:mod:`.graphs`): the capture's own staging memory
        self.capture: CaptureStaging | None = None

    @property
    def capturing(self) -> bool:
        """Whether a stream capture is open on the stream."""
        return self.capture is not None


class CudaEvent:
    __slots__ = ("cu", "handle", "timed")

    def __init__(self, handle: int, cu: Any, timed: bool) -> None:
        self.handle = handle
        self.cu = cu
        self.timed = timed


class CudaFunction:
    __slots__ = ("binary", "cu", "info", "name", "param_size")

    def __init__(
        self,
        cu: Any,
        name: str,
        param_size: int | None,
        binary: int,
        info: FunctionInfo = PLAIN_FUNCTION,
    ) -> None:
        self.cu = cu
        self.name = name
        self.param_size = param_size
        self.binary = binary
        #: the declared parameters of a built-in kernel (checked before its launch)
        self.info = info


class CudaGraph:
    """A captured graph: the CUDA graph, its executable instance, and its staging memory."""

    __slots__ = ("blocks", "exec", "graph", "handle")

    def __init__(self, handle: int, graph: Any, graph_exec: Any, blocks: list[int]) -> None:
        self.handle = handle
        self.graph = graph
        self.exec = graph_exec
        #: device memory of the capture's placeholder staging (freed with the graph)
        self.blocks = blocks


class CudaBinary:
    __slots__ = ("builtin", "functions", "module")

    def __init__(self, module: Any, builtin: bool) -> None:
        self.module = module
        self.builtin = builtin
        self.functions: dict[str, int] = {}


class StreamRingOps:
    """:class:`RingOps` of one stream: device memory and fence events of the runtime."""

    __slots__ = ("runtime", "stream")

    def __init__(self, runtime: CudaCore, stream: CudaStream) -> None:
        self.runtime = runtime
        self.stream = stream

    def alloc(self, nbytes: int) -> int:
        return self.runtime.device_alloc(nbytes, "cuMemAlloc")

    def free(self, address: int) -> None:
        self.runtime.device_free_quietly(address)

    def record(self) -> object:
        return self.runtime.record_fence(self.stream)

    def done(self, fence: object) -> bool:
        return self.runtime.event_done(fence, "cuEventQuery")

    def wait(self, fence: object) -> None:
        runtime = self.runtime
        runtime.poll(lambda: runtime.event_done(fence, "cuEventQuery"), -1, "cuEventQuery")

    def release(self, fence: object) -> None:
        self.runtime.recycle_fence(fence)


class CudaCore(AclEmulation[CudaStream, CudaEvent, CudaGraph, CudaBinary, CudaFunction]):
    """The context-level part of :class:`~.runtime.CudaRuntime`: the driver objects, CUDA
    errors and the sticky fault, polling, fences, memory, and close."""

    def __init__(
        self,
        driver: Any,
        device_id: int,
        device: Any,
        context: Any,
        capability: int,
        *,
        block_dim: int = DEFAULT_BLOCK_DIM,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        compiler: Callable[[str, int], bytes] | None = None,
    ) -> None:
        super().__init__()
        self.device_id = device_id
        #: compute capability as major*10 + minor (e.g. 90 for an H100/H200)
        self.capability = capability
        self.block_dim = block_dim
        self.staging_bytes = staging_bytes
        self._d = driver
        self._device = device
        self._ctx = context
        self._compiler = compiler or compile_cuda_source
        self._tls = CudaTls()
        self._tls.bound = True  # open_cuda_runtime bound the context to this thread
        self._close_lock = threading.Lock()
        self._fault_lock = threading.Lock()
        self._device_memory: dict[int, int] = {}
        self._host_memory: dict[int, int] = {}
        self._host_starts: list[int] = []
        self._host_lock = threading.Lock()
        self._fence_pool: list[object] = []
        self._fences: list[object] = []  # every fence event created (destroyed at close)
        self._graveyard: list[int] = []  # staging memory freed at close (force-destroyed streams)
        self._pid = os.getpid()
        #: errors swallowed by the last close() (it never raises for leftovers)
        self.close_errors: tuple[AscendError, ...] = ()
        # control block: mapped pinned memory the built-in kernels read and write
        self._control = 0
        self._control_device = 0
        err, host = driver.cuMemHostAlloc(
            CONTROL_SIZE, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE
        )
        if int(err):
            raise self._cuda_error(int(err), "cuMemHostAlloc")
        self._control = int(host)
        ctypes.memset(self._control, 0, CONTROL_SIZE)
        err, dptr = driver.cuMemHostGetDevicePointer(self._control, 0)
        if int(err):
            driver.cuMemFreeHost(self._control)
            raise self._cuda_error(int(err), "cuMemHostGetDevicePointer")
        self._control_device = int(dptr)
        # bound methods of the hot paths
        self._cuLaunchKernel = driver.cuLaunchKernel
        self._cuEventRecord = driver.cuEventRecord
        self._cuEventQuery = driver.cuEventQuery
        self._cuStreamQuery = driver.cuStreamQuery
        self._cuMemcpyHtoDAsync = driver.cuMemcpyHtoDAsync

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("faulted" if self._fault else "open")
        return f"<CudaRuntime device={self.device_id} sm_{self.capability} {state}>"

    # --- errors and checks -------------------------------------------------------------

    def _cuda_error(self, code: int, func: str) -> RuntimeAPIError:
        description = ""
        try:
            err, text = self._d.cuGetErrorString(self._d.CUresult(code))
            if not int(err) and text:
                description = text.decode("utf-8", "replace")
        except Exception:
            pass
        return self._noted(cuda_error(code, func, description, self._d))

    def _raise(self, code: int, func: str) -> NoReturn:
        """Raise for a failing driver call (a device fault is noted: sticky from now on)."""
        if code in CUDA_FAULT_CODES:
            raise self._note_fault(code, func)
        raise self._cuda_error(code, func)

    def _note_fault(self, code: int, func: str) -> RuntimeAPIError:
        with self._fault_lock:
            if self._fault is None:
                cuda = self._cuda_error(code, func)
                acl = 0
                if self._control:
                    acl = ctypes.c_uint32.from_address(self._control + CONTROL_FAULT_OFFSET).value
                if acl:
                    cls = error_class_for_code(acl)
                    if not issubclass(cls, DeviceFaultError):
                        cls = DeviceFaultError
                    self._fault = Fault(
                        cls,
                        acl,
                        f"{cuda.message}; the 'fault' kernel raised ACL error {acl} on purpose",
                    )
                else:
                    self._fault = Fault(
                        DeviceFaultError,
                        code,
                        f"{cuda.message} (a kernel faulted; the CUDA context is unusable until "
                        "the runtime is closed)",
                    )
        return self._fault_error(func)

    def _bound(self) -> bool:
        if self._tls.bound:
            return True
        # The primary context is the device's, shared by every runtime of it: a thread where
        # another runtime of this device (or its opener, on another thread) made it current
        # has it bound, as CUDA sees it.
        err, current = self._d.cuCtxGetCurrent()
        if int(err) or int(current) != int(self._ctx):
            return False
        self._tls.bound = True
        return True

    def _context_error(self, func: str) -> AscendError:
        if self._closed:
            return self._noted(ClosedError("the cuda runtime is closed", func=func))
        message = (
            f"no context is bound to thread {threading.current_thread().name!r}: call "
            "set_current_context() first"
        )
        return self._noted(ContextNullError(message, code=ACL_ERROR_RT_CONTEXT_NULL, func=func))

    # --- what the owned parts (the capture) use ------------------------------------------

    @property
    def driver(self) -> Any:
        """The ``cuda.bindings.driver`` module (or the tests' fake) this runtime calls."""
        return self._d

    def fail(self, code: int, func: str) -> NoReturn:
        """Raise for the failing driver call ``func`` (a fault is noted: sticky from now on)."""
        self._raise(code, func)

    def refusal(self, func: str, message: str) -> RuntimeAPIError:
        """The 107000 refusal of ``func`` (remembered as the thread's latest error)."""
        return self._param(func, message)

    def launch_image(
        self,
        f: CudaFunction,
        num_blocks: int,
        block: int,
        s: CudaStream,
        region: int,
        args_addr: int,
        args_size: int,
        param_size: int,
        entries: list[tuple[int, int]],
    ) -> None:
        """A launch with placeholders whose image goes to device memory at ``region``: each
        slot of the caller's buffer gets its data's address there, the image is copied there
        (``cuMemcpyHtoDAsync``), then the kernel is launched with the patched parameters."""
        apply_patches(args_addr, placeholder_patches(entries, region))
        (err,) = self._cuMemcpyHtoDAsync(region, args_addr, args_size, s.cu)
        if int(err):
            self._raise(int(err), "cuMemcpyHtoDAsync")
        extra = self._tls.extra.set(args_addr, param_size) if param_size else 0
        (err,) = self._cuLaunchKernel(f.cu, num_blocks, 1, 1, block, 1, 1, 0, s.cu, None, extra)
        if int(err):
            self._raise(int(err), "cuLaunchKernel")

    def poll(self, done: Callable[[], bool], timeout_ms: int, func: str) -> bool:
        """Poll ``done`` with GIL-releasing sleeps (backoff) until true or ``timeout_ms`` passed."""
        if done():
            return True
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        delay = POLL_FIRST_S
        sleep = time.sleep
        while True:
            if self._closed:
                raise ClosedError("the cuda runtime was closed during the wait", func=func)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sleep(min(delay, left))
            else:
                sleep(delay)
            if done():
                return True
            delay = min(delay * 2, POLL_MAX_S)

    def event_done(self, fence: object, func: str) -> bool:
        (err,) = self._cuEventQuery(fence)
        code = int(err)
        if code == CUDA_SUCCESS:
            return True
        if code == CUDA_ERROR_NOT_READY:
            return False
        self._raise(code, func)

    # --- context and lifecycle ---------------------------------------------------------

    @property
    def context(self) -> int:
        """The primary context's handle (``CUcontext`` as an int)."""
        return int(self._ctx)

    def release_thread(self) -> None:
        """See the protocol: nothing (CUDA's current primary context is no reference; its
        release is the close's ``cuDevicePrimaryCtxRelease``)."""

    def set_current_context(self, context: int | None = None) -> None:
        """``cuCtxSetCurrent``: bind the device's primary context to the calling thread, or
        ``context`` (a handle :meth:`get_current_context` returned; works after close too)."""
        func = "cuCtxSetCurrent"
        if context is not None and (context != int(self._ctx) or self._closed):
            # another's context (the primary context is shared: it may be this one's number)
            make = getattr(self._d, "CUcontext", None)
            (err,) = self._d.cuCtxSetCurrent(context if make is None else make(context))
            if int(err):
                self._raise(int(err), func)
            self._tls.bound = False
            return
        if self._closed:
            raise ClosedError("the cuda runtime is closed", func=func)
        (err,) = self._d.cuCtxSetCurrent(self._ctx)
        if int(err):
            self._raise(int(err), func)
        self._tls.bound = True

    def fault_site(self) -> tuple[int, int] | None:
        """See the protocol."""
        return None  # CUDA reports a sticky error per context, not which kernel raised it

    def last_task_id(self) -> int | None:
        """See the protocol: CUDA does not number tasks."""
        return None

    def get_current_context(self) -> int | None:
        """``cuCtxGetCurrent``: the calling thread's current context (``None``: none)."""
        err, current = self._d.cuCtxGetCurrent()
        if int(err):
            self._raise(int(err), "cuCtxGetCurrent")
        return int(current) or None

    def release_hangs(self) -> None:
        """Make every built-in ``hang`` kernel of this runtime return (now and from now on)."""
        if self._control:
            ctypes.c_uint32.from_address(self._control + CONTROL_RELEASE_OFFSET).value = 1

    def close(self) -> None:
        """Release everything, reset the primary context if a kernel faulted. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._pid:  # a forked child must not touch the parent's CUDA state
            return
        d = self._d
        errors: list[AscendError] = []

        def attempt(func: str, *args: object) -> Any:
            try:
                result = getattr(d, func)(*args)
            except Exception as exc:  # the bindings' own exceptions
                errors.append(InternalError(f"{func}: {exc!r}", func=func))
                return None
            code = int(result[0])
            if code and code not in CUDA_FAULT_CODES:
                errors.append(cuda_error(code, func, driver=d))
            return result

        self.release_hangs()
        pushed_result = attempt("cuCtxPushCurrent", self._ctx)
        pushed = pushed_result is not None and int(pushed_result[0]) == 0
        self._close_graphs(attempt)
        if pushed and self._fault is None:
            self._drain_for_close(CLOSE_DRAIN_S)
        for s in list(self._streams.values()):
            attempt("cuStreamDestroy", s.cu)
            if s.ring is not None:
                raw = s.ring.close(free=False)
                if raw:
                    self._graveyard.append(raw)
        for ev in list(self._events.values()):
            attempt("cuEventDestroy", ev.cu)
        for fence in self._fences:
            attempt("cuEventDestroy", fence)
        for binary in list(self._binaries.values()):
            attempt("cuModuleUnload", binary.module)
        for ptr in [*self._device_memory, *self._graveyard]:
            attempt("cuMemFree", ptr)
        for ptr in list(self._host_memory):
            attempt("cuMemFreeHost", ptr)
        if self._control:
            attempt("cuMemFreeHost", self._control)
        self._streams.clear()
        self._events.clear()
        self._fences.clear()
        self._fence_pool.clear()
        self._binaries.clear()
        self._functions.clear()
        self._device_memory.clear()
        self._graveyard.clear()
        self._host_memory.clear()
        self._host_starts.clear()
        self._control = 0
        if pushed:
            attempt("cuCtxPopCurrent")
        attempt("cuDevicePrimaryCtxRelease", self._device)
        if self._fault is not None:
            # The context is unusable after a fault: destroy it, so the next open gets a new one.
            attempt("cuDevicePrimaryCtxReset", self._device)
        self.close_errors = tuple(errors)

    def _close_graphs(self, attempt: Callable[..., Any]) -> None:
        """Close's hook for the capture (:mod:`.graphs`, owned by the runtime): end open
        captures, destroy the graphs, and leave their staging memory in ``_graveyard``
        (``attempt(func, *args)`` calls the driver, collecting errors)."""

    def _drain_for_close(self, seconds: float) -> None:
        """Give queued work (released ``hang`` kernels included) a bounded time to finish, so
        nothing still runs in modules and memory that close is about to release."""
        deadline = time.monotonic() + seconds
        for s in list(self._streams.values()):
            while time.monotonic() < deadline:
                try:
                    (err,) = self._cuStreamQuery(s.cu)
                except Exception:
                    break
                if int(err) != CUDA_ERROR_NOT_READY:
                    break
                time.sleep(POLL_MAX_S)

    # --- fences (staging rings) --------------------------------------------------------

    def record_fence(self, s: CudaStream) -> object:
        try:
            fence = self._fence_pool.pop()
        except IndexError:
            err, fence = self._d.cuEventCreate(CU_EVENT_DISABLE_TIMING)
            if int(err):
                self._raise(int(err), "cuEventCreate")
            self._fences.append(fence)
        (err,) = self._cuEventRecord(fence, s.cu)
        if int(err):
            self._fence_pool.append(fence)
            self._raise(int(err), "cuEventRecord")
        return fence

    def recycle_fence(self, fence: object) -> None:
        """A fence event no longer needed by a ring: reused by the next :meth:`record_fence`."""
        self._fence_pool.append(fence)

    # --- memory ------------------------------------------------------------------------

    def device_alloc(self, size: int, func: str) -> int:
        err, ptr = self._d.cuMemAlloc(size)
        if int(err):
            self._raise(int(err), func)
        return int(ptr)

    def device_free_quietly(self, ptr: int) -> None:
        try:
            self._d.cuMemFree(ptr)
        except Exception:
            pass

    def _device_malloc(self, size: int, func: str) -> int:
        # at least 256-byte aligned; after a fault CUDA refuses: the fault is raised
        ptr = self.device_alloc(size, func)
        self._device_memory[ptr] = size
        return ptr

    def _device_free(self, ptr: int, func: str) -> bool:
        # at once (CUDA may wait for the device to be idle inside the call)
        if self._device_memory.pop(ptr, None) is None:
            return False
        (err,) = self._d.cuMemFree(ptr)
        if int(err) and self._fault is None:
            self._raise(int(err), func)
        return True

    def _device_malloc_host(self, size: int, func: str) -> int:
        # pinned (page-locked) host memory, page aligned
        err, ptr = self._d.cuMemHostAlloc(size, CU_MEMHOSTALLOC_PORTABLE)
        if int(err):
            self._raise(int(err), func)
        address = int(ptr)
        with self._host_lock:
            self._host_memory[address] = size
            bisect.insort(self._host_starts, address)
        return address

    def _device_free_host(self, ptr: int, func: str) -> bool:
        with self._host_lock:
            if self._host_memory.pop(ptr, None) is None:
                return False
            index = bisect.bisect_left(self._host_starts, ptr)
            del self._host_starts[index]
        (err,) = self._d.cuMemFreeHost(ptr)
        if int(err) and self._fault is None:
            self._raise(int(err), func)
        return True

    def is_pinned(self, addr: int, count: int) -> bool:
        """Whether ``[addr, addr + count)`` lies in one allocation of :meth:`malloc_host`."""
        starts = self._host_starts
        index = bisect.bisect_right(starts, addr) - 1
        if index < 0:
            return False
        try:
            start = starts[index]
            size = self._host_memory[start]
        except (IndexError, KeyError):  # freed concurrently
            return False
        return addr + count <= start + size
