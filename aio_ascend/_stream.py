"""``Stream``: an ordered queue of device work with bounded admission (public facade)."""

from __future__ import annotations

import enum
import math
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ._buffer import DeviceBuffer, allocations_of, byte_range
from ._errors import ClosedError
from ._event import Event, event_flags
from ._graph import Graph
from ._host.hostargs import HostArgs, PackedArgs
from ._host.hostdata import destination_bytes, dims_of, plain_dtype, source_array
from ._host.pinned import PinnedArrays, pinned_owner
from ._host.snapshot import shareable, shared_image
from ._interop import ExternalEvent, TorchOrder
from ._launch_config import LaunchConfig, LaunchConfigDict
from ._module import Function
from ._plan import LaunchPlan
from ._runtime.abi import MAX_NUM_BLOCKS
from ._sched.graphs import CaptureGraph
from ._sched.lane import Lane
from ._sched.scheduler import DeviceState, Scheduler
from ._sched.shutdown import drain as drain_lane
from ._sched.task import Task
from ._sched.unseen import raise_failures
from ._sched.work import (
    CopyDevice,
    CopyToDevice,
    CopyToHost,
    Launch,
    LaunchSpec,
    Memset,
    PinnedCopyToDevice,
    PinnedCopyToHost,
    RecordEvent,
    WaitEvent,
)
from ._stream_sync import HeldCalls, StreamSync, check_src_stream
from ._values import check_close_args, integer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from ._sched.lane import Lane
    from ._sched.lifetimes import Allocation, Lifetimes
    from ._sched.work import Request

__all__ = ["Stream"]

_Out = TypeVar("_Out")

_EMPTY_ARGS = HostArgs()  # never changed: it caches its packing for the last kernel it met


def _pack_for(fn: Function, args: object) -> PackedArgs:
    """``args`` packed for ``fn`` (checked against its declared parameters, with its hidden
    arguments): a ``ValueError`` names the kernel, before anything reaches the runtime."""
    if not isinstance(args, HostArgs):
        raise TypeError(f"args must be a HostArgs or None, got {type(args).__name__}")
    try:
        return args.pack(fn.info)
    except ValueError as exc:
        raise ValueError(f"kernel {fn.name!r}: {exc}") from None


def launch_args(
    device: object, scheduler: Scheduler, fn: object, blocks: object, args: object, config: object
) -> tuple[Function, int, PackedArgs, LaunchConfig | None, tuple[Allocation, ...]]:
    """A launch's input, checked (the one definition, for launches, plans and captures):
    ``(fn, blocks as an int, args packed for it, config, what it holds while queued: the
    device buffers the args point to and the kernel's module)``."""
    if not isinstance(fn, Function):
        raise TypeError(f"fn must be a Function, got {type(fn).__name__}")
    if fn.device is not device:
        raise ValueError(f"{fn!r} belongs to a different device")
    held = fn.module._held_by(fn)  # noqa: SLF001 - its lifetime; ClosedError once closed
    if type(blocks) is not int or not 1 <= blocks <= MAX_NUM_BLOCKS:
        blocks = _checked_blocks(blocks)
    if args is None:
        packed = fn.no_args  # (packed once per kernel)
        if packed is None:  # it declares parameters: the error names them
            packed = _pack_for(fn, _EMPTY_ARGS)
    else:
        packed = _pack_for(fn, args)
    cfg = None if config is None else LaunchConfig.coerce(config)  # type: ignore[arg-type]
    if not packed.buffers:
        return fn, blocks, packed, cfg, held
    scheduler.check_open()
    buffers = allocations_of(
        packed.buffers, scheduler.lifetimes, "HostArgs.ptr", others_allowed=True
    )
    return fn, blocks, packed, cfg, buffers + held


