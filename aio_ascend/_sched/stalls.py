"""Streams whose oldest batch does not complete: the poller asks the stream itself.

The poller learns that a batch finished by querying the event recorded after it, and that the
device failed by a query that raises. On the real CANN runtime a failed task does neither:
STARS stops the stream's queue at the failed task until the runtime has read its error
completion, and only a stream synchronize reads completions (``aclrtSynchronizeStream*``:
stream.cc:4438 and stars_engine.cc:1398-1470 of the pinned runtime; an event query reads the
queue head alone, npu_driver_res.cc:861-878). The event after the failed task stays NOT_READY
for ever, so without a probe every task of the stream would wait for its task timeout (600 s
by default), and a stream synchronize with it.

So a stream whose oldest batch has been outstanding for :data:`STALL_PROBE_S` is synchronized
with a short timeout (:data:`STALL_PROBE_WAIT_MS`): a failure it reports is the device's
fault, as a failing query's is; a timeout means the work is still running. The wait before
the next probe of the same batch doubles up to :data:`STALL_PROBE_MAX_S`, so a long kernel
costs a few short probes a second, and work that completes within the first wait costs
nothing but a dictionary entry per stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .work import Batch

__all__ = ["STALL_PROBE_MAX_S", "STALL_PROBE_S", "STALL_PROBE_WAIT_MS", "StallProbes"]

#: how long a stream's oldest batch is outstanding before the stream is first probed
STALL_PROBE_S = 0.05
#: the longest wait between two probes of one batch
STALL_PROBE_MAX_S = 1.0
#: how long one probe may block the poller (ms; the runtime refuses 0: acl-runtime.md §2.1)
STALL_PROBE_WAIT_MS = 1


class StallProbes:
    """When to probe which stream (poller thread only): per stream handle, the batch at its
    head when first seen, when to probe it next and the wait after that."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Batch, float, float]] = {}

    def due(self, outstanding: dict[int, deque[Batch]], now: float) -> list[int]:
        """The streams to probe now (each one's next probe is put off as it is returned)."""
        seen = self._seen
        probe: list[int] = []
        for handle, batches in outstanding.items():
            if not batches:
                continue
            head = batches[0]
            known = seen.get(handle)
            if known is None or known[0] is not head:  # a new oldest batch: its clock starts
                seen[handle] = (head, now + STALL_PROBE_S, STALL_PROBE_S)
                continue
            _, at, wait = known
            if now >= at:
                wait = min(wait * 2, STALL_PROBE_MAX_S)
                seen[handle] = (head, now + wait, wait)
                probe.append(handle)
        return probe

    def forget(self, handles: Iterable[int]) -> None:
        """Streams with nothing outstanding any more."""
        for handle in handles:
            self._seen.pop(handle, None)

    def clear(self) -> None:
        """Nothing is outstanding (the device faulted or closed)."""
        self._seen.clear()
