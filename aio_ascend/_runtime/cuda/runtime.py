"""The ``cuda`` backend: the :class:`~aio_ascend._runtime.Runtime` seam over an NVIDIA GPU.

It drives the device through ``cuda.bindings.driver`` (the ``cuda-bindings`` package, the
``cuda`` extra of aio_ascend), imported only when a runtime is opened or probed, so this module
imports, type-checks and tests without it. The ACL calls map onto the CUDA driver API:

- context per thread: the device's primary context, bound with ``cuCtxSetCurrent``
- streams: ``cuStreamCreate(CU_STREAM_NON_BLOCKING)``, or ``cuStreamCreateWithPriority`` with
  the same flag for a priority (checked against ``cuCtxGetStreamPriorityRange`` first, since
  CUDA would clamp it silently)
- Ex events: ``cuEventCreate`` (``CU_EVENT_DISABLE_TIMING`` unless ``ACL_EVENT_TIME_LINE``);
  ``cuEventQuery`` answers ``CUDA_ERROR_NOT_READY`` -> NOT_READY
- synchronize with a timeout: polling ``cuEventQuery``/``cuStreamQuery`` with short
  GIL-releasing sleeps (backoff 20 us .. 1 ms) up to the timeout
- memory: ``cuMemAlloc``/``cuMemFree``, pinned ``cuMemHostAlloc``/``cuMemFreeHost``,
  ``cuMemcpy{HtoD,DtoH,DtoD}Async``, ``cuMemsetD8Async`` (a range outside an allocation is
  refused at the call with CUDA_ERROR_INVALID_VALUE, not a fault when it runs)
- ``info()``: ``cuDriverGetVersion``, ``cuMemGetInfo``, ``cuCtxGetStreamPriorityRange``,
  ``cuDeviceGetName``, ``cuDeviceGetAttribute`` (compute capability)
- kernel binaries: ``cuModuleLoadData`` (PTX, cubin, fatbin, or a ``.cu`` file compiled with
  NVRTC); ``load_binary(None)``: the built-ins of :mod:`.kernels`, compiled with NVRTC
  for the device
- ``aclrtLaunchKernelWithHostArgs``: ``cuLaunchKernel`` with the host args buffer as the
  parameter buffer (``extra``: BUFFER_POINTER, BUFFER_SIZE, END); grid x = ``numBlocks``,
  block x = ``cfg.block_dim`` (default 256)
- placeholders: the args image is copied (``cuMemcpyHtoDAsync``) into a per-stream device
  staging ring, and each slot of the caller's buffer gets the device address of its data,
  written as a uint64 before the launch

Errors: a failing driver call raises the typed error for the CUDA error number (``.code`` is the
CUDA number, the message names it: ``CUDA_ERROR_ILLEGAL_ADDRESS (700): ...``). Kernel faults
(illegal address, trap, misaligned access, ...) raise :class:`DeviceFaultError` and are sticky,
as a CUDA context is unusable after one; closing the runtime resets the primary context so the
next open works. Two exceptions keep the protocol's contract: argument checks made here, before
CUDA sees anything, raise the ACL codes the contract names (107000 with the field's ACL name,
107002, 107017, 107042, 507046, 507047), and the built-in ``fault`` kernel reports the ACL code
it was asked for (the message still names the CUDA error).

Limits, because CUDA has no way to do better: ``destroy_stream_force`` cannot discard work that
is queued or running, so it releases every built-in ``hang`` kernel of this runtime (they spin on
a host flag) and destroys the stream, whose remaining work still runs; the stream failure mode is
stored but a fault always halts the context (as stop-on-failure does); after a fault, calls
that need the context (``malloc`` included) raise the fault, while cleanup calls succeed.

Modules: :mod:`.core` (context, errors, polling, fences, memory, close), this module (streams,
events, kernels, launches, ``open_cuda_runtime``), :mod:`.graphs` (stream capture and graph
replay), :mod:`.errors`, :mod:`.launch` (the ``extra`` array and placeholder patches),
:mod:`.staging` (the fenced ring, a capture's staging), :mod:`.nvrtc`, :mod:`.driver` (lazy
import and probe), :mod:`.kernels` (the built-in kernels' source).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any, ClassVar

from ..._errors import (
    BackendUnavailableError,
    DeviceFaultError,
    EventSyncTimeoutError,
    InternalError,
    InvalidParamError,
    StreamSyncTimeoutError,
)
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    ACL_ERROR_RT_SYMBOL_NOT_FOUND,
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    PTR_MAX,
    SIZE_MAX,
    binary_bytes,
    check_args,
    check_device_id,
    check_num_blocks,
    check_placeholder_table,
)
from ..base import PLAIN_FUNCTION
from ..staging import DEFAULT_STAGING_BYTES, MAX_STAGING_ALIGN, StagingRing, staging_alignment
from .core import (
    CU_EVENT_DISABLE_TIMING,
    CU_STREAM_NON_BLOCKING,
    DEFAULT_BLOCK_DIM,
    CudaBinary,
    CudaCore,
    CudaEvent,
    CudaFunction,
    CudaGraph,
    CudaStream,
    StreamRingOps,
)
from .driver import (
    cuda_version_string,
    device_count,
    device_name_string,
    initialized_driver,
    probe,
)
from .errors import (
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS,
    cuda_error,
)
from .graphs import CudaCapture
from .kernels import BUILTIN_INFO, BUILTIN_NAMES, CONTROL_SYMBOL, KERNEL_SOURCE, PARAM_SIZES
from .nvrtc import compile_cuda_source

__all__ = [
    "DEFAULT_BLOCK_DIM",
    "DEFAULT_STAGING_BYTES",
    "CudaRuntime",
    "compile_cuda_source",
    "cuda_version_string",
    "device_count",
    "device_name_string",
    "open_cuda_runtime",
    "probe",
]

_LAUNCH = "cuLaunchKernel"


class CudaRuntime(CudaCore):
    """One NVIDIA GPU through ``cuda.bindings.driver``. Create with :func:`open_cuda_runtime`."""

    name = "cuda"
    #: one host parameter buffer per launch (``cuLaunchKernel`` with ``CU_LAUNCH_PARAM_BUFFER``)
    launch_path = "param_buffer"
    #: CUDA documents no limit; its launch queue blocks the host at about a thousand pending
    #: launches per stream, so the scheduler stays below that
    stream_capacity = 1024
    ordered_task_ids = False  # no task ids at all

    #: the CUDA function each call of the seam maps to (what its errors name)
    CALLS: ClassVar[dict[str, str]] = {
        "stream_priority_range": "cuCtxGetStreamPriorityRange",
        "create_stream": "cuStreamCreate",
        "stream_priority": "cuStreamCreateWithPriority",
        "destroy_stream": "cuStreamDestroy",
        "destroy_stream_force": "cuStreamDestroy",
        "set_stream_failure_mode": "cuStreamSetFailureMode",
        "synchronize_stream": "cuStreamSynchronize",
        "create_event": "cuEventCreate",
        "destroy_event": "cuEventDestroy",
        "record_event": "cuEventRecord",
        "query_event_status": "cuEventQuery",
        "synchronize_event": "cuEventSynchronize",
        "stream_wait_event": "cuStreamWaitEvent",
        "event_elapsed_time": "cuEventElapsedTime",
        "malloc": "cuMemAlloc",
        "malloc_host": "cuMemHostAlloc",
        "free": "cuMemFree",
        "free_host": "cuMemFreeHost",
        "memcpy_async": "cuMemcpyAsync",
        "load_binary": "cuModuleLoadData",
        "unload_binary": "cuModuleUnload",
        "get_function": "cuModuleGetFunction",
        "begin_capture": "cuStreamBeginCapture",
        "end_capture": "cuStreamEndCapture",
        "launch_graph": "cuGraphLaunch",
        "destroy_graph": "cuGraphExecDestroy",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: stream capture and graph replay (:mod:`.graphs`)
        self.capture = CudaCapture(self)

    # --- streams -----------------------------------------------------------------------

    def _device_priority_range(self, func: str) -> tuple[int, int]:
        # (least, greatest), e.g. (0, -5); CUDA would clamp a priority outside it silently,
        # so create_stream refuses one first
        err, least, greatest = self._d.cuCtxGetStreamPriorityRange()
        if int(err):
            self._raise(int(err), func)
        return int(least), int(greatest)

    def _device_create_stream(self, priority: int | None, func: str) -> CudaStream:
        if priority is None:
            err, cu = self._d.cuStreamCreate(CU_STREAM_NON_BLOCKING)
        else:
            err, cu = self._d.cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING, priority)
        if int(err):
            self._raise(int(err), func)
        s = CudaStream(int(cu), cu)
        self._streams[s.handle] = s
        return s

    def _stream_idle(self, s: CudaStream, func: str) -> bool:
        (err,) = self._cuStreamQuery(s.cu)
        code = int(err)
        if code == CUDA_SUCCESS:
            return True
        if code == CUDA_ERROR_NOT_READY:
            return False
        self._raise(code, func)

    def _device_destroy_stream(self, s: CudaStream, force: bool, func: str) -> None:
        # CUDA cannot discard queued or running work: a forced destroy releases every built-in
        # ``hang`` kernel of this runtime so the stream can drain, and frees its staging memory
        # only at close
        self.capture.abort(s)
        if force:
            self.release_hangs()
        elif self._fault is None:
            try:
                self.poll(lambda: self._stream_idle(s, func), -1, func)
            except DeviceFaultError:
                pass  # faulted while waiting: destroy without waiting
        self._streams.pop(s.handle, None)
        self._release_stream(s, free_ring=not force)

    def _release_stream(self, s: CudaStream, *, free_ring: bool) -> None:
        (err,) = self._d.cuStreamDestroy(s.cu)
        ring = s.ring
        s.ring = None
        if ring is not None:
            raw = ring.close(free=free_ring and self._fault is None)
            if raw:
                self._graveyard.append(raw)
        code = int(err)
        if code and self._fault is None:
            self._raise(code, "cuStreamDestroy")

    def _device_sync_stream(self, s: CudaStream, timeout_ms: int, func: str) -> None:
        if not self.poll(lambda: self._stream_idle(s, func), timeout_ms, func):
            message = f"stream not idle after {timeout_ms} ms"
            raise self._noted(
                StreamSyncTimeoutError(message, code=ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, func=func)
            )

    # --- events ------------------------------------------------------------------------

    def _device_create_event(self, timed: bool, func: str) -> CudaEvent:
        # timing only for ACL_EVENT_TIME_LINE; a never-recorded CUDA event queries as complete,
        # as an Ex event does
        err, cu = self._d.cuEventCreate(0 if timed else CU_EVENT_DISABLE_TIMING)
        if int(err):
            self._raise(int(err), func)
        return CudaEvent(int(cu), cu, timed)

    def _device_destroy_event(self, ev: CudaEvent, func: str) -> None:
        (err,) = self._d.cuEventDestroy(ev.cu)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

    def _device_record(self, ev: CudaEvent, s: CudaStream, func: str) -> None:
        (err,) = self._cuEventRecord(ev.cu, s.cu)
        if int(err):
            self._raise(int(err), func)

    def _device_query(self, ev: CudaEvent, func: str) -> int:
        (err,) = self._cuEventQuery(ev.cu)
        code = int(err)
        if code == CUDA_SUCCESS:
            return ACL_EVENT_RECORDED_STATUS_COMPLETE
        if code == CUDA_ERROR_NOT_READY:
            return ACL_EVENT_RECORDED_STATUS_NOT_READY
        self._raise(code, func)

    def _device_sync_event(self, ev: CudaEvent, timeout_ms: int, func: str) -> None:
        # polls cuEventQuery with short GIL-releasing sleeps until done or the timeout
        if not self.poll(lambda: self.event_done(ev.cu, func), timeout_ms, func):
            message = f"event not complete after {timeout_ms} ms"
            raise self._noted(
                EventSyncTimeoutError(message, code=ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, func=func)
            )

    def _device_wait_event(self, s: CudaStream, ev: CudaEvent, func: str) -> None:
        (err,) = self._d.cuStreamWaitEvent(s.cu, ev.cu, 0)
        if int(err):
            self._raise(int(err), func)

    def _device_elapsed(self, start: CudaEvent, end: CudaEvent, func: str) -> float:
        err, ms = self._d.cuEventElapsedTime(start.cu, end.cu)
        code = int(err)
        if code in (CUDA_ERROR_NOT_READY, CUDA_ERROR_INVALID_HANDLE):
            # not complete yet, or never recorded
            exc = self._cuda_error(code, func)
            raise InvalidParamError(
                f"{exc.message} (both events must be recorded and complete)", code=code, func=func
            )
        if code:
            self._raise(code, func)
        return float(ms)

    def _device_memcpy(
        self, s: CudaStream, dst: int, src: int, count: int, kind: int, func: str
    ) -> None:
        # a host side outside malloc_host memory is pageable: the call then waits until the
        # stream has performed the copy
        self.capture.check_copy(s, dst, src, count, kind, func)
        host: int | None
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            host, name = src, "cuMemcpyHtoDAsync"
            (err,) = self._cuMemcpyHtoDAsync(dst, src, count, s.cu)
        elif kind == ACL_MEMCPY_DEVICE_TO_HOST:
            host, name = dst, "cuMemcpyDtoHAsync"
            (err,) = self._d.cuMemcpyDtoHAsync(dst, src, count, s.cu)
        elif kind == ACL_MEMCPY_DEVICE_TO_DEVICE:
            host, name = None, "cuMemcpyDtoDAsync"
            (err,) = self._d.cuMemcpyDtoDAsync(dst, src, count, s.cu)
        else:
            raise self._param(
                func,
                f"kind={kind!r}: expected 1 (host to device), 2 (device to host) or 3 "
                "(device to device)",
            )
        if int(err):
            self._raise(int(err), name)
        if host is not None and count and not self.is_pinned(host, count):
            # pageable: done when the call returns (the stream has reached and run the copy)
            self.poll(lambda: self._stream_idle(s, func), -1, func)

    def memset_async(self, ptr: int, dst_max: int, value: int, count: int, stream: int) -> None:
        """``cuMemsetD8Async``. A range outside a live allocation is refused by CUDA at the call
        (``CUDA_ERROR_INVALID_VALUE``: :class:`InvalidParamError` with the CUDA code) rather
        than faulting when the task runs."""
        func = "cuMemsetD8Async"
        self._enter_live(func)
        s = self._stream(stream, func)
        for label, size in (("dst_max (destMax)", dst_max), ("count", count)):
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= SIZE_MAX:
                raise self._param(func, f"{label}={size!r}: expected an int in 0..{SIZE_MAX}")
        if count > dst_max:
            raise self._param(func, f"count={count} is larger than destMax={dst_max}")
        if isinstance(ptr, bool) or not isinstance(ptr, int) or not 0 < ptr <= PTR_MAX:
            raise self._param(func, f"ptr (devPtr)={ptr!r} is a NULL or invalid pointer")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise self._param(func, f"value={value!r}: expected a byte value in 0..255")
        (err,) = self._d.cuMemsetD8Async(ptr, value, count, s.cu)
        if int(err):
            self._raise(int(err), func)

    def info(self) -> dict[str, object]:
        """``runtime_version`` (the CUDA version the driver supports, ``cuDriverGetVersion``,
        e.g. ``"12.4"``), ``memory_free``/``memory_total`` (``cuMemGetInfo``), the stream
        priority range, ``device_name`` (``cuDeviceGetName``) and ``compute_capability``
        (``"major.minor"``)."""
        func = "cuMemGetInfo"
        self._enter(func)
        d = self._d

        def check(result: Any, name: str) -> Any:
            code = int(result[0])
            if code:
                self._raise(code, name)
            return result[1] if len(result) == 2 else result[1:]

        version = int(check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
        free, total = check(d.cuMemGetInfo(), func)
        least, greatest = self.stream_priority_range()
        raw_name = check(d.cuDeviceGetName(256, self._device), "cuDeviceGetName")
        attr = d.CUdevice_attribute
        major, minor = (
            int(check(d.cuDeviceGetAttribute(which, self._device), "cuDeviceGetAttribute"))
            for which in (
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )
        )
        return {
            "runtime_version": cuda_version_string(version),
            "memory_free": int(free),
            "memory_total": int(total),
            "stream_priority_least": least,
            "stream_priority_greatest": greatest,
            "device_name": device_name_string(raw_name),
            "compute_capability": f"{major}.{minor}",
        }

    # --- kernels -----------------------------------------------------------------------

    def _device_load(self, source: object, func: str) -> tuple[int, CudaBinary]:
        # None (the built-in kernels, compiled with NVRTC), a path (.cu source is compiled with
        # NVRTC; .ptx, .cubin, .fatbin are loaded), or the bytes of a PTX, cubin or fatbin image
        builtin = source is None
        if source is None:
            image = self._compiler(KERNEL_SOURCE, self.capability)
        elif (data := binary_bytes(source)) is not None:
            image = data  # (not empty, and a path names a file: check_binary_source)
        elif isinstance(source, str | os.PathLike):
            path = os.path.abspath(os.fspath(source))
            with open(path, "rb") as fh:
                image = fh.read()
            if path.endswith(".cu"):
                image = self._compiler(image.decode("utf-8"), self.capability)
        else:
            raise TypeError(
                "the cuda backend loads a path (.cu, .ptx, .cubin, .fatbin), the bytes of a PTX, "
                f"cubin or fatbin image, or None for the built-in kernels; got "
                f"{type(source).__name__}"
            )
        if _looks_like_ptx(image) and not image.endswith(b"\0"):
            image += b"\0"  # PTX text must be NUL-terminated
        err, module = self._d.cuModuleLoadData(image)
        if int(err):
            self._raise(int(err), func)
        handle = int(module)
        binary = CudaBinary(module, builtin)
        if builtin:
            try:
                self._install_control(module)
            except BaseException:
                self._d.cuModuleUnload(module)
                raise
        return handle, binary

    def _install_control(self, module: Any) -> None:
        func = "cuModuleGetGlobal"
        err, dptr, nbytes = self._d.cuModuleGetGlobal(module, CONTROL_SYMBOL.encode())
        if int(err):
            self._raise(int(err), func)
        if int(nbytes) != 8:
            raise InternalError(f"{CONTROL_SYMBOL} is {nbytes} bytes, expected 8", func=func)
        value = ctypes.c_uint64(self._control_device)
        (err,) = self._d.cuMemcpyHtoD(dptr, ctypes.addressof(value), 8)
        if int(err):
            self._raise(int(err), "cuMemcpyHtoD")

    def _device_unload(self, b: CudaBinary, func: str) -> None:
        (err,) = self._d.cuModuleUnload(b.module)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

    def _device_get_function(
        self, binary: int, b: CudaBinary, name: str, encoded: bytes, func: str
    ) -> tuple[int, CudaFunction]:
        err, cu = self._d.cuModuleGetFunction(b.module, encoded)
        code = int(err)
        if code == CUDA_ERROR_NOT_FOUND:
            message = f"kernel {name!r} not found in the module (CUDA_ERROR_NOT_FOUND)"
            if b.builtin:
                message += f"; the built-in kernels are {sorted(BUILTIN_NAMES)}"
            raise self._error(ACL_ERROR_RT_SYMBOL_NOT_FOUND, func, message)
        if code:
            self._raise(code, func)
        builtin = b.builtin and name in PARAM_SIZES
        param_size = PARAM_SIZES[name] if builtin else None
        if param_size is None:
            param_size = self._param_size(cu)
        info = BUILTIN_INFO[name] if builtin else PLAIN_FUNCTION
        return int(cu), CudaFunction(cu, name, param_size, binary, info)

    def _param_size(self, cu: Any) -> int | None:
        """End of the last parameter (``cuFuncGetParamInfo``, CUDA 12.4+), or None if unknown."""
        getter = getattr(self._d, "cuFuncGetParamInfo", None)
        if getter is None:
            return None
        end = 0
        for index in range(4096):
            try:
                err, offset, size = getter(cu, index)
            except Exception:  # the driver predates the call
                return None
            code = int(err)
            if code == CUDA_ERROR_INVALID_VALUE:
                return end  # past the last parameter
            if code:
                return None
            end = max(end, int(offset) + int(size))
        return end

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
        """``cuLaunchKernel`` with the host args buffer as the parameter buffer (``extra``).

        Grid x = ``num_blocks``, block x = ``cfg.block_dim`` or the runtime's ``block_dim``; the
        other ``LaunchConfig`` fields are ACL attributes without a CUDA meaning and are ignored.
        With placeholders, the args image is first copied to the stream's staging ring and each
        slot of the caller's buffer is patched with the device address of its data.
        """
        name = _LAUNCH
        tls = self._tls
        if self._closed or not tls.bound or self._fault is not None:
            self._enter_live(name)
        f = self._functions.get(func)
        if f is None:
            raise self._bad_handle(
                name, f"funcHandle {func!r} is not a function of a loaded module"
            )
        s = self._streams.get(stream)
        if s is None:
            raise self._bad_handle(name, f"stream {stream!r} is not a live stream")
        try:
            check_num_blocks(name, num_blocks)
            check_args(name, args_addr, args_size)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        block = self.block_dim
        if cfg is not None:
            if not isinstance(cfg, LaunchConfig):
                raise self._param(
                    name, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}"
                )
            if cfg.block_dim is not None:
                block = cfg.block_dim
        param_size = f.param_size
        if param_size is None:
            param_size = args_size
        elif args_size < param_size:
            raise self._param(
                name,
                f"argsSize={args_size} is smaller than the {param_size} bytes of parameters of "
                f"kernel {f.name!r}",
            )
        try:
            entries = check_placeholder_table(name, placeholders_addr, placeholder_count, args_size)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        if entries:  # a capture stages in memory of its own: ring slots get reused
            stage = self.capture.launch if s.capture is not None else self._launch_staged
            stage(f, num_blocks, block, s, args_addr, args_size, param_size, entries)
            return
        extra = tls.extra.set(args_addr, param_size) if param_size else 0
        (err,) = self._cuLaunchKernel(f.cu, num_blocks, 1, 1, block, 1, 1, 0, s.cu, None, extra)
        if int(err):
            self._raise(int(err), name)

    def _launch_staged(
        self,
        f: CudaFunction,
        num_blocks: int,
        block: int,
        s: CudaStream,
        args_addr: int,
        args_size: int,
        param_size: int,
        entries: list[tuple[int, int]],
    ) -> None:
        with s.lock:
            ring = s.ring
            if ring is None:
                ring = s.ring = StagingRing(StreamRingOps(self, s), self.staging_bytes)
            region = ring.allocate(args_size, staging_alignment(entries))
            try:
                self.launch_image(
                    f, num_blocks, block, s, region, args_addr, args_size, param_size, entries
                )
            finally:
                ring.committed(args_size)

    # --- graphs: the device part is the capture's ---------------------------------------

    def _device_begin_capture(self, s: CudaStream, func: str) -> None:
        self.capture.begin(s, func)

    def _device_end_capture(self, s: CudaStream, func: str) -> CudaGraph:
        return self.capture.end(s, func)

    def _device_launch_graph(self, g: CudaGraph, s: CudaStream, func: str) -> None:
        self.capture.replay(g, s, func)

    def _device_destroy_graph(self, g: CudaGraph, func: str) -> None:
        self.capture.destroy(g, func, faulted=self._fault is not None)

    def _close_graphs(self, attempt: Callable[..., Any]) -> None:
        graphs = list(self._graphs.values())
        self._graphs.clear()
        self.capture.close(attempt, list(self._streams.values()), graphs, self._graveyard)

    def staging_stats(self, stream: int) -> dict[str, int]:
        """Counters of a stream's staging ring (zeros before its first placeholder launch)."""
        s = self._stream(stream, "staging_stats")
        ring = s.ring
        if ring is None:
            return {"allocations": 0, "fences": 0, "waits": 0, "grows": 0, "capacity": 0}
        return {**ring.stats, "capacity": ring.capacity}


