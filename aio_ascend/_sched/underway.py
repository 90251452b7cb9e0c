"""``Underway``: what the submitter thread is in the middle of, for those who must stop it.

The submitter works through one hop (a tick's requests) or one parked stream's resume at a time.
Two parties need to know what that is while it runs:

- a device close that finds the thread still alive (stuck in a runtime call): the streams it may
  be inside a call on must not be destroyed under it (:meth:`Underway.streams`), and its
  requests are failed and leaked with it (:meth:`Underway.requests`);
- the thread itself, when a defect of ours raises in the middle (:meth:`Underway.lost`): the
  requests must fail rather than wait for good, but each exactly once. Some are settled already:
  in a batch handed to the poller (which reports them), refused (their failures not yet posted,
  kept here so they go as they were), or parked or carried again (a later resume settles them).
  The rest failed *somewhere* in between, and whether they reached the device is unknown, so
  what they hold must wait for the close.

Written by the submitter thread only; read by a close (on the loop) that abandons it, when the
thread may be anywhere: a stale read only names a hop it has just left.
"""

from __future__ import annotations

from collections.abc import Iterable

from .batching import Hop
from .lane import Lane
from .work import Delivery, Request

__all__ = ["Underway"]


class Underway:
    """The hop or resume the submitter thread is in, and what of it is settled already.

    :ivar hop: the hop being submitted
    :ivar resuming: the parked stream being resumed, and the requests it resumes with
    :ivar handed: the request lists of the batches handed to the poller since :meth:`begin`
    :ivar failing: refusals since :meth:`begin` not yet posted (emptied before posting)
    """

    __slots__ = ("failing", "handed", "hop", "resuming")

    def __init__(self) -> None:
        self.hop: Hop | None = None
        self.resuming: tuple[Lane, list[Request]] | None = None
        self.handed: list[list[Request]] = []
        self.failing: list[Delivery] = []

    def begin(self) -> list[Delivery]:
        """A hop or a resume starts: its list of refusals (handed batches start anew too)."""
        self.handed = []
        self.failing = []
        return self.failing

    def end(self) -> None:
        """The hop or resume is done with (before its refusals are posted): no reference to
        its work may outlive it here, while the thread waits for the next."""
        self.handed = []
        self.failing = []

    def requests(self) -> list[Request]:
        """The requests of the hop or resume under way (none between them)."""
        hop, resuming = self.hop, self.resuming
        if hop is not None:
            return list(hop.requests)
        return list(resuming[1]) if resuming is not None else []

    def streams(self) -> set[int]:
        """The streams the thread may be inside a runtime call on, or call on next."""
        hop, resuming = self.hop, self.resuming
        busy = {req.lane.handle for req in hop.requests} if hop is not None else set()
        if resuming is not None:
            busy.add(resuming[0].handle)
        return busy

    def lost(self, still_queued: Iterable[Request]) -> tuple[list[Delivery], list[Request]]:
        """A defect raised in the middle: the refusals to post as they were, and the requests
        nobody settled (to fail, their holdings kept for the close). ``still_queued``: the
        requests parked or carried now (settled by a later resume). Nothing is under way after."""
        requests, failures = self.requests(), self.failing
        settled = {id(req) for batch in self.handed for req in batch}
        settled.update(id(req) for req, _, _ in failures)
        settled.update(id(req) for req in still_queued)
        self.hop = self.resuming = None
        self.end()
        return failures, [req for req in requests if id(req) not in settled]
