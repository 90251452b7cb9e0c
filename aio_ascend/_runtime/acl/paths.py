"""Which launch path a CANN release offers, chosen by the symbols its library exports.

Three ways to launch a kernel exist across CANN releases (``docs/cann-support.md`` §2):

* **host args** (``aclrtLaunchKernelWithHostArgs``, CANN 8.5.0 on): one host buffer, copied by
  the runtime, placeholders patched into it; what the runtime seam mirrors;
* **args handle** (``aclrtKernelArgsInit``/``Append``/``AppendPlaceHolder``/
  ``GetPlaceHolderBuffer``/``Finalize`` + ``aclrtLaunchKernelWithConfig``, CANN 8.1 on, with
  ``aclrtBinaryLoadFromFile`` from 8.2): the runtime builds the buffer (8-byte slots) and adds
  the hidden MIX arguments itself;
* **device args** (``aclrtLaunchKernel``, CANN 8.0): args in device memory that must outlive the
  kernel, with the legacy loader (``aclrtCreateBinary`` + ``aclrtBinaryLoad``); the library
  stages the image in a fenced per-stream device ring (:mod:`.devargs`).

The choice is made by symbol presence (``dlsym``), never by the version string, which is only
reported (``aclsysGetCANNVersion`` exists from 8.2). The first complete path of
:data:`PREFERENCE` wins.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

from ..._errors import BackendUnavailableError

__all__ = [
    "LOADERS",
    "PATH_SYMBOLS",
    "PREFERENCE",
    "LaunchPath",
    "choose_path",
    "unusable_error",
]


class LaunchPath(enum.Enum):
    """How the loaded release launches kernels (``info()["launch_path"]``)."""

    HOST_ARGS = "host_args"
    ARGS_HANDLE = "args_handle"
    DEVICE_ARGS = "device_args"


#: the loaders of the host-args and args-handle paths (the legacy loader is the device-args path's)
LOADERS: Final = ("aclrtBinaryLoadFromFile", "aclrtBinaryLoadFromData")
#: the legacy loader (``aclrtBinaryGetFunction`` and ``aclrtBinaryUnLoad`` are required anyway)
LEGACY_LOADER: Final = ("aclrtCreateBinary", "aclrtBinaryLoad")

#: the symbols each implemented path needs, beyond ``ffi.PROTOTYPES``
PATH_SYMBOLS: Final[dict[LaunchPath, tuple[str, ...]]] = {
    LaunchPath.HOST_ARGS: ("aclrtLaunchKernelWithHostArgs", *LOADERS),
    LaunchPath.ARGS_HANDLE: (
        "aclrtKernelArgsInit",
        "aclrtKernelArgsAppend",
        "aclrtKernelArgsAppendPlaceHolder",
        "aclrtKernelArgsGetPlaceHolderBuffer",
        "aclrtKernelArgsFinalize",
        "aclrtLaunchKernelWithConfig",
        *LOADERS,
    ),
    LaunchPath.DEVICE_ARGS: ("aclrtLaunchKernel", *LEGACY_LOADER),
}

#: the implemented paths, best first
PREFERENCE: Final = (LaunchPath.HOST_ARGS, LaunchPath.ARGS_HANDLE, LaunchPath.DEVICE_ARGS)

#: what each path is called in messages, with the releases that have it
_DESCRIPTION: Final = {
    LaunchPath.HOST_ARGS: "host args (aclrtLaunchKernelWithHostArgs, CANN 8.5.0+)",
    LaunchPath.ARGS_HANDLE: (
        "args handle (aclrtKernelArgs* + aclrtLaunchKernelWithConfig, CANN 8.2/8.3)"
    ),
    LaunchPath.DEVICE_ARGS: (
        "device args (aclrtCreateBinary + aclrtBinaryLoad + aclrtLaunchKernel, CANN 8.0)"
    ),
}


def choose_path(
    has: Callable[[str], bool],
) -> tuple[LaunchPath | None, dict[LaunchPath, list[str]]]:
    """The first complete path of :data:`PREFERENCE` (``None``: none), and what each path
    tried lacks."""
    missing: dict[LaunchPath, list[str]] = {}
    for path in PREFERENCE:
        lacking = [name for name in PATH_SYMBOLS[path] if not has(name)]
        if not lacking:
            return path, missing
        missing[path] = lacking
    return None, missing


def unusable_error(
    library: str,
    release: str,
    missing: dict[LaunchPath, list[str]],
) -> BackendUnavailableError:
    """The error for a library that has no complete launch path: each path tried and what it
    lacks."""
    lines = [f"{library} ({release}) was found, but aio_ascend has no launch path for it. Tried:"]
    for path, lacking in missing.items():
        lines.append(f"  {_DESCRIPTION[path]}: missing {', '.join(lacking)}")
    lines.append(
        "Install CANN 8.5.0 or newer (8.3 works through the args-handle path, 8.0 through the "
        "device-args path), or use "
        "backend='sim' (AIO_ASCEND_BACKEND=sim) to simulate beside this install. "
        "See docs/cann-support.md."
    )
    return BackendUnavailableError("\n".join(lines))
