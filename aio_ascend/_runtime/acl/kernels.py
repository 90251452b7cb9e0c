"""Kernel binaries on the ``acl`` backend: load options, kernel types, what a function needs.

* **Load options** (``docs/cann-support.md`` §5): ``kernel_type`` becomes
  ``ACL_RT_BINARY_LOAD_OPT_MAGIC`` with the matching magic, ``lazy`` becomes
  ``ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD``. The runtime refuses the magic for a file
  (``binary_loader.cc``: "RT_LOAD_BINARY_OPT_MAGIC does not support in load from file"): a file's
  kernel type comes from the JSON the compiler writes beside it, so a ``kernel_type`` for a path
  is refused here, before the runtime, with that reason.
* **Kernel type of a file**: read from ``<name>.json`` beside ``<name>.o`` as the runtime reads
  it (its ``"magic"``, ``"intercoreSync"``): a MIX kernel needs hidden arguments (§4).
* **Function info**: the parameters ``aclrtFunctionGetParamCount``/``GetParamInfo`` report (9.1
  on), and the hidden arguments the host-args path must supply itself. The runtime decides them
  per kernel from its ELF metadata (a kernel with cross-core sync or of a MIX type gets the
  inter-core sync slot in front, unless its ELF carries its own ``g_sysFftsAddr``; every non-CPU
  kernel gets the overflow slot after its parameters), so the library asks the runtime
  (:func:`probe_hidden_args`): it builds the kernel's args in a buffer of its own with
  ``aclrtKernelArgsInitByUserMem`` + an ``Append`` of a marker + ``Finalize`` and reads back the
  leading slots, the sync address and the overflow slot, once per function. Where the probe's
  functions are missing it falls back to the load magic: the sync address
  (``aclrtGetHardwareSyncAddr``) in slot 0 and the overflow address
  (``aclrtCtxGetFloatOverflowAddr``) after the parameters of a MIX kernel. On the args-handle
  path ``aclrtKernelArgsFinalize`` writes both, and the placeholder data must follow the
  parameters (``FunctionInfo.data_align``). On the device-args path (CANN 8.0) neither address
  can be read (both getters are 8.5+) and ``aclrtLaunchKernel`` adds nothing, so a MIX kernel is
  refused (``BackendUnavailableError``) when its function is looked up.
"""

from __future__ import annotations

import ctypes
import json
import os
from ctypes import byref, c_size_t, c_uint64, c_void_p
from typing import Any

from ..._errors import BackendUnavailableError, RuntimeAPIError
from ..abi import (
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD,
    ACL_RT_BINARY_LOAD_OPT_MAGIC,
    KernelType,
)
from ..base import PLAIN_FUNCTION, FunctionInfo
from . import ffi as ffi
from .paths import LaunchPath

__all__ = [
    "PROBE_SYMBOLS",
    "json_kernel_type",
    "load_options",
    "probe_hidden_args",
    "read_function_info",
]

#: alignment of placeholder data blocks on the args-handle path (the runtime 8-aligns them)
ARGS_HANDLE_DATA_ALIGN = 8

#: what :func:`probe_hidden_args` calls
PROBE_SYMBOLS = (
    "aclrtKernelArgsGetHandleMemSize",
    "aclrtKernelArgsGetMemSize",
    "aclrtKernelArgsInitByUserMem",
    "aclrtKernelArgsAppend",
    "aclrtKernelArgsFinalize",
)
#: the probe's parameter, found again in the buffer after the leading system slots
_MARKER = 0xA10A5CE70D0B1E5A
#: the byte the probe's buffer is filled with: a slot still holding it was not written
_FILL = 0x5E
_UNWRITTEN = int.from_bytes(bytes([_FILL]) * 8, "little")


