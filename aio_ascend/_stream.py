"""``Stream``: an ordered queue of device work with bounded admission (public facade)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ._buffer import DeviceBuffer, allocations_of
from ._event import Event, event_flags
from ._host.hostargs import HostArgs
from ._launch_config import LaunchConfig
from ._module import Function
from ._runtime.abi import MAX_NUM_BLOCKS
from ._sched.scheduler import Scheduler
from ._sched.task import Task

if TYPE_CHECKING:
    from types import TracebackType

    from ._sched.lane import Lane

__all__ = ["Stream"]

_EMPTY_PACKED = HostArgs().pack()


def _check_blocks(blocks: object) -> int:
    if isinstance(blocks, bool) or not isinstance(blocks, int):
        raise TypeError(f"blocks must be an int, got {type(blocks).__name__}")
    if not 1 <= blocks <= MAX_NUM_BLOCKS:
        raise ValueError(f"blocks={blocks} is out of range 1..{MAX_NUM_BLOCKS}")
    return blocks


def _source_bytes(src: object) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``src`` of ``copy_to_device`` as a 1-D contiguous byte array, checked in the call.

    A strided source is copied into a contiguous one here (that copy is what is sent);
    object arrays and what is not an array or bytes-like are refused.
    """
    if isinstance(src, np.ndarray):
        array = src
    else:
        try:
            array = np.asarray(memoryview(src))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TypeError(
                f"copy_to_device src must be an ndarray or bytes-like, got {type(src).__name__}"
            ) from None
    if array.dtype.hasobject:
        raise TypeError(f"copy_to_device src: an array of {array.dtype} has no device bytes")
    return np.ascontiguousarray(array.view(np.ndarray)).reshape(-1).view(np.uint8)


