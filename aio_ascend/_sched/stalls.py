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

Who probes. A probe's 1 ms is not a bound on the real runtime: when it times out, the runtime
takes a snapshot, a control task it waits for with no timeout (``api_impl.cc:1731-1733,
6360-6381``). Over our driver that wait took seconds, and once a busy stream had been destroyed
by force it never ended. Run by the poller, it froze every stream's completions and the
watchdog with it. So the probes run on a thread of their own, :class:`Prober`
(``aio_ascend-probe-<device>``), one at a time, and report back through the poller's inbox
(:class:`Probed`); the poller asks for the next one only once the last has reported, goes on
completing the other streams' work meanwhile, and destroys a stream closed by force only when
no probe is inside a call on it (a forced close of the stream being probed waits for the
probe's report). A probe that never returns leaves stalls to the watchdog, and the thread to
the device's close, which spares its stream (:attr:`Prober.probing`) and abandons it as stuck.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable

from .._errors import StreamSyncTimeoutError
from .._runtime import Runtime
from .work import Batch

__all__ = [
    "STALL_PROBE_MAX_S",
    "STALL_PROBE_S",
    "STALL_PROBE_WAIT_MS",
    "Probed",
    "Prober",
    "StallProbes",
]

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


class Probed:
    """One probe's report, through the poller's inbox: the stream, and the error the runtime
    reported (``None``: still running, or done)."""

    __slots__ = ("error", "handle")

    def __init__(self, handle: int, error: BaseException | None) -> None:
        self.handle = handle
        self.error = error


class Prober:
    """The thread ``aio_ascend-probe-<device>``: one stall probe at a time, off the poller.

    :param report: where each :class:`Probed` goes (the poller's inbox)
    """

    def __init__(self, runtime: Runtime, device_id: int, report: Callable[[Probed], None]) -> None:
        self._runtime = runtime
        self._report = report
        self._jobs: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._stop_asked = False
        #: the stream a probe is synchronizing now, else None (read by the close: a stream is
        #: never destroyed under a thread inside a call on it)
        self.probing: int | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-probe-{device_id}", daemon=True
        )

    def probe(self, handle: int) -> None:
        """Probe ``handle`` (the poller thread: once the last probe has reported). The thread
        starts with the first probe: most devices never have a stream stall that long."""
        if self.thread.ident is None:
            self.thread.start()
        self._jobs.put(handle)

    def stop(self) -> None:
        """Exit before the next probe (any thread; a probe under way reports first)."""
        self._stop_asked = True
        self._jobs.put(None)

    def _main(self) -> None:
        self._runtime.set_current_context()
        while True:
            handle = self._jobs.get()
            if handle is None or self._stop_asked:
                return
            error: BaseException | None = None
            self.probing = handle
            try:
                self._runtime.synchronize_stream(handle, STALL_PROBE_WAIT_MS)
            except StreamSyncTimeoutError:
                pass  # still running
            except BaseException as exc:
                error = exc
            self.probing = None
            self._report(Probed(handle, error))