_ELF_MAGIC = b"\x7fELF"
_FATBIN_MAGIC = b"\x50\xed\x55\xba"


def _looks_like_ptx(image: bytes) -> bool:
    """Neither a cubin (ELF) nor a fatbin: PTX text."""
    return not image.startswith((_ELF_MAGIC, _FATBIN_MAGIC))


def check_cuda_options(
    *,
    block_dim: object = DEFAULT_BLOCK_DIM,
    staging_bytes: object = DEFAULT_STAGING_BYTES,
    **_: object,
) -> None:
    """The values of the cuda backend's numeric options (``open_device`` checks them in its
    call too; ``driver`` and ``compiler`` are used as given)."""
    if isinstance(block_dim, bool) or not isinstance(block_dim, int) or not 1 <= block_dim <= 1024:
        raise ValueError(f"block_dim={block_dim!r} must be an int in 1..1024")
    if (
        isinstance(staging_bytes, bool)
        or not isinstance(staging_bytes, int)
        or staging_bytes < MAX_STAGING_ALIGN
    ):
        raise ValueError(f"staging_bytes={staging_bytes!r} must be an int >= {MAX_STAGING_ALIGN}")


def open_cuda_runtime(
    device_id: int,
    *,
    block_dim: int = DEFAULT_BLOCK_DIM,
    staging_bytes: int = DEFAULT_STAGING_BYTES,
    driver: Any = None,
    compiler: Callable[[str, int], bytes] | None = None,
) -> CudaRuntime:
    """Open CUDA device ``device_id`` and bind its primary context to the calling thread.

    ``cuInit``, ``cuDeviceGet``, ``cuDevicePrimaryCtxRetain``, ``cuCtxSetCurrent``. Sharing the
    primary context means device pointers from PyTorch, CuPy or JAX on the same device can be
    passed to kernels.

    :param block_dim: threads per block when a launch's ``LaunchConfig.block_dim`` is unset
    :param staging_bytes: initial size of each stream's placeholder staging ring
    :param driver: an object with the ``cuda.bindings.driver`` API (tests pass a fake)
    :param compiler: ``(cuda_source, capability) -> image`` (default: NVRTC)
    :raises BackendUnavailableError: cuda-bindings or the NVIDIA driver is missing, or no device
    """
    check_device_id(device_id)
    check_cuda_options(block_dim=block_dim, staging_bytes=staging_bytes)
    driver = initialized_driver(driver)
    err, count = driver.cuDeviceGetCount()
    if int(err) or count <= 0:
        raise BackendUnavailableError("no CUDA device is visible", func="cuDeviceGetCount")
    if device_id >= count:
        raise InvalidParamError(
            f"device_id={device_id}: only {count} CUDA device(s)",
            code=CUDA_ERROR_INVALID_DEVICE,
            func="cuDeviceGet",
        )

    def check(result: Any, func: str) -> Any:
        code = int(result[0])
        if code:
            raise cuda_error(code, func, driver=driver)
        return result[1] if len(result) == 2 else result[1:]

    device = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    major = int(
        check(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute",
        )
    )
    minor = int(
        check(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute",
        )
    )
    context = check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    try:
        check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        runtime = CudaRuntime(
            driver,
            device_id,
            device,
            context,
            major * 10 + minor,
            block_dim=block_dim,
            staging_bytes=staging_bytes,
            compiler=compiler,
        )
        return runtime
    except BaseException:
        driver.cuDevicePrimaryCtxRelease(device)
        raise
