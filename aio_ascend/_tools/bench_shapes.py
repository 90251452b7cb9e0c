"""The bench's workload shapes beyond the throughput rows (``aio-ascend bench``).

Each function measures one shape side by side with its own baseline, in one process:

- ``handler``: the request-handler shape (every coroutine launches, then awaits its task);
- ``roundtrip``: one launch + await against a bare ``await to_thread(noop)``, interleaved;
- ``fanout``: 256 concurrent request handlers against one handler (launches/s);
- ``producer_lag``: the loop's lag while one producer issues 10,000 launches over 8 streams,
  yielding every 64 launches, then awaits them in order (three repeats pooled);
- ``graph``: replaying a captured 100-kernel graph against launching the 100 kernels one by one
  (loop-thread CPU per kernel);
- ``copy_isolation``: another stream's 1-block launches while one stream uploads and downloads
  256 MiB blocks, against the same launches on an idle device (one stream never blocks
  another).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from .. import Device, Function, HostArgs, Stream, open_device

__all__ = [
    "ShapeConfig",
    "bench_copy_isolation",
    "bench_fanout",
    "bench_graph",
    "bench_handler",
    "bench_producer_lag",
    "bench_roundtrip",
    "launch_storm",
    "run_async",
    "spread",
]


class ShapeConfig(Protocol):
    """What the shapes read of the bench's configuration (``bench.BenchConfig``)."""

    launchers: int
    backend: str
    loop: str
    repeats: int
    scale: float

    def n(self, base: int) -> int: ...


