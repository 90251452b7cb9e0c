"""Reliability: the event loop stays healthy under load.

* Loop lag (a ticker measuring how late ``anyio.sleep(0.001)`` wakes) while 10,000 tasks are in
  flight: launched by 10,000 coroutines, held on the device, then completed and woken.
* Idle cost: process CPU time while 100 awaits wait on long ``sleep`` kernels.
* Threads: the library adds exactly its own threads (``aio_ascend-submit-<id>``,
  ``aio_ascend-poll-<id>``, ``aio_ascend-sim-<id>``) per device, whatever the load, and none
  survive ``aclose()``.

This machine is noisy (2 shared cores): the figures are reported, the bounds are generous.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from reliability_helpers import (
    percentile,
    report,
    scaled,
    sim_leak_check,  # noqa: F401 - fixture
    tracked_device,
)

import aio_ascend as aa

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("sim_leak_check")]


def _loop_name(anyio_backend: Any) -> str:
    return anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")


class Ticker:
    """Measures how late ``anyio.sleep(period)`` returns, tagged by the current phase."""

    def __init__(self, period: float = 0.001) -> None:
        self.period = period
        self.phase = "start"
        self.lags: dict[str, list[float]] = {}
        self.samples: list[tuple[float, float]] = []  # (start, end) of every tick
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            t0 = time.perf_counter()
            await anyio.sleep(self.period)
            t1 = time.perf_counter()
            self.lags.setdefault(self.phase, []).append(max(t1 - t0 - self.period, 0.0))
            self.samples.append((t0, t1))

    def all(self) -> list[float]:
        return [lag for lags in self.lags.values() for lag in lags]

    def excluding(self, pauses: list[tuple[float, float]]) -> list[float]:
        """Lags of the ticks during which no full garbage collection ran."""
        return [
            max(t1 - t0 - self.period, 0.0)
            for t0, t1 in self.samples
            if not any(start < t1 and end > t0 for start, end in pauses)
        ]


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds per library thread (Linux /proc; empty elsewhere)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = thread.name.split("-")[1] if thread.name.startswith("aio_ascend-") else "loop"
        if thread is threading.main_thread() or thread.name.startswith("aio_ascend-"):
            out[role] = (int(fields[11]) + int(fields[12])) / tick
    return out


class GcPauses:
    """The garbage collector's full (generation 2) passes: (start, end) perf_counter times."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif info.get("generation") == 2:
            self.pauses.append((self._start, time.perf_counter()))

    def __enter__(self) -> GcPauses:
        # The test runner's own heap (collected items, hypothesis, numpy, ...) would make every
        # full collection slower than in an application: freeze it, measure what we add.
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)
        gc.unfreeze()


async def test_loop_lag_with_10000_tasks_in_flight(anyio_backend: Any) -> None:
    total = scaled(10_000, 10_000)
    per_stream = 1000  # within a stream's runtime queue entries (2013), batch events included
    ticker = Ticker()
    with GcPauses() as gc_pauses:
        figures = await _lag_run(anyio_backend, total, per_stream, ticker)
    # Python's full collections (10,000 coroutines, tasks and requests are a lot of objects)
    # stall any loop; the ticks they hit are reported, and the bound that is about the
    # scheduler is taken over the other ticks.
    no_gc = ticker.excluding(gc_pauses.pauses)
    figures = report(
        f"loop_lag[{_loop_name(anyio_backend)}]",
        **figures,
        gc_full_collections=len(gc_pauses.pauses),
        gc_full_collection_max_ms=max((b - a for a, b in gc_pauses.pauses), default=0.0) * 1e3,
        lag_p99_ms_outside_gc=percentile(no_gc, 99) * 1e3,
        lag_max_ms_outside_gc=max(no_gc, default=0.0) * 1e3,
    )
    assert figures["tasks_in_flight"] == total, figures
    # Generous bounds (2 noisy shared cores). Measured here: p99 outside GC 11-42 ms, with GC
    # 15-62 ms; the completion phase is the worst (the 256-item delivery chunks are per
    # hand-off, and several hand-offs queued behind a busy loop run in one iteration).
    assert figures["lag_p99_ms_outside_gc"] < 75, figures
    assert figures["lag_p99_ms"] < 150, figures
    assert figures["lag_max_ms"] < 500, figures


