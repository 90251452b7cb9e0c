"""The ``cuda`` backend: the :class:`~aio_ascend._runtime.Runtime` seam over an NVIDIA GPU.

It drives the device through ``cuda.bindings.driver`` (the ``cuda-bindings`` package, the
``cuda`` extra of aio_ascend), imported only when a runtime is opened or probed, so this module
imports, type-checks and tests without it. The ACL calls map onto the CUDA driver API:

- context per thread: the device's primary context, bound with ``cuCtxSetCurrent``
- streams: ``cuStreamCreate(CU_STREAM_NON_BLOCKING)``
- Ex events: ``cuEventCreate`` (``CU_EVENT_DISABLE_TIMING`` unless ``ACL_EVENT_TIME_LINE``);
  ``cuEventQuery`` answers ``CUDA_ERROR_NOT_READY`` -> NOT_READY
- synchronize with a timeout: polling ``cuEventQuery``/``cuStreamQuery`` with short
  GIL-releasing sleeps (backoff 20 us .. 1 ms) up to the timeout
- memory: ``cuMemAlloc``/``cuMemFree``, pinned ``cuMemHostAlloc``/``cuMemFreeHost``,
  ``cuMemcpy{HtoD,DtoH,DtoD}Async``
- kernel binaries: ``cuModuleLoadData`` (PTX, cubin, fatbin, or a ``.cu`` file compiled with
  NVRTC); ``load_binary(None)``: the built-ins of :mod:`._cuda_kernels`, compiled with NVRTC
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
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from ..._errors import (
    AscendError,
    BackendUnavailableError,
    ClosedError,
    ContextNullError,
    DeviceFaultError,
    EventSyncTimeoutError,
    InternalError,
    InvalidHandleError,
    InvalidParamError,
    MemoryAllocationError,
    RuntimeAPIError,
    StreamSyncTimeoutError,
    error_class_for_code,
)
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
from .kernels import (
    BUILTIN_NAMES,
    CONTROL_FAULT_OFFSET,
    CONTROL_RELEASE_OFFSET,
    CONTROL_SIZE,
    CONTROL_SYMBOL,
    KERNEL_SOURCE,
    NVRTC_OPTIONS,
    PARAM_SIZES,
)

__all__ = [
    "CU_LAUNCH_PARAM_BUFFER_POINTER",
    "CU_LAUNCH_PARAM_BUFFER_SIZE",
    "CU_LAUNCH_PARAM_END",
    "CUDA_FAULT_CODES",
    "DEFAULT_BLOCK_DIM",
    "DEFAULT_STAGING_BYTES",
    "CudaRuntime",
    "LaunchExtra",
    "RingOps",
    "StagingRing",
    "compile_cuda_source",
    "cuda_error",
    "open_cuda_runtime",
    "placeholder_patches",
    "probe",
    "read_placeholder_table",
    "staging_alignment",
    "validate_placeholders",
]

# --- constants (values from cuda.h; the bindings expose the same numbers) ----------------------

#: ``extra`` markers of ``cuLaunchKernel`` (``((void*)0x01)``, ``0x02``, ``0x00``)
CU_LAUNCH_PARAM_BUFFER_POINTER = 0x01
CU_LAUNCH_PARAM_BUFFER_SIZE = 0x02
CU_LAUNCH_PARAM_END = 0x00

_CU_STREAM_NON_BLOCKING = 0x1
_CU_EVENT_DISABLE_TIMING = 0x2
_CU_MEMHOSTALLOC_PORTABLE = 0x1
_CU_MEMHOSTALLOC_DEVICEMAP = 0x2

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_CONTEXT_IS_DESTROYED = 709

#: CUDA errors that mean a kernel faulted on the device: the context is unusable afterwards
CUDA_FAULT_CODES = frozenset(
    {
        214,  # ECC_UNCORRECTABLE
        220,  # NVLINK_UNCORRECTABLE
        700,  # ILLEGAL_ADDRESS
        702,  # LAUNCH_TIMEOUT
        710,  # ASSERT
        714,  # HARDWARE_STACK_ERROR
        715,  # ILLEGAL_INSTRUCTION
        716,  # MISALIGNED_ADDRESS
        717,  # INVALID_ADDRESS_SPACE
        718,  # INVALID_PC
        719,  # LAUNCH_FAILED
    }
)

_CUDA_ERROR_NAMES = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    218: "CUDA_ERROR_INVALID_PTX",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}

_CUDA_ERROR_CLASSES: dict[int, type[RuntimeAPIError]] = {
    CUDA_ERROR_INVALID_VALUE: InvalidParamError,
    CUDA_ERROR_OUT_OF_MEMORY: MemoryAllocationError,
    CUDA_ERROR_INVALID_CONTEXT: ContextNullError,
    CUDA_ERROR_CONTEXT_IS_DESTROYED: ContextNullError,
    CUDA_ERROR_INVALID_HANDLE: InvalidHandleError,
}

# ACL codes for the checks made here, before CUDA sees the call (as the contract names them)
_ACL_PARAM_INVALID = 107000
_ACL_CONTEXT_NULL = 107002
_ACL_INVALID_HANDLE = 107017
_ACL_SYMBOL_NOT_FOUND = 107042
_ACL_STREAM_SYNC_TIMEOUT = 507046
_ACL_EVENT_SYNC_TIMEOUT = 507047

#: threads per block when ``cfg.block_dim`` is not set
DEFAULT_BLOCK_DIM = 256
#: initial size of each stream's placeholder staging ring (it grows for larger args)
DEFAULT_STAGING_BYTES = 256 * 1024
#: the largest placeholder alignment ``HostArgs`` allows (and the ring's base alignment)
MAX_STAGING_ALIGN = 4096
#: smallest alignment of a staged args image on the device
MIN_STAGING_ALIGN = 64
#: staged launches between two fence events of a ring
FENCE_EVERY = 64
#: sanity cap on ``placeHolderNum`` (the table is read during the call)
MAX_PLACEHOLDERS = 65535
_I32_MAX = 2**31 - 1
_PTR_MAX = 2**64 - 1
#: GIL-releasing sleeps between polls of a synchronize call
_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 1e-3
#: longest close() waits for queued work before releasing what it uses
_CLOSE_DRAIN_S = 2.0

_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<II")
_STATUS_COMPLETE = ACL_EVENT_RECORDED_STATUS_COMPLETE
_STATUS_NOT_READY = ACL_EVENT_RECORDED_STATUS_NOT_READY
_LAUNCH = "cuLaunchKernel"


# --- pure helpers (no cuda-bindings, no device: unit-tested on any machine) --------------------


def cuda_error_name(code: int, driver: Any = None) -> str:
    """``CUDA_ERROR_...`` for a CUDA error number (from the bindings when they know it)."""
    name = _CUDA_ERROR_NAMES.get(code)
    if name is not None:
        return name
    if driver is not None:
        try:
            found: str = driver.CUresult(code).name
            return found
        except Exception:
            pass
    return f"CUDA_ERROR_{code}"


def cuda_error(code: int, func: str, description: str = "", driver: Any = None) -> RuntimeAPIError:
    """The typed error for a failing CUDA driver call; ``.code`` is the CUDA error number.

    Device faults become :class:`DeviceFaultError`, invalid values :class:`InvalidParamError`,
    bad handles :class:`InvalidHandleError`, out of memory :class:`MemoryAllocationError`, a
    missing context :class:`ContextNullError`; anything else :class:`RuntimeAPIError`.
    """
    name = cuda_error_name(code, driver)
    message = f"{name} ({code})"
    if description:
        message += f": {description}"
    cls: type[RuntimeAPIError]
    if code in CUDA_FAULT_CODES:
        cls = DeviceFaultError
    else:
        cls = _CUDA_ERROR_CLASSES.get(code, RuntimeAPIError)
    return cls(message, code=code, func=func)


class LaunchExtra:
    """The ``extra`` array of ``cuLaunchKernel`` for a parameter-buffer launch.

    ``{CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
    CU_LAUNCH_PARAM_END}``: five pointers and the ``size_t`` the fourth points to. One instance
    per thread is reused by every launch (the driver reads it only during the call).

    The driver copies the parameter buffer with the kernel's parameter layout, which is the C
    struct layout of its parameter list: ``HostArgs`` packs every argument at its natural
    alignment, so the packed image is that layout as it is. Only the size must be exact (the
    driver refuses a buffer size that includes tail padding or placeholder data), so the size is
    the kernel's parameter size, not ``argsSize``. A buffer at an address that is not 8-aligned is
    first copied into an aligned scratch area (:meth:`set`).
    """

    __slots__ = ("_scratch", "_scratch_addr", "_scratch_size", "address", "array", "size")

    def __init__(self) -> None:
        self.array = (ctypes.c_void_p * 5)()
        self.size = ctypes.c_size_t(0)
        self.array[0] = CU_LAUNCH_PARAM_BUFFER_POINTER
        self.array[1] = None
        self.array[2] = CU_LAUNCH_PARAM_BUFFER_SIZE
        self.array[3] = ctypes.addressof(self.size)
        self.array[4] = CU_LAUNCH_PARAM_END
        #: the value to pass as ``extra``
        self.address = ctypes.addressof(self.array)
        self._scratch: Any = None
        self._scratch_addr = 0
        self._scratch_size = 0

    def set(self, buffer: int, size: int) -> int:
        """Point the array at ``size`` bytes at host address ``buffer``; returns :attr:`address`."""
        if buffer & 7:
            buffer = self._aligned_copy(buffer, size)
        self.array[1] = buffer
        self.size.value = size
        return self.address

    def _aligned_copy(self, buffer: int, size: int) -> int:
        if size > self._scratch_size:
            self._scratch = (ctypes.c_uint64 * ((size + 7) // 8))()
            self._scratch_addr = ctypes.addressof(self._scratch)
            self._scratch_size = size
        ctypes.memmove(self._scratch_addr, buffer, size)
        return self._scratch_addr

    def entries(self) -> list[int]:
        """The five pointer values as ints (for diagnostics and tests)."""
        return [int(v or 0) for v in self.array]


def read_placeholder_table(table_addr: int, count: int) -> list[tuple[int, int]]:
    """The ``(addrOffset, dataOffset)`` entries of an ``aclrtPlaceHolderInfo`` host array."""
    raw = ctypes.string_at(table_addr, _ENTRY.size * count)
    return list(_ENTRY.iter_unpack(raw))


def validate_placeholders(entries: Sequence[tuple[int, int]], args_size: int) -> str | None:
    """``None`` if every entry is valid for an args buffer of ``args_size`` bytes, else a message
    naming the first invalid field (the sim's rules: 8-aligned ``addrOffset`` with the 8-byte
    slot inside the buffer, 8-aligned ``dataOffset`` below ``argsSize``)."""
    for index, (addr_offset, data_offset) in enumerate(entries):
        where = f"placeHolderArray[{index}]"
        if addr_offset % 8:
            return f"{where}.addrOffset={addr_offset} is not 8-aligned"
        if addr_offset + 8 > args_size:
            return (
                f"{where}.addrOffset={addr_offset}: the 8-byte slot ends past argsSize={args_size}"
            )
        if data_offset % 8:
            return f"{where}.dataOffset={data_offset} is not 8-aligned"
        if data_offset >= args_size:
            return f"{where}.dataOffset={data_offset} is not below argsSize={args_size}"
    return None


def staging_alignment(entries: Sequence[tuple[int, int]]) -> int:
    """Alignment of the device copy of an args image so that each data block keeps its own.

    Data at ``dataOffset`` d is aligned (in the host image) to the lowest set bit of d; a device
    region aligned to the largest of those keeps every block's alignment at ``region + d``.
    At least :data:`MIN_STAGING_ALIGN`, at most :data:`MAX_STAGING_ALIGN`.
    """
    align = MIN_STAGING_ALIGN
    for _, data_offset in entries:
        if data_offset:
            align = max(align, data_offset & -data_offset)
    return min(align, MAX_STAGING_ALIGN)


def placeholder_patches(
    entries: Sequence[tuple[int, int]], region: int
) -> list[tuple[int, bytes]]:
    """``(addrOffset, uint64 little-endian bytes)`` to write into the caller's args buffer.

    The args image ``[0, argsSize)`` is copied to device address ``region``, so the data of
    each placeholder lies at ``region + dataOffset``.
    """
    return [(addr_offset, _U64.pack(region + data_offset)) for addr_offset, data_offset in entries]


def apply_patches(args_addr: int, patches: Sequence[tuple[int, bytes]]) -> None:
    """Write each patch at ``args_addr + offset`` (host memory the caller owns)."""
    for offset, data in patches:
        ctypes.memmove(args_addr + offset, data, len(data))


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class RingOps(Protocol):
    """What a :class:`StagingRing` needs from its runtime (device memory and fence events)."""

    def alloc(self, nbytes: int) -> int:
        """Device memory of ``nbytes``; returns its address."""
        ...

    def free(self, address: int) -> None:
        """Free memory from :meth:`alloc`."""
        ...

    def record(self) -> object:
        """Record a fence on the ring's stream, capturing the work submitted so far."""
        ...

    def done(self, fence: object) -> bool:
        """Whether the fence's captured work has completed (never blocks)."""
        ...

    def wait(self, fence: object) -> None:
        """Block until the fence's captured work has completed."""
        ...

    def release(self, fence: object) -> None:
        """The fence is no longer needed (completed or discarded)."""
        ...


