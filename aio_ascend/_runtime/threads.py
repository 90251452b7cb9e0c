"""GIL hand-over for library threads that share the GIL with the event loop, and timer slack.

The problem. A Python thread that keeps computing holds the GIL until the interpreter forces a
switch (every ``sys.getswitchinterval()``, 5 ms by default), so the event loop's thread waits
that long for its turn, round after round while the thread stays busy: loop lag of several
milliseconds. The submitter, the poller and the sim's device thread run bursts of Python work;
the staging threads (``malloc_host``, ``np.copyto``) and the waiter (a blocking runtime call)
spend theirs with the GIL released, and the host-function thread runs the users' code, which is
theirs to schedule. None of these helpers touches asyncio or trio.

The rule. :func:`yield_gil` hands the GIL over at once (a 20 us sleep: ``time.sleep(0)`` is not
enough, the sleeper usually takes the GIL straight back). A thread offers it at the end of a
slice of :data:`GIL_SLICE_S` (0.5 ms) of Python work, but the submitter and the poller only do
so when the loop has not run for :data:`LOOP_STARVED_S` (2 ms): a loop that runs needs no turn,
and handing it one anyway costs every thread CPU (smaller batches, more wake-ups).

- :class:`LoopPulse` is the heartbeat, one per device: the loop thread writes it
  (:meth:`LoopPulse.beat`, in ``Scheduler.flush`` and after each delivery drain), the library
  threads only read it. A single float attribute: a stale read only shifts one hand-over, so no
  lock is needed.
- :class:`GilTurns` is one thread's own slice under that rule (never shared between threads):
  the slice counts from the thread's last yield or GIL-releasing wait (:meth:`GilTurns.waited`),
  however many hops or rounds it spans, so short hops that follow each other add up.
- The sim's device thread uses the plain rule: it yields after every drain that took longer than
  :data:`GIL_SLICE_S`, whether the loop ran or not.

Measured (``aio-ascend bench --only producer_lag,poll``, the one-producer shape): loop lag p99
17-20 ms before this rule, 5.5-7 ms with it, host CPU per launch at saturation unchanged; a 1 ms
``LOOP_STARVED_S`` cost 9 % more CPU.

:func:`reduce_timer_slack` makes the calling thread's short timed waits accurate on Linux (the
poller calls it: its backoff starts at 5 us, and the default 50 us slack would dominate it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import time
from typing import Any

__all__ = [
    "GIL_SLICE_S",
    "LOOP_STARVED_S",
    "GilTurns",
    "LoopPulse",
    "reduce_timer_slack",
    "yield_gil",
]

#: how long a library thread may run Python code before it offers the GIL to others
GIL_SLICE_S = 0.0005
_YIELD_S = 0.00002
#: how long the event loop's thread may go without running before a library thread that has
#: used up its slice hands the GIL over (see :class:`LoopPulse`; 2 ms: one-producer loop lag
#: p99 5.5-6.8 ms with host CPU per launch unchanged; 1 ms cost +9 % CPU; measured with
#: ``aio-ascend bench --only producer_lag,poll``)
LOOP_STARVED_S = 0.002


def yield_gil() -> None:
    """Block briefly (GIL released) so a thread waiting for the GIL can take it.

    ``time.sleep(0)`` is not enough: the sleeper usually takes the GIL straight back before
    the waiting thread has woken up.
    """
    time.sleep(_YIELD_S)


def reduce_timer_slack() -> None:
    """Make short timed waits of the calling thread accurate (Linux only, best effort).

    Linux rounds timed waits up by the thread's timer slack (50 us by default), which would
    dominate a poll interval of a few microseconds. ``PR_SET_TIMERSLACK`` is 29.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        _prctl()(29, 1000, 0, 0, 0)


@functools.cache
def _prctl() -> Any:
    # found once: find_library runs ldconfig in a subprocess (~2 ms at every device's open)
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


class LoopPulse:
    """When the event loop's thread last ran library code: a heartbeat the loop writes and the
    library threads read, so that they yield the GIL when the loop needs it and only then.

    A library thread that has used up its slice (:data:`GIL_SLICE_S`, counted since its last
    yield or wait, however many rounds of work that spans) yields only if the loop has not
    run for :data:`LOOP_STARVED_S`: the loop is then most likely waiting for the GIL (a busy
    thread keeps it for the interpreter's 5 ms switch interval, round after round: loop lag).
    A loop that does run needs no turn, and handing it one anyway costs every thread CPU
    (smaller batches, more wake-ups).
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def beat(self) -> None:
        """The loop ran (loop thread)."""
        self.last = time.perf_counter()

    def starved(self, now: float) -> bool:
        """Whether the loop has not run for :data:`LOOP_STARVED_S` before ``now``."""
        return now - self.last > LOOP_STARVED_S


class GilTurns:
    """One library thread's turns at the GIL under :class:`LoopPulse`'s rule: its slice
    counts from its last yield or wait, and it yields only to a starved loop."""

    __slots__ = ("_pulse", "_slice_end")

    def __init__(self, pulse: LoopPulse) -> None:
        self._pulse = pulse
        self._slice_end = 0.0  # when the slice is used up

    def offer(self) -> None:
        """Yield the GIL if the slice is used up and the loop has not run for a while."""
        now = time.perf_counter()
        if now > self._slice_end and self._pulse.starved(now):
            yield_gil()
            self._slice_end = time.perf_counter() + GIL_SLICE_S

    def waited(self) -> None:
        """The thread waited with the GIL released: a fresh slice."""
        self._slice_end = time.perf_counter() + GIL_SLICE_S
