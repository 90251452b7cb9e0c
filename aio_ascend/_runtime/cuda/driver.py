"""Importing ``cuda.bindings.driver`` lazily, and probing whether the backend can run here."""

from __future__ import annotations

import threading
from typing import Any

from ..._errors import BackendUnavailableError
from .errors import cuda_error_name

__all__ = [
    "INIT_LOCK",
    "cuda_version_string",
    "device_count",
    "device_name_string",
    "import_driver",
    "probe",
]

#: serialises ``cuInit`` calls
INIT_LOCK = threading.Lock()


def import_driver() -> Any:
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
        driver = import_driver()
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


def initialized_driver(driver: Any = None) -> Any:
    """cuda-bindings' driver module (``driver``, else imported) after ``cuInit``.

    :raises BackendUnavailableError: cuda-bindings or the NVIDIA driver is missing
    """
    if driver is None:
        try:
            driver = import_driver()
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the cuda backend needs cuda-bindings ({exc}); pip install 'aio_ascend[cuda]'"
            ) from exc
    try:
        with INIT_LOCK:
            (err,) = driver.cuInit(0)
    except Exception as exc:
        raise BackendUnavailableError(
            f"the NVIDIA driver cannot be loaded: {type(exc).__name__}: {exc}", func="cuInit"
        ) from exc
    if int(err):
        raise BackendUnavailableError(
            f"cuInit failed: {cuda_error_name(int(err), driver)}", code=int(err), func="cuInit"
        )
    return driver


def device_count(*, driver: Any = None) -> int:
    """``cuDeviceGetCount`` (after ``cuInit``); 0 when the driver loads but sees none.

    :raises BackendUnavailableError: cuda-bindings or the NVIDIA driver is missing
    """
    driver = initialized_driver(driver)
    try:
        err, count = driver.cuDeviceGetCount()
    except Exception as exc:
        raise BackendUnavailableError(
            f"the NVIDIA driver cannot be loaded: {type(exc).__name__}: {exc}", func="cuInit"
        ) from exc
    if int(err):
        raise BackendUnavailableError(
            f"cuDeviceGetCount failed: {cuda_error_name(int(err), driver)}", code=int(err)
        )
    return int(count)


def cuda_version_string(version: int) -> str:
    """``cuDriverGetVersion``'s ``1000 * major + 10 * minor`` as ``"major.minor"``
    (12040 -> ``"12.4"``)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def device_name_string(raw: bytes | str) -> str:
    """``cuDeviceGetName``'s buffer (the name, a NUL, then padding) as text."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
