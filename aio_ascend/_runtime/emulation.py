"""One ACL emulation: the runtime's rules written once, for backends that model ACL over
something else (the sim's device thread, the CUDA driver).

The acl backend gets ACL's semantics from the real runtime. The sim and the cuda backend have
to *be* that runtime, and most of what that means has nothing to do with their device:

* **Contexts.** Every call but a few needs this runtime's context bound to the calling thread;
  otherwise it fails (107002) before anything happens (``_enter``). A backend says what "bound"
  means (``_bound``) and words the refusal (``_context_error``).
* **The sticky fault.** Once the device faulted, every call that submits or observes work
  raises the fault (``_enter_live``); creation and cleanup calls keep working. The first fault
  is kept as a :class:`Fault` (its error class, ACL or CUDA code, and text) until ``close``.
* **The thread's latest error.** Each refusal leaves its text for ``aclGetRecentErrMsg``
  (``get_recent_error_message``), per thread, in one format: ``"<call> [<code>]: <why>"``.
  Errors built here remember themselves (``_error``, ``_param``, ``_bad_handle``); an error a
  shared :mod:`.abi` check raised is remembered with ``_checked`` (or ``_noted``).
* **Handles.** Streams, events, graphs, binaries and functions are looked up in tables this
  class owns, so a handle that is not live (never made, destroyed, or another runtime's) is
  refused with 107017 before the device sees it.
* **Capture.** A capturing stream refuses what cannot be captured (``_not_capturing``), and
  the graph calls' bookkeeping (one capture at a time, a graph handle that never aliases a
  destroyed one) is the same everywhere.

A call is then written once here as its ACL rules, ending in one hook that does the device's
part: ``_device_<what>``. A backend is its device: the hooks, its hot paths (launches, event
records and queries, copies), its ``info`` and ``close``. Each backend names its calls in
:attr:`AclEmulation.CALLS` (its errors carry those names: ``aclrtMalloc`` on the sim,
``cuMemAlloc`` on cuda), so a refusal says which native function refused.

Threads: the tables are plain dicts, changed by whichever thread calls (the scheduler calls a
runtime from its submitter and poller threads, and the loop thread creates and destroys);
single dict operations are atomic under the GIL, and a backend whose device part needs more
takes its own lock there.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

from .._errors import AscendError, RuntimeAPIError, error_for_code
from .abi import (
    ACL_ERROR_RT_INVALID_HANDLE,
    ACL_ERROR_RT_PARAM_INVALID,
    ACL_EVENT_TIME_LINE,
    MALLOC_APPEND_SIZE,
    KernelType,
    check_alloc_size,
    check_binary_source,
    check_event_flags,
    check_failure_mode,
    check_kernel_name,
    check_load_options,
    check_memcpy,
    check_timeout,
)
from .abi import hex_or_repr as _hex
from .base import PLAIN_FUNCTION, FunctionInfo

__all__ = ["AclEmulation", "Fault"]


class Fault(NamedTuple):
    """The first device fault of a runtime: raised by every later call that needs the device."""

    error: type[RuntimeAPIError]
    code: int
    message: str


class _Stream(Protocol):
    handle: int
    failure_mode: int

    @property
    def capture(self) -> object | None: ...


class _Event(Protocol):
    handle: int
    timed: bool


class _Graph(Protocol):
    handle: int


class _Binary(Protocol):
    functions: dict[str, int]


class _Function(Protocol):
    info: FunctionInfo


StreamT = TypeVar("StreamT", bound=_Stream)
EventT = TypeVar("EventT", bound=_Event)
GraphT = TypeVar("GraphT", bound=_Graph)
BinaryT = TypeVar("BinaryT", bound=_Binary)
FunctionT = TypeVar("FunctionT", bound=_Function)
_E = TypeVar("_E", bound=AscendError)


class AclEmulation(ABC, Generic[StreamT, EventT, GraphT, BinaryT, FunctionT]):
    """ACL's semantics over a backend's device (see the module docstring)."""

    #: the backend's native name for each call of the seam (what its errors name)
    CALLS: ClassVar[dict[str, str]]

    def __init__(self) -> None:
        self._tls: Any = threading.local()
        self._closed = False
        self._fault: Fault | None = None
        self._streams: dict[int, StreamT] = {}
        self._events: dict[int, EventT] = {}
        self._graphs: dict[int, GraphT] = {}
        self._binaries: dict[int, BinaryT] = {}
        self._functions: dict[int, FunctionT] = {}

    # --- what a backend supplies besides the _device_* hooks ---------------------------

    @abstractmethod
    def _bound(self) -> bool:
        """Whether this runtime's context is the calling thread's."""

    @abstractmethod
    def _context_error(self, func: str) -> AscendError:
        """The refusal of a call made while closed or without this context bound."""

    # --- errors: each one leaves its text as the thread's latest ------------------------

    def _noted(self, exc: _E) -> _E:
        """``exc``, remembered as this thread's latest error."""
        code = "" if exc.code is None else f" [{exc.code}]"
        self._tls.last_error = f"{exc.func}{code}: {exc.message}"
        return exc

    def _error(self, code: int, func: str, message: str) -> RuntimeAPIError:
        """The typed error for ``code`` (remembered)."""
        return self._noted(error_for_code(code, func, message))

    def _param(self, func: str, message: str) -> RuntimeAPIError:
        return self._error(ACL_ERROR_RT_PARAM_INVALID, func, message)

    def _bad_handle(self, func: str, message: str) -> RuntimeAPIError:
        return self._error(ACL_ERROR_RT_INVALID_HANDLE, func, message)

    def _fault_error(self, func: str) -> RuntimeAPIError:
        fault = self._fault
        assert fault is not None
        return self._noted(fault.error(fault.message, code=fault.code, func=func))

    def _checked(self, check: Any, func: str, *args: Any) -> Any:
        """``check(func, *args)`` (a shared :mod:`.abi` check), its refusal remembered."""
        try:
            return check(func, *args)
        except RuntimeAPIError as exc:
            raise self._noted(exc) from None

    def get_recent_error_message(self) -> str:
        """``aclGetRecentErrMsg``: the latest error text of the calling thread ('' if none)."""
        message: str = getattr(self._tls, "last_error", "")
        return message

    # --- entering a call ----------------------------------------------------------------

    def _enter(self, func: str) -> None:
        """Open, and this runtime's context bound to the calling thread."""
        if self._closed or not self._bound():
            raise self._context_error(func)

    def _enter_live(self, func: str) -> None:
        """:meth:`_enter`, and no device fault (calls that submit or observe work)."""
        if self._closed or not self._bound():
            raise self._context_error(func)
        if self._fault is not None:
            raise self._fault_error(func)

    def must_settle(self) -> bool:
        """See the protocol: never on an emulation."""
        return False

    def wait_settled(self, limit_s: float | None = None) -> None:
        """See the protocol: nothing of a stream destroyed by force outlives it here."""

    def leaked_device_blocks(self) -> int:
        """See the protocol: never on an emulation."""
        return 0

    # --- handles ------------------------------------------------------------------------

    def _stream(self, stream: int, func: str) -> StreamT:
        s = self._streams.get(stream)
        if s is None:
            raise self._bad_handle(func, f"stream handle {stream!r} is not a live stream")
        return s

    def _event(self, event: int, func: str) -> EventT:
        ev = self._events.get(event)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        return ev

    def _graph(self, graph: int, func: str) -> GraphT:
        g = self._graphs.get(graph)
        if g is None:
            raise self._bad_handle(func, f"graph handle {_hex(graph)} is not a live graph")
        return g

    def _binary(self, binary: int, func: str) -> BinaryT:
        b = self._binaries.get(binary)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        return b

    def _not_capturing(self, s: StreamT, func: str) -> None:
        if s.capture is not None:
            raise self._param(
                func, f"stream {s.handle:#x} is capturing: {func} is refused until end_capture"
            )

    # --- streams ------------------------------------------------------------------------

    def stream_priority_range(self) -> tuple[int, int]:
        """``(least, greatest)`` urgency: lower numbers are more urgent."""
        func = self.CALLS["stream_priority_range"]
        self._enter(func)
        return self._device_priority_range(func)

    def create_stream(self, priority: int | None = None) -> int:
        """A stream; a ``priority`` outside :meth:`stream_priority_range` is refused."""
        func = self.CALLS["create_stream"]
        self._enter(func)
        if priority is not None:
            least, greatest = self.stream_priority_range()
            if (
                isinstance(priority, bool)
                or not isinstance(priority, int)
                or not greatest <= priority <= least
            ):
                raise self._param(
                    self.CALLS["stream_priority"],
                    f"stream priority {priority!r} is outside the device's range "
                    f"{greatest}..{least} (lower = more urgent)",
                )
        return self._device_create_stream(priority, func).handle

    def destroy_stream(self, stream: int) -> None:
        """Wait for the stream's queued work (unless the device faulted), then destroy it."""
        func = self.CALLS["destroy_stream"]
        self._enter(func)
        self._device_destroy_stream(self._stream(stream, func), False, func)

    def destroy_stream_force(self, stream: int) -> None:
        """Destroy the stream at once (see each backend for what happens to its work)."""
        func = self.CALLS["destroy_stream_force"]
        self._enter(func)
        self._device_destroy_stream(self._stream(stream, func), True, func)

    def set_stream_failure_mode(self, stream: int, mode: int) -> None:
        """Validated and stored: on an emulation any kernel fault halts the whole device (as
        stop-on-failure does)."""
        func = self.CALLS["set_stream_failure_mode"]
        self._enter(func)
        s = self._stream(stream, func)
        s.failure_mode = self._checked(check_failure_mode, func, mode)

    def synchronize_stream(self, stream: int, timeout_ms: int) -> None:
        """Block until the stream's work so far is done, or ``timeout_ms`` (-1: forever)."""
        func = self.CALLS["synchronize_stream"]
        self._enter_live(func)
        s = self._stream(stream, func)
        self._not_capturing(s, func)
        self._device_sync_stream(s, self._checked(check_timeout, func, timeout_ms), func)

    # --- events -------------------------------------------------------------------------

    def create_event(self, flags: int) -> int:
        """An Ex event (``ACL_EVENT_TIME_LINE`` in ``flags``: it keeps a timestamp)."""
        func = self.CALLS["create_event"]
        self._enter(func)
        flags = self._checked(check_event_flags, func, flags)
        ev = self._device_create_event(bool(flags & ACL_EVENT_TIME_LINE), func)
        self._events[ev.handle] = ev
        return ev.handle

    def destroy_event(self, event: int) -> None:
        """Destroy the event (queued records and waits of it still complete)."""
        func = self.CALLS["destroy_event"]
        self._enter(func)
        ev = self._events.pop(event, None)
        if ev is None:
            raise self._bad_handle(func, f"event handle {event!r} is not a live event")
        self._device_destroy_event(ev, func)

    def record_event(self, event: int, stream: int) -> None:
        """NOT_READY from the end of this call until the device reaches the record."""
        func = self.CALLS["record_event"]
        self._enter_live(func)
        ev = self._event(event, func)
        s = self._stream(stream, func)
        self._not_capturing(s, func)
        self._device_record(ev, s, func)

    def query_event_status(self, event: int) -> int:
        """1 (COMPLETE) or 0 (NOT_READY); never blocks. A never-recorded event is COMPLETE."""
        func = self.CALLS["query_event_status"]
        self._enter_live(func)
        return self._device_query(self._event(event, func), func)

    def synchronize_event(self, event: int, timeout_ms: int) -> None:
        """Block until the event's latest record completed, or ``timeout_ms`` (-1: forever)."""
        func = self.CALLS["synchronize_event"]
        self._enter_live(func)
        ev = self._event(event, func)
        self._device_sync_event(ev, self._checked(check_timeout, func, timeout_ms), func)

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Later work on ``stream`` waits for the event's record as of this call."""
        func = self.CALLS["stream_wait_event"]
        self._enter_live(func)
        s = self._stream(stream, func)
        ev = self._event(event, func)
        self._not_capturing(s, func)
        self._device_wait_event(s, ev, func)

    def event_elapsed_time(self, start: int, end: int) -> float:
        """Milliseconds between two completed ``ACL_EVENT_TIME_LINE`` events."""
        func = self.CALLS["event_elapsed_time"]
        self._enter_live(func)
        pair = []
        for label, handle in (("startEvent", start), ("endEvent", end)):
            ev = self._event(handle, func)
            if not ev.timed:
                raise self._param(func, f"{label} was not created with ACL_EVENT_TIME_LINE")
            pair.append(ev)
        return self._device_elapsed(pair[0], pair[1], func)

    # --- memory -------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """Device memory (see each backend for its alignment)."""
        func = self.CALLS["malloc"]
        self._enter(func)
        size = self._checked(check_alloc_size, func, size, MALLOC_APPEND_SIZE)
        return self._device_malloc(size, func)

    def malloc_host(self, size: int) -> int:
        """Pinned host memory."""
        func = self.CALLS["malloc_host"]
        self._enter(func)
        return self._device_malloc_host(self._checked(check_alloc_size, func, size), func)

    def free(self, ptr: int) -> None:
        """Free device memory at once, even if queued work still uses it."""
        func = self.CALLS["free"]
        self._enter(func)
        if not self._device_free(ptr, func):
            raise self._param(func, f"devPtr={_hex(ptr)} is not a live device allocation")

    def free_host(self, ptr: int) -> None:
        """Free pinned host memory at once."""
        func = self.CALLS["free_host"]
        self._enter(func)
        if not self._device_free_host(ptr, func):
            raise self._param(func, f"hostPtr={_hex(ptr)} is not a live pinned host allocation")

    def memcpy_async(
        self, dst: int, dst_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """Queue a copy; a pageable host side makes the call wait until the copy is done."""
        func = self.CALLS["memcpy_async"]
        self._enter_live(func)
        s = self._stream(stream, func)
        self._checked(check_memcpy, func, dst, dst_max, src, count, kind)
        self._device_memcpy(s, dst, src, count, kind, func)

    # --- kernels ------------------------------------------------------------------------

    def load_binary(
        self, source: object, *, kernel_type: KernelType | None = None, lazy: bool | None = None
    ) -> int:
        """Load a kernel binary (what ``source`` may be is each backend's); ``kernel_type``
        and ``lazy`` are checked and otherwise ignored."""
        func = self.CALLS["load_binary"]
        check_load_options(kernel_type, lazy)
        check_binary_source(source)
        self._enter(func)
        handle, binary = self._device_load(source, func)
        self._binaries[handle] = binary
        return handle

    def unload_binary(self, binary: int) -> None:
        """Unload: its function handles become invalid (queued launches still run)."""
        func = self.CALLS["unload_binary"]
        self._enter(func)
        b = self._binaries.pop(binary, None)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        for handle in b.functions.values():
            self._functions.pop(handle, None)
        self._device_unload(b, func)

    def get_function(self, binary: int, name: str) -> int:
        """The kernel ``name`` of ``binary``; an unknown name is 107042 (symbol not found)."""
        func = self.CALLS["get_function"]
        self._enter(func)
        encoded = check_kernel_name(name)
        b = self._binary(binary, func)
        handle = b.functions.get(name)
        if handle is None:
            handle, function = self._device_get_function(binary, b, name, encoded, func)
            self._functions[handle] = function
            b.functions[name] = handle
        return handle

    def function_info(self, func: int) -> FunctionInfo:
        """A kernel's declared parameters, else nothing to follow (the args go to the kernel
        as the builder packed them)."""
        f = self._functions.get(func)
        return PLAIN_FUNCTION if f is None else f.info

    # --- graphs -------------------------------------------------------------------------

    def begin_capture(self, stream: int) -> None:
        """Work submitted to ``stream`` from now on is recorded, not run, until
        :meth:`end_capture`."""
        func = self.CALLS["begin_capture"]
        self._enter_live(func)
        s = self._stream(stream, func)
        if s.capture is not None:
            raise self._param(func, f"stream {stream:#x} is already capturing")
        self._device_begin_capture(s, func)

    def end_capture(self, stream: int) -> int:
        """The recorded work as a graph handle (never one a destroyed graph had)."""
        func = self.CALLS["end_capture"]
        self._enter(func)
        s = self._stream(stream, func)
        if s.capture is None:
            raise self._param(func, f"stream {stream:#x} is not capturing")
        g = self._device_end_capture(s, func)
        self._graphs[g.handle] = g
        return g.handle

    def launch_graph(self, graph: int, stream: int) -> None:
        """Queue one replay of ``graph`` on ``stream`` (one task of the stream)."""
        func = self.CALLS["launch_graph"]
        self._enter_live(func)
        s = self._stream(stream, func)
        g = self._graph(graph, func)
        self._not_capturing(s, func)
        self._device_launch_graph(g, s, func)

    def destroy_graph(self, graph: int) -> None:
        """Destroy the graph at once (the caller makes sure no queued replay needs it)."""
        func = self.CALLS["destroy_graph"]
        self._enter(func)
        g = self._graphs.pop(graph, None)
        if g is None:
            raise self._bad_handle(func, f"graph handle {_hex(graph)} is not a live graph")
        self._device_destroy_graph(g, func)

    # --- the device's part of each call (abstract: a backend lacking one cannot be made) -

    @abstractmethod
    def _device_priority_range(self, func: str) -> tuple[int, int]: ...

    @abstractmethod
    def _device_create_stream(self, priority: int | None, func: str) -> StreamT:
        """Create and register (``self._streams``) a stream (``None``: default priority)."""

    @abstractmethod
    def _device_destroy_stream(self, s: StreamT, force: bool, func: str) -> None:
        """Unregister and destroy ``s`` (ending a capture left open on it)."""

    @abstractmethod
    def _device_sync_stream(self, s: StreamT, timeout_ms: int, func: str) -> None: ...

    @abstractmethod
    def _device_create_event(self, timed: bool, func: str) -> EventT: ...

    @abstractmethod
    def _device_destroy_event(self, ev: EventT, func: str) -> None: ...

    @abstractmethod
    def _device_record(self, ev: EventT, s: StreamT, func: str) -> None: ...

    @abstractmethod
    def _device_query(self, ev: EventT, func: str) -> int: ...

    @abstractmethod
    def _device_sync_event(self, ev: EventT, timeout_ms: int, func: str) -> None: ...

    @abstractmethod
    def _device_wait_event(self, s: StreamT, ev: EventT, func: str) -> None: ...

    @abstractmethod
    def _device_elapsed(self, start: EventT, end: EventT, func: str) -> float: ...

    @abstractmethod
    def _device_malloc(self, size: int, func: str) -> int: ...

    @abstractmethod
    def _device_malloc_host(self, size: int, func: str) -> int: ...

    @abstractmethod
    def _device_free(self, ptr: int, func: str) -> bool:
        """Free ``ptr``; False if it is not a live allocation."""

    @abstractmethod
    def _device_free_host(self, ptr: int, func: str) -> bool: ...

    @abstractmethod
    def _device_memcpy(
        self, s: StreamT, dst: int, src: int, count: int, kind: int, func: str
    ) -> None: ...

    @abstractmethod
    def _device_load(self, source: object, func: str) -> tuple[int, BinaryT]: ...

    @abstractmethod
    def _device_unload(self, b: BinaryT, func: str) -> None: ...

    @abstractmethod
    def _device_get_function(
        self, handle: int, b: BinaryT, name: str, encoded: bytes, func: str
    ) -> tuple[int, FunctionT]: ...

    @abstractmethod
    def _device_begin_capture(self, s: StreamT, func: str) -> None: ...

    @abstractmethod
    def _device_end_capture(self, s: StreamT, func: str) -> GraphT: ...

    @abstractmethod
    def _device_launch_graph(self, g: GraphT, s: StreamT, func: str) -> None: ...

    @abstractmethod
    def _device_destroy_graph(self, g: GraphT, func: str) -> None: ...