class Stream:
    """A device stream: work submitted to it runs in submission order.

    Create with ``dev.stream(max_in_flight=1024)``. Every operation (``launch``, copies,
    ``record_event``, ``wait_event``) first *admits* the request: at most ``max_in_flight``
    requests of this stream are in flight at once, and further calls wait, first come first
    served. An admitted request is batched with the others made in the same loop tick and
    handed to the runtime in one thread hop; the call returns a :class:`Task` at once.

    Cancelling a call that is waiting for admission means the request never happens. Once the
    call has returned its ``Task``, the work will run (see :class:`Task`).

    Use from the event loop that opened the device only.

    :ivar device: the device
    :ivar handle: the runtime stream handle
    :ivar max_in_flight: the admission bound
    """

    def __init__(self, device: object, scheduler: Scheduler, lane: Lane) -> None:
        self.device = device
        self.handle = lane.handle
        self.max_in_flight = lane.admission.limit
        self._scheduler = scheduler
        self._lane = lane
        self._ref = weakref.ref(self)

    # --- operations ----------------------------------------------------------------------

    async def launch(
        self,
        fn: Function,
        blocks: int,
        args: HostArgs | None = None,
        *,
        config: LaunchConfig | dict[str, Any] | None = None,
    ) -> Task:
        """Queue kernel ``fn`` on ``blocks`` blocks with ``args``; return its :class:`Task`.

        ``args`` is snapshotted: the builder may be reused as soon as this returns. Every
        ``DeviceBuffer`` it points to stays alive until the task completes.

        :raises TypeError, ValueError: bad arguments (before anything reaches the runtime)
        :raises ClosedError: the stream or device is closed
        :raises DeviceFaultError: the device has faulted (cause: the first fault)
        """
        scheduler = self._scheduler
        if type(fn) is not Function or fn.device is not self.device:
            self._check_function(fn)
        if type(blocks) is not int or not 0 < blocks <= MAX_NUM_BLOCKS:
            blocks = _check_blocks(blocks)
        if args is None:
            packed = _EMPTY_PACKED
        elif isinstance(args, HostArgs):
            packed = args.pack()
        else:
            raise TypeError(f"args must be a HostArgs or None, got {type(args).__name__}")
        cfg = None if config is None else LaunchConfig.coerce(config)
        if packed.buffers:
            scheduler.check_open()
            buffers = allocations_of(
                packed.buffers, scheduler.lifetimes, "HostArgs.ptr", others_allowed=True
            )
        else:
            buffers = ()
        lane = self._lane
        if not scheduler.try_admit(lane):
            await scheduler.admit(lane)
        task = Task(scheduler.adapter, self._ref, "launch")
        return scheduler.launch(lane, task, fn.handle, blocks, cfg, packed, buffers)

    def _check_function(self, fn: object) -> None:
        if not isinstance(fn, Function):
            raise TypeError(f"fn must be a Function, got {type(fn).__name__}")
        if fn.device is not self.device:
            raise ValueError(f"{fn!r} belongs to a different device")

    def _buffer(self, obj: object, field: str) -> DeviceBuffer:
        self._scheduler.check_open()
        (buffer,) = allocations_of((obj,), self._scheduler.lifetimes, field)
        return buffer

    async def copy_to_device(self, dst: DeviceBuffer, src: Any) -> Task:
        """Copy host data (an ndarray or bytes-like, C order) into ``dst`` on this stream.

        ``src`` is staged into a pinned buffer just before submission and kept referenced
        until the task completes: do not modify it until then.
        """
        dst_buf = self._buffer(dst, "copy_to_device dst")
        source = _source_bytes(src)
        count = source.nbytes
        if count == 0:
            raise ValueError("copy_to_device: src is empty")
        if count > dst_buf.nbytes:
            raise ValueError(
                f"copy_to_device: src has {count} bytes, dst buffer only {dst_buf.nbytes}"
            )
        await self._admit()
        task = Task(self._scheduler.adapter, self._ref, "copy_to_device")
        return self._scheduler.copy_to_device(self._lane, task, dst_buf, source, count)

    async def copy_to_host(self, dst: np.ndarray[Any, Any], src: DeviceBuffer) -> Task:
        """Copy ``dst.nbytes`` bytes of ``src`` into the writable, C-contiguous array ``dst``.

        ``dst`` is filled when the task completes (before ``await task`` returns).
        """
        src_buf = self._buffer(src, "copy_to_host src")
        if not isinstance(dst, np.ndarray):
            raise TypeError(f"copy_to_host dst must be an ndarray, got {type(dst).__name__}")
        if dst.dtype.hasobject:
            raise TypeError(f"copy_to_host dst: an array of {dst.dtype} cannot hold device data")
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("copy_to_host dst must be a writable, C-contiguous ndarray")
        count = dst.nbytes
        if count == 0:
            raise ValueError("copy_to_host: dst is empty")
        if count > src_buf.nbytes:
            raise ValueError(
                f"copy_to_host: dst has {count} bytes, src buffer only {src_buf.nbytes}"
            )
        await self._admit()
        task = Task(self._scheduler.adapter, self._ref, "copy_to_host")
        # the same memory as a plain 1-D byte array (np.matrix and other subclasses included)
        dst_bytes = dst.view(np.ndarray).reshape(-1).view(np.uint8)
        return self._scheduler.copy_to_host(self._lane, task, dst_bytes, src_buf, count)

    async def record_event(self, *, timing: bool = False) -> Event:
        """Record an :class:`Event` after the work queued so far on this stream."""
        if not isinstance(timing, bool):
            raise TypeError("timing must be a bool")
        await self._admit()
        scheduler = self._scheduler
        task = Task(scheduler.adapter, self._ref, "record_event")

        def make_event(handle: int) -> Event:
            return Event(self.device, scheduler, self, handle, timing, task)

        event = scheduler.record_event(self._lane, task, make_event, event_flags(timing))
        assert isinstance(event, Event)
        return event

    async def wait_event(self, event: Event) -> Task:
        """Make work queued on this stream after this call wait for ``event`` (on the device)."""
        if not isinstance(event, Event):
            raise TypeError(f"wait_event() takes an Event, got {type(event).__name__}")
        if event.device is not self.device:
            raise ValueError("wait_event(): the event belongs to a different device")
        await self._admit()
        task = Task(self._scheduler.adapter, self._ref, "wait_event")
        return self._scheduler.wait_event(self._lane, task, event)

    async def _admit(self) -> None:
        if not self._scheduler.try_admit(self._lane):
            await self._scheduler.admit(self._lane)

    async def synchronize(self) -> None:
        """Wait until everything queued on this stream so far has finished.

        Raises the device's fault if it has one; failures of individual tasks are reported by
        their own ``Task``.
        """
        last = self._lane.last
        if last is not None and not last.done():
            try:
                await last
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    raise
        self._scheduler.raise_fault()

    async def aclose(self) -> None:
        """Wait for this stream's work, then destroy it. Idempotent."""
        await self._scheduler.close_lane(self._lane)

    async def __aenter__(self) -> Stream:
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
        """Requests admitted on this stream and not yet finished on the device."""
        return self._lane.admission.in_flight

    def __repr__(self) -> str:
        lane = self._lane
        state = "closed" if lane.closed else "open"
        return (
            f"<Stream {self.handle:#x} {state} in_flight={lane.admission.in_flight}/"
            f"{self.max_in_flight} waiting={len(lane.admission.queue)}>"
        )
