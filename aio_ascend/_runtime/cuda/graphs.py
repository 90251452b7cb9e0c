"""Stream capture and graph replay on the ``cuda`` backend (the seam's four graph calls).

- ``begin_capture``: ``cuStreamBeginCapture(hStream, CU_STREAM_CAPTURE_MODE_RELAXED)``. Relaxed,
  because the rest of the library keeps working while a capture is open: the poller thread
  queries the events of other streams, and memory is allocated (by users, and for a captured
  launch's placeholder data); the global and thread-local modes make such calls illegal.
- ``end_capture``: ``cuStreamEndCapture``, then ``cuGraphInstantiateWithFlags(hGraph, 0)``.
  The handle returned names the backend's own record (graph, executable graph, and the
  capture's staging memory), not a CUDA handle, so a destroyed graph's handle never aliases a
  later one and a replay of it is refused before CUDA sees it (as for every other handle).
- ``launch_graph``: ``cuGraphLaunch`` (CUDA runs the launches of one executable graph one at a
  time, in launch order, whichever their streams).
- ``destroy_graph``: ``cuGraphExecDestroy``, ``cuGraphDestroy``, and ``cuMemFree`` of the
  capture's staging memory.

On a capturing stream these are refused with ``InvalidParamError`` (107000) before CUDA sees
them: event records and waits (CUDA would turn them into capture dependencies), syncs and
pageable copies (they would invalidate the capture), a second ``begin_capture``, a graph launch.
``end_capture`` on a stream that is not capturing is refused the same way. A stream destroyed
while capturing has its capture ended and discarded first; ``close`` does the same, and destroys
the graphs left.

Placeholders: outside a capture, a launch's args image goes to the stream's staging ring, whose
slots are reused once fenced. A captured copy into a ring slot would be replayed later into a
slot that other launches use meanwhile, so on a capturing stream the image is staged in memory
of the capture's own (:class:`~.staging.CaptureStaging`, ``cuMemAlloc``), which the graph owns
and ``destroy_graph`` frees (or ``end_capture``, when the capture fails). CUDA copies the kernel
parameters (the ``extra`` buffer) at capture time; the captured host-to-device copy of the
image reads the caller's pinned buffer at every replay (it must be ``malloc_host`` memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ..abi import ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE
from ..staging import CaptureStaging, staging_alignment
from .core import CudaCore, CudaFunction, CudaGraph, CudaStream
from .launch import apply_patches, placeholder_patches

__all__ = ["GRAPH_HANDLE_BASE", "CudaGraphs"]

#: the first graph handle a runtime gives (then counting up; never reused)
GRAPH_HANDLE_BASE = 0x6A0001


def _as_int(handle: Any) -> int:
    return 0 if handle is None else int(handle)


class CudaGraphs(CudaCore):
    """The graph calls of :class:`~.runtime.CudaRuntime` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._graph_ids = itertools.count(GRAPH_HANDLE_BASE)

    # --- refusals on a capturing stream (called by the runtime before the driver) --------

    def _check_capture_copy(
        self, s: CudaStream, dst: int, src: int, count: int, kind: int, func: str
    ) -> None:
        """A copy on a capturing stream must have its host side in pinned memory."""
        if s.capture is None or not count:
            return
        if kind == ACL_MEMCPY_HOST_TO_DEVICE:
            host = src
        elif kind == ACL_MEMCPY_DEVICE_TO_HOST:
            host = dst
        else:
            return
        if not self.is_pinned(host, count):
            raise self._param(
                func,
                f"stream {s.handle:#x} is capturing: a copy from or to pageable host memory "
                "cannot be captured (use malloc_host memory)",
            )

    # --- captured launches with placeholders --------------------------------------------

    def _launch_captured(
        self,
        f: CudaFunction,
        num_blocks: int,
        block: int,
        s: CudaStream,
        args_addr: int,
        args_size: int,
        param_size: int,
        entries: list[tuple[int, int]],
    ) -> None:
        """A launch with placeholders on a capturing stream: its args image is staged in the
        capture's own device memory (the runtime's ``_launch_staged`` uses the ring)."""
        name = "cuLaunchKernel"
        if not self.is_pinned(args_addr, args_size):
            raise self._param(
                name,
                "a captured launch with placeholders needs its args in pinned memory "
                "(malloc_host): every replay copies them to the device",
            )
        with s.lock:
            staging = s.capture
            if staging is None:
                raise self._param(name, f"stream {s.handle:#x} is not capturing")
            region = staging.allocate(args_size, staging_alignment(entries))
            apply_patches(args_addr, placeholder_patches(entries, region))
            (err,) = self._cuMemcpyHtoDAsync(region, args_addr, args_size, s.cu)
            if int(err):
                self._raise(int(err), "cuMemcpyHtoDAsync")
            extra = self._tls.extra.set(args_addr, param_size) if param_size else 0
            (err,) = self._cuLaunchKernel(f.cu, num_blocks, 1, 1, block, 1, 1, 0, s.cu, None, extra)
            if int(err):
                self._raise(int(err), name)

    def _capture_alloc(self, nbytes: int) -> int:
        return self.device_alloc(nbytes, "cuMemAlloc")

    def _free_blocks(self, blocks: list[int]) -> None:
        for block in blocks:
            self.device_free_quietly(block)
        blocks.clear()

    # --- the seam ------------------------------------------------------------------------

    def _device_begin_capture(self, s: CudaStream, func: str) -> None:
        # relaxed mode (module docstring)
        with s.lock:
            mode = self._d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            (err,) = self._d.cuStreamBeginCapture(s.cu, mode)
            if int(err):
                self._raise(int(err), func)
            s.capture = CaptureStaging(self._capture_alloc)

    def _device_end_capture(self, s: CudaStream, func: str) -> CudaGraph:
        # cuStreamEndCapture + cuGraphInstantiateWithFlags(hGraph, 0); if either fails, what
        # the capture holds is released
        with s.lock:
            staging = s.capture
            if staging is None:
                raise self._param(func, f"stream {s.handle:#x} is not capturing")
            s.capture = None
            err, graph = self._d.cuStreamEndCapture(s.cu)
        blocks = staging.blocks
        if int(err):
            if _as_int(graph):
                self._d.cuGraphDestroy(graph)
            self._free_blocks(blocks)
            self._raise(int(err), func)
        err, graph_exec = self._d.cuGraphInstantiateWithFlags(graph, 0)
        if int(err):
            self._d.cuGraphDestroy(graph)
            self._free_blocks(blocks)
            self._raise(int(err), "cuGraphInstantiateWithFlags")
        return CudaGraph(next(self._graph_ids), graph, graph_exec, blocks)

    def _device_launch_graph(self, g: CudaGraph, s: CudaStream, func: str) -> None:
        (err,) = self._d.cuGraphLaunch(g.exec, s.cu)
        if int(err):
            self._raise(int(err), func)

    def _device_destroy_graph(self, g: CudaGraph, func: str) -> None:
        # cuGraphExecDestroy + cuGraphDestroy, and the capture's staging memory
        (err_exec,) = self._d.cuGraphExecDestroy(g.exec)
        (err_graph,) = self._d.cuGraphDestroy(g.graph)
        self._free_blocks(g.blocks)
        if self._fault is None:
            for err, name in ((err_exec, func), (err_graph, "cuGraphDestroy")):
                if int(err):
                    self._raise(int(err), name)

    # --- streams going away -------------------------------------------------------------

    def _abort_capture(self, s: CudaStream) -> None:
        """End a capture still open on ``s`` (about to be destroyed) and discard its graph."""
        with s.lock:
            staging, s.capture = s.capture, None
        if staging is None:
            return
        err, graph = self._d.cuStreamEndCapture(s.cu)
        if not int(err) and _as_int(graph):
            self._d.cuGraphDestroy(graph)
        self._free_blocks(staging.blocks)

    def _close_graphs(self, attempt: Callable[..., Any]) -> None:
        for s in list(self._streams.values()):
            staging, s.capture = s.capture, None
            if staging is None:
                continue
            result = attempt("cuStreamEndCapture", s.cu)
            if result is not None and not int(result[0]) and _as_int(result[1]):
                attempt("cuGraphDestroy", result[1])
            self._graveyard.extend(staging.blocks)
        graphs = list(self._graphs.values())
        self._graphs.clear()
        for g in graphs:
            attempt("cuGraphExecDestroy", g.exec)
            attempt("cuGraphDestroy", g.graph)
            self._graveyard.extend(g.blocks)
