"""Event handles: the batch events of the threads, and the user events of ``record_event``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .._runtime import Runtime
from .._runtime.abi import ACL_EVENT_CAPTURE_STREAM_PROGRESS

__all__ = ["BatchEvents", "EventRecord", "UserEvents"]

#: spare user-event handles kept per flag set; more are destroyed
MAX_SPARE_EVENTS = 1024


class BatchEvents:
    """Completion events, one recorded after each batch: taken by the submitter, given back
    by the poller once the batch completed, destroyed at close (every one ever created).

    ``deque`` appends and pops are atomic, so the two threads share it without a lock.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._free: deque[int] = deque()
        self.created: list[int] = []

    def take(self) -> int:
        """A free event (submitter thread; its context is bound)."""
        try:
            return self._free.pop()
        except IndexError:
            return self.create()

    def create(self) -> int:
        """A new event that is destroyed at close (submitter thread)."""
        event = self._runtime.create_event(ACL_EVENT_CAPTURE_STREAM_PROGRESS)
        self.created.append(event)
        return event

    def give_back(self, event: int) -> None:
        """The batch recorded with ``event`` completed (poller thread)."""
        self._free.append(event)


class UserEvents:
    """Handles for ``record_event``, recycled once their public ``Event`` is collected.

    :param create: creates an event with the given flags (loop thread, context bound)
    :param destroy: destroys one (loop thread, context bound)
    """

    def __init__(self, create: Callable[[int], int], destroy: Callable[[int], None]) -> None:
        self._create = create
        self._destroy = destroy
        #: (handle, flags) of collected Events, appended by finalizers (any thread)
        self.retired: deque[tuple[int, int]] = deque()
        self._spare: dict[int, list[int]] = {}
        self.alive: set[int] = set()  # every handle created and not destroyed

    def take(self, flags: int) -> int:
        """An event with ``flags``: a recycled one if any (loop thread)."""
        if self.retired:
            self.recycle()
        spares = self._spare.get(flags)
        if spares:
            return spares.pop()
        handle = self._create(flags)
        self.alive.add(handle)
        return handle

    def retire(self, handle: int, flags: int) -> None:
        """The public Event of ``handle`` was collected: every request that used it completed,
        so it can be recorded again (a ``weakref.finalize`` callback, any thread)."""
        self.retired.append((handle, flags))

    def recycle(self) -> None:
        """Keep a bounded number of retired handles per flag set, destroy the rest (loop)."""
        dead = self.retired
        while dead:
            handle, flags = dead.popleft()
            spares = self._spare.setdefault(flags, [])
            if len(spares) < MAX_SPARE_EVENTS:
                spares.append(handle)
            else:
                self.alive.discard(handle)
                self._destroy(handle)

    def take_all(self) -> list[int]:
        """On close: every handle still alive (referenced, spare or retired), now forgotten."""
        handles = list(self.alive)
        self.alive.clear()
        self.retired.clear()
        self._spare.clear()
        return handles


class EventRecord:
    """What the scheduler knows of one user event: its handle and how its recording went.

    :ivar error: why it was never recorded, if it was refused
    :ivar recorded: the record call reached the runtime (a query can tell its status; set by
        the submitter thread)
    """

    __slots__ = ("error", "flags", "handle", "recorded")

    def __init__(self, handle: int, flags: int) -> None:
        self.handle = handle
        self.flags = flags
        self.recorded = False
        self.error: BaseException | None = None
