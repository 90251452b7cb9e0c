"""Per-stream admission: at most ``limit`` requests in flight, further callers queue FIFO.

Pure bookkeeping: this module never wakes anybody itself. Each method returns the waiter the
caller must wake (or ``None``), so the decisions are testable without a loop or threads.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Admission", "Ticket"]


class Ticket:
    """One caller waiting for a slot; ``granted`` once a slot was handed to it."""

    __slots__ = ("granted", "waiter")

    def __init__(self, waiter: Any) -> None:
        self.waiter = waiter
        self.granted = False


class Admission:
    """The in-flight count of one stream and the queue of callers waiting for a slot."""

    __slots__ = ("in_flight", "limit", "queue")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.queue: deque[Ticket] = deque()

    def try_enter(self) -> bool:
        """Take a slot at once if one is free and nobody is queued ahead (FIFO fairness)."""
        if self.in_flight < self.limit and not self.queue:
            self.in_flight += 1
            return True
        return False

    def enqueue(self, waiter: Any) -> Ticket:
        """Queue a caller; it holds a slot once its ticket is granted."""
        ticket = Ticket(waiter)
        self.queue.append(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> Any:
        """A queued caller gives up (cancelled). Returns a waiter to wake, if any.

        A ticket granted in the meantime holds a slot: it passes on to the next in line.
        """
        if ticket.granted:
            return self.leave()
        self.queue.remove(ticket)
        return None

    def leave(self) -> Any:
        """A request of this stream finished: its slot goes to the oldest queued caller.

        Returns that caller's waiter (to wake), or ``None`` if the slot became free.
        """
        queue = self.queue
        while queue:
            ticket = queue.popleft()
            if not ticket.granted:
                ticket.granted = True
                return ticket.waiter
        self.in_flight -= 1
        return None

    def grant_all(self) -> list[Any]:
        """On close: every queued caller gets a slot (to re-check the state and raise)."""
        woken = []
        while self.queue:
            ticket = self.queue.popleft()
            ticket.granted = True
            self.in_flight += 1
            woken.append(ticket.waiter)
        return woken

    def reset(self) -> None:
        """The stream is gone (destroyed by force): nothing of it is in flight any more."""
        self.in_flight = 0

    def __repr__(self) -> str:
        return f"<Admission {self.in_flight}/{self.limit} queued={len(self.queue)}>"
