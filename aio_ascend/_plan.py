"""``LaunchPlan``: one kernel launch checked, packed and pinned once, queued again and again."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._closing_waits import ClosingWaits
from ._errors import ClosedError
from ._host.snapshot import shareable, shared_image
from ._sched.plans import PlanRecord
from ._sched.task import Task
from ._sched.work import Launch, LaunchSpec
from ._unique import Unique

if TYPE_CHECKING:
    from types import TracebackType

    from ._host.hostargs import PackedArgs
    from ._launch_config import LaunchConfig
    from ._module import Function
    from ._sched.lane import Lane
    from ._sched.lifetimes import Allocation
    from ._sched.scheduler import Scheduler
    from ._stream_sync import StreamSync

__all__ = ["LaunchPlan"]


class LaunchPlan(Unique):
    """A kernel launch prepared once on a stream (``stream.plan(fn, blocks, args)``) and
    queued as often as wanted with ``await plan.launch()`` (its :class:`Task`) or ``await
    plan.run()`` (and wait)::

        async with stream.plan(fn, 8, HostArgs().ptr(buf).u32(n)) as plan:
            for _ in range(1000):
                await plan.launch()
        await stream.synchronize()

    The arguments are checked, packed and copied into pinned memory when the plan is made;
    a launch only checks what can change: the stream and device are open, the device has
    not faulted, the call comes from the device's event loop. Launches without placeholders
    all read that one pinned image (a kernel's hidden arguments included: they are laid in
    when the args are packed); with placeholders each gets its own copy of it, since the
    runtime writes their device addresses into the args buffer during the launch.

    Lifetimes: the plan keeps the device buffers its args point to, as a ``Graph`` does:
    their ``free()`` waits until the plan is closed and its queued launches have finished.
    Close it (:meth:`close`, or ``async with``); a plan left open holds them until the device
    closes.

    :ivar stream: the stream it launches on
    :ivar function: the kernel
    :ivar blocks: the number of blocks
    """

    __slots__ = (
        "__weakref__",
        "_lane",
        "_record",
        "_ref",
        "_scheduler",
        "_spec",
        "_waits",
        "blocks",
        "function",
        "stream",
    )

    def __init__(
        self,
        stream: Any,
        stream_ref: Callable[[], Any],
        scheduler: Scheduler,
        lane: Lane,
        fn: Function,
        blocks: int,
        cfg: LaunchConfig | None,
        packed: PackedArgs,
        buffers: tuple[Allocation, ...],
    ) -> None:
        self.stream = stream
        self.function = fn
        self.blocks = blocks
        self._scheduler = scheduler
        self._lane = lane
        self._ref = stream_ref
        host = shared_image(scheduler.pool, packed) if shareable(packed) else None
        self._record = PlanRecord(scheduler.lifetimes, scheduler.pool, host, buffers)
        # every launch holds the plan's record (one tuple for all of them)
        self._spec = LaunchSpec(
            fn.handle, blocks, cfg, packed, host, (self._record,), kernel=fn.name
        )
        self._record.spec = self._spec
        #: the launches waiting for admission (close() turns them away)
        self._waits = ClosingWaits("the launch plan")
        # Dropped without close(): released as close() would, on the loop (collection may
        # happen on any thread; frees belong to the loop's)
        stream.device._object_finalizers.finalize(self, scheduler.drop_record, self._record)  # noqa: SLF001

    async def launch(self) -> Task:
        """Queue the launch on the plan's stream; return its :class:`Task`.

        :raises ClosedError: the plan, the stream or the device is closed
        :raises DeviceFaultError: the device has faulted (cause: the first fault)
        :raises RuntimeError: called from another thread or event loop than the device's
        """
        record = self._record
        if record.free_requested:
            raise ClosedError("the launch plan is closed")
        scheduler = self._scheduler
        lane = self._lane
        stream: StreamSync = self.stream
        # The stream's own admission (a plan is part of its stream's facade): after a pending
        # host function, with an external torch stream's queue drained first.
        if not (stream._plain and scheduler.try_admit(lane)):  # noqa: SLF001
            await self._waits.admit(stream, record)
        if stream._order is None:  # noqa: SLF001 - no torch handshake to wait for
            return scheduler.enqueue(Launch(lane, self._spec))
        return await stream._queued(Launch(lane, self._spec))  # noqa: SLF001

    async def run(self) -> None:
        """:meth:`launch` and wait until the kernel has finished (cancelled after the launch
        was admitted, only the wait is cancelled: see :class:`Task`)."""
        await (await self.launch())

    def close(self) -> None:
        """Launch no more: launches waiting for admission fail with ``ClosedError`` (nothing
        of them is queued), and what the plan holds is released once its queued launches have
        finished (then the buffers' deferred frees proceed). Idempotent."""
        record = self._record
        record.registry.free(record)
        self._waits.turn_away()

    @property
    def closed(self) -> bool:
        """Whether the plan can launch no more: :meth:`close` has been called, or its stream
        or device is closed, as ``stream.closed`` says (queued launches may still be running)."""
        return self._record.free_requested or self._lane.closed

    async def __aenter__(self) -> LaunchPlan:
        if self._record.free_requested:
            raise ClosedError("the launch plan is closed")
        self._scheduler.check_usable(self._lane)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<LaunchPlan {self.function.name!r} blocks={self.blocks} {state}>"
