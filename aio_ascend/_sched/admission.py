"""Per-stream admission: a bound on requests in flight and on runtime queue entries.

Two budgets apply to each stream: at most ``limit`` requests in flight (the user's
``max_in_flight``), and at most ``entry_budget`` runtime queue entries (the backend's stream
capacity), so that a submitting call can never block on a full queue. Every request takes one
entry of its own and may take one more for the completion event recorded after its batch.

The life of one slot (all on the loop thread):

1. admitted (:meth:`Admission.try_enter`, or a waiter's grant): ``in_flight`` +1, ``entries``
   +:data:`ENTRIES_PER_REQUEST` (2);
2. the batch is formed (``Scheduler.flush``): a request that does not close its batch gives back
   the event's entry (:meth:`Admission.refund`; its ``Request.entries`` becomes 1);
3. the request's completion is resolved on the loop (``DeliveryQueue``), or it is refused or
   dropped before submission: :meth:`Admission.release` gives back the slot and its entries. A
   task the watchdog failed after its submission keeps both until the device has really finished
   it (the queue entries are still taken on the device): :meth:`Admission.time_out`.

So ``in_flight <= limit`` and ``entries <= entry_budget`` hold at all times, and what the
library has queued on a stream never exceeds its capacity.

Fairness. Callers that do not fit wait in FIFO order; while anyone waits, a newcomer is not
admitted at once even if it would fit (:meth:`try_enter` looks at the queue first), so nobody is
overtaken. Every release, refund or expiry grants the oldest waiters that now fit.

Prepaid slots. Waking a waiter is the expensive part of admission (a future, a loop callback and
a resumed coroutine chain: several microseconds, against well under one for an admission that
does not wait). A saturated stream used to wake one waiter per finished request, so a launcher
that loops suspended once per launch. Instead a granted waiter gets up to :data:`GRANT_PER_WAKE`
(64) slots at once, oldest waiter first: one for the call that waited, the rest *prepaid* for
the calls the same coroutine makes before it next suspends (:meth:`Admission.adopt`). Nobody
else may use them: the caller's identity (its task) is checked, so a newcomer never overtakes
the queue. When the owner suspends, whatever it did not use goes back (:meth:`Admission.expire`,
called one loop turn later by the scheduler, for that adoption's ``generation`` only) to the
next waiters in line. A stream has one owner of prepaid slots at a time: adopting new ones
expires the previous owner's first.

A hung stream. Waiters wait for capacity that finishing work frees. Once every slot taken is
held by work the watchdog has failed (the device has not finished it, and may never), nothing
will free one: the stream is *stalled* (:meth:`Admission.stalled`). Its waiters are turned away
then (their tickets ``refused`` and ``hung``), and so is anyone who would wait while it stays
so; should the device finish that work after all, its slots come back and admission goes on.

Cancellation. A waiter cancelled before its grant leaves the queue and holds nothing; one
cancelled after its grant but before it resumed (:meth:`Admission.withdraw`) passes its slots,
prepaid ones included, to those in line. On close, :meth:`Admission.refuse_all` turns every
waiter away (its ticket is ``refused``: it holds nothing) and drops the prepaid slots;
:meth:`Admission.reset` forgets everything once the stream was destroyed by force.

Pure bookkeeping: nothing here wakes anybody, and there are no locks (only the loop thread calls
it, through ``Scheduler`` and ``DeliveryQueue``); each method returns the waiters the caller
must wake, so the decisions are testable without a loop (``tests/unit/test_decisions.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["ENTRIES_PER_REQUEST", "GRANT_PER_WAKE", "Admission", "Ticket"]

#: entries a request reserves: its own, and its share of a batch completion event at most
ENTRIES_PER_REQUEST = 2
#: slots one granted waiter gets at most (its call's and those prepaid for its next calls)
GRANT_PER_WAKE = 64
_NOBODY: list[Any] = []  # returned for "wake nobody" (never appended to)


def _nobody() -> object:
    return None


class Ticket:
    """One caller waiting for admission: ``granted`` once admitted (with ``extra`` more slots
    for its next calls), ``refused`` when the stream or device closed first (it then holds
    nothing)."""

    __slots__ = ("extra", "granted", "hung", "refused", "waiter")

    def __init__(self, waiter: Any) -> None:
        self.waiter = waiter
        self.granted = False
        self.refused = False
        self.hung = False  # (refused since the stream stalled, not since it closed)
        self.extra = 0


class Admission:
    """The in-flight requests and runtime queue entries of one stream, and its waiters.

    :ivar in_flight: requests admitted and not yet finished on the device (prepaid slots
        included)
    :ivar entries: runtime queue entries they hold (reserved or in the queue)
    :ivar prepaid: slots admitted ahead for the calls of ``owner`` (see the module docstring)
    :ivar generation: counts adoptions (an expiry names the one it is for)
    :ivar timed_out: slots held by requests the watchdog failed that the device has not
        finished yet
    """

    __slots__ = (
        "current",
        "entries",
        "entry_budget",
        "generation",
        "granted_ahead",
        "in_flight",
        "limit",
        "owner",
        "prepaid",
        "queue",
        "timed_out",
    )

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
        self.prepaid = 0
        #: slots granted to queued callers for their later calls, before they resume (they
        #: become ``prepaid`` then): counted in ``in_flight``, used by no request yet
        self.granted_ahead = 0
        self.owner: object = None
        #: who is calling (the running task): set with the first prepaid slots
        self.current: Callable[[], object] = _nobody
        self.generation = 0
        self.timed_out = 0

    def fits(self) -> bool:
        """Whether one more request fits both budgets now."""
        return (
            self.in_flight < self.limit and self.entries + ENTRIES_PER_REQUEST <= self.entry_budget
        )

    def unsettled(self) -> int:
        """Requests admitted and not finished: ``in_flight`` without the slots granted for
        calls not made yet (prepaid, or granted ahead to a caller that has not resumed)."""
        return self.in_flight - self.prepaid - self.granted_ahead

    def live(self) -> bool:
        """Whether requests still run that the watchdog has not failed (those it failed keep
        their slots until the device finishes them, which may be never)."""
        return self.unsettled() > self.timed_out

    def try_enter(self) -> bool:
        """Admit at once: on a slot prepaid for this caller, or if the request fits and nobody
        is queued ahead (FIFO fairness)."""
        if self.prepaid and self.owner is self.current():
            self.prepaid -= 1  # (counted when it was granted)
            return True
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
            self.granted_ahead -= ticket.extra
            slots, ticket.extra = 1 + ticket.extra, 0
            return self.release(ENTRIES_PER_REQUEST * slots, slots)
        if not ticket.refused:
            self.queue.remove(ticket)
        return []

    def release(self, entries: int, count: int = 1) -> list[Any]:
        """``count`` requests finished (or were never built) and give back ``entries``: whom
        to wake."""
        self.in_flight -= count
        self.entries -= entries
        return self.grant() if self.queue else _NOBODY

    def refund(self, entries: int) -> list[Any]:
        """Reserved entries that turned out unneeded (batch formed): whom to wake."""
        self.entries -= entries
        return self.grant() if self.queue else []

    def grant(self) -> list[Any]:
        """Admit queued callers, oldest first, while they fit, each with up to
        :data:`GRANT_PER_WAKE` slots: their waiters."""
        woken = []
        queue = self.queue
        while queue:
            # as many slots as both budgets have room for, at most GRANT_PER_WAKE
            slots = min(
                GRANT_PER_WAKE,
                self.limit - self.in_flight,
                (self.entry_budget - self.entries) // ENTRIES_PER_REQUEST,
            )
            if slots <= 0:
                break
            ticket = queue.popleft()
            ticket.granted = True
            self.in_flight += slots
            self.entries += ENTRIES_PER_REQUEST * slots
            ticket.extra = slots - 1
            self.granted_ahead += slots - 1
            woken.append(ticket.waiter)
        return woken

    def stalled(self) -> bool:
        """Whether nothing but the device finishing work the watchdog failed can free a slot,
        and one more request does not fit: a wait now could last for good."""
        return 0 < self.in_flight <= self.timed_out and not self.fits()

    def time_out(self) -> list[Any]:
        """The watchdog failed a request that keeps its slot (it finishes late, or never):
        whom to wake, turned away (``hung``) if the stream has stalled."""
        self.timed_out += 1
        if not self.queue or not self.stalled():
            return _NOBODY
        woken = []
        while self.queue:
            ticket = self.queue.popleft()
            ticket.refused = ticket.hung = True
            woken.append(ticket.waiter)
        return woken

    def finished_late(self) -> None:
        """A request the watchdog failed has finished on the device (its slot is released
        next, as any other)."""
        self.timed_out -= 1

    def adopt(self, ticket: Ticket, owner: object, current: Callable[[], object]) -> list[Any]:
        """A granted caller resumes (``owner``: its task; ``current()`` names the running
        one): its extra slots are prepaid for its next calls, and the slots an earlier owner
        left unused go to the queue. Returns whom to wake."""
        woken = self.expire() if self.prepaid else _NOBODY
        self.granted_ahead -= ticket.extra
        self.prepaid, ticket.extra = ticket.extra, 0
        self.owner = owner
        self.current = current
        self.generation += 1
        return woken

    def expire(self, generation: int | None = None) -> list[Any]:
        """The prepaid slots' owner has suspended (or ``generation``'s owner has): what it
        did not use goes back. Returns whom to wake."""
        unused = self.prepaid
        if not unused or (generation is not None and generation != self.generation):
            return _NOBODY
        self.prepaid = 0
        self.owner = None
        return self.release(ENTRIES_PER_REQUEST * unused, unused)

    def refuse_all(self) -> list[Any]:
        """On close: every queued caller is turned away (it holds nothing), prepaid slots are
        dropped: the waiters to wake."""
        unused, self.prepaid, self.owner = self.prepaid, 0, None
        self.in_flight -= unused
        self.entries -= ENTRIES_PER_REQUEST * unused
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
        self.prepaid = 0
        self.timed_out = 0
        self.owner = None

    def __repr__(self) -> str:
        return (
            f"<Admission {self.in_flight}/{self.limit} entries {self.entries}/"
            f"{self.entry_budget} queued={len(self.queue)}>"
        )
