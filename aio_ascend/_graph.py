"""``Graph``: device work captured once on a stream and replayed with one runtime call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._closing_waits import ClosingWaits
from ._sched.graphs import GraphRecord
from ._unique import Unique

if TYPE_CHECKING:
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

    :ivar device: the device
    :ivar operations: how many operations were captured
    """

    __slots__ = ("__weakref__", "_record", "_waits", "device", "operations")

    def __init__(
        self, device: object, record: GraphRecord, dropped: Callable[[GraphRecord], None]
    ) -> None:
        self.device = device
        self._record = record
        self.operations = len(record.ops)
        #: replays waiting for admission (close() turns them away)
        self._waits = ClosingWaits("the graph")
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

    async def _admit_replay(self, stream: StreamSync) -> None:
        # a slot of ``stream`` for one replay, turned away if the graph closes meanwhile
        await self._waits.admit(stream, self._record)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"replays queued={self._record.uses}"
        return f"<Graph {self.operations} operations {state}>"
