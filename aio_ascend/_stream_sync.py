"""What a stream offers beyond queueing work: waiting for another stream, asking whether it
is idle, host functions in stream order, and the admission every operation goes through (a
host function holds later work; an external torch stream does its handshake)."""

from __future__ import annotations

import contextlib
import inspect
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from ._buffer import DeviceBuffer, byte_range
from ._hostfunc import ASYNC_FN, host_funcs
from ._sched.task import HostFunctionTask, Task
from ._unique import Unique

if TYPE_CHECKING:
    import numpy.typing as npt

    from ._event import Event
    from ._interop import ExternalEvent, TorchOrder
    from ._sched.lane import Lane
    from ._sched.scheduler import Scheduler
    from ._sched.work import Request

__all__ = ["HeldCalls", "StreamSync"]


def check_src_stream(src: DeviceBuffer, src_stream: object) -> StreamSync | None:
    """``copy_device``'s ``src_stream``: None, or a stream of ``src``'s device."""
    if src_stream is None:
        return None
    if not isinstance(src_stream, StreamSync):
        raise TypeError(f"src_stream must be a Stream, got {type(src_stream).__name__}")
    if src_stream._scheduler.lifetimes is not src.registry:  # noqa: SLF001
        raise ValueError(
            f"copy_device: src_stream {src_stream!r} is a stream of another device than src's "
            f"({src!r}); pass one of src's device"
        )
    return src_stream


