"""The aio_ascend exception hierarchy, keyed by ACL error codes.

This module imports nothing else from aio_ascend. It is the one definition of the ACL error
numbers (:class:`AclCode`; ``_runtime/abi.py`` names them as plain ints for the backends).
Runtime backends translate raw return codes with :func:`error_for_code`; everything above the
runtime seam only ever sees these types.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import ClassVar, TypeVar

__all__ = [
    "AICoreExceptionError",
    "AclCode",
    "AICoreTimeoutError",
    "AscendError",
    "BackendUnavailableError",
    "CaptureError",
    "CaptureInvalidatedError",
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
    "WrongLoopError",
    "error_class_for_code",
    "error_for_code",
]


class AclCode(IntEnum):
    """The ACL error numbers aio_ascend knows by name (``aclError``; CANN ``acl_base_rt.h``,
    ``rt_error_codes.h``). The one definition of each number in the package."""

    INVALID_PARAM = 100000
    REPEAT_INITIALIZE = 100002
    BAD_ALLOC = 200000
    INVALID_RESOURCE_HANDLE = 200005
    RT_PARAM_INVALID = 107000
    RT_CONTEXT_NULL = 107002
    RT_INVALID_HANDLE = 107017
    RT_DEVICE_TASK_ABORT = 107022
    RT_STREAM_ABORT = 107023
    RT_SYMBOL_NOT_FOUND = 107042
    # model-RI capture (rt_error_codes.h:44-61, 154); 107035 is a task-abort code among them
    RT_CAPTURE_DEPENDENCY = 107024
    RT_STREAM_UNJOINED = 107025
    RT_MODEL_CAPTURED = 107026
    RT_STREAM_CAPTURED = 107027
    RT_EVENT_CAPTURED = 107028
    RT_STREAM_NOT_CAPTURED = 107029
    RT_CAPTURE_MODE_NOT_SUPPORT = 107030
    RT_STREAM_CAPTURE_IMPLICIT = 107031
    STREAM_CAPTURE_CONFLICT = 107032
    STREAM_TASK_GROUP_STATUS = 107033
    STREAM_TASK_GROUP_INTR = 107034
    RT_TASK_ABORT_STOP = 107035
    RT_STREAM_CAPTURE_UNMATCHED = 107036
    RT_MODEL_RUNNING = 107037
    RT_STREAM_CAPTURE_WRONG_THREAD = 107038
    RT_INSUFFICIENT_INPUT_ARRAY = 107039
    RT_MODEL_UPDATE_FAILED = 107040
    RT_STREAM_CAPTURE_INVALIDATED = 507903
    RT_FEATURE_NOT_SUPPORT = 207000
    RT_MEMORY_ALLOCATION = 207001
    RT_DEVICE_OOM = 207018
    RT_LOST_HEARTBEAT = 507010
    RT_MODEL_EXECUTE = 507011
    RT_SYS_DMA = 507013
    RT_AICORE_TIMEOUT = 507014
    RT_AICORE_EXCEPTION = 507015
    RT_AICORE_TRAP_EXCEPTION = 507016
    RT_AICPU_TIMEOUT = 507017
    RT_AICPU_EXCEPTION = 507018
    RT_VECTOR_CORE_TIMEOUT = 507034
    RT_VECTOR_CORE_EXCEPTION = 507035
    RT_VECTOR_CORE_TRAP_EXCEPTION = 507036
    RT_AICORE_TRAP_READ_OVERFLOW = 507042
    RT_AICORE_TRAP_WRITE_OVERFLOW = 507043
    RT_VECTOR_CORE_TRAP_READ_OVERFLOW = 507044
    RT_VECTOR_CORE_TRAP_WRITE_OVERFLOW = 507045
    RT_STREAM_SYNC_TIMEOUT = 507046
    RT_EVENT_SYNC_TIMEOUT = 507047
    RT_FFTS_PLUS_TIMEOUT = 507048
    RT_FFTS_PLUS_EXCEPTION = 507049
    RT_FFTS_PLUS_TRAP_EXCEPTION = 507050
    RT_DEVICE_MEM_ERROR = 507053
    RT_HBM_MULTI_BIT_ECC_ERROR = 507054
    RT_LINK_ERROR = 507056
    # The rest of rt_error_codes.h (hicann/runtime@681ef76), known by name so that an error
    # without the runtime's text still says what it means
    RT_INVALID_DEVICEID = 107001
    RT_STREAM_CONTEXT = 107003
    RT_MODEL_CONTEXT = 107004
    RT_STREAM_MODEL = 107005
    RT_EVENT_TIMESTAMP_INVALID = 107006
    RT_EVENT_TIMESTAMP_REVERSAL = 107007
    RT_ADDR_UNALIGNED = 107008
    RT_FILE_OPEN = 107009
    RT_FILE_WRITE = 107010
    RT_STREAM_SUBSCRIBE = 107011
    RT_THREAD_SUBSCRIBE = 107012
    RT_GROUP_NOT_SET = 107013
    RT_GROUP_NOT_CREATE = 107014
    RT_STREAM_NO_CB_REG = 107015
    RT_INVALID_MEMORY_TYPE = 107016
    RT_INVALID_MALLOC_TYPE = 107018
    RT_WAIT_TIMEOUT = 107019
    RT_TASK_TIMEOUT = 107020
    RT_SYSPARAMOPT_NOT_SET = 107021
    RT_INVALID_SYMBOL = 107043
    RT_INVALID_DEVICE_FUNCTION = 107044
    RT_SUB_ACLGRAPH_IS_CAPTURING = 107045
    RT_MEMORY_FREE = 207002
    RT_AICORE_OVER_FLOW = 207003
    RT_NO_DEVICE = 207004
    RT_RESOURCE_ALLOC_FAIL = 207005
    RT_NO_PERMISSION = 207006
    RT_NO_EVENT_RESOURCE = 207007
    RT_NO_STREAM_RESOURCE = 207008
    RT_NO_NOTIFY_RESOURCE = 207009
    RT_NO_MODEL_RESOURCE = 207010
    RT_NO_CDQ_RESOURCE = 207011
    RT_OVER_LIMIT = 207012
    RT_QUEUE_EMPTY = 207013
    RT_QUEUE_FULL = 207014
    RT_REPEATED_INIT = 207015
    RT_AIVEC_OVER_FLOW = 207016
    RT_OVER_FLOW = 207017
    RT_FEATURE_NOT_SUPPORT_UPDATE_OP = 207019
    RT_TIMEOUT = 207020
    RT_LINK_TYPE_NOT_SUPPORTED = 207021
    RT_INTERNAL_ERROR = 507000
    RT_TS_ERROR = 507001
    RT_STREAM_TASK_FULL = 507002
    RT_STREAM_TASK_EMPTY = 507003
    RT_STREAM_NOT_COMPLETE = 507004
    RT_END_OF_SEQUENCE = 507005
    RT_EVENT_NOT_COMPLETE = 507006
    RT_CONTEXT_RELEASE_ERROR = 507007
    RT_SOC_VERSION = 507008
    RT_TASK_TYPE_NOT_SUPPORT = 507009
    RT_REPORT_TIMEOUT = 507012
    RT_AICPU_DATADUMP_RSP_ERR = 507019
    RT_AICPU_MODEL_RSP_ERR = 507020
    RT_PROFILING_ERROR = 507021
    RT_IPC_ERROR = 507022
    RT_MODEL_ABORT_NORMAL = 507023
    RT_KERNEL_UNREGISTERING = 507024
    RT_RINGBUFFER_NOT_INIT = 507025
    RT_RINGBUFFER_NO_DATA = 507026
    RT_KERNEL_LOOKUP = 507027
    RT_KERNEL_DUPLICATE = 507028
    RT_DEBUG_REGISTER_FAIL = 507029
    RT_DEBUG_UNREGISTER_FAIL = 507030
    RT_LABEL_CONTEXT = 507031
    RT_PROGRAM_USE_OUT = 507032
    RT_DEV_SETUP_ERROR = 507033
    RT_CDQ_BATCH_ABNORMAL = 507037
    RT_DIE_MODE_CHANGE_ERROR = 507038
    RT_DIE_SET_ERROR = 507039
    RT_INVALID_DIEID = 507040
    RT_DIE_MODE_NOT_SET = 507041
    RT_SEND_MSG = 507051
    RT_COPY_DATA = 507052
    RT_SUSPECT_DEVICE_MEM_ERROR = 507055
    RT_SUSPECT_REMOTE_ERROR = 507057
    RT_DRV_INTERNAL_ERROR = 507899
    RT_AICPU_INTERNAL_ERROR = 507900
    RT_SOCKET_CLOSE = 507901
    RT_AICPU_INFO_LOAD_RSP_ERR = 507902
    RT_COMM_OP_RETRY_FAIL = 507904
    SNAPSHOT_LOCK_TIMEOUT = 507905
    SNAPSHOT_LOCK_FAILED = 507906
    SNAPSHOT_UNLOCK_FAILED = 507907
    SNAPSHOT_BACKUP_FAILED = 507908
    SNAPSHOT_RESTORE_FAILED = 507909
    HOST_MEMORY_ALREADY_REGISTERED = 507910
    HOST_MEMORY_NOT_REGISTERED = 507911
    SNAPSHOT_CALLBACK_FAILED = 507912
    SNAPSHOT_REGISTER_CALLBACK_FAILED = 507913
    RT_L3_PORT_ERROR = 507914
    RT_CCU_TIMEOUT = 507915
    RT_CCU_EXCEPTION = 507916


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
        # (with what was set after construction, such as ``TaskTimeoutError.by_close``)
        state = {k: v for k, v in vars(self).items() if k not in ("code", "message", "func")}
        return (_rebuild, (type(self), self.message, self.code, self.func), state or None)


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

    :ivar by_close: True when a forced close (``aclose(timeout=...)`` of the device or the
        stream) gave up on the task, False for the watchdog's ``task_timeout``. The close's
        WARNING reports those tasks, so they are not logged again one by one as unretrieved.
    """

    by_close: bool = False


