"""The aio_ascend exception hierarchy, keyed by ACL error codes.

This module imports nothing else from aio_ascend. Runtime backends translate raw return codes
with :func:`error_for_code` (or :func:`raise_for_code`); everything above the runtime seam only
ever sees these types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

__all__ = [
    "AICoreExceptionError",
    "AICoreTimeoutError",
    "AscendError",
    "BackendUnavailableError",
    "ClosedError",
    "ContextNullError",
    "DeviceFaultError",
    "EventSyncTimeoutError",
    "InternalError",
    "InvalidHandleError",
    "InvalidParamError",
    "derived_error",
    "MemoryAllocationError",
    "RuntimeAPIError",
    "StreamAbortError",
    "StreamSyncTimeoutError",
    "TaskTimeoutError",
    "error_class_for_code",
    "error_for_code",
    "raise_for_code",
]


class AscendError(Exception):
    """Base class of every error aio_ascend raises on purpose.

    :ivar code: the ACL (or CUDA) error number, or ``None`` when the error did not come from a
        runtime call.
    :ivar message: human-readable text (for runtime errors, the runtime's own message).
    :ivar func: the runtime function that failed (e.g. ``"aclrtRecordEvent"``), if any.
    """

    def __init__(self, message: str = "", *, code: int | None = None, func: str | None = None):
        self.code = code
        self.message = message
        self.func = func
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.func:
            parts.append(f"{self.func}")
        if self.code is not None:
            parts.append(f"[{self.code}]")
        head = " ".join(parts)
        if head and self.message:
            return f"{head}: {self.message}"
        return head or self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, self.code, self.func))


def _rebuild(
    cls: type[AscendError], message: str, code: int | None, func: str | None
) -> AscendError:
    return cls(message, code=code, func=func)


class RuntimeAPIError(AscendError):
    """A runtime call returned a non-zero code. Subclasses are registered by code."""

    codes: ClassVar[tuple[int, ...]] = ()


class DeviceFaultError(RuntimeAPIError):
    """A fault while the device executed work (ACL 507xxx execution codes).

    Faults are sticky for the device: once one is seen, every unfinished or later task on the
    same device fails with a ``DeviceFaultError`` whose ``__cause__`` is the first fault.
    The device must be closed and opened again.
    """


class TaskTimeoutError(AscendError, TimeoutError):
    """The per-device watchdog (``task_timeout``) or ``aclose(timeout=...)`` gave up on a task.

    The device work itself may still be running: its buffers stay retained until the device
    reports completion or the device is closed.
    """


class BackendUnavailableError(AscendError):
    """The requested backend's library is not installed or cannot be loaded."""


class ClosedError(AscendError):
    """Use after ``aclose()``, or a request dropped by ``aclose(cancel=True)``."""


class InternalError(AscendError):
    """An invariant of aio_ascend broke. This is a bug in aio_ascend: please report it."""


# --- code registry ---------------------------------------------------------------------------

_REGISTRY: dict[int, type[RuntimeAPIError]] = {}


_E = TypeVar("_E", bound=RuntimeAPIError)


def _register(*codes: int) -> Callable[[type[_E]], type[_E]]:
    def decorate(cls: type[_E]) -> type[_E]:
        for code in codes:
            if code in _REGISTRY:
                raise RuntimeError(f"ACL code {code} registered twice")
            _REGISTRY[code] = cls
        cls.codes = codes
        return cls

    return decorate


@_register(100000, 107000)
class InvalidParamError(RuntimeAPIError, ValueError):
    """The runtime rejected a parameter (ACL_ERROR_INVALID_PARAM / ACL_ERROR_RT_PARAM_INVALID)."""


@_register(107002)
class ContextNullError(RuntimeAPIError):
    """The calling thread has no current context (ACL_ERROR_RT_CONTEXT_NULL)."""


@_register(107017, 200005)
class InvalidHandleError(RuntimeAPIError):
    """A stream, event, function or memory handle is not valid (ACL_ERROR_RT_INVALID_HANDLE)."""


@_register(207001, 200000, 207018)
class MemoryAllocationError(RuntimeAPIError, MemoryError):
    """Device or host memory could not be allocated (ACL_ERROR_RT_MEMORY_ALLOCATION)."""


@_register(107023, 107022)
class StreamAbortError(RuntimeAPIError):
    """The stream (or the device's tasks) were aborted (ACL_ERROR_RT_STREAM_ABORT)."""


@_register(507046)
class StreamSyncTimeoutError(RuntimeAPIError, TimeoutError):
    """``aclrtSynchronizeStreamWithTimeout`` ran out of time (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)."""


@_register(507047)
class EventSyncTimeoutError(RuntimeAPIError, TimeoutError):
    """``aclrtSynchronizeEventWithTimeout`` ran out of time (ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)."""


@_register(507015)
class AICoreExceptionError(DeviceFaultError):
    """An AI Core raised an exception while executing a kernel (ACL_ERROR_RT_AICORE_EXCEPTION)."""


@_register(507014)
class AICoreTimeoutError(DeviceFaultError):
    """An AI Core task ran past its execution timeout (ACL_ERROR_RT_AICORE_TIMEOUT)."""


# Device execution faults without a dedicated class still become DeviceFaultError.
_DEVICE_FAULT_CODES = frozenset(
    {
        507010,  # LOST_HEARTBEAT
        507011,  # MODEL_EXECUTE
        507013,  # SYS_DMA
        507016,  # AICORE_TRAP_EXCEPTION
        507017,  # AICPU_TIMEOUT
        507018,  # AICPU_EXCEPTION
        507034,  # VECTOR_CORE_TIMEOUT
        507035,  # VECTOR_CORE_EXCEPTION
        507036,  # VECTOR_CORE_TRAP_EXCEPTION
        507042,
        507043,
        507044,
        507045,  # AIC/AIV trap read/write overflow
        507048,
        507049,
        507050,  # FFTS+ timeout/exception/trap
        507053,  # DEVICE_MEM_ERROR
        507054,  # HBM_MULTI_BIT_ECC
        507056,  # LINK_ERROR
    }
)

#: ACL codes that mean "the device faulted while executing work".
DEVICE_FAULT_CODES = frozenset(_DEVICE_FAULT_CODES | {507014, 507015})


def is_device_fault_code(code: int) -> bool:
    """Whether ``code`` is a device execution fault (sticky for the device)."""
    return code in DEVICE_FAULT_CODES


def error_class_for_code(code: int) -> type[RuntimeAPIError]:
    """The exception class registered for an ACL code (``RuntimeAPIError`` if none)."""
    cls = _REGISTRY.get(code)
    if cls is not None:
        return cls
    if code in _DEVICE_FAULT_CODES:
        return DeviceFaultError
    return RuntimeAPIError


def error_for_code(code: int, func: str | None = None, message: str = "") -> RuntimeAPIError:
    """Build the typed error for a non-zero runtime return code. The number is always kept."""
    return error_class_for_code(code)(message, code=code, func=func)


def raise_for_code(code: int, func: str | None = None, message: str = "") -> None:
    """Raise the typed error for ``code`` unless it is 0 (success)."""
    if code:
        raise error_for_code(code, func, message)


def derived_error(first: BaseException, what: str) -> BaseException:
    """A fresh error of the same kind as ``first``, with ``first`` as its cause.

    Used for tasks that failed *because of* an earlier error (a sticky device fault, an
    earlier refusal in the same batch) without being its origin.
    """
    err: BaseException
    if isinstance(first, AscendError):
        try:
            err = type(first)(f"{what}: {first.message}", code=first.code, func=first.func)
        except TypeError:
            err = AscendError(f"{what}: {first.message}", code=first.code, func=first.func)
    else:
        err = InternalError(f"{what}: {first!r}")
    err.__cause__ = first
    return err
