"""CUDA driver error numbers and their mapping onto the aio_ascend exception tree.

Pure (no cuda-bindings needed): a failing driver call raises the typed error for the CUDA error
number (``.code`` is the CUDA number, the message names it:
``CUDA_ERROR_ILLEGAL_ADDRESS (700): ...``). Kernel faults become :class:`DeviceFaultError`.
"""

from __future__ import annotations

from typing import Any

from ..._errors import (
    ContextNullError,
    DeviceFaultError,
    InvalidHandleError,
    InvalidParamError,
    MemoryAllocationError,
    RuntimeAPIError,
)

__all__ = [
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_INVALID_CONTEXT",
    "CUDA_ERROR_INVALID_DEVICE",
    "CUDA_ERROR_INVALID_HANDLE",
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_NOT_FOUND",
    "CUDA_ERROR_NOT_READY",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA_FAULT_CODES",
    "CUDA_SUCCESS",
    "cuda_error",
    "cuda_error_name",
]

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
    401: "CUDA_ERROR_ILLEGAL_STATE",
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
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
    903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
    904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
    905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
    906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
    907: "CUDA_ERROR_CAPTURED_EVENT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
    999: "CUDA_ERROR_UNKNOWN",
}

_CUDA_ERROR_CLASSES: dict[int, type[RuntimeAPIError]] = {
    CUDA_ERROR_INVALID_VALUE: InvalidParamError,
    CUDA_ERROR_OUT_OF_MEMORY: MemoryAllocationError,
    CUDA_ERROR_INVALID_CONTEXT: ContextNullError,
    CUDA_ERROR_CONTEXT_IS_DESTROYED: ContextNullError,
    CUDA_ERROR_INVALID_HANDLE: InvalidHandleError,
}


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