class BackendUnavailableError(AscendError):
    """The requested backend's library is not installed or cannot be loaded."""


class ClosedError(AscendError):
    """Use after ``aclose()``, or a request dropped by ``aclose(cancel=True)``."""


class WrongLoopError(AscendError, RuntimeError, ValueError):
    """The device, or an object of it, was used from another event loop or thread than the one
    that opened it, or in a process forked from that one; nothing was done.

    A ``RuntimeError`` (as asyncio's own wrong-loop errors are) and a ``ValueError`` (bad input:
    the call named a device that belongs elsewhere), so that either ``except`` catches it.
    """


class InternalError(AscendError):
    """An invariant of aio_ascend broke. This is a bug in aio_ascend: please report it."""


# --- code registry ---------------------------------------------------------------------------

_REGISTRY: dict[int, type[RuntimeAPIError]] = {}


_E = TypeVar("_E", bound=RuntimeAPIError)


def _register(*codes: AclCode) -> Callable[[type[_E]], type[_E]]:
    def decorate(cls: type[_E]) -> type[_E]:
        for code in codes:
            if code in _REGISTRY:
                raise RuntimeError(f"ACL code {code} registered twice")
            _REGISTRY[code.value] = cls
        cls.codes = tuple(code.value for code in codes)
        return cls

    return decorate


