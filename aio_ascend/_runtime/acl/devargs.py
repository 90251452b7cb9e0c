"""The device-args launch path (CANN 8.0): the legacy loader and ``aclrtLaunchKernel``.

CANN 8.0 has neither ``aclrtLaunchKernelWithHostArgs`` nor the ``aclrtKernelArgs*`` handle:
``aclrtLaunchKernel(funcHandle, numBlocks, argsData, argsSize, stream)`` takes its args in
**device** memory that the caller fills and that must outlive the kernel (the runtime passes the
pointer to the device, ``isNoNeedH2DCopy = 1``; ``docs/cann-support.md`` §2.1). The runtime seam
still hands this path one host args image and its placeholder table, so per launch:

1. the image is given a region of the stream's staging ring (:class:`~..staging.StagingRing`, the
   fenced per-stream ring the cuda backend uses too), aligned so that every placeholder data
   block keeps its alignment;
2. it is copied into the ring's pinned host mirror (same offset) and each placeholder slot of
   that copy gets the device address of its data (``region + dataOffset``): the caller's buffer
   is read during the call and never written, as on the args-handle path;
3. ``aclrtMemcpyAsync`` (host to device, pinned source) queues the copy on the launch's stream,
   then ``aclrtLaunchKernel`` queues the kernel with the region as its args: stream order puts
   the copy before the kernel;
4. every :data:`~..staging.FENCE_EVERY` launches (or a quarter of the ring) an event is recorded
   on the stream; a region (device and mirror) is reused only once the fence after it reads
   complete, so neither a copy nor the kernel can see bytes of a later launch. A full ring waits
   for its oldest fence; an image larger than the ring makes it grow once the stream drained.

Rings are per stream, created at the stream's first launch. Their memory is ``malloc`` and
``malloc_host`` memory of the runtime, so ``close`` frees it with the rest; a stream destroyed
with :meth:`~.runtime.AclRuntime.destroy_stream` (which waits for its work) frees its ring at once,
one force-destroyed keeps it until ``close`` (a kernel may still read it).

Each kernel's args end with an overflow argument: the address of an 8-byte device buffer of the
runtime (:meth:`DeviceArgsPath.overflow_address`), laid out after the parameters and before any
placeholder data (``FunctionInfo.suffix``), where the args-handle path's ``Finalize`` puts the
context's overflow address.

What ``aclrtLaunchKernel`` cannot carry is refused before anything is queued: a
:class:`~aio_ascend.LaunchConfig` with attributes (kernel timeouts, schedule mode, ...) needs
``aclrtLaunchKernelV2`` (CANN 8.5+), so it raises ``BackendUnavailableError`` naming that
function rather than being ignored; a stream capture (``aclmdlRI*``, absent on 8.0) is refused.

The loader: ``aclrtCreateBinary(data, len)`` + ``aclrtBinaryLoad`` (a file is read and loaded as
its bytes; its kernel type is still read from the JSON beside it), then ``aclrtDestroyBinary`` on
the descriptor where the release exports it (it only holds the pointer and length; the data is
kept until the binary is unloaded). The legacy loader takes no options: ``kernel_type`` and
``lazy`` are refused (``ValueError``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable
from ctypes import byref, c_void_p
from typing import Any, Protocol

from ..._errors import (
    AscendError,
    BackendUnavailableError,
    DeviceFaultError,
    EventSyncTimeoutError,
    error_for_code,
)
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_RT_INVALID_HANDLE,
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_SYNC,
    ACL_MEMCPY_HOST_TO_DEVICE,
    KernelType,
    binary_bytes,
    check_placeholder_table,
    param_error,
)
from ..staging import (
    DEFAULT_STAGING_BYTES,
    MAX_STAGING_ALIGN,
    StagingRing,
    apply_patches,
    placeholder_patches,
    staging_alignment,
)
from .values import check_launch

__all__ = ["LAUNCH", "DeviceArgsPath", "load_legacy"]

#: the launch call of this path (named in its errors)
LAUNCH = "aclrtLaunchKernel"
#: how long one wait for a fence blocks before it is retried (a closed runtime then refuses)
_FENCE_WAIT_MS = 200


class _Runtime(Protocol):
    """The seam calls the path makes on :class:`~.runtime.AclRuntime`."""

    def malloc(self, size: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def malloc_host(self, size: int) -> int: ...
    def free_host(self, ptr: int) -> None: ...
    def create_event(self, flags: int) -> int: ...
    def record_event(self, event: int, stream: int) -> None: ...
    def query_event_status(self, event: int) -> int: ...
    def synchronize_event(self, event: int, timeout_ms: int) -> None: ...
    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None: ...


class _RingOps:
    """:class:`~..staging.RingOps` of one stream: device memory with a pinned host mirror of
    the same size (a region's host copy is at the same offset), and fence events."""

    __slots__ = ("_fences", "_pairs", "_rt", "host", "stream")

    def __init__(self, runtime: _Runtime, stream: int, fences: list[int]) -> None:
        self._rt = runtime
        self.stream = stream
        self._fences = fences  # the runtime-wide pool of recycled fence events
        self._pairs: dict[int, int] = {}  # device allocation -> its host mirror
        #: the host mirror of the current device allocation
        self.host = 0

    def alloc(self, nbytes: int) -> int:
        device = self._rt.malloc(nbytes)
        try:
            host = self._rt.malloc_host(nbytes)
        except BaseException:
            with contextlib.suppress(AscendError):
                self._rt.free(device)
            raise
        self._pairs[device] = self.host = host
        return device

    def free(self, address: int) -> None:
        host = self._pairs.pop(address, 0)
        with contextlib.suppress(AscendError):
            self._rt.free(address)
        if host:
            with contextlib.suppress(AscendError):
                self._rt.free_host(host)

    def record(self) -> object:
        try:
            event = self._fences.pop()
        except IndexError:
            event = self._rt.create_event(ACL_EVENT_SYNC)
        try:
            self._rt.record_event(event, self.stream)
        except BaseException:
            self._fences.append(event)
            raise
        return event

    def done(self, fence: object) -> bool:
        assert isinstance(fence, int)
        return self._rt.query_event_status(fence) == ACL_EVENT_RECORDED_STATUS_COMPLETE

    def wait(self, fence: object) -> None:
        assert isinstance(fence, int)
        while True:  # bounded waits: a closed runtime refuses the next one (ClosedError)
            try:
                self._rt.synchronize_event(fence, _FENCE_WAIT_MS)
                return
            except EventSyncTimeoutError:
                continue

    def release(self, fence: object) -> None:
        assert isinstance(fence, int)
        self._fences.append(fence)


class _Staging:
    """One stream's ring, its ops and the lock that serialises the stream's launches."""

    __slots__ = ("lock", "ops", "ring")

    def __init__(self, ops: _RingOps, capacity: int) -> None:
        self.lock = threading.Lock()
        self.ops = ops
        self.ring = StagingRing(ops, capacity)


def _refuse_cfg(cfg: object) -> None:
    """A config ``aclrtLaunchKernel`` cannot carry is refused, not ignored."""
    if cfg is None:
        return
    if not isinstance(cfg, LaunchConfig):
        raise param_error(LAUNCH, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}")
    if cfg.num_attrs:
        raise BackendUnavailableError(
            f"{cfg!r} cannot be applied on this CANN release: its launch "
            "(aclrtLaunchKernel, the device-args path of CANN 8.0) takes no launch config, and "
            "aclrtLaunchKernelV2, which does, is CANN 8.5+. Launch without a config (a kernel "
            "timeout can only become a bound on the host's wait, e.g. anyio.fail_after around "
            "the task's wait, while the kernel runs on), or install CANN 8.5 or newer.",
            func="aclrtLaunchKernelV2",
        )


class DeviceArgsPath:
    """The device-args launches of one :class:`~.runtime.AclRuntime` (module docstring)."""

    def __init__(
        self,
        runtime: _Runtime,
        *,
        table: Callable[[], dict[str, Any]],
        streams: set[int],
        functions: dict[int, int],
        capturing: set[int],
        sticky: Callable[[DeviceFaultError], AscendError],
        capacity: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        """``table()``: the runtime's function table now (it changes at close and fork);
        ``streams``, ``functions`` (handle -> binary), ``capturing``: the runtime's live sets,
        shared; ``sticky``: its fault reporting."""
        if capacity < MAX_STAGING_ALIGN:
            raise ValueError(f"staging capacity={capacity} must be at least {MAX_STAGING_ALIGN}")
        self._rt = runtime
        self._table = table
        self._streams = streams
        self._functions = functions
        self._capturing = capturing
        self._sticky = sticky
        self.capacity = capacity
        self._staging: dict[int, _Staging] = {}
        self._lock = threading.Lock()
        self._fences: list[int] = []
        self._overflow: int | None = None

    def _stream(self, stream: int) -> _Staging:
        staging = self._staging.get(stream)
        if staging is None:
            with self._lock:
                staging = self._staging.get(stream)
                if staging is None:
                    ops = _RingOps(self._rt, stream, self._fences)
                    staging = self._staging[stream] = _Staging(ops, self.capacity)
        return staging

    def launch(
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
        """The seam's launch on this path: the same checks as the other paths, every input
        refused before anything is queued, then stage, copy, launch (module docstring)."""
        func, num_blocks, stream, args_addr, args_size, placeholders_addr = check_launch(
            func, num_blocks, stream, args_addr, args_size, placeholders_addr, placeholder_count
        )
        entries = check_placeholder_table(LAUNCH, placeholders_addr, placeholder_count, args_size)
        _refuse_cfg(cfg)
        rt = self._rt
        if func not in self._functions:
            raise error_for_code(
                ACL_ERROR_RT_INVALID_HANDLE,
                LAUNCH,
                f"funcHandle {func:#x} is not a function of a loaded binary",
            )
        if stream not in self._streams:
            raise error_for_code(
                ACL_ERROR_RT_INVALID_HANDLE, LAUNCH, f"stream {stream:#x} is not a live stream"
            )
        if stream in self._capturing:
            raise param_error(
                LAUNCH, f"stream {stream:#x} is capturing: a device-args launch cannot be captured"
            )
        staging = self._stream(stream)
        with staging.lock:
            ring = staging.ring
            region = ring.allocate(args_size, staging_alignment(entries))
            try:
                host = staging.ops.host + (region - ring.base)
                ctypes.memmove(host, args_addr, args_size)
                if entries:
                    apply_patches(host, placeholder_patches(entries, region))
                rt.memcpy_async(
                    region, args_size, host, args_size, ACL_MEMCPY_HOST_TO_DEVICE, stream
                )
                try:
                    self._table()[LAUNCH](func, num_blocks, region, args_size, stream)
                except DeviceFaultError as exc:
                    raise self._sticky(exc) from None
            finally:
                ring.committed(args_size)

    def forget_stream(self, stream: int, *, drained: bool) -> None:
        """``stream`` was destroyed: free its ring now if its work is done (``drained``),
        else leave the memory to ``close`` (a kernel of it may still read its args)."""
        with self._lock:
            staging = self._staging.pop(stream, None)
        if staging is not None:
            with staging.lock:
                staging.ring.close(free=drained)

    def overflow_address(self) -> int:
        """An 8-byte device buffer passed as every kernel's trailing overflow argument, as the
        asc-devkit launchers pass one (8.0 has no ``aclrtCtxGetFloatOverflowAddr`` to give the
        context's): allocated once, freed at close with the rest of the runtime's memory."""
        with self._lock:
            if self._overflow is None:
                self._overflow = self._rt.malloc(8)
            return self._overflow

    def forget_all(self) -> None:
        """At close (the runtime frees the memory and the fence events itself)."""
        with self._lock:
            self._staging.clear()
            self._fences.clear()
            self._overflow = None

    def stats(self, stream: int) -> dict[str, int]:
        """Counters of a stream's ring (zeros before its first launch): allocations, fences,
        waits, grows, capacity."""
        staging = self._staging.get(stream)
        if staging is None:
            return {"allocations": 0, "fences": 0, "waits": 0, "grows": 0, "capacity": 0}
        return {**staging.ring.stats, "capacity": staging.ring.capacity}


def load_legacy(
    fn: dict[str, Any],
    has: Any,
    source: object,
    kind: KernelType | None,
    lazy: bool | None,
    recent: Any,
) -> tuple[int, bytes, KernelType | None]:
    """Load ``source`` (bytes-like, or a path) with ``aclrtCreateBinary`` + ``aclrtBinaryLoad``:
    ``(binary handle, the data to keep, the kernel type if known)``. ``recent()`` gives the
    runtime's error text (``aclrtCreateBinary`` returns NULL, not a code)."""
    from .kernels import json_kernel_type

    if kind is not None or lazy is not None:
        given = "kernel_type" if kind is not None else "lazy"
        raise ValueError(
            f"{given} cannot be given on this CANN release: its loader (aclrtCreateBinary + "
            "aclrtBinaryLoad, the device-args path of CANN 8.0) takes no load options (the "
            "magic and lazy-load options belong to aclrtBinaryLoadFromData/FromFile, CANN 8.2+)"
        )
    data = binary_bytes(source)  # (not empty: check_binary_source)
    if data is None and isinstance(source, str | os.PathLike):
        path = os.path.abspath(os.fspath(source))
        with open(path, "rb") as file:
            data = file.read()
        if not data:
            raise ValueError(f"load_binary: the kernel binary {path!r} is empty")
        kind = json_kernel_type(path)
    if data is None:
        raise TypeError(
            "load_binary takes a path (str or os.PathLike), bytes-like data or None, "
            f"got {type(source).__name__}"
        )
    descriptor = fn["aclrtCreateBinary"](data, len(data))
    if not descriptor:
        raise error_for_code(
            ACL_ERROR_INVALID_PARAM, "aclrtCreateBinary", recent() or "returned NULL"
        )
    handle = c_void_p()
    try:
        fn["aclrtBinaryLoad"](descriptor, byref(handle))
    finally:
        if has("aclrtDestroyBinary"):
            with contextlib.suppress(AscendError):
                fn["aclrtDestroyBinary"](descriptor)
    if not handle.value:
        raise error_for_code(ACL_ERROR_INVALID_PARAM, "aclrtBinaryLoad", "returned a NULL handle")
    return handle.value, data, kind
