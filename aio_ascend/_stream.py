"""``Stream``: an ordered queue of device work with bounded admission (event-loop side)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import ClosedError
from ._host.hostargs import HostArgs
from ._launch_config import LaunchConfig
from ._module import Function
from ._runtime.abi import MAX_NUM_BLOCKS
from ._sched.task import Event, Task, _event_flags
from ._sched.work import CopyToDevice, CopyToHost, Launch, RecordEvent, Request, WaitEvent

if TYPE_CHECKING:
    from types import TracebackType

    from ._device import Device, DeviceBuffer
    from ._host.pool import HostBuffer

_OPEN = "open"

__all__ = ["Stream"]

_EMPTY_PACKED = HostArgs().pack()


class _Admission:
    __slots__ = ("granted", "waiter")

    def __init__(self, waiter: Any) -> None:
        self.waiter = waiter
        self.granted = False


def _check_blocks(blocks: object) -> int:
    if isinstance(blocks, bool) or not isinstance(blocks, int):
        raise TypeError(f"blocks must be an int, got {type(blocks).__name__}")
    if not 1 <= blocks <= MAX_NUM_BLOCKS:
        raise ValueError(f"blocks={blocks} is out of range 1..{MAX_NUM_BLOCKS}")
    return blocks


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
    """

    def __init__(self, device: Device, handle: int, max_in_flight: int) -> None:
        self._device = device
        self.handle = handle
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._admission: deque[_Admission] = deque()
        self._closed = False
        self._last: Task | None = None

    # --- admission -----------------------------------------------------------------------

    async def _admit(self) -> None:
        device = self._device
        if device._yield_due:
            # A tight launch loop never suspends otherwise: once per flushed batch, let the
            # loop run (this bounds loop lag at a few ms however fast the caller launches).
            device._yield_due = False
            await device._adapter.checkpoint()
        if (
            device._state is not _OPEN
            or device._engine.fault is not None
            or device._loop_now() is not device._loop_identity
        ):
            device._check_usable()
        if self._closed:
            raise ClosedError("the stream is closed")
        if self._in_flight < self.max_in_flight and not self._admission:
            self._in_flight += 1
        else:
            await self._wait_for_slot()
        if self._in_flight > device._peak_in_flight:
            device._peak_in_flight = self._in_flight
        device._unsettled += 1

    async def _wait_for_slot(self) -> None:
        device = self._device
        entry = _Admission(device._adapter.new_waiter())
        self._admission.append(entry)
        try:
            await device._adapter.wait(entry.waiter)
        except BaseException:
            if entry.granted:
                self._release_slot()
            else:
                self._admission.remove(entry)
            raise
        try:
            device._check_usable()
            if self._closed:
                raise ClosedError("the stream was closed while waiting for admission")
        except BaseException:
            self._release_slot()
            raise

    def _release_slot(self) -> int:
        # Loop thread. A freed slot passes straight to the oldest waiter, if any (returns 1
        # when it woke one).
        admission = self._admission
        while admission:
            entry = admission.popleft()
            if entry.granted:
                continue
            entry.granted = True
            self._device._adapter.wake(entry.waiter)
            return 1
        self._in_flight -= 1
        return 0

    def _wake_admission_waiters(self) -> None:
        # On close: every admission waiter gets a slot, re-checks the state and raises.
        admission = self._admission
        while admission:
            entry = admission.popleft()
            entry.granted = True
            self._in_flight += 1
            self._device._adapter.wake(entry.waiter)

    def _enqueue(self, request: Request) -> Task:
        self._last = request.task
        self._device._enqueue(request)
        return request.task

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
        device = self._device
        if type(fn) is Function and fn._device is device:
            func = fn.handle
        else:
            func = device._function_handle(fn)
        if type(blocks) is not int or not 0 < blocks <= MAX_NUM_BLOCKS:
            blocks = _check_blocks(blocks)
        if args is None:
            packed = _EMPTY_PACKED
        elif type(args) is HostArgs or isinstance(args, HostArgs):
            packed = args._packed or args.pack()
        else:
            raise TypeError(f"args must be a HostArgs or None, got {type(args).__name__}")
        cfg = None if config is None else LaunchConfig.coerce(config)
        buffers = device._device_buffers(packed.buffers) if packed.buffers else ()
        # self._admit(), inlined on its fast path (this is the hottest call of the library)
        if (
            device._yield_due
            or device._state is not _OPEN
            or device._engine.fault is not None
            or device._loop_now() is not device._loop_identity
            or self._closed
            or self._in_flight >= self.max_in_flight
            or self._admission
        ):
            await self._admit()
        else:
            self._in_flight += 1
            if self._in_flight > device._peak_in_flight:
                device._peak_in_flight = self._in_flight
            device._unsettled += 1
        try:
            nbytes = packed.nbytes
            count = packed.placeholder_count
            table_offset = (nbytes + 7) & ~7
            host = device._pool.acquire(table_offset + 8 * count)
            view = host.view
            view[:nbytes] = packed.image
            if count:
                view[table_offset : table_offset + 8 * count] = packed.table
            if buffers:
                device._retain(buffers)
        except BaseException:
            device._unsettled -= 1
            self._release_slot()
            raise
        self._last = task = Task(device, self, "launch")
        pending = device._pending
        pending.append(
            Launch(self, task, host, buffers, func, blocks, cfg, nbytes, table_offset, count)
        )
        if len(pending) >= device._flush_at or not device._flush_scheduled:
            device._schedule_flush()
        return task

    async def copy_to_device(self, dst: DeviceBuffer, src: Any) -> Task:
        """Copy host data (an ndarray or bytes-like, C order) into ``dst`` on this stream.

        ``src`` is staged into a pinned buffer just before submission and kept referenced
        until the task completes: do not modify it until then.
        """
        device = self._device
        (dst_buf,) = device._device_buffers((dst,), field="copy_to_device dst")
        if isinstance(src, np.ndarray):
            count = src.nbytes
        else:
            try:
                count = memoryview(src).nbytes
            except TypeError:
                raise TypeError(
                    f"copy_to_device src must be an ndarray or bytes-like, got {type(src).__name__}"
                ) from None
        if count == 0:
            raise ValueError("copy_to_device: src is empty")
        if count > dst_buf.nbytes:
            raise ValueError(
                f"copy_to_device: src has {count} bytes, dst buffer only {dst_buf.nbytes}"
            )
        host = await self._admit_copy(count, dst_buf)
        task = Task(device, self, "copy_to_device")
        return self._enqueue(CopyToDevice(self, task, host, dst_buf, src, count))

    async def copy_to_host(self, dst: np.ndarray[Any, Any], src: DeviceBuffer) -> Task:
        """Copy ``dst.nbytes`` bytes of ``src`` into the writable, C-contiguous array ``dst``.

        ``dst`` is filled when the task completes (before ``await task`` returns).
        """
        device = self._device
        (src_buf,) = device._device_buffers((src,), field="copy_to_host src")
        if not isinstance(dst, np.ndarray):
            raise TypeError(f"copy_to_host dst must be an ndarray, got {type(dst).__name__}")
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError("copy_to_host dst must be a writable, C-contiguous ndarray")
        count = dst.nbytes
        if count == 0:
            raise ValueError("copy_to_host: dst is empty")
        if count > src_buf.nbytes:
            raise ValueError(
                f"copy_to_host: dst has {count} bytes, src buffer only {src_buf.nbytes}"
            )
        host = await self._admit_copy(count, src_buf)
        task = Task(device, self, "copy_to_host")
        return self._enqueue(CopyToHost(self, task, host, dst, src_buf, count))

    async def _admit_copy(self, count: int, buffer: DeviceBuffer) -> HostBuffer:
        # Admission, then the copy's pinned staging buffer and a use of its device buffer.
        await self._admit()
        device = self._device
        try:
            host = device._pool.acquire(count)
            device._retain((buffer,))
        except BaseException:
            device._unsettled -= 1
            self._release_slot()
            raise
        return host

    async def record_event(self, *, timing: bool = False) -> Event:
        """Record an :class:`Event` after the work queued so far on this stream."""
        device = self._device
        if not isinstance(timing, bool):
            raise TypeError("timing must be a bool")
        await self._admit()
        try:
            handle = device._take_event(_event_flags(timing))
        except BaseException:
            device._unsettled -= 1
            self._release_slot()
            raise
        task = Task(device, self, "record_event")
        event = Event(device, self, handle, timing, task)
        self._enqueue(RecordEvent(self, task, event))
        return event

    async def wait_event(self, event: Event) -> Task:
        """Make work queued on this stream after this call wait for ``event`` (on the device)."""
        device = self._device
        if not isinstance(event, Event):
            raise TypeError(f"wait_event() takes an Event, got {type(event).__name__}")
        if event._device is not device:
            raise ValueError("wait_event(): the event belongs to a different device")
        await self._admit()
        task = Task(device, self, "wait_event")
        return self._enqueue(WaitEvent(self, task, event))

    async def synchronize(self) -> None:
        """Wait until everything queued on this stream so far has finished.

        Raises the device's fault if it has one; failures of individual tasks are reported by
        their own ``Task``.
        """
        last = self._last
        if last is not None and not last.done():
            try:
                await last
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    raise
        self._device._raise_fault()

    async def aclose(self) -> None:
        """Wait for this stream's work, then destroy it. Idempotent."""
        if self._closed:
            return
        await self._drain()
        self._closed = True
        self._wake_admission_waiters()
        await self._device._close_stream(self)

    async def _drain(self) -> None:
        # Like synchronize(), but never raises a task's or the device's error.
        last = self._last
        if last is not None and not last.done():
            try:
                await last
            except Exception:
                pass

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
    def in_flight(self) -> int:
        """Requests admitted on this stream and not yet finished on the device."""
        return self._in_flight

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Stream {self.handle:#x} {state} in_flight={self._in_flight}/"
            f"{self.max_in_flight} waiting={len(self._admission)}>"
        )