@_register(AclCode.INVALID_PARAM, AclCode.RT_PARAM_INVALID)
class InvalidParamError(RuntimeAPIError, ValueError):
    """The runtime rejected a parameter (ACL_ERROR_INVALID_PARAM / ACL_ERROR_RT_PARAM_INVALID)."""


@_register(AclCode.RT_CONTEXT_NULL)
class ContextNullError(RuntimeAPIError):
    """The calling thread has no current context (ACL_ERROR_RT_CONTEXT_NULL)."""


@_register(AclCode.RT_INVALID_HANDLE, AclCode.INVALID_RESOURCE_HANDLE)
class InvalidHandleError(RuntimeAPIError):
    """A stream, event, function or memory handle is not valid (ACL_ERROR_RT_INVALID_HANDLE)."""


@_register(AclCode.RT_MEMORY_ALLOCATION, AclCode.BAD_ALLOC, AclCode.RT_DEVICE_OOM)
class MemoryAllocationError(RuntimeAPIError, MemoryError):
    """Device or host memory could not be allocated (ACL_ERROR_RT_MEMORY_ALLOCATION)."""


@_register(AclCode.RT_STREAM_ABORT, AclCode.RT_DEVICE_TASK_ABORT, AclCode.RT_TASK_ABORT_STOP)
class StreamAbortError(RuntimeAPIError):
    """The stream (or the device's tasks) were aborted (ACL_ERROR_RT_STREAM_ABORT)."""


@_register(AclCode.RT_STREAM_SYNC_TIMEOUT)
class StreamSyncTimeoutError(RuntimeAPIError, TimeoutError):
    """``aclrtSynchronizeStreamWithTimeout`` ran out of time (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)."""


@_register(AclCode.RT_EVENT_SYNC_TIMEOUT)
class EventSyncTimeoutError(RuntimeAPIError, TimeoutError):
    """``aclrtSynchronizeEventWithTimeout`` ran out of time (ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)."""


