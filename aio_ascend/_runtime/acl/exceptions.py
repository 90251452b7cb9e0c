"""Exception info: which task faulted the device, from the runtime's exception callback.

``aclrtSetExceptionInfoCallback`` registers one callback per process (the last one set wins;
``docs/cann-support.md`` §7), which the runtime calls on one of its own threads, possibly several
at once, while it processes a task failure; the ``aclrtExceptionInfo *`` is valid only during the
call. The callback here does the least it can: it reads the four ids it needs with the getters
(C calls, needed before the info goes away) and appends them to a ``deque`` (a thread-safe
hand-off); nothing else runs there. ``AclRuntime.fault_site`` then maps the stream id to one of
its streams (``aclrtStreamGetId``) and the task id to the task's index on that stream.

The callback object is kept alive for the life of the process (a deregistration API exists
only after CANN 9.2.0-beta.1), and is cleared with ``aclrtSetExceptionInfoCallback(NULL)`` at
exit, before ``aclFinalize``. Exception info is an accelerator for attribution, never the way a
fault is detected: another library may replace the callback; the stop-on-failure query stays the
source of truth, and without a report the scheduler attributes the fault as before.

[INF, to confirm on hardware] the task id of the info is the task's 0-based index on its stream
among the tasks submitted to it (the double numbers them so); a device-level failure reports the
stream id ``0xFFFFFFFF`` and is not a site.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from typing import Any, Final

from ..._errors import AscendError
from . import ffi as ffi

__all__ = ["DEVICE_LEVEL", "ExceptionLog", "exception_log"]

#: the stream / task id of a device-level failure (heartbeat lost, OOM): no task to blame
DEVICE_LEVEL: Final = 0xFFFFFFFF
#: reports kept (the oldest are dropped past it)
_KEPT = 1024


class ExceptionLog:
    """The exception reports of one library: ``(device, stream id, task id, code)`` tuples."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.reports: deque[tuple[int, int, int, int]] = deque(maxlen=_KEPT)
        task = functions["aclrtGetTaskIdFromExceptionInfo"]
        stream = functions["aclrtGetStreamIdFromExceptionInfo"]
        device = functions["aclrtGetDeviceIdFromExceptionInfo"]
        code = functions["aclrtGetErrorCodeFromExceptionInfo"]
        append = self.reports.append

        def on_exception(info: int | None) -> None:
            # a runtime thread: read what is needed while the info is valid, hand it off
            append((device(info), stream(info), task(info), code(info)))

        #: the ctypes trampoline: must stay referenced while the runtime may call it
        self.callback = ffi.EXCEPTION_CALLBACK(on_exception)
        self._set = functions["aclrtSetExceptionInfoCallback"]
        self._set(self.callback)
        atexit.register(self.clear)

    def clear(self) -> None:
        """Unregister (``NULL``), so that the runtime never calls into a finished interpreter."""
        try:
            self._set(None)
        except AscendError:
            pass

    def site(self, device: int, streams: dict[int, int]) -> tuple[int, int] | None:
        """The first report of a task on one of ``streams`` (stream id -> handle) of
        ``device``: ``(stream handle, task index)``; ``None`` if there is none."""
        for dev, stream_id, task_id, _ in list(self.reports):
            if dev == device and stream_id != DEVICE_LEVEL:
                handle = streams.get(stream_id)
                if handle is not None:
                    return handle, task_id
        return None


_LOGS: dict[str, ExceptionLog] = {}
_LOGS_LOCK = threading.Lock()


def exception_log(path: str, functions: dict[str, Any], has: Any) -> ExceptionLog | None:
    """The library's exception log, registered once per library (``None`` where the library
    lacks the callback or its getters)."""
    needed = (
        "aclrtSetExceptionInfoCallback",
        "aclrtGetTaskIdFromExceptionInfo",
        "aclrtGetStreamIdFromExceptionInfo",
        "aclrtGetDeviceIdFromExceptionInfo",
        "aclrtGetErrorCodeFromExceptionInfo",
    )
    if not all(has(name) for name in needed):
        return None
    with _LOGS_LOCK:
        log = _LOGS.get(path)
        if log is None:
            log = _LOGS[path] = ExceptionLog(functions)
        return log
