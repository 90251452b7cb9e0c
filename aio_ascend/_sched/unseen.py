"""Failures are never unseen: failed tasks whose error nobody retrieved.

A task's error counts as retrieved once ``await task`` raised it, ``task.exception()``
returned it, or a ``synchronize()`` raised it. Until then it is held here (without keeping the
task alive): ``Stream.synchronize()`` raises those of its stream once, a task collected with
its error unretrieved is logged at ERROR, and the device logs what is left when it closes, as
asyncio does for tasks. ``ClosedError`` (work dropped by ``aclose(cancel=True)`` or a close)
does not count. Tasks failed by a device fault are not reported one by one: the fault is
logged once, with the number of tasks it failed, when the device closes.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._errors import ClosedError
from .faults import FaultState

__all__ = ["MAX_LOGGED_AT_CLOSE", "FailureLog", "Unseen", "raise_failures"]

log = logging.getLogger("aio_ascend")

#: unretrieved failures logged one by one when a device closes; the rest in one summary line
MAX_LOGGED_AT_CLOSE = 10


class Unseen:
    """One failed task's unretrieved error (it holds no reference to the task)."""

    __slots__ = ("__weakref__", "exc", "finalizer", "kind", "stream_ref")

    def __init__(self, exc: BaseException, kind: str, stream_ref: Callable[[], Any]) -> None:
        self.exc = exc
        self.kind = kind
        self.stream_ref = stream_ref
        self.finalizer: weakref.finalize[Any, Any] | None = None


class FailureLog:
    """The unretrieved failures of one device's tasks, and its fault tally.

    :param device_id: for log messages
    :param faults: the device's fault state (failures caused by its fault are only counted)
    """

    def __init__(self, device_id: int, faults: FaultState) -> None:
        self._device_id = device_id
        self._faults = faults
        self._lock = threading.Lock()
        self._open: dict[int, Unseen] = {}  # id(record) -> record, oldest first
        #: tasks the device's fault failed (its first fault included)
        self.fault_failed = 0

    def __len__(self) -> int:
        return len(self._open)

    def note(self, task: Any, exc: BaseException, kind: str, stream_ref: Any) -> Unseen | None:
        """``task`` failed with ``exc`` (loop thread): the record to keep on the task until its
        error is retrieved, or None when this failure is not reported one by one."""
        if isinstance(exc, ClosedError):
            return None
        first = self._faults.first
        if first is not None and (exc is first or exc.__cause__ is first):
            self.fault_failed += 1
            return None
        record = Unseen(exc, kind, stream_ref)
        record.finalizer = weakref.finalize(task, self._collected, record)
        record.finalizer.atexit = False
        with self._lock:
            self._open[id(record)] = record
        return record

    def retrieved(self, record: Unseen) -> None:
        """The error of ``record`` was seen (awaited, asked for, or raised by a sync)."""
        with self._lock:
            self._open.pop(id(record), None)
        if record.finalizer is not None:
            record.finalizer.detach()
            record.finalizer = None

    def take(self, stream_ref: Any = None) -> list[BaseException]:
        """The unretrieved errors of one stream's tasks (all streams' for None), oldest first;
        they count as retrieved from now on."""
        with self._lock:
            chosen = [
                record
                for record in self._open.values()
                if stream_ref is None or record.stream_ref is stream_ref
            ]
            for record in chosen:
                del self._open[id(record)]
        for record in chosen:
            if record.finalizer is not None:
                record.finalizer.detach()
                record.finalizer = None
        return [record.exc for record in chosen]

    def _collected(self, record: Unseen) -> None:
        # A task was garbage-collected (any thread) with its error unretrieved.
        with self._lock:
            if self._open.pop(id(record), None) is None:
                return
        log.error(
            "device %d: a %s task failed and its error was never retrieved (await the task, "
            "call its exception(), or synchronize() its stream)",
            self._device_id,
            record.kind,
            exc_info=record.exc,
        )

    def report_at_close(self) -> None:
        """The device is closing: log what was never retrieved, and the device's fault once."""
        remaining = self.take()
        for exc in remaining[:MAX_LOGGED_AT_CLOSE]:
            log.error(
                "device %d closed with a failed task whose error was never retrieved",
                self._device_id,
                exc_info=exc,
            )
        if len(remaining) > MAX_LOGGED_AT_CLOSE:
            log.error(
                "device %d: %d more failed tasks whose errors were never retrieved",
                self._device_id,
                len(remaining) - MAX_LOGGED_AT_CLOSE,
            )
        first = self._faults.first
        if first is not None:
            log.error(
                "device %d faulted: %s; the fault failed %d task(s) (each raised "
                "DeviceFaultError, caused by this one for all but the first)",
                self._device_id,
                first,
                self.fault_failed,
            )


def raise_failures(errors: list[BaseException], what: str) -> None:
    """Raise ``errors``: nothing for none, one as itself, several as an ``ExceptionGroup``."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BaseExceptionGroup(f"{len(errors)} {what} failed", errors)
