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
from typing import Any

from ..._errors import (
    BackendUnavailableError,
    DeviceFaultError,
    EventSyncTimeoutError,
    InternalError,
    InvalidParamError,
    RuntimeAPIError,
    StreamSyncTimeoutError,
)
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    ACL_ERROR_RT_SYMBOL_NOT_FOUND,
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    PTR_MAX,
    SIZE_MAX,
    KernelType,
    check_args,
    check_event_flags,
    check_failure_mode,
    check_load_options,
    check_memcpy,
    check_num_blocks,
    check_placeholder_table,
    check_timeout,
)
from ..base import PLAIN_FUNCTION
from ..staging import DEFAULT_STAGING_BYTES, MAX_STAGING_ALIGN, StagingRing, staging_alignment
from .core import (
    CU_EVENT_DISABLE_TIMING,
    CU_STREAM_NON_BLOCKING,
    DEFAULT_BLOCK_DIM,
    CudaBinary,
    CudaEvent,
    CudaFunction,
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
from .graphs import CudaGraphs
from .kernels import BUILTIN_INFO, BUILTIN_NAMES, CONTROL_SYMBOL, KERNEL_SOURCE, PARAM_SIZES
from .launch import apply_patches, placeholder_patches
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


class CudaRuntime(CudaGraphs):
    """One NVIDIA GPU through ``cuda.bindings.driver``. Create with :func:`open_cuda_runtime`."""

    name = "cuda"
    #: one host parameter buffer per launch (``cuLaunchKernel`` with ``CU_LAUNCH_PARAM_BUFFER``)
    launch_path = "param_buffer"
    #: CUDA documents no limit; its launch queue blocks the host at about a thousand pending
    #: launches per stream, so the scheduler stays below that
    stream_capacity = 1024
    ordered_task_ids = False  # no task ids at all

    # --- streams -----------------------------------------------------------------------

    def create_stream(self, priority: int | None = None) -> int:
        """``cuStreamCreate(CU_STREAM_NON_BLOCKING)``, or with a ``priority``
        ``cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING, priority)``. CUDA clamps a
        priority outside :meth:`stream_priority_range` silently; it is refused here first."""
        if priority is None:
            func = "cuStreamCreate"
            self._enter(func)
            err, cu = self._d.cuStreamCreate(CU_STREAM_NON_BLOCKING)
        else:
            func = "cuStreamCreateWithPriority"
            self._enter(func)
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise self._param(func, f"priority={priority!r}: expected an int or None")
            least, greatest = self.stream_priority_range()
            if not greatest <= priority <= least:
                raise self._param(
                    func,
                    f"priority={priority} is outside the device's range {greatest}..{least} "
                    "(lower = more urgent)",
                )
            err, cu = self._d.cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING, priority)
        if int(err):
            self._raise(int(err), func)
        handle = int(cu)
        self._streams[handle] = CudaStream(handle, cu)
        return handle

    def stream_priority_range(self) -> tuple[int, int]:
        """``cuCtxGetStreamPriorityRange``: ``(least, greatest)``, e.g. ``(0, -5)``."""
        func = "cuCtxGetStreamPriorityRange"
        self._enter(func)
        err, least, greatest = self._d.cuCtxGetStreamPriorityRange()
        if int(err):
            self._raise(int(err), func)
        return int(least), int(greatest)

    def _stream_idle(self, s: CudaStream, func: str) -> bool:
        (err,) = self._cuStreamQuery(s.cu)
        code = int(err)
        if code == CUDA_SUCCESS:
            return True
        if code == CUDA_ERROR_NOT_READY:
            return False
        self._raise(code, func)

    def destroy_stream(self, stream: int) -> None:
        """Wait for the stream's queued work (unless the device faulted), then destroy it."""
        func = "cuStreamDestroy"
        self._enter(func)
        s = self._stream(stream, func)
        self._abort_capture(s)
        if self._fault is None:
            try:
                self.poll(lambda: self._stream_idle(s, func), -1, func)
            except DeviceFaultError:
                pass  # faulted while waiting: destroy without waiting
        self._streams.pop(s.handle, None)
        self._release_stream(s, free_ring=True)

    def destroy_stream_force(self, stream: int) -> None:
        """Destroy at once. CUDA cannot discard queued or running work: every built-in ``hang``
        kernel of this runtime is released so the stream can drain, and its staging memory is
        freed only at close."""
        func = "cuStreamDestroy"
        self._enter(func)
        s = self._stream(stream, func)
        self._abort_capture(s)
        self.release_hangs()
        self._streams.pop(s.handle, None)
        self._release_stream(s, free_ring=False)

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

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        """Stored only: on CUDA a kernel fault always halts the context (stop-on-failure)."""
        func = "cuStreamSetFailureMode"
        self._enter(func)
        s = self._stream(stream, func)
        try:
            s.mode = check_failure_mode(func, mode)
        except InvalidParamError as exc:
            raise self._noted(exc) from None

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        func = "cuStreamSynchronize"
        self._enter_live(func)
        s = self._stream(stream, func)
        self._not_capturing(s, func)
        try:
            timeout_ms = check_timeout(func, timeout_ms)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        if not self.poll(lambda: self._stream_idle(s, func), timeout_ms, func):
            message = f"stream not idle after {timeout_ms} ms"
            self._set_error(message)
            raise StreamSyncTimeoutError(message, code=ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, func=func)

    # --- events ------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        """An event; timing is enabled only for ``ACL_EVENT_TIME_LINE``. A never-recorded CUDA
        event queries as complete, as an Ex event does."""
        func = "cuEventCreate"
        self._enter(func)
        try:
            check_event_flags(func, flags)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        timed = bool(flags & ACL_EVENT_TIME_LINE)
        err, cu = self._d.cuEventCreate(0 if timed else CU_EVENT_DISABLE_TIMING)
        if int(err):
            self._raise(int(err), func)
        handle = int(cu)
        self._events[handle] = CudaEvent(handle, cu, timed)
        return handle

    def destroy_event(self, event: int) -> None:
        func = "cuEventDestroy"
        self._enter(func)
        ev = self._events.pop(event, None)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        (err,) = self._d.cuEventDestroy(ev.cu)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

    def record_event(self, event: int, stream: int) -> None:
        func = "cuEventRecord"
        if self._closed or not self._tls.bound or self._fault is not None:
            self._enter_live(func)
        ev = self._events.get(event)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        s = self._streams.get(stream)
        if s is None:
            raise self._bad_handle(func, f"stream handle {stream!r} is not a live stream")
        self._not_capturing(s, func)
        (err,) = self._cuEventRecord(ev.cu, s.cu)
        if int(err):
            self._raise(int(err), func)

    def query_event_status(self, event: int) -> int:
        func = "cuEventQuery"
        if self._closed or not self._tls.bound or self._fault is not None:
            self._enter_live(func)
        ev = self._events.get(event)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        (err,) = self._cuEventQuery(ev.cu)
        code = int(err)
        if code == CUDA_SUCCESS:
            return ACL_EVENT_RECORDED_STATUS_COMPLETE
        if code == CUDA_ERROR_NOT_READY:
            return ACL_EVENT_RECORDED_STATUS_NOT_READY
        self._raise(code, func)

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        """Polls ``cuEventQuery`` with short GIL-releasing sleeps until done or the timeout."""
        func = "cuEventSynchronize"
        self._enter_live(func)
        ev = self._event(event, func)
        try:
            timeout_ms = check_timeout(func, timeout_ms)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        if not self.poll(lambda: self.event_done(ev.cu, func), timeout_ms, func):
            message = f"event not complete after {timeout_ms} ms"
            self._set_error(message)
            raise EventSyncTimeoutError(message, code=ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, func=func)

    def stream_wait_event(self, stream: int, event: int) -> None:
        func = "cuStreamWaitEvent"
        self._enter_live(func)
        s = self._stream(stream, func)
        ev = self._event(event, func)
        self._not_capturing(s, func)
        (err,) = self._d.cuStreamWaitEvent(s.cu, ev.cu, 0)
        if int(err):
            self._raise(int(err), func)

    def event_elapsed_time(self, start: int, end: int) -> float:
        func = "cuEventElapsedTime"
        self._enter_live(func)
        events = []
        for label, handle in (("startEvent", start), ("endEvent", end)):
            ev = self._event(handle, func)
            if not ev.timed:
                raise self._param(func, f"{label} was not created with ACL_EVENT_TIME_LINE")
            events.append(ev)
        err, ms = self._d.cuEventElapsedTime(events[0].cu, events[1].cu)
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

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """``cuMemcpy{HtoD,DtoH,DtoD}Async``. A host side outside :meth:`malloc_host` memory is
        pageable: the call then waits until the stream has performed the copy."""
        func = "cuMemcpyAsync"
        self._enter_live(func)
        s = self._stream(stream, func)
        try:
            check_memcpy(func, dst, dst_max, src, count, kind)
        except InvalidParamError as exc:
            raise self._noted(exc) from None
        self._check_capture_copy(s, dst, src, count, kind, func)
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

    def load_binary(
        self, source: object, *, kernel_type: KernelType | None = None, lazy: bool | None = None
    ) -> int:
        """Load a module: ``None`` (the built-in kernels, compiled with NVRTC), a path (``.cu``
        source is compiled with NVRTC; ``.ptx``, ``.cubin``, ``.fatbin`` are loaded), or the
        bytes of a PTX, cubin or fatbin image. ``kernel_type`` and ``lazy`` (Ascend load
        options) are checked and ignored."""
        func = "cuModuleLoadData"
        check_load_options(kernel_type, lazy)
        self._enter(func)
        builtin = source is None
        if source is None:
            image = self._compiler(KERNEL_SOURCE, self.capability)
        elif isinstance(source, bytes | bytearray | memoryview):
            image = bytes(source)
            if not image:
                raise ValueError("load_binary: the module image is empty")
        elif isinstance(source, str | os.PathLike):
            path = os.path.abspath(os.fspath(source))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"load_binary: no module file at {path!r}")
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
        self._binaries[handle] = binary
        return handle

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

    def unload_binary(self, binary: int) -> None:
        func = "cuModuleUnload"
        self._enter(func)
        b = self._binaries.pop(binary, None)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        for handle in b.functions.values():
            self._functions.pop(handle, None)
        (err,) = self._d.cuModuleUnload(b.module)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

    def get_function(self, binary: int, name: str) -> int:
        func = "cuModuleGetFunction"
        self._enter(func)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        encoded = name.encode("utf-8")
        if not encoded or b"\0" in encoded:
            raise ValueError(f"name={name!r} is not a valid kernel name")
        b = self._binaries.get(binary)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        handle = b.functions.get(name)
        if handle is not None:
            return handle
        err, cu = self._d.cuModuleGetFunction(b.module, encoded)
        code = int(err)
        if code == CUDA_ERROR_NOT_FOUND:
            message = f"kernel {name!r} not found in the module (CUDA_ERROR_NOT_FOUND)"
            if b.builtin:
                message += f"; the built-in kernels are {sorted(BUILTIN_NAMES)}"
            self._set_error(message)
            raise RuntimeAPIError(message, code=ACL_ERROR_RT_SYMBOL_NOT_FOUND, func=func)
        if code:
            self._raise(code, func)
        builtin = b.builtin and name in PARAM_SIZES
        param_size = PARAM_SIZES[name] if builtin else None
        if param_size is None:
            param_size = self._param_size(cu)
        info = BUILTIN_INFO[name] if builtin else PLAIN_FUNCTION
        handle = int(cu)
        self._functions[handle] = CudaFunction(cu, name, param_size, binary, info)
        b.functions[name] = handle
        return handle

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

    def function_param_size(self, func: int) -> int | None:
        """The parameter buffer size launches of ``func`` pass (None: ``argsSize`` is used)."""
        f = self._functions.get(func)
        if f is None:
            raise self._bad_handle("cuFuncGetParamInfo", f"funcHandle {func!r} is not known")
        return f.param_size

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
            stage = self._launch_captured if s.capture is not None else self._launch_staged
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
        name = _LAUNCH
        with s.lock:
            ring = s.ring
            if ring is None:
                ring = s.ring = StagingRing(StreamRingOps(self, s), self.staging_bytes)
            region = ring.allocate(args_size, staging_alignment(entries))
            try:
                apply_patches(args_addr, placeholder_patches(entries, region))
                (err,) = self._cuMemcpyHtoDAsync(region, args_addr, args_size, s.cu)
                if int(err):
                    self._raise(int(err), "cuMemcpyHtoDAsync")
                extra = self._tls.extra.set(args_addr, param_size) if param_size else 0
                (err,) = self._cuLaunchKernel(
                    f.cu, num_blocks, 1, 1, block, 1, 1, 0, s.cu, None, extra
                )
                if int(err):
                    self._raise(int(err), name)
            finally:
                ring.committed(args_size)

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
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise ValueError(f"device_id must be a non-negative int, got {device_id!r}")
    if isinstance(block_dim, bool) or not isinstance(block_dim, int) or not 1 <= block_dim <= 1024:
        raise ValueError(f"block_dim={block_dim!r} must be an int in 1..1024")
    if (
        isinstance(staging_bytes, bool)
        or not isinstance(staging_bytes, int)
        or staging_bytes < MAX_STAGING_ALIGN
    ):
        raise ValueError(f"staging_bytes={staging_bytes!r} must be an int >= {MAX_STAGING_ALIGN}")
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
    before = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
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
        runtime.context_before_open = int(before) or None
        return runtime
    except BaseException:
        driver.cuDevicePrimaryCtxRelease(device)
        raise
