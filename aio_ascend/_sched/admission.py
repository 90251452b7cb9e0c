"""Per-stream admission: a bound on requests in flight and on runtime queue entries.

Two budgets apply to each stream: at most ``limit`` requests in flight (the user's
``max_in_flight``), and at most ``entry_budget`` runtime queue entries (the backend's stream
capacity), so that a submitting call can never block on a full queue. Every request takes one
entry of its own and may take one more for the completion event recorded after its batch: a
request reserves :data:`ENTRIES_PER_REQUEST` when admitted, and the entry it turns out not to
need (it does not close a batch) is refunded when the batch is formed.

Callers that do not fit wait in FIFO order. Pure bookkeeping: nothing here wakes anybody; each
method returns the waiters the caller must wake, so the decisions are testable without a loop.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["ENTRIES_PER_REQUEST", "Admission", "Ticket"]

#: entries a request reserves: its own, and its share of a batch completion event at most
ENTRIES_PER_REQUEST = 2
_NOBODY: list[Any] = []  # returned for "wake nobody" (never appended to)


class Ticket:
    """One caller waiting for admission: ``granted`` once admitted, ``refused`` when the
    stream or device closed first (it then holds nothing)."""

    __slots__ = ("granted", "refused", "waiter")

    def __init__(self, waiter: Any) -> None:
        self.waiter = waiter
        self.granted = False
        self.refused = False


class Admission:
    """The in-flight requests and runtime queue entries of one stream, and its waiters.

    :ivar in_flight: requests admitted and not yet finished on the device
    :ivar entries: runtime queue entries they hold (reserved or in the queue)
    """

    __slots__ = ("entries", "entry_budget", "in_flight", "limit", "queue")

    def __init__(self, limit: int, entry_budget: int) -> None:
        if entry_budget < ENTRIES_PER_REQUEST:
            raise ValueError(
                f"a stream's runtime queue capacity of {entry_budget} entries is too small: each "
                f"request needs {ENTRIES_PER_REQUEST} (itself and the completion event recorded "
                "after it)"
            )
        self.limit = limit
        self.entry_budget = entry_budget
        self.in_flight = 0
        self.entries = 0
        self.queue: deque[Ticket] = deque()

    def fits(self) -> bool:
        """Whether one more request fits both budgets now."""
        return (
            self.in_flight < self.limit and self.entries + ENTRIES_PER_REQUEST <= self.entry_budget
        )

    def try_enter(self) -> bool:
        """Admit at once if the request fits and nobody is queued ahead (FIFO fairness)."""
        if self.queue or not self.fits():
            return False
        self.in_flight += 1
        self.entries += ENTRIES_PER_REQUEST
        return True

    def enqueue(self, waiter: Any) -> Ticket:
        """Queue a caller; it is admitted once its ticket is granted."""
        ticket = Ticket(waiter)
        self.queue.append(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> list[Any]:
        """A queued caller gives up (cancelled): the waiters to wake.

        A ticket granted in the meantime holds its admission: it passes on to those in line.
        """
        if ticket.granted:
            return self.release(ENTRIES_PER_REQUEST)
        if not ticket.refused:
            self.queue.remove(ticket)
        return []

    def release(self, entries: int) -> list[Any]:
        """A request finished (or was never built) and gives back ``entries``: whom to wake."""
        self.in_flight -= 1
        self.entries -= entries
        queue = self.queue
        if not queue:
            return _NOBODY
        if len(queue) > 1 or entries != ENTRIES_PER_REQUEST:
            return self.grant()
        # one waiter for the one request's worth just freed: it fits (the common case of a
        # saturated stream, ``aio-ascend bench --only poll``)
        ticket = queue.popleft()
        ticket.granted = True
        self.in_flight += 1
        self.entries += ENTRIES_PER_REQUEST
        return [ticket.waiter]

    def refund(self, entries: int) -> list[Any]:
        """Reserved entries that turned out unneeded (batch formed): whom to wake."""
        self.entries -= entries
        return self.grant() if self.queue else []

    def grant(self) -> list[Any]:
        """Admit queued callers, oldest first, while they fit: their waiters."""
        woken = []
        queue = self.queue
        while queue and self.fits():
            ticket = queue.popleft()
            ticket.granted = True
            self.in_flight += 1
            self.entries += ENTRIES_PER_REQUEST
            woken.append(ticket.waiter)
        return woken

    def refuse_all(self) -> list[Any]:
        """On close: every queued caller is turned away (it holds nothing): their waiters."""
        woken = []
        while self.queue:
            ticket = self.queue.popleft()
            ticket.refused = True
            woken.append(ticket.waiter)
        return woken

    def reset(self) -> None:
        """The stream is gone (destroyed by force): nothing of it is in flight any more."""
        self.in_flight = 0
        self.entries = 0

    def __repr__(self) -> str:
        return (
            f"<Admission {self.in_flight}/{self.limit} entries {self.entries}/"
            f"{self.entry_budget} queued={len(self.queue)}>"
        )
