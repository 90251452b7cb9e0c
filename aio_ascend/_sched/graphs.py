"""Graphs: device work recorded once on a stream (runtime capture) and replayed with one call.

A capture is one :class:`CaptureGraph` request: the submitter begins the runtime's capture on
the stream, submits the recorded operations (recorded, not run), and ends it, which gives the
graph handle. No batch event is ever recorded inside a capture: the whole capture is one
request, and the batch's completion event goes after it. A replay is one :class:`LaunchGraph`
request (one runtime task).

What the graph's replays read stays with the graph (:class:`GraphRecord`): the pinned host
buffers of the captured launches' args and placeholder data and of the captured host-to-device
copies (so every replay copies the bytes given at capture time), and the device allocations the
operations use. They are released when the graph is closed and no queued replay needs it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ClosedError
from .._host.hostargs import PackedArgs
from .._host.hostdata import write_bytes
from .._host.pool import HostBufferPool
from .._launch_config import LaunchConfig
from .compiled import interpreted
from .dropped import warn_resource
from .lifetimes import Allocation, Lifetimes
from .work import CopyDevice, CopyToDevice, Launch, LaunchSpec, Memset, Request

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .lane import Lane

__all__ = ["CaptureGraph", "GraphBook", "GraphRecord", "LaunchGraph"]


@interpreted
class GraphRecord(Allocation):
    """A captured graph, tracked like a device allocation: queued replays keep it in use, and
    closing it while replays are queued is deferred until they are done.

    :ivar handle: the runtime graph (0 until the capture has ended)
    :ivar ops: the recorded requests (what replays read: their host buffers and allocations)
    """

    __slots__ = ("_destroy_graph", "_forget", "handle", "ops")

    def __init__(self, registry: Lifetimes, ops: list[Request]) -> None:
        super().__init__(registry, 0, 0)
        self.handle = 0
        self.ops = ops
        self._destroy_graph: Callable[[int], None] | None = None
        self._forget: Callable[[GraphRecord], None] | None = None

    def bind_disposer(
        self, destroy_graph: Callable[[int], None], forget: Callable[[GraphRecord], None]
    ) -> None:
        """What retiring the record does: destroy the runtime graph, release what it held."""
        self._destroy_graph = destroy_graph
        self._forget = forget
        self.disposer = self._dispose

    def _dispose(self) -> None:
        if self._forget is not None:
            self._forget(self)
        handle, self.handle = self.handle, 0
        if handle and self._destroy_graph is not None:
            with contextlib.suppress(Exception):  # the device may have faulted or closed
                self._destroy_graph(handle)
        ops, self.ops = self.ops, []
        self.registry.release(ops)

    def dropped(self, device_id: int) -> None:
        """Its ``Graph`` was collected without ``close()`` (loop thread): warn, and close it as
        ``close()`` does (destroyed once its queued replays have finished). Nothing if it was
        closed, by the user or by the device's close."""
        if self.free_requested:
            return
        warn_resource(
            f"a Graph of {len(self.ops)} operation(s) on device {device_id} was "
            "garbage-collected without close(); it is destroyed once its queued replays "
            "have finished"
        )
        self.registry.free(self)


@interpreted
class CaptureGraph(Request):
    """Record ``graph.ops`` on the stream as a runtime graph (one request, no runtime task)."""

    __slots__ = ("graph",)
    kind = "capture"
    runtime_tasks = 0  # recorded work is not queued

    def __init__(self, lane: Lane, graph: GraphRecord) -> None:
        super().__init__(lane, None, (graph,))
        self.graph = graph

    def submit(self, runtime: Runtime, stream: int) -> None:
        runtime.begin_capture(stream)
        try:
            for op in self.graph.ops:
                if op.host is None and op.staged:
                    raise ValueError(f"captured {op.kind} has no staging buffer")
                op.submit(runtime, stream)
        except BaseException:
            with contextlib.suppress(Exception):
                runtime.destroy_graph(runtime.end_capture(stream))
            raise
        self.graph.handle = runtime.end_capture(stream)


@interpreted
class LaunchGraph(Request):
    """One replay of a graph on the stream (one runtime task); it keeps the graph in use."""

    __slots__ = ("graph",)
    kind = "launch_graph"

    def __init__(self, lane: Lane, graph: GraphRecord) -> None:
        super().__init__(lane, None, (graph,))
        self.graph = graph

    def submit(self, runtime: Runtime, stream: int) -> None:
        runtime.launch_graph(self.graph.handle, stream)


