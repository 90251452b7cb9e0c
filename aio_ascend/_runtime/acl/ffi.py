"""ctypes declarations for the ACL runtime (``libascendcl.so``): structs, constants, prototypes.

Declarations only: no loading policy, no error handling (see :mod:`.library`). Every layout and
value here was read off the CANN headers (``shared/docs/acl-abi/``) and is checked against them
by ``tests/runtime/test_acl_abi.py``:

* pointers and opaque handles (``aclrtStream``, ``void **`` out-params, ...) are ``c_void_p``;
* ``size_t`` is ``c_size_t``, ``int32_t``/``uint32_t``/``uint64_t`` the fixed-width types;
* ``aclError`` (``typedef int``) and the C enums passed by value are ``c_int``;
* ``const char *`` arguments are ``c_char_p``; ``aclGetRecentErrMsg`` and ``aclrtGetSocName``
  return ``c_char_p``.

:data:`PROTOTYPES` are required: every CANN release the backend supports has them (8.0 on,
``docs/cann-support.md`` §1), and a library lacking one is refused. :data:`OPTIONAL_PROTOTYPES`
are functions some releases lack (checked against ``acl_prototypes_more.json``): the launch
paths (host args, args handle, device args), the loaders, version and device queries, hidden
MIX arguments, parameter info, exception info. Each is looked up on its own, when first used
(:func:`bind_one`); the runtime method that needs a missing one raises
``BackendUnavailableError`` naming it, and the launch path is chosen by which are present.

The library is opened with ``ctypes.CDLL``, so every call releases the GIL.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any

__all__ = [
    "OPTIONAL_PROTOTYPES",
    "PROTOTYPES",
    "VALUE_RETURNING",
    "AclCANNPackageVersion",
    "EXCEPTION_CALLBACK",
    "AclrtBinaryLoadOption",
    "AclrtBinaryLoadOptionValue",
    "AclrtBinaryLoadOptions",
    "AclrtLaunchKernelAttr",
    "AclrtLaunchKernelAttrValue",
    "AclrtLaunchKernelCfg",
    "AclrtPlaceHolderInfo",
    "AclrtStreamAttrValue",
    "AclrtTimeoutUs",
    "CTYPE_NAMES",
    "STRUCTS",
    "bind",
    "bind_one",
    "prototype",
]

# The constants (enums, flags, error codes) are defined once, in ``_runtime/abi.py``; the launch
# attribute ids in ``_launch_config.LaunchAttrId``.

# --- structs ---------------------------------------------------------------------------------


class AclrtPlaceHolderInfo(Structure):
    """``aclrtPlaceHolderInfo``: 8 bytes."""

    _fields_ = [("addrOffset", c_uint32), ("dataOffset", c_uint32)]


class AclrtTimeoutUs(Structure):
    """``aclrtTimeoutUs``: 8 bytes, 4-aligned (two uint32, not one uint64)."""

    _fields_ = [("timeoutLow", c_uint32), ("timeoutHigh", c_uint32)]


class AclrtLaunchKernelAttrValue(Union):
    """``aclrtLaunchKernelAttrValue``: 16 bytes, 4-aligned."""

    _fields_ = [
        ("schemMode", c_uint8),
        ("localMemorySize", c_uint32),
        ("dynUBufSize", c_uint32),
        ("engineType", c_int),  # aclrtEngineType (enum)
        ("blockDimOffset", c_uint32),
        ("isBlockTaskPrefetch", c_uint8),
        ("isDataDump", c_uint8),
        ("timeout", c_uint16),
        ("timeoutUs", AclrtTimeoutUs),
        ("enableProfiling", c_uint8),
        ("rsv", c_uint32 * 4),
    ]


class AclrtLaunchKernelAttr(Structure):
    """``aclrtLaunchKernelAttr``: enum id + value union, 20 bytes."""

    _fields_ = [("id", c_int), ("value", AclrtLaunchKernelAttrValue)]


class AclrtLaunchKernelCfg(Structure):
    """``aclrtLaunchKernelCfg``: 16 bytes on LP64."""

    _fields_ = [("attrs", POINTER(AclrtLaunchKernelAttr)), ("numAttrs", c_size_t)]


class AclrtBinaryLoadOptionValue(Union):
    """``aclrtBinaryLoadOptionValue``: 16 bytes."""

    _fields_ = [
        ("isLazyLoad", c_uint32),
        ("magic", c_uint32),
        ("cpuKernelMode", c_int32),
        ("rsv", c_uint32 * 4),
    ]


class AclrtBinaryLoadOption(Structure):
    """``aclrtBinaryLoadOption``: enum type + value union, 20 bytes."""

    _fields_ = [("type", c_int), ("value", AclrtBinaryLoadOptionValue)]


class AclrtBinaryLoadOptions(Structure):
    """``aclrtBinaryLoadOptions``: 16 bytes on LP64."""

    _fields_ = [("options", POINTER(AclrtBinaryLoadOption)), ("numOpt", c_size_t)]


class AclrtStreamAttrValue(Union):
    """``aclrtStreamAttrValue`` (``aclrtSetStreamAttribute``): 16 bytes, 8-aligned.

    ``streamPriority`` (for ``ACL_STREAM_ATTR_PRIORITY``) is a newer member than the others; like
    every member it sits at offset 0, so it does not change the layout.
    """

    _fields_ = [
        ("failureMode", c_uint64),
        ("overflowSwitch", c_uint32),
        ("userCustomTag", c_uint32),
        ("cacheOpInfoSwitch", c_uint32),
        ("streamPriority", c_uint32),
        ("reserve", c_uint32 * 4),
    ]


class AclCANNPackageVersion(Structure):
    """``aclCANNPackageVersion`` (``aclsysGetCANNVersion``): five strings, 512 bytes."""

    _fields_ = [
        ("version", ctypes.c_char * 128),
        ("majorVersion", ctypes.c_char * 64),
        ("minorVersion", ctypes.c_char * 64),
        ("releaseVersion", ctypes.c_char * 64),
        ("patchVersion", ctypes.c_char * 64),
        ("reserved", ctypes.c_char * 128),
    ]


#: ``typedef void (*aclrtExceptionInfoCallback)(aclrtExceptionInfo *)``
EXCEPTION_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p)

#: C struct name -> ctypes type (what the ABI test walks)
STRUCTS: dict[str, Any] = {
    "aclrtPlaceHolderInfo": AclrtPlaceHolderInfo,
    "aclrtTimeoutUs": AclrtTimeoutUs,
    "aclrtLaunchKernelAttrValue": AclrtLaunchKernelAttrValue,
    "aclrtLaunchKernelAttr": AclrtLaunchKernelAttr,
    "aclrtLaunchKernelCfg": AclrtLaunchKernelCfg,
    "aclrtBinaryLoadOption": AclrtBinaryLoadOption,
    "aclrtBinaryLoadOptions": AclrtBinaryLoadOptions,
    "aclrtStreamAttrValue": AclrtStreamAttrValue,
    "aclCANNPackageVersion": AclCANNPackageVersion,
}

# --- prototypes ------------------------------------------------------------------------------

_ERR = c_int  # aclError is `typedef int aclError`
_PTR = c_void_p
_ENUM = c_int

#: the ACL functions every supported release has: name -> (restype, argtypes), as in the headers
PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # init, device, context
    "aclInit": (_ERR, (c_char_p,)),  # const char *configPath
    "aclFinalize": (_ERR, ()),
    "aclrtGetDeviceCount": (_ERR, (_PTR,)),  # uint32_t *count
    "aclrtSetDevice": (_ERR, (c_int32,)),
    "aclrtResetDevice": (_ERR, (c_int32,)),
    "aclrtCreateContext": (_ERR, (_PTR, c_int32)),  # aclrtContext *, int32_t deviceId
    "aclrtDestroyContext": (_ERR, (_PTR,)),
    "aclrtSetCurrentContext": (_ERR, (_PTR,)),
    "aclrtGetCurrentContext": (_ERR, (_PTR,)),  # aclrtContext *
    "aclGetRecentErrMsg": (c_char_p, ()),
    # streams
    "aclrtCreateStream": (_ERR, (_PTR,)),  # aclrtStream *
    "aclrtDestroyStream": (_ERR, (_PTR,)),
    "aclrtDestroyStreamForce": (_ERR, (_PTR,)),
    "aclrtSynchronizeStreamWithTimeout": (_ERR, (_PTR, c_int32)),  # timeout in ms
    "aclrtStreamQuery": (_ERR, (_PTR, _PTR)),  # stream, aclrtStreamStatus *
    "aclrtSetStreamFailureMode": (_ERR, (_PTR, c_uint64)),
    # events
    "aclrtCreateEventExWithFlag": (_ERR, (_PTR, c_uint32)),  # aclrtEvent *, uint32_t flag
    "aclrtDestroyEvent": (_ERR, (_PTR,)),
    "aclrtRecordEvent": (_ERR, (_PTR, _PTR)),  # event, stream
    "aclrtQueryEventStatus": (_ERR, (_PTR, _PTR)),  # event, aclrtEventRecordedStatus *
    "aclrtSynchronizeEventWithTimeout": (_ERR, (_PTR, c_int32)),  # timeout in ms
    "aclrtStreamWaitEvent": (_ERR, (_PTR, _PTR)),  # stream, event
    "aclrtEventElapsedTime": (_ERR, (_PTR, _PTR, _PTR)),  # float *ms, start, end
    # memory
    "aclrtMalloc": (_ERR, (_PTR, c_size_t, _ENUM)),  # void **, size, aclrtMemMallocPolicy
    "aclrtFree": (_ERR, (_PTR,)),
    "aclrtMallocHost": (_ERR, (_PTR, c_size_t)),
    "aclrtFreeHost": (_ERR, (_PTR,)),
    # dst, destMax, src, count, aclrtMemcpyKind, stream
    "aclrtMemcpyAsync": (_ERR, (_PTR, c_size_t, _PTR, c_size_t, _ENUM, _PTR)),
    # kernels (the loaders and launches differ per release: OPTIONAL_PROTOTYPES)
    "aclrtBinaryGetFunction": (_ERR, (_PTR, c_char_p, _PTR)),  # bin, name, aclrtFuncHandle *
    "aclrtBinaryUnLoad": (_ERR, (_PTR,)),
}

#: ACL functions some CANN releases lack: bound when the library has them (same format). Which
#: release introduced each is not in the headers; the runtime refuses a call that needs a missing
#: one with ``BackendUnavailableError`` instead of refusing the whole library.
OPTIONAL_PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # stream, aclrtStreamAttr, aclrtStreamAttrValue *
    "aclrtSetStreamAttribute": (_ERR, (_PTR, _ENUM, _PTR)),
    # int32_t *leastPriority, int32_t *greatestPriority (cann-support.md row 44; not in the JSON)
    "aclrtDeviceGetStreamPriorityRange": (_ERR, (_PTR, _PTR)),
    # devPtr, maxCount, int32_t value, count, stream
    "aclrtMemsetAsync": (_ERR, (_PTR, c_size_t, c_int32, c_size_t, _PTR)),
    # int32_t *major, *minor, *patch
    "aclrtGetVersion": (_ERR, (_PTR, _PTR, _PTR)),
    # aclrtMemAttr, size_t *free, size_t *total
    "aclrtGetMemInfo": (_ERR, (_ENUM, _PTR, _PTR)),
    "aclrtGetSocName": (c_char_p, ()),
    # loaders (8.2/8.3 on: cann-support.md rows 14-15)
    "aclrtBinaryLoadFromFile": (_ERR, (c_char_p, _PTR, _PTR)),  # path, options *, aclrtBinHandle *
    "aclrtBinaryLoadFromData": (_ERR, (_PTR, c_size_t, _PTR, _PTR)),
    # the legacy loader and the device-args launch (CANN 8.0; cann-support.md rows 30, 47):
    # aclrtBinary aclrtCreateBinary(const void *data, size_t dataLen) (NULL on failure)
    "aclrtCreateBinary": (_PTR, (_PTR, c_size_t)),
    "aclrtBinaryLoad": (_ERR, (_PTR, _PTR)),  # const aclrtBinary, aclrtBinHandle *
    "aclrtDestroyBinary": (_ERR, (_PTR,)),  # aclrtBinary (cann-support.md §2.3; 8.0: unknown)
    # funcHandle, numBlocks, const void *argsData (DEVICE memory), argsSize, stream
    "aclrtLaunchKernel": (_ERR, (_PTR, c_uint32, _PTR, c_size_t, _PTR)),
    # the host-args launch (8.5 on): func, numBlocks, stream, cfg *, hostArgs, argsSize,
    # placeHolderArray *, placeHolderNum
    "aclrtLaunchKernelWithHostArgs": (
        _ERR,
        (_PTR, c_uint32, _PTR, _PTR, _PTR, c_size_t, _PTR, c_size_t),
    ),
    # the args-handle launch (8.1 on): aclrtFuncHandle, aclrtArgsHandle *
    "aclrtKernelArgsInit": (_ERR, (_PTR, _PTR)),
    # argsHandle, void *param, size_t paramSize, aclrtParamHandle *
    "aclrtKernelArgsAppend": (_ERR, (_PTR, _PTR, c_size_t, _PTR)),
    "aclrtKernelArgsAppendPlaceHolder": (_ERR, (_PTR, _PTR)),  # argsHandle, aclrtParamHandle *
    # argsHandle, paramHandle, size_t dataSize, void **bufferAddr
    "aclrtKernelArgsGetPlaceHolderBuffer": (_ERR, (_PTR, _PTR, c_size_t, _PTR)),
    "aclrtKernelArgsFinalize": (_ERR, (_PTR,)),
    # the args handle in the caller's memory (read back by the hidden-argument probe):
    # func, size_t *memSize / func, size_t userArgsSize, size_t *actualArgsSize /
    # func, aclrtArgsHandle argsHandle, void *userHostMem, size_t actualArgsSize
    "aclrtKernelArgsGetHandleMemSize": (_ERR, (_PTR, _PTR)),
    "aclrtKernelArgsGetMemSize": (_ERR, (_PTR, c_size_t, _PTR)),
    "aclrtKernelArgsInitByUserMem": (_ERR, (_PTR, _PTR, _PTR, c_size_t)),
    # func, numBlocks, stream, cfg *, argsHandle, void *reserve (NULL)
    "aclrtLaunchKernelWithConfig": (_ERR, (_PTR, c_uint32, _PTR, _PTR, _PTR, _PTR)),
    # versions and device facts: aclCANNPackageName, aclCANNPackageVersion *
    "aclsysGetCANNVersion": (_ERR, (_ENUM, _PTR)),
    "aclrtGetDeviceInfo": (_ERR, (c_uint32, _ENUM, _PTR)),  # deviceId, aclrtDevAttr, int64_t *
    "aclrtStreamGetId": (_ERR, (_PTR, _PTR)),  # stream, int32_t *streamId
    # aclrtStream *, uint32_t priority, uint32_t flag
    "aclrtCreateStreamWithConfig": (_ERR, (_PTR, c_uint32, c_uint32)),
    # hidden MIX arguments (8.5 on): void **addr
    "aclrtGetHardwareSyncAddr": (_ERR, (_PTR,)),
    "aclrtCtxGetFloatOverflowAddr": (_ERR, (_PTR,)),
    # parameter info (9.1 on): const void *func, size_t *paramCount
    "aclrtFunctionGetParamCount": (_ERR, (_PTR, _PTR)),
    # func, size_t paramIndex, size_t *paramOffset, size_t *paramSize
    "aclrtFunctionGetParamInfo": (_ERR, (_PTR, c_size_t, _PTR, _PTR)),
    # exception info: aclrtExceptionInfoCallback; the getters take const aclrtExceptionInfo *
    "aclrtSetExceptionInfoCallback": (_ERR, (_PTR,)),
    "aclrtGetTaskIdFromExceptionInfo": (c_uint32, (_PTR,)),
    "aclrtGetStreamIdFromExceptionInfo": (c_uint32, (_PTR,)),
    "aclrtGetDeviceIdFromExceptionInfo": (c_uint32, (_PTR,)),
    "aclrtGetErrorCodeFromExceptionInfo": (c_uint32, (_PTR,)),
    # exception callbacks that coexist (acl_rt.h: several may be registered), 9.x
    "aclrtExceptionInfoCallbackRegister": (_ERR, (_PTR,)),
    "aclrtExceptionInfoCallbackUnregister": (_ERR, (_PTR,)),
    # uint32_t *taskId: the calling thread's last task (8.2 on)
    "aclrtGetThreadLastTaskId": (_ERR, (_PTR,)),
    # int32_t timeout (ms, -1: none): every task of the current context's device
    "aclrtSynchronizeDeviceWithTimeout": (_ERR, (c_int32,)),
    # aclrtLastErrLevel -> the code itself (VALUE_RETURNING: not a failure)
    "aclrtGetLastError": (_ERR, (_ENUM,)),
    "aclrtPeekAtLastError": (_ERR, (_ENUM,)),
    # model-RI capture (graphs): stream, aclmdlRICaptureMode
    "aclmdlRICaptureBegin": (_ERR, (_PTR, _ENUM)),
    "aclmdlRICaptureEnd": (_ERR, (_PTR, _PTR)),  # stream, aclmdlRI *modelRI
    "aclmdlRIExecuteAsync": (_ERR, (_PTR, _PTR)),  # aclmdlRI modelRI, stream
    "aclmdlRIDestroy": (_ERR, (_PTR,)),  # aclmdlRI modelRI
}

#: functions whose ``int`` result is a value (an error code read back), not a failure to raise
VALUE_RETURNING = frozenset({"aclrtGetLastError", "aclrtPeekAtLastError"})

#: ctypes type -> a C spelling, for messages (pointer types all map to "void*"). On LP64 Linux
#: some ctypes names are one type (``c_int is c_int32``, ``c_size_t is c_uint64``), so a type
#: reads back as the last spelling listed for it; the ABI test compares types, not names.
CTYPE_NAMES: dict[Any, str] = {
    c_int: "int",
    c_int32: "int32_t",
    c_uint32: "uint32_t",
    c_uint64: "uint64_t",
    c_size_t: "size_t",
    c_void_p: "void*",
    c_char_p: "const char*",
}


def prototype(name: str) -> tuple[Any, tuple[Any, ...]]:
    """``(restype, argtypes)`` of a required or optional function."""
    found = PROTOTYPES.get(name)
    return OPTIONAL_PROTOTYPES[name] if found is None else found


def bind_one(cdll: ctypes.CDLL, name: str) -> Any | None:
    """``name`` looked up in ``cdll`` with its prototype set; ``None`` when ``cdll`` lacks it."""
    restype, argtypes = prototype(name)
    try:
        function = cdll[name]  # a fresh function object (getattr would share a cached one)
    except AttributeError:
        return None
    function.restype = restype
    function.argtypes = argtypes
    return function


def bind(cdll: ctypes.CDLL) -> dict[str, Any]:
    """Every function of :data:`PROTOTYPES` and :data:`OPTIONAL_PROTOTYPES` that ``cdll`` has,
    with its prototype set (a missing optional function is simply absent).

    Raises ``AttributeError`` naming the first missing required symbol.
    """
    functions: dict[str, Any] = {}
    for name in (*PROTOTYPES, *OPTIONAL_PROTOTYPES):
        function = bind_one(cdll, name)
        if function is None:
            if name in PROTOTYPES:
                raise AttributeError(f"{name}: undefined symbol")
            continue
        functions[name] = function
    return functions