def run_async(cfg: ShapeConfig, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``fn()`` on the configured loop (asyncio or uvloop)."""
    if cfg.loop == "uvloop":
        import uvloop

        return uvloop.run(fn())
    return asyncio.run(fn())


async def launch_storm(
    dev: Device, total: int, launchers: int, streams: int = 1, *, plans: bool = False
) -> float:
    """``launchers`` coroutines launching ``noop`` fire-and-forget, each awaiting its last
    (``plans``: through one ``stream.plan(noop, 1)`` per stream)."""
    ss = [dev.stream() for _ in range(streams)]
    noop = dev.function("noop")
    per = max(1, total // launchers)
    made = [s.plan(noop, 1) for s in ss] if plans else []

    async def worker(i: int) -> None:
        s = ss[i % len(ss)]
        last = None
        if plans:
            plan = made[i % len(ss)]
            for _ in range(per):
                last = await plan.launch()
        else:
            for _ in range(per):
                last = await s.launch(noop, 1)
        if last is not None:
            await last

    async with anyio.create_task_group() as tg:
        for i in range(launchers):
            tg.start_soon(worker, i)
    for plan in made:
        plan.close()
    for s in ss:
        await s.aclose()
    return float(per * launchers)


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q, method="nearest")) if values else float("nan")


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max / mean / stdev of repeated measurements (pyperf-style reporting)."""
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


async def _handlers(dev: Device, total: int, launchers: int) -> int:
    s = dev.stream()
    noop = dev.function("noop")
    per = max(1, total // launchers)

    async def handler() -> None:
        for _ in range(per):
            await (await s.launch(noop, 1))

    async with anyio.create_task_group() as tg:
        for _ in range(launchers):
            tg.start_soon(handler)
    await s.aclose()
    return per * launchers


def bench_handler(cfg: ShapeConfig) -> dict[str, Any]:
    """Request-handler shape: ``launchers`` coroutines, each ``launch`` then ``await task``."""
    n = cfg.n(50_000)
    repeats = max(1, cfg.repeats)

    async def main() -> list[float]:
        cpu = []
        async with open_device(0, backend=cfg.backend) as dev:
            await _handlers(dev, min(n, 5_000), cfg.launchers)
            for _ in range(repeats):
                cpu0 = time.process_time()
                done = await _handlers(dev, n, cfg.launchers)
                cpu.append((time.process_time() - cpu0) / done * 1e6)
        return cpu

    cpu = run_async(cfg, main)
    return {"cpu_us_per_launch": statistics.median(cpu), "cpu_us_spread": spread(cpu), "n": n}


def bench_roundtrip(cfg: ShapeConfig) -> dict[str, Any]:
    """One launch + await at a time against a bare ``await to_thread(noop)``, interleaved in
    rounds so that both see the same machine."""
    rounds, per_round = 5, cfg.n(300)

    def nothing() -> None:
        pass

    async def main() -> dict[str, Any]:
        ours: list[float] = []
        bare: list[float] = []
        async with open_device(0, backend=cfg.backend) as dev:
            s = dev.stream()
            noop = dev.function("noop")
            for _ in range(100):
                await (await s.launch(noop, 1))
                await anyio.to_thread.run_sync(nothing)
            for _ in range(rounds):
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    await (await s.launch(noop, 1))
                    ours.append(time.perf_counter() - t0)
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    await anyio.to_thread.run_sync(nothing)
                    bare.append(time.perf_counter() - t0)
        return {
            "launch_await_p50_us": _p(ours, 50) * 1e6,
            "launch_await_p99_us": _p(ours, 99) * 1e6,
            "to_thread_noop_p50_us": _p(bare, 50) * 1e6,
            "to_thread_noop_p99_us": _p(bare, 99) * 1e6,
            "n": len(ours),
        }

    result: dict[str, Any] = run_async(cfg, main)
    return result


def bench_fanout(cfg: ShapeConfig) -> dict[str, Any]:
    """Launches/s of ``launchers`` concurrent request handlers (each: launch, then await)
    against one handler doing the same: what concurrency buys a server."""
    n = cfg.n(30_000)
    repeats = max(1, cfg.repeats)

    async def main() -> dict[str, Any]:
        many: list[float] = []
        one: list[float] = []
        async with open_device(0, backend=cfg.backend) as dev:
            await _handlers(dev, 2_000, cfg.launchers)
            for _ in range(repeats):
                for launchers, total, out in (
                    (cfg.launchers, n, many),
                    (1, max(200, n // 20), one),
                ):
                    wall0 = time.perf_counter()
                    done = await _handlers(dev, total, launchers)
                    out.append(done / (time.perf_counter() - wall0))
        return {
            "many_launches_per_s": statistics.median(many),
            "one_launches_per_s": statistics.median(one),
            "many_spread": spread(many),
            "one_spread": spread(one),
            "launchers": cfg.launchers,
        }

    result: dict[str, Any] = run_async(cfg, main)
    return result


def bench_producer_lag(cfg: ShapeConfig) -> dict[str, Any]:
    """Loop lag (overshoot of a 1 ms sleep) while one producer issues 10,000 launches over 8
    streams, yielding every 64, then awaits them in order; three repeats pooled."""
    total, every = 10_000, 64
    repeats = max(3, cfg.repeats)

    async def main() -> dict[str, Any]:
        lags: list[float] = []
        async with open_device(0, backend=cfg.backend) as dev:
            streams = [dev.stream() for _ in range(8)]
            noop = dev.function("noop")
            for _ in range(repeats):
                running = [True]

                async def ticker(running: list[bool] = running) -> None:
                    while running[0]:
                        t0 = time.perf_counter()
                        await anyio.sleep(0.001)
                        lags.append(time.perf_counter() - t0 - 0.001)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(ticker)
                    tasks = []
                    for i in range(total):
                        tasks.append(await streams[i % 8].launch(noop, 1))
                        if i % every == every - 1:
                            await anyio.lowlevel.checkpoint()
                    for task in tasks:
                        await task
                    running[0] = False
        return {
            "lag_p50_ms": _p(lags, 50) * 1e3,
            "lag_p99_ms": _p(lags, 99) * 1e3,
            "lag_max_ms": max(lags) * 1e3 if lags else float("nan"),
            "ticks": len(lags),
            "repeats": repeats,
        }

    result: dict[str, Any] = run_async(cfg, main)
    return result


def bench_graph(cfg: ShapeConfig) -> dict[str, Any]:
    """Loop-thread CPU per kernel: replaying a captured 100-kernel graph against launching the
    100 kernels one by one (both pipelined: queue everything, await the last)."""
    kernels, replays = 100, max(20, cfg.n(300) // 1)

    async def main() -> dict[str, Any]:
        async with open_device(0, backend=cfg.backend) as dev:
            s, t = dev.stream(), dev.stream()
            noop = dev.function("noop")
            async with s.capture() as capture:
                for _ in range(kernels):
                    capture.launch(noop, 1, HostArgs())
            graph = capture.graph
            assert graph is not None
            for _ in range(10):
                await t.run_graph(graph)
            replay_cpu, single_cpu = [], []
            for _ in range(max(1, cfg.repeats)):
                cpu0 = time.thread_time()
                for _ in range(replays):
                    last = await t.launch_graph(graph)
                await last
                replay_cpu.append((time.thread_time() - cpu0) / (replays * kernels) * 1e6)
                cpu0 = time.thread_time()
                for _ in range(replays * kernels):
                    one = await t.launch(noop, 1)
                await one
                single_cpu.append((time.thread_time() - cpu0) / (replays * kernels) * 1e6)
            graph.close()
        return {
            "replay_loop_cpu_us_per_kernel": statistics.median(replay_cpu),
            "single_loop_cpu_us_per_kernel": statistics.median(single_cpu),
            "replay_spread": spread(replay_cpu),
            "single_spread": spread(single_cpu),
            "kernels_per_graph": kernels,
            "replays": replays,
        }

    result: dict[str, Any] = run_async(cfg, main)
    return result


async def _launch_delays(
    s: Stream, fn: Function, until: Callable[[int], bool], gap_s: float = 0.002
) -> tuple[list[float], list[float], list[float]]:
    """1-block launches on ``s``, one at a time ``gap_s`` apart, until ``until(launched)``:
    each one's admission -> submission, device completion -> resumption, and admission ->
    resumption (seconds)."""
    submit: list[float] = []
    wake: list[float] = []
    total: list[float] = []
    while not until(len(total)):
        task = await s.launch(fn, 1)
        await task
        assert task.submitted_at is not None and task.completed_at is not None
        assert task.resumed_at is not None
        submit.append(task.submitted_at - task.admitted_at)
        wake.append(task.resumed_at - task.completed_at)
        total.append(task.resumed_at - task.admitted_at)
        await anyio.sleep(gap_s)
    return submit, wake, total


async def copy_isolation(
    dev: Device, block_bytes: int, copies: int = 3, idle_launches: int = 100
) -> dict[str, Any]:
    """Another stream's launch delays (p95, ms) while one stream uploads and downloads
    ``block_bytes`` blocks (``copies`` of each at least), and on the idle device; and one
    copy's own time (the better of an upload and a download alone)."""
    copier, other = dev.stream(), dev.stream()
    noop = dev.function("noop")
    buf = dev.malloc(block_bytes)
    src = np.full(block_bytes, 7, np.uint8)
    out = np.empty(block_bytes, np.uint8)
    await copier.upload(buf, src)  # warm: the pinned staging buffers exist from here on
    await copier.download(buf, out=out)
    own = []
    for _ in range(2):
        t0 = time.perf_counter()
        await copier.upload(buf, src)
        own.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await copier.download(buf, out=out)
        own.append(time.perf_counter() - t0)
    idle = await _launch_delays(other, noop, lambda launched: launched >= idle_launches)
    done = [0]

    async def copy_loop() -> None:
        while done[0] < copies:
            await copier.upload(buf, src)
            await copier.download(buf, out=out)
            done[0] += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(copy_loop)
        await anyio.lowlevel.checkpoint()
        busy = await _launch_delays(other, noop, lambda _: done[0] >= copies)
    buf.free()
    await copier.aclose()
    await other.aclose()
    ms = 1e3
    copy_s = min(own)
    result: dict[str, Any] = {
        "block_mib": block_bytes >> 20,
        "copy_ms": copy_s * ms,
        "limit_ms": max(0.3 * copy_s, 0.015) * ms,
        "launches": len(busy[0]),
    }
    for name, (submit, wake, total) in (("idle", idle), ("busy", busy)):
        result[f"{name}_submit_p95_ms"] = _p(submit, 95) * ms
        result[f"{name}_wake_p95_ms"] = _p(wake, 95) * ms
        result[f"{name}_latency_p95_ms"] = _p(total, 95) * ms
    return result


def bench_copy_isolation(cfg: ShapeConfig) -> dict[str, Any]:
    """Another stream's 1-block launch latency while one stream uploads and downloads 256 MiB
    blocks, against the idle device (see :func:`copy_isolation`)."""

    # 256 MiB at scale 1 (smaller runs copy less, at least 4 MiB: still a big copy)
    block = max(4 << 20, int((256 << 20) * min(cfg.scale, 1.0))) & ~0xFFFF

    async def main() -> dict[str, Any]:
        async with open_device(0, backend=cfg.backend) as dev:
            return await copy_isolation(dev, block, copies=max(3, cfg.repeats))

    result: dict[str, Any] = run_async(cfg, main)
    return result
