"""The ACL facts every layer shares, defined once: constants, limits, codes, argument checks.

Values are read off the CANN headers (``shared/docs/acl-abi/acl_abi_facts.json``); the ABI test
compares them with that file. The error numbers are defined once, in :class:`AclCode` of
``_errors.py`` (L0, which cannot import this module), and only named here. The launch attribute
ids are defined once, in :class:`~aio_ascend._launch_config.LaunchAttrId`.

The argument checks (``check_*``) are what every backend (``sim``, ``acl``, ``cuda``) runs
before its runtime sees a call, so the three refuse the same bad input with the same error: an
:class:`~aio_ascend._errors.InvalidParamError` with code 107000 (``ACL_ERROR_RT_PARAM_INVALID``),
the ACL function name as ``func``, and a message naming the argument both by its Python name and
by its ACL name (``num_blocks (numBlocks)=0 ...``).
"""

from __future__ import annotations

import ctypes
import enum
import os
import re
import struct
from collections.abc import Sequence
from typing import Any, Final

from .._errors import AclCode, InvalidParamError
from .._values import integer

__all__ = [
    "hex_or_repr",
    "ACL_DEV_ATTR_AICORE_CORE_NUM",
    "ACL_DEV_ATTR_CUBE_CORE_NUM",
    "ACL_DEV_ATTR_VECTOR_CORE_NUM",
    "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    "ACL_ERROR_RT_STREAM_CAPTURED",
    "ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED",
    "ACL_ERROR_RT_STREAM_NOT_CAPTURED",
    "ACL_MODEL_RI_CAPTURE_MODE_GLOBAL",
    "ACL_MODEL_RI_CAPTURE_MODE_RELAXED",
    "ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL",
    "ACL_PKG_NAME_CANN",
    "ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD",
    "ACL_RT_BINARY_LOAD_OPT_MAGIC",
    "ACL_RT_BINARY_MAGIC_ELF_AICORE",
    "ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE",
    "ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE",
    "ACL_RT_THREAD_LEVEL",
    "KernelType",
    "ACL_STREAM_CAPACITY",
    "ACL_CONTINUE_ON_FAILURE",
    "ACL_ERROR_INVALID_PARAM",
    "ACL_ERROR_REPEAT_INITIALIZE",
    "ACL_ERROR_RT_AICORE_EXCEPTION",
    "ACL_ERROR_RT_AICORE_TIMEOUT",
    "ACL_ERROR_RT_CONTEXT_NULL",
    "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
    "ACL_ERROR_RT_INVALID_HANDLE",
    "ACL_ERROR_RT_MEMORY_ALLOCATION",
    "ACL_ERROR_RT_PARAM_INVALID",
    "ACL_ERROR_RT_STREAM_ABORT",
    "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
    "ACL_ERROR_RT_SYMBOL_NOT_FOUND",
    "ACL_EVENT_CAPTURE_STREAM_PROGRESS",
    "ACL_EVENT_RECORDED_STATUS_COMPLETE",
    "ACL_EVENT_RECORDED_STATUS_NOT_READY",
    "ACL_EVENT_SYNC",
    "ACL_EVENT_TIME_LINE",
    "ACL_MEMCPY_DEVICE_TO_DEVICE",
    "ACL_MEMCPY_DEVICE_TO_HOST",
    "ACL_MEMCPY_HOST_TO_DEVICE",
    "ACL_MEM_MALLOC_HUGE_FIRST",
    "ACL_STOP_ON_FAILURE",
    "EVENT_FLAGS_MASK",
    "INT32_MAX",
    "INT32_MIN",
    "MAX_NUM_BLOCKS",
    "MAX_PLACEHOLDERS",
    "PARAM_KIND_SIZES",
    "PLACEHOLDER_INFO_SIZE",
    "PTR_MAX",
    "SIZE_MAX",
    "UINT32_MAX",
    "UINT64_MAX",
    "MALLOC_APPEND_SIZE",
    "check_alloc_size",
    "check_args",
    "check_device_id",
    "check_event_flags",
    "check_failure_mode",
    "binary_bytes",
    "check_binary_source",
    "is_bytes_like",
    "check_load_options",
    "load_keywords",
    "check_kernel_name",
    "check_memcpy",
    "check_num_blocks",
    "copy_fields_fit",
    "launch_fields_fit",
    "check_placeholder_count",
    "check_placeholder_entries",
    "check_placeholder_table",
    "check_table_addr",
    "check_timeout",
    "declare_params",
    "param_error",
    "placeholder_problem",
    "read_placeholder_table",
]