class StagingRing:
    """Per-stream device staging for placeholder data: a ring reused only after completion.

    Each staged launch takes a region with :meth:`allocate` (its copy and launch are queued on
    the stream right after) and reports it with :meth:`committed`. Regions are grouped; a group
    is closed by recording a fence on the stream every :data:`FENCE_EVERY` launches (or a quarter
    of the ring), and its bytes are reused only once its fence reads complete, so no copy can
    overwrite data that a queued kernel has yet to read. When the ring is full, the oldest
    group's fence is waited for (the stream is FIFO); a region larger than the ring makes it
    grow once everything queued has completed. Not thread-safe: the runtime serialises each
    stream's launches.
    """

    __slots__ = (
        "_base",
        "_capacity",
        "_fence_every",
        "_groups",
        "_head",
        "_open_bytes",
        "_open_count",
        "_open_start",
        "_ops",
        "_raw",
        "stats",
    )

    def __init__(
        self, ops: RingOps, capacity: int = DEFAULT_STAGING_BYTES, fence_every: int = FENCE_EVERY
    ) -> None:
        if capacity < MAX_STAGING_ALIGN:
            raise ValueError(f"staging capacity={capacity} must be at least {MAX_STAGING_ALIGN}")
        if fence_every < 1:
            raise ValueError(f"fence_every={fence_every} must be >= 1")
        self._ops = ops
        self._fence_every = fence_every
        self._capacity = 0
        self._raw = 0
        self._base = 0
        self._head = 0
        #: closed groups in allocation order: [start offset, fence]
        self._groups: deque[tuple[int, object]] = deque()
        self._open_start: int | None = None
        self._open_count = 0
        self._open_bytes = 0
        #: counters: allocations, fences recorded, waits (blocking), grows
        self.stats = {"allocations": 0, "fences": 0, "waits": 0, "grows": 0}
        self._map(capacity)

    def _map(self, capacity: int) -> None:
        raw = self._ops.alloc(capacity + MAX_STAGING_ALIGN)
        self._raw = raw
        self._base = _align_up(raw, MAX_STAGING_ALIGN)
        self._capacity = capacity
        self._head = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def base(self) -> int:
        """Device address of offset 0 (aligned to :data:`MAX_STAGING_ALIGN`)."""
        return self._base

    @property
    def live_groups(self) -> int:
        """Fenced groups not yet known to be complete (plus the open one, if any)."""
        return len(self._groups) + (self._open_start is not None)

    def _live_start(self) -> int | None:
        if self._groups:
            return self._groups[0][0]
        return self._open_start

    def _try_place(self, nbytes: int, align: int) -> int | None:
        lo = self._live_start()
        if lo is None:  # nothing live: start over at the beginning
            self._head = 0
            return 0 if nbytes <= self._capacity else None
        head = self._head
        offset = _align_up(head, align)
        if head > lo:  # live data is [lo, head): free are [head, capacity) and [0, lo)
            if offset + nbytes <= self._capacity:
                return offset
            if nbytes <= lo:
                return 0
            return None
        # wrapped (head <= lo): free is [head, lo)
        if offset + nbytes <= lo:
            return offset
        return None

    def _retire_completed(self) -> bool:
        retired = False
        groups = self._groups
        while groups and self._ops.done(groups[0][1]):
            _, fence = groups.popleft()
            self._ops.release(fence)
            retired = True
        return retired

    def _close_open(self) -> None:
        if self._open_start is None:
            return
        fence = self._ops.record()
        self.stats["fences"] += 1
        self._groups.append((self._open_start, fence))
        self._open_start = None
        self._open_count = 0
        self._open_bytes = 0

    def _wait_oldest(self) -> None:
        if not self._groups:
            self._close_open()
        if not self._groups:
            raise InternalError("staging ring is full but holds nothing")
        _, fence = self._groups[0]
        self.stats["waits"] += 1
        self._ops.wait(fence)
        self._groups.popleft()
        self._ops.release(fence)

    def _drain(self) -> None:
        self._close_open()
        while self._groups:
            self._wait_oldest()

    def _grow(self, nbytes: int, align: int) -> None:
        self._drain()
        self.stats["grows"] += 1
        capacity = max(self._capacity * 2, MAX_STAGING_ALIGN)
        while capacity < nbytes + align:
            capacity *= 2
        self._ops.free(self._raw)
        self._raw = 0
        self._map(capacity)

    def allocate(self, nbytes: int, align: int) -> int:
        """A device region of ``nbytes`` aligned to ``align`` (<= :data:`MAX_STAGING_ALIGN`).

        May block until queued work of the stream completes (ring full), or grow the ring.
        """
        if nbytes <= 0:
            raise ValueError(f"nbytes={nbytes} must be > 0")
        if align <= 0 or align & (align - 1) or align > MAX_STAGING_ALIGN:
            raise ValueError(f"align={align} must be a power of two <= {MAX_STAGING_ALIGN}")
        if nbytes > self._capacity:
            self._grow(nbytes, align)
        while True:
            offset = self._try_place(nbytes, align)
            if offset is not None:
                break
            if not self._retire_completed():
                self._wait_oldest()
        self._head = offset + nbytes
        if self._open_start is None:
            self._open_start = offset
        self.stats["allocations"] += 1
        return self._base + offset

    def committed(self, nbytes: int) -> None:
        """The copy (and launch) using the last region were submitted: maybe close the group."""
        self._open_count += 1
        self._open_bytes += nbytes
        if self._open_count >= self._fence_every or self._open_bytes * 4 >= self._capacity:
            self._close_open()

    def close(self, free: bool = True) -> int:
        """Drop every fence; free the device memory unless ``free`` is false.

        Returns the raw allocation when it was not freed (the caller frees it later, once the
        device no longer uses it), else 0.
        """
        for _, fence in self._groups:
            self._ops.release(fence)
        self._groups.clear()
        self._open_start = None
        raw, self._raw = self._raw, 0
        if raw and free:
            self._ops.free(raw)
            return 0
        return raw