def _launch_spec(
    device: object, scheduler: Scheduler, fn: object, blocks: object, args: object, config: object
) -> LaunchSpec:
    """A launch's input checked and packed (:func:`launch_args`); without args or config it
    is kept on the kernel for its next launches with as many blocks (``Function.launch_specs``)."""
    fn, blocks, packed, cfg, buffers = launch_args(device, scheduler, fn, blocks, args, config)
    if args is not None:
        return LaunchSpec(fn.handle, blocks, cfg, packed, None, buffers, once=True, kernel=fn.name)
    host = fn.no_args_image
    if host is None and shareable(packed):
        # one pinned image per kernel, shared by its launches without args (unpinned with
        # its module: see its record's images; else by the pool's close)
        scheduler.check_open()
        host = fn.no_args_image = shared_image(scheduler.pool, packed)
        for record in fn.module.held:
            record.images.append(host)
    spec = LaunchSpec(fn.handle, blocks, cfg, packed, host, buffers, kernel=fn.name)
    if cfg is None:
        fn.launch_specs[blocks] = spec
    return spec


def _checked_blocks(blocks: object) -> int:
    count = integer("blocks", blocks)  # (numpy's integers too; never a bool)
    if not 1 <= count <= MAX_NUM_BLOCKS:
        raise ValueError(f"blocks={count} is out of range 1..{MAX_NUM_BLOCKS}")
    return count