# --- error codes (defined in _errors.AclCode) ---------------------------------------------------

ACL_ERROR_INVALID_PARAM: Final[int] = AclCode.INVALID_PARAM.value
ACL_ERROR_REPEAT_INITIALIZE: Final[int] = AclCode.REPEAT_INITIALIZE.value
ACL_ERROR_RT_PARAM_INVALID: Final[int] = AclCode.RT_PARAM_INVALID.value
ACL_ERROR_RT_CONTEXT_NULL: Final[int] = AclCode.RT_CONTEXT_NULL.value
ACL_ERROR_RT_INVALID_HANDLE: Final[int] = AclCode.RT_INVALID_HANDLE.value
ACL_ERROR_RT_STREAM_ABORT: Final[int] = AclCode.RT_STREAM_ABORT.value
ACL_ERROR_RT_SYMBOL_NOT_FOUND: Final[int] = AclCode.RT_SYMBOL_NOT_FOUND.value
ACL_ERROR_RT_MEMORY_ALLOCATION: Final[int] = AclCode.RT_MEMORY_ALLOCATION.value
ACL_ERROR_RT_AICORE_TIMEOUT: Final[int] = AclCode.RT_AICORE_TIMEOUT.value
ACL_ERROR_RT_AICORE_EXCEPTION: Final[int] = AclCode.RT_AICORE_EXCEPTION.value
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: Final[int] = AclCode.RT_STREAM_SYNC_TIMEOUT.value
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: Final[int] = AclCode.RT_EVENT_SYNC_TIMEOUT.value
ACL_ERROR_RT_FEATURE_NOT_SUPPORT: Final[int] = AclCode.RT_FEATURE_NOT_SUPPORT.value
ACL_ERROR_RT_STREAM_CAPTURED: Final[int] = AclCode.RT_STREAM_CAPTURED.value
ACL_ERROR_RT_STREAM_NOT_CAPTURED: Final[int] = AclCode.RT_STREAM_NOT_CAPTURED.value
ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED: Final[int] = AclCode.RT_STREAM_CAPTURE_INVALIDATED.value

# --- enums and flags (acl_abi_facts.json) -------------------------------------------------------

# aclrtEventRecordedStatus (NOT the older aclrtEventStatus, whose values are the reverse)
ACL_EVENT_RECORDED_STATUS_NOT_READY: Final = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE: Final = 1
# event flags of aclrtCreateEventExWithFlag
ACL_EVENT_SYNC: Final = 0x01
ACL_EVENT_CAPTURE_STREAM_PROGRESS: Final = 0x02
ACL_EVENT_TIME_LINE: Final = 0x08
#: every flag bit the headers define (ACL_EVENT_SYNC .. ACL_EVENT_EXTERNAL and neighbours)
EVENT_FLAGS_MASK: Final = 0x7F
# aclrtSetStreamFailureMode
ACL_CONTINUE_ON_FAILURE: Final = 0
ACL_STOP_ON_FAILURE: Final = 1
# aclrtMemcpyKind
ACL_MEMCPY_HOST_TO_DEVICE: Final = 1
ACL_MEMCPY_DEVICE_TO_HOST: Final = 2
ACL_MEMCPY_DEVICE_TO_DEVICE: Final = 3
# aclrtMemMallocPolicy
ACL_MEM_MALLOC_HUGE_FIRST: Final = 0
# aclCANNPackageName (aclsysGetCANNVersion; acl_prototypes_more.json "types")
ACL_PKG_NAME_CANN: Final = 0
# aclrtDevAttr (aclrtGetDeviceInfo; acl_prototypes_more.json "types")
ACL_DEV_ATTR_AICORE_CORE_NUM: Final = 101
ACL_DEV_ATTR_CUBE_CORE_NUM: Final = 102
ACL_DEV_ATTR_VECTOR_CORE_NUM: Final = 201
# aclrtLastErrLevel (aclrtGetLastError / aclrtPeekAtLastError)
ACL_RT_THREAD_LEVEL: Final = 0
# aclmdlRICaptureMode (aclmdlRICaptureBegin; acl_prototypes_more.json "types")
ACL_MODEL_RI_CAPTURE_MODE_GLOBAL: Final = 0
ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL: Final = 1
ACL_MODEL_RI_CAPTURE_MODE_RELAXED: Final = 2
# aclrtBinaryLoadOptionType and the magics of ACL_RT_BINARY_LOAD_OPT_MAGIC (cann-support.md §5.1:
# the CANN 8.5.0+ headers)
ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD: Final = 1
ACL_RT_BINARY_LOAD_OPT_MAGIC: Final = 2
ACL_RT_BINARY_MAGIC_ELF_AICORE: Final = 0x43554245
ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE: Final = 0x41415246
ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE: Final = 0x41494343


