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
6360-6381``). Over our driver that wait took seconds (once 16.5 s), and the real runtime
promises no bound. Run by the poller, it froze every stream's completions and the watchdog with
it. So the probes run on a thread of their own, :class:`Prober`
(``aio_ascend-probe-<device>``), one at a time, and report back through the poller's inbox
(:class:`Probed`); the poller asks for the next one only once the last has reported, goes on
completing the other streams' work meanwhile. A probe that never returns leaves stalls to the
watchdog, and the thread to the device's close, which abandons it as stuck.

Who destroys a probed stream. A probe is asked for on the poller thread and runs later on the
prober's; meanwhile the stream's work may finish and the loop close it, or a forced close
destroy it. Destroyed under the probe, the real runtime frees the stream under the thread
synchronizing on it (``stream.cc:4682-4686``, ``docs/cann-support.md`` §13.3); destroyed
before it, the probe reads "not a live stream", which is no fault of the device. So every
destroy of a library stream, on any thread, goes through :meth:`Prober.retire`: a stream with
a probe asked for and not over is destroyed by the prober right after that probe (whose report
then carries no error: nobody waits on that stream's work), any other at once. Once the
device's close has stopped the prober, such a stream is left to the close instead
(:meth:`Prober.take_left`), which destroys it after joining the thread: a destroy by force
first looks at the stream on acl, which can take seconds on the real runtime, and the join is
bounded. A probe stuck for good thereby leaks its stream, never frees it under the call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable

from .._errors import StreamSyncTimeoutError
from .._runtime import Runtime
from .binding import bound_for_life
from .lane import Lane
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

log = logging.getLogger("aio_ascend")


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
    """The thread ``aio_ascend-probe-<device>``: one stall probe at a time, off the poller, and
    the one place a library stream is destroyed (:meth:`retire`).

    :param report: where each :class:`Probed` goes (the poller's inbox)
    """

    def __init__(self, runtime: Runtime, device_id: int, report: Callable[[Probed], None]) -> None:
        self._runtime = runtime
        self._device_id = device_id
        self._report = report
        self._jobs: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        #: guards the fields below: the poller asks for probes, the prober runs them, and the
        #: loop, the poller and the close destroy streams
        self._lock = threading.Lock()
        self._stop_asked = False
        self._target: int | None = None  # the stream of the probe asked for and not over
        self._retired: dict[int, tuple[Lane, Callable[[int], None]]] = {}
        self._left: list[Lane] = []  # retired, then left to the close by a stopping prober
        self.thread = threading.Thread(
            target=self._main, name=f"aio_ascend-probe-{device_id}", daemon=True
        )

    def probe(self, handle: int) -> None:
        """Probe ``handle`` (the poller thread: once the last probe has reported; nothing once
        the stop is asked). The thread starts with the first probe: most devices never have a
        stream stall that long."""
        with self._lock:  # (a stop's None goes after the job, never before: see retire)
            if self._stop_asked:
                return
            self._target = handle
            if self.thread.ident is None:
                self.thread.start()
            self._jobs.put(handle)

    def retire(self, lane: Lane, destroy: Callable[[int], None]) -> None:
        """Destroy ``lane``'s runtime stream with ``destroy`` (any thread; a lane destroyed
        already is left alone): at once (``destroy``'s error propagates), or, while a probe
        of it is asked for and not over, by the prober right after that probe."""
        with self._lock:
            if lane.destroyed:
                return
            lane.destroyed = True  # (or as good as: nobody else may destroy it)
            if lane.handle == self._target:
                self._retired[lane.handle] = (lane, destroy)
                return
            try:
                destroy(lane.handle)
            except BaseException:
                lane.destroyed = False  # still there: the device's close destroys it
                raise

    def retire_by_force(self, lane: Lane, runtime: Runtime) -> None:
        """:meth:`retire` with ``runtime.destroy_stream_force`` (``aclrtDestroyStreamForce``),
        its error ignored: the stream's work has been given up on, and the device may have
        faulted. ``runtime`` binds the device's context on a shared thread (the loop's:
        ``Scheduler.bound``)."""
        self.retire(lane, functools.partial(_destroy_quietly, runtime))

    def take_left(self) -> list[Lane]:
        """The lanes retired while a probe was out, whose destroy the prober left to the close
        because it was stopping (their probe is over: any thread may destroy them)."""
        with self._lock:
            left, self._left = self._left, []
        return left

    def stop(self) -> None:
        """Exit before the next probe (any thread; a probe under way reports first, and the
        streams retired meanwhile are left to the close: :meth:`take_left`)."""
        with self._lock:
            self._stop_asked = True
        self._jobs.put(None)

    def _main(self) -> None:
        with bound_for_life(self._runtime):
            self._serve()

    def _serve(self) -> None:
        while True:
            handle = self._jobs.get()
            if handle is None:
                return
            with self._lock:
                skip = self._stop_asked or handle in self._retired
            error: BaseException | None = None
            if not skip:
                try:
                    self._runtime.synchronize_stream(handle, STALL_PROBE_WAIT_MS)
                except StreamSyncTimeoutError:
                    pass  # still running
                except BaseException as exc:
                    error = exc
            with self._lock:
                self._target = None
                retired = self._retired.pop(handle, None)
                if retired is not None:
                    error = None  # the stream was closed meanwhile: nobody waits on it
                    lane, destroy = retired
                    if self._stop_asked:
                        # The close destroys it once this thread has exited (take_left): a
                        # destroy by force first looks at the stream (acl/settle.py), which
                        # can take seconds on the real runtime, and the close's join of this
                        # thread is bounded.
                        lane.destroyed = False
                        self._left.append(lane)
                    else:
                        self._destroy_retired(lane, destroy)
            self._report(Probed(handle, error))

    def _destroy_retired(self, lane: Lane, destroy: Callable[[int], None]) -> None:
        try:
            destroy(lane.handle)
        except Exception:  # nobody to raise it to: the close's leak check shows the stream
            log.exception(
                "device %d: destroying runtime stream %#x after its stall probe failed",
                self._device_id,
                lane.handle,
            )


def _destroy_quietly(runtime: Runtime, handle: int) -> None:
    with contextlib.suppress(Exception):
        runtime.destroy_stream_force(handle)
