"""Model-RI capture and replay on the ``acl`` backend (the seam's four graph calls).

- ``begin_capture``: ``aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED)``.
  Relaxed, because the rest of the library keeps working while a capture is open: the poller
  thread queries the events of other streams, and other threads allocate memory; the global
  and thread-local modes restrict such calls (as CUDA's do; cann-support.md §10.1).
- ``end_capture``: ``aclmdlRICaptureEnd(stream, &modelRI)``. The handle returned names the
  backend's own record of the model, not the ``aclmdlRI`` pointer, so a destroyed graph's handle
  never aliases a later model and a replay of it is refused before ACL sees it.
- ``launch_graph``: ``aclmdlRIExecuteAsync(modelRI, stream)``: one stream task.
- ``destroy_graph``: ``aclmdlRIDestroy(modelRI)``.

The four functions are optional symbols (:mod:`.library`): on a release without them each call
raises ``BackendUnavailableError`` naming the symbol and the library, before anything is done.

On a capturing stream these are refused with ``InvalidParamError`` (107000) before ACL sees
them: event records and waits (a capture records no cross-stream dependencies here), stream
syncs and copies from or to pageable host memory (they would have to run now), a second
``begin_capture``, a graph launch. ``end_capture`` on a stream that is not capturing is refused
the same way. A stream destroyed while capturing has its capture ended and its model destroyed
first; ``close`` does the same, and destroys the graphs left.

The runtime's own capture codes (107024-107040, 507903) arrive as ``CaptureError`` and
``CaptureInvalidatedError`` (``_errors.py``). An ``aclmdlRICaptureEnd`` that fails with 507903 (an
error invalidated the capture) has still ended it: the runtime cleared the model and took the
stream out of capture mode, so nothing of it is kept here and the stream takes work again. CANN
documents this capture as an experimental feature (``docs/cann-support.md`` §10.1).

Launches: on the host-args path (8.5+) ``aclrtLaunchKernelWithHostArgs`` copies the args and the
placeholder data during the call; on the args-handle path (8.3) the args are built in the
runtime's handle and launched with ``aclrtLaunchKernelWithConfig``, captured the same way.
Whether a captured launch's task reads those copies or the caller's buffers at replay is not
documented; the scheduler keeps the args buffers alive and unchanged with the graph, so both
are safe (cann-support.md §10.1 lists what needs hardware to settle).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from ctypes import byref, c_void_p
from typing import Any

from ..._errors import (
    AscendError,
    DeviceFaultError,
    InternalError,
    InvalidHandleError,
    RuntimeAPIError,
)
from ..abi import (
    ACL_ERROR_RT_INVALID_HANDLE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
    param_error,
)
from .values import ptr as _ptr

__all__ = ["GRAPH_HANDLE_BASE", "AclCapture"]

#: the first graph handle a runtime gives (then counting up; never reused)
GRAPH_HANDLE_BASE = 0x7A0001

_BEGIN = "aclmdlRICaptureBegin"
_END = "aclmdlRICaptureEnd"
_EXECUTE = "aclmdlRIExecuteAsync"
_DESTROY = "aclmdlRIDestroy"


class AclCapture:
    """The capture state of one :class:`~.runtime.AclRuntime`, which owns it and forwards the
    seam's graph calls to it (see the module docstring).

    :param acl: the runtime's bound function by name (its table changes at close)
    :param is_pinned: whether a host range lies in one of the runtime's pinned allocations
    :param sticky: the runtime's fault reporting (the first fault's text on later reports)
    """

    def __init__(
        self,
        acl: Callable[[str], Any],
        is_pinned: Callable[[int, int], bool],
        sticky: Callable[[DeviceFaultError], RuntimeAPIError],
    ) -> None:
        self._acl = acl
        self._is_pinned = is_pinned
        self._sticky = sticky
        #: streams with a capture open
        self.streams: set[int] = set()
        #: graph handle -> aclmdlRI
        self.graphs: dict[int, int] = {}
        self._ids = itertools.count(GRAPH_HANDLE_BASE)

    # --- refusals on a capturing stream (asked by the runtime before ACL) ----------------

    def refuse(self, stream: int, func: str) -> None:
        """Refuse ``func`` on ``stream`` if it is capturing."""
        if stream in self.streams:
            raise param_error(
                func, f"stream {stream:#x} is capturing: {func} is refused until end_capture"
            )

    def check_copy(self, dst: int, src: int, count: int, kind: int, func: str) -> None:
        """A copy on a capturing stream must have its host side in pinned memory."""
        if not count or kind not in (ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST):
            return
        host = src if kind == ACL_MEMCPY_HOST_TO_DEVICE else dst
        if not self._is_pinned(host, count):
            raise param_error(
                func,
                "the stream is capturing: a copy from or to pageable host memory cannot be "
                "captured (use malloc_host memory)",
            )

    # --- the seam's four calls -----------------------------------------------------------

    def begin(self, stream: int) -> None:
        """``aclmdlRICaptureBegin`` in relaxed mode."""
        stream = _ptr("stream", stream)
        if stream in self.streams:
            raise param_error(_BEGIN, f"stream {stream:#x} is already capturing")
        self._acl(_BEGIN)(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
        self.streams.add(stream)

    def end(self, stream: int) -> int:
        """``aclmdlRICaptureEnd``: the recorded work as a graph handle (the stream is not
        capturing afterwards, whether or not the call succeeded; ``CaptureInvalidatedError``
        when the runtime invalidated the capture, whose model it has discarded)."""
        stream = _ptr("stream", stream)
        if stream not in self.streams:
            raise param_error(_END, f"stream {stream:#x} is not capturing")
        self.streams.discard(stream)
        model = c_void_p()
        self._acl(_END)(stream, byref(model))
        if not model.value:
            raise InternalError(f"{_END} succeeded but returned a NULL modelRI", func=_END)
        handle = next(self._ids)
        self.graphs[handle] = model.value
        return handle

    def _model(self, graph: int, func: str) -> int:
        model = self.graphs.get(graph) if type(graph) is int else None
        if model is None:
            raise InvalidHandleError(
                f"graph handle {graph!r} is not a live graph",
                code=ACL_ERROR_RT_INVALID_HANDLE,
                func=func,
            )
        return model

    def launch(self, graph: int, stream: int) -> None:
        """``aclmdlRIExecuteAsync``: queue one replay of ``graph`` on ``stream``."""
        stream = _ptr("stream", stream)
        model = self._model(graph, _EXECUTE)
        self.refuse(stream, _EXECUTE)
        try:
            self._acl(_EXECUTE)(model, stream)
        except DeviceFaultError as exc:
            raise self._sticky(exc) from None

    def destroy(self, graph: int) -> None:
        """``aclmdlRIDestroy`` (the caller makes sure no queued replay still needs it)."""
        model = self._model(graph, _DESTROY)
        del self.graphs[graph]
        self._acl(_DESTROY)(model)

    # --- streams going away -------------------------------------------------------------

    def abort(self, stream: int) -> None:
        """End a capture still open on ``stream`` (about to be destroyed), discard its model."""
        if stream not in self.streams:
            return
        self.streams.discard(stream)
        model = c_void_p()
        with contextlib.suppress(AscendError):
            self._acl(_END)(stream, byref(model))
            if model.value:
                self._acl(_DESTROY)(model.value)

    def close(self, attempt: Callable[..., Any]) -> None:
        """At the runtime's close (before the streams go): end open captures, destroy every
        graph (``attempt(name, *args)`` calls ACL, collecting errors)."""
        for stream in list(self.streams):
            model = c_void_p()
            if attempt(_END, stream, byref(model)) is not None and model.value:
                attempt(_DESTROY, model.value)
        self.streams.clear()
        models = list(self.graphs.values())
        self.graphs.clear()
        for model_ri in models:
            attempt(_DESTROY, model_ri)