class KernelType(enum.Enum):
    """What a kernel binary loaded from bytes holds (``load_module(kernel_type=...)``).

    The value is the ``ACL_RT_BINARY_LOAD_OPT_MAGIC`` magic. There is no MIX magic: on Atlas
    A2/A3 (cube and vector cores apart) the AI Core magic means MIX to the runtime
    (``Magic2KernelAttrType``), and without a magic it assumes CUBE (cann-support.md §5.3).
    ``MIX`` also tells the library to supply the kernel's hidden arguments (§4).
    """

    AICORE = "aicore"
    VECTOR = "vector"
    CUBE = "cube"
    MIX = "mix"

    @property
    def magic(self) -> int:
        """The ``aclrtBinaryLoadOptionValue.magic`` for this type."""
        return _KERNEL_MAGICS[self]

    @classmethod
    def coerce(cls, value: object) -> KernelType:
        """A ``KernelType`` from itself or its name; ``ValueError``/``TypeError`` otherwise."""
        if isinstance(value, KernelType):
            return value
        if not isinstance(value, str):
            raise TypeError(f"kernel_type must be a str, got {type(value).__name__}")
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(repr(kind.value) for kind in cls)
            raise ValueError(f"kernel_type={value!r}: expected one of {names}") from None


def check_load_options(kernel_type: object, lazy: object) -> tuple[KernelType | None, bool | None]:
    """The load options of ``load_binary`` as values, checked alike on every backend
    (``ValueError``/``TypeError`` naming the field)."""
    kind = None if kernel_type is None else KernelType.coerce(kernel_type)
    if lazy is not None and not isinstance(lazy, bool):
        raise TypeError(f"lazy must be a bool or None, got {type(lazy).__name__}")
    return kind, lazy


def load_keywords(kernel_type: object, lazy: object) -> tuple[KernelType | None, dict[str, Any]]:
    """:func:`check_load_options`'s values: the kernel type, and ``load_binary``'s keywords."""
    kind, lazy = check_load_options(kernel_type, lazy)
    return kind, {"kernel_type": kind, "lazy": lazy}


def is_bytes_like(source: object) -> bool:
    """Whether ``source`` is binary data: any object with the buffer protocol (``bytes``,
    ``bytearray``, ``memoryview``, a NumPy array, ``array.array``...) whose items hold no
    Python objects (a NumPy object array's buffer holds pointers); ``bytes(source)`` is its
    data then."""
    if isinstance(source, bytes | bytearray):
        return True
    if isinstance(source, str):
        return False
    try:
        view = memoryview(source)  # type: ignore[arg-type]
        item_format = view.format
    except ValueError:
        return isinstance(source, memoryview)  # (released: its use says so)
    except TypeError:  # no buffer (NumPy cannot export some either: datetime64)
        return False
    return "O" not in _FIELD_NAMES.sub("", item_format)


#: the field names of a struct format (``T{<i:count:}``), which may hold any letter
_FIELD_NAMES: Final = re.compile(r":[^:]*:")


def binary_bytes(source: object) -> bytes | None:
    """The data of a bytes-like ``source`` (:func:`is_bytes_like`; a copy unless it is
    ``bytes``), ``None`` for any other source."""
    if isinstance(source, bytes):
        return source
    if not is_bytes_like(source):
        return None
    return memoryview(source).tobytes()  # type: ignore[arg-type]


