"""The ``acl`` backend: the :class:`~aio_ascend._runtime.Runtime` seam over ``libascendcl.so``.

The library is found through ``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME``
(``<dir>/lib64/libascendcl.so``) and then the loader path; an explicit ``library_path=`` is used
alone. ``aclInit`` runs once per process (``aclFinalize`` at interpreter exit if we initialised),
and a forked child refuses to use a runtime its parent initialised.

Every ACL call goes through one checker (the ctypes ``errcheck`` of each bound function): a
non-zero ``aclError`` becomes :func:`~aio_ascend._errors.error_for_code` with the text of
``aclGetRecentErrMsg`` (read on the failing thread, right after the failure). Every value is
range-checked before it reaches a C type that would silently narrow it.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import struct
import threading
import weakref
from ctypes import byref, c_float, c_int, c_uint32, c_void_p
from typing import Any, NoReturn

from ..._errors import (
    AscendError,
    BackendUnavailableError,
    ClosedError,
    DeviceFaultError,
    InternalError,
    InvalidParamError,
    RuntimeAPIError,
    error_for_code,
)
from ..._launch_config import LaunchConfig
from . import ffi as ffi

__all__ = [
    "ENV_BUILTINS",
    "LIBRARY_NAME",
    "AclRuntime",
    "library_candidates",
    "open_acl_runtime",
    "probe",
]

#: file name of the ACL runtime library
LIBRARY_NAME = "libascendcl.so"
#: environment variables naming a CANN install (``<dir>/lib64/libascendcl.so``), in order
HOME_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
#: path of a kernel binary providing the built-in kernels (``load_binary(None)``)
ENV_BUILTINS = "AIO_ASCEND_ACL_BUILTINS"

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1
_SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
_PTR_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1
_MAX_NUM_BLOCKS = 65535
_STATUS_COMPLETE = ffi.ACL_EVENT_RECORDED_STATUS_COMPLETE
_STATUS_NOT_READY = ffi.ACL_EVENT_RECORDED_STATUS_NOT_READY


# --- value checks ---------------------------------------------------------------------------


def _as_int(name: str, value: object) -> int:
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


def _in_range(name: str, value: object, low: int, high: int) -> int:
    number = _as_int(name, value)
    if not low <= number <= high:
        raise ValueError(f"{name}={number} is out of range {low}..{high}")
    return number


def _ptr(name: str, value: object) -> int:
    number = _as_int(name, value)
    if not 0 <= number <= _PTR_MAX:
        raise ValueError(f"{name}={number:#x} is not an address (0..2**64-1)")
    return number


def _timeout(func: str, value: object) -> int:
    number = _as_int("timeout_ms", value)
    if number == 0 or number < -1:
        # The runtime rejects 0 (it does not mean "poll") and anything below -1.
        raise InvalidParamError(
            f"timeout_ms={number}: must be -1 (forever) or > 0; use the query calls to poll",
            code=ffi.ACL_ERROR_RT_PARAM_INVALID,
            func=func,
        )
    if number > _I32_MAX:
        raise ValueError(f"timeout_ms={number} does not fit int32 (max {_I32_MAX})")
    return number


# --- the library ----------------------------------------------------------------------------


def library_candidates(library_path: str | os.PathLike[str] | None = None) -> list[str]:
    """Where :func:`open_acl_runtime` looks for ``libascendcl.so``, in order.

    An explicit ``library_path`` is the only candidate. Otherwise: ``$ASCEND_HOME_PATH`` and
    ``$ASCEND_TOOLKIT_HOME`` (``<dir>/lib64/libascendcl.so``), then the dynamic loader
    (``ctypes.util.find_library("ascendcl")`` and the bare ``libascendcl.so``).
    """
    if library_path is not None:
        return [os.fspath(library_path)]
    candidates: list[str] = []
    for var in HOME_ENV_VARS:
        home = os.environ.get(var, "").strip()
        if home:
            candidates.append(os.path.join(home, "lib64", LIBRARY_NAME))
    found = ctypes.util.find_library("ascendcl")
    if found:
        candidates.append(found)
    candidates.append(LIBRARY_NAME)
    unique: list[str] = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


class _Library:
    """One loaded ``libascendcl.so``: its bound functions and its once-per-process init."""

    def __init__(self, path: str, cdll: ctypes.CDLL, functions: dict[str, Any]) -> None:
        self.path = path
        self.cdll = cdll
        self.functions = functions
        self.init_pid: int | None = None
        self.initialised_by_us = False
        self.lock = threading.Lock()
        self._recent = functions["aclGetRecentErrMsg"]
        self._last = threading.local()
        checker = self._errcheck
        for name, function in functions.items():
            if ffi.PROTOTYPES[name][0] is ctypes.c_int:
                function.errcheck = checker

    def _fetch_message(self) -> str:
        """``aclGetRecentErrMsg`` of the calling thread (reading clears it in ACL)."""
        raw = self._recent()
        if not raw:
            return ""
        text: str = raw.decode("utf-8", "replace").strip()
        return text

    def recent_message(self) -> str:
        """The latest error text of the calling thread ('' if none).

        ACL clears its text when it is read, and the checker reads it for every failure, so the
        text is kept per thread until the next failure replaces it.
        """
        fresh = self._fetch_message()
        if fresh:
            self._last.text = fresh
            return fresh
        text: str = getattr(self._last, "text", "")
        return text

    def _errcheck(self, result: int, function: Any, arguments: tuple[Any, ...]) -> int:
        """THE checker: a non-zero ``aclError`` becomes the typed error with the runtime text."""
        if result:
            message = self._fetch_message()
            self._last.text = message
            raise error_for_code(result, function.__name__, message)
        return result

    def ensure_initialised(self) -> None:
        """``aclInit(NULL)`` once per process; refuse a child forked after it."""
        pid = os.getpid()
        with self.lock:
            if self.init_pid is not None:
                if self.init_pid != pid:
                    raise _fork_error(self.init_pid)
                return
            try:
                self.functions["aclInit"](None)
            except RuntimeAPIError as exc:
                if exc.code != ffi.ACL_ERROR_REPEAT_INITIALIZE:
                    raise BackendUnavailableError(
                        f"aclInit failed: {exc}", code=exc.code, func="aclInit"
                    ) from exc
                # someone else in this process initialised ACL: theirs to finalise
            else:
                self.initialised_by_us = True
                atexit.register(self._finalize_at_exit)
            self.init_pid = pid

    def _finalize_at_exit(self) -> None:
        if self.initialised_by_us and self.init_pid == os.getpid():
            self.initialised_by_us = False
            try:
                self.functions["aclFinalize"]()
            except AscendError:
                pass

    def device_count(self) -> int:
        count = c_uint32()
        self.functions["aclrtGetDeviceCount"](byref(count))
        return count.value


_LIBRARIES: dict[str, _Library] = {}
_LIBRARIES_LOCK = threading.Lock()


def _fork_error(init_pid: int) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"the acl backend was initialised in process {init_pid}; this process "
        f"({os.getpid()}) is a fork of it and cannot use ACL (the runtime does not survive "
        "fork). Open the device in the child only, or use the 'spawn' start method."
    )


def _load_library(library_path: str | os.PathLike[str] | None) -> _Library:
    tried: list[str] = []
    for candidate in library_candidates(library_path):
        is_path = os.sep in candidate
        if is_path and not os.path.exists(candidate):
            tried.append(f"{candidate}: no such file")
            continue
        key = os.path.realpath(candidate) if is_path else candidate
        with _LIBRARIES_LOCK:
            cached = _LIBRARIES.get(key)
            if cached is not None:
                return cached
            try:
                cdll = ctypes.CDLL(candidate)
            except OSError as exc:
                tried.append(f"{candidate}: {exc}")
                continue
            try:
                functions = ffi.bind(cdll)
            except AttributeError as exc:
                tried.append(
                    f"{candidate}: loaded, but a required symbol is missing ({exc}); "
                    "aclrtLaunchKernelWithHostArgs needs CANN 8.5 or newer"
                )
                continue
            library = _LIBRARIES[key] = _Library(candidate, cdll, functions)
            return library
    raise BackendUnavailableError(
        f"cannot load {LIBRARY_NAME}; tried:\n  "
        + "\n  ".join(tried)
        + "\nInstall CANN and source its set_env.sh (sets ASCEND_HOME_PATH), or pass "
        "library_path=."
    )


def probe() -> tuple[bool, str]:
    """Whether the ``acl`` backend can run here, and why (never raises)."""
    try:
        library = _load_library(None)
        library.ensure_initialised()
        count = library.device_count()
    except AscendError as exc:
        return False, str(exc)
    except Exception as exc:  # a probe must not raise
        return False, f"{type(exc).__name__}: {exc}"
    if count <= 0:
        return False, f"{library.path} loaded, but no Ascend device is visible"
    return True, f"{library.path}, {count} device(s)"


# --- per-thread scratch out-params ----------------------------------------------------------


class _Scratch(threading.local):
    """Out-parameters reused by the calls of one thread (never shared between threads)."""

    def __init__(self) -> None:
        self.handle = c_void_p()
        self.handle_ref = byref(self.handle)
        self.status = c_int()
        self.status_ref = byref(self.status)
        self.ms = c_float()
        self.ms_ref = byref(self.ms)


# --- launch configs -------------------------------------------------------------------------

# id(LaunchConfig) -> (the config, its attribute array, byref(cfg struct)); the config is kept
# so the id cannot be reused while its entry lives. The runtime only reads cfg during the call.
_CFG_CACHE: dict[int, tuple[LaunchConfig, Any, Any]] = {}
_CFG_CACHE_MAX = 256


def _cfg_arg(cfg: object) -> Any:
    """The ``aclrtLaunchKernelCfg *`` for ``cfg`` (``None`` -> NULL; no attributes -> NULL)."""
    entry = _CFG_CACHE.get(id(cfg))
    if entry is not None and entry[0] is cfg:
        return entry[2]
    if not isinstance(cfg, LaunchConfig):
        raise _launch_error(f"cfg must be a LaunchConfig or None, got {type(cfg).__name__}")
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


# --- the runtime ----------------------------------------------------------------------------

_LIVE: weakref.WeakSet[AclRuntime] = weakref.WeakSet()


def _refusing(exc_type: type[AscendError], message: str) -> dict[str, Any]:
    """A function table whose every entry raises ``exc_type(message)``."""

    def make(name: str) -> Any:
        def refuse(*args: object) -> NoReturn:
            raise exc_type(message, func=name)

        return refuse

    return {name: make(name) for name in ffi.PROTOTYPES}


class AclRuntime:
    """One device through ``libascendcl.so``. Create with :func:`open_acl_runtime`."""

    name = "acl"

    def __init__(self, library: _Library, device_id: int, context: int) -> None:
        self.device_id = device_id
        self.library_path = library.path
        self._library = library
        self._fn: dict[str, Any] = library.functions
        self._context = context
        self._tls = _Scratch()
        self._closed = False
        self._close_lock = threading.Lock()
        # what close() releases if the caller did not
        self._streams: set[int] = set()
        self._events: set[int] = set()
        self._device_memory: set[int] = set()
        self._host_memory: set[int] = set()
        self._binaries: dict[int, bytes | None] = {}
        self._first_fault: DeviceFaultError | None = None
        #: errors swallowed by the last close() (it never raises for leftovers)
        self.close_errors: tuple[AscendError, ...] = ()
        _LIVE.add(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<AclRuntime device={self.device_id} {state} library={self.library_path!r}>"

    @property
    def context(self) -> int:
        """The ``aclrtContext`` handle of this runtime."""
        return self._context

    def _new_handle(self) -> tuple[c_void_p, Any]:
        scratch = self._tls
        scratch.handle.value = None
        return scratch.handle, scratch.handle_ref

    @staticmethod
    def _handle_value(handle: c_void_p, func: str) -> int:
        value = handle.value
        if not value:
            raise InternalError(f"{func} succeeded but returned a NULL handle", func=func)
        return value

    # --- context and lifecycle ---------------------------------------------------------

    def set_current_context(self) -> None:
        self._fn["aclrtSetCurrentContext"](self._context)

    def get_recent_error_message(self) -> str:
        return self._library.recent_message()

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            fn = self._fn
            self._fn = _refusing(ClosedError, "the acl runtime is closed")
        _LIVE.discard(self)
        if fn is not self._library.functions:  # forked child: nothing may touch ACL
            return
        errors: list[AscendError] = []

        def attempt(name: str, *args: object) -> Any:
            try:
                return fn[name](*args)
            except AscendError as exc:
                errors.append(exc)
                return None

        previous = c_void_p()
        try:
            fn["aclrtGetCurrentContext"](byref(previous))
        except AscendError:
            previous.value = None
        attempt("aclrtSetCurrentContext", self._context)
        for stream in list(self._streams):
            attempt("aclrtDestroyStreamForce", stream)
        for event in list(self._events):
            attempt("aclrtDestroyEvent", event)
        for binary in list(self._binaries):
            attempt("aclrtBinaryUnLoad", binary)
        for pointer in list(self._device_memory):
            attempt("aclrtFree", pointer)
        for pointer in list(self._host_memory):
            attempt("aclrtFreeHost", pointer)
        self._streams.clear()
        self._events.clear()
        self._binaries.clear()
        self._device_memory.clear()
        self._host_memory.clear()
        attempt("aclrtDestroyContext", self._context)
        attempt("aclrtResetDevice", self.device_id)
        if previous.value and previous.value != self._context:
            # leave the calling thread bound to whatever it used before (another device)
            attempt("aclrtSetCurrentContext", previous.value)
        self.close_errors = tuple(errors)

    def _sticky(self, exc: DeviceFaultError) -> RuntimeAPIError:
        """Keep the first fault's text on every later report of the same fault.

        After a fault the context is halted and every later call returns the fault's code; what
        ``aclGetRecentErrMsg`` says for those calls varies (often nothing useful), so they carry
        the text of the first report, as the contract asks.
        """
        first = self._first_fault
        if first is None:
            self._first_fault = exc
            return exc
        code = exc.code
        if code is None or code != first.code or exc.message == first.message:
            return exc
        return error_for_code(code, exc.func, first.message)

    def _disable_after_fork(self) -> None:
        parent = self._library.init_pid or os.getppid()
        self._fn = _refusing(BackendUnavailableError, _fork_error(parent).message)
        self._tls = _Scratch()
        self._close_lock = threading.Lock()

    # --- streams -----------------------------------------------------------------------

    def create_stream(self) -> int:
        handle, ref = self._new_handle()
        self._fn["aclrtCreateStream"](ref)
        stream = self._handle_value(handle, "aclrtCreateStream")
        self._streams.add(stream)
        return stream

    def destroy_stream(self, stream: int) -> None:
        stream = _ptr("stream", stream)
        self._fn["aclrtDestroyStream"](stream)
        self._streams.discard(stream)

    def destroy_stream_force(self, stream: int) -> None:
        stream = _ptr("stream", stream)
        self._fn["aclrtDestroyStreamForce"](stream)
        self._streams.discard(stream)

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        self._fn["aclrtSetStreamFailureMode"](
            _ptr("stream", stream), _in_range("mode", mode, 0, _U64_MAX)
        )

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        func = "aclrtSynchronizeStreamWithTimeout"
        try:
            self._fn[func](_ptr("stream", stream), _timeout(func, timeout_ms))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    # --- events ------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        flags = _in_range("flags", flags, 0, _U32_MAX)
        handle, ref = self._new_handle()
        self._fn["aclrtCreateEventExWithFlag"](ref, flags)
        event = self._handle_value(handle, "aclrtCreateEventExWithFlag")
        self._events.add(event)
        return event

    def destroy_event(self, event: int) -> None:
        event = _ptr("event", event)
        self._fn["aclrtDestroyEvent"](event)
        self._events.discard(event)

    def record_event(self, event: int, stream: int) -> None:
        if not (
            type(event) is int
            and type(stream) is int
            and 0 <= event <= _PTR_MAX
            and 0 <= stream <= _PTR_MAX
        ):
            event, stream = _ptr("event", event), _ptr("stream", stream)
        try:
            self._fn["aclrtRecordEvent"](event, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def query_event_status(self, event: int) -> int:
        if not (type(event) is int and 0 <= event <= _PTR_MAX):
            event = _ptr("event", event)
        scratch = self._tls
        try:
            self._fn["aclrtQueryEventStatus"](event, scratch.status_ref)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None
        # compare by name: aclrtEventRecordedStatus has NOT_READY = 0, COMPLETE = 1
        if scratch.status.value == _STATUS_COMPLETE:
            return _STATUS_COMPLETE
        return _STATUS_NOT_READY

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        func = "aclrtSynchronizeEventWithTimeout"
        try:
            self._fn[func](_ptr("event", event), _timeout(func, timeout_ms))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def stream_wait_event(self, stream: int, event: int) -> None:
        try:
            self._fn["aclrtStreamWaitEvent"](_ptr("stream", stream), _ptr("event", event))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def event_elapsed_time(self, start: int, end: int) -> float:
        start, end = _ptr("start", start), _ptr("end", end)
        scratch = self._tls
        self._fn["aclrtEventElapsedTime"](scratch.ms_ref, start, end)
        return float(scratch.ms.value)

    # --- memory ------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        size = _in_range("size", size, 0, _SIZE_MAX)
        handle, ref = self._new_handle()
        self._fn["aclrtMalloc"](ref, size, ffi.ACL_MEM_MALLOC_HUGE_FIRST)
        pointer = self._handle_value(handle, "aclrtMalloc")
        self._device_memory.add(pointer)
        return pointer

    def free(self, ptr: int) -> None:
        ptr = _ptr("ptr", ptr)
        self._fn["aclrtFree"](ptr)
        self._device_memory.discard(ptr)

    def malloc_host(self, size: int) -> int:
        size = _in_range("size", size, 0, _SIZE_MAX)
        handle, ref = self._new_handle()
        self._fn["aclrtMallocHost"](ref, size)
        pointer = self._handle_value(handle, "aclrtMallocHost")
        self._host_memory.add(pointer)
        return pointer

    def free_host(self, ptr: int) -> None:
        ptr = _ptr("ptr", ptr)
        self._fn["aclrtFreeHost"](ptr)
        self._host_memory.discard(ptr)

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        if not (
            type(dst) is int
            and type(dst_max) is int
            and type(src) is int
            and type(count) is int
            and type(kind) is int
            and type(stream) is int
            and 0 <= dst <= _PTR_MAX
            and 0 <= src <= _PTR_MAX
            and 0 <= stream <= _PTR_MAX
            and 0 <= dst_max <= _SIZE_MAX
            and 0 <= count <= _SIZE_MAX
            and _I32_MIN <= kind <= _I32_MAX
        ):
            dst, src, stream = _ptr("dst", dst), _ptr("src", src), _ptr("stream", stream)
            dst_max = _in_range("dst_max", dst_max, 0, _SIZE_MAX)
            count = _in_range("count", count, 0, _SIZE_MAX)
            kind = _in_range("kind", kind, _I32_MIN, _I32_MAX)
        try:
            self._fn["aclrtMemcpyAsync"](dst, dst_max, src, count, kind, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    # --- kernels -----------------------------------------------------------------------

    def load_binary(self, source: object) -> int:
        """Load a kernel binary: a path (``str``/``PathLike``) or its bytes; ``None``: built-ins.

        A path is made absolute (the runtime requires it) and loaded with
        ``aclrtBinaryLoadFromFile``; bytes-like data with ``aclrtBinaryLoadFromData`` (the data
        is kept until the binary is unloaded). ``None`` loads the file named by
        ``$AIO_ASCEND_ACL_BUILTINS``.
        """
        if source is None:
            builtins = os.environ.get(ENV_BUILTINS, "").strip()
            if not builtins:
                raise BackendUnavailableError(
                    "the acl backend has no built-in kernels of its own: set "
                    f"{ENV_BUILTINS} to the path of a kernel binary that provides them "
                    "(vector_add, axpy, scale, matmul, sleep, fault, hang, noop)"
                )
            source = builtins
        handle, ref = self._new_handle()
        data: bytes | None = None
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            if not data:
                raise ValueError("load_binary: the kernel binary data is empty")
            self._fn["aclrtBinaryLoadFromData"](data, len(data), None, ref)
            func = "aclrtBinaryLoadFromData"
        elif isinstance(source, str | os.PathLike):
            path = os.path.abspath(os.fspath(source))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"load_binary: no kernel binary at {path!r}")
            self._fn["aclrtBinaryLoadFromFile"](os.fsencode(path), None, ref)
            func = "aclrtBinaryLoadFromFile"
        else:
            raise TypeError(
                "load_binary takes a path (str or os.PathLike), bytes-like data or None, "
                f"got {type(source).__name__}"
            )
        binary = self._handle_value(handle, func)
        self._binaries[binary] = data
        return binary

    def unload_binary(self, binary: int) -> None:
        binary = _ptr("binary", binary)
        self._fn["aclrtBinaryUnLoad"](binary)
        self._binaries.pop(binary, None)

    def get_function(self, binary: int, name: str) -> int:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        encoded = name.encode("utf-8")
        if b"\0" in encoded or not encoded:
            raise ValueError(f"name={name!r} is not a valid kernel name")
        binary = _ptr("binary", binary)
        handle, ref = self._new_handle()
        self._fn["aclrtBinaryGetFunction"](binary, encoded, ref)
        return self._handle_value(handle, "aclrtBinaryGetFunction")

    def launch_kernel_with_host_args(
        self,
        func: int,
        num_blocks: int,
        stream: int,
        cfg: LaunchConfig | None,
        args_addr: int,
        args_size: int,
        placeholders_addr: int,
        placeholder_count: int,
    ) -> None:
        if not (
            type(func) is int
            and type(num_blocks) is int
            and type(stream) is int
            and type(args_addr) is int
            and type(args_size) is int
            and type(placeholders_addr) is int
            and type(placeholder_count) is int
            and 0 <= func <= _PTR_MAX
            and 0 <= stream <= _PTR_MAX
            and 0 <= args_addr <= _PTR_MAX
            and 0 <= placeholders_addr <= _PTR_MAX
            and 0 <= num_blocks <= _MAX_NUM_BLOCKS
            and 0 <= args_size <= _U32_MAX
            and 0 <= placeholder_count <= _MAX_PLACEHOLDERS
        ):
            func, num_blocks, stream, args_addr, args_size, placeholders_addr = _check_launch(
                func,
                num_blocks,
                stream,
                args_addr,
                args_size,
                placeholders_addr,
                placeholder_count,
            )
        if placeholder_count:
            _check_placeholder_table(placeholders_addr, placeholder_count)
        try:
            self._fn["aclrtLaunchKernelWithHostArgs"](
                func,
                num_blocks,
                stream,
                None if cfg is None else _cfg_arg(cfg),
                args_addr,
                args_size,
                placeholders_addr,
                placeholder_count,
            )
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None


_LAUNCH = "aclrtLaunchKernelWithHostArgs"
#: more placeholders than a kernel can have parameters is a caller bug (ACL allows 128)
_MAX_PLACEHOLDERS = 4096
_ENTRY = struct.Struct("<II")


def _launch_error(message: str) -> InvalidParamError:
    return InvalidParamError(message, code=ffi.ACL_ERROR_RT_PARAM_INVALID, func=_LAUNCH)


def _check_launch(
    func: object,
    num_blocks: object,
    stream: object,
    args_addr: object,
    args_size: object,
    placeholders_addr: object,
    placeholder_count: object,
) -> tuple[int, int, int, int, int, int]:
    """The slow path of the launch checks: precise errors naming the argument."""
    blocks = _as_int("num_blocks", num_blocks)
    if not 0 <= blocks <= _MAX_NUM_BLOCKS:
        # The runtime would cast numBlocks to uint16 on this path: refuse, never wrap.
        raise _launch_error(f"num_blocks (numBlocks)={blocks} is out of range 1..{_MAX_NUM_BLOCKS}")
    size = _as_int("args_size", args_size)
    if not 0 <= size <= _U32_MAX:
        # argsSize is a size_t, but the runtime uses it as a uint32
        raise _launch_error(f"args_size (argsSize)={size} is out of range 1..{_U32_MAX}")
    count = _as_int("placeholder_count", placeholder_count)
    if not 0 <= count <= _MAX_PLACEHOLDERS:
        raise _launch_error(
            f"placeholder_count (placeHolderNum)={count} is out of range 0..{_MAX_PLACEHOLDERS}"
        )
    return (
        _ptr("func", func),
        blocks,
        _ptr("stream", stream),
        _ptr("args_addr", args_addr),
        size,
        _ptr("placeholders_addr", placeholders_addr),
    )


def _check_placeholder_table(table: int, count: int) -> None:
    """Refuse a NULL table and misaligned entries (the runtime checks only the ranges).

    A slot at an unaligned ``addrOffset`` or data at an unaligned ``dataOffset`` would hand the
    kernel a misaligned pointer; the ranges (``addrOffset + 8 <= argsSize``,
    ``dataOffset < argsSize``) are left to the runtime.
    """
    if not table:
        raise _launch_error(
            f"placeholders_addr (placeHolderArray) is NULL with placeholder_count={count}"
        )
    data = ctypes.string_at(table, _ENTRY.size * count)
    for index, (addr_offset, data_offset) in enumerate(_ENTRY.iter_unpack(data)):
        if addr_offset % 8:
            raise _launch_error(f"placeholder {index}: addrOffset={addr_offset} is not 8-aligned")
        if data_offset % 8:
            raise _launch_error(f"placeholder {index}: dataOffset={data_offset} is not 8-aligned")


def open_acl_runtime(
    device_id: int, *, library_path: str | os.PathLike[str] | None = None
) -> AclRuntime:
    """Open ``device_id`` through ``libascendcl.so`` and bind its new context to this thread.

    ``aclInit`` (once per process), ``aclrtSetDevice``, ``aclrtCreateContext``.
    :raises BackendUnavailableError: the library cannot be loaded (the message lists every
        path tried), ``aclInit`` failed, or this is a forked child of the process that
        initialised ACL.
    """
    device_id = _in_range("device_id", device_id, 0, _I32_MAX)
    library = _load_library(library_path)
    library.ensure_initialised()
    fn = library.functions
    fn["aclrtSetDevice"](device_id)
    context = c_void_p()
    try:
        fn["aclrtCreateContext"](byref(context), device_id)
    except BaseException:
        try:
            fn["aclrtResetDevice"](device_id)
        except AscendError:
            pass
        raise
    if not context.value:
        raise InternalError("aclrtCreateContext returned a NULL context", func="aclrtCreateContext")
    return AclRuntime(library, device_id, context.value)


def _after_fork_in_child() -> None:
    global _LIBRARIES_LOCK
    _LIBRARIES_LOCK = threading.Lock()
    for library in list(_LIBRARIES.values()):
        library.lock = threading.Lock()
    for runtime in list(_LIVE):
        runtime._disable_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
