"""The ``acl`` backend: the :class:`~aio_ascend._runtime.Runtime` seam over ``libascendcl.so``.

Loading the library and ``aclInit`` live in :mod:`.library`; this module is the runtime class.
Every value is checked before it reaches a C type that would silently narrow it: the ACL
argument rules with the shared checks of :mod:`..abi` (the same ones the sim and cuda backends
run), and plain C ranges (handles, sizes) here, as ``TypeError``/``ValueError``.
"""

from __future__ import annotations

import os
import threading
import weakref
from ctypes import byref, c_int32, c_void_p
from typing import Any, Final

from ..._errors import (
    AscendError,
    BackendUnavailableError,
    ClosedError,
    DeviceFaultError,
    InternalError,
    RuntimeAPIError,
    error_for_code,
)
from ..._launch_config import LaunchConfig
from ..abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_STREAM_CAPACITY,
    INT32_MAX,
    PTR_MAX,
    SIZE_MAX,
    UINT32_MAX,
    UINT64_MAX,
    KernelType,
    check_binary_source,
    check_event_flags,
    check_failure_mode,
    check_kernel_name,
    check_load_options,
    check_memcpy,
    check_placeholder_table,
    copy_fields_fit,
    launch_fields_fit,
    param_error,
)
from ..base import FunctionInfo, LaunchBatch
from . import ffi as ffi
from .argshandle import launch_with_args_handle
from .batch import native_batch
from .contexts import ThreadContexts, open_context
from .devargs import DeviceArgsPath, load_legacy
from .exceptions import Sites
from .facts import ACL_HBM_MEM, device_facts
from .graphs import AclCapture
from .kernels import read_function_info
from .library import (
    LIBRARY_NAME,
    AclLibrary,
    device_count,
    fork_error,
    library_candidates,
    probe,
    usable_library,
)
from .loaders import builtins_path, load_binary_from
from .paths import LaunchPath
from .settle import Settle
from .values import LAUNCH as _LAUNCH
from .values import Scratch as _Scratch
from .values import as_int as _as_int
from .values import cfg_arg as _cfg_arg
from .values import check_launch as _check_launch
from .values import in_range as _in_range
from .values import ptr as _ptr
from .values import refusing as _refusing
from .values import timeout as _timeout

__all__ = [
    "ACL_HBM_MEM",
    "ACL_STREAM_ATTR_PRIORITY",
    "ENV_BUILTINS",
    "LIBRARY_NAME",
    "AclRuntime",
    "device_count",
    "library_candidates",
    "open_acl_runtime",
    "probe",
]

#: path of a kernel binary providing the built-in kernels (``load_binary(None)``)
ENV_BUILTINS = "AIO_ASCEND_ACL_BUILTINS"

_MEMSET = "aclrtMemsetAsync"
_SET_ATTR = "aclrtSetStreamAttribute"

# Constants only this backend passes (the shared ones are abi's); the ABI test checks them
# against the docs they come from.
#: ``aclrtStreamAttr``: the stream priority attribute (acl-runtime.md §2.1; CANN headers older
#: than the attribute define only 1..4)
ACL_STREAM_ATTR_PRIORITY: Final = 5


# --- the runtime ----------------------------------------------------------------------------

_LIVE: weakref.WeakSet[AclRuntime] = weakref.WeakSet()


