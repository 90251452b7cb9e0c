"""Failures are never unseen: failed tasks whose error nobody retrieved.

A task's error counts as retrieved once ``await task`` raised it, ``task.exception()``
returned it, or a ``synchronize()`` raised it. Until then it is held here (without keeping the
task alive): ``Stream.synchronize()`` raises those of its stream once, a task collected with
its error unretrieved is logged at ERROR, and the device logs what is left when it closes, as
asyncio does for tasks. A ``synchronize()`` waiting when the device closes still raises its
stream's failures (a :class:`Claim` receives what others take while it waits), and a failure
whose task was being awaited when it failed is left to its awaiters at close (logged if they
do not retrieve it, when the task is collected). ``ClosedError`` (work dropped by
``aclose(cancel=True)`` or a close) does not count. Tasks failed by a device fault are not
reported one by one: the fault is logged once, with the number of tasks it failed, when the
device closes. Tasks a forced close gave up on (``TaskTimeoutError.by_close``) are reported by
that close's WARNING, with their number: they are held like any failure (a ``synchronize()``
raises them), but never logged one by one.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._errors import ClosedError, TaskTimeoutError
from .faults import FaultState

__all__ = ["MAX_LOGGED_AT_CLOSE", "Claim", "FailureLog", "Unseen", "raise_failures"]

log = logging.getLogger("aio_ascend")

#: unretrieved failures logged one by one when a device closes; the rest in one summary line
MAX_LOGGED_AT_CLOSE = 10


class Unseen:
    """One failed task's unretrieved error (it holds no reference to the task)."""

    __slots__ = ("__weakref__", "exc", "finalizer", "kind", "quiet", "stream_ref", "waited")

    def __init__(
        self, exc: BaseException, kind: str, stream_ref: Callable[[], Any], waited: bool = False
    ) -> None:
        self.exc = exc
        self.kind = kind
        self.stream_ref = stream_ref
        #: coroutines were awaiting the task when it failed (they will retrieve it, unless
        #: cancelled first)
        self.waited = waited
        #: reported already (a forced close's WARNING counted it): never logged
        self.quiet = isinstance(exc, TaskTimeoutError) and exc.by_close
        self.finalizer: weakref.finalize[Any, Any] | None = None


class Claim:
    """A ``synchronize()`` in progress: the errors of its stream (every stream's for None)
    that others take while it waits, so that it raises them too."""

    __slots__ = ("errors", "stream_ref")

    def __init__(self, stream_ref: Any) -> None:
        self.stream_ref = stream_ref
        self.errors: list[BaseException] = []

    def wants(self, record: Unseen) -> bool:
        return self.stream_ref is None or record.stream_ref is self.stream_ref


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
        self._claims: list[Claim] = []
        #: tasks the device's fault failed (its first fault included)
        self.fault_failed = 0

    def __len__(self) -> int:
        return len(self._open)

    def note(
        self, task: Any, exc: BaseException, kind: str, stream_ref: Any, waited: bool = False
    ) -> Unseen | None:
        """``task`` failed with ``exc`` (loop thread; ``waited``: coroutines were awaiting
        it): the record to keep on the task until its error is retrieved, or None when this
        failure is not reported one by one."""
        if isinstance(exc, ClosedError):
            return None
        first = self._faults.first
        if first is not None and _caused_by(exc, first):
            self.fault_failed += 1
            return None
        record = Unseen(exc, kind, stream_ref, waited)
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
            self._hand_to_claims(chosen)
        self._detach(chosen)
        return [record.exc for record in chosen]

    def claim(self, stream_ref: Any = None) -> Claim:
        """A ``synchronize()`` starts waiting for one stream (every stream for None); hand its
        claim back to :meth:`release` when the wait is over."""
        claim = Claim(stream_ref)
        with self._lock:
            self._claims.append(claim)
        return claim

    def release(self, claim: Claim) -> list[BaseException]:
        """The wait of ``claim`` is over: the errors others took for it meanwhile."""
        with self._lock:
            self._claims.remove(claim)
        return claim.errors

    def _hand_to_claims(self, records: list[Unseen]) -> None:
        # Under the lock: whoever takes a record, every synchronize() waiting for its stream
        # raises it too (a close or another synchronize must not make a wait look successful).
        for claim in self._claims:
            claim.errors.extend(record.exc for record in records if claim.wants(record))

    @staticmethod
    def _detach(records: list[Unseen]) -> None:
        for record in records:
            if record.finalizer is not None:
                record.finalizer.detach()
                record.finalizer = None

    def _collected(self, record: Unseen) -> None:
        # A task was garbage-collected (any thread) with its error unretrieved.
        with self._lock:
            if self._open.pop(id(record), None) is None or record.quiet:
                return
        log.error(
            "device %d: a %s task failed and its error was never retrieved (await the task, "
            "call its exception(), or synchronize() its stream)",
            self._device_id,
            record.kind,
            exc_info=record.exc,
        )

    def report_at_close(self) -> None:
        """The device is closing: log what was never retrieved, and the device's fault once.

        Not logged now: what a waiting ``synchronize()`` will raise, and the failures of tasks
        that were being awaited when they failed (the awaiters run after the close; what they
        leave unretrieved is logged when its task is collected).
        """
        with self._lock:
            claimed = [r for r in self._open.values() if any(c.wants(r) for c in self._claims)]
            orphaned = [r for r in self._open.values() if not r.waited and r not in claimed]
            for record in claimed + orphaned:
                del self._open[id(record)]
            self._hand_to_claims(claimed)
        self._detach(claimed + orphaned)
        remaining = [record.exc for record in orphaned if not record.quiet]
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
                str(first),  # (a record that keeps no traceback: a handler may keep records)
                self.fault_failed,
            )


def _caused_by(exc: BaseException, first: BaseException) -> bool:
    # ``first`` is ``exc`` or on its chain of causes (a host function's error is caused by
    # the failure of the work before it, itself caused by the fault): a few links at most
    cause: BaseException | None = exc
    for _ in range(8):
        if cause is None:
            return False
        if cause is first:
            return True
        cause = cause.__cause__
    return False


def raise_failures(errors: list[BaseException], what: str) -> None:
    """Raise ``errors``: nothing for none, one as itself, several as an ``ExceptionGroup``."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BaseExceptionGroup(f"{len(errors)} {what} failed", errors)