# --- NVRTC ------------------------------------------------------------------------------------

_COMPILED: dict[tuple[str, int], bytes] = {}
_COMPILED_LOCK = threading.Lock()


def _nvrtc_text(nvrtc: Any, prog: Any, size_fn: str, get_fn: str) -> bytes:
    err, size = getattr(nvrtc, size_fn)(prog)
    if int(err):
        raise BackendUnavailableError(f"NVRTC {size_fn} failed: {err!r}")
    buffer = b" " * int(size)
    (err,) = getattr(nvrtc, get_fn)(prog, buffer)
    if int(err):
        raise BackendUnavailableError(f"NVRTC {get_fn} failed: {err!r}")
    return buffer


def compile_cuda_source(
    source: str, capability: int, name: str = "aio_ascend_kernels.cu", nvrtc: Any = None
) -> bytes:
    """Compile CUDA C ``source`` with NVRTC for compute capability ``capability`` (e.g. 90).

    Returns a cubin (``sm_XY``) when this NVRTC knows the architecture, else PTX for the newest
    architecture it knows below it (the driver JIT-compiles PTX). Results are cached per process.
    """
    key = (hashlib.sha256(source.encode()).hexdigest(), capability)
    with _COMPILED_LOCK:
        cached = _COMPILED.get(key)
    if cached is not None:
        return cached
    if nvrtc is None:
        try:
            from cuda.bindings import nvrtc as nvrtc_module
        except ImportError as exc:
            raise BackendUnavailableError(
                f"NVRTC is not available ({exc}); install cuda-bindings"
            ) from exc
        nvrtc = nvrtc_module
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        supported = sorted(int(a) for a in archs) if not int(err) else []
    except Exception as exc:
        raise BackendUnavailableError(
            f"NVRTC cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if capability in supported or not supported:
        arch, cubin = f"sm_{capability}", True
    else:
        below = [a for a in supported if a <= capability]
        if not below:
            raise BackendUnavailableError(
                f"this NVRTC supports {supported}, nothing at or below sm_{capability}"
            )
        arch, cubin = f"compute_{below[-1]}", False
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if int(err):
        raise BackendUnavailableError(f"nvrtcCreateProgram failed: {err!r}")
    try:
        options = [opt.encode() for opt in NVRTC_OPTIONS] + [
            f"--gpu-architecture={arch}".encode()
        ]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if int(err):
            log = _nvrtc_text(nvrtc, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            raise BackendUnavailableError(
                f"NVRTC could not compile {name} for {arch}:\n"
                + log.decode("utf-8", "replace").strip("\0 \n")
            )
        if cubin:
            image = _nvrtc_text(nvrtc, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        else:
            image = _nvrtc_text(nvrtc, prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
    finally:
        try:
            nvrtc.nvrtcDestroyProgram(prog)
        except Exception:
            pass
    with _COMPILED_LOCK:
        _COMPILED[key] = image
    return image


# --- the bindings -----------------------------------------------------------------------------

_INIT_LOCK = threading.Lock()


def _import_driver() -> Any:
    from cuda.bindings import driver

    return driver


def _bindings_version() -> str:
    try:
        import cuda.bindings

        version: str = getattr(cuda.bindings, "__version__", "?")
        return version
    except ImportError:
        return "?"


def probe() -> tuple[bool, str]:
    """Whether the ``cuda`` backend can run here, and why (never raises)."""
    try:
        driver = _import_driver()
    except ImportError as exc:
        return False, f"cuda-bindings is not installed ({exc}); pip install 'aio_ascend[cuda]'"
    except Exception as exc:
        return False, f"cuda-bindings cannot be imported: {type(exc).__name__}: {exc}"
    try:
        (err,) = driver.cuInit(0)
        if int(err):
            return False, f"cuInit failed: {cuda_error_name(int(err), driver)} ({int(err)})"
        err, count = driver.cuDeviceGetCount()
        if int(err):
            return False, f"cuDeviceGetCount failed: {cuda_error_name(int(err), driver)}"
    except Exception as exc:  # no libcuda.so: the bindings raise their own exceptions
        return False, f"the NVIDIA driver cannot be loaded: {type(exc).__name__}: {exc}"
    if count <= 0:
        return False, "cuda-bindings and the driver load, but no CUDA device is visible"
    return True, f"cuda-bindings {_bindings_version()}, {count} device(s)"


# --- the runtime ------------------------------------------------------------------------------


class _Tls(threading.local):
    """Per-thread state: context binding, the launch ``extra`` array, the latest error text."""

    def __init__(self) -> None:
        self.bound = False
        self.extra = LaunchExtra()
        self.last_error = ""


class _Stream:
    __slots__ = ("cu", "handle", "lock", "mode", "ring")

    def __init__(self, handle: int, cu: Any) -> None:
        self.handle = handle
        self.cu = cu
        self.lock = threading.Lock()
        self.ring: StagingRing | None = None
        self.mode = ACL_STOP_ON_FAILURE


class _Event:
    __slots__ = ("cu", "handle", "timed")

    def __init__(self, handle: int, cu: Any, timed: bool) -> None:
        self.handle = handle
        self.cu = cu
        self.timed = timed


class _Function:
    __slots__ = ("binary", "cu", "name", "param_size")

    def __init__(self, cu: Any, name: str, param_size: int | None, binary: int) -> None:
        self.cu = cu
        self.name = name
        self.param_size = param_size
        self.binary = binary


class _Binary:
    __slots__ = ("builtin", "functions", "module")

    def __init__(self, module: Any, builtin: bool) -> None:
        self.module = module
        self.builtin = builtin
        self.functions: dict[str, int] = {}


class _StreamRingOps:
    """:class:`RingOps` of one stream: device memory and fence events of the runtime."""

    __slots__ = ("runtime", "stream")

    def __init__(self, runtime: CudaRuntime, stream: _Stream) -> None:
        self.runtime = runtime
        self.stream = stream

    def alloc(self, nbytes: int) -> int:
        return self.runtime._device_alloc(nbytes, "cuMemAlloc")

    def free(self, address: int) -> None:
        self.runtime._device_free_quietly(address)

    def record(self) -> object:
        return self.runtime._record_fence(self.stream)

    def done(self, fence: object) -> bool:
        return self.runtime._event_done(fence, "cuEventQuery")

    def wait(self, fence: object) -> None:
        runtime = self.runtime
        runtime._poll(lambda: runtime._event_done(fence, "cuEventQuery"), -1, "cuEventQuery")

    def release(self, fence: object) -> None:
        self.runtime._fence_pool.append(fence)


class CudaRuntime:
    """One NVIDIA GPU through ``cuda.bindings.driver``. Create with :func:`open_cuda_runtime`."""

    name = "cuda"

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
        self.device_id = device_id
        #: compute capability as major*10 + minor (e.g. 90 for an H100/H200)
        self.capability = capability
        self.block_dim = block_dim
        self.staging_bytes = staging_bytes
        self._d = driver
        self._device = device
        self._ctx = context
        self._compiler = compiler or compile_cuda_source
        self._tls = _Tls()
        self._tls.bound = True  # open_cuda_runtime bound the context to this thread
        self._closed = False
        self._close_lock = threading.Lock()
        self._fault: tuple[type[RuntimeAPIError], int, str] | None = None
        self._fault_lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._functions: dict[int, _Function] = {}
        self._binaries: dict[int, _Binary] = {}
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
            CONTROL_SIZE, _CU_MEMHOSTALLOC_DEVICEMAP | _CU_MEMHOSTALLOC_PORTABLE
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

    def _set_error(self, message: str) -> None:
        self._tls.last_error = message

    def _cuda_error(self, code: int, func: str) -> RuntimeAPIError:
        description = ""
        try:
            err, text = self._d.cuGetErrorString(self._d.CUresult(code))
            if not int(err) and text:
                description = text.decode("utf-8", "replace")
        except Exception:
            pass
        exc = cuda_error(code, func, description, self._d)
        self._set_error(exc.message)
        return exc

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
                    self._fault = (
                        cls,
                        acl,
                        f"{cuda.message}; the 'fault' kernel raised ACL error {acl} on purpose",
                    )
                else:
                    self._fault = (
                        DeviceFaultError,
                        code,
                        f"{cuda.message} (a kernel faulted; the CUDA context is unusable until "
                        "the runtime is closed)",
                    )
        return self._fault_error(func)

    def _fault_error(self, func: str) -> RuntimeAPIError:
        fault = self._fault
        if fault is None:
            raise InternalError("no fault to report", func=func)
        cls, code, message = fault
        self._set_error(message)
        return cls(message, code=code, func=func)

    def _param(self, func: str, message: str) -> InvalidParamError:
        self._set_error(message)
        return InvalidParamError(message, code=_ACL_PARAM_INVALID, func=func)

    def _bad_handle(self, func: str, message: str) -> InvalidHandleError:
        self._set_error(message)
        return InvalidHandleError(message, code=_ACL_INVALID_HANDLE, func=func)

    def _enter(self, func: str) -> None:
        """Open, and a context bound to this thread."""
        if self._closed:
            raise ClosedError("the cuda runtime is closed", func=func)
        tls = self._tls
        if not tls.bound:
            message = (
                f"no context is bound to thread {threading.current_thread().name!r}: call "
                "set_current_context() first"
            )
            tls.last_error = message
            raise ContextNullError(message, code=_ACL_CONTEXT_NULL, func=func)

    def _enter_live(self, func: str) -> None:
        """:meth:`_enter`, and the device has not faulted (calls that submit or observe work)."""
        self._enter(func)
        if self._fault is not None:
            raise self._fault_error(func)

    def _stream(self, stream: int, func: str) -> _Stream:
        s = self._streams.get(stream)
        if s is None:
            raise self._bad_handle(func, f"stream handle {stream!r} is not a live stream")
        return s

    def _event(self, event: int, func: str) -> _Event:
        ev = self._events.get(event)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        return ev

    def _check_timeout(self, timeout_ms: object, func: str) -> int:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
            raise self._param(func, f"timeout={timeout_ms!r}: expected an int (ms)")
        if timeout_ms == 0 or timeout_ms < -1:
            raise self._param(func, f"timeout={timeout_ms}: expected -1 (forever) or > 0 ms")
        if timeout_ms > _I32_MAX:
            raise self._param(func, f"timeout={timeout_ms} does not fit int32")
        return timeout_ms

    def _poll(self, done: Callable[[], bool], timeout_ms: int, func: str) -> bool:
        """Poll ``done`` with GIL-releasing sleeps (backoff) until true or ``timeout_ms`` passed."""
        if done():
            return True
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        delay = _POLL_FIRST_S
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
            delay = min(delay * 2, _POLL_MAX_S)

    def _event_done(self, fence: object, func: str) -> bool:
        (err,) = self._cuEventQuery(fence)
        code = int(err)
        if code == CUDA_SUCCESS:
            return True
        if code == CUDA_ERROR_NOT_READY:
            return False
        self._raise(code, func)

    # --- context and lifecycle ---------------------------------------------------------

    def set_current_context(self) -> None:
        """``cuCtxSetCurrent``: bind the device's primary context to the calling thread."""
        func = "cuCtxSetCurrent"
        if self._closed:
            raise ClosedError("the cuda runtime is closed", func=func)
        (err,) = self._d.cuCtxSetCurrent(self._ctx)
        if int(err):
            self._raise(int(err), func)
        self._tls.bound = True

    def get_recent_error_message(self) -> str:
        message: str = self._tls.last_error
        return message

    @property
    def is_faulted(self) -> bool:
        """Whether a kernel faulted (sticky until close)."""
        return self._fault is not None

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
        if pushed and self._fault is None:
            self._drain_for_close(_CLOSE_DRAIN_S)
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
                time.sleep(_POLL_MAX_S)

    # --- streams -----------------------------------------------------------------------

    def create_stream(self) -> int:
        func = "cuStreamCreate"
        self._enter(func)
        err, cu = self._d.cuStreamCreate(_CU_STREAM_NON_BLOCKING)
        if int(err):
            self._raise(int(err), func)
        handle = int(cu)
        self._streams[handle] = _Stream(handle, cu)
        return handle

    def _stream_idle(self, s: _Stream, func: str) -> bool:
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
        if self._fault is None:
            try:
                self._poll(lambda: self._stream_idle(s, func), -1, func)
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
        self.release_hangs()
        self._streams.pop(s.handle, None)
        self._release_stream(s, free_ring=False)

    def _release_stream(self, s: _Stream, *, free_ring: bool) -> None:
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
        if isinstance(mode, bool) or mode not in (ACL_CONTINUE_ON_FAILURE, ACL_STOP_ON_FAILURE):
            raise self._param(func, f"mode={mode!r}: expected 0 (continue) or 1 (stop on failure)")
        s.mode = mode

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        func = "cuStreamSynchronize"
        self._enter_live(func)
        s = self._stream(stream, func)
        timeout_ms = self._check_timeout(timeout_ms, func)
        if not self._poll(lambda: self._stream_idle(s, func), timeout_ms, func):
            message = f"stream not idle after {timeout_ms} ms"
            self._set_error(message)
            raise StreamSyncTimeoutError(message, code=_ACL_STREAM_SYNC_TIMEOUT, func=func)

    # --- events ------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        """An event; timing is enabled only for ``ACL_EVENT_TIME_LINE``. A never-recorded CUDA
        event queries as complete, as an Ex event does."""
        func = "cuEventCreate"
        self._enter(func)
        if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags <= 0x7F:
            raise self._param(func, f"flag={flags!r}: expected a combination of ACL_EVENT_* bits")
        timed = bool(flags & ACL_EVENT_TIME_LINE)
        err, cu = self._d.cuEventCreate(0 if timed else _CU_EVENT_DISABLE_TIMING)
        if int(err):
            self._raise(int(err), func)
        handle = int(cu)
        self._events[handle] = _Event(handle, cu, timed)
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
            return _STATUS_COMPLETE
        if code == CUDA_ERROR_NOT_READY:
            return _STATUS_NOT_READY
        self._raise(code, func)

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        """Polls ``cuEventQuery`` with short GIL-releasing sleeps until done or the timeout."""
        func = "cuEventSynchronize"
        self._enter_live(func)
        ev = self._event(event, func)
        timeout_ms = self._check_timeout(timeout_ms, func)
        if not self._poll(lambda: self._event_done(ev.cu, func), timeout_ms, func):
            message = f"event not complete after {timeout_ms} ms"
            self._set_error(message)
            raise EventSyncTimeoutError(message, code=_ACL_EVENT_SYNC_TIMEOUT, func=func)

    def stream_wait_event(self, stream: int, event: int) -> None:
        func = "cuStreamWaitEvent"
        self._enter_live(func)
        s = self._stream(stream, func)
        ev = self._event(event, func)
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

    # --- fences (staging rings) --------------------------------------------------------

    def _record_fence(self, s: _Stream) -> object:
        try:
            fence = self._fence_pool.pop()
        except IndexError:
            err, fence = self._d.cuEventCreate(_CU_EVENT_DISABLE_TIMING)
            if int(err):
                self._raise(int(err), "cuEventCreate")
            self._fences.append(fence)
        (err,) = self._cuEventRecord(fence, s.cu)
        if int(err):
            self._fence_pool.append(fence)
            self._raise(int(err), "cuEventRecord")
        return fence

    # --- memory ------------------------------------------------------------------------

    def _device_alloc(self, size: int, func: str) -> int:
        err, ptr = self._d.cuMemAlloc(size)
        if int(err):
            self._raise(int(err), func)
        return int(ptr)

    def _device_free_quietly(self, ptr: int) -> None:
        try:
            self._d.cuMemFree(ptr)
        except Exception:
            pass

    def malloc(self, size: int) -> int:
        """``cuMemAlloc`` (at least 256-byte aligned)."""
        func = "cuMemAlloc"
        self._enter(func)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise self._param(func, f"size={size!r}: expected an int > 0")
        ptr = self._device_alloc(size, func)  # after a fault CUDA refuses: the fault is raised
        self._device_memory[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        """``cuMemFree`` at once (CUDA may wait for the device to be idle inside the call)."""
        func = "cuMemFree"
        self._enter(func)
        if self._device_memory.pop(ptr, None) is None:
            raise self._param(func, f"devPtr={_hex(ptr)} is not a live device allocation")
        (err,) = self._d.cuMemFree(ptr)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

    def malloc_host(self, size: int) -> int:
        """``cuMemHostAlloc``: pinned (page-locked) host memory, page aligned."""
        func = "cuMemHostAlloc"
        self._enter(func)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise self._param(func, f"size={size!r}: expected an int > 0")
        err, ptr = self._d.cuMemHostAlloc(size, _CU_MEMHOSTALLOC_PORTABLE)
        if int(err):
            self._raise(int(err), func)
        address = int(ptr)
        with self._host_lock:
            self._host_memory[address] = size
            bisect.insort(self._host_starts, address)
        return address

    def free_host(self, ptr: int) -> None:
        func = "cuMemFreeHost"
        self._enter(func)
        with self._host_lock:
            if self._host_memory.pop(ptr, None) is None:
                raise self._param(
                    func, f"hostPtr={_hex(ptr)} is not a live pinned host allocation"
                )
            index = bisect.bisect_left(self._host_starts, ptr)
            del self._host_starts[index]
        (err,) = self._d.cuMemFreeHost(ptr)
        if int(err) and self._fault is None:
            self._raise(int(err), func)

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

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """``cuMemcpy{HtoD,DtoH,DtoD}Async``. A host side outside :meth:`malloc_host` memory is
        pageable: the call then waits until the stream has performed the copy."""
        func = "cuMemcpyAsync"
        self._enter_live(func)
        s = self._stream(stream, func)
        for label, value in (("destMax", dst_max), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self._param(func, f"{label}={value!r}: expected an int >= 0")
        if count > dst_max:
            raise self._param(func, f"count={count} is larger than destMax={dst_max}")
        for label, value in (("dst", dst), ("src", src)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _PTR_MAX:
                raise self._param(func, f"{label}={value!r} is a NULL or invalid pointer")
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
            self._poll(lambda: self._stream_idle(s, func), -1, func)

    # --- kernels -----------------------------------------------------------------------

    def load_binary(self, source: object) -> int:
        """Load a module: ``None`` (the built-in kernels, compiled with NVRTC), a path (``.cu``
        source is compiled with NVRTC; ``.ptx``, ``.cubin``, ``.fatbin`` are loaded), or the
        bytes of a PTX, cubin or fatbin image."""
        func = "cuModuleLoadData"
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
        binary = _Binary(module, builtin)
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
            raise RuntimeAPIError(message, code=_ACL_SYMBOL_NOT_FOUND, func=func)
        if code:
            self._raise(code, func)
        param_size = PARAM_SIZES[name] if b.builtin and name in PARAM_SIZES else None
        if param_size is None:
            param_size = self._param_size(cu)
        handle = int(cu)
        self._functions[handle] = _Function(cu, name, param_size, binary)
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
        if type(num_blocks) is not int or not 1 <= num_blocks <= MAX_NUM_BLOCKS:
            raise self._param(
                name, f"numBlocks={num_blocks!r}: expected an int in 1..{MAX_NUM_BLOCKS}"
            )
        block = self.block_dim
        if cfg is not None:
            if not isinstance(cfg, LaunchConfig):
                raise self._param(
                    name, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}"
                )
            if cfg.block_dim is not None:
                block = cfg.block_dim
        if type(args_addr) is not int or not 0 < args_addr <= _PTR_MAX:
            raise self._param(name, f"hostArgs={args_addr!r}: the args buffer address is NULL")
        if type(args_size) is not int or not 1 <= args_size <= UINT32_MAX:
            raise self._param(name, f"argsSize={args_size!r}: expected an int in 1..{UINT32_MAX}")
        param_size = f.param_size
        if param_size is None:
            param_size = args_size
        elif args_size < param_size:
            raise self._param(
                name,
                f"argsSize={args_size} is smaller than the {param_size} bytes of parameters of "
                f"kernel {f.name!r}",
            )
        if placeholder_count:
            if type(placeholder_count) is not int or not 0 <= placeholder_count <= MAX_PLACEHOLDERS:
                raise self._param(
                    name,
                    f"placeHolderNum={placeholder_count!r}: expected an int in "
                    f"0..{MAX_PLACEHOLDERS}",
                )
            if type(placeholders_addr) is not int or not 0 < placeholders_addr <= _PTR_MAX:
                raise self._param(
                    name, f"placeHolderArray is NULL while placeHolderNum={placeholder_count}"
                )
            entries = read_placeholder_table(placeholders_addr, placeholder_count)
            problem = validate_placeholders(entries, args_size)
            if problem is not None:
                raise self._param(name, problem)
            self._launch_staged(f, num_blocks, block, s, args_addr, args_size, param_size, entries)
            return
        if type(placeholder_count) is not int or placeholder_count < 0:
            raise self._param(
                name, f"placeHolderNum={placeholder_count!r}: expected an int >= 0"
            )
        extra = tls.extra.set(args_addr, param_size) if param_size else 0
        (err,) = self._cuLaunchKernel(f.cu, num_blocks, 1, 1, block, 1, 1, 0, s.cu, None, extra)
        if int(err):
            self._raise(int(err), name)

    def _launch_staged(
        self,
        f: _Function,
        num_blocks: int,
        block: int,
        s: _Stream,
        args_addr: int,
        args_size: int,
        param_size: int,
        entries: list[tuple[int, int]],
    ) -> None:
        name = _LAUNCH
        with s.lock:
            ring = s.ring
            if ring is None:
                ring = s.ring = StagingRing(_StreamRingOps(self, s), self.staging_bytes)
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


def _hex(value: object) -> str:
    return f"{value:#x}" if isinstance(value, int) else repr(value)


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
    if driver is None:
        try:
            driver = _import_driver()
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the cuda backend needs cuda-bindings ({exc}); pip install 'aio_ascend[cuda]'"
            ) from exc
    try:
        with _INIT_LOCK:
            (err,) = driver.cuInit(0)
    except Exception as exc:
        raise BackendUnavailableError(
            f"the NVIDIA driver cannot be loaded: {type(exc).__name__}: {exc}", func="cuInit"
        ) from exc
    if int(err):
        raise BackendUnavailableError(
            f"cuInit failed: {cuda_error_name(int(err), driver)}", code=int(err), func="cuInit"
        )
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
        return CudaRuntime(
            driver,
            device_id,
            device,
            context,
            major * 10 + minor,
            block_dim=block_dim,
            staging_bytes=staging_bytes,
            compiler=compiler,
        )
    except BaseException:
        driver.cuDevicePrimaryCtxRelease(device)
        raise
