"""``Posting``: how the library threads' outcomes reach the event loop, and where they wait when
they cannot.

Each round of outcomes (a poll round's completions, a batch the submitter failed) goes to the
loop with one ``call_soon_threadsafe``. Two ways a round can miss the loop:

- the loop has finished: the call raises, and the round is *held* until an ``aclose()`` from
  another loop adopts the device (:meth:`Posting.adopt`);
- the loop finishes with the round's callback still queued: ``asyncio.run`` closes its loop
  once the main coroutine has returned, and a callback queued in between is dropped with it,
  silently (the call succeeded). So a round stays *in transit* until its callback has run, and
  an adopting loop delivers what is still in transit first (those rounds came first), then what
  was held. Without this, a close from a second ``asyncio.run`` waited for good for tasks whose
  completion the first loop had thrown away.

A forced close holds back every round from when it starts destroying streams
(:meth:`Posting.hold_back`): what the threads report about streams destroyed under them is
sorted out by the close (:meth:`Posting.take_held`).

Threads: :meth:`Posting.post` comes from the library threads, under the lock; the callback runs
on the loop and takes its round off the in-transit queue (callbacks run in the order they were
queued, which is the order of the queue: both happen under the lock).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .loop import LoopAdapter
from .work import Arrival

__all__ = ["Posting"]


class Posting:
    """The hop of outcomes into one device's loop."""

    __slots__ = ("_deliver", "_held", "_holding", "_in_transit", "_lock", "adapter")

    def __init__(self, adapter: LoopAdapter, deliver: Callable[[Sequence[Arrival]], Any]) -> None:
        self.adapter = adapter
        self._deliver = deliver  # (the delivery queue's, on the loop)
        self._lock = threading.Lock()
        self._in_transit: deque[Sequence[Arrival]] = deque()
        self._held: list[Arrival] = []
        self._holding = False

    def post(self, deliveries: Sequence[Arrival]) -> None:
        """Hand a round to the loop (library threads; never waits for the loop)."""
        if not deliveries:
            return
        with self._lock:
            if self._holding:
                self._held.extend(deliveries)
                return
            self._in_transit.append(deliveries)
            if not self.adapter.call_soon_threadsafe(self._arrived, deliveries):
                self._in_transit.pop()
                self._held.extend(deliveries)

    def _arrived(self, deliveries: Sequence[Arrival]) -> None:
        # The loop runs a round's callback: it is no longer in transit.
        with self._lock:
            arrived = self._in_transit.popleft()
        assert arrived is deliveries, "rounds arrive in the order they were posted"
        self._deliver(deliveries)

    def adopt(self, adapter: LoopAdapter) -> list[Arrival]:
        """From now on post into ``adapter``'s loop (the first one has finished); returns what
        never reached the old one, in order: the rounds in transit, then those held."""
        with self._lock:
            self.adapter = adapter
            lost = [item for round_ in self._in_transit for item in round_]
            self._in_transit.clear()
            lost += self._held
            self._held = []
        return lost

    @property
    def holding(self) -> bool:
        """Whether rounds are held back now (see :meth:`hold_back`)."""
        return self._holding

    def hold_back(self, holding: bool) -> None:
        """Hold every round from now on (``True``: a forced close destroys the streams)."""
        with self._lock:
            self._holding = holding

    def take_held(self) -> list[Arrival]:
        """The rounds held so far (the close sorts them out)."""
        with self._lock:
            held, self._held = self._held, []
        return held
