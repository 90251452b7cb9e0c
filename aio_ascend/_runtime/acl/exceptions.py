"""Exception info: which task faulted the device, from the runtime's exception callback.

The runtime calls the callback on one of its own threads, possibly several at once, while it
processes a task failure; the ``aclrtExceptionInfo *`` is valid only during the call. The
callback here does the least it can: it reads the four ids it needs with the getters (C calls,
needed before the info goes away) and appends them, numbered, to a ``deque`` (a thread-safe
hand-off); nothing else runs there. ``AclRuntime.fault_site`` then maps the stream id to one of
its streams (``aclrtStreamGetId``); the task id is the runtime's own, matched exactly against the
ids ``aclrtGetThreadLastTaskId`` gave for our submissions.

Registration, and what coexisting with other libraries costs (``docs/cann-support.md`` §7):

- Where the library exports ``aclrtExceptionInfoCallbackRegister``, the callback is added to
  the runtime's list (callbacks are keyed by their pointer, so HCCL's, aclshmem's and ours all
  run) and removed with ``...Unregister`` at exit, which removes nobody else's.
- Otherwise ``aclrtSetExceptionInfoCallback`` is the one slot of the process, and the last
  library to set it wins: setting ours replaces whoever set theirs before, and a later one
  replaces ours (then attribution falls back to "the first fault for the stream"). Opening a
  device with ``runtime_options={"exception_callback": False}`` leaves the slot alone. The
  runtime has no getter for the slot, so we cannot know whether ours is still the one set: we
  never clear it (clearing would remove another library's). At exit the library's
  ``aclFinalize`` stops the runtime's threads before the interpreter goes away.

Reports are scoped: each carries a serial number, a runtime only reads the reports that arrived
after the stream was created (:meth:`ExceptionLog.mark`), and a runtime's reports are dropped
when it closes, so a stale report never matches a recycled stream id. What a runtime drops is
bounded by when it held each stream id: a close can run late (a collected device, or once a
stuck runtime call returned), after the same device was opened again and a new stream of it
got a recycled id, whose reports are not the closing runtime's.
A device-level failure reports the stream id ``0xFFFFFFFF`` and is not a site; a task id of
``0xFFFFFFFF`` names no task either.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections import deque
from typing import Any, Final

from ..._errors import AscendError
from . import ffi as ffi

__all__ = ["DEVICE_LEVEL", "ExceptionLog", "Sites", "exception_log"]

#: the stream / task id of a device-level failure (heartbeat lost, OOM): no task to blame
DEVICE_LEVEL: Final = 0xFFFFFFFF
#: reports kept (the oldest are dropped past it)
_KEPT = 1024


class ExceptionLog:
    """The exception reports of one library: ``(serial, device, stream id, task id, code)``,
    in serial order (a serial is taken as its report is appended, under the append lock).

    Reports are never taken out but by age (the deque keeps the latest :data:`_KEPT`): what a
    closing runtime drops is noted as spans that :meth:`site` skips. A close may run inside
    the garbage collector, on any thread, even inside another close's drop (a finalizer), so
    dropping holds no lock a report's append takes, and a reader never sees the reports
    half rebuilt.
    """

    def __init__(self, functions: dict[str, Any], *, register: bool) -> None:
        self.reports: deque[tuple[int, int, int, int, int]] = deque(maxlen=_KEPT)
        self._appending = threading.Lock()  # the runtime's threads append
        self._last = 0  # the serial of the latest report
        #: what closed runtimes dropped: (device, stream id, first serial, end serial)
        self.dropped: list[tuple[int, int, int, int]] = []
        # drops from several threads; re-entered by a finalizer's close on the same thread
        self._dropping = threading.RLock()
        task = functions["aclrtGetTaskIdFromExceptionInfo"]
        stream = functions["aclrtGetStreamIdFromExceptionInfo"]
        device = functions["aclrtGetDeviceIdFromExceptionInfo"]
        code = functions["aclrtGetErrorCodeFromExceptionInfo"]
        append = self.reports.append
        lock = self._appending

        def on_exception(info: int | None) -> None:
            # a runtime thread: read what is needed while the info is valid, hand it off
            ids = (device(info), stream(info), task(info), code(info))
            with lock:
                serial = self._last + 1
                append((serial, *ids))
                self._last = serial  # (after the append: a report below the mark is in)

        #: the ctypes trampoline: must stay referenced while the runtime may call it
        self.callback = ffi.EXCEPTION_CALLBACK(on_exception)
        #: how it was registered: "register" (one of many), "set" (the process's one slot)
        self.mode = "register" if register else "set"
        if register:
            functions["aclrtExceptionInfoCallbackRegister"](self.callback)
            unregister = functions["aclrtExceptionInfoCallbackUnregister"]
            atexit.register(self._unregister, unregister)
        else:
            functions["aclrtSetExceptionInfoCallback"](self.callback)

    def _unregister(self, unregister: Any) -> None:
        try:
            unregister(self.callback)  # ours only: another library's stays registered
        except AscendError:
            pass

    def mark(self) -> int:
        """The serial the next report will have at least (reports below it are older)."""
        return self._last + 1

    def site(self, device: int, streams: dict[int, tuple[int, int]]) -> tuple[int, int] | None:
        """The first report of a task on one of ``streams`` (stream id -> (handle, the mark
        at its creation)) of ``device``, not dropped: ``(stream handle, task id)``; ``None``
        if none."""
        dropped = self.dropped
        for serial, dev, stream_id, task_id, _ in list(self.reports):
            if dev != device or stream_id == DEVICE_LEVEL or task_id == DEVICE_LEVEL:
                continue
            known = streams.get(stream_id)
            if known is None or serial < known[1]:
                continue
            if not any(_covers(span, serial, dev, stream_id) for span in dropped):
                return known[0], task_id
        return None

    def drop(self, device: int, spans: dict[int, tuple[int, int]]) -> None:
        """Forget the reports of a closing runtime: ``device``'s, about a stream id of
        ``spans`` (stream id -> (first serial, end serial), the end at most :meth:`mark`)
        with a serial in its span. Only the spans some report kept lies in are noted (a
        later report has a later serial), so the list stays as short as the log."""
        added = [(device, sid, first, end) for sid, (first, end) in spans.items()]
        with self._dropping:
            while True:  # (a drop in a finalizer run meanwhile replaced the list: again)
                before = self.dropped
                kept = [span for span in before + added if self._lies_in(span)]
                if self.dropped is before:
                    self.dropped = kept
                    return

    def _lies_in(self, span: tuple[int, int, int, int]) -> bool:
        # whether a report kept is about the span's device and stream id, within it
        return any(_covers(span, serial, dev, sid) for serial, dev, sid, _, _ in list(self.reports))


def _covers(span: tuple[int, int, int, int], serial: int, device: int, stream_id: int) -> bool:
    """Whether a dropped ``span`` holds the report ``serial`` about ``stream_id``."""
    return span[0] == device and span[1] == stream_id and span[2] <= serial < span[3]


_LOGS: dict[str, ExceptionLog] = {}
_LOGS_LOCK = threading.Lock()

_GETTERS = (
    "aclrtGetTaskIdFromExceptionInfo",
    "aclrtGetStreamIdFromExceptionInfo",
    "aclrtGetDeviceIdFromExceptionInfo",
    "aclrtGetErrorCodeFromExceptionInfo",
)


def exception_log(
    path: str, functions: dict[str, Any], has: Any, *, allow_set: bool = True
) -> ExceptionLog | None:
    """The library's exception log, registered once per library (``None`` where the library
    lacks a way to register or the getters, or where only the process-wide slot exists and
    ``allow_set`` is false)."""
    if not all(has(name) for name in _GETTERS):
        return None
    register = has("aclrtExceptionInfoCallbackRegister") and has(
        "aclrtExceptionInfoCallbackUnregister"
    )
    with _LOGS_LOCK:
        log = _LOGS.get(path)
        if log is not None:
            return log if log.mode == "register" or allow_set else None
        if not register and not (allow_set and has("aclrtSetExceptionInfoCallback")):
            return None
        log = _LOGS[path] = ExceptionLog(functions, register=register)
        return log


class Sites:
    """One runtime's view of the reports: its streams' ids, from when each was created."""

    def __init__(self, library: Any, *, exception_callback: bool) -> None:
        self.log = exception_log(
            library.path, library.functions, library.has, allow_set=exception_callback
        )
        self._has_ids = library.has("aclrtStreamGetId")
        #: aclrtStreamGetId -> (stream handle, the first report serial that may concern it)
        self.stream_ids: dict[int, tuple[int, int]] = {}
        #: the ids of streams destroyed by force -> the first serial that may concern them
        #: (a kernel left running on one may fault after the destroy)
        self._forced: dict[int, int] = {}
        name = "aclrtGetThreadLastTaskId"
        # bound without the error checker: called after every launch, and a failure here only
        # means "cannot tell" (None), never an error of the launch
        self.get_last_task: Any = ffi.bind_one(library.cdll, name) if library.has(name) else None

    def note(self, stream: int, functions: dict[str, Any]) -> None:
        """A new stream: its id (``aclrtStreamGetId``), the reports from now on."""
        if self.log is None or not self._has_ids:
            return
        number = ctypes.c_int32()
        functions["aclrtStreamGetId"](stream, ctypes.byref(number))
        stream_id = number.value & 0xFFFFFFFF  # the info's id is a uint32
        # a report from before the stream existed is about another stream with that id
        self.stream_ids[stream_id] = (stream, self.log.mark())

    def forget(self, stream: int, *, drained: bool) -> None:
        """A stream destroyed: its id may go to another stream from now on. A report about
        a drained one came before the destroy, so before any later stream with its id was
        made: it never matches that stream. One destroyed by force may leave a kernel
        running, whose report may come later: its id is this runtime's until the close."""
        for number, (handle, first) in list(self.stream_ids.items()):
            if handle == stream:
                del self.stream_ids[number]
                if not drained:
                    self._forced[number] = min(first, self._forced.get(number, first))

    def last_task_id(self, scratch: Any) -> int | None:
        """``aclrtGetThreadLastTaskId`` into the thread's ``scratch``; ``None`` without it."""
        get = self.get_last_task
        if get is None or get(scratch.task_id_ref):
            return None
        task_id: int = scratch.task_id.value
        return task_id

    def site(self, device: int) -> tuple[int, int] | None:
        return None if self.log is None else self.log.site(device, self.stream_ids)

    def drop(self, device: int) -> None:
        """At close: the reports about this runtime's streams, those it still has and those
        it destroyed by force with work left on them, are stale from now on. Those about a
        stream id it destroyed idle are not dropped: a late close (a collected device, or
        once a stuck runtime call returned) must not drop the reports of the device opened
        again meanwhile, whose new stream may have the recycled id. (A new stream with the
        id of one destroyed by force with work left is the one case that stays ambiguous:
        its reports before this close go too.)"""
        log = self.log
        if log is not None:
            end = log.mark()
            spans = {number: (first, end) for number, first in self._forced.items()}
            spans.update((number, (first, end)) for number, (_, first) in self.stream_ids.items())
            log.drop(device, spans)
            self._forced.clear()
