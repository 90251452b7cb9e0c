"""Loading a kernel binary on the host-args and args-handle paths (CANN 8.1 on).

* A path is made absolute (the runtime requires it) and loaded with ``aclrtBinaryLoadFromFile``;
  its kernel type comes from the JSON the compiler writes beside it.
* Bytes are loaded with ``aclrtBinaryLoadFromData`` where the release documents it for AI Core
  kernels (8.5 on: the host-args path; the data is kept until the binary is unloaded). CANN
  8.2/8.3 document ``aclrtBinaryLoadFromData`` for AI CPU kernels only (``docs/cann-support.md``
  §1.2, row 15), so on the args-handle path the bytes are written to a private temporary folder
  (``kernel.o``, and a ``kernel.json`` naming the kernel type when one is given: the runtime
  refuses the magic option for files and reads the type from that JSON) and loaded with
  ``aclrtBinaryLoadFromFile``; the folder is removed right after the call, because the runtime
  reads the file and its JSON during it (hicann/runtime@681ef76:
  ``src/runtime/core/src/kernel/binary_loader.cc:288-322``).

The legacy loader of CANN 8.0 is :func:`.devargs.load_legacy`.
"""

from __future__ import annotations

import json
import os
import tempfile
from ctypes import byref
from typing import Any

from ..._errors import BackendUnavailableError
from ..abi import ACL_RT_BINARY_MAGIC_ELF_AICORE, KernelType, binary_bytes
from .kernels import json_kernel_type, load_options
from .paths import LaunchPath

__all__ = ["builtins_path", "load_binary_from", "type_json"]

#: the JSON "magic" names the runtime converts (binary_loader.cc:45-59), by load magic
_JSON_MAGIC = {
    KernelType.AICORE: "RT_DEV_BINARY_MAGIC_ELF",
    KernelType.MIX: "RT_DEV_BINARY_MAGIC_ELF",
    KernelType.VECTOR: "RT_DEV_BINARY_MAGIC_ELF_AIVEC",
    KernelType.CUBE: "RT_DEV_BINARY_MAGIC_ELF_AICUBE",
}


def type_json(kind: KernelType) -> dict[str, object]:
    """The JSON beside a kernel file that makes the runtime load it as ``kind``: its magic, and
    for MIX the AI Core magic with ``"intercoreSync": 1`` (read by ``ParseInterCrossSync``,
    binary_loader.cc:77-83), which gives its kernels the inter-core sync slot."""
    meta: dict[str, object] = {"magic": _JSON_MAGIC[kind]}
    if kind is KernelType.MIX:
        assert kind.magic == ACL_RT_BINARY_MAGIC_ELF_AICORE
        meta["intercoreSync"] = 1
    return meta


def _load_bytes_from_file(
    fn: dict[str, Any], data: bytes, kind: KernelType | None, lazy: bool | None, ref: Any
) -> None:
    options = load_options(None, lazy, from_file=True)
    with tempfile.TemporaryDirectory(prefix="aio_ascend_kernel_") as folder:  # mode 0700
        path = os.path.join(folder, "kernel.o")
        with open(path, "wb") as file:
            file.write(data)
        if kind is not None:
            with open(os.path.join(folder, "kernel.json"), "w", encoding="utf-8") as file:
                json.dump(type_json(kind), file)
        fn["aclrtBinaryLoadFromFile"](
            os.fsencode(path), None if options is None else byref(options), ref
        )


def load_binary_from(
    fn: dict[str, Any],
    path: LaunchPath,
    source: object,
    kind: KernelType | None,
    lazy: bool | None,
    ref: Any,
) -> tuple[str, bytes | None, KernelType | None]:
    """Load ``source`` into the handle behind ``ref``: the function that loaded it, the data to
    keep until the unload, and the kernel type when known."""
    data = binary_bytes(source)
    if data is not None:  # (not empty: check_binary_source)
        if path is LaunchPath.ARGS_HANDLE:
            _load_bytes_from_file(fn, data, kind, lazy, ref)
            return "aclrtBinaryLoadFromFile", None, kind
        options = load_options(kind, lazy, from_file=False)
        fn["aclrtBinaryLoadFromData"](
            data, len(data), None if options is None else byref(options), ref
        )
        return "aclrtBinaryLoadFromData", data, kind
    if isinstance(source, str | os.PathLike):
        file = os.path.abspath(os.fspath(source))
        options = load_options(kind, lazy, from_file=True)
        fn["aclrtBinaryLoadFromFile"](
            os.fsencode(file), None if options is None else byref(options), ref
        )
        return "aclrtBinaryLoadFromFile", None, json_kernel_type(file)
    raise TypeError(
        "load_binary takes a path (str or os.PathLike), bytes-like data or None, "
        f"got {type(source).__name__}"
    )


def builtins_path(variable: str) -> str:
    """The kernel binary the environment ``variable`` names: the backend's built-in kernels
    (``load_binary(None)``); ``BackendUnavailableError`` if it names none."""
    path = os.environ.get(variable, "").strip()
    if not path:
        raise BackendUnavailableError(
            f"the acl backend has no built-in kernels of its own: set {variable} to the path "
            "of a kernel binary that provides them (vector_add, axpy, scale, matmul, sleep, "
            "fault, hang, noop)"
        )
    return path
