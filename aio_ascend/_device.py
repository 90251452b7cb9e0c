"""``Device`` and ``open_device``: the public face of one open device."""

from __future__ import annotations

import logging
import math
import time
import warnings
import weakref
from collections.abc import Generator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import numpy as np
import numpy.typing as npt

from ._buffer import DeviceBuffer
from ._host.hostdata import dims_of, host_array, plain_dtype
from ._host.pool import DEFAULT_RETAINED_BYTES
from ._hostfunc import close_host_funcs, observed_as
from ._interop import ExternalEvent, TorchOrder, event_handle, stream_handle
from ._module import Function, Module
from ._runtime import (
    Runtime,
    check_device_id,
    check_option_names,
    check_runtime_options,
    choose_backend,
    open_runtime,
)
from ._runtime import device_count as _runtime_device_count
from ._runtime.abi import PTR_MAX, KernelType, load_keywords
from ._runtime.base import FunctionInfo
from ._sched.admission import ENTRIES_PER_REQUEST
from ._sched.loop import current_loop_adapter
from ._sched.owned import OwnedFinalizers
from ._sched.poller import CompletionMode
from ._sched.scheduler import DeviceState, Scheduler
from ._sched.shutdown import call_off_loop
from ._stream import Stream, synchronize
from ._unique import Unique
from ._values import check_close_args, integer
from ._values import seconds as seconds_of

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Device", "DeviceBuffer", "Function", "Module", "open_device"]

log = logging.getLogger("aio_ascend")

#: the most requests one stream may be asked to admit at once: a sanity bound only (a stream's
#: entry budget, below its runtime queue's capacity, bounds what it really admits)
MAX_IN_FLIGHT = 1 << 20
#: the most requests of one stream in one hop (below the runtime's ~2013-entry queue)
MAX_BATCH_CAP = 2000


def _completion_mode(completion: object) -> CompletionMode:
    try:
        return CompletionMode(completion)
    except (ValueError, TypeError):
        raise ValueError(f"completion={completion!r}: expected 'poll' or 'block'") from None


#: the runtime options that set a stream's runtime queue capacity (sim, acl)
_CAPACITY_OPTIONS = ("max_queue_depth", "stream_capacity")


def _options_of(runtime_options: object) -> dict[str, Any]:
    if runtime_options is not None and not isinstance(runtime_options, Mapping):
        raise TypeError(f"runtime_options must be a mapping, got {type(runtime_options).__name__}")
    return dict(runtime_options or {})


def _check_runtime_options(backend: str, options: dict[str, Any]) -> None:
    """Keys and types (the backend's factory), and a queue capacity the scheduler can use,
    before the runtime opens."""
    for key in _CAPACITY_OPTIONS:
        value = options.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < ENTRIES_PER_REQUEST:
            raise ValueError(
                f"runtime_options[{key!r}]={value}: each stream needs room for at least "
                f"{ENTRIES_PER_REQUEST} runtime queue entries (a request and the completion "
                "event recorded after it)"
            )
    check_runtime_options(backend, options)


def _check_seconds(name: str, seconds: object) -> float:
    value = seconds_of(name, seconds)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={seconds!r} must be a finite number > 0")
    return value


def _check_pool_bytes(value: object) -> int:
    return _int_in("pinned_pool_bytes", value, 0, 1 << 62)


def _check_pool_limit(value: object) -> int | None:
    if value is None:
        return None
    limit = integer("pool_limit_bytes (an int or None)", value)
    if limit <= 0:
        raise ValueError(f"pool_limit_bytes={limit} must be > 0 (or None: no limit)")
    return limit


def _int_in(name: str, value: object, low: int, high: int) -> int:
    number = integer(name, value)
    if not low <= number <= high:
        raise ValueError(f"{name}={number} is out of range {low}..{high}")
    return number