class StreamSync(Unique):
    """The base of :class:`~aio_ascend.Stream` that holds these operations."""

    device: object
    _scheduler: Scheduler
    _lane: Lane
    _ref: Callable[[], object]
    #: the handshake with the framework owning this (external) stream, if any
    _order: TorchOrder | None
    #: the latest host function: later operations wait until it has returned
    _hold: HostFunctionTask | None
    #: the calls waiting behind it, in order
    _line: HeldCalls
    #: neither of them: an operation may take the fast path of admission
    _plain: bool

    if TYPE_CHECKING:

        async def record_event(self, *, timing: bool = False) -> Event: ...

        async def wait_event(self, event: Event | ExternalEvent) -> Task: ...

        async def _fence(
            self,
            timing: bool = False,
            drain: bool = False,
            handover: bool = False,
            quiet: bool = False,
        ) -> Event: ...

        async def copy_to_device(self, dst: DeviceBuffer, src: Any) -> Task: ...

        async def download(
            self,
            src: DeviceBuffer,
            dtype: npt.DTypeLike | None = None,
            shape: int | tuple[int, ...] | None = None,
            *,
            out: Any = None,
        ) -> Any: ...

    async def wait_stream(self, other: StreamSync) -> Task:
        """Make work queued on this stream after this call wait (on the device) for the work
        queued on ``other`` so far: an event recorded on ``other``, waited for here. Returns
        the wait's Task (done once this stream is past it).

        Cancelled between the two steps, the event is recorded and nothing waits for it.

        :raises ValueError: ``other`` is this stream, or a stream of another device
        """
        if not isinstance(other, StreamSync):
            raise TypeError(f"wait_stream() takes a Stream, got {type(other).__name__}")
        if other is self:
            raise ValueError("wait_stream(): a stream's work is always ordered after its own")
        if other.device is not self.device:
            raise ValueError(
                "wait_stream(): the streams belong to different devices (an event of one "
                "device cannot be waited for on another: await other.synchronize() instead)"
            )
        self._scheduler.check_usable(self._lane)
        # The record is ours, not the caller's (quiet): its failure reaches them through the
        # wait's Task (and the other stream's own work), never as an error of its own.
        event = await other._fence(drain=True, handover=True, quiet=True)
        return await self.wait_event(event)

    def query(self) -> bool:
        """Whether everything queued on this stream so far has finished (successfully or not),
        without waiting: ``False`` while any of it is queued, submitted or running, or
        finished on the device but not yet observed by the library. A closed stream whose
        work is done answers ``True``.

        :raises RuntimeError: called from another thread than the device's event loop's
        """
        self._scheduler.adapter.check_thread()
        lane = self._lane
        last = lane.last  # (None once it failed: its elders may still run, as slots say)
        return (last is None or last.done()) and not lane.admission.live()

    async def launch_host_func(self, fn: Callable[[], object]) -> Task:
        """Run ``fn()`` on a library thread once the work queued on this stream so far has
        finished; return its :class:`Task` (done when ``fn`` has returned; an exception from
        ``fn`` fails the Task, never the stream or the device).

        Later operations on this stream wait until ``fn`` has returned (their calls wait, as
        on a full stream), so work queued after the host function runs after it; other
        streams carry on. ``fn`` runs on the device's host-function thread
        (``aio_ascend-hostfunc-<id>``), one at a time per device: it must not block on this
        event loop, and should not call the device (use the loop for that). If the earlier
        work fails, ``fn`` does not run and the Task fails with an error caused by that
        failure. An ``fn`` still running after the device's ``task_timeout`` fails its Task
        with ``TaskTimeoutError``, as the watchdog fails device work, and so does one running
        when its stream's ``aclose(timeout=...)`` gives up; it cannot be interrupted, so the
        stream's later work still waits until it returns. Emulated on every backend (an
        event, then the thread); the device's close waits for a running ``fn`` (up to
        ``aclose``'s timeout, else ``task_timeout``). On a stream of torch_npu's, torch's own
        later ops are not held by it.

        :raises TypeError: ``fn`` is not callable, or is a coroutine function (an async
            callable's coroutine fails the Task with ``TypeError`` when it is called)
        """
        if not callable(fn):
            raise TypeError(f"launch_host_func() takes a callable, got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(ASYNC_FN)
        scheduler = self._scheduler
        scheduler.check_usable(self._lane)
        # The fence without the torch handshake: the hold must be in place before this call
        # awaits anything after queueing the record (else later work overtakes it); torch's
        # own later ops are not held by a host function (they reach the runtime stream
        # directly), so there is nothing to hand over.
        # (quiet: its failure reaches the caller as the host function's, caused by it)
        recorded = await self._fence(drain=True, quiet=True)
        task = HostFunctionTask(self._lane)
        # (no await from the record's admission to here: nothing else is queued in between)
        self._hold = task
        self._plain = False
        self._lane.hold_for(task)
        device = self.device
        runner = host_funcs(device, scheduler.device_id, scheduler.adapter, scheduler.task_timeout)
        runner.start(recorded, task, fn)
        return task

    async def _copy_from_peer(
        self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int | None, src_stream: object
    ) -> Task:
        # copy_device from another device's buffer: read there (on src_stream, in its order)
        # into host memory, then write here. The runtimes' peer copies are not used: the sim,
        # the acl double and the cuda fake have no peers to test them on.
        # Everything is checked before the read is queued there: nothing of a refused call runs
        there = check_src_stream(src, src_stream)
        if there is None:
            raise ValueError(
                "copy_device: src belongs to another device; pass src_stream=, a stream of "
                "that device (the read is queued on it, after its work)"
            )
        self._scheduler.check_usable(self._lane)
        _, _, count = byte_range(src, src.registry, "copy_device src", nbytes)
        byte_range(dst, self._scheduler.lifetimes, "copy_device dst", count)
        host = np.empty(count, np.uint8)
        await there.download(src if count == src.nbytes else src[:count], out=host)
        return await self.copy_to_device(dst, host)

    async def _queued(self, request: Request) -> Task:
        # Queue an admitted request: on a stream shared with torch, return once it has been
        # handed to the runtime (the handshake's second half)
        if self._order is None:
            return self._scheduler.enqueue(request)
        return await self._order.queue(request, self._scheduler)

    def _held(self) -> bool:
        """Whether a call must wait in line: a host function has not returned, or others wait."""
        hold = self._hold
        return bool(self._line) or (hold is not None and not hold.returned.is_set())

    async def _admit(self, drain: bool = True) -> None:
        # Behind a host function, calls wait in line: see HeldCalls
        if not self._held():
            await self._admit_now(drain)
            return
        self._plain = False
        line = self._line
        turn = None
        try:
            turn = await line.join()  # (cancelled: it left the line itself)
            await self._admit_now(drain)
        finally:
            if turn is not None:
                line.leave(turn)
            if not self._held():
                self._plain = self._order is None  # (whoever empties the line)

    async def _admit_now(self, drain: bool) -> None:
        scheduler = self._scheduler
        lane = self._lane
        while True:
            hold = self._hold
            if hold is not None:
                if not hold.returned.is_set():  # a host function: later work starts after it
                    await hold.returned.wait()
                    if scheduler.faults.first is not None:  # (waiting, as for admission:
                        raise scheduler.fault_error()  # the fault's error, even at a close)
                    continue
                self._hold = None
                self._plain = self._order is None and not self._line
            if drain and self._order is not None:
                self._order.before()
            if not scheduler.try_admit(lane):
                await scheduler.admit(lane)
            if self._hold is None or self._hold.returned.is_set():
                return
            # a host function was queued while this call waited for admission: after it
            scheduler.unadmit(lane)


class HeldCalls:
    """The calls waiting behind a stream's host function, served in the order they came.

    A host function holds its stream's later operations until it has returned: their calls
    wait. Woken together when it returns, they would race for the stream, and the order they
    run in is the event loop's (trio's is random): a caller queueing host functions again and
    again could overtake another for good. So they wait in line: only the first waits for the
    host function, and each passes the turn on once its own operation is admitted (or it gave
    up: cancelled, refused). While anyone is in line, a newcomer joins its end, even if the
    host function has returned (loop thread only).
    """

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: deque[anyio.Event] = deque()

    def __bool__(self) -> bool:
        return bool(self._turns)

    async def join(self) -> anyio.Event:
        """Wait until the caller is first in line; its turn, to :meth:`leave` with."""
        turn = anyio.Event()
        self._turns.append(turn)
        if self._turns[0] is not turn:
            try:
                await turn.wait()
            except BaseException:  # (cancelled: set or not, the turn passes on)
                self.leave(turn)
                raise
        return turn

    def leave(self, turn: anyio.Event) -> None:
        """Leave the line: the next caller's turn, if ``turn`` was the first."""
        turns = self._turns
        if turns and turns[0] is turn:
            turns.popleft()
            if turns:
                turns[0].set()
        else:
            with contextlib.suppress(ValueError):
                turns.remove(turn)