async def _lag_run(
    anyio_backend: Any, total: int, per_stream: int, ticker: Ticker
) -> dict[str, Any]:
    async with tracked_device() as dev:
        sim = dev.runtime
        streams = [dev.stream(max_in_flight=per_stream) for _ in range(-(-total // per_stream))]
        noop = dev.function("noop")
        launched = anyio.Event()
        count = 0
        t: dict[str, float] = {}

        async def request(s: aa.Stream) -> None:
            nonlocal count
            task = await s.launch(noop, 1)
            count += 1
            if count == total:
                launched.set()
            await task

        async with anyio.create_task_group() as outer:
            outer.start_soon(ticker.run)
            await anyio.sleep(0.05)
            ticker.phase = "idle"
            await anyio.sleep(0.05)
            sim.pause()  # type: ignore[attr-defined]
            ticker.phase = "launch"
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(total):
                    tg.start_soon(request, streams[i % len(streams)])
                    if i % 64 == 63:
                        # requests arrive over time (64 per loop tick), not 10,000 at once
                        await anyio.lowlevel.checkpoint()
                await launched.wait()
                t["launch_s"] = time.perf_counter() - t0
                await anyio.sleep(0.02)
                in_flight = dev.stats()["in_flight"]
                ticker.phase = "held"
                await anyio.sleep(0.1)
                ticker.phase = "complete"
                t1 = time.perf_counter()
                sim.resume()  # type: ignore[attr-defined]
            t["complete_s"] = time.perf_counter() - t1
            ticker.phase = "after"
            await anyio.sleep(0.05)
            ticker.stop = True
        stats = dev.stats()
    lags = ticker.all()
    ms = 1000.0

    def phase(name: str, q: float) -> float:
        return percentile(ticker.lags.get(name, []), q) * ms

    return {
        "tasks_in_flight": in_flight,
        "launch_10k_s": t["launch_s"],
        "complete_and_wake_10k_s": t["complete_s"],
        "wakeups": stats["wakeups"],
        "lag_samples": len(lags),
        "lag_p50_ms": percentile(lags, 50) * ms,
        "lag_p99_ms": percentile(lags, 99) * ms,
        "lag_max_ms": max(lags) * ms,
        "lag_p99_ms_launch": phase("launch", 99),
        "lag_p99_ms_held": phase("held", 99),
        "lag_p99_ms_complete": phase("complete", 99),
        "lag_max_ms_complete": phase("complete", 100),
    }


@pytest.mark.parametrize("completion", ["poll", "block"])
async def test_idle_cpu_while_100_awaits_wait_on_long_kernels(
    anyio_backend: Any, completion: str
) -> None:
    kernel_s = 1.2
    async with tracked_device(completion=completion) as dev:
        streams = [dev.stream() for _ in range(100)]
        sleep = dev.function("sleep")
        done = 0

        async def waiter(s: aa.Stream) -> None:
            nonlocal done
            await (await s.launch(sleep, 1, aa.HostArgs().u32(int(kernel_s * 1e6))))
            done += 1

        async with anyio.create_task_group() as tg:
            for s in streams:
                tg.start_soon(waiter, s)
            await anyio.sleep(0.2)  # everything launched and waiting
            threads0, cpu0, wall0 = _thread_cpu_s(), time.process_time(), time.perf_counter()
            await anyio.sleep(0.8)
            cpu1, wall1, threads1 = time.process_time(), time.perf_counter(), _thread_cpu_s()
            waiting = len(streams) - done
    cpu_fraction = (cpu1 - cpu0) / (wall1 - wall0)
    per_thread = {
        f"cpu_{role}_pct": round(100 * (threads1[role] - threads0.get(role, 0.0)) / (wall1 - wall0))
        for role in threads1
    }
    figures = report(
        f"idle_cpu[{_loop_name(anyio_backend)},{completion}]",
        awaits_waiting=waiting,
        window_s=wall1 - wall0,
        process_cpu_pct_of_one_core=100 * cpu_fraction,
        **per_thread,
    )
    assert waiting == 100, figures
    assert cpu_fraction < 0.30, figures


async def test_the_library_adds_exactly_its_own_threads(anyio_backend: Any) -> None:
    before = {t.ident for t in threading.enumerate()}

    def added() -> list[str]:
        # (not trio's: anyio's pytest plugin runs trio in guest mode, whose I/O waits run
        # in a "Trio thread N" of trio's thread cache, started the first time trio waits)
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.ident not in before and not t.name.startswith("Trio thread")
        )

    peak: list[str] = []
    async with tracked_device() as dev0:
        after_open = added()
        async with tracked_device(device_id=1):
            two = added()
        s = [dev0.stream() for _ in range(16)]
        buf = dev0.malloc(4096)
        for i in range(2000):
            stream = s[i % len(s)]
            await stream.launch(dev0.function("noop"), 1)
            if i % 100 == 0:
                await stream.copy_to_device(buf, bytes(4096))
                ev = await stream.record_event()
                await s[(i + 1) % len(s)].wait_event(ev)
                del ev
                peak = max(peak, added(), key=len)
        await dev0.synchronize()
        under_load = added()
    after_close = added()  # aclose() joined them: nothing to wait for
    own = ["aio_ascend-poll-0", "aio_ascend-sim-0", "aio_ascend-submit-0"]
    report(
        f"threads[{_loop_name(anyio_backend)}]",
        added_by_one_device=len(after_open),
        added_by_two_devices=len(two),
        added_under_load_peak=len(peak),
        added_after_close=len(after_close),
    )
    # the stall prober starts with its first probe: on a loaded machine a batch may be
    # outstanding long enough for one
    lazy = {"aio_ascend-probe-0"}
    assert after_open == own
    assert two == sorted(own + [name.replace("-0", "-1") for name in own])
    assert set(own) <= set(under_load) <= set(own) | lazy
    assert set(own) <= set(peak) <= set(own) | lazy
    assert after_close == []
