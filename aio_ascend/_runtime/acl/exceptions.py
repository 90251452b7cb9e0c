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
import itertools
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, Final

from ..._errors import AscendError
from . import ffi as ffi

__all__ = ["DEVICE_LEVEL", "ExceptionLog", "Sites", "exception_log"]

#: the stream / task id of a device-level failure (heartbeat lost, OOM): no task to blame
DEVICE_LEVEL: Final = 0xFFFFFFFF
#: reports kept (the oldest are dropped past it)
_KEPT = 1024


class ExceptionLog:
    """The exception reports of one library: ``(serial, device, stream id, task id, code)``."""

    def __init__(self, functions: dict[str, Any], *, register: bool) -> None:
        self.reports: deque[tuple[int, int, int, int, int]] = deque(maxlen=_KEPT)
        task = functions["aclrtGetTaskIdFromExceptionInfo"]
        stream = functions["aclrtGetStreamIdFromExceptionInfo"]
        device = functions["aclrtGetDeviceIdFromExceptionInfo"]
        code = functions["aclrtGetErrorCodeFromExceptionInfo"]
        append = self.reports.append
        serials = itertools.count(1)
        self._serials = serials

        def on_exception(info: int | None) -> None:
            # a runtime thread: read what is needed while the info is valid, hand it off
            append((next(serials), device(info), stream(info), task(info), code(info)))

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
        """The serial number the next report will have at least (reports below it are older)."""
        last = self.reports[-1][0] if self.reports else 0
        return last + 1

    def site(self, device: int, streams: dict[int, tuple[int, int]]) -> tuple[int, int] | None:
        """The first report of a task on one of ``streams`` (stream id -> (handle, the mark
        at its creation)) of ``device``: ``(stream handle, task id)``; ``None`` if none."""
        for serial, dev, stream_id, task_id, _ in list(self.reports):
            if dev != device or stream_id == DEVICE_LEVEL or task_id == DEVICE_LEVEL:
                continue
            known = streams.get(stream_id)
            if known is not None and serial >= known[1]:
                return known[0], task_id
        return None

    def oldest(self) -> int:
        """The serial of the oldest report kept (:meth:`mark` when there is none)."""
        reports = self.reports
        return reports[0][0] if reports else self.mark()

    def drop(self, device: int, spans: Iterable[tuple[int, int, int]]) -> None:
        """Forget the reports of a closing runtime: ``device``'s, about a stream id while
        that runtime held it, each span ``(stream id, first serial, end serial)``. A report
        outside its spans is kept: the stream id may be another runtime's by now."""
        held: dict[int, list[tuple[int, int]]] = {}
        for stream_id, first, end in spans:
            held.setdefault(stream_id, []).append((first, end))

        def ours(report: tuple[int, int, int, int, int]) -> bool:
            serial, dev, stream_id = report[0], report[1], report[2]
            return dev == device and any(a <= serial < b for a, b in held.get(stream_id, ()))

        keep = [report for report in list(self.reports) if not ours(report)]
        self.reports.clear()
        self.reports.extend(keep)


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
        #: the ids this runtime's destroyed streams held, and when: (id, first, end serial)
        self._spans: list[tuple[int, int, int]] = []
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

    def forget(self, stream: int) -> None:
        """A stream destroyed: its id may go to another runtime's stream from now on."""
        log = self.log
        if log is None:
            return
        for number, (handle, first) in list(self.stream_ids.items()):
            if handle == stream:
                del self.stream_ids[number]
                oldest = log.oldest()  # a span older than every report kept can go
                self._spans = [span for span in self._spans if span[2] > oldest]
                self._spans.append((number, first, log.mark()))

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
        """At close: this runtime's reports are stale from now on (the reports about a
        stream id it no longer held are not its own: the close may run late)."""
        log = self.log
        if log is not None:
            end = log.mark()
            held = [(number, first, end) for number, (_, first) in self.stream_ids.items()]
            log.drop(device, self._spans + held)
            self._spans = []
