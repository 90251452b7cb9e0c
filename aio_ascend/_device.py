"""``Device`` and ``open_device``: one runtime, its threads, pools, streams and buffers."""

from __future__ import annotations

import math
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ._errors import ClosedError, TaskTimeoutError, derived_error
from ._host.pool import HostBufferPool
from ._module import Function, Module
from ._runtime import Runtime, choose_backend, open_runtime
from ._runtime.abi import ACL_STOP_ON_FAILURE
from ._sched.engine import LATE, TIMEOUT, Delivery, Engine
from ._sched.loop import LoopAdapter, current_loop_adapter
from ._sched.work import Request
from ._stream import Stream

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Device", "DeviceBuffer", "Function", "Module", "open_device"]

# completions resolved per loop turn at most, and coroutines woken by them at most
_MAX_RESOLVED_PER_TURN = 1024
_MAX_WAKES_PER_TURN = 128
_MAX_SPARE_EVENTS = 1024
# which device's context each thread has bound last (see Device._rt)
_bound = threading.local()
_OPEN, _CLOSING, _CLOSED = "open", "closing", "closed"


def _bound_call(runtime: Runtime, token: object, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to bind the calling thread to ``runtime``'s context first (see Device._rt)."""

    def call(*args: Any) -> Any:
        if getattr(_bound, "token", None) is not token:
            runtime.set_current_context()
            _bound.token = token
        return fn(*args)

    return call


class DeviceBuffer:
    """Device memory from :meth:`Device.malloc`.

    :ivar ptr: the device address (int)
    :ivar nbytes: the size in bytes

    :meth:`free` is deferred while queued work still uses the buffer (as a ``HostArgs.ptr``
    or a copy source/destination): the memory is released when that work has completed.
    """

    __slots__ = ("__weakref__", "_device", "_free_requested", "_freed", "_uses", "nbytes", "ptr")

    def __init__(self, device: Device, ptr: int, nbytes: int) -> None:
        self._device = device
        self.ptr = ptr
        self.nbytes = nbytes
        self._uses = 0
        self._free_requested = False
        self._freed = False

    def free(self) -> None:
        """Release the memory now, or as soon as the work that uses it has completed."""
        self._device._free_buffer(self)

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` has been called (the memory may still be in use by the device)."""
        return self._free_requested

    def __repr__(self) -> str:
        state = "freed" if self._free_requested else f"uses={self._uses}"
        return f"<DeviceBuffer {self.ptr:#x} nbytes={self.nbytes} {state}>"


class Device:
    """An open device: the runtime, its library threads, buffer pools and streams.

    Open with ``async with aio_ascend.open_device(0) as dev:`` (or ``dev = await
    open_device(0)`` and ``await dev.aclose()``). Use it from the event loop that opened it.

    Threads: a submitter (``aio_ascend-submit-<id>``) makes every runtime call that can wait on
    the device; a poller (``aio_ascend-poll-<id>``) observes completions. Both bind the device
    context first. Short calls (malloc, free, stream/event creation, module loading) are made
    on the loop thread, which ``open_device`` binds too.

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
    ) -> None:
        if completion not in ("poll", "block"):
            raise ValueError(f"completion={completion!r}: expected 'poll' or 'block'")
        if isinstance(task_timeout, bool) or not isinstance(task_timeout, int | float):
            raise TypeError("task_timeout must be a number of seconds")
        if not (task_timeout > 0 and math.isfinite(task_timeout)):
            raise ValueError(f"task_timeout={task_timeout!r} must be a finite number > 0")
        self._adapter: LoopAdapter = current_loop_adapter()
        self._loop_now = self._adapter.current
        self._loop_identity = self._adapter.identity
        self._runtime = runtime
        self.backend: str = runtime.name
        self.device_id: int = runtime.device_id
        self.completion = completion
        self.task_timeout = float(task_timeout)
        self._state = _OPEN
        self._bind_token = token = object()
        self._rt()
        self._pool = HostBufferPool(
            _bound_call(runtime, token, runtime.malloc_host),
            _bound_call(runtime, token, runtime.free_host),
            debug=debug,
        )
        self._streams: list[Stream] = []
        self._buffers: weakref.WeakSet[DeviceBuffer] = weakref.WeakSet()
        self._live_buffers: set[DeviceBuffer] = set()
        self._buf_lock = threading.Lock()
        self._modules: list[Module] = []
        self._builtin: Module | None = None
        self._pending: list[Request] = []
        self._flush_scheduled = False
        self._yield_due = False
        self._flush_at = min(batch_cap, 256)
        self._unsettled = 0
        self._peak_in_flight = 0
        self._idle_waiters: list[Any] = []
        self._completed: deque[Delivery] = deque()  # delivered, not yet resolved
        self._drain_scheduled = False
        self._close_waiters: list[Any] = []
        self._dead_events: deque[tuple[int, int]] = deque()
        self._spare_events: dict[int, list[int]] = {}
        self._user_events: set[int] = set()  # every live handle record_event created
        deliver = weakref.WeakMethod(self._deliver)
        release = weakref.WeakMethod(self._release_resources)

        def deliver_cb(items: list[Delivery]) -> None:
            method = deliver()
            if method is not None:
                method(items)

        def release_cb(requests: list[Request]) -> None:
            method = release()
            if method is not None:
                method(requests)

        self._engine = Engine(
            runtime=runtime,
            pool=self._pool,
            adapter=self._adapter,
            deliver=deliver_cb,
            device_id=self.device_id,
            task_timeout=self.task_timeout,
            completion=completion,
            batch_cap=batch_cap,
        )
        self._engine.release_hook = release_cb
        self._engine.start()

    # --- public API ----------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """The backend runtime (for diagnostics and backend-specific test controls)."""
        return self._runtime

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate ``nbytes`` of device memory (64-byte aligned)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise TypeError(f"malloc(nbytes): expected an int, got {type(nbytes).__name__}")
        if nbytes <= 0:
            raise ValueError(f"malloc(nbytes={nbytes}): nbytes must be > 0")
        self._check_open()
        ptr = self._rt().malloc(nbytes)
        buf = DeviceBuffer(self, ptr, nbytes)
        with self._buf_lock:
            self._live_buffers.add(buf)
        return buf

    def load_module(self, source: object) -> Module:
        """Load a kernel binary (acl: a path or bytes; sim: an ``aio_ascend.sim.KernelLibrary``)."""
        self._check_open()
        handle = self._rt().load_binary(source)
        module = Module(self, handle, source)
        self._modules.append(module)
        return module

    def function(self, name: str) -> Function:
        """A built-in kernel of the backend (sim: vector_add, axpy, scale, matmul, ...)."""
        if self._builtin is None:
            self._builtin = self.load_module(None)
        return self._builtin.function(name)

    def stream(self, *, max_in_flight: int = 1024) -> Stream:
        """A new stream (in stop-on-failure mode); also usable as ``async with``."""
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError("max_in_flight must be an int")
        if not 1 <= max_in_flight <= 2000:
            raise ValueError(f"max_in_flight={max_in_flight} is out of range 1..2000")
        self._check_usable()
        handle = self._rt().create_stream()
        try:
            self._rt().set_stream_failure_mode(handle, ACL_STOP_ON_FAILURE)
        except BaseException:
            self._rt().destroy_stream_force(handle)
            raise
        stream = Stream(self, handle, max_in_flight)
        self._streams.append(stream)
        return stream

    def stats(self) -> Mapping[str, int]:
        """Counters: launches, copies, batches, wakeups, in_flight, peak_in_flight, and more."""
        counters = self._engine.counters
        pool = self._pool.stats()
        return {
            "launches": counters["launches"],
            "copies": counters["copies"],
            "batches": counters["batches"],
            "wakeups": counters["wakeups"],
            "in_flight": sum(stream._in_flight for stream in self._streams),
            "peak_in_flight": self._peak_in_flight,
            "timeouts": counters["timeouts"],
            "streams": len(self._streams),
            "device_buffers": len(self._live_buffers),
            "host_buffers_in_use": pool["in_use"],
            "host_buffers_free": pool["free"],
            "host_buffers_high_water": pool["high_water"],
            "host_buffer_allocations": pool["allocations"],
            "host_buffer_violations": pool["violations"],
            "faulted": int(self._engine.fault is not None),
        }

    @property
    def fault(self) -> BaseException | None:
        """The first device fault, or ``None``."""
        return self._engine.fault

    async def synchronize(self) -> None:
        """Wait until everything queued on every stream has finished; raise the device fault."""
        for stream in list(self._streams):
            await stream._drain()
        self._raise_fault()

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

        Afterwards no thread of the device is alive and nothing it allocated is left. Calling
        it again is a no-op; it is shielded from cancellation once started.
        """
        if self._state != _OPEN:
            if self._state == _CLOSING:  # another caller is closing: wait for it
                waiter = self._adapter.new_waiter()
                self._close_waiters.append(waiter)
                await self._adapter.wait(waiter)
            return
        self._state = _CLOSING
        with anyio.CancelScope(shield=True):
            if cancel:
                pending, self._pending = self._pending, []
                self._release_resources(pending)
                for request in pending:
                    request.settled = True
                    self._unsettled -= 1
                    request.stream._release_slot()
                    request.task._resolve(ClosedError("dropped by aclose(cancel=True)"))
            else:
                self._flush()
            for stream in self._streams:
                stream._wake_admission_waiters()
            forced = False
            if self._unsettled:
                with anyio.move_on_after(timeout) as scope:
                    await self._wait_idle()
                forced = scope.cancelled_caught or self._unsettled > 0
            await self._shutdown(forced=forced)

    async def __aenter__(self) -> Device:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"<Device {self.backend}:{self.device_id} {self._state} "
            f"streams={len(self._streams)} unsettled={self._unsettled}>"
        )

    # --- internals: checks ---------------------------------------------------------------

    def _rt(self) -> Runtime:
        # The runtime, with the calling thread bound to this device's context first: the loop
        # thread may serve several devices, and ACL contexts are per thread.
        if getattr(_bound, "token", None) is not self._bind_token:
            self._runtime.set_current_context()
            _bound.token = self._bind_token
        return self._runtime

    def _check_open(self) -> None:
        if self._state != _OPEN:
            raise ClosedError(f"the device is {self._state}")

    def _check_usable(self) -> None:
        if self._state != _OPEN:
            raise ClosedError(f"the device is {self._state}")
        if not self._adapter.is_current():
            raise RuntimeError(
                "aio_ascend device used from a different event loop (or thread) than the one "
                "that opened it"
            )
        self._raise_fault()

    def _raise_fault(self) -> None:
        fault = self._engine.fault
        if fault is not None:
            raise derived_error(fault, "the device has faulted; close and reopen it")

    def _function_handle(self, fn: object) -> int:
        if not isinstance(fn, Function):
            raise TypeError(f"fn must be a Function, got {type(fn).__name__}")
        if fn._device is not self:
            raise ValueError(f"{fn!r} belongs to a different device")
        return fn.handle

    def _device_buffers(
        self, objs: Iterable[object], field: str = "HostArgs.ptr"
    ) -> tuple[DeviceBuffer, ...]:
        if self._state != _OPEN:
            raise ClosedError(f"the device is {self._state}")
        out = []
        for obj in objs:
            if not isinstance(obj, DeviceBuffer):
                if field != "HostArgs.ptr":
                    raise TypeError(f"{field} must be a DeviceBuffer, got {type(obj).__name__}")
                continue
            if obj._device is not self:
                raise ValueError(f"{field}: {obj!r} belongs to a different device")
            if obj._free_requested:
                raise ValueError(f"{field}: {obj!r} has been freed")
            out.append(obj)
        return tuple(out)

    # --- internals: buffers --------------------------------------------------------------

    def _retain(self, buffers: tuple[DeviceBuffer, ...]) -> None:
        if buffers:
            with self._buf_lock:
                for buf in buffers:
                    buf._uses += 1

    def _free_buffer(self, buf: DeviceBuffer) -> None:
        with self._buf_lock:
            if buf._free_requested:
                return
            buf._free_requested = True
            if buf._uses:
                return  # the last user frees it
            buf._freed = True
            self._live_buffers.discard(buf)
        if self._state != _CLOSED:
            self._rt().free(buf.ptr)

    def _release_resources(self, requests: list[Request]) -> None:
        # Any library thread, once the device can no longer touch the requests' memory.
        release_host = self._pool.release
        to_free = []
        for request in requests:
            host = request.host
            if host is not None:
                request.host = None
                release_host(host)
            if request.buffers:
                with self._buf_lock:
                    for buf in request.buffers:
                        buf._uses -= 1
                        if buf._uses == 0 and buf._free_requested and not buf._freed:
                            buf._freed = True
                            self._live_buffers.discard(buf)
                            to_free.append(buf.ptr)
                request.buffers = ()
        if to_free:
            runtime = self._rt()
            for ptr in to_free:
                runtime.free(ptr)

    def _retire_user_event(self, handle: int, flags: int) -> None:
        # weakref.finalize of an Event (any thread): every request that used the event has
        # completed on the device, so its handle can be recorded again.
        self._dead_events.append((handle, flags))

    def _recycle_dead_events(self) -> None:
        # Loop thread: keep a bounded number of spare handles per flag set, destroy the rest.
        dead = self._dead_events
        while dead:
            handle, flags = dead.popleft()
            spares = self._spare_events.setdefault(flags, [])
            if len(spares) < _MAX_SPARE_EVENTS:
                spares.append(handle)
            elif self._state != _CLOSED:
                self._user_events.discard(handle)
                self._rt().destroy_event(handle)

    def _take_event(self, flags: int) -> int:
        """An Ex event with ``flags`` for ``record_event``: a recycled one if any."""
        if self._dead_events:
            self._recycle_dead_events()
        spares = self._spare_events.get(flags)
        if spares:
            return spares.pop()
        handle = self._rt().create_event(flags)
        self._user_events.add(handle)
        return handle

    # --- internals: submission and delivery (loop thread) --------------------------------

    def _enqueue(self, request: Request) -> None:
        self._pending.append(request)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if len(self._pending) >= self._flush_at:
            # A full batch goes out at once; the next admission yields to the loop once.
            self._flush()
            self._yield_due = True
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._adapter.call_soon(self._on_tick)

    def _on_tick(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._engine.submit(pending)
        if self._dead_events:
            self._recycle_dead_events()

    def _deliver(self, items: list[Delivery]) -> None:
        # The poller's one hop per round. Completions queue up here and are resolved in
        # bounded chunks, one per loop turn, however many hops arrive in one turn, so a flood
        # of completions cannot stall the loop.
        self._completed.extend(items)
        if not self._drain_scheduled:
            self._drain_completed()

    def _drain_completed(self, budget: bool = True) -> None:
        # What costs loop time is the coroutines each resolution wakes (awaiters of the task,
        # a launch waiting for the freed slot): those are budgeted per turn, plain
        # resolutions only loosely.
        self._drain_scheduled = False
        completed = self._completed
        wakes = 0
        limit = _MAX_RESOLVED_PER_TURN if budget else len(completed)
        wake_limit = _MAX_WAKES_PER_TURN if budget else len(completed) * 2 + 1
        for _ in range(min(len(completed), limit)):
            request, error, mode = completed.popleft()
            if mode != LATE:
                wakes += request.task._resolve(error)
                if not request.settled:
                    request.settled = True
                    self._unsettled -= 1
            if mode != TIMEOUT:
                wakes += request.stream._release_slot()
            if wakes >= wake_limit:
                break
        if completed and not self._drain_scheduled:
            self._drain_scheduled = True
            self._adapter.call_soon(self._drain_completed)
        elif self._unsettled == 0 and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                self._adapter.wake(waiter)

    async def _wait_idle(self) -> None:
        while self._unsettled > 0:
            waiter = self._adapter.new_waiter()
            self._idle_waiters.append(waiter)
            await self._adapter.wait(waiter)

    # --- internals: shutdown -------------------------------------------------------------

    async def _close_stream(self, stream: Stream) -> None:
        # self._streams holds the streams whose runtime stream still exists.
        if stream not in self._streams or self._state != _OPEN:
            return
        if self._engine.fault is not None or stream._in_flight:
            return  # its work can no longer be observed normally: aclose destroys it by force
        self._streams.remove(stream)
        self._rt().destroy_stream(stream.handle)

    async def _shutdown(self, *, forced: bool) -> None:
        engine = self._engine
        runtime = self._rt()
        engine.stop()
        if forced or engine.fault is not None:
            # Unblock threads stuck in runtime calls (full queues, hung kernels) first.
            self._destroy_streams()
        deadline = time.monotonic() + 10.0
        while not engine.join(0) and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.001)  # a thread join cannot be awaited: poll it briefly
        # What is left never completed. Once the streams are gone nothing on the device can
        # touch its memory: fail the tasks and release everything.
        self._destroy_streams()
        leftovers: list[Request] = engine.unsubmitted()
        leftovers.extend(self._pending)
        self._pending = []
        for batch in engine.leftover_batches():
            leftovers.extend(batch.requests)
        self._release_resources(leftovers)
        for request in leftovers:
            if not request.task.done():
                request.task._resolve(
                    TaskTimeoutError(f"{request.kind} did not finish before aclose() gave up")
                    if forced
                    else ClosedError(f"{request.kind} was dropped when the device closed")
                )
        self._release_resources(engine.orphans)
        engine.orphans.clear()
        self._drain_completed(budget=False)  # completions delivered but not yet resolved
        self._unsettled = 0
        for handle in engine.all_batch_events:
            self._quietly(runtime.destroy_event, handle)
        # Every user event, whether its Event object is gone (dead or spare) or still
        # referenced by the caller (Event.query() and elapsed_ms() raise ClosedError after this).
        for handle in self._user_events:
            self._quietly(runtime.destroy_event, handle)
        self._user_events.clear()
        self._dead_events.clear()
        self._spare_events.clear()
        with self._buf_lock:
            live = list(self._live_buffers)
            self._live_buffers.clear()
        for buf in live:
            buf._free_requested = buf._freed = True
            self._quietly(runtime.free, buf.ptr)
        for module in self._modules:
            self._quietly(runtime.unload_binary, module.handle)
        self._modules.clear()
        self._pool.close()
        self._state = _CLOSED
        runtime.close()
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            self._adapter.wake(waiter)

    def _destroy_streams(self) -> None:
        for stream in self._streams:
            stream._closed = True
            stream._in_flight = 0
            self._quietly(self._rt().destroy_stream_force, stream.handle)
        self._streams.clear()

    @staticmethod
    def _quietly(fn: Any, *args: Any) -> None:
        # Best-effort cleanup during shutdown: a failure here must not stop the rest.
        try:
            fn(*args)
        except Exception:
            pass

    def __del__(self) -> None:
        if getattr(self, "_state", _CLOSED) == _CLOSED:
            return
        message = (
            f"{self!r} was garbage-collected without aclose(); its threads are stopped and its "
            "runtime closed, but outstanding tasks are never resolved"
        )
        self._state = _CLOSED
        warnings.warn(message, ResourceWarning, stacklevel=1)
        try:
            self._engine.stop()
            self._engine.join(1.0)
            self._runtime.close()
        except Exception:
            pass


class _DeviceOpener:
    """What :func:`open_device` returns: ``async with`` it, or ``await`` it."""

    def __init__(self, kwargs: dict[str, Any], device_id: int, backend: str) -> None:
        self._kwargs = kwargs
        self._device_id = device_id
        self._backend = backend
        self._device: Device | None = None

    async def _open(self) -> Device:
        options = dict(self._kwargs)
        runtime_options = options.pop("runtime_options", None) or {}
        runtime = open_runtime(self._backend, self._device_id, **runtime_options)
        try:
            return Device(runtime, **options)
        except BaseException:
            runtime.close()
            raise

    def __await__(self) -> Generator[Any, None, Device]:
        return self._open().__await__()

    async def __aenter__(self) -> Device:
        self._device = await self._open()
        return self._device

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._device is not None:
            await self._device.aclose()


def open_device(
    device_id: int = 0,
    backend: str = "auto",
    *,
    completion: str = "poll",
    task_timeout: float = 600.0,
    debug: bool = False,
    batch_cap: int = 512,
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
    :param runtime_options: keyword options for the backend (sim: ``time_model=True``, ...)
    """
    if backend != "auto":
        choose_backend(backend)  # validate the name early, with a clear error
    kwargs = {
        "completion": completion,
        "task_timeout": task_timeout,
        "debug": debug,
        "batch_cap": batch_cap,
        "runtime_options": dict(runtime_options or {}),
    }
    return _DeviceOpener(kwargs, device_id, backend)
