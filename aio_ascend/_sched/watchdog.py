"""The per-device watchdog: which batches have outlived ``task_timeout``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._errors import TaskTimeoutError
from .work import Delivery, Outcome

if TYPE_CHECKING:
    from .work import Batch

__all__ = ["STALLED", "expire", "log_expired", "time_out"]

#: why a stream refuses a request that would wait for admission when every slot it has is held
#: by work the watchdog failed (the device has not finished it, and may never)
STALLED = (
    "not queued: every slot of its stream is held by work that did not finish within "
    "task_timeout (the stream looks hung; its slots come back if the device finishes that "
    "work): close the stream (aclose(timeout=...)) and use another"
)

log = logging.getLogger("aio_ascend")


def log_expired(device_id: int, deliveries: Iterable[Delivery], task_timeout: float) -> None:
    """Say that the watchdog failed tasks (a decision the user should hear of: WARNING); the
    library's own quiet tasks are not counted, as ``stats()`` does not count them."""
    failed = sum(not request.quiet for request, _, _ in deliveries)
    if failed:
        log.warning(
            "device %d: the watchdog failed %d task(s) with TaskTimeoutError "
            "(not finished within task_timeout=%gs)",
            device_id,
            failed,
            task_timeout,
        )


def expire(queues: Iterable[Iterable[Batch]], now: float, task_timeout: float) -> list[Delivery]:
    """Mark the batches past their deadline as timed out: deliveries failing their requests.

    ``queues`` holds each stream's outstanding batches, oldest first (deadlines grow along
    a stream, so the scan of one stream stops at the first batch still in time). A batch is
    timed out once; its slots stay taken until the device really finishes it.
    """
    deliveries: list[Delivery] = []
    for batches in queues:
        for batch in batches:
            if batch.deadline > now:
                break
            if batch.timed_out:
                continue
            deliveries.extend(
                time_out(
                    batch,
                    f"did not finish within task_timeout={task_timeout:g}s (the device may "
                    "still be running it)",
                )
            )
    return deliveries


def time_out(batch: Batch, why: str) -> list[Delivery]:
    """Mark ``batch`` timed out: deliveries failing each request with a ``TaskTimeoutError``
    saying ``"<kind> <why>"``. Its slots and holdings stay taken until the device really
    finishes it (it arrives later as ``FINISHED_LATE``)."""
    batch.timed_out = True
    deliveries: list[Delivery] = []
    for request in batch.requests:
        request.submitted_at = batch.submitted
        error = TaskTimeoutError(f"{request.kind} {why}")
        deliveries.append((request, error, Outcome.TIMED_OUT))
    return deliveries
