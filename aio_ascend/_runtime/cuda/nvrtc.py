"""Compiling CUDA C with NVRTC (``cuda.bindings.nvrtc``, imported only when used)."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from ..._errors import BackendUnavailableError
from .kernels import NVRTC_OPTIONS

__all__ = ["compile_cuda_source"]

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
        options = [opt.encode() for opt in NVRTC_OPTIONS] + [f"--gpu-architecture={arch}".encode()]
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
