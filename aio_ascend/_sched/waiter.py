"""Block mode's waiter thread (``aio_ascend-wait-<device>``): sleeps in the runtime on the
oldest batch event, then pokes the poller, so that the oldest work is seen complete at once
without polling for it.

What it is for. In poll mode the poller's backoff tops out at 1 ms, which costs idle CPU while
long kernels run. ``completion="block"`` starts this thread beside the poller: it blocks in
``synchronize_event`` (GIL released) on one event, and when that returns it puts ``POKE`` in the
poller's inbox, which ends the poller's wait at once. The poller keeps polling every stream,
only less often (up to every 4 ms), so a long task on one stream never delays the completions of
the others.

Invariants. The waiter decides nothing: it never resolves, releases or fails a task, and its
only effect on the scheduler is a poke. The poller stays the one thread that observes
completions, so a wrong or stale target costs at most latency, never correctness. That matters
because batch events are recycled: the poller gives an event back once its batch completed, and
the submitter may record it again at once; a waiter still (or newly) sleeping on it then wakes
later than it might (or pokes for a batch the poller has seen already), and the poller's own
queries settle which batch is done.

Who touches what. The poller sets the target (:meth:`watch`, after every round: the head batch
with the earliest deadline, or ``None``); only a change sets ``_changed``. The waiter thread
reads ``_target`` and writes its counters (``sync_timeouts``, summed by ``Device.stats``). The
loop calls :meth:`stop` at the close (or a finalizer, for a device collected unclosed).

Timeout slices. The wait is cut into slices that grow while the same work stays unfinished: 50
ms doubling to 1 s (:func:`next_slice`), back to 50 ms once an event completes. On CANN each
timed-out ``aclrtSynchronizeEventWithTimeout`` logs two ERROR lines, so a long kernel costs at
most two such lines a second, not two hundred. A failing sync (a fault, an event that went away)
is ignored here: the poller's next query reports it; one that keeps failing (until a sleep
succeeds) is tried again ever more slowly (1 ms doubling to a slice), never in a tight loop.
With nothing to watch the thread sleeps on ``_changed`` (at most 0.5 s at a time).

Shutdown. :meth:`stop` sets a flag and wakes an idle thread; a thread inside a sync leaves when
its slice ends, at most 1 s later (``MAX_SLICE_MS``), within the 2 s the device's close gives
its threads to exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .._errors import EventSyncTimeoutError
from .._runtime import Runtime
from .binding import bound_for_life
from .counters import Counters

__all__ = ["FIRST_SLICE_MS", "MAX_SLICE_MS", "Waiter", "next_slice"]

FIRST_SLICE_MS = 50
MAX_SLICE_MS = 1000
#: how long an idle waiter sleeps before it looks again (it is also woken on new work)
_IDLE_S = 0.5


def next_slice(slice_ms: int, timed_out: bool) -> int:
    """The next timeout slice: doubled after a timeout (up to MAX_SLICE_MS), else the first."""
    return min(slice_ms * 2, MAX_SLICE_MS) if timed_out else FIRST_SLICE_MS


class Waiter:
    """The thread ``aio_ascend-wait-<device>``.

    :param poke: tells the poller to look now (non-blocking)
    """

    def __init__(self, *, runtime: Runtime, device_id: int, poke: Callable[[], None]) -> None:
        self._runtime = runtime
        self._poke = poke
        self.counters = Counters()
        self._target: int | None = None  # the event to sleep on, set by the poller
        self._changed = threading.Event()
        self._stop = False
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-wait-{device_id}", daemon=True
        )

    def watch(self, event: int | None) -> None:
        """The poller's oldest outstanding batch event (``None``: nothing outstanding)."""
        if event != self._target:
            self._target = event
            self._changed.set()

    def stop(self) -> None:
        """Ask the thread to exit (after the slice it is sleeping in, at most MAX_SLICE_MS)."""
        self._stop = True
        self._changed.set()

    def _main(self) -> None:
        with bound_for_life(self._runtime):
            self._serve()

    def _serve(self) -> None:
        slice_ms = FIRST_SLICE_MS
        backoff = 0.0  # while the sleep itself keeps failing: how long before the next try
        while not self._stop:
            event = self._target
            if event is None:
                self._changed.wait(_IDLE_S)
                self._changed.clear()
                continue
            self._changed.clear()
            try:
                self._runtime.synchronize_event(event, slice_ms)
            except EventSyncTimeoutError:
                self.counters.sync_timeouts += 1
                slice_ms = next_slice(slice_ms, True)
                continue
            except Exception:
                # A fault, or the event went away: the poller's next query tells. An error
                # that persists (the poller has not moved on) is retried ever more slowly, up
                # to a slice apart, rather than a thousand times a second.
                backoff = min(2 * backoff or 0.001, slice_ms / 1000)
                self._poke()
                self._changed.wait(backoff)
                continue
            backoff = 0.0
            slice_ms = next_slice(slice_ms, False)
            self._poke()
            if self._target == event:
                # Not moved on yet: wait for the poller's next look (or a short while).
                self._changed.wait(0.001)