class Device(Unique):
    """An open device: the runtime, its library threads, buffer pools and streams.

    Open with ``async with aio_ascend.open_device(0) as dev:`` (or ``dev = await
    open_device(0)`` and ``await dev.aclose()``). Use it from the event loop that opened it:
    its calls (awaitable or not) raise ``RuntimeError`` from another loop or thread, except
    ``stats()``, ``memory_stats()``, ``fault`` and ``closed`` (and its plain attributes).

    Threads: a submitter (``aio_ascend-submit-<id>``) makes every runtime call that can wait on
    the device; a poller (``aio_ascend-poll-<id>``) observes completions. Both bind the device
    context first. Short calls (malloc, free, stream/event creation, ``load_module``) are made
    on the loop thread, which ``open_device`` binds too; ``aload_module`` loads on a thread of
    its own.

    Faults are sticky: after a device fault every unfinished or later task fails with
    ``DeviceFaultError`` (cause: the first fault). Close the device and open it again.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        completion: str = "poll",
        task_timeout: float = 600.0,
        debug: bool = False,
        batch_cap: int = 512,
        close_timeout: float = 5.0,
        pinned_pool_bytes: int = DEFAULT_RETAINED_BYTES,
        pool_limit_bytes: int | None = None,
    ) -> None:
        mode = _completion_mode(completion)
        _check_pool_bytes(pinned_pool_bytes)
        pool_limit_bytes = _check_pool_limit(pool_limit_bytes)
        timeout = _check_seconds("task_timeout", task_timeout)
        batch_cap = _int_in("batch_cap", batch_cap, 1, MAX_BATCH_CAP)
        self.close_timeout = _check_seconds("close_timeout", close_timeout)
        self.backend: str = runtime.name
        self.device_id: int = runtime.device_id
        self.completion = completion
        self.task_timeout = timeout
        self._scheduler = scheduler = Scheduler(
            runtime,
            adapter=current_loop_adapter(),
            completion=mode,
            task_timeout=timeout,
            debug=debug,
            batch_cap=batch_cap,
            pinned_pool_bytes=pinned_pool_bytes,
            pool_limit_bytes=pool_limit_bytes,
        )
        self._builtin: Module | None = None
        observed_as(self, scheduler.source)  # its host functions, as tracing and metrics see them
        # Collected without aclose(): stop the threads and close the runtime (never at exit:
        # daemon threads may be inside runtime calls then).
        self._finalizer = weakref.finalize(self, scheduler.abandon)
        self._finalizer.atexit = False
        #: the finalizers of its streams, plans, events and graphs (detached at its close)
        self._object_finalizers = OwnedFinalizers()

    # --- public API ----------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """The backend runtime (for diagnostics and backend-specific test controls)."""
        return self._scheduler.runtime

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has finished (or the device was collected without it)."""
        scheduler = self._scheduler
        return scheduler.abandoned or scheduler.state is DeviceState.CLOSED

    @property
    def fault(self) -> BaseException | None:
        """The first device fault (the runtime's error, a ``DeviceFaultError`` carrying its
        ACL ``code``), or ``None`` while the device is healthy.

        Sticky: once set it stays set, every unfinished or later task fails with a
        ``DeviceFaultError`` caused by it, and only closing the device and opening a new one
        recovers (see the faults guide). Any thread may read it."""
        return self._scheduler.faults.first

    def malloc(self, nbytes: int, *, pool: bool = True) -> DeviceBuffer:
        """Allocate ``nbytes`` of device memory (64-byte aligned), from the device's pool.

        The pool serves a request with a cached block of its size class (up to 25 % larger)
        when there is one, else with a new block from the runtime. A freed buffer's block
        becomes reusable only once the work queued on it has completed; the contents of a
        reused block are undefined (the sim fills it with ``0xCD``). On out-of-memory the
        cached blocks are given back to the runtime and the allocation is tried once more.
        See :meth:`memory_stats` and :meth:`empty_cache`.

        :param nbytes: any integer type (numpy's too), 1 .. 2**64-1
        :param pool: False: exactly ``nbytes`` straight from the runtime, given back to it
            when freed (never cached)
        :raises ValueError: ``nbytes`` below 1, or more than a 64-bit address space holds
        :raises MemoryError: (a ``RuntimeAPIError`` with ACL code 207001) the device has not
            that much memory free, or the allocation would take the device past
            ``open_device(pool_limit_bytes=...)``
        """
        if not isinstance(pool, bool):
            raise TypeError(f"malloc(pool=...) must be a bool, got {type(pool).__name__}")
        nbytes = integer("malloc(nbytes)", nbytes)
        if nbytes <= 0:
            raise ValueError(f"malloc(nbytes={nbytes}): nbytes must be > 0")
        if nbytes > PTR_MAX:
            raise ValueError(
                f"malloc(nbytes={nbytes}): more than the 64-bit device address space holds "
                f"(at most {PTR_MAX})"
            )
        scheduler = self._owned()
        lifetimes = scheduler.lifetimes
        lifetimes.reap()
        ptr, block = lifetimes.memory.allocate(nbytes, pooled=pool)
        buffer = DeviceBuffer(lifetimes, ptr, nbytes, block=block, pooled=pool)
        lifetimes.track(buffer)
        return buffer

    def pinned_empty(
        self, shape: int | tuple[int, ...], dtype: npt.DTypeLike
    ) -> np.ndarray[Any, Any]:
        """A new C-ordered numpy array in page-locked host memory of this device
        (``aclrtMallocHost``); its contents are unspecified, as ``np.empty``'s.

        Copies from and to it (``upload``/``download``, ``copy_to_device``/``copy_to_host``,
        a view of it too, when C-contiguous) go straight between it and the device, with no
        staging copy. Its memory is freed once the array and every view of it are garbage
        and no queued copy uses it. A download into it is written by the device itself: if
        it fails or times out, the array's contents are unspecified until the device has
        been synchronized or closed.

        An array that outlives its device stays valid (its memory is freed when it is
        collected, and the device's runtime is closed only then); no device accepts it in a
        copy any more. Another device's copies refuse it too (``ValueError``).

        :param shape: an int or a tuple of ints (any integer type), none negative
        :param dtype: anything ``np.dtype`` takes, of fixed size (no object arrays)
        :raises TypeError: a bad shape or dtype
        :raises ValueError: a negative dimension
        :raises RuntimeAPIError: the runtime has not that much pinned memory
        """
        dims = dims_of(shape, "pinned_empty")
        if dtype is None:  # (np.dtype(None) is float64: say it)
            raise TypeError("pinned_empty: dtype is required (np.float32, 'u1', ...)")
        kind = plain_dtype("pinned_empty", dtype)
        if math.prod(dims) * kind.itemsize > PTR_MAX:
            raise ValueError(f"pinned_empty: shape {dims} of {kind} exceeds the address space")
        return self._owned().pinned.empty(dims, kind)

    def pinned_like(self, array: Any) -> np.ndarray[Any, Any]:
        """:meth:`pinned_empty` with the shape and dtype of ``array`` (an ndarray, or anything
        a copy takes from the host: a buffer, a torch CPU tensor, ...); like ``np.empty_like``
        it does not copy the contents: ``p = dev.pinned_like(a); p[...] = a`` does."""
        if not isinstance(array, np.ndarray):
            array = host_array(array, "pinned_like(array)", writable=False, typed=True)
        return self.pinned_empty(array.shape, array.dtype)

    def memory_stats(self) -> Mapping[str, int]:
        """The device memory of this device and its pool, in bytes and counts (any thread;
        after the close too: then nothing is allocated, reserved or cached).

        - ``allocated_bytes``: held by live buffers (their blocks); ``requested_bytes``: what
          those buffers asked for; ``reserved_bytes``: held from the runtime (allocated plus
          cached); ``cached_bytes``/``cached_blocks``: freed blocks kept for reuse;
          ``peak_allocated_bytes``, ``peak_reserved_bytes``; ``limit_bytes``:
          ``pool_limit_bytes`` (0: none);
        - counts since the open: ``allocations`` (``malloc`` calls), ``pool_hits`` (served
          from the cache), ``runtime_allocations`` and ``runtime_frees`` (calls to the
          runtime's malloc and free), ``oom_retries`` (the runtime's out-of-memory answers
          retried after emptying the cache; reaching ``pool_limit_bytes`` empties it too,
          uncounted: the runtime was not asked), ``runtime_leaks`` (blocks whose free the
          backend took but leaked at the close instead, since work of a stream destroyed by
          force might still use them and the device never settled: acl only; the close logs
          an ERROR then).

        ``stats()["device_buffers"]`` counts the live buffers themselves.
        """
        return MappingProxyType(self._scheduler.lifetimes.memory.stats())

    def empty_cache(self) -> int:
        """Give the pool's cached blocks back to the runtime (e.g. for memory another library
        allocates); returns the bytes given back. Blocks of live buffers, and of freed ones
        whose queued work has not completed yet, stay where they are. If the runtime refuses
        a free, the other blocks are given back all the same, that block stays cached, and
        the runtime's error is raised."""
        return int(self._owned().lifetimes.memory.empty_cache())

    def load_module(
        self,
        source: object,
        *,
        kernel_type: str | None = None,
        lazy: bool | None = None,
    ) -> Module:
        """Load a kernel binary (acl: a path, or bytes-like data such as ``bytes`` or a NumPy
        array; sim: an ``aio_ascend.sim.KernelLibrary``).

        It stays loaded until :meth:`Module.close` and the end of the work that may run its
        kernels, or until the device closes.

        :param kernel_type: what a binary loaded from bytes holds: ``"vector"``, ``"cube"``,
            ``"aicore"`` or ``"mix"`` (cube and vector cores together). Bytes carry no type,
            and without one the runtime assumes CUBE on Atlas A2/A3; a MIX kernel also gets
            its hidden arguments supplied at each launch. For a file the JSON beside it gives
            the type, and the runtime refuses the option (``ValueError`` here). acl maps it to
            ``ACL_RT_BINARY_LOAD_OPT_MAGIC``; sim and cuda check it and ignore it.
        :param lazy: ``ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD``: register the binary now, copy it to
            the device at first use (``None``: the runtime's default)
        :raises ValueError: a bad ``kernel_type``, or one given for a file; an empty path
        :raises TypeError: ``lazy`` that is not a bool
        :raises ClosedError: the device is closed
        :raises DeviceFaultError: the device has faulted (cause: the first fault)
        """
        kind, options = load_keywords(kernel_type, lazy)
        scheduler = self._owned()
        handle = scheduler.binaries.load(scheduler.loader(), source, options)
        return self._module(handle, source, kind, closable=True)

    async def aload_module(
        self,
        source: object,
        *,
        kernel_type: str | None = None,
        lazy: bool | None = None,
    ) -> Module:
        """:meth:`load_module` without holding up the event loop: the runtime reads and loads
        the binary on a thread of its own (a big binary takes seconds), and the loop runs
        meanwhile. Cancelled, it waits for that load and unloads the binary; the device's
        close waits for it too (within its ``timeout``: past it, a load still under way is a
        stuck runtime call, and the runtime is closed once it has returned). The runtime
        reads ``source`` while this waits: a buffer (or a sim ``KernelLibrary``) must not
        change until it returns.

        :raises ClosedError: the device is closed, or was closed while the binary loaded
        """
        kind, options = load_keywords(kernel_type, lazy)
        scheduler = self._owned()
        name = f"aio_ascend-load-{self.device_id}"
        handle = await scheduler.binaries.load_off_loop(scheduler.loader(), source, options, name)
        scheduler.check_open()  # (closed meanwhile: its close unloaded the binary)
        return self._module(handle, source, kind, closable=True)

    def _module(
        self, handle: int, source: object, kind: KernelType | None, *, closable: bool
    ) -> Module:
        # The Module of a binary just loaded; closable: tracked (see _sched/modules.py)
        scheduler = self._scheduler
        kind_name = None if kind is None else kind.value
        record = scheduler.binaries.track(handle) if closable else None
        module = Module(self, handle, source, self._get_function, kind_name, self._owned, record)
        if record is not None:  # (dropped: nothing can launch its kernels any more)
            self._object_finalizers.finalize(module, scheduler.drop_record, record)
        return module

    def _owned(self) -> Scheduler:
        """The scheduler, once the device is found open and the caller on its loop's thread
        (``ClosedError``, ``RuntimeError``): what every synchronous call checks first."""
        scheduler = self._scheduler
        scheduler.check_open()
        scheduler.adapter.check_thread()
        return scheduler

    def _get_function(self, module: int, name: str) -> tuple[int, FunctionInfo]:
        scheduler = self._owned()
        runtime = scheduler.bound()
        handle = runtime.get_function(module, name)
        return handle, runtime.function_info(handle)

    def function(self, name: str) -> Function:
        """A built-in kernel of the backend (sim: vector_add, axpy, scale, matmul, ...)."""
        self._owned()
        if self._builtin is None:  # (the device's own: unloaded with it, never closed)
            scheduler = self._scheduler  # (faulted too: what fails is the launch)
            handle = scheduler.binaries.load(scheduler.bound(), None, {})
            self._builtin = self._module(handle, None, None, closable=False)
        return self._builtin.function(name)

    def wrap(self, ptr: int, nbytes: int, *, owner: object = None) -> DeviceBuffer:
        """Device memory someone else owns (e.g. a torch_npu tensor's ``data_ptr()``), as a
        ``DeviceBuffer`` usable wherever one is.

        aio_ascend never frees it: ``free()`` only drops the wrapper. ``owner`` (the tensor)
        is kept referenced by the wrapper, so that queued work never outlives the memory; it
        is let go once the wrapper is freed (after the work queued on it completes) or
        collected. The memory must stay valid for as long as work uses it.

        Nothing here checks that ``[ptr, ptr + nbytes)`` is memory of the device, and the
        runtime may not either (its ``aclrtMemsetAsync`` checks no address at the call): work
        that reaches past it faults the device when it runs, or on hardware may write whatever
        lies beyond. Give the tensor's own size.
        """
        ptr = integer("wrap(ptr)", ptr)
        nbytes = integer("wrap(nbytes)", nbytes)
        if ptr <= 0 or ptr >= 1 << 64:
            raise ValueError(f"wrap(ptr={ptr:#x}): not a device address")
        if nbytes <= 0 or ptr + nbytes > 1 << 64:
            raise ValueError(f"wrap(nbytes={nbytes}): must be > 0 and stay in the address space")
        scheduler = self._owned()
        return DeviceBuffer(scheduler.lifetimes, ptr, nbytes, external=True, owner=owner)

    def stream(self, *, max_in_flight: int = 1024, priority: int | None = None) -> Stream:
        """A new stream (in stop-on-failure mode); also usable as ``async with``.

        :param max_in_flight: requests admitted at once (further calls wait, FIFO); the
            stream's runtime queue entry budget also bounds them, so a large value never lets
            the runtime queue fill (1 .. 2**20)
        :param priority: lower = more urgent, within ``dev.info``'s
            ``stream_priority_greatest``..``stream_priority_least``; ``None``: the default
        """
        max_in_flight = _int_in("max_in_flight", max_in_flight, 1, MAX_IN_FLIGHT)
        if priority is not None:
            priority = integer("priority (an int or None)", priority)
            self._scheduler.check_usable()
            least, greatest = self._scheduler.bound().stream_priority_range()
            if not greatest <= priority <= least:
                raise ValueError(
                    f"priority={priority} is out of this device's range {greatest} (most "
                    f"urgent) .. {least} (least)"
                )
        lane = self._scheduler.open_lane(max_in_flight, priority=priority)
        return Stream(self, self._scheduler, lane)

    def external_stream(self, handle: object, *, max_in_flight: int = 1024) -> Stream:
        """A runtime stream created elsewhere, scheduled like any stream of this device.

        ``handle`` is the stream's handle (an int), or the framework's stream object itself
        (anything with an ``npu_stream`` or ``cuda_stream`` attribute, such as
        ``torch.npu.current_stream()``). Given the object, every operation keeps its order
        with the framework's own work on that stream, both ways: just before an operation is
        queued, ``npu_stream`` is read again (for torch_npu that drains its task queue, so
        torch's earlier ops reach the stream first), and the call returns once the operation
        has been handed to the runtime (so a torch op issued next lands after it). That costs
        a thread round trip per call, and the drain blocks the loop while torch's queue
        empties; a plain handle has neither cost nor either guarantee.

        It is never destroyed here (``aclose`` only stops using it) and its failure mode is
        left as its owner set it. Its entry budget counts only the work queued through
        aio_ascend: work its owner queues on it directly is outside it. On the sim, ``handle``
        comes from ``dev.runtime.create_stream()``.
        """
        max_in_flight = _int_in("max_in_flight", max_in_flight, 1, MAX_IN_FLIGHT)
        scheduler = self._owned()  # (before the handle is read: that drains torch's queue)
        handle, owner = stream_handle(handle)
        scheduler.retire_dropped()  # a wrapper of it dropped, its work done, is gone
        for lane in scheduler.lanes:
            if lane.handle == handle:
                dropped = lane.stream_ref() is None
                raise ValueError(
                    f"stream {handle:#x} is already open on this device"
                    + (
                        " (a wrapper of it was dropped while its work runs: it is free again "
                        "once that work is done; close a wrapper with aclose() instead)"
                        if dropped
                        else " (use that Stream, or aclose() it first)"
                    )
                )
        lane = scheduler.open_lane(max_in_flight, external=handle)
        order = None
        if owner is not None:
            order = TorchOrder(owner, handle, scheduler.adapter)
            lane.handover = order.handover
        return Stream(self, scheduler, lane, order)

    def external_event(self, event: object, *, after: object = None) -> ExternalEvent:
        """A runtime event created and recorded elsewhere (a handle, or an object with an
        ``npu_event`` or ``cuda_event`` attribute such as a recorded ``torch.npu.Event``):
        ``await stream.wait_event(ext)`` makes a stream wait for it on the device, ``await
        ext`` waits for it on the host, ``ext.query()`` asks the runtime.

        :param after: the framework stream object the event is recorded on: it is drained
            (its ``npu_stream`` read) before every wait or query, so a record still in
            torch_npu's task queue reaches the runtime first. Without it, record the event
            and read the stream's ``npu_stream`` before handing the event over.
        """
        scheduler = self._owned()
        handle = event_handle(event)
        if after is not None and stream_handle(after)[1] is None:
            # a handle read off the stream cannot drain its queue again: it would order nothing
            raise TypeError(
                "external_event(after=...) takes the framework's stream object (one with "
                f"npu_stream or cuda_stream), not a handle: got {type(after).__name__}"
            )
        return ExternalEvent(self, scheduler, handle, after)

    @property
    def info(self) -> Mapping[str, object]:
        """What is known of the device: ``backend``, ``device_id``, ``runtime_version``,
        ``memory_free``/``memory_total`` (bytes), ``stream_priority_least``/``_greatest``,
        ``launch_path`` (how kernels are launched: ``"host_args"``, or ``"args_handle"`` on
        CANN 8.3) and ``stream_capacity``, plus what the backend adds (acl: ``cann_version``,
        ``soc_name``, ``ai_core_count``, ``cube_core_count``, ``vector_core_count``; cuda:
        ``device_name``, ``compute_capability``). A fact the runtime cannot tell (an older CANN
        release lacking the function) is ``None``. Read afresh on each access."""
        runtime = self._owned().bound()
        facts: dict[str, object] = {
            "backend": self.backend,
            "device_id": self.device_id,
            "launch_path": getattr(runtime, "launch_path", "host_args"),
            "stream_capacity": runtime.stream_capacity,
        }
        facts.update(runtime.info())
        return MappingProxyType(facts)

    def stats(self) -> Mapping[str, int]:
        """Counters: launches, copies, batches, wakeups, in_flight, peak_in_flight, and more;
        ``timeouts`` counts the tasks (launches, copies, events, replays, host functions)
        that failed with ``TaskTimeoutError``, the watchdog's or a forced close's, each once
        (not the events ``wait_stream`` and ``launch_host_func`` record for themselves);
        ``pinned_arrays`` and ``pinned_bytes`` count the pinned arrays not yet freed
        (:meth:`pinned_empty`). Readable from any thread."""
        scheduler = self._scheduler
        return {**scheduler.stats(), **scheduler.pinned.stats()}

    async def synchronize(self) -> None:
        """Wait until everything queued on every stream has finished; then raise, as
        :meth:`Stream.synchronize` does, the unretrieved failures of every stream's tasks and
        the device's fault.

        :raises ClosedError: the device is closed (or closing) when it is called
        """
        scheduler = self._scheduler
        await synchronize(scheduler, list(scheduler.lanes), None, "tasks of this device")

    async def aclose(
        self,
        *,
        cancel: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the device's work, not the call
    ) -> None:
        """Finish or drop outstanding work, stop the threads and release everything.

        :param cancel: drop requests not yet handed to the runtime (their tasks fail with
            ``ClosedError``) instead of submitting them; submitted work is still waited for
        :param timeout: seconds to wait for outstanding work; past it the streams are destroyed
            by force and their unfinished tasks fail with ``TaskTimeoutError``. ``None`` waits
            until every task has finished or been failed by the ``task_timeout`` watchdog.

        Afterwards no thread of the device is alive and nothing it allocated is left. A call
        while a close is under way waits for that close and holds it to its own arguments too
        (its ``timeout`` can only bring the force nearer: a shutdown path can escalate from a
        patient close to a forced one); once closed, a call is a no-op. It is shielded from
        cancellation once started, asyncio's own included (``asyncio.wait_for``,
        ``asyncio.timeout``, ``Task.cancel``, and ``asyncio.run`` cancelling what is left as
        it ends): the close finishes, then the cancellation is raised. To bound it, give
        ``timeout`` (or escalate with a second call that does).
        """
        timeout = check_close_args(cancel, timeout)
        started = time.monotonic()
        scheduler = self._scheduler
        try:
            await scheduler.aclose(cancel=cancel, timeout=timeout)
        finally:
            # (also when a cancellation is raised after the scheduler's close, itself shielded:
            # the rest of the close is, too; once done, its finalizer is detached)
            if scheduler.state is DeviceState.CLOSED and self._finalizer.alive:
                await scheduler.adapter.shielded(self._after_close, started, timeout)
        # A cancellation held off by the shield (anyio's, trio's) is raised now, not left to
        # the caller's next checkpoint (its scope would have finished as if never cancelled).
        # And one turn of the loop: trio keeps the outcome of the task's last wait until it
        # next yields, and on CPython 3.12+ that outcome's traceback reaches this frame, so
        # the device would outlive its close until then.
        await anyio.lowlevel.checkpoint()

    async def _after_close(self, started: float, timeout: float | None) -> None:  # noqa: ASYNC109
        # Host functions whose earlier work completed still run, bounded like the device's
        # work: within what is left of ``timeout`` (the close returns within it), else within
        # task_timeout.
        if timeout is not None:
            timeout = max(0.0, started + timeout - time.monotonic())
        await close_host_funcs(self, self.task_timeout if timeout is None else timeout)
        self._finalizer.detach()
        self._object_finalizers.detach_all()

    async def __aenter__(self) -> Device:
        self._scheduler.check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            # Left by an exception or a cancellation (Ctrl-C, a server shutting down): drop
            # what was not submitted and force the rest after close_timeout, never waiting
            # for task_timeout. (Shielded: what propagates is that exception, never a
            # cancellation raised in its place.)
            with anyio.CancelScope(shield=True):
                await self.aclose(cancel=True, timeout=self.close_timeout)

    def __repr__(self) -> str:
        scheduler = self._scheduler
        state = "open" if scheduler.abandoned else scheduler.state.value
        return (
            f"<Device {self.backend}:{self.device_id} {state} "
            f"streams={len(scheduler.lanes)} unsettled={scheduler.unsettled}>"
        )

    def __del__(self) -> None:
        # Only warns: the finalizer registered in __init__ does the cleanup (during a garbage
        # collection it may already have run).
        scheduler = getattr(self, "_scheduler", None)
        if scheduler is not None and (
            scheduler.abandoned or scheduler.state is not DeviceState.CLOSED
        ):
            warnings.warn(
                f"{self!r} was garbage-collected without aclose(); its threads are stopped and "
                "its runtime closed, but outstanding tasks are never resolved",
                ResourceWarning,
                stacklevel=1,
            )


