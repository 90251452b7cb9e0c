"""Batches: which requests of a loop tick close a batch, and the hop that carries them.

The requests of one tick cross to the submitter in one hop. Per stream they form batches of at
most ``cap`` requests in call order, each followed by one recorded completion event; the
request after which that event is recorded *closes* the batch and keeps the entry it reserved
for it, the others give that entry back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .lane import Lane
from .work import Request

__all__ = ["Hop", "form_batches"]


def form_batches(requests: Sequence[Request], cap: int) -> dict[Lane, int]:
    """Mark the requests that close a batch; the entries to refund per stream.

    Per stream, every ``cap``-th request and the last one close a batch. A request that does
    not close one needs one entry instead of the two it reserved.
    """
    remaining: dict[Lane, int] = {}
    for request in requests:
        remaining[request.lane] = remaining.get(request.lane, 0) + 1
    position: dict[Lane, int] = {}
    refunds: dict[Lane, int] = {}
    for request in requests:
        lane = request.lane
        index = position[lane] = position.get(lane, 0) + 1
        if index % cap == 0 or index == remaining[lane]:
            request.closes_batch = True
        else:
            request.entries = 1
            refunds[lane] = refunds.get(lane, 0) + 1
    return refunds


class Hop:
    """One tick's requests on their way to the submitter, with the deadline of their tasks.

    Either the submitter takes it or the watchdog expires it (when the submitter did not get
    to it in time), never both: :meth:`take` and :meth:`expire` decide under one lock.
    """

    __slots__ = ("_lock", "_state", "deadline", "requests")

    def __init__(self, requests: list[Request], deadline: float, lock: threading.Lock) -> None:
        self.requests = requests
        self.deadline = deadline
        self._lock = lock
        self._state = 0  # 0 waiting, 1 taken, 2 expired

    def take(self) -> bool:
        """The submitter starts on it: False if the watchdog expired it first."""
        with self._lock:
            if self._state:
                return False
            self._state = 1
            return True

    def expire(self) -> bool:
        """The watchdog gives up on it: False if the submitter has taken it."""
        with self._lock:
            if self._state:
                return False
            self._state = 2
            return True
