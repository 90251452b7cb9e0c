"""The runtime seam: the ACL subset the scheduler needs, as plain synchronous Python calls.

A :class:`Runtime` is one backend bound to one device. Every method stands for the ACL function
named in its docstring and keeps its semantics; handles and host/device addresses are ``int``;
failures raise the typed errors of :mod:`aio_ascend._errors` (``RuntimeAPIError`` subclasses
carrying the ACL code). Methods may block the calling thread; none of them touches asyncio,
anyio or trio. The docstrings below are the contract every backend (``sim``, ``acl``, ``cuda``)
is tested against (the contract suite, ``tests/runtime/test_contract_*.py``).

Thread rules (as in ACL): contexts are per thread, and a thread has one current context (that
of any runtime, or one another library made). A thread must bind this runtime's context with
:meth:`Runtime.set_current_context` before any other call, except :meth:`Runtime.close`,
:meth:`Runtime.get_current_context` and :meth:`Runtime.function_info`; otherwise the call fails
with code 107002 (``ContextNullError``). Every backend also has ``get_recent_error_message()``
(``aclGetRecentErrMsg``, callable unbound): a diagnostic for people and the contract tests, which
the scheduler never calls, so it is not part of the seam.
A caller that must leave a thread as it found it (the event loop's thread, which another library
such as torch_npu may share) reads :meth:`Runtime.get_current_context` first and gives it back
with ``set_current_context(saved)`` after its call.

After :meth:`Runtime.close` every other method raises an ``AscendError`` (the sim raises
``ContextNullError``, the acl backend ``ClosedError``); callers must not rely on which.
After a device fault, calls that submit or observe work raise the fault's error, while
creation and cleanup calls (malloc, free, create/destroy stream and event) keep working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._errors import AscendError
    from .._launch_config import LaunchConfig
    from .abi import KernelType

__all__ = ["PLAIN_FUNCTION", "FunctionInfo", "LaunchBatch", "Runtime"]


@dataclass(frozen=True)
class FunctionInfo:
    """What a backend knows about one kernel that the host args of its launches must follow
    (:meth:`Runtime.function_info`). The default (:data:`PLAIN_FUNCTION`) asks for nothing.

    :ivar params: ``(offset, size)`` of each parameter the kernel declares, as
        ``aclrtFunctionGetParamInfo`` reports them (CANN 9.1 on); ``None`` when unknown. A
        ``HostArgs`` whose fields differ in number or size is refused before the launch.
    :ivar prefix: 64-bit values the caller lays out in 8-byte slots *before* the kernel's
        parameters: the inter-core sync address of a MIX kernel on Atlas A2/A3, which the
        host-args launch does not add itself (``docs/cann-support.md`` §4).
    :ivar suffix: 64-bit values laid out in 8-byte slots right *after* the parameters (before
        any placeholder data): the context's float-overflow address of such a kernel.
    :ivar data_align: when set, the runtime places placeholder data itself (the args-handle
        path): the data blocks are laid out right after the (8-aligned) parameters, each at this
        alignment, so that the parameter area of the image ends where the data begins.
    :ivar kernel_type: the kernel type the binary was loaded as (``"mix"`` ...), if known
    """

    params: tuple[tuple[int, int], ...] | None = None
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    data_align: int | None = None
    kernel_type: str | None = None

    @property
    def plain(self) -> bool:
        """Whether the host args of this kernel are packed exactly as the builder lays them out."""
        return (
            self.params is None and not self.prefix and not self.suffix and self.data_align is None
        )


#: a kernel the backend knows nothing special about
PLAIN_FUNCTION = FunctionInfo()


class LaunchBatch(Protocol):
    """``runtime.launch_batch(launches)``: a run of plain launches in one call, where a backend
    has one (the acl backend on the host-args path with its native extension built:
    ``aio_ascend._runtime.acl.batch``); elsewhere the attribute is absent or ``None`` and the
    caller launches one by one with :meth:`Runtime.launch_kernel_with_host_args`.

    ``launches`` are launch requests: objects with ``func``, ``blocks``, ``cfg``, ``host.addr``,
    ``nbytes``, ``table_offset``, ``placeholder_count`` and ``lane.handle`` (the stream), each
    meaning what it does for :meth:`Runtime.launch_kernel_with_host_args` (the placeholder
    table at ``host.addr + table_offset``). They are submitted in order, each with that
    method's checks, and each one submitted gets ``position`` (:meth:`Runtime.last_task_id`
    right after it, ``-1`` for ``None``). Returns ``(submitted, refusal)``: all of them were
    submitted (``submitted == len(launches)``); or ``launches[submitted]`` was refused with
    ``refusal`` (the error the per-launch method would have raised) and nothing after it was
    submitted; or ``refusal`` is ``None`` and ``launches[submitted]`` is one this call leaves
    to the per-launch method (a launch config, a value that needs the precise check, a closed
    runtime), nothing after it submitted either. The calling thread's current context is the
    one every launch goes to, as for the per-launch method.
    """

    def __call__(self, launches: list[Any]) -> tuple[int, AscendError | None]: ...


@runtime_checkable
class Runtime(Protocol):
    """One backend bound to one device; the ACL functions the scheduler uses.

    Obtain one with :func:`aio_ascend._runtime.open_runtime`. After :meth:`close` no other
    method may be called.
    """

    #: backend name: ``"sim"``, ``"acl"`` or ``"cuda"``
    name: str
    #: the device this runtime is bound to
    device_id: int
    #: queue entries one stream holds before a submitting call blocks (each launch, copy,
    #: event record or wait takes one); the scheduler never lets a stream reach it
    stream_capacity: int
    #: the ids :meth:`last_task_id` gives are each stream's tasks counted 0, 1, ... in
    #: submission order (the sim): a fault report then also says the tasks before it on its
    #: stream finished. False where ids wrap or the runtime's own tasks take some (acl).
    ordered_task_ids: bool

    @property
    def context(self) -> int:
        """This runtime's context handle (``aclrtContext``; never 0)."""
        ...

    # --- context and lifecycle -------------------------------------------------------------

    def set_current_context(self, context: int | None = None) -> None:
        """``aclrtSetCurrentContext``: bind the device's context to the calling thread.

        Idempotent. Must be called by every thread before its first other call. With
        ``context`` (a handle :meth:`get_current_context` returned: another runtime's, or
        another library's), bind that one instead; this works after :meth:`close` too, so that
        a caller can always give a thread its context back.
        """
        ...

    def get_current_context(self) -> int | None:
        """``aclrtGetCurrentContext``: the calling thread's current context handle, whoever made
        it (this runtime, another, another library); ``None`` when the thread has none."""
        ...

    def release_thread(self) -> None:
        """The calling thread lets go of this runtime's context, if it is current (else
        nothing): every thread that bound it does so before it ends, the opener's included.
        On ACL a thread's binding is a reference, and a destroyed context is deleted (its
        queues and memory given back) only once no thread has it current; ACL cannot unbind,
        so the device's primary context (``aclrtSetDevice``'s) is bound instead
        (``acl/contexts.py``). Any thread; before :meth:`close` (after it: best effort)."""
        ...

    def close(self) -> None:
        """Destroy the context and reset the device (``aclrtDestroyContext``/``aclrtResetDevice``).

        Releases everything the runtime still holds (streams, events, memory, modules) and stops
        any thread the backend started. A device fault is cleared by closing and opening again.
        Idempotent; callable from any thread.
        """
        ...

    def must_settle(self) -> bool:
        """Whether :meth:`wait_settled` would wait (a stream with unfinished work was destroyed
        by force since the device last settled)."""
        ...

    def wait_settled(self, limit_s: float | None = None) -> None:
        """Before :meth:`close` frees memory: wait, up to ``limit_s`` (``None``: a limit of the
        backend's, and never longer), until no work of a stream destroyed by force can still
        touch it (a no-op where none can).

        May block: the scheduler calls it from a worker thread, never on the event loop.
        Where the wait runs out, :meth:`close` leaks instead of freeing.
        """
        ...

    def leaked_device_blocks(self) -> int:
        """Device allocations this runtime leaked instead of freeing them (their :meth:`free`
        or :meth:`close` came while work of a stream destroyed by force might still use them,
        and the device never settled): 0 where nothing is ever leaked."""
        ...

    # --- streams ---------------------------------------------------------------------------

    def create_stream(self, priority: int | None = None) -> int:
        """``aclrtCreateStream``: a new FIFO stream handle (never 0).

        ``priority`` (``None``: the runtime's default) is a number in the range of
        :meth:`stream_priority_range`, lower = more urgent; acl sets it with
        ``aclrtSetStreamAttribute(ACL_STREAM_ATTR_PRIORITY)``, cuda creates the stream with
        ``cuStreamCreateWithPriority``. Out of range: ``InvalidParamError`` (107000).
        """
        ...

    def stream_priority_range(self) -> tuple[int, int]:
        """``aclrtDeviceGetStreamPriorityRange``: ``(least, greatest)`` urgency; the greatest is
        the lowest number (acl: ``(7, 0)``; cuda: e.g. ``(0, -5)``)."""
        ...

    def destroy_stream(self, stream: int) -> None:
        """``aclrtDestroyStream``: wait for the stream's queued work, then destroy it.

        If the device has faulted, the stream is destroyed without waiting. A stream whose
        work never finishes (a hung kernel) blocks this call: use :meth:`destroy_stream_force`.
        """
        ...

    def destroy_stream_force(self, stream: int) -> None:
        """``aclrtDestroyStreamForce``: destroy at once, discarding queued and running work."""
        ...

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        """``aclrtSetStreamFailureMode``: ``ACL_STOP_ON_FAILURE`` (1) or ``_CONTINUE_ON_FAILURE``.

        In stop-on-failure mode a device fault halts the whole context: queries and syncs on every
        stream return the fault code and new work is refused.
        """
        ...

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        """``aclrtSynchronizeStreamWithTimeout``: block until the work submitted to the stream
        before this call has finished (work submitted meanwhile by other threads is not waited
        for).

        ``timeout_ms`` is -1 (forever) or > 0; 0 is rejected with 107000 as by the real runtime.
        Raises ``StreamSyncTimeoutError`` (507046) on timeout and the fault's error if the device
        faulted.
        """
        ...

    # --- events ----------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        """``aclrtCreateEventExWithFlag``: a reusable Ex event.

        ``flags`` is a combination of ``ACL_EVENT_SYNC`` (others may wait on it),
        ``ACL_EVENT_CAPTURE_STREAM_PROGRESS`` and ``ACL_EVENT_TIME_LINE`` (timestamps). An Ex
        event that was never recorded queries as COMPLETE.
        """
        ...

    def destroy_event(self, event: int) -> None:
        """``aclrtDestroyEvent``."""
        ...

    def record_event(self, event: int, stream: int) -> None:
        """``aclrtRecordEvent``: capture the work submitted to ``stream`` so far.

        Re-recording replaces the captured set. The event reads NOT_READY from the moment this
        call returns until the captured work is done. (A query on another thread that races
        with this call may still see the previous status.)
        """
        ...

    def query_event_status(self, event: int) -> int:
        """``aclrtQueryEventStatus``: ``..._RECORDED_STATUS_COMPLETE`` (1) or ``_NOT_READY`` (0).

        Never blocks. If the device has faulted (stop-on-failure), raises the fault's
        ``DeviceFaultError`` instead of returning a status.
        """
        ...

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        """``aclrtSynchronizeEventWithTimeout``: block until the event completes.

        ``timeout_ms`` is -1 or > 0 (0 raises ``InvalidParamError``); raises
        ``EventSyncTimeoutError`` (507047) on timeout, the fault's error if the device faulted.
        """
        ...

    def fault_site(self) -> tuple[int, int] | None:
        """Which task faulted the device, if the backend knows: ``(stream, task id)``, the id
        being what :meth:`last_task_id` returned right after that task's submission (the sim:
        the task's 0-based index on its stream; acl: the runtime's ``(flip << 16) | id``, which
        wraps and counts the runtime's own tasks too); ``None`` before a fault or when it cannot
        tell. The id is only ever matched exactly: it says nothing of the tasks before it."""
        ...

    def last_task_id(self) -> int | None:
        """The id :meth:`fault_site` would name for the last task the calling thread submitted
        (acl: ``aclrtGetThreadLastTaskId``); ``None`` when the backend cannot tell (CANN 8.0,
        CUDA): a fault report then names a stream, not a task."""
        ...

    def stream_wait_event(self, stream: int, event: int) -> None:
        """``aclrtStreamWaitEvent``: later work on ``stream`` waits for the event's captured work.

        The wait refers to the event's recording at the time of this call (a later re-record
        does not affect it). Waiting on a never-recorded Ex event does not wait.
        """
        ...

    def event_elapsed_time(self, start: int, end: int) -> float:
        """``aclrtEventElapsedTime``: milliseconds between two completed ``TIME_LINE`` events."""
        ...

    # --- memory ----------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """``aclrtMalloc`` (huge-first): device memory, 64-byte aligned. ``size`` > 0."""
        ...

    def free(self, ptr: int) -> None:
        """``aclrtFree``: free at once (does not wait for work that still uses it).

        Freeing an address that is not a live allocation raises ``InvalidParamError``.
        """
        ...

    def malloc_host(self, size: int) -> int:
        """``aclrtMallocHost``: pinned host memory, 64-byte aligned, readable/writable by Python.

        Copies from/to pinned memory are truly asynchronous: the runtime reads or writes it when
        the copy executes, so it must stay valid until then.
        """
        ...

    def free_host(self, ptr: int) -> None:
        """``aclrtFreeHost``: free pinned host memory at once."""
        ...

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """``aclrtMemcpyAsync``: queue a copy of ``count`` bytes on ``stream``.

        ``kind`` is ``ACL_MEMCPY_HOST_TO_DEVICE``, ``_DEVICE_TO_HOST`` or ``_DEVICE_TO_DEVICE``.
        ``count > dst_max`` raises ``InvalidParamError``. A host side in pinned memory (from
        :meth:`malloc_host`) is accessed when the copy executes; any other host address is
        pageable, and the call then blocks until the stream reaches the copy and performs it.
        """
        ...

    def memset_async(self, ptr: int, dst_max: int, value: int, count: int, stream: int) -> None:
        """``aclrtMemsetAsync``: queue setting ``count`` bytes at device address ``ptr`` to the
        byte ``value`` (0..255) on ``stream``. ``count > dst_max`` raises ``InvalidParamError``;
        memory outside a live allocation faults the device when the task executes."""
        ...

    def info(self) -> dict[str, object]:
        """What the backend can tell about its device and itself, as plain values.

        Every backend gives ``runtime_version`` (str), ``memory_free`` and ``memory_total``
        (bytes, ``aclrtGetMemInfo``), ``stream_priority_least`` and
        ``stream_priority_greatest``; each may add keys of its own (acl: ``soc_name``,
        ``cann_version``, core counts; cuda: ``device_name``, ``compute_capability``).
        """
        ...

    # --- graphs ----------------------------------------------------------------------------

    def begin_capture(self, stream: int) -> None:
        """Start capturing ``stream`` (acl: ``aclmdlRICaptureBegin``, relaxed mode; cuda:
        ``cuStreamBeginCapture``, relaxed mode): launches, copies between pinned host and
        device memory and memsets submitted to it from now on are recorded, not run. The
        stream must be idle. Event records and waits, pageable copies and syncs on a
        capturing stream raise (``InvalidParamError``)."""
        ...

    def end_capture(self, stream: int) -> int:
        """Stop capturing ``stream``: the recorded work as a graph handle (acl:
        ``aclmdlRICaptureEnd``; cuda: ``cuStreamEndCapture`` + ``cuGraphInstantiate``)."""
        ...

    def launch_graph(self, graph: int, stream: int) -> None:
        """Queue one replay of ``graph`` on ``stream``: one runtime task (acl:
        ``aclmdlRIExecuteAsync``; cuda: ``cuGraphLaunch``). A runtime may read a captured
        launch's args at capture or at each replay, and a captured copy reads its pinned host
        memory at each replay: the caller keeps both alive and unchanged while the graph
        exists."""
        ...

    def destroy_graph(self, graph: int) -> None:
        """Destroy ``graph`` (acl: ``aclmdlRIDestroy``): the caller makes sure no queued replay
        still needs it."""
        ...

    # --- kernels ---------------------------------------------------------------------------

    def load_binary(
        self,
        source: object,
        *,
        kernel_type: KernelType | None = None,
        lazy: bool | None = None,
    ) -> int:
        """``aclrtBinaryLoadFromFile``/``FromData``: load a kernel binary, return its handle.

        What ``source`` may be is backend-specific (a path or bytes for ``acl``; a
        ``KernelLibrary`` for ``sim``). ``None`` loads the backend's built-in kernels.
        ``kernel_type`` and ``lazy`` map to ``aclrtBinaryLoadOptions`` on acl (the magic and
        ``ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD``; the magic only for bytes: the runtime refuses it
        for a file, whose kernel type the JSON beside it gives); ``None`` passes no option.
        Backends without load options check the values and otherwise ignore them.
        """
        ...

    def function_info(self, func: int) -> FunctionInfo:
        """What the host args of kernel ``func`` must follow (:class:`FunctionInfo`): its
        declared parameters where the runtime can tell, the hidden arguments the caller must
        supply on this backend's launch path, where placeholder data must go."""
        ...

    def unload_binary(self, binary: int) -> None:
        """``aclrtBinaryUnLoad``."""
        ...

    def get_function(self, binary: int, name: str) -> int:
        """``aclrtBinaryGetFunction``: the function handle of kernel ``name`` in ``binary``.

        An unknown name raises ``RuntimeAPIError`` (107042, symbol not found).
        """
        ...

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
        """``aclrtLaunchKernelWithHostArgs``: queue kernel ``func`` on ``stream``.

        ``args_addr`` is the address of a *writable* host buffer of ``args_size`` bytes (> 0,
        < 2**32); ``placeholders_addr`` points to ``placeholder_count`` ``aclrtPlaceHolderInfo``
        entries (``{uint32 addrOffset; uint32 dataOffset}``), or is 0 when the count is 0. For
        each entry the runtime writes the device address of the data at ``dataOffset`` as a
        uint64 into the caller's buffer at ``addrOffset`` (so ``addrOffset + 8 <= args_size``
        and ``dataOffset < args_size``, both 8-aligned for the slot), then ships
        ``[0, args_size)`` to the device. ``num_blocks`` is 1..65535. The table and ``cfg`` are
        read only during the call. Returning means *submitted*, not executed. The caller keeps
        the args buffer alive and unchanged until the kernel completes: the real runtime copies
        it during the call, but the ``sim`` reads pinned args when the kernel executes, so a
        lifetime bug shows up as wrong results in tests.

        On the acl backend over CANN 8.3 (``launch_path == "args_handle"``) the image is
        replayed through ``aclrtKernelArgs*`` + ``aclrtLaunchKernelWithConfig``: the runtime
        builds and patches its own buffer (the caller's is not patched), and the argument area
        must end where the first placeholder data block starts (as ``HostArgs`` packs it for
        such a function: :attr:`FunctionInfo.data_align`).
        """
        ...