def load_options(
    kind: KernelType | None, lazy: bool | None, *, from_file: bool
) -> ffi.AclrtBinaryLoadOptions | None:
    """The ``aclrtBinaryLoadOptions`` for ``kind`` and ``lazy`` (``None``: no options)."""
    if kind is not None and from_file:
        raise ValueError(
            f"kernel_type={kind.value!r} cannot be given for a kernel file: the runtime refuses "
            "the magic option when loading from a file (aclrtBinaryLoadFromFile: "
            "'RT_LOAD_BINARY_OPT_MAGIC does not support in load from file'); the JSON the "
            "compiler writes beside the .o gives its kernel type. Load the bytes instead to "
            "choose it."
        )
    entries: list[tuple[int, int]] = []
    if lazy is not None:
        entries.append((ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD, int(lazy)))
    if kind is not None:
        entries.append((ACL_RT_BINARY_LOAD_OPT_MAGIC, kind.magic))
    if not entries:
        return None
    array = (ffi.AclrtBinaryLoadOption * len(entries))()
    for option, (kind_id, value) in zip(array, entries, strict=True):
        option.type = kind_id
        option.value.rsv[0] = value  # isLazyLoad and magic are both the first uint32
    return ffi.AclrtBinaryLoadOptions(array, len(entries))  # keeps the array referenced


def json_kernel_type(path: str) -> KernelType | None:
    """The kernel type the JSON beside a kernel file gives, as the runtime reads it
    (``<name>.json`` for ``<name>.o``; ``jsonMagic > optionMagic > defaultMagic``): a MIX magic
    or ``"intercoreSync": 1`` is MIX; ``None`` without a JSON or a magic it names."""
    stem, _ = os.path.splitext(path)
    try:
        with open(stem + ".json", encoding="utf-8") as file:
            meta = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    magic = str(meta.get("magic", ""))
    if "MIX" in magic or meta.get("intercoreSync") == 1:
        return KernelType.MIX
    if magic.endswith("_AIVEC"):
        return KernelType.VECTOR
    if magic.endswith("_AICUBE"):
        return KernelType.CUBE
    if magic == "RT_DEV_BINARY_MAGIC_ELF":
        return KernelType.AICORE
    return None


def _param_info(fn: dict[str, Any], func: int) -> tuple[tuple[int, int], ...] | None:
    """``(offset, size)`` per parameter (``None`` when the binary carries no metadata)."""
    count = c_size_t()
    try:
        fn["aclrtFunctionGetParamCount"](func, byref(count))
        params = []
        offset, size = c_size_t(), c_size_t()
        for index in range(count.value):
            fn["aclrtFunctionGetParamInfo"](func, index, byref(offset), byref(size))
            params.append((int(offset.value), int(size.value)))
    except RuntimeAPIError:
        return None
    return tuple(params)


def _address(fn: dict[str, Any], name: str) -> int | None:
    """``name(void **)``'s address; ``None`` where the chip lacks the feature (207000)."""
    out = c_void_p()
    try:
        fn[name](byref(out))
    except RuntimeAPIError as exc:
        if exc.code == ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
            return None
        raise
    return out.value or None


def probe_hidden_args(
    fn: dict[str, Any], func: int, overflow: int | None
) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """The hidden arguments the runtime lays out for ``func``: ``(prefix, suffix)``, and whether
    the kernel takes parameters at all.

    ``aclrtKernelArgsInitByUserMem`` builds the kernel's args handle over a buffer of ours
    (filled with :data:`_FILL`; the runtime writes nothing at init) and reserves the leading
    system slots; one 8-byte marker is appended after them, and ``Finalize`` writes the sync
    address into slot 0 (where the chip has it) and the overflow address into the next 8-aligned
    slot after the marker. The marker's offset gives the leading slots (a reserved slot the
    runtime left unwritten is passed as 0), the slot after it the overflow argument. A kernel
    that takes no parameters refuses the marker (the handle's ``maxUserParamNum`` is the kernel's
    parameter count); its overflow slot then directly follows the leading ones, found by its
    value (``overflow``, the context's address) where it is known.
    """
    handle_size, buffer_size = c_size_t(), c_size_t()
    fn["aclrtKernelArgsGetHandleMemSize"](func, byref(handle_size))
    fn["aclrtKernelArgsGetMemSize"](func, 8, byref(buffer_size))
    size = max(int(buffer_size.value), 8 * 16)
    handle = ctypes.create_string_buffer(max(int(handle_size.value), 1))
    buffer = ctypes.create_string_buffer(bytes([_FILL]) * size, size)
    fn["aclrtKernelArgsInitByUserMem"](func, handle, buffer, size)
    marker, param = c_uint64(_MARKER), c_void_p()
    try:
        fn["aclrtKernelArgsAppend"](handle, byref(marker), 8, byref(param))
        appended = True
    except RuntimeAPIError:  # no user parameters: maxUserParamNum is 0
        appended = False
    fn["aclrtKernelArgsFinalize"](handle)
    raw = buffer.raw
    slots = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, size - 7, 8)]
    if appended:
        lead = slots.index(_MARKER)
        tail = lead + 1
    else:
        written = [i for i, value in enumerate(slots) if value != _UNWRITTEN]
        if overflow is not None and overflow in slots:
            lead = slots.index(overflow)
        else:  # the overflow slot is the last one written (after at most one sync slot)
            lead = written[-1] if written else 0
        tail = lead
    prefix = tuple(0 if value == _UNWRITTEN else value for value in slots[:lead])
    suffix = () if tail >= len(slots) or slots[tail] == _UNWRITTEN else (slots[tail],)
    return prefix, suffix, appended