class GraphBook:
    """The graphs of one device: the recorded operations' builders, and the live graphs.

    :param destroy_graph: destroys a runtime graph (binds the calling thread's context itself)
    """

    def __init__(
        self, pool: HostBufferPool, lifetimes: Lifetimes, destroy_graph: Callable[[int], None]
    ) -> None:
        self._pool = pool
        self._lifetimes = lifetimes
        self._destroy_graph = destroy_graph
        self._lock = threading.Lock()
        self._live: set[GraphRecord] = set()
        #: the operations of capture blocks still recording, by id (the close releases them)
        self._recording: dict[int, list[Request]] = {}

    def __len__(self) -> int:
        return len(self._live)

    # --- recorded operations (loop thread; nothing is admitted or queued) ------------------

    def launch(
        self,
        lane: Lane,
        func: int,
        blocks: int,
        cfg: LaunchConfig | None,
        packed: PackedArgs,
        allocations: tuple[Allocation, ...],
        kernel: str | None = None,
    ) -> Launch:
        """A launch to record: its args snapshotted, its buffers retained (by the graph)."""
        spec = LaunchSpec(func, blocks, cfg, packed, None, allocations, once=True, kernel=kernel)
        request = Launch(lane, spec)
        request.stage(self._pool)
        self._lifetimes.retain(allocations)
        return request

    def copy_to_device(
        self, lane: Lane, dst: Allocation, root: Allocation, src: Any, count: int
    ) -> CopyToDevice:
        """A host-to-device copy to record; the bytes of ``src`` are staged now, and every
        replay copies those."""
        host = self._pool.acquire(count)
        write_bytes(np.frombuffer(host.view, np.uint8, count), src)
        self._lifetimes.retain((root,))
        request = CopyToDevice(lane, host, dst, root, src, count)
        request.src = np.frombuffer(host.view, np.uint8, count)  # restaging copies the same
        return request

    def copy_device(
        self,
        lane: Lane,
        dst: Allocation,
        src: Allocation,
        roots: tuple[Allocation, Allocation],
        count: int,
    ) -> CopyDevice:
        self._lifetimes.retain(roots)
        return CopyDevice(lane, dst, src, count, roots)

    def memset(
        self, lane: Lane, dst: Allocation, root: Allocation, value: int, count: int
    ) -> Memset:
        self._lifetimes.retain((root,))
        return Memset(lane, dst, root, value, count)

    # --- graphs ----------------------------------------------------------------------------

    def new(self, ops: list[Request]) -> GraphRecord:
        """A graph record for ``ops`` (live until closed or the device closes)."""
        record = GraphRecord(self._lifetimes, ops)
        record.bind_disposer(self._destroy_graph, self._forget)
        with self._lock:
            self._live.add(record)
        return record

    def begin(self, ops: list[Request]) -> None:
        """A capture block records into ``ops``: what they hold is released by the device's
        close if the block is still recording then."""
        with self._lock:
            self._recording[id(ops)] = ops

    def end(self, ops: list[Request], *, keep: bool) -> bool:
        """The block recording ``ops`` is left: True if they are to become a graph (``keep``);
        else what they hold is released now (left by an exception).

        :raises ClosedError: ``keep``, but the device's close has released them meanwhile
        """
        with self._lock:
            recording = self._recording.pop(id(ops), None) is not None
        if not recording:  # the device's close released them
            if keep:
                raise ClosedError("the device was closed while the capture block recorded")
            return False
        if not keep:
            self._lifetimes.release(ops)
        return keep

    def _forget(self, record: GraphRecord) -> None:
        with self._lock:
            self._live.discard(record)

    def close_all(self) -> None:
        """The device is closing (its streams are gone): destroy every graph left."""
        with self._lock:
            live, self._live = list(self._live), set()
            recording, self._recording = list(self._recording.values()), {}
        for ops in recording:  # blocks still recording: they never become graphs
            self._lifetimes.release(ops)
            ops.clear()
        for record in live:
            record.released = record.free_requested = True
            if record.disposer is not None:
                record.disposer()
