"""Batches: which requests of a loop tick close a batch, and the hop that carries them.

The requests of one tick cross to the submitter in one hop. Per stream they form batches of at
most ``cap`` requests (in call order; the first batch of a hop may be the short one), each
followed by one recorded completion event; the
request after which that event is recorded *closes* the batch and keeps the entry it reserved
for it, the others give that entry back. An event's record always closes its batch
(``Request.ends_batch``): a batch's tasks complete together, and ``await event`` must not wait
for work queued after the record (nor hang behind a kernel that hangs there).
"""

from __future__ import annotations

from collections.abc import Sequence

from .admission import ENTRIES_PER_REQUEST
from .lane import Lane
from .work import Request

__all__ = ["Hop", "flush_now", "form_batches"]


def flush_now(pending: int, flush_at: int) -> bool:
    """Whether a pending batch of ``pending`` requests goes out now rather than at tick end."""
    return pending >= flush_at


def form_batches(requests: Sequence[Request], cap: int) -> dict[Lane, int]:
    """Mark the requests that close a batch; the entries to refund per stream. Each stream's
    latest task is noted as handed over (``Lane.flushed``).

    Per stream, counting from its last request of the hop backwards, every ``cap``-th one
    closes a batch (so the last one always does). A request that does not close one needs
    one entry instead of the two it reserved. One pass, from the end: this runs for every
    request, so it is part of the host CPU per launch that ``aio-ascend bench --only
    raw,poll,plan,handler,roundtrip --repeats 3`` reports.
    """
    if len(requests) == 1:  # batch_cap=1, or a lone request: it closes its batch
        request = requests[0]
        request.closes_batch = True
        request.lane.flushed = request.lane.last
        return {}
    counts: dict[Lane, int] = {}
    get = counts.get
    for request in reversed(requests):
        lane = request.lane
        behind = get(lane, 0)
        counts[lane] = behind + 1
        if behind % cap == 0:
            request.closes_batch = True
        elif request.ends_batch:  # (rare: laid out again, record by record)
            return _ending_early(requests, cap)
        else:
            request.entries = 1
    refunds = {}
    for lane, count in counts.items():
        lane.flushed = lane.last
        refund = count - (count + cap - 1) // cap
        if refund:
            refunds[lane] = refund
    return refunds


def _ending_early(requests: Sequence[Request], cap: int) -> dict[Lane, int]:
    # form_batches where a request that ends its batch is not where the count would end one:
    # the same layout, each stream's count starting again after it
    in_batch: dict[Lane, int] = {}  # per stream: requests behind this one in its batch
    refunds: dict[Lane, int] = {}
    for request in reversed(requests):
        lane = request.lane
        behind = in_batch.get(lane, 0)
        if behind == 0 or behind == cap or request.ends_batch:
            request.closes_batch = True
            request.entries = ENTRIES_PER_REQUEST
            in_batch[lane] = 1
        else:
            request.closes_batch = False
            request.entries = 1
            in_batch[lane] = behind + 1
            refunds[lane] = refunds.get(lane, 0) + 1
    for lane in in_batch:
        lane.flushed = lane.last
    return refunds


class Hop:
    """One tick's requests on their way to the submitter, with the deadline of their tasks.

    Either the submitter takes it or the watchdog expires it (when the submitter did not get
    to it in time), never both: :meth:`take` and :meth:`expire` race for one token, and
    ``list.pop`` is atomic (no lock per hop: batch_cap=1 makes a hop of every request).
    """

    __slots__ = ("_token", "deadline", "requests")

    def __init__(self, requests: list[Request], deadline: float) -> None:
        self.requests = requests
        self.deadline = deadline
        self._token = [True]

    def take(self) -> bool:
        """The submitter starts on it: False if the watchdog expired it first."""
        try:
            return self._token.pop()
        except IndexError:
            return False

    def expire(self) -> bool:
        """The watchdog gives up on it: False if the submitter has taken it."""
        try:
            return self._token.pop()
        except IndexError:
            return False