def _new_array(src: object, dtype: npt.DTypeLike | None, shape: object) -> np.ndarray[Any, Any]:
    """The array ``download`` fills: checked against ``src`` before anything is queued."""
    if not isinstance(src, DeviceBuffer):
        hint = ""
        if isinstance(src, np.ndarray):
            hint = (
                "; to fill an existing array, pass it as out=: download(buf, out=array) "
                "(or copy_to_host(array, buf))"
            )
        raise TypeError(
            "download(src, dtype=None, shape=None, *, out=None) reads the DeviceBuffer src "
            f"into a new array: src must be a DeviceBuffer, got {type(src).__name__}{hint}"
        )
    kind = plain_dtype("download", np.uint8 if dtype is None else dtype)
    if shape is None:
        if src.nbytes % kind.itemsize:
            raise ValueError(
                f"download: src has {src.nbytes} bytes, not a multiple of {kind}'s "
                f"{kind.itemsize}-byte items; pass a shape"
            )
        dims: tuple[int, ...] = (src.nbytes // kind.itemsize,)
    else:
        dims = dims_of(shape, "download")
    needed = math.prod(dims) * kind.itemsize
    if needed == 0:
        raise ValueError(f"download: shape {dims} of {kind} holds no bytes: nothing to read")
    if needed > src.nbytes:
        raise ValueError(
            f"download: shape {dims} of {kind} needs {needed} bytes, src has {src.nbytes}"
        )
    return np.empty(dims, dtype=kind)


def _upload_args(
    lifetimes: Lifetimes, dst: object, src: object
) -> tuple[DeviceBuffer, DeviceBuffer, np.ndarray[Any, Any], int]:
    """``copy_to_device``'s input, checked: (dst, its root, the source array, count)."""
    if isinstance(src, DeviceBuffer) and not isinstance(dst, DeviceBuffer):
        raise TypeError(
            f"copy_to_device/upload(dst, src) writes host data src into the DeviceBuffer dst; "
            f"got a {type(dst).__name__} as dst and a DeviceBuffer as src: swap them (to read "
            "a buffer back: download(buf) or copy_to_host(array, buf))"
        )
    dst_buf, root, room = byte_range(dst, lifetimes, "copy_to_device dst", None)
    source = source_array(src, "copy_to_device src")
    count = source.nbytes
    if count == 0:
        raise ValueError("copy_to_device: src is empty")
    if count > room:
        raise ValueError(f"copy_to_device: src has {count} bytes, dst buffer only {room}")
    return dst_buf, root, source, count


def _pinned_address(pinned: PinnedArrays, data: np.ndarray[Any, Any], what: str) -> int:
    """The address of ``data`` if it lies in a pinned array of this device (the copy goes
    direct), else 0 (it is staged); a pinned array of another device is refused."""
    owner = pinned_owner(data)
    if owner is None:
        return 0
    if owner.registry is not pinned:
        closed = " (closed)" if owner.registry.closed else ""
        raise ValueError(
            f"{what} is a pinned array of another device{closed}: use one of this device's "
            "(dev.pinned_empty, dev.pinned_like) or an ordinary array"
        )
    return int(data.__array_interface__["data"][0])


def _device_copy_args(
    lifetimes: Lifetimes, dst: object, src: object, nbytes: object
) -> tuple[DeviceBuffer, DeviceBuffer, tuple[DeviceBuffer, DeviceBuffer], int]:
    """``copy_device``'s input, checked: (dst, src, their roots, count)."""
    src_buf, src_root, count = byte_range(src, lifetimes, "copy_device src", nbytes)
    dst_buf, dst_root, _ = byte_range(dst, lifetimes, "copy_device dst", count)
    if src_buf.ptr < dst_buf.ptr + count and dst_buf.ptr < src_buf.ptr + count:
        raise ValueError(
            "copy_device: the source and destination ranges overlap (the runtimes leave that "
            "undefined); copy through a temporary buffer"
        )
    return dst_buf, src_buf, (dst_root, src_root), count


def _memset_args(
    lifetimes: Lifetimes, dst: object, value: object, nbytes: object
) -> tuple[DeviceBuffer, DeviceBuffer, int, int]:
    """``memset``'s input, checked: (dst, its root, the byte value, count)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"memset value must be an int, got {type(value).__name__}")
    if not 0 <= value <= 255:
        raise ValueError(f"memset value={value} is not a byte (0..255)")
    dst_buf, root, count = byte_range(dst, lifetimes, "memset dst", nbytes)
    return dst_buf, root, int(value), count


class _CaptureState(enum.Enum):
    """A :class:`GraphCapture`'s life: entered once, recording inside the block, then done."""

    NEW = enum.auto()
    RECORDING = enum.auto()
    DONE = enum.auto()


class GraphCapture:
    """What ``async with stream.capture() as capture:`` gives: record operations on it, then
    take ``capture.graph`` after the block (see :meth:`Stream.capture`).

    Each call validates its input at once, as the stream's own methods do, and snapshots what
    it reads from the host (the launch's args, the copy's source bytes); nothing reaches the
    device until the block exits. Left by an exception, nothing is captured.
    """

    def __init__(
        self,
        stream: Stream,
        scheduler: Scheduler,
        lane: Lane,
        admit: Callable[[], Awaitable[None]],
    ) -> None:
        self._stream = stream
        self._scheduler = scheduler
        self._lane = lane
        self._admit = admit
        self._ops: list[Request] = []
        self._state = _CaptureState.NEW
        #: the captured graph, once the block has exited
        self.graph: Graph | None = None

    def _recording(self) -> None:
        self._scheduler.check_usable(self._lane)
        if self._state is not _CaptureState.RECORDING:
            raise RuntimeError("record operations inside `async with stream.capture() as c:`")

    def launch(
        self,
        fn: Function,
        blocks: int,
        args: HostArgs | None = None,
        *,
        config: LaunchConfig | LaunchConfigDict | None = None,
    ) -> None:
        """Record a kernel launch (see :meth:`Stream.launch`); ``args`` is snapshotted now."""
        self._recording()
        scheduler = self._scheduler
        fn, blocks, packed, cfg, buffers = launch_args(
            self._stream.device, scheduler, fn, blocks, args, config
        )
        self._ops.append(
            scheduler.graphs.launch(self._lane, fn.handle, blocks, cfg, packed, buffers, fn.name)
        )

    def copy_to_device(self, dst: DeviceBuffer, src: Any) -> None:
        """Record a host-to-device copy; the bytes of ``src`` are taken now, and every replay
        copies those."""
        self._recording()
        scheduler = self._scheduler
        dst_buf, root, source, count = _upload_args(scheduler.lifetimes, dst, src)
        self._ops.append(scheduler.graphs.copy_to_device(self._lane, dst_buf, root, source, count))

    def copy_device(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int | None = None) -> None:
        """Record a device-to-device copy (see :meth:`Stream.copy_device`)."""
        self._recording()
        scheduler = self._scheduler
        dst_buf, src_buf, roots, count = _device_copy_args(scheduler.lifetimes, dst, src, nbytes)
        self._ops.append(scheduler.graphs.copy_device(self._lane, dst_buf, src_buf, roots, count))

    def memset(self, dst: DeviceBuffer, value: int, nbytes: int | None = None) -> None:
        """Record a memset (see :meth:`Stream.memset`)."""
        self._recording()
        scheduler = self._scheduler
        dst_buf, root, byte, count = _memset_args(scheduler.lifetimes, dst, value, nbytes)
        self._ops.append(scheduler.graphs.memset(self._lane, dst_buf, root, byte, count))

    async def __aenter__(self) -> GraphCapture:
        if self._state is not _CaptureState.NEW:
            raise RuntimeError("a GraphCapture is entered once")
        self._scheduler.check_usable(self._lane)  # made before the device closed: ClosedError
        self._state = _CaptureState.RECORDING
        self._scheduler.graphs.begin(self._ops)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = _CaptureState.DONE
        ops, self._ops = self._ops, []
        graphs = self._scheduler.graphs
        if not graphs.end(ops, keep=exc_type is None):
            return  # left by an exception: what was recorded is released
        if not ops:
            raise ValueError("nothing was captured: use the capture's methods (capture.launch..)")
        record = graphs.new(ops)
        scheduler = self._scheduler
        try:
            await self._admit()
        except BaseException:
            record.registry.free(record)  # nothing was queued: released now
            raise
        capture = scheduler.enqueue(CaptureGraph(self._lane, record))  # (it holds the record)
        try:
            await capture
        except BaseException:
            record.registry.free(record)  # once the capture request is done with it
            raise
        self.graph = Graph(self._stream.device, record, scheduler.drop_record)


async def synchronize(scheduler: Scheduler, lanes: list[Lane], stream_ref: Any, what: str) -> None:
    """Wait for the work queued on ``lanes`` so far; then raise the unretrieved failures of
    one stream's tasks (every stream's for None), once, and the device's fault, every time.
    A close while it waits cannot take those failures from it (they are claimed); one called
    once the stream or device is closed (or closing) raises ``ClosedError``: it has nothing
    left to wait for, and returning would read as success for work the close may have failed."""
    if not scheduler.adapter.is_current():
        raise scheduler.adapter.foreign()
    scheduler.check_open(lanes[0] if stream_ref is not None else None)
    failures = scheduler.failures
    claim = failures.claim(stream_ref)
    try:
        for lane in lanes:
            await drain_lane(lane)
    finally:
        errors = failures.release(claim)
    seen = {id(error) for error in errors}
    errors.extend(e for e in failures.take(stream_ref) if id(e) not in seen)
    if scheduler.faults.first is not None:
        errors.append(scheduler.fault_error())
    raise_failures(errors, what)


class Stream(StreamSync):
    """A device stream: work submitted to it runs in submission order.

    Create with ``dev.stream(max_in_flight=1024)``. Every operation (``launch``, copies,
    ``record_event``, ``wait_event``) first *admits* the request: at most ``max_in_flight``
    requests of this stream are in flight at once, and further calls wait, first come first
    served. An admitted request is batched with the others made in the same loop tick and
    handed to the runtime in one thread hop; the call returns a :class:`Task` at once.

    Cancelling a call that is waiting for admission means the request never happens. Once the
    call has returned its ``Task``, the work will run (see :class:`Task`).

    Use from the event loop that opened the device only. A stream dropped without
    :meth:`aclose` is destroyed once the work queued on it has finished, with a
    ``ResourceWarning``.

    :ivar device: the device
    :ivar handle: the runtime stream handle
    :ivar max_in_flight: the admission bound
    """

    def __init__(
        self, device: object, scheduler: Scheduler, lane: Lane, order: TorchOrder | None = None
    ) -> None:
        self.device = device
        self.handle = lane.handle
        self.max_in_flight = lane.admission.limit
        self._scheduler = scheduler
        self._lane = lane
        self._ref = weakref.ref(self)
        lane.stream_ref = self._ref  # (its tasks' ``stream``)
        self._order = order
        self._hold = None
        self._line = HeldCalls()
        self._plain = order is None
        # Collected without aclose(): the scheduler destroys its runtime stream once its queued
        # work is done (the lane is the scheduler's, so nothing else would)
        device._object_finalizers.finalize(self, scheduler.drop_lane, lane)  # type: ignore[attr-defined]  # noqa: SLF001

    # --- operations ----------------------------------------------------------------------

    async def launch(
        self,
        fn: Function,
        blocks: int,
        args: HostArgs | None = None,
        *,
        config: LaunchConfig | LaunchConfigDict | None = None,
    ) -> Task:
        """Queue kernel ``fn`` on ``blocks`` blocks with ``args``; return its :class:`Task`.

        ``args`` is snapshotted: the builder may be reused as soon as this returns. Every
        ``DeviceBuffer`` it points to stays alive until the task completes.

        :raises TypeError: bad argument types (before anything reaches the runtime)
        :raises ValueError: bad argument values (before anything reaches the runtime)
        :raises ClosedError: the stream or device is closed
        :raises DeviceFaultError: the device has faulted (cause: the first fault)
        """
        scheduler = self._scheduler
        spec = None
        if (
            args is None
            and config is None
            and type(fn) is Function
            and type(blocks) is int
            and fn.device is self.device
        ):
            spec = fn.launch_specs.get(blocks)  # checked and packed before
        if spec is None:
            spec = _launch_spec(self.device, scheduler, fn, blocks, args, config)
        lane = self._lane
        if not (self._plain and scheduler.try_admit(lane)):
            await self._admit()
        if self._order is None:
            return scheduler.enqueue(Launch(lane, spec))
        return await self._queued(Launch(lane, spec))

    def plan(
        self,
        fn: Function,
        blocks: int,
        args: HostArgs | None = None,
        *,
        config: LaunchConfig | LaunchConfigDict | None = None,
    ) -> LaunchPlan:
        """A :class:`LaunchPlan`: ``fn`` on ``blocks`` blocks with ``args``, checked, packed
        and pinned once, to queue on this stream again and again (``await plan.launch()``,
        ``await plan.run()``). ``args`` is snapshotted now; the device buffers it points to
        stay alive until the plan is closed and its launches have finished.

        :raises TypeError: bad argument types
        :raises ValueError: bad argument values
        :raises ClosedError: the stream or device is closed
        :raises DeviceFaultError: the device has faulted
        """
        scheduler = self._scheduler
        scheduler.check_usable(self._lane)
        fn, blocks, packed, cfg, buffers = launch_args(
            self.device, scheduler, fn, blocks, args, config
        )
        return LaunchPlan(self, self._ref, scheduler, self._lane, fn, blocks, cfg, packed, buffers)

    async def copy_to_device(self, dst: DeviceBuffer, src: Any) -> Task:
        """Copy host data into ``dst`` on this stream: an ndarray, an object with the buffer
        protocol, a CPU ``__dlpack__`` object (a torch CPU tensor) or one with ``__array__``;
        its bytes in C order (a strided source is gathered as it is staged).

        ``src`` is staged into a pinned buffer just before submission (above 1 MiB by a
        staging thread) and kept referenced until then: do not modify it until the task
        completes. A pinned array of this device
        (:meth:`Device.pinned_empty`) is read by the device itself when the copy executes,
        with no staging: do not modify it until the task completes.

        :raises ValueError: ``src`` is a pinned array of another device
        """
        scheduler = self._scheduler
        scheduler.check_open()
        dst_buf, root, source, count = _upload_args(scheduler.lifetimes, dst, src)
        addr = _pinned_address(scheduler.pinned, source, "copy_to_device src")
        if not source.flags.c_contiguous:
            addr = 0  # a strided view of a pinned array is gathered into a staging buffer
        await self._admit()
        if addr:  # straight from the user's pinned memory
            copy: Request = PinnedCopyToDevice(
                self._lane, None, dst_buf, root, (addr, source), count
            )
        else:
            copy = CopyToDevice(self._lane, None, dst_buf, root, source, count)
        return await self._queued(copy)

    async def copy_to_host(self, dst: Any, src: DeviceBuffer) -> Task:
        """Copy as many bytes of ``src`` as ``dst`` holds into ``dst``, in place: a writable,
        C-contiguous ndarray, writable object with the buffer protocol (``bytearray``, ...)
        or CPU ``__dlpack__`` object (a torch CPU tensor).

        ``dst`` is filled when the task completes (before ``await task`` returns); a task that
        fails never writes it. A pinned array of this device (:meth:`Device.pinned_empty`) is
        written by the device itself, with no staging: if the task fails or times out, its
        contents are unspecified until the device has been synchronized or closed.

        :raises ValueError: ``dst`` is read-only, not C-contiguous, empty, or a pinned array
            of another device
        """
        scheduler = self._scheduler
        scheduler.check_open()
        if isinstance(dst, DeviceBuffer) and not isinstance(src, DeviceBuffer):
            raise TypeError(
                "copy_to_host(dst, src) reads the DeviceBuffer src into the array dst; got a "
                f"DeviceBuffer as dst and a {type(src).__name__} as src: swap them (to write "
                "host data into a buffer: upload(buf, array))"
            )
        src_buf, root, room = byte_range(src, scheduler.lifetimes, "copy_to_host src", None)
        dst_bytes = destination_bytes(dst, "copy_to_host dst")
        count = dst_bytes.nbytes
        if count > room:
            raise ValueError(f"copy_to_host: dst has {count} bytes, src buffer only {room}")
        addr = _pinned_address(scheduler.pinned, dst_bytes, "copy_to_host dst")
        await self._admit()
        if addr:  # straight into the user's pinned memory
            copy: Request = PinnedCopyToHost(
                self._lane, None, (addr, dst_bytes), src_buf, root, count
            )
        else:
            copy = CopyToHost(self._lane, None, dst_bytes, src_buf, root, count)
        return await self._queued(copy)

    async def copy_device(
        self,
        dst: DeviceBuffer,
        src: DeviceBuffer,
        nbytes: int | None = None,
        *,
        src_stream: Stream | None = None,
    ) -> Task:
        """Copy ``nbytes`` (default: all of ``src``) from ``src`` to ``dst`` (device memory of
        this device) on this stream.

        ``src`` may belong to another device: then the read is queued on ``src_stream``, a
        stream of that device (after the work queued on it so far), staged through host
        memory, and the call returns once it is done, with the Task of the write here.

        :raises ValueError: ``nbytes`` exceeds either buffer, the two ranges overlap, or
            ``src`` is on another device and no ``src_stream`` is given, or ``src_stream`` is
            not a stream of ``src``'s device (each before anything is queued, on either device)
        """
        scheduler = self._scheduler
        scheduler.check_open()
        if isinstance(src, DeviceBuffer) and src.registry is not scheduler.lifetimes:
            return await self._copy_from_peer(dst, src, nbytes, src_stream)
        dst_buf, src_buf, roots, count = _device_copy_args(scheduler.lifetimes, dst, src, nbytes)
        check_src_stream(src_buf, src_stream)  # (unused here: src is on this device)
        await self._admit()
        return await self._queued(CopyDevice(self._lane, dst_buf, src_buf, count, roots))

    async def memset(self, dst: DeviceBuffer, value: int, nbytes: int | None = None) -> Task:
        """Set ``nbytes`` bytes (default: all) of ``dst`` to the byte ``value`` (0..255) on this
        stream."""
        scheduler = self._scheduler
        scheduler.check_open()
        dst_buf, root, byte, count = _memset_args(scheduler.lifetimes, dst, value, nbytes)
        await self._admit()
        return await self._queued(Memset(self._lane, dst_buf, root, byte, count))

    # --- one await: queue and wait for completion ---------------------------------------

    async def run(
        self,
        fn: Function,
        blocks: int,
        args: HostArgs | None = None,
        *,
        config: LaunchConfig | LaunchConfigDict | None = None,
    ) -> None:
        """:meth:`launch` and wait until the kernel has finished.

        Cancelled before the launch was admitted, nothing happens; after it, only the wait is
        cancelled: the kernel still runs (see :class:`Task`).
        """
        await (await self.launch(fn, blocks, args, config=config))

    async def upload(self, dst: DeviceBuffer, src: Any) -> None:
        """:meth:`copy_to_device` and wait until the copy has finished."""
        await (await self.copy_to_device(dst, src))

    @overload
    async def download(
        self,
        src: DeviceBuffer,
        dtype: npt.DTypeLike | None = None,
        shape: int | tuple[int, ...] | None = None,
        *,
        out: None = None,
    ) -> np.ndarray[Any, Any]: ...

    @overload
    async def download(
        self, src: DeviceBuffer, dtype: None = None, shape: None = None, *, out: _Out
    ) -> _Out: ...

    async def download(
        self,
        src: DeviceBuffer,
        dtype: npt.DTypeLike | None = None,
        shape: int | tuple[int, ...] | None = None,
        *,
        out: Any = None,
    ) -> Any:
        """Copy device memory into a new array (or into ``out``), wait, and return the array.

        :param dtype: the new array's dtype (``None``: ``uint8``)
        :param shape: its shape (``None``: 1-D, as many items as ``src`` holds; ``src``'s size
            must then be a multiple of the item size). A shape needing fewer bytes than ``src``
            has reads the start of ``src``.
        :param out: what to fill in place and return instead (then ``dtype`` and ``shape``
            stay ``None``): anything :meth:`copy_to_host` takes (an ndarray, a writable
            buffer, a torch CPU tensor, a pinned array)
        :raises ValueError: the array needs more bytes than ``src`` has
        """
        if out is not None:
            if dtype is not None or shape is not None:
                raise ValueError("download(): pass either out= or dtype/shape, not both")
            array = out
        else:
            array = _new_array(src, dtype, shape)
        await (await self.copy_to_host(array, src))
        return array

    # --- graphs ----------------------------------------------------------------------------

    def capture(self) -> GraphCapture:
        """Record device work once, to replay it with one runtime call per replay::

            async with stream.capture() as capture:
                capture.launch(fn, 8, args)      # recorded (args snapshotted now), not run
                capture.memset(buf, 0)
            graph = capture.graph                # after the block: an aa.Graph
            await other.run_graph(graph)         # on any stream of the device

        The capture runs on this stream (the runtime's stream capture) when the block exits,
        after the work queued on it before; the block's exit waits for it. Launches,
        host-to-device copies, device copies and memsets can be captured; copies to host,
        events and waits cannot (download after the replay instead).
        """
        self._scheduler.check_usable(self._lane)
        return GraphCapture(self, self._scheduler, self._lane, self._admit)

    async def launch_graph(self, graph: Graph) -> Task:
        """Queue one replay of ``graph`` on this stream; return its :class:`Task` (one runtime
        task; the graph stays alive until it is done)."""
        if not isinstance(graph, Graph):
            raise TypeError(f"launch_graph() takes a Graph, got {type(graph).__name__}")
        if graph.device is not self.device:
            raise ValueError("launch_graph(): the graph belongs to a different device")
        self._scheduler.check_open()  # (the close closed the graph too: say why)
        if graph.closed:
            raise ClosedError(f"launch_graph(): {graph!r} is closed")
        return await graph._replay(self)  # noqa: SLF001

    async def run_graph(self, graph: Graph) -> None:
        """:meth:`launch_graph` and wait until the replay has finished."""
        await (await self.launch_graph(graph))

    async def record_event(self, *, timing: bool = False) -> Event:
        """Record an :class:`Event` after the work queued so far on this stream."""
        if not isinstance(timing, bool):
            raise TypeError("timing must be a bool")
        return await self._fence(timing, drain=True, handover=True)

    async def _fence(
        self, timing: bool = False, drain: bool = False, handover: bool = False, quiet: bool = False
    ) -> Event:
        # record_event; without the external stream's handshake unless ``handover``
        await self._admit(drain)
        scheduler = self._scheduler
        record = RecordEvent(self._lane, quiet=quiet)
        try:
            handle = scheduler.user_events.take(event_flags(timing))
            record.event = event = Event(self.device, scheduler, self, handle, timing, record)
        except BaseException:
            scheduler.unadmit(self._lane)
            raise
        if handover:
            await self._queued(record)
        else:
            scheduler.enqueue(record)
        return event

    async def wait_event(self, event: Event | ExternalEvent) -> Task:
        """Make work queued on this stream after this call wait for ``event`` (on the device):
        an :class:`Event` of this device, or one made elsewhere (``dev.external_event``). The
        returned Task completes once the stream is past the wait, so awaiting it waits for
        the event too."""
        if not isinstance(event, Event | ExternalEvent):
            raise TypeError(f"wait_event() takes an Event, got {type(event).__name__}")
        if event.device is not self.device:
            raise ValueError("wait_event(): the event belongs to a different device")
        if isinstance(event, ExternalEvent):
            event.drain()
        await self._admit()
        return await self._queued(WaitEvent(self._lane, event))

    async def synchronize(self) -> None:
        """Wait until everything queued on this stream so far has finished.

        Then raises what nobody has seen yet: the failures of this stream's earlier tasks
        whose errors were never retrieved (one as itself, several as an ``ExceptionGroup``;
        each only once, and ``ClosedError`` from a cancelling close does not count), and the
        device's fault if it has one (every time).

        :raises ClosedError: the stream or the device is closed (or closing) when it is called
        """
        await synchronize(self._scheduler, [self._lane], self._ref, "tasks of this stream")

    async def aclose(
        self,
        *,
        cancel: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the stream's work, not the call
    ) -> None:
        """Wait for this stream's work, then destroy it.

        A call while another close of the stream waits (or after one whose wait was
        cancelled) waits as that one does, with its own ``cancel`` and ``timeout``: the first
        deadline to pass forces the stream, and both return once it is gone. Once the stream
        is gone, a call does nothing.

        :param cancel: drop this stream's requests still on the loop's side (not yet handed to
            the submitter thread: their tasks fail with ``ClosedError``); what the submitter
            has is still submitted (or fails by its deadline) and waited for
        :param timeout: seconds to wait for the stream's work; past it the stream is destroyed
            by force and its unfinished tasks fail with ``TaskTimeoutError``, as in a forced
            ``Device.aclose``, while the device and its other streams carry on. Work the
            ``task_timeout`` watchdog failed counts until the device finishes it. ``None``
            waits until every task has finished or been failed by the watchdog (the stream
            goes once the device has finished such work).

        What the forced work holds (its buffers, pinned staging) is released only when the
        device closes: the device may still be running it. The forced part is shielded from
        cancellation; cancelling the wait before it leaves the stream closed to new work.
        """
        timeout = check_close_args(cancel, timeout)
        scheduler, lane = self._scheduler, self._lane
        if not scheduler.adapter.is_current() and not (
            lane.closed and (lane not in scheduler.lanes or scheduler.state is not DeviceState.OPEN)
        ):
            raise scheduler.adapter.foreign()  # before anything changes (once gone: nothing)
        closing = scheduler.close_lane(lane, cancel=cancel, timeout=timeout)
        if self._hold is not None:
            # Calls held behind a host function (one the watchdog failed may run for long)
            # are refused now, not after it: the close marks the stream closed before it
            # first waits, so they wake to a closed stream.
            self._hold.returned.set()
        await closing

    async def __aenter__(self) -> Stream:
        if self.closed:
            raise ClosedError("the stream is closed")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        """Whether the stream takes no new work (closed, or its device closed)."""
        return self._lane.closed

    @property
    def in_flight(self) -> int:
        """Requests admitted on this stream and not yet finished on the device (slots granted
        ahead for a caller's next calls are not requests yet: not counted)."""
        return self._lane.admission.unsettled()

    def __repr__(self) -> str:
        lane = self._lane
        state = "closed" if lane.closed else "open"
        return (
            f"<Stream {self.handle:#x} {state} in_flight={lane.admission.unsettled()}/"
            f"{self.max_in_flight} waiting={len(lane.admission.queue)}>"
        )
