"""Stream capture and graph replay on the ``cuda`` backend (the seam's four graph calls).

- ``begin_capture``: ``cuStreamBeginCapture(hStream, CU_STREAM_CAPTURE_MODE_RELAXED)``. Relaxed,
  because the rest of the library keeps working while a capture is open: the poller thread
  queries the events of other streams, and memory is allocated (by users, and for a captured
  launch's placeholder data); the global and thread-local modes make such calls illegal.
- ``end_capture``: ``cuStreamEndCapture``, then ``cuGraphInstantiate(hGraph, 0)``.
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

__all__ = ["GRAPH_HANDLE_BASE", "CudaCapture"]

#: the first graph handle a runtime gives (then counting up; never reused)
GRAPH_HANDLE_BASE = 0x6A0001


def _as_int(handle: Any) -> int:
    return 0 if handle is None else int(handle)


class CudaCapture:
    """The capture side of one :class:`~.runtime.CudaRuntime`, which owns it and forwards the
    device part of the seam's graph calls to it (see the module docstring)."""

    def __init__(self, runtime: CudaCore) -> None:
        self._runtime = runtime
        self._driver = runtime.driver
        self._ids = itertools.count(GRAPH_HANDLE_BASE)

    # --- what a capturing stream refuses (asked by the runtime before the driver) --------

    def check_copy(
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
        if not self._runtime.is_pinned(host, count):
            raise self._runtime.refusal(
                func,
                f"stream {s.handle:#x} is capturing: a copy from or to pageable host memory "
                "cannot be captured (use malloc_host memory)",
            )

    def launch(
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
        capture's own device memory (outside a capture it goes to the stream's ring)."""
        runtime = self._runtime
        name = "cuLaunchKernel"
        if not runtime.is_pinned(args_addr, args_size):
            raise runtime.refusal(
                name,
                "a captured launch with placeholders needs its args in pinned memory "
                "(malloc_host): every replay copies them to the device",
            )
        with s.lock:
            staging = s.capture
            if staging is None:
                raise runtime.refusal(name, f"stream {s.handle:#x} is not capturing")
            region = staging.allocate(args_size, staging_alignment(entries))
            runtime.launch_image(
                f, num_blocks, block, s, region, args_addr, args_size, param_size, entries
            )

    def _free_blocks(self, blocks: list[int]) -> None:
        for block in blocks:
            self._runtime.device_free_quietly(block)
        blocks.clear()

    # --- the device part of the seam's four calls ---------------------------------------

    def begin(self, s: CudaStream, func: str) -> None:
        """``cuStreamBeginCapture`` in relaxed mode."""
        d = self._driver
        with s.lock:
            (err,) = d.cuStreamBeginCapture(
                s.cu, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            )
            if int(err):
                self._runtime.fail(int(err), func)
            s.capture = CaptureStaging(
                lambda nbytes: self._runtime.device_alloc(nbytes, "cuMemAlloc")
            )

    def end(self, s: CudaStream, func: str) -> CudaGraph:
        """``cuStreamEndCapture`` + ``cuGraphInstantiate(hGraph, 0)``; if either
        fails, what the capture holds is released."""
        d = self._driver
        with s.lock:
            staging = s.capture
            if staging is None:
                raise self._runtime.refusal(func, f"stream {s.handle:#x} is not capturing")
            s.capture = None
            err, graph = d.cuStreamEndCapture(s.cu)
        blocks = staging.blocks
        if int(err):
            if _as_int(graph):
                d.cuGraphDestroy(graph)
            self._free_blocks(blocks)
            self._runtime.fail(int(err), func)
        err, graph_exec = d.cuGraphInstantiate(graph, 0)
        if int(err):
            d.cuGraphDestroy(graph)
            self._free_blocks(blocks)
            self._runtime.fail(int(err), "cuGraphInstantiate")
        return CudaGraph(next(self._ids), graph, graph_exec, blocks)

    def replay(self, g: CudaGraph, s: CudaStream, func: str) -> None:
        """``cuGraphLaunch``."""
        (err,) = self._driver.cuGraphLaunch(g.exec, s.cu)
        if int(err):
            self._runtime.fail(int(err), func)

    def destroy(self, g: CudaGraph, func: str, *, faulted: bool) -> None:
        """``cuGraphExecDestroy`` + ``cuGraphDestroy``, and the capture's staging memory."""
        (err_exec,) = self._driver.cuGraphExecDestroy(g.exec)
        (err_graph,) = self._driver.cuGraphDestroy(g.graph)
        self._free_blocks(g.blocks)
        if not faulted:
            for err, name in ((err_exec, func), (err_graph, "cuGraphDestroy")):
                if int(err):
                    self._runtime.fail(int(err), name)

    # --- streams going away -------------------------------------------------------------

    def abort(self, s: CudaStream) -> None:
        """End a capture still open on ``s`` (about to be destroyed) and discard its graph."""
        with s.lock:
            staging, s.capture = s.capture, None
        if staging is None:
            return
        err, graph = self._driver.cuStreamEndCapture(s.cu)
        if not int(err) and _as_int(graph):
            self._driver.cuGraphDestroy(graph)
        self._free_blocks(staging.blocks)

    def close(
        self,
        attempt: Callable[..., Any],
        streams: list[CudaStream],
        graphs: list[CudaGraph],
        graveyard: list[int],
    ) -> None:
        """At the runtime's close: end open captures, destroy the graphs, and leave their
        staging memory in ``graveyard`` (``attempt(func, *args)`` calls the driver, collecting
        errors)."""
        for s in streams:
            staging, s.capture = s.capture, None
            if staging is None:
                continue
            result = attempt("cuStreamEndCapture", s.cu)
            if result is not None and not int(result[0]) and _as_int(result[1]):
                attempt("cuGraphDestroy", result[1])
            graveyard.extend(staging.blocks)
        for g in graphs:
            attempt("cuGraphExecDestroy", g.exec)
            attempt("cuGraphDestroy", g.graph)
            graveyard.extend(g.blocks)
