"""Units of device work as they travel from the loop to the runtime and back.

A :class:`Request` is created on the event loop when a stream admits it, submitted to the
runtime by the submitter thread, and released by the poller thread once its completion has been
observed. It owns what the device may read or write for it (a pooled pinned buffer, device
allocations it references, user arrays) until then: nothing is released on cancellation.
"""

from __future__ import annotations

import enum
from abc import abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import derived_error
from .._host.hostdata import write_bytes
from .._host.snapshot import snapshot_args
from .._runtime.abi import (
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from .._runtime.pybatch import launch_one
from .compiled import interpreted
from .events import EventRecord
from .task import Task

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._host.hostargs import PackedArgs
    from .._host.pool import HostBuffer, HostBufferPool
    from .._launch_config import LaunchConfig
    from .._runtime import Runtime
    from .lane import Lane
    from .lifetimes import Allocation

__all__ = [
    "STAGE_AT_HAND_BYTES",
    "Arrival",
    "Batch",
    "CopyDevice",
    "CopyToDevice",
    "CopyToHost",
    "Delivery",
    "Launch",
    "LaunchSpec",
    "Memset",
    "Outcome",
    "PinnedCopyToDevice",
    "PinnedCopyToHost",
    "RecordEvent",
    "Request",
    "WaitEvent",
    "expand",
]

#: host copies up to this size are staged where they are queued and unstaged by the poller;
#: the host side of a bigger one is done by a staging thread (see ``stager.CopyWorker``)
STAGE_AT_HAND_BYTES = 1 << 20


class Outcome(enum.Enum):
    """What a delivered completion means for its task and for its stream's slot."""

    #: the device finished (or refused) the request: resolve the task, free its slot
    FINISHED = enum.auto()
    #: the watchdog gave up: resolve the task, keep the slot until the device is done with it
    TIMED_OUT = enum.auto()
    #: timed-out work the device finished after all: only free the slot
    FINISHED_LATE = enum.auto()


@interpreted  # a Task (a regular Python class: users hold weak references to tasks)
class Request(Task):
    """One operation on one stream, and the :class:`Task` its caller awaits (one object per
    operation). Subclasses implement :meth:`submit`."""

    # Its fields are declared and set by ``Task.__init__`` (one call makes a request):
    #
    # - ``host``: its pinned staging buffer or args image (None until staged, and once
    #   released);
    # - ``buffers``: the device allocations (and plan or graph records) it uses, until released;
    # - ``entries``: runtime queue entries it holds (``admission.ENTRIES_PER_REQUEST`` until
    #   its batch is formed), and ``closes_batch``: whether its batch's completion event is
    #   recorded after it;
    # - ``position``: the runtime's id of its (last) task once submitted (what a fault report
    #   names); -1: not submitted, or the runtime does not tell.
    kind = "request"
    lane: Lane  # (its stream, as the scheduler sees it)
    #: whether it counts as a copy in ``Device.stats()`` (the submitter counts a plain
    #: :class:`Launch` by its type; a graph replay counts as neither)
    is_copy = False
    #: whether :meth:`on_complete` has host-side work to do
    needs_completion = False
    #: runtime tasks it queues on its stream (fault reports count them)
    runtime_tasks = 1
    #: whether it refers to user objects (arrays, events) that :meth:`let_go` drops once it
    #: is released: the request is the Task its caller may keep for long
    holds_user = False
    #: whether it goes through a pinned staging buffer (``host``: taken by :meth:`stage` when
    #: it is queued; for a big copy the loop leaves it None, and the submitter has
    #: :meth:`prepare` run by its staging thread)
    staged = False
    #: whether it always closes its batch (an event's record: its Task, and so ``await
    #: event``, completes with it, not with work queued after it in the same tick)
    ends_batch = False

    host: HostBuffer | None
    buffers: tuple[Allocation, ...]

    @abstractmethod
    def submit(self, runtime: Runtime, stream: int) -> None:
        """Queue the operation on ``stream`` (submitter thread)."""

    def stage(self, pool: HostBufferPool) -> None:
        """Take its pinned staging buffer from ``pool`` (loop thread, when it is queued)."""

    def prepare(self, acquire: Callable[[int], HostBuffer]) -> None:
        """Take the pinned staging buffer of a big copy from ``acquire`` and fill it (a staging
        thread, while the request waits)."""

    def on_complete(self) -> None:
        """Finish host-side work after the device completed it (poller thread, or its staging
        thread for a big copy: see :meth:`unstaged_bytes`)."""

    def unstaged_bytes(self) -> int:
        """Bytes :meth:`on_complete` copies (only called when ``needs_completion``)."""
        return 0

    def on_refused(self, exc: BaseException) -> None:
        """The request will never reach the device (the thread that gave up on it: the
        submitter, the watchdog, or the loop dropping it before the hand-over)."""

    def let_go(self) -> None:
        """Released (any library thread): drop the user objects it refers to."""


Delivery = tuple[Request, BaseException | None, Outcome]


# (not acyclic: a LaunchPlan's spec and its record hold each other, spec.buffers being the
# record, and a cycle through an object the collector cannot see is never collected)
class LaunchSpec:
    """What every launch of one kernel with one set of args has in common: made once (per
    kernel and block count for its launches without args or config, once per ``LaunchPlan``,
    once per launch with args of its own) and shared by its launches.

    :ivar func: the runtime's function handle
    :ivar kernel: the kernel's name, for traces and metrics (None: not known)
    :ivar blocks: the number of blocks
    :ivar cfg: the launch config, or None
    :ivar args: the packed args
    :ivar host: a pinned image of ``args`` every launch reads (``snapshot.shareable``), or None
        when each launch needs a copy of its own (taken by :meth:`Launch.stage`)
    :ivar buffers: the device allocations the args point to (each launch retains them)
    :ivar once: made for one launch: the args (and through them the user's buffers) are let
        go once that launch has its own copy, since its Task may be kept long after
    """

    __slots__ = (
        "args",
        "blocks",
        "buffers",
        "cfg",
        "func",
        "host",
        "kernel",
        "nbytes",
        "once",
        "placeholder_count",
        "table_offset",
    )

    def __init__(
        self,
        func: int,
        blocks: int,
        cfg: LaunchConfig | None,
        args: PackedArgs,
        host: HostBuffer | None = None,
        buffers: tuple[Allocation, ...] = (),
        *,
        once: bool = False,
        kernel: str | None = None,
    ) -> None:
        self.func = func
        self.kernel = kernel
        self.blocks = blocks
        self.cfg = cfg
        self.args: PackedArgs | None = args
        self.host = host
        self.buffers = buffers
        self.once = once
        self.nbytes = args.nbytes
        self.table_offset = args.table_offset
        self.placeholder_count = args.placeholder_count


@interpreted
class Launch(Request):
    """A kernel launch of ``spec``: its host args in a pinned buffer, the spec's shared image
    or a copy of its own (``host`` None until :meth:`stage` takes it)."""

    __slots__ = ("spec",)
    kind = "launch"
    staged = True

    def __init__(self, lane: Lane, spec: LaunchSpec) -> None:
        Task.__init__(self, lane, spec.host, spec.buffers)
        self.spec = spec

    def stage(self, pool: HostBufferPool) -> None:
        spec = self.spec
        args = spec.args
        assert args is not None, "a spec made for one launch is staged once"
        self.host = snapshot_args(pool, args)
        if spec.once:  # (the request keeps its own reference to the buffers)
            spec.args = None
            spec.buffers = ()

    def submit(self, runtime: Runtime, stream: int) -> None:
        launch_one(runtime, self)  # (on its lane's stream: ``stream``)


@interpreted
class _Copy(Request):
    """A copy of ``count`` bytes (staged through the pinned buffer ``host`` if it has a host
    side); it keeps ``allocations`` (the device memory's roots) in use.

    Device memory is held as ``(ptr, nbytes)``, not as the user's buffer objects, and a user
    array only while it is needed: once a request is released, nothing of the user's is left
    in it (a wrapped buffer's owner is let go as soon as the work is done).
    """

    __slots__ = ("count", "dst", "src")
    is_copy = True
    holds_user = True

    def __init__(
        self,
        lane: Lane,
        host: HostBuffer | None,
        dst: Any,
        src: Any,
        count: int,
        allocations: tuple[Allocation, ...],
    ) -> None:
        super().__init__(lane, host, allocations)
        self.dst = dst
        self.src = src
        self.count = count

    def let_go(self) -> None:
        self.dst = self.src = None


@interpreted
class CopyToDevice(_Copy):
    """Host -> device: the source is staged into a pinned buffer just before submission.

    ``src`` is the source array, in any layout: its C-order bytes are sent (gathered into
    the staging buffer by :func:`write_bytes`; see ``Stream.copy_to_device``);
    ``dst`` the device memory (a buffer or a view), ``root`` the allocation it belongs to.
    """

    __slots__ = ()
    kind = "copy_to_device"
    staged = True

    def __init__(
        self,
        lane: Lane,
        host: HostBuffer | None,
        dst: Allocation,
        root: Allocation,
        src: Any,
        count: int,
    ) -> None:
        super().__init__(lane, host, (dst.ptr, dst.nbytes), src, count, (root,))

    def stage(self, pool: HostBufferPool) -> None:
        if self.count <= STAGE_AT_HAND_BYTES:  # else staged aside (prepare)
            self.host = pool.acquire(self.count)

    def prepare(self, acquire: Callable[[int], HostBuffer]) -> None:
        self.host = acquire(self.count)  # held from here: released with the request
        self._fill(self.host)

    def _fill(self, host: HostBuffer) -> None:
        write_bytes(np.frombuffer(host.view, np.uint8, self.count), self.src)
        self.src = None  # staged: the user's array is not needed any more

    def submit(self, runtime: Runtime, stream: int) -> None:
        host = self.host
        assert host is not None
        if self.src is not None:  # a small copy: staged here
            self._fill(host)
        ptr, room = self.dst
        runtime.memcpy_async(ptr, room, host.addr, self.count, ACL_MEMCPY_HOST_TO_DEVICE, stream)


@interpreted
class CopyToHost(_Copy):
    """Device -> host: lands in a pinned buffer, copied into the user's array on completion.

    ``dst`` is the destination's first ``count`` bytes as a 1-D uint8 array (same memory).
    """

    __slots__ = ()
    kind = "copy_to_host"
    staged = True
    needs_completion = True

    def __init__(
        self,
        lane: Lane,
        host: HostBuffer | None,
        dst: Any,
        src: Allocation,
        root: Allocation,
        count: int,
    ) -> None:
        super().__init__(lane, host, dst, (src.ptr, src.nbytes), count, (root,))

    def submit(self, runtime: Runtime, stream: int) -> None:
        host = self.host
        assert host is not None
        runtime.memcpy_async(
            host.addr, host.capacity, self.src[0], self.count, ACL_MEMCPY_DEVICE_TO_HOST, stream
        )

    def stage(self, pool: HostBufferPool) -> None:
        if self.count <= STAGE_AT_HAND_BYTES:  # else staged aside (prepare)
            self.host = pool.acquire(self.count)

    def prepare(self, acquire: Callable[[int], HostBuffer]) -> None:
        self.host = acquire(self.count)

    def on_complete(self) -> None:
        host = self.host
        assert host is not None
        np.copyto(self.dst, np.frombuffer(host.view, np.uint8, self.count))  # GIL released
        self.dst = None

    def unstaged_bytes(self) -> int:
        return self.count


@interpreted
class PinnedCopyToDevice(CopyToDevice):
    """Host -> device straight from the user's pinned array: no staging.

    ``src`` is ``(address, array)``: the array (and so its pinned memory) is held as long as
    the request, which outlives the device's use of it, since the runtime reads it when the
    copy executes.
    """

    __slots__ = ()
    staged = False

    def submit(self, runtime: Runtime, stream: int) -> None:
        ptr, room = self.dst
        runtime.memcpy_async(ptr, room, self.src[0], self.count, ACL_MEMCPY_HOST_TO_DEVICE, stream)


@interpreted
class PinnedCopyToHost(CopyToHost):
    """Device -> host straight into the user's pinned array: no staging, nothing to do on
    completion. ``dst`` is ``(address, array)``, held as long as the request.

    The device writes the user's memory itself here: a copy that failed or timed out may
    still have written part of it (or write it later, until the device is done).
    """

    __slots__ = ()
    staged = False
    needs_completion = False

    def submit(self, runtime: Runtime, stream: int) -> None:
        count = self.count
        runtime.memcpy_async(
            self.dst[0], count, self.src[0], count, ACL_MEMCPY_DEVICE_TO_HOST, stream
        )


@interpreted
class CopyDevice(_Copy):
    """Device -> device on the stream; ``roots`` are the allocations of ``dst`` and ``src``."""

    __slots__ = ()
    kind = "copy_device"

    def __init__(
        self,
        lane: Lane,
        dst: Allocation,
        src: Allocation,
        count: int,
        roots: tuple[Allocation, Allocation],
    ) -> None:
        super().__init__(lane, None, (dst.ptr, dst.nbytes), (src.ptr, src.nbytes), count, roots)

    def submit(self, runtime: Runtime, stream: int) -> None:
        (dst, room), (src, _) = self.dst, self.src
        runtime.memcpy_async(dst, room, src, self.count, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)


@interpreted
class Memset(Request):
    """Set ``count`` bytes of device memory to one byte value on the stream."""

    __slots__ = ("count", "dst", "value")
    kind = "memset"

    def __init__(
        self, lane: Lane, dst: Allocation, root: Allocation, value: int, count: int
    ) -> None:
        super().__init__(lane, None, (root,))
        self.dst = (dst.ptr, dst.nbytes)
        self.value = value
        self.count = count

    def submit(self, runtime: Runtime, stream: int) -> None:
        ptr, room = self.dst
        runtime.memset_async(ptr, room, self.value, self.count, stream)


@interpreted
class _EventRequest(Request):
    """A request on a user-visible event. The public ``Event`` awaits its record request (its
    record task), so the event is let go once the request is released: no cycle keeps a
    dropped event alive, and a kept task holds no event."""

    __slots__ = ("event", "quiet")
    holds_user = True

    def __init__(self, lane: Lane, event: EventRecord | None = None, quiet: bool = False) -> None:
        super().__init__(lane, None, ())
        #: the event (set after the request is made where the event needs it first)
        self.event: Any = event
        #: a record of the library's own (``wait_stream``'s, ``launch_host_func``'s): see
        #: ``Task.quiet`` (an instance's flag, not a subclass: the compiled submitter tells
        #: records by their exact type)
        self.quiet = quiet

    def let_go(self) -> None:
        self.event = None


@interpreted
class RecordEvent(_EventRequest):
    """Record a user-visible event on the stream."""

    __slots__ = ()
    kind = "record_event"
    ends_batch = True

    def submit(self, runtime: Runtime, stream: int) -> None:
        try:
            runtime.record_event(self.event.handle, stream)
        except BaseException as exc:
            self.event.error = exc
            raise
        self.event.recorded = True

    def on_refused(self, exc: BaseException) -> None:
        self.event.error = exc


@interpreted
class WaitEvent(_EventRequest):
    """Make later work on the stream wait for an event recorded on another stream."""

    __slots__ = ()
    kind = "wait_event"

    def submit(self, runtime: Runtime, stream: int) -> None:
        record_error = self.event.error
        if record_error is not None:
            raise derived_error(record_error, "the event this wait depends on was never recorded")
        runtime.stream_wait_event(stream, self.event.handle)

    def record_pending(self) -> bool:
        """Whether the event's record has not reached the runtime yet, nor failed (its stream
        is parked in the submitter): a wait submitted now would not wait for it. (An event
        made elsewhere is recorded by its owner: never pending here.)"""
        event = self.event
        return isinstance(event, EventRecord) and not event.recorded and event.error is None


class Batch:
    """Requests submitted to one stream in one hop, followed by one recorded event.

    :ivar submitted: ``time.perf_counter()`` once its event was recorded (the tasks'
        ``submitted_at``)
    :ivar completed: when the poller saw its event complete (the tasks' ``completed_at``)
    :ivar delivered: how many of its requests the loop has resolved (a whole finished batch is
        delivered as one item: see :func:`expand`)
    """

    __slots__ = (
        "completed",
        "deadline",
        "delivered",
        "event",
        "lane",
        "requests",
        "submitted",
        "timed_out",
    )

    def __init__(
        self,
        lane: Lane,
        requests: list[Request],
        event: int,
        deadline: float,
        submitted: float = 0.0,
    ):
        self.lane = lane
        self.requests = requests
        self.event = event
        self.deadline = deadline
        self.submitted = submitted
        self.timed_out = False
        self.completed = 0.0
        self.delivered = 0


#: what the threads hand the loop: one request's outcome (and error), or a whole batch that
#: finished (each of its requests FINISHED: the poller's usual delivery)
Arrival = Delivery | Batch


def expand(items: Iterable[Arrival]) -> list[Delivery]:
    """Deliveries one per request: a finished batch's requests (not yet resolved) stamped with
    its times, ``(request, None, FINISHED)`` each."""
    out: list[Delivery] = []
    for item in items:
        if isinstance(item, Batch):
            submitted, completed = item.submitted, item.completed
            for request in item.requests[item.delivered :]:
                request.submitted_at = submitted
                request.completed_at = completed
                out.append((request, None, Outcome.FINISHED))
        else:
            out.append(item)
    return out