class _DeviceOpener:
    """What :func:`open_device` returns: ``async with`` it, or ``await`` it."""

    def __init__(self, kwargs: dict[str, Any], device_id: int, backend: str) -> None:
        self._kwargs = kwargs
        self._device_id = device_id
        self._backend = backend
        self._device: Device | None = None
        self._entered = False  # by an async with block (one at a time)

    def _open_runtime(self, runtime_options: dict[str, Any]) -> Runtime:
        name, why = choose_backend(self._backend)
        log.info("device %d: backend %s (%s)", self._device_id, name, why)
        if self._backend == "auto":  # (an explicit backend's options were checked in the call)
            _check_runtime_options(name, runtime_options)
        runtime = open_runtime(name, self._device_id, **runtime_options)
        try:
            runtime.release_thread()  # (this thread ends now: see Runtime.release_thread)
        except BaseException:
            _close_quietly(runtime)
            raise
        return runtime

    async def _open(self) -> Device:
        options = dict(self._kwargs)
        runtime_options = options.pop("runtime_options", None) or {}
        # Off the loop: choosing the backend may load the runtime's library, and opening it
        # initialises the runtime and the device (seconds on real hardware), importing the
        # backend's modules the first time.
        runtime = await call_off_loop(
            f"aio_ascend-open-{self._device_id}",
            lambda: self._open_runtime(runtime_options),
            discard=_close_quietly,
        )
        try:
            return Device(runtime, **options)
        except BaseException:
            runtime.close()
            raise

    def __await__(self) -> Generator[Any, None, Device]:
        return self._open().__await__()

    async def __aenter__(self) -> Device:
        if self._entered:
            # one block's exit would close the other's device, and its own never be closed
            raise RuntimeError(
                "this open_device(...) is in use by another async with block: call "
                "open_device() once per block"
            )
        self._entered = True
        try:
            self._device = await self._open()
        except BaseException:
            self._entered = False
            raise
        return self._device

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        device, self._device = self._device, None
        self._entered = False
        if device is not None:
            await device.__aexit__(exc_type, exc, tb)