class AclRuntime:
    """One device through ``libascendcl.so``. Create with :func:`open_acl_runtime`. The graph
    calls (model-RI capture) go to its :class:`~.graphs.AclCapture`."""

    name = "acl"
    launch_batch: LaunchBatch | None = None  # base.LaunchBatch: host args, if built (.batch)
    ordered_task_ids = False  # (flip << 16) | id: wraps, and counts the runtime's own tasks

    def __init__(
        self,
        library: AclLibrary,
        device_id: int,
        contexts: tuple[int, int],
        stream_capacity: int = ACL_STREAM_CAPACITY,
        exception_callback: bool = True,
    ) -> None:
        self.device_id = device_id
        self.stream_capacity = stream_capacity
        self.library_path = library.path
        self._library = library
        assert library.launch_path is not None  # usable_library refuses a library without one
        self._path = library.launch_path
        if self._path is LaunchPath.ARGS_HANDLE:
            self.launch_kernel_with_host_args = self._launch_args_handle  # type: ignore[method-assign]
        elif self._path is LaunchPath.HOST_ARGS:  # runs of launches in one native call, if built
            self.launch_batch = native_batch(
                library, lambda: self._fn is library.functions, self._sticky
            )
        # Before CANN 9.1 the headers lack ACL_STREAM_ATTR_PRIORITY (cann-support.md row 42):
        # a priority is given at creation (aclrtCreateStreamWithConfig, 8.5 on) instead.
        version = library.version_tuple
        self._priority_at_creation = (
            library.has("aclrtCreateStreamWithConfig") and version is not None and version < (9, 1)
        )
        self._fn: dict[str, Any] = library.functions
        #: (context, primary context): see contexts.py
        self._contexts = ThreadContexts(library.functions, *contexts)
        self._context = contexts[0]
        self._tls = _Scratch()
        self._closed = False
        self._close_lock = threading.Lock()
        # what close() releases if the caller did not
        self._streams: set[int] = set()
        self._events: set[int] = set()
        self._device_memory: set[int] = set()
        self._host_memory: dict[int, int] = {}  # pinned: address -> size
        #: model-RI capture and replay: the streams capturing, the graphs
        self.capture = AclCapture(lambda name: self._fn[name], self.is_pinned, self._sticky)
        self._capturing = self.capture.streams
        #: binary -> (its data when loaded from bytes, its kernel type if known)
        self._binaries: dict[int, tuple[bytes | None, KernelType | None]] = {}
        self._function_binary: dict[int, int] = {}  # function handle -> its binary
        self._infos: dict[int, FunctionInfo] = {}  # function handle -> what function_info read
        #: those three are written by the loop (loads, lookups) and by whatever thread unloads
        #: a module (its last launch's release: the poller's, often)
        self._binary_lock = threading.Lock()
        self._first_fault: DeviceFaultError | None = None
        #: the runtime's exception reports (registered before any launch), scoped to this open
        self._sites = Sites(library, exception_callback=exception_callback)
        #: frees wait for the device after a stream was destroyed by force (settle.py)
        self.settle = Settle(device_id, library)
        #: the device-args path (CANN 8.0: :mod:`.devargs`), None on the others
        self._devargs: DeviceArgsPath | None = None
        if self._path is LaunchPath.DEVICE_ARGS:
            self._devargs = DeviceArgsPath(
                self,
                table=lambda: self._fn,
                streams=self._streams,
                functions=self._function_binary,
                capturing=self._capturing,
                sticky=self._sticky,
            )
            self.launch_kernel_with_host_args = self._devargs.launch  # type: ignore[method-assign]
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

    @property
    def launch_path(self) -> str:
        """How kernels are launched on the loaded release: ``"host_args"``
        (``aclrtLaunchKernelWithHostArgs``), ``"args_handle"`` (``aclrtKernelArgs*`` +
        ``aclrtLaunchKernelWithConfig``) or ``"device_args"`` (``aclrtLaunchKernel``, CANN 8.0);
        see ``docs/cann-support.md``."""
        return self._path.value

    @property
    def cann_version(self) -> str | None:
        """The CANN release (``aclsysGetCANNVersion``; ``None`` before 8.2, which lacks it)."""
        return self._library.cann_version

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

    def set_current_context(self, context: int | None = None) -> None:
        """See the protocol; another context is bound through the library itself, so that a
        thread can be given its context back after :meth:`close` too."""
        if context is None or context == self._context:
            self._fn["aclrtSetCurrentContext"](self._context)
            return
        self._contexts.bind(context)

    def get_current_context(self) -> int | None:
        """``aclrtGetCurrentContext`` (``None`` when the thread has none: 107002)."""
        return self._contexts.current()

    def release_thread(self) -> None:
        """See the protocol: the primary context is bound instead (contexts.py)."""
        self._contexts.release()

    def get_recent_error_message(self) -> str:
        return self._library.recent_message()

    def must_settle(self) -> bool:
        """See the protocol."""
        return self.settle.unsettled and not self._closed

    def wait_settled(self, limit_s: float | None = None) -> None:
        """See the protocol: ``Settle.wait`` on this thread, bound to this context meanwhile."""
        if self._closed or not self.settle.unsettled:
            return
        try:
            with self._contexts.lent():
                self.settle.wait(limit_s)
        except AscendError:
            pass  # the close decides (and waits itself if nothing was learnt here)

    def leaked_device_blocks(self) -> int:
        """See the protocol: what the close's ``Settle.release`` leaked (any thread)."""
        return sum(kind == "device" for kind, _ in tuple(self.settle.leaked))

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            fn = self._fn
            self._fn = _refusing(ClosedError, "the acl runtime is closed")
        _LIVE.discard(self)
        self.launch_batch = None  # it refers back to this runtime: no cycle once closed
        if fn is not self._library.functions or self._library.finalized:  # forked, exiting
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
        self.capture.close(attempt)
        if self._devargs is not None:
            self._devargs.forget_all()  # its memory and fences are freed below
        for stream in list(self._streams):  # (a stream found complete frees its id at once)
            drained = self.settle.force(stream, lambda s: attempt("aclrtDestroyStreamForce", s))
            self._sites.forget(stream, drained=drained)
        for event in list(self._events):
            attempt("aclrtDestroyEvent", event)
        memory, host, binaries = self._device_memory, self._host_memory, self._binaries
        # freed once the device settled; else leaked, and the context with them
        if self.settle.release(attempt, binary=binaries, device=memory, host=host):
            attempt("aclrtDestroyContext", self._context)
            attempt("aclrtResetDevice", self.device_id)
        self._sites.drop(self.device_id)  # (after the settle: a forced kernel's late fault)
        for held in (self._streams, self._events, binaries, memory, host):
            held.clear()
        if previous.value and previous.value not in (self._context, self._contexts.primary):
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

    def disable_after_fork(self) -> None:
        """In a forked child: refuse every call (ACL does not survive fork)."""
        parent = self._library.init_pid or os.getppid()
        self._fn = _refusing(BackendUnavailableError, fork_error(parent).message)
        self._tls = _Scratch()
        self._close_lock = threading.Lock()

    # --- streams -----------------------------------------------------------------------

    def create_stream(self, priority: int | None = None) -> int:
        """``aclrtCreateStream``, then ``aclrtSetStreamAttribute(ACL_STREAM_ATTR_PRIORITY)``
        when ``priority`` is given (not ``aclrtCreateStreamWithConfig``, whose priority argument
        recent releases call "reserved": acl-runtime.md §2.1). On a release before 9.1, whose
        headers lack the priority attribute, ``aclrtCreateStreamWithConfig(priority, 0)``.

        The priority is checked against :meth:`stream_priority_range` first; if setting it fails
        the new stream is destroyed before the error propagates.
        """
        value: ffi.AclrtStreamAttrValue | None = None
        if priority is not None:
            number = _as_int("priority", priority)
            least, greatest = self.stream_priority_range()
            if not greatest <= number <= least:
                raise param_error(
                    _SET_ATTR,
                    f"priority (streamPriority)={number}: expected {greatest}..{least} "
                    f"({greatest} is the most urgent)",
                )
            value = ffi.AclrtStreamAttrValue()  # zeroed: the whole 16 bytes cross
            value.streamPriority = number
        handle, ref = self._new_handle()
        fn = self._fn
        if value is not None and self._priority_at_creation:
            fn["aclrtCreateStreamWithConfig"](ref, value.streamPriority, 0)
            return self._note_stream(self._handle_value(handle, "aclrtCreateStreamWithConfig"))
        fn["aclrtCreateStream"](ref)
        stream = self._handle_value(handle, "aclrtCreateStream")
        if value is not None:
            try:
                fn[_SET_ATTR](stream, ACL_STREAM_ATTR_PRIORITY, byref(value))
            except BaseException:
                try:
                    fn["aclrtDestroyStreamForce"](stream)
                except AscendError:
                    pass
                raise
        return self._note_stream(stream)

    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = c_int32(), c_int32()
        self._fn["aclrtDeviceGetStreamPriorityRange"](byref(least), byref(greatest))
        return least.value, greatest.value

    def destroy_stream(self, stream: int) -> None:
        stream = _ptr("stream", stream)
        self.capture.abort(stream)
        self._fn["aclrtDestroyStream"](stream)
        self._forget_stream(stream, drained=True)

    def destroy_stream_force(self, stream: int) -> None:
        stream = _ptr("stream", stream)
        self.capture.abort(stream)
        drained = self.settle.force(stream, self._fn["aclrtDestroyStreamForce"])
        self._forget_stream(stream, drained=drained)

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        self._fn["aclrtSetStreamFailureMode"](
            _ptr("stream", stream),
            check_failure_mode("aclrtSetStreamFailureMode", _in_range("mode", mode, 0, UINT64_MAX)),
        )

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        func = "aclrtSynchronizeStreamWithTimeout"
        stream = _ptr("stream", stream)
        self.capture.refuse(stream, func)
        try:
            self._fn[func](stream, _timeout(func, timeout_ms))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    # --- events ------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        func = "aclrtCreateEventExWithFlag"
        flags = check_event_flags(func, _in_range("flags", flags, 0, UINT32_MAX))
        handle, ref = self._new_handle()
        self._fn[func](ref, flags)
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
            and 0 <= event <= PTR_MAX
            and 0 <= stream <= PTR_MAX
        ):
            event, stream = _ptr("event", event), _ptr("stream", stream)
        if stream in self._capturing:
            self.capture.refuse(stream, "aclrtRecordEvent")
        try:
            self._fn["aclrtRecordEvent"](event, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def query_event_status(self, event: int) -> int:
        if not (type(event) is int and 0 <= event <= PTR_MAX):
            event = _ptr("event", event)
        scratch = self._tls
        try:
            self._fn["aclrtQueryEventStatus"](event, scratch.status_ref)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None
        # compare by name: aclrtEventRecordedStatus has NOT_READY = 0, COMPLETE = 1
        if scratch.status.value == ACL_EVENT_RECORDED_STATUS_COMPLETE:
            return ACL_EVENT_RECORDED_STATUS_COMPLETE
        return ACL_EVENT_RECORDED_STATUS_NOT_READY

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        func = "aclrtSynchronizeEventWithTimeout"
        try:
            self._fn[func](_ptr("event", event), _timeout(func, timeout_ms))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def fault_site(self) -> tuple[int, int] | None:
        """See the protocol: from the runtime's exception info (:mod:`.exceptions`): the first
        report of a task on one of this runtime's streams; ``None`` before one arrives."""
        return self._sites.site(self.device_id)

    def last_task_id(self) -> int | None:
        """See the protocol: ``aclrtGetThreadLastTaskId`` (8.2 on; ``None`` before)."""
        return self._sites.last_task_id(self._tls)

    def _note_stream(self, stream: int) -> int:
        """Keep ``stream`` for close, and its id for exception reports (8.2 on)."""
        self._streams.add(stream)
        self._sites.note(stream, self._fn)
        return stream

    def _forget_stream(self, stream: int, *, drained: bool) -> None:
        self._streams.discard(stream)
        if self._devargs is not None:
            self._devargs.forget_stream(stream, drained=drained)
        self._sites.forget(stream, drained=drained)

    def stream_wait_event(self, stream: int, event: int) -> None:
        stream = _ptr("stream", stream)
        self.capture.refuse(stream, "aclrtStreamWaitEvent")
        try:
            self._fn["aclrtStreamWaitEvent"](stream, _ptr("event", event))
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def event_elapsed_time(self, start: int, end: int) -> float:
        start, end = _ptr("start", start), _ptr("end", end)
        scratch = self._tls
        self._fn["aclrtEventElapsedTime"](scratch.ms_ref, start, end)
        return float(scratch.ms.value)

    # --- memory ------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        size = _in_range("size", size, 0, SIZE_MAX)
        handle, ref = self._new_handle()
        self._fn["aclrtMalloc"](ref, size, ACL_MEM_MALLOC_HUGE_FIRST)
        pointer = self._handle_value(handle, "aclrtMalloc")
        self._device_memory.add(pointer)
        return pointer

    def free(self, ptr: int) -> None:
        ptr = _ptr("ptr", ptr)
        if not self.settle.free("device", ptr):  # deferred: a forced stream may still use it
            return self._device_memory.discard(ptr)
        self._fn["aclrtFree"](ptr)
        self._device_memory.discard(ptr)

    def malloc_host(self, size: int) -> int:
        size = _in_range("size", size, 0, SIZE_MAX)
        handle, ref = self._new_handle()
        self._fn["aclrtMallocHost"](ref, size)
        pointer = self._handle_value(handle, "aclrtMallocHost")
        self._host_memory[pointer] = size
        return pointer

    def free_host(self, ptr: int) -> None:
        ptr = _ptr("ptr", ptr)
        if not self.settle.free("host", ptr):
            self._host_memory.pop(ptr, None)
            return None
        self._fn["aclrtFreeHost"](ptr)
        self._host_memory.pop(ptr, None)

    def is_pinned(self, address: int, count: int) -> bool:
        """Whether ``[address, address + count)`` lies in one ``malloc_host`` allocation."""
        return any(
            base <= address and address + count <= base + size
            for base, size in self._host_memory.items()
        )

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        if not copy_fields_fit(dst, dst_max, src, count, kind, stream):
            # the slow path words the refusal (or converts numpy ints)
            dst, src, stream = _ptr("dst", dst), _ptr("src", src), _ptr("stream", stream)
            dst_max = _in_range("dst_max", dst_max, 0, SIZE_MAX)
            count = _in_range("count", count, 0, SIZE_MAX)
            kind = _as_int("kind", kind)
            check_memcpy("aclrtMemcpyAsync", dst, dst_max, src, count, kind)
        if stream in self._capturing:
            self.capture.check_copy(dst, src, count, kind, "aclrtMemcpyAsync")
        try:
            self._fn["aclrtMemcpyAsync"](dst, dst_max, src, count, kind, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def memset_async(self, ptr: int, dst_max: int, value: int, count: int, stream: int) -> None:
        ptr, stream = _ptr("ptr", ptr), _ptr("stream", stream)
        dst_max = _in_range("dst_max", dst_max, 0, SIZE_MAX)
        count = _in_range("count", count, 0, SIZE_MAX)
        value = _as_int("value", value)
        if not ptr:
            raise param_error(_MEMSET, "ptr (devPtr) is NULL")
        if count > dst_max:
            raise param_error(_MEMSET, f"count={count} is larger than maxCount={dst_max}")
        if not 0 <= value <= 255:
            raise param_error(_MEMSET, f"value={value}: expected a byte value 0..255")
        try:
            self._fn[_MEMSET](ptr, dst_max, value, count, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    # --- information -------------------------------------------------------------------

    def info(self) -> dict[str, object]:
        """The runtime seam's keys plus what the release can tell (:func:`.facts.device_facts`:
        ``cann_version``, ``launch_path``, ``soc_name``, core counts, ``library_path``; a value
        is ``None`` where the loaded release lacks the function that would say)."""
        facts = device_facts(self._fn, self._library, self.device_id)
        facts["launch_path"] = self.launch_path
        facts["library_path"] = self.library_path
        facts["native_submit"] = self.launch_batch is not None
        return facts

    # --- graphs (model-RI capture: :mod:`.graphs`) ---------------------------------------

    def begin_capture(self, stream: int) -> None:
        """``aclmdlRICaptureBegin`` in relaxed mode: work submitted to ``stream`` from now on
        is recorded, not run, until :meth:`end_capture`."""
        self.capture.begin(stream)

    def end_capture(self, stream: int) -> int:
        """``aclmdlRICaptureEnd``: the recorded work as a graph handle."""
        return self.capture.end(stream)

    def launch_graph(self, graph: int, stream: int) -> None:
        """``aclmdlRIExecuteAsync``: queue one replay of ``graph`` on ``stream``."""
        self.capture.launch(graph, stream)

    def destroy_graph(self, graph: int) -> None:
        """``aclmdlRIDestroy`` (the caller makes sure no queued replay still needs it)."""
        self.capture.destroy(graph)

    # --- kernels -----------------------------------------------------------------------

    def load_binary(
        self,
        source: object,
        *,
        kernel_type: KernelType | None = None,
        lazy: bool | None = None,
    ) -> int:
        """Load a kernel binary: a path (``str``/``PathLike``) or bytes-like data (a NumPy
        array too); ``None``: the built-ins, the file named by ``$AIO_ASCEND_ACL_BUILTINS``.

        A path (made absolute: the runtime requires it) goes to ``aclrtBinaryLoadFromFile``, data
        to ``aclrtBinaryLoadFromData`` (a copy kept until the unload) or, on the args-handle path
        (8.2/8.3, whose ``aclrtBinaryLoadFromData`` is for AI CPU kernels), through a private
        temporary file (:mod:`.loaders`). ``kernel_type`` and ``lazy`` become
        ``aclrtBinaryLoadOptions`` (:mod:`.kernels`): a ``kernel_type`` for a file is refused
        (``ValueError``: the runtime refuses the magic option for files); a file's kernel type is
        read from the JSON beside it. CANN 8.0: the legacy loader, no options (:mod:`.devargs`).
        """
        kind, lazy = check_load_options(kernel_type, lazy)
        if source is None:
            source = builtins_path(ENV_BUILTINS)
        check_binary_source(source)  # (the built-ins' path too)
        if self._devargs is None:
            handle, ref = self._new_handle()
            func, data, kind = load_binary_from(self._fn, self._path, source, kind, lazy, ref)
            binary = self._handle_value(handle, func)
        else:  # CANN 8.0: the legacy loader (.devargs)
            binary, data, kind = load_legacy(
                self._fn, self._library.has, source, kind, lazy, self.get_recent_error_message
            )
        with self._binary_lock:
            self._binaries[binary] = (data, kind)
        return binary

    def unload_binary(self, binary: int) -> None:
        """``aclrtBinaryUnLoad``, from any thread. Its records go first, while its handles are
        its own: the runtime hands them out again once unloaded (to a load on the loop)."""
        binary = _ptr("binary", binary)
        with self._binary_lock:
            _kept = self._binaries.pop(binary, None)  # (its data, if any: kept through the call)
            for func in [f for f, b in self._function_binary.items() if b == binary]:
                del self._function_binary[func]
                self._infos.pop(func, None)
        if self.settle.free("binary", binary):  # else deferred: a forced stream may use it
            self._fn["aclrtBinaryUnLoad"](binary)

    def function_info(self, func: int) -> FunctionInfo:
        """See the protocol: the parameters the runtime reports (9.1 on), the hidden arguments
        of a MIX kernel on the host-args path, the data placement on the args-handle path
        (:func:`.kernels.read_function_info`)."""
        func = _ptr("func", func)
        info = self._infos.get(func)  # read once per function: the probe makes runtime calls
        if info is None:
            binary = self._function_binary.get(func)
            kind = None if binary is None else self._binaries.get(binary, (None, None))[1]
            overflow = None if self._devargs is None else self._devargs.overflow_address()
            info = read_function_info(self._fn, self._library.has, func, kind, self._path, overflow)
            self._infos[func] = info
        return info

    def get_function(self, binary: int, name: str) -> int:
        encoded = check_kernel_name(name)
        binary = _ptr("binary", binary)
        handle, ref = self._new_handle()
        self._fn["aclrtBinaryGetFunction"](binary, encoded, ref)
        func = self._handle_value(handle, "aclrtBinaryGetFunction")
        with self._binary_lock:
            self._function_binary[func] = binary
        return func

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
        if not launch_fields_fit(
            func, num_blocks, stream, args_addr, args_size, placeholders_addr, placeholder_count
        ):  # the slow path words the refusal (or converts numpy ints)
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
            check_placeholder_table(_LAUNCH, placeholders_addr, placeholder_count, args_size)
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

    def _launch_args_handle(
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
        """The seam's launch on the args-handle path (see :mod:`.argshandle`): the same checks,
        then the image replayed through ``aclrtKernelArgs*`` + ``aclrtLaunchKernelWithConfig``."""
        func, num_blocks, stream, args_addr, args_size, placeholders_addr = _check_launch(
            func, num_blocks, stream, args_addr, args_size, placeholders_addr, placeholder_count
        )
        entries = check_placeholder_table(_LAUNCH, placeholders_addr, placeholder_count, args_size)
        try:
            info = self._infos.get(func)
            launch_with_args_handle(
                self._fn,
                func,
                num_blocks,
                stream,
                None if cfg is None else _cfg_arg(cfg),
                args_addr,
                0 if info is not None and info.params == () else args_size,
                entries,
            )
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None


def check_acl_options(
    *,
    stream_capacity: object = ACL_STREAM_CAPACITY,
    exception_callback: object = True,
    **_: object,
) -> None:
    """The values of the acl backend's options (``open_device`` checks them in its call too;
    where the library is, ``library_path``, is found out only by loading it)."""
    _in_range("stream_capacity", stream_capacity, 2, INT32_MAX)
    if not isinstance(exception_callback, bool):
        raise TypeError(f"exception_callback must be a bool, got {exception_callback!r}")


def open_acl_runtime(
    device_id: int,
    *,
    library_path: str | os.PathLike[str] | None = None,
    stream_capacity: int = ACL_STREAM_CAPACITY,
    exception_callback: bool = True,
) -> AclRuntime:
    """Open ``device_id`` through ``libascendcl.so`` and bind its new context to this thread.

    :param stream_capacity: runtime queue entries per stream (default 1536: below every
        queue depth known, cann-support.md §12.1)
    :param exception_callback: set the process-wide ``aclrtSetExceptionInfoCallback`` where
        the release has no ``aclrtExceptionInfoCallbackRegister`` (it replaces another
        library's callback); ``False`` leaves it alone (faults are attributed per stream)

    ``aclInit`` (once per process), ``aclrtSetDevice``, ``aclrtCreateContext``.
    :raises BackendUnavailableError: the library cannot be loaded (the message lists every
        path tried), it has no launch path aio_ascend implements (the message names its
        release, the missing symbols and the paths tried), ``aclInit`` failed, or this is a
        forked child of the process that initialised ACL.
    """
    device_id = _in_range("device_id", device_id, 0, INT32_MAX)
    check_acl_options(stream_capacity=stream_capacity, exception_callback=exception_callback)
    stream_capacity = int(stream_capacity)
    library = usable_library(library_path)
    contexts = open_context(library.functions, device_id)
    return AclRuntime(library, device_id, contexts, stream_capacity, exception_callback)


def _after_fork_in_child() -> None:
    for runtime in list(_LIVE):
        runtime.disable_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