def check_binary_source(source: object) -> None:
    """What every backend refuses alike before its loader sees ``source``: empty binary data
    (``ValueError``), an empty path (not the current directory: ``ValueError``) and a path with
    no file (``FileNotFoundError``). Which sources a backend loads is its own."""
    if is_bytes_like(source):
        if not memoryview(source).nbytes:  # type: ignore[arg-type]
            raise ValueError("load_binary: the kernel binary data is empty")
    elif isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not path:
            raise ValueError("load_binary: the path is empty")
        if "\0" in path:
            raise ValueError(f"load_binary: the path {path!r} holds a NUL")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"load_binary: no kernel binary at {os.path.abspath(path)!r}")


def check_kernel_name(name: object) -> bytes:
    """A kernel name as the runtime takes it (UTF-8, no NUL), checked alike on every backend
    (``TypeError``/``ValueError``) before any lookup."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        encoded = b""
    if not encoded or b"\0" in encoded:
        raise ValueError(f"name={name!r} is not a valid kernel name (UTF-8, not empty, no NUL)")
    return encoded


_KERNEL_MAGICS: Final = {
    KernelType.AICORE: ACL_RT_BINARY_MAGIC_ELF_AICORE,
    KernelType.VECTOR: ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE,
    KernelType.CUBE: ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE,
    KernelType.MIX: ACL_RT_BINARY_MAGIC_ELF_AICORE,
}

# --- limits -------------------------------------------------------------------------------------

UINT32_MAX: Final = 2**32 - 1
UINT64_MAX: Final = 2**64 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
SIZE_MAX: Final = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
PTR_MAX: Final = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1
#: What ``aclrtMalloc`` adds to a size before it aligns it: 32 for the alignment and the SoC's
#: padding (32 unless its spec says otherwise); a size whose sum overflows ``size_t`` is refused
#: with ACL_ERROR_INVALID_PARAM (``src/acl/aclrt_impl/memory.cpp:297-302``,
#: ``GetAlignedAndPaddingSize``). ``aclrtMallocHost`` adds nothing.
MALLOC_APPEND_SIZE: Final = 64

#: ``numBlocks`` must lie in 1..MAX_NUM_BLOCKS (the HostArgs path casts it to uint16).
MAX_NUM_BLOCKS: Final = 65535
#: ``placeHolderNum`` cap of every backend. The HostArgs launch path documents no cap of its own
#: (``api_error.cc`` checks only the offsets), but each placeholder fills one pointer parameter
#: of the kernel and a kernel has at most 128 parameters (the argsHandle API's limit:
#: ``docs/cann-support.md`` §2.1): a longer table cannot belong to a real kernel. ``HostArgs``
#: refuses more than 128 by default too.
MAX_PLACEHOLDERS: Final = 128
#: ``sizeof(aclrtPlaceHolderInfo)``: two uint32 (addrOffset, dataOffset).
PLACEHOLDER_INFO_SIZE: Final = 8
#: the entry budget of a stream: below every queue depth known for the supported chips (2013
#: maxTaskNumPerStream on A2/A3, 2042 on Atlas training, 2014 on 950, 1,792 usable slots
#: reported on A2/A3 with CANN 9.0.0; an ini's normalStreamDepth may set less: cann-support.md
#: §12.1). Every launch, copy, event record or wait takes one entry.
ACL_STREAM_CAPACITY: Final = 1536

#: bytes of each kind of kernel parameter, by the name of the ``HostArgs`` setter that packs it
#: (a placeholder is a pointer parameter)
PARAM_KIND_SIZES: Final[dict[str, int]] = {
    "ptr": 8,
    "placeholder": 8,
    "u64": 8,
    "i64": 8,
    "f64": 8,
    "u32": 4,
    "i32": 4,
    "f32": 4,
    "u16": 2,
    "i16": 2,
    "f16": 2,
    "u8": 1,
    "i8": 1,
    "bool": 1,
}

_PLACEHOLDER_INFO = struct.Struct("<II")
assert _PLACEHOLDER_INFO.size == PLACEHOLDER_INFO_SIZE

# --- argument checks ----------------------------------------------------------------------------


def declare_params(what: str, params: object) -> tuple[tuple[int, int], ...]:
    """A kernel's declared parameters as ``(offset, size)`` pairs (C natural layout, as
    ``aclrtFunctionGetParamInfo`` reports them), from a sequence of kinds (the name of the
    ``HostArgs`` setter: ``"ptr"``, ``"u32"`` ...) or byte sizes (``raw`` fields).

    ``TypeError``/``ValueError`` naming ``what`` for anything else: a declaration is checked
    when it is made, not when a launch first meets it.
    """
    if isinstance(params, str | bytes) or not isinstance(params, Sequence):
        raise TypeError(
            f"{what}: params must be a sequence of kinds (str) or sizes (int), "
            f"got {type(params).__name__}"
        )
    kinds = ", ".join(repr(kind) for kind in PARAM_KIND_SIZES)
    declared: list[tuple[int, int]] = []
    cursor = 0
    for index, param in enumerate(params):
        if isinstance(param, str):
            size = PARAM_KIND_SIZES.get(param)
            if size is None:
                raise ValueError(
                    f"{what}: parameter {index} has kind {param!r}; expected one of {kinds} "
                    "or a size in bytes"
                )
            align = size
        elif isinstance(param, int) and not isinstance(param, bool):
            if param <= 0:
                raise ValueError(f"{what}: parameter {index} has size {param}; sizes are >= 1")
            size, align = param, 1
        else:
            raise TypeError(
                f"{what}: parameter {index} must be a kind (str) or a size (int), "
                f"got {type(param).__name__}"
            )
        cursor = (cursor + align - 1) // align * align
        declared.append((cursor, size))
        cursor += size
    return tuple(declared)


def hex_or_repr(value: object) -> str:
    """A handle or address for a message: hex for an int, ``repr`` for anything else."""
    return f"{value:#x}" if isinstance(value, int) else repr(value)


def param_error(func: str, message: str) -> InvalidParamError:
    """The error every backend raises for an argument it refuses (107000, named ``func``)."""
    return InvalidParamError(message, code=ACL_ERROR_RT_PARAM_INVALID, func=func)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_device_id(device_id: object) -> int:
    """A device id, the library's rule for every backend: an int (``TypeError``) in
    0..INT32_MAX (``ValueError``: ``aclrtSetDevice`` takes an ``int32_t``)."""
    device_id = integer("device_id", device_id)
    if not 0 <= device_id <= INT32_MAX:
        raise ValueError(f"device_id must be an int in 0..{INT32_MAX}, got {device_id!r}")
    return device_id


def check_timeout(func: str, timeout_ms: object) -> int:
    """The timeout rule of ``aclrtSynchronize{Stream,Event}WithTimeout``: -1 (forever) or
    1..INT32_MAX ms. 0 does not mean "poll": the runtime rejects it (use the query calls)."""
    if not _is_int(timeout_ms):
        raise param_error(func, f"timeout_ms={timeout_ms!r}: expected an int (ms)")
    assert isinstance(timeout_ms, int)
    if timeout_ms == 0 or timeout_ms < -1:
        raise param_error(
            func,
            f"timeout_ms={timeout_ms}: must be -1 (forever) or > 0 ms; use the query calls to poll",
        )
    if timeout_ms > INT32_MAX:
        raise param_error(func, f"timeout_ms={timeout_ms} does not fit int32 (max {INT32_MAX})")
    return timeout_ms


def launch_fields_fit(
    func: object,
    num_blocks: object,
    stream: object,
    args_addr: object,
    args_size: object,
    placeholders_addr: object,
    placeholder_count: object,
) -> bool:
    """Whether every field of a host-args launch is a plain int in its range: the hot paths'
    one question (the sim, the acl backend), answered by the same ranges that
    :func:`check_num_blocks`, :func:`check_args` and :func:`check_placeholder_count` word one
    by one; a caller calls those (or its own slow path) only when this says no. Handles are
    only range-checked here: a backend looks them up."""
    return (
        type(func) is int
        and type(num_blocks) is int
        and type(stream) is int
        and type(args_addr) is int
        and type(args_size) is int
        and type(placeholders_addr) is int
        and type(placeholder_count) is int
        and 0 <= func <= PTR_MAX
        and 0 <= stream <= PTR_MAX
        and 0 < args_addr <= PTR_MAX
        and 0 <= placeholders_addr <= PTR_MAX
        and 1 <= num_blocks <= MAX_NUM_BLOCKS
        and 1 <= args_size <= UINT32_MAX
        and 0 <= placeholder_count <= MAX_PLACEHOLDERS
    )


def check_num_blocks(func: str, num_blocks: object) -> int:
    """``numBlocks`` in 1..MAX_NUM_BLOCKS: refuse, never let the runtime wrap it to uint16."""
    if not _is_int(num_blocks) or not 1 <= num_blocks <= MAX_NUM_BLOCKS:  # type: ignore[operator]
        raise param_error(
            func, f"num_blocks (numBlocks)={num_blocks!r}: expected an int in 1..{MAX_NUM_BLOCKS}"
        )
    assert isinstance(num_blocks, int)
    return num_blocks


def check_args(func: str, args_addr: object, args_size: object) -> None:
    """``hostArgs`` non-NULL; ``argsSize`` in 1..UINT32_MAX (the runtime uses it as uint32)."""
    if not _is_int(args_addr) or not 0 < args_addr <= PTR_MAX:  # type: ignore[operator]
        raise param_error(
            func, f"args_addr (hostArgs)={args_addr!r}: the args buffer address is NULL or invalid"
        )
    if not _is_int(args_size) or not 1 <= args_size <= UINT32_MAX:  # type: ignore[operator]
        raise param_error(
            func, f"args_size (argsSize)={args_size!r}: expected an int in 1..{UINT32_MAX}"
        )


def check_placeholder_count(func: str, count: object) -> int:
    """``placeHolderNum`` in 0..MAX_PLACEHOLDERS."""
    if not _is_int(count) or not 0 <= count <= MAX_PLACEHOLDERS:  # type: ignore[operator]
        raise param_error(
            func,
            f"placeholder_count (placeHolderNum)={count!r}: expected an int in "
            f"0..{MAX_PLACEHOLDERS}",
        )
    assert isinstance(count, int)
    return count


def placeholder_problem(entries: Sequence[tuple[int, int]], args_size: int) -> str | None:
    """``None`` if every ``(addrOffset, dataOffset)`` entry is valid for an args buffer of
    ``args_size`` bytes, else a message naming the first invalid field.

    The runtime itself rejects ``addrOffset >= argsSize`` and ``dataOffset >= argsSize``
    (``api_error.cc::CheckArgs``); the backends are stricter: the 8-byte slot must lie inside
    the buffer, and both offsets must be 8-aligned (else the kernel gets a misaligned pointer).
    """
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


def check_placeholder_entries(
    func: str, entries: Sequence[tuple[int, int]], args_size: int
) -> None:
    """Raise for the first invalid entry (see :func:`placeholder_problem`)."""
    for addr_offset, data_offset in entries:
        if (
            (addr_offset | data_offset) & 7
            or addr_offset + 8 > args_size
            or (data_offset >= args_size)
        ):
            problem = placeholder_problem(entries, args_size)
            assert problem is not None
            raise param_error(func, problem)


def read_placeholder_table(table_addr: int, count: int) -> list[tuple[int, int]]:
    """The ``(addrOffset, dataOffset)`` entries of an ``aclrtPlaceHolderInfo`` host array."""
    raw = ctypes.string_at(table_addr, PLACEHOLDER_INFO_SIZE * count)
    return list(_PLACEHOLDER_INFO.iter_unpack(raw))


def check_table_addr(func: str, table_addr: object, count: int) -> int:
    """``placeHolderArray`` must not be NULL when ``placeHolderNum`` is not 0."""
    if not _is_int(table_addr) or not 0 < table_addr <= PTR_MAX:  # type: ignore[operator]
        raise param_error(func, f"placeHolderArray is NULL while placeHolderNum={count}")
    assert isinstance(table_addr, int)
    return table_addr


def check_placeholder_table(
    func: str, table_addr: object, count: object, args_size: int
) -> list[tuple[int, int]]:
    """Check ``placeHolderNum`` and a table in host memory; return its entries.

    For a non-zero count: the table must be non-NULL, and every entry valid for ``args_size``
    (:func:`placeholder_problem`). The table is read during the call, as the runtime reads it.
    """
    number = check_placeholder_count(func, count)
    if not number:
        return []
    table_addr = check_table_addr(func, table_addr, number)
    entries = read_placeholder_table(table_addr, number)
    check_placeholder_entries(func, entries, args_size)
    return entries


def check_event_flags(func: str, flags: object) -> int:
    """``aclrtCreateEventExWithFlag``'s flag: a combination of the ``ACL_EVENT_*`` bits."""
    if not _is_int(flags) or not 0 <= flags <= EVENT_FLAGS_MASK:  # type: ignore[operator]
        raise param_error(
            func, f"flags (flag)={flags!r}: expected a combination of ACL_EVENT_* bits"
        )
    assert isinstance(flags, int)
    return flags


