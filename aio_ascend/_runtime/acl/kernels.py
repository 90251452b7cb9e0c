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
  on), and the hidden arguments of a MIX kernel that the host-args path must supply itself: the
  inter-core sync address (``aclrtGetHardwareSyncAddr``) in slot 0 and the context's overflow
  address (``aclrtCtxGetFloatOverflowAddr``) after the parameters. On the args-handle path
  ``aclrtKernelArgsFinalize`` writes both, and the placeholder data must follow the parameters
  (``FunctionInfo.data_align``). On the device-args path (CANN 8.0) neither address can be read
  (both getters are 8.5+) and ``aclrtLaunchKernel`` adds nothing, so a MIX kernel is refused
  (``BackendUnavailableError``) when its function is looked up.
"""

from __future__ import annotations

import json
import os
from ctypes import byref, c_size_t, c_void_p
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

__all__ = ["json_kernel_type", "load_options", "read_function_info"]

#: alignment of placeholder data blocks on the args-handle path (the runtime 8-aligns them)
ARGS_HANDLE_DATA_ALIGN = 8


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


def read_function_info(
    fn: dict[str, Any],
    has: Any,
    func: int,
    kind: KernelType | None,
    path: LaunchPath,
) -> FunctionInfo:
    """What the host args of ``func`` (from a binary of type ``kind``) must follow on ``path``."""
    params = None
    if has("aclrtFunctionGetParamCount") and has("aclrtFunctionGetParamInfo"):
        params = _param_info(fn, func)
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    data_align = None
    if path is LaunchPath.DEVICE_ARGS:
        if kind is KernelType.MIX:
            raise BackendUnavailableError(
                "a MIX kernel needs the inter-core sync and overflow addresses among its args "
                "(docs/cann-support.md §4), and this CANN release (device-args path, 8.0) can "
                "neither read them (aclrtGetHardwareSyncAddr, aclrtCtxGetFloatOverflowAddr: "
                "8.5+) nor have the runtime add them (aclrtKernelArgsFinalize: 8.1+)",
                func="aclrtGetHardwareSyncAddr",
            )
    elif path is LaunchPath.ARGS_HANDLE:
        data_align = ARGS_HANDLE_DATA_ALIGN  # Finalize adds the hidden arguments itself
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
