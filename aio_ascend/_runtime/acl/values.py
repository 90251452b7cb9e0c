"""Values for the ``acl`` backend's C calls: range checks, per-thread out-params, launch configs.

Every value is checked before it reaches a C type that would silently narrow it: the ACL argument
rules with the shared checks of :mod:`..abi`, plain C ranges (handles, sizes) here, as
``TypeError``/``ValueError``.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import byref, c_float, c_int, c_uint32, c_void_p
from typing import Any, NoReturn

from ..._errors import AscendError
from ..._launch_config import LaunchConfig
from ..abi import PTR_MAX, check_args, check_num_blocks, check_timeout, param_error
from . import ffi as ffi

__all__ = ["LAUNCH", "Scratch", "as_int", "cfg_arg", "check_launch", "in_range", "ptr", "timeout"]

LAUNCH = "aclrtLaunchKernelWithHostArgs"

# --- value checks (C ranges; the ACL rules are abi's) ----------------------------------------


def as_int(name: str, value: object) -> int:
    """``value`` as a Python int (``__index__`` accepted; bool and float refused)."""
    if type(value) is int:
        return value
    if isinstance(value, bool | float):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    index = getattr(type(value), "__index__", None)
    if index is None:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    result: int = index(value)
    return result


def in_range(name: str, value: object, low: int, high: int) -> int:
    number = as_int(name, value)
    if not low <= number <= high:
        raise ValueError(f"{name}={number} is out of range {low}..{high}")
    return number


def ptr(name: str, value: object) -> int:
    number = as_int(name, value)
    if not 0 <= number <= PTR_MAX:
        raise ValueError(f"{name}={number:#x} is not an address (0..2**64-1)")
    return number


def timeout(func: str, value: object) -> int:
    return check_timeout(func, as_int("timeout_ms", value))


# --- per-thread scratch out-params ----------------------------------------------------------


class Scratch(threading.local):
    """Out-parameters reused by the calls of one thread (never shared between threads)."""

    def __init__(self) -> None:
        self.handle = c_void_p()
        self.handle_ref = byref(self.handle)
        self.status = c_int()
        self.status_ref = byref(self.status)
        self.ms = c_float()
        self.ms_ref = byref(self.ms)
        self.task_id = c_uint32()
        self.task_id_ref = byref(self.task_id)


# --- launch configs -------------------------------------------------------------------------

# id(LaunchConfig) -> (the config, its attribute array, byref(cfg struct)); the config is kept
# so the id cannot be reused while its entry lives. The runtime only reads cfg during the call.
_CFG_CACHE: dict[int, tuple[LaunchConfig, Any, Any]] = {}
_CFG_CACHE_MAX = 256


def cfg_arg(cfg: object) -> Any:
    """The ``aclrtLaunchKernelCfg *`` for ``cfg`` (``None`` -> NULL; no attributes -> NULL)."""
    entry = _CFG_CACHE.get(id(cfg))
    if entry is not None and entry[0] is cfg:
        return entry[2]
    if not isinstance(cfg, LaunchConfig):
        raise param_error(LAUNCH, f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}")
    packed = cfg.pack_attrs()
    count = cfg.num_attrs
    if count == 0:
        # A cfg with no attributes means the same as none; the runtime wants attrs non-NULL.
        arg: Any = None
        attrs: Any = None
    else:
        attrs = (ffi.AclrtLaunchKernelAttr * count).from_buffer_copy(packed)
        struct = ffi.AclrtLaunchKernelCfg(
            ctypes.cast(attrs, ctypes.POINTER(ffi.AclrtLaunchKernelAttr)), count
        )
        arg = byref(struct)
    if len(_CFG_CACHE) >= _CFG_CACHE_MAX:
        _CFG_CACHE.clear()
    _CFG_CACHE[id(cfg)] = (cfg, attrs, arg)
    return arg


def check_launch(
    func: object,
    num_blocks: object,
    stream: object,
    args_addr: object,
    args_size: object,
    placeholders_addr: object,
    placeholder_count: object,
) -> tuple[int, int, int, int, int, int]:
    """The slow path of the launch checks: precise errors naming the argument."""
    blocks = check_num_blocks(LAUNCH, as_int("num_blocks", num_blocks))
    addr = as_int("args_addr", args_addr)
    if addr < 0:
        raise ValueError(f"args_addr={addr:#x} is not an address (0..2**64-1)")
    size = as_int("args_size", args_size)
    check_args(LAUNCH, addr, size)
    as_int("placeholder_count", placeholder_count)
    return (
        ptr("func", func),
        blocks,
        ptr("stream", stream),
        addr,
        size,
        ptr("placeholders_addr", placeholders_addr),
    )


def refusing(exc_type: type[AscendError], message: str) -> dict[str, Any]:
    """A function table whose every entry raises ``exc_type(message)``."""

    def make(name: str) -> Any:
        def refuse(*args: object) -> NoReturn:
            raise exc_type(message, func=name)

        return refuse

    return {name: make(name) for name in (*ffi.PROTOTYPES, *ffi.OPTIONAL_PROTOTYPES)}
