"""Observation hooks: how tracing and metrics see tasks, at no cost while nobody looks.

The scheduler calls out at three points only, each guarded by one attribute check of the
process-wide :data:`HOOKS`:

- a ``Task`` is created: ``HOOKS.capture`` (None unless an observer wants context from the
  creating code, e.g. the tracer's request scope or an OpenTelemetry parent span);
- a round of completions is delivered into the loop (``DeliveryQueue.deliver``: once per
  round, not per task): ``HOOKS.observers``;
- a coroutine that waited for a task resumes (``Task.wait_finished``): ``HOOKS.observers``.

A host function (``Stream.launch_host_func``) never goes through the scheduler's deliveries:
its runner tells the observers itself when it finishes (one check of ``HOOKS.observers`` per
host function), as a delivery whose request is a :class:`HostCall`.

Observers are added and removed from any thread; the tuple is replaced, never mutated, so a
reader sees either the old or the new set. An observer that raises is logged and dropped:
observation must never break the scheduler.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

__all__ = [
    "HOOKS",
    "HostCall",
    "Hooks",
    "Observer",
    "ObserverContext",
    "Source",
    "task_of",
    "times",
]

log = logging.getLogger("aio_ascend")


class Source:
    """What observers know of the device a delivery comes from (one per open device).

    :ivar device_id: the device number
    :ivar backend: the backend's name

    (A launch names its kernel itself: ``request.spec.kernel``.)
    """

    __slots__ = ("backend", "device_id")

    def __init__(self, device_id: int, backend: str) -> None:
        self.device_id = device_id
        self.backend = backend

    def __repr__(self) -> str:
        return f"<Source device {self.device_id} ({self.backend})>"


class HostCall:
    """A finished host function as a delivery's request: what observers read of a request
    (``kind``, ``task``, ``lane.handle``, ``func``), plus its own times, as its ``Task`` has
    no batch and keeps ``submitted_at``/``completed_at`` at None (read both through
    :func:`times`).

    :ivar submitted: the function was handed to the host-function thread (the work before it
        was done), or None if it never ran
    :ivar completed: the function returned, or None if it never ran
    """

    __slots__ = ("completed", "handle", "submitted", "task")

    kind = "host_func"
    func = None

    def __init__(
        self, task: Any, handle: int, submitted: float | None, completed: float | None
    ) -> None:
        self.task = task
        self.handle = handle
        self.submitted = submitted
        self.completed = completed

    @property
    def lane(self) -> HostCall:
        """Its stream as requests have it (``lane.handle``: the runtime stream handle)."""
        return self


def task_of(request: Any) -> Any:
    """The Task of a delivered request: itself, or a host call's."""
    return request.task if type(request) is HostCall else request


def times(request: Any) -> tuple[float | None, float | None]:
    """``(submitted, completed)`` of a delivered request: its task's, or a host call's own."""
    if type(request) is HostCall:
        return request.submitted, request.completed
    return request.submitted_at, request.completed_at


class Observer(Protocol):
    """What an observer implements (all calls on the event-loop thread of the device)."""

    #: whether :meth:`capture` is called when a task is created
    wants_capture: bool

    def capture(self) -> object:
        """Context of the code creating a task; kept in ``task.captured[self]``."""
        ...

    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        """A round of ``(request, error, outcome)`` deliveries, before their tasks resolve."""
        ...

    def resumed(self, task: Any) -> None:
        """A coroutine that waited for ``task`` resumed (``task.resumed_at`` is set)."""
        ...


class Hooks:
    """The process-wide set of observers (see the module docstring)."""

    __slots__ = ("_lock", "capture", "observers")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: the active observers (an immutable tuple: empty means nobody looks)
        self.observers: tuple[Observer, ...] = ()
        #: called by every new Task when an observer wants context, else None
        self.capture: Callable[[], dict[Observer, object]] | None = None

    def add(self, observer: Observer) -> None:
        """Start calling ``observer`` (a no-op if it is already active)."""
        with self._lock:
            if observer not in self.observers:
                self._set((*self.observers, observer))

    def remove(self, observer: Observer) -> None:
        """Stop calling ``observer`` (a no-op if it is not active)."""
        with self._lock:
            self._set(tuple(o for o in self.observers if o is not observer))

    def _set(self, observers: tuple[Observer, ...]) -> None:
        capturing = tuple(o for o in observers if o.wants_capture)
        self.observers = observers
        if len(capturing) == 1:  # the usual case, one call less per task
            self.capture = _capture_one(capturing[0])
        else:
            self.capture = (lambda: _capture(capturing)) if capturing else None

    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        """Tell every observer of a round of deliveries."""
        for observer in self.observers:
            try:
                observer.delivered(source, deliveries)
            except Exception:
                self.failed(observer)

    def resumed(self, task: Any) -> None:
        """Tell every observer that a waiter of ``task`` resumed."""
        for observer in self.observers:
            try:
                observer.resumed(task)
            except Exception:
                self.failed(observer)

    def failed(self, observer: Observer) -> None:
        """``observer`` raised (the exception being handled): log it once and drop it."""
        log.exception("aio_ascend: observer %r failed; it is removed", observer)
        self.remove(observer)


def _capture_one(observer: Observer) -> Callable[[], dict[Observer, object]]:
    capture = observer.capture

    def captured() -> dict[Observer, object]:
        try:
            return {observer: capture()}
        except Exception:
            HOOKS.failed(observer)
            return {}

    return captured


def _capture(observers: tuple[Observer, ...]) -> dict[Observer, object]:
    captured: dict[Observer, object] = {}
    for observer in observers:
        try:
            captured[observer] = observer.capture()
        except Exception:
            HOOKS.failed(observer)
    return captured


#: the one set of observers of this process
HOOKS = Hooks()


class ObserverContext(ABC):
    """``with``/``async with`` around an observer's ``start()``/``stop()`` (tracing, metrics)."""

    @abstractmethod
    def start(self) -> None:
        """Start observing."""

    @abstractmethod
    def stop(self) -> None:
        """Stop observing. Idempotent."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