def _close_quietly(runtime: Runtime) -> None:
    # a runtime opened for a caller who was cancelled meanwhile
    try:
        runtime.close()
    except Exception:
        log.exception("closing a runtime opened for a cancelled open_device() failed")


def open_device(
    device_id: int = 0,
    backend: str = "auto",
    *,
    completion: str = "poll",
    task_timeout: float = 600.0,
    debug: bool = False,
    batch_cap: int = 512,
    close_timeout: float = 5.0,
    pinned_pool_bytes: int = DEFAULT_RETAINED_BYTES,
    pool_limit_bytes: int | None = None,
    runtime_options: Mapping[str, Any] | None = None,
) -> _DeviceOpener:
    """Open device ``device_id`` on ``backend``: ``async with open_device(0) as dev: ...``.

    :param backend: ``"auto"`` (acl when ``libascendcl.so`` loads, else sim; the environment
        variable ``AIO_ASCEND_BACKEND`` overrides it), ``"sim"``, ``"acl"`` or ``"cuda"``
    :param completion: ``"poll"`` (query events with short GIL-releasing sleeps and backoff)
        or ``"block"`` (a thread blocked in ``synchronize_event`` with a timeout slice)
    :param task_timeout: seconds after which an unfinished task fails with ``TaskTimeoutError``
    :param debug: poison released host buffers and check guard bytes (finds lifetime bugs)
    :param batch_cap: most requests of one stream in one batch (one completion event each)
    :param close_timeout: seconds a device block left by an exception or a cancellation
        waits for submitted work before it destroys the streams by force (unsubmitted work
        is dropped at once)
    :param pinned_pool_bytes: free pinned staging memory kept for reuse; what a burst of big
        copies allocated beyond it is given back when they finish
    :param pool_limit_bytes: the most device memory ``malloc`` holds from the runtime (live
        buffers and the pool's cached blocks); an allocation past it first empties the cache,
        then raises ``MemoryError`` (a ``RuntimeAPIError``, code 207001). ``None``: no limit
        but the device's
    :param runtime_options: keyword options for the backend, checked in this call (names,
        types and ranges; ``TypeError`` lists the backend's options; with ``"auto"`` only
        the names here, the rest once the backend is chosen): sim ``time_model``,
        ``max_queue_depth``, ``memory_bytes``; acl ``library_path`` (the ``libascendcl.so``
        to load instead of searching the CANN install), ``stream_capacity``; cuda
        ``block_dim``, ``staging_bytes`` (see the backends guide)
    """
    # Every argument is checked here, in the call, not when the device is opened.
    device_id = check_device_id(device_id)
    if backend != "auto":
        choose_backend(backend)  # validate the name early, with a clear error
    _completion_mode(completion)
    task_timeout = _check_seconds("task_timeout", task_timeout)
    close_timeout = _check_seconds("close_timeout", close_timeout)
    batch_cap = _int_in("batch_cap", batch_cap, 1, MAX_BATCH_CAP)
    pinned_pool_bytes = _check_pool_bytes(pinned_pool_bytes)
    pool_limit_bytes = _check_pool_limit(pool_limit_bytes)
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be a bool, got {type(debug).__name__}")
    options = _options_of(runtime_options)
    if backend != "auto":
        _check_runtime_options(backend, options)
    else:  # (the values once the backend is chosen, on the opener thread)
        check_option_names(options)
    kwargs = {
        "completion": completion,
        "task_timeout": task_timeout,
        "debug": debug,
        "batch_cap": batch_cap,
        "close_timeout": close_timeout,
        "pinned_pool_bytes": pinned_pool_bytes,
        "pool_limit_bytes": pool_limit_bytes,
        "runtime_options": options,
    }
    return _DeviceOpener(kwargs, device_id, backend)


def device_count(backend: str = "auto", *, runtime_options: Mapping[str, Any] | None = None) -> int:
    """How many devices ``backend`` sees (``"auto"``: the backend ``open_device`` would choose):
    ``aclrtGetDeviceCount`` on acl, ``cuDeviceGetCount`` on cuda, 1 on the sim (where every
    ``device_id`` opens an independent simulated device). No device is opened.

    :param runtime_options: where the runtime is, as ``open_device`` takes it (acl:
        ``library_path``; cuda: ``driver``)
    :raises BackendUnavailableError: the backend cannot be used here
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    options = _options_of(runtime_options)
    name, _ = choose_backend(backend)
    _check_runtime_options(name, options)
    return _runtime_device_count(name, **options)
