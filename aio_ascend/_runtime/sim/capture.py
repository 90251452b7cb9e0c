"""The sim's graph capture (``aclmdlRICapture*`` modelled) and ``aclrtMemsetAsync``.

A mixin of :class:`~.runtime.SimRuntime` over the device executor: a capturing stream records
the tasks submitted to it instead of queueing them; a replay is one task that runs the recorded
list in order (``DeviceExecutor._run_graph``).
"""

from __future__ import annotations

from ..abi import hex_or_repr as _hex
from .executor import (
    GRAPH,
    GRAPH_HANDLE,
    MEMSET,
    DeviceExecutor,
    SimGraph,
    SimStream,
    new_handle,
)
from .memory import is_device_address

__all__ = ["CaptureAndFill"]


class CaptureAndFill(DeviceExecutor):
    """Graph capture and replay, and memset, of the simulated runtime."""

    def memset_async(self, ptr: int, dst_max: int, value: int, count: int, stream: int) -> None:
        """``aclrtMemsetAsync``: queue setting ``count`` bytes at ``ptr`` to ``value``'s low byte.

        The range is checked when the task executes (outside a live allocation: a device
        fault), as for device-to-device copies.
        """
        func = "aclrtMemsetAsync"
        self._check_live(func)
        s = self._stream(stream, func)
        for name, number in (("maxCount", dst_max), ("count", count), ("devPtr", ptr)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise self._param(func, f"{name}={number!r} is not a valid size or address")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._param(func, f"value={value!r} is not an int")
        if count > dst_max:
            raise self._param(func, f"count={count} > maxCount={dst_max}")
        if not is_device_address(ptr):
            raise self._param(func, f"devPtr={_hex(ptr)} is not a device address")
        self._enqueue(s, (MEMSET, ptr, value & 0xFF, count), func)

    # --- graphs (model-RI capture) --------------------------------------------------------

    def _not_capturing(self, s: SimStream, func: str) -> None:
        if s.capture is not None:
            raise self._param(func, "the stream is capturing: the operation cannot be captured")

    def begin_capture(self, stream: int) -> None:
        """``aclmdlRICaptureBegin`` (thread-local mode): work submitted to ``stream`` from now
        on is recorded, not run, until :meth:`end_capture`."""
        func = "aclmdlRICaptureBegin"
        self._check_live(func)
        s = self._stream(stream, func)
        with self._lock:
            if s.capture is not None:
                raise self._param(func, "the stream is already capturing")
            s.capture = []

    def end_capture(self, stream: int) -> int:
        """``aclmdlRICaptureEnd``: the recorded work as a graph handle."""
        func = "aclmdlRICaptureEnd"
        self._check(func)
        s = self._stream(stream, func)
        with self._lock:
            if s.capture is None:
                raise self._param(func, "the stream is not capturing")
            tasks, s.capture = s.capture, None
            handle = new_handle(GRAPH_HANDLE)
            self._graphs[handle] = SimGraph(handle, tasks)
        return handle

    def launch_graph(self, graph: int, stream: int) -> None:
        """``aclmdlRIExecuteAsync``: queue one replay of ``graph`` on ``stream`` (one task)."""
        func = "aclmdlRIExecuteAsync"
        self._check_live(func)
        s = self._stream(stream, func)
        g = self._graphs.get(graph)
        if g is None:
            raise self._bad_handle(func, f"modelRI {_hex(graph)} is not a live graph")
        self._not_capturing(s, func)
        self._enqueue(s, (GRAPH, g), func)

    def destroy_graph(self, graph: int) -> None:
        """``aclmdlRIDestroy``: at once (queued replays keep the task list they hold)."""
        func = "aclmdlRIDestroy"
        self._check(func)
        if self._graphs.pop(graph, None) is None:
            raise self._bad_handle(func, f"modelRI {_hex(graph)} is not a live graph")
