"""Closing one stream by force while the device runs on (``Stream.aclose(timeout=)``).

The loop marks the stream ``forced`` (the submitter fails its requests from then on, never
submitting them) and sends a :class:`LaneForce` through the submitter, behind every hop that
may still submit to the stream, to the poller, behind every batch the stream got. The poller
drops the stream's batches (their tasks fail as a forced device close fails them), destroys
the runtime stream by force, and sets ``done``: no thread touches the stream afterwards, and
nothing is reported complete for a stream destroyed under its work.

What the dropped work holds (host buffers, device allocations, batch events) is not released
then: a kernel or DMA may still be running on the device. It waits for the device's close.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .._errors import TaskTimeoutError
from .lane import Lane
from .work import Batch, Delivery, Outcome, Request

__all__ = ["LaneForce", "gave_up", "give_up"]


class LaneForce:
    """One stream to destroy by force, on its way from the loop to the poller.

    :ivar done: set by the poller once the stream is destroyed and its batches dropped
    """

    __slots__ = ("done", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.done = threading.Event()


def gave_up(kind: str) -> TaskTimeoutError:
    """The error of a task a forced close (of its stream or its device) gave up on."""
    return TaskTimeoutError(f"{kind} did not finish before aclose() gave up")


def give_up(batches: Iterable[Batch]) -> tuple[list[Delivery], list[Request]]:
    """Deliveries failing ``batches`` of a stream destroyed by force, and their requests,
    whose resources must wait for the device's close."""
    deliveries: list[Delivery] = []
    held: list[Request] = []
    for batch in batches:
        # A batch the watchdog failed already: only its slots are given back now.
        outcome = Outcome.FINISHED_LATE if batch.timed_out else Outcome.FINISHED
        deliveries.extend((req, gave_up(req.kind), outcome) for req in batch.requests)
        held.extend(batch.requests)
    return deliveries, held
