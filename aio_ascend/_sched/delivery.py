"""Completions into the loop: queued as they arrive, resolved in bounded chunks per loop turn.

Waking coroutines is loop work: resuming thousands in one callback stalls the loop. What costs
is the coroutines each resolution wakes (awaiters of the task, a launch waiting for the freed
slot), so those are budgeted per turn; plain resolutions only loosely.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .work import Delivery

__all__ = ["MAX_RESOLVED_PER_TURN", "MAX_WAKES_PER_TURN", "DeliveryQueue"]

MAX_RESOLVED_PER_TURN = 1024
MAX_WAKES_PER_TURN = 128


class DeliveryQueue:
    """Delivered completions not yet resolved.

    :param resolve: applies one delivery; returns how many coroutines it woke
    :param call_soon: schedules a callback on a later loop turn
    :param on_empty: called when a drain has emptied the queue
    """

    def __init__(
        self,
        resolve: Callable[[Delivery], int],
        call_soon: Callable[[Callable[[], None]], None],
        on_empty: Callable[[], None],
    ) -> None:
        self._resolve = resolve
        self._call_soon = call_soon
        self._on_empty = on_empty
        self._queue: deque[Delivery] = deque()
        self._drain_scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def deliver(self, items: list[Delivery]) -> None:
        """The poller's (or submitter's) one hop: queue, and drain now unless a drain is due."""
        self._queue.extend(items)
        if not self._drain_scheduled:
            self.drain()

    def drain(self, *, budget: bool = True) -> None:
        """Resolve up to one turn's budget; schedule the next turn if any is left."""
        self._drain_scheduled = False
        completed = self._queue
        resolve = self._resolve
        limit = MAX_RESOLVED_PER_TURN if budget else len(completed)
        wake_limit = MAX_WAKES_PER_TURN if budget else len(completed) * 2 + 1
        wakes = 0
        for _ in range(min(len(completed), limit)):
            wakes += resolve(completed.popleft())
            if wakes >= wake_limit:
                break
        if completed and not self._drain_scheduled:
            self._drain_scheduled = True
            self._call_soon(self.drain)
        elif not completed:
            self._on_empty()