def check_failure_mode(func: str, mode: object) -> int:
    """``aclrtSetStreamFailureMode``: ACL_CONTINUE_ON_FAILURE (0) or ACL_STOP_ON_FAILURE (1)."""
    if not _is_int(mode) or mode not in (ACL_CONTINUE_ON_FAILURE, ACL_STOP_ON_FAILURE):
        raise param_error(func, f"mode={mode!r}: expected 0 (continue) or 1 (stop on failure)")
    assert isinstance(mode, int)
    return mode


def check_alloc_size(func: str, size: object, append: int = 0) -> int:
    """``aclrtMalloc``/``aclrtMallocHost`` size: an int in 1..SIZE_MAX - ``append`` (what the
    call adds before aligning: :data:`MALLOC_APPEND_SIZE` for device memory)."""
    limit = SIZE_MAX - append
    if not _is_int(size) or not 0 < size <= limit:  # type: ignore[operator]
        raise param_error(func, f"size={size!r}: expected an int in 1..{limit}")
    assert isinstance(size, int)
    return size


def copy_fields_fit(
    dst: object, dst_max: object, src: object, count: object, kind: object, stream: object
) -> bool:
    """Whether every field of an ``aclrtMemcpyAsync`` is a plain int in its range: the fast
    question, answered by the ranges :func:`check_memcpy` words (the stream handle is only
    range-checked)."""
    return (
        type(dst) is int
        and type(dst_max) is int
        and type(src) is int
        and type(count) is int
        and type(kind) is int
        and type(stream) is int
        and 0 < dst <= PTR_MAX
        and 0 < src <= PTR_MAX
        and 0 <= stream <= PTR_MAX
        and 0 <= count <= dst_max <= SIZE_MAX
        and ACL_MEMCPY_HOST_TO_DEVICE <= kind <= ACL_MEMCPY_DEVICE_TO_DEVICE
    )