def read_function_info(
    fn: dict[str, Any],
    has: Any,
    func: int,
    kind: KernelType | None,
    path: LaunchPath,
    overflow: int | None = None,
) -> FunctionInfo:
    """What the host args of ``func`` (from a binary of type ``kind``) must follow on ``path``.

    ``overflow``: on the device-args path, the address passed as the trailing overflow argument.
    On the args-handle path a kernel that takes no parameters is given ``params=()`` when the
    probe can tell: an empty ``HostArgs`` is then launched without any ``Append`` (one 8-byte
    argument would move the overflow slot the runtime appends after the parameters)."""
    params = None
    if has("aclrtFunctionGetParamCount") and has("aclrtFunctionGetParamInfo"):
        params = _param_info(fn, func)
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    data_align = None
    hidden: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    if path is not LaunchPath.DEVICE_ARGS and all(has(name) for name in PROBE_SYMBOLS):
        known = None
        if has("aclrtCtxGetFloatOverflowAddr"):
            known = _address(fn, "aclrtCtxGetFloatOverflowAddr")
        try:
            lead, tail, takes_params = probe_hidden_args(fn, func, known)
        except RuntimeAPIError:
            pass  # a runtime that cannot answer: the load magic decides, as before
        else:
            hidden = (lead, tail)
            if not takes_params and params is None and path is LaunchPath.ARGS_HANDLE:
                params = ()
    if path is LaunchPath.DEVICE_ARGS:
        if kind is KernelType.MIX:
            raise BackendUnavailableError(
                "a MIX kernel needs the inter-core sync and overflow addresses among its args "
                "(docs/cann-support.md §4), and this CANN release (device-args path, 8.0) can "
                "neither read them (aclrtGetHardwareSyncAddr, aclrtCtxGetFloatOverflowAddr: "
                "8.5+) nor have the runtime add them (aclrtKernelArgsFinalize: 8.1+)",
                func="aclrtGetHardwareSyncAddr",
            )
        suffix = () if overflow is None else (overflow,)
    elif path is LaunchPath.ARGS_HANDLE:
        data_align = ARGS_HANDLE_DATA_ALIGN  # Finalize adds the hidden arguments itself
    elif hidden is not None:
        prefix, suffix = hidden
    elif kind in (KernelType.MIX, KernelType.AICORE):
        # The AI Core magic means MIX on chips with the inter-core sync feature (A2/A3), which
        # are those where aclrtGetHardwareSyncAddr answers (cann-support.md §4.3, §5.3).
        sync = _address(fn, "aclrtGetHardwareSyncAddr")
        if sync is not None:
            prefix = (sync,)
        if sync is not None or kind is KernelType.MIX:
            overflow = _address(fn, "aclrtCtxGetFloatOverflowAddr")
            suffix = () if overflow is None else (overflow,)
    info = FunctionInfo(params, prefix, suffix, data_align, None if kind is None else kind.value)
    return PLAIN_FUNCTION if info == PLAIN_FUNCTION else info