@_register(
    AclCode.RT_CAPTURE_DEPENDENCY,
    AclCode.RT_STREAM_UNJOINED,
    AclCode.RT_MODEL_CAPTURED,
    AclCode.RT_STREAM_CAPTURED,
    AclCode.RT_EVENT_CAPTURED,
    AclCode.RT_STREAM_NOT_CAPTURED,
    AclCode.RT_CAPTURE_MODE_NOT_SUPPORT,
    AclCode.RT_STREAM_CAPTURE_IMPLICIT,
    AclCode.STREAM_CAPTURE_CONFLICT,
    AclCode.STREAM_TASK_GROUP_STATUS,
    AclCode.STREAM_TASK_GROUP_INTR,
    AclCode.RT_STREAM_CAPTURE_UNMATCHED,
    AclCode.RT_MODEL_RUNNING,
    AclCode.RT_STREAM_CAPTURE_WRONG_THREAD,
    AclCode.RT_INSUFFICIENT_INPUT_ARRAY,
    AclCode.RT_MODEL_UPDATE_FAILED,
)
class CaptureError(RuntimeAPIError):
    """A graph capture call was refused: the stream is (or is not) capturing, the operation
    cannot be captured, or the model is in the wrong state (ACL_ERROR_RT_STREAM_CAPTURED and the
    other 1070xx capture codes)."""


@_register(AclCode.RT_STREAM_CAPTURE_INVALIDATED)
class CaptureInvalidatedError(CaptureError):
    """An error during the capture invalidated it: ``aclmdlRICaptureEnd`` returns no graph, the
    runtime has discarded the captured model and the stream has left capture mode
    (ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)."""


@_register(AclCode.RT_AICORE_EXCEPTION)
class AICoreExceptionError(DeviceFaultError):
    """An AI Core raised an exception while executing a kernel (ACL_ERROR_RT_AICORE_EXCEPTION)."""


@_register(AclCode.RT_AICORE_TIMEOUT)
class AICoreTimeoutError(DeviceFaultError):
    """An AI Core task ran past its execution timeout (ACL_ERROR_RT_AICORE_TIMEOUT)."""


# Device execution faults without a dedicated class still become DeviceFaultError.
_DEVICE_FAULT_CODES = frozenset(
    code.value
    for code in (
        AclCode.RT_LOST_HEARTBEAT,
        AclCode.RT_MODEL_EXECUTE,
        AclCode.RT_SYS_DMA,
        AclCode.RT_AICORE_TRAP_EXCEPTION,
        AclCode.RT_AICPU_TIMEOUT,
        AclCode.RT_AICPU_EXCEPTION,
        AclCode.RT_VECTOR_CORE_TIMEOUT,
        AclCode.RT_VECTOR_CORE_EXCEPTION,
        AclCode.RT_VECTOR_CORE_TRAP_EXCEPTION,
        AclCode.RT_AICORE_TRAP_READ_OVERFLOW,
        AclCode.RT_AICORE_TRAP_WRITE_OVERFLOW,
        AclCode.RT_VECTOR_CORE_TRAP_READ_OVERFLOW,
        AclCode.RT_VECTOR_CORE_TRAP_WRITE_OVERFLOW,
        AclCode.RT_FFTS_PLUS_TIMEOUT,
        AclCode.RT_FFTS_PLUS_EXCEPTION,
        AclCode.RT_FFTS_PLUS_TRAP_EXCEPTION,
        AclCode.RT_DEVICE_MEM_ERROR,
        AclCode.RT_HBM_MULTI_BIT_ECC_ERROR,
        AclCode.RT_LINK_ERROR,
    )
)


def error_class_for_code(code: int) -> type[RuntimeAPIError]:
    """The exception class registered for an ACL code (``RuntimeAPIError`` if none)."""
    cls = _REGISTRY.get(code)
    if cls is not None:
        return cls
    if code in _DEVICE_FAULT_CODES:
        return DeviceFaultError
    return RuntimeAPIError


def error_for_code(code: int, func: str | None = None, message: str = "") -> RuntimeAPIError:
    """Build the typed error for a non-zero runtime return code. The number is always kept;
    without the runtime's text (``aclGetRecentErrMsg`` often has none) the code's name says
    what it means."""
    if not message:
        try:
            name = f"ACL_ERROR_{AclCode(code).name}"
        except ValueError:
            name = "an ACL error code aio_ascend does not know by name"
        message = f"{name} (the runtime gave no message)"
    return error_class_for_code(code)(message, code=code, func=func)


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