def check_memcpy(
    func: str, dst: object, dst_max: object, src: object, count: object, kind: object
) -> None:
    """``aclrtMemcpyAsync``: sizes in 0..SIZE_MAX with ``count <= destMax``, non-NULL
    pointers, and one of the three ``ACL_MEMCPY_*`` kinds."""
    for name, value in (("dst_max (destMax)", dst_max), ("count", count)):
        if not _is_int(value) or not 0 <= value <= SIZE_MAX:  # type: ignore[operator]
            raise param_error(func, f"{name}={value!r}: expected an int in 0..{SIZE_MAX}")
    if count > dst_max:  # type: ignore[operator]
        raise param_error(func, f"count={count} is larger than destMax={dst_max}")
    for name, value in (("dst", dst), ("src", src)):
        if not _is_int(value) or not 0 < value <= PTR_MAX:  # type: ignore[operator]
            raise param_error(func, f"{name}={value!r} is a NULL or invalid pointer")
    if not _is_int(kind) or kind not in (
        ACL_MEMCPY_HOST_TO_DEVICE,
        ACL_MEMCPY_DEVICE_TO_HOST,
        ACL_MEMCPY_DEVICE_TO_DEVICE,
    ):
        raise param_error(
            func,
            f"kind={kind!r}: expected 1 (host to device), 2 (device to host) or 3 "
            "(device to device)",
        )
