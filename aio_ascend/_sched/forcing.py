"""Closing one stream by force while the device runs on (``Stream.aclose(timeout=)``).

The loop marks the stream ``forced`` (the submitter fails its requests from then on, never
submitting them) and sends a :class:`LaneForce` through the submitter, behind every hop that
may still submit to the stream, to the poller, behind every batch the stream got. The poller
drops the stream's batches (their tasks fail as a forced device close fails them), destroys
the runtime stream by force, and sets ``done``: no thread touches the stream afterwards, and
nothing is reported complete for a stream destroyed under its work.

What the dropped work holds (host buffers, device allocations, batch events) is not released
then: a kernel or DMA may still be running on the device. It waits for the device's close.

Between streams. An event the stream was to record, whose record had not run when the stream
was destroyed, is never recorded on the device, and a stream waiting on it there waits for good
(the pinned runtime over ``tests/realrt``'s driver keeps such a wait pending, and the sim and the
acl double model that; real hardware is unconfirmed). Which records had run is read just before
the destroy (their status: complete or not): after it, the real runtime reports every task of
the stream as done, the dropped records included (it marks the stream force-recycled and
reclaims its tasks up to the tail: ``stream.cc:4636-4643``, ``stars_engine.cc:490-498``), so a
look afterwards tells nothing. A record that runs in the moment between the look and the
destroy is taken as dropped (its waiters fail though they could have run): failing is
recoverable, a wait for good is not. So such an event is marked
lost (:func:`lost_records`: ``EventRecord.error``), and a wait on it submitted afterwards is
refused (``WaitEvent.submit``) instead of blocking its stream; other streams' batches already
behind a wait on it are failed at once (:func:`stranded_by`), as the watchdog would fail them at
their deadline, with an error that says why. Their slots and holdings stay taken (``TIMED_OUT``):
should the record run after all, they finish late. The records queued on such a stream behind
the wait are lost in turn, and so on down a chain of streams (s1 -> s2 -> s3: s3 waits on s2's
event, which waits on s1's). Such a stream is *stranded*
(``Lane.stranded``, :func:`strand`): its queue can run nothing more, so new requests on it are
refused in the call (``Scheduler.check_usable``, with that error as cause), and a batch of it
the poller receives later fails at once the same way; closing it and opening a new one is the
way out (its close does not wait for what can never finish).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .._errors import TaskTimeoutError
from .._runtime import Runtime
from .._runtime.abi import ACL_EVENT_RECORDED_STATUS_COMPLETE
from .lane import Lane
from .watchdog import time_out
from .work import Batch, Delivery, Outcome, RecordEvent, Request, WaitEvent

__all__ = [
    "STRANDED",
    "STRANDED_RECORD",
    "LaneForce",
    "gave_up",
    "give_up",
    "lost_records",
    "strand",
    "stranded_by",
    "waits_on",
]


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
    error = TaskTimeoutError(f"{kind} did not finish before aclose() gave up")
    error.by_close = True
    return error


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


#: why an event is lost: its record was dropped by a forced close, or is queued behind a wait
#: on a lost event (its stream stranded)
_DROPPED_RECORD = "record_event was dropped by the forced close of its stream before it ran"
STRANDED_RECORD = (
    "record_event will not run: its stream waits for an event whose record was dropped by the "
    "forced close of another stream"
)


def lost_records(
    runtime: Runtime, batches: Iterable[Batch], why: str = _DROPPED_RECORD
) -> set[int]:
    """The events that ``batches`` (dropped by a forced close, or stranded) were to record
    and that do not read complete: each marked lost (its ``error``: later waits on it are
    refused). Returns their handles."""
    lost: set[int] = set()
    for batch in batches:
        for req in batch.requests:
            event = req.event if type(req) is RecordEvent else None
            if event is None or not event.recorded or event.error is not None:
                continue
            try:
                complete = runtime.query_event_status(event.handle) == (
                    ACL_EVENT_RECORDED_STATUS_COMPLETE
                )
            except Exception:  # (a broken context: nothing will complete)
                complete = False
            if not complete:
                event.error = TaskTimeoutError(f"{why}: the event may never complete")
                lost.add(event.handle)
    return lost


def stranded_by(
    lost: set[int], queues: Iterable[Iterable[Batch]], runtime: Runtime
) -> list[Delivery]:
    """On other streams, every outstanding batch from the first one with a wait on a ``lost``
    event on (a stream is FIFO: what follows the wait waits too): deliveries failing them.
    Marked timed out: their slots stay taken until the device really finishes them, if ever.

    A stranded stream's own event records behind the wait will never run either: they are
    lost in turn (:func:`lost_records`), and so on down every chain of streams waiting on
    each other (each event is marked lost once, so this ends)."""
    deliveries: list[Delivery] = []
    queues = list(queues)
    while lost:
        behind: list[Batch] = []
        for batches in queues:
            stranded = False
            for batch in batches:
                if not stranded:
                    stranded = waits_on(batch, lost)
                    if stranded:
                        strand(batch.lane)
                if not stranded:
                    continue
                behind.append(batch)
                if not batch.timed_out:
                    deliveries.extend(time_out(batch, STRANDED))
        lost = lost_records(runtime, behind, STRANDED_RECORD)
    return deliveries


def waits_on(batch: Batch, lost: set[int] | None = None) -> bool:
    """Whether ``batch`` has a wait on an event of ``lost`` (None: on any event marked lost,
    or whose record failed: a wait submitted before that may wait for good)."""
    for req in batch.requests:
        event = req.event if type(req) is WaitEvent else None
        if event is not None and (
            event.handle in lost if lost is not None else event.error is not None
        ):
            return True
    return False


#: why the work of a stranded stream fails (after its kind)
STRANDED = (
    "will not run: its stream waits for an event whose record was dropped by the forced close "
    "of another stream (close this stream and open a new one)"
)


def strand(lane: Lane) -> None:
    """``lane``'s queue waits for a record that will never run (poller thread, once): from now
    on its requests fail with this error as cause (see the module docstring)."""
    if lane.stranded is None:
        lane.stranded = TaskTimeoutError(
            "the stream waits for an event whose record was dropped by the forced close of "
            "another stream: it can run nothing more (close it and open a new one)"
        )
