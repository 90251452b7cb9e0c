"""When library threads hand the GIL to the event loop (``_runtime/threads.LoopPulse``): only
once their slice is used up, however many hops it spans, and only if the loop has not run for
``LOOP_STARVED_S`` (a loop that runs needs no turn; giving it one costs CPU)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aio_ascend import HostArgs
from aio_ascend._host.pool import HostBuffer
from aio_ascend._runtime import threads
from aio_ascend._runtime.threads import LOOP_STARVED_S, LoopPulse
from aio_ascend._sched.batching import Hop, form_batches
from aio_ascend._sched.faults import FaultState
from aio_ascend._sched.lane import Lane
from aio_ascend._sched.submitter import Submitter
from aio_ascend._sched.work import Batch, Launch, LaunchSpec, Request


def test_the_pulse_says_starved_only_after_the_loop_has_been_away() -> None:
    pulse = LoopPulse()
    pulse.beat()
    assert not pulse.starved(pulse.last + LOOP_STARVED_S / 2)
    assert pulse.starved(pulse.last + LOOP_STARVED_S * 1.5)


class _Runtime:
    def __init__(self) -> None:
        self.launches = 0

    def set_current_context(self) -> None:
        pass

    def release_thread(self) -> None:
        pass

    def launch_kernel_with_host_args(self, *args: Any) -> None:
        self.launches += 1

    def last_task_id(self) -> int | None:
        return None

    def record_event(self, event: int, stream: int) -> None:
        pass


class _Events:
    def take(self) -> int:
        return 1


def _hops(count: int, size: int) -> list[Hop]:
    lane = Lane(1, 100_000, 200_000)
    host = HostBuffer(0, 4096, 4096, 64, memoryview(bytearray(64)))
    spec = LaunchSpec(7, 1, None, HostArgs().u64(0).pack(), host)  # 8 bytes of args
    hops = []
    for _ in range(count):
        requests: list[Request] = [Launch(lane, spec) for _ in range(size)]
        form_batches(requests, 512)
        hops.append(Hop(requests, time.monotonic() + 60))
    return hops


def _submitter(runtime: _Runtime, batches: list[Batch], pulse: LoopPulse) -> Submitter:
    return Submitter(
        runtime=runtime,  # type: ignore[arg-type]
        device_id=0,
        faults=FaultState(),
        lifetimes=None,  # type: ignore[arg-type]
        batch_events=_Events(),  # type: ignore[arg-type]
        post=lambda deliveries: None,
        stage=None,  # type: ignore[arg-type]
        to_poller=batches.append,
        task_timeout=60.0,
        pulse=pulse,
    )


def test_hops_of_one_request_still_give_a_starved_loop_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    yields: list[float] = []
    monkeypatch.setattr(threads, "yield_gil", lambda: yields.append(1.0))
    pulse = LoopPulse()
    pulse.last = -1e9
    runtime, batches = _Runtime(), []
    submitter = _submitter(runtime, batches, pulse)
    hops = _hops(2000, 1)  # far more than a slice's worth of work, in tiny hops
    for hop in hops:
        submitter.submit(hop)
    submitter.stop()
    submitter.thread.start()
    submitter.thread.join(30)
    assert not submitter.thread.is_alive()
    assert runtime.launches == len(hops) == len(batches)
    assert len(yields) >= 2


@pytest.mark.parametrize("starved", [True, False])
def test_the_submitter_yields_to_a_starved_loop_only(
    monkeypatch: pytest.MonkeyPatch, starved: bool
) -> None:
    yields: list[float] = []
    monkeypatch.setattr(threads, "yield_gil", lambda: yields.append(1.0))
    pulse = LoopPulse()
    pulse.last = -1e9 if starved else 1e18  # the loop never ran / always just ran
    runtime = _Runtime()
    batches: list[Batch] = []
    submitter = _submitter(runtime, batches, pulse)
    # many small hops, each far shorter than a slice: their time adds up. The starved case
    # runs until the loop got three turns (a liveness bound, not a timing); the other runs
    # for five slices' worth of hops at least. A preempted hop must not end the run early.
    start = time.perf_counter()
    hops = 0
    while True:
        for hop in _hops(1, 64):
            submitter._hop(hop)
            hops += 1
        elapsed = time.perf_counter() - start
        if starved and (len(yields) >= 3 or elapsed > 10.0):
            break
        if not starved and hops >= 20 and elapsed > 5 * threads.GIL_SLICE_S:
            break
    assert runtime.launches == 64 * hops and len(batches) == hops
    if starved:
        assert len(yields) >= 3  # the loop gets its turns, across hops
        # ... but at most one per slice used up: never one per hop or per offer
        assert len(yields) <= elapsed / threads.GIL_SLICE_S + 1
    else:
        assert yields == []
