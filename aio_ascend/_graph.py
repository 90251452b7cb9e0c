"""``Graph``: device work captured once on a stream and replayed with one runtime call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ._closing_waits import ClosingWaits
from ._errors import TaskTimeoutError
from ._sched.graphs import GraphRecord, LaunchGraph
from ._unique import Unique

if TYPE_CHECKING:
    from ._sched.task import Task
    from ._stream_sync import StreamSync

__all__ = ["Graph"]


class Graph(Unique):
    """Device work recorded once (``async with stream.capture() as capture:``) and replayed
    with one runtime call: ``await stream.run_graph(graph)``, or ``task = await
    stream.launch_graph(graph)``, on any stream of the device, as often as wanted.

    Lifetimes: the graph keeps what its replays read until it is closed and its queued
    replays have finished: the pinned copies of the captured launches' arguments and
    placeholder data, the bytes of the captured host-to-device copies (every replay copies the
    bytes given at capture time), and the device buffers the captured work uses (their
    ``free()`` waits for the graph). A graph collected without :meth:`close` is closed then,
    with a ``ResourceWarning``, as a dropped ``DeviceBuffer`` is.

    Replays run one at a time: the device runs a graph's own queue from its head at each
    replay, and refuses to start it while a replay still runs (a device fault). Replays on one
    stream follow each other anyway; one queued on another stream than the last replay waits,
    in ``launch_graph``, until that replay has finished.

    :ivar device: the device
    :ivar operations: how many operations were captured
    """

    __slots__ = ("__weakref__", "_last", "_record", "_waits", "device", "operations")

    def __init__(
        self, device: object, record: GraphRecord, dropped: Callable[[GraphRecord], None]
    ) -> None:
        self.device = device
        self._record = record
        self.operations = len(record.ops)
        #: replays waiting for admission (close() turns them away)
        self._waits = ClosingWaits("the graph")
        self._last: Task | None = None  # the latest replay queued
        # collected unclosed (any thread): ``dropped`` closes it on the device's loop
        device._object_finalizers.finalize(self, dropped, record)  # type: ignore[attr-defined]  # noqa: SLF001

    @property
    def record(self) -> GraphRecord:
        """The scheduler's record of the graph (for the stream that replays it)."""
        return self._record

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (queued replays may still be running)."""
        return self._record.free_requested

    def close(self) -> None:
        """Destroy the graph now, or once its queued replays have finished; replays waiting
        for admission fail with ``ClosedError`` (nothing of them is queued). Idempotent."""
        self._record.registry.free(self._record)
        self._waits.turn_away()

    async def _replay(self, stream: StreamSync) -> Task:
        # One replay queued on ``stream`` (see the class docstring), with a slot of its own,
        # turned away if the graph closes meanwhile. The device refuses a replay that starts
        # while another runs: its model-execute program checks the graph's queue is idle
        # (hicann/runtime@681ef76 stars_cond_isa_helper.cc:221-626, via
        # model_execute_task_func_call.cc:171-238; seen over tests/realrt's driver).
        lane = stream._lane  # noqa: SLF001
        while True:
            last = self._last
            if _clear_for(last, lane):
                await self._waits.admit(stream, self._record)
                last = self._last  # (another replay may have been queued meanwhile)
                if _clear_for(last, lane):
                    break
                stream._scheduler.unadmit(lane)  # noqa: SLF001 - after that one, then
            assert last is not None
            if last.done():  # failed, yet the device may run it still (timed out, forced)
                raise TaskTimeoutError(
                    "launch_graph(): the graph's last replay, on another stream, did not "
                    "finish in time and may still run on the device: replay it on that stream "
                    "(after it), or once that stream is closed"
                )
            await self._waits.wait(last.wait_finished, self._record)
        queued = self._last = LaunchGraph(lane, self._record)
        try:
            return await stream._queued(queued)  # noqa: SLF001
        except anyio.get_cancelled_exc_class():
            raise  # (a cancel in torch's handshake comes once the replay is queued: it runs)
        except BaseException:
            if self._last is queued:  # (refused before it was queued: nobody waits for it)
                self._last = last
            raise

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"replays queued={self._record.uses}"
        return f"<Graph {self.operations} operations {state}>"


def _clear_for(last: Task | None, lane: object) -> bool:
    # Whether a replay on ``lane`` may be queued now: none before it, or the last one is on the
    # same stream (after it in stream order), or the device is done with it (its holdings
    # released: a replay failed by the watchdog keeps them while it may still run)
    return last is None or last.lane is lane or (last.done() and not last.buffers)
