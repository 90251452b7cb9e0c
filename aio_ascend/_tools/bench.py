"""Side-by-side benchmarks of the scheduler against the obvious alternatives (``aio-ascend bench``).

Every number is measured in the same process, one after the other, so ratios are meaningful
even on a noisy 2-core machine. Sizes scale with ``scale`` (1.0 runs in well under a minute).
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import anyio.to_thread

from .. import HostArgs, __version__, is_compiled, open_device
from .._host.pool import HostBufferPool
from .._host.snapshot import snapshot_args
from .._runtime import open_runtime
from .._runtime.abi import ACL_EVENT_CAPTURE_STREAM_PROGRESS
from .._runtime.acl.batch import native_submit
from ..tracing import Tracer
from .bench_acl import ACL_STEPS, acl_rows, acl_steps
from .bench_shapes import (
    bench_copy_isolation,
    bench_fanout,
    bench_graph,
    bench_handler,
    bench_producer_lag,
    bench_roundtrip,
    launch_storm,
    run_async,
    spread,
)
from .bench_targets import ratios, round_groups, run_rounds
from .progress import Progress
from .stats import percentile

__all__ = ["BACKEND_STEPS", "STEPS", "BenchConfig", "format_table", "ratios", "run_bench"]


@dataclass
class BenchConfig:
    """What to run and how big."""

    scale: float = 1.0
    launchers: int = 256
    backend: str = "sim"
    loop: str = "asyncio"  # or "uvloop"
    #: repeats of the rows reported with their spread (min/median/max)
    repeats: int = 3
    progress: TextIO | None = sys.stderr
    results: dict[str, Any] = field(default_factory=dict)
    #: --trace: the wake-latency steps record extra probe rounds into it (aio_ascend.tracing),
    #: after their measured rounds, so that tracing never skews a figure
    tracer: Tracer | None = None

    def n(self, base: int) -> int:
        return max(100, int(base * self.scale))


# --- (a) raw synchronous loop ---------------------------------------------------------------


def bench_raw(cfg: BenchConfig) -> dict[str, Any]:
    """(a): a plain loop of runtime launches on one thread, one sync at the end (``repeats``
    times: the median and the spread)."""
    n = cfg.n(50_000)
    rt = open_runtime(cfg.backend, 0)
    rates, cpus = [], []
    try:
        stream = rt.create_stream()
        binary = rt.load_binary(None)
        noop = rt.get_function(binary, "noop")
        args = rt.malloc_host(64)
        event = rt.create_event(ACL_EVENT_CAPTURE_STREAM_PROGRESS)
        launch = rt.launch_kernel_with_host_args
        for _ in range(min(n, 5_000)):  # warm, as (c) is before it is measured
            launch(noop, 1, stream, None, args, 8, 0, 0)
        rt.record_event(event, stream)
        rt.synchronize_event(event, -1)
        for _ in range(max(1, cfg.repeats)):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                launch(noop, 1, stream, None, args, 8, 0, 0)
            rt.record_event(event, stream)
            rt.synchronize_event(event, -1)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            rates.append(n / wall)
            cpus.append(cpu / n * 1e6)
        rt.destroy_event(event)
        rt.free_host(args)
        rt.destroy_stream(stream)
        rt.unload_binary(binary)
    finally:
        rt.close()
    return {
        "launches_per_s": statistics.median(rates),
        "cpu_us_per_launch": statistics.median(cpus),
        "cpu_us_spread": spread(cpus),
        "n": n,
    }


# --- (b) naive per-launch to_thread(launch + sync) ------------------------------------------


def bench_naive(cfg: BenchConfig) -> dict[str, Any]:
    """(b): every launch is ``await to_thread(launch + record + synchronize)``."""
    n = cfg.n(8_000)
    rt = open_runtime(cfg.backend, 0)
    local = threading.local()
    binary = rt.load_binary(None)
    noop = rt.get_function(binary, "noop")
    stream = rt.create_stream()
    lock = threading.Lock()
    created: list[tuple[int, int]] = []

    def launch_and_sync() -> None:
        state = getattr(local, "state", None)
        if state is None:
            rt.set_current_context()
            state = local.state = (rt.malloc_host(64), rt.create_event(0))
            with lock:
                created.append(state)
        args, event = state
        rt.launch_kernel_with_host_args(noop, 1, stream, None, args, 8, 0, 0)
        rt.record_event(event, stream)
        rt.synchronize_event(event, -1)

    async def main() -> tuple[float, float, list[float]]:
        per = max(1, n // cfg.launchers)

        async def worker() -> None:
            for _ in range(per):
                await anyio.to_thread.run_sync(launch_and_sync)

        wall0, cpu0 = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for _ in range(cfg.launchers):
                tg.start_soon(worker)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        single = []
        for _ in range(cfg.n(500)):
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(launch_and_sync)
            single.append(time.perf_counter() - t0)
        return per * cfg.launchers / wall, cpu / (per * cfg.launchers) * 1e6, single

    try:
        rate, cpu_us, single = run_async(cfg, main)
    finally:
        rt.set_current_context()
        for args, event in created:
            rt.destroy_event(event)
            rt.free_host(args)
        rt.destroy_stream(stream)
        rt.unload_binary(binary)
        rt.close()
    return {
        "launches_per_s": rate,
        "cpu_us_per_launch": cpu_us,
        "single_launch_p50_us": percentile(single, 50) * 1e6,
        "single_launch_p99_us": percentile(single, 99) * 1e6,
        "n": n,
        "latencies_us": [x * 1e6 for x in single],
    }


# --- (c) the scheduler ------------------------------------------------------------------------


def bench_scheduler(
    cfg: BenchConfig,
    completion: str,
    batch_cap: int = 512,
    *,
    traced: bool = False,
    plans: bool = False,
) -> dict[str, Any]:
    """(c): ``launchers`` coroutines each launching ``noop`` through one Device, ``repeats``
    times (``traced``: with an :class:`aio_ascend.tracing.Tracer` recording the measured
    launches; ``plans``: each launch through a ``LaunchPlan``)."""
    n = cfg.n(50_000)

    async def main() -> dict[str, Any]:
        async with open_device(
            0, backend=cfg.backend, completion=completion, batch_cap=batch_cap
        ) as dev:
            await launch_storm(dev, min(n, 5_000), cfg.launchers, plans=plans)  # warm-up
            allocs0 = dev.stats()["host_buffer_allocations"]
            batches0, wakeups0 = dev.stats()["batches"], dev.stats()["wakeups"]
            rates, cpus = [], []
            for _ in range(max(1, cfg.repeats)):
                tracer = Tracer(max_tasks=n) if traced else None
                wall0, cpu0 = time.perf_counter(), time.process_time()
                if tracer is not None:
                    tracer.start()
                done = await launch_storm(dev, n, cfg.launchers, plans=plans)
                if tracer is not None:
                    tracer.stop()  # (its records are built here: counted, as tracing's cost)
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                rates.append(done / wall)
                cpus.append(cpu / done * 1e6)
            done *= len(rates)
            stats = dev.stats()
            single = []
            s = dev.stream()
            noop = dev.function("noop")
            for _ in range(cfg.n(500)):
                t0 = time.perf_counter()
                await (await s.launch(noop, 1))
                single.append(time.perf_counter() - t0)
            return {
                "launches_per_s": statistics.median(rates),
                "cpu_us_per_launch": statistics.median(cpus),
                "cpu_us_spread": spread(cpus),
                "batches": stats["batches"] - batches0,
                "wakeups": stats["wakeups"] - wakeups0,
                "host_allocations_after_warmup": stats["host_buffer_allocations"] - allocs0,
                "launches_measured": done,
                "single_launch_p50_us": percentile(single, 50) * 1e6,
                "single_launch_p99_us": percentile(single, 99) * 1e6,
                "latencies_us": [x * 1e6 for x in single],
            }

    result: dict[str, Any] = run_async(cfg, main)
    return result


# --- wake latency -----------------------------------------------------------------------------


def bench_bare_wakes(cfg: BenchConfig) -> dict[str, float]:
    """Thread -> thread (``threading.Event``) and thread -> coroutine (``call_soon_threadsafe``)."""
    rounds = cfg.n(2_000)
    event_lat: list[float] = []
    go, woke = threading.Event(), threading.Event()
    stamp = [0.0]

    def setter() -> None:
        for _ in range(rounds):
            time.sleep(0.0002)
            stamp[0] = time.perf_counter()
            go.set()
            woke.wait()
            woke.clear()

    thread = threading.Thread(target=setter)
    thread.start()
    for _ in range(rounds):
        go.wait()
        event_lat.append(time.perf_counter() - stamp[0])
        go.clear()
        woke.set()
    thread.join()

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        lat: list[float] = []
        for _ in range(rounds):
            fut: asyncio.Future[float] = loop.create_future()

            def fire(f: asyncio.Future[float] = fut) -> None:
                time.sleep(0.0002)
                t0 = time.perf_counter()
                loop.call_soon_threadsafe(f.set_result, t0)

            threading.Thread(target=fire).start()
            t0 = await fut
            lat.append(time.perf_counter() - t0)
        return lat

    cst_lat: list[float] = run_async(cfg, main)
    return {
        "threading_event_p50_us": percentile(event_lat, 50) * 1e6,
        "threading_event_p99_us": percentile(event_lat, 99) * 1e6,
        "call_soon_threadsafe_p50_us": percentile(cst_lat, 50) * 1e6,
        "call_soon_threadsafe_p99_us": percentile(cst_lat, 99) * 1e6,
    }


def _stamp_library(stamps: list[float]) -> Any:
    from ..sim import KernelLibrary

    lib = KernelLibrary("bench")

    @lib.kernel("stamp")
    def stamp(ctx: Any) -> None:
        stamps.append(time.perf_counter())

    return lib


def bench_wake_latency(cfg: BenchConfig, completion: str, churn: bool) -> dict[str, float]:
    """Device completion -> awaiting coroutine resumed, idle or while 10,000 tasks churn."""
    rounds = cfg.n(1_500)

    async def main() -> dict[str, Any]:
        stamps: list[float] = []
        async with open_device(0, backend="sim", completion=completion) as dev:
            fn = dev.load_module(_stamp_library(stamps)).function("stamp")
            probe = dev.stream()
            stop = anyio.Event()
            in_flight = [0]

            async def churner(s: Any) -> None:
                # 1,250 tasks outstanding per stream, each a 1 ms kernel, replaced as soon as
                # it completes: ~8,000 completions/s over 8 streams, 10,000 always in flight.
                sleep = dev.function("sleep")
                args = HostArgs().u32(1000)
                pending: deque[Any] = deque()
                while not stop.is_set():
                    pending.append(await s.launch(sleep, 1, args))
                    in_flight[0] += 1
                    if len(pending) >= 1250:
                        await pending[0]
                    while pending and pending[0].done():
                        pending.popleft()
                        in_flight[0] -= 1
                for t in pending:
                    await t

            lat: list[float] = []
            async with anyio.create_task_group() as tg:
                if churn:
                    for _ in range(8):
                        tg.start_soon(churner, dev.stream(max_in_flight=1300))
                    while in_flight[0] < 9_900:  # noqa: ASYNC110 - polling a counter
                        await anyio.sleep(0.001)
                for _ in range(rounds):
                    task = await probe.launch(fn, 1)
                    await task
                    resumed = time.perf_counter()
                    lat.append(resumed - stamps[-1])
                if cfg.tracer is not None and not churn:
                    cfg.tracer.name_stream(probe, f"probe ({completion})")
                    with cfg.tracer:
                        for _ in range(TRACED_ROUNDS):
                            await (await probe.launch(fn, 1))
                stop.set()
            return {
                "p50_us": percentile(lat, 50) * 1e6,
                "p99_us": percentile(lat, 99) * 1e6,
                "samples": len(lat),
                "latencies_us": [x * 1e6 for x in lat],
            }

    result: dict[str, float] = run_async(cfg, main)
    return result


#: probe rounds recorded per wake-latency step with --trace (not counted in its figures)
TRACED_ROUNDS = 400


# --- loop health ----------------------------------------------------------------------------


def bench_loop_lag(cfg: BenchConfig) -> dict[str, float]:
    """Event-loop lag with 10,000 launches outstanding over 8 streams.

    Three phases, each measured by a ticker coroutine (``sleep(1 ms)`` overshoot): issuing the
    10,000 launches as fast as one coroutine can; holding them outstanding (each stream is
    blocked behind a 300 ms kernel); and draining them (10,000 completions delivered).
    """
    total = 10_000
    hold_s = 0.3

    async def main() -> dict[str, float]:
        async with open_device(0, backend="sim") as dev:
            streams = [dev.stream(max_in_flight=1300) for _ in range(8)]
            noop, sleep = dev.function("noop"), dev.function("sleep")
            lags: dict[str, list[float]] = {"issue": [], "hold": [], "drain": []}
            phase = ["issue"]
            running = [True]

            async def ticker() -> None:
                while running[0]:
                    t0 = time.perf_counter()
                    await anyio.sleep(0.001)
                    lags[phase[0]].append(time.perf_counter() - t0 - 0.001)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                started = time.perf_counter()
                tasks = [
                    await s.launch(sleep, 1, HostArgs().u32(int(hold_s * 1e6))) for s in streams
                ]
                for i in range(total):
                    tasks.append(await streams[i % 8].launch(noop, 1))
                outstanding = sum(s.in_flight for s in streams)
                phase[0] = "hold"
                await tasks[0]
                phase[0] = "drain"
                for t in tasks:
                    await t
                running[0] = False
            issue_s = time.perf_counter() - started

            def p(name: str, q: float) -> float:
                return percentile(lags[name], q) * 1e3

            held = lags["hold"] + lags["drain"]
            return {
                "outstanding_at_peak": outstanding,
                "lag_p50_ms": percentile(held, 50) * 1e3,
                "lag_p99_ms": percentile(held, 99) * 1e3,
                "lag_max_ms": max(held) * 1e3 if held else float("nan"),
                "hold_p99_ms": p("hold", 99),
                "drain_p99_ms": p("drain", 99),
                "issue_p99_ms": p("issue", 99),
                "issue_max_ms": max(lags["issue"]) * 1e3 if lags["issue"] else float("nan"),
                "total_s": issue_s,
            }

    result: dict[str, float] = run_async(cfg, main)
    return result


def bench_idle_cost(cfg: BenchConfig, completion: str) -> dict[str, float]:
    """Process CPU time while one coroutine awaits a long (1 s) kernel."""
    seconds = 1.0

    async def main() -> dict[str, float]:
        async with open_device(0, backend="sim", completion=completion) as dev:
            s = dev.stream()
            task = await s.launch(dev.function("sleep"), 1, HostArgs().u32(int(seconds * 1e6)))
            await anyio.sleep(0.05)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            await task
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            return {"cpu_percent": 100 * cpu / wall, "cpu_ms": cpu * 1e3, "wall_s": wall}

    result: dict[str, float] = run_async(cfg, main)
    return result


# --- host args --------------------------------------------------------------------------------


def bench_packing(cfg: BenchConfig) -> dict[str, float]:
    """A typical launch: 3 pointers + 2 scalars + a 16-byte tiling placeholder.

    The snapshot is L2's one definition (``snapshot_args``: image, then the placeholder table
    at the next 8-byte boundary, in a pooled pinned buffer), timed with its release.
    """
    n = cfg.n(20_000)
    tiling = b"\x01" * 16
    t0 = time.perf_counter()
    for i in range(n):
        HostArgs().ptr(0x1000).ptr(0x2000).ptr(0x3000).u32(i).f32(0.5).placeholder(tiling).pack()
    build_us = (time.perf_counter() - t0) / n * 1e6

    rt = open_runtime("sim", 0)
    pool = HostBufferPool(rt.malloc_host, rt.free_host)
    try:
        args = HostArgs().ptr(0x1000).ptr(0x2000).ptr(0x3000).u32(7).f32(0.5).placeholder(tiling)
        packed = args.pack()
        for _ in range(64):  # warm-up
            pool.release(snapshot_args(pool, packed))
        before = pool.stats()["allocations"]
        t0 = time.perf_counter()
        for _ in range(n):
            buf = snapshot_args(pool, packed)
            pool.release(buf)
        snapshot_us = (time.perf_counter() - t0) / n * 1e6
        allocations = pool.stats()["allocations"] - before
        pool.close()
    finally:
        rt.close()
    return {
        "build_and_pack_us": build_us,
        "snapshot_into_pool_us": snapshot_us,
        "pool_allocations_per_100k": allocations * 100_000 / n,
    }


# --- the whole suite --------------------------------------------------------------------------

STEPS: list[tuple[str, str, Callable[[BenchConfig], dict[str, Any]]]] = [
    ("packing", "host args packing + pool", bench_packing),
    ("raw", "(a) raw runtime loop", bench_raw),
    ("naive", "(b) naive to_thread(launch+sync)", bench_naive),
    ("unbatched", "(b2) scheduler, batch_cap=1", lambda c: bench_scheduler(c, "poll", 1)),
    ("poll", "(c) scheduler, poll mode", lambda c: bench_scheduler(c, "poll")),
    ("handler", "(c) request-handler shape", bench_handler),
    ("plan", "(c) plan launches, poll mode", lambda c: bench_scheduler(c, "poll", plans=True)),
    ("roundtrip", "launch+await vs to_thread(noop)", bench_roundtrip),
    ("fanout", "256 handlers vs one", bench_fanout),
    ("block", "(c') scheduler, block mode", lambda c: bench_scheduler(c, "block")),
    ("traced", "(c) with tracing on", lambda c: bench_scheduler(c, "poll", traced=True)),
    ("bare_wakes", "bare thread/loop wakes", bench_bare_wakes),
    ("wake_poll", "completion->resume, poll", lambda c: bench_wake_latency(c, "poll", False)),
    ("wake_block", "completion->resume, block", lambda c: bench_wake_latency(c, "block", False)),
    ("wake_churn", "completion->resume, 10k churn", lambda c: bench_wake_latency(c, "poll", True)),
    ("loop_lag", "loop lag, 10k outstanding", bench_loop_lag),
    ("producer_lag", "loop lag, one producer", bench_producer_lag),
    ("graph", "graph replay vs one by one", bench_graph),
    ("copy_isolation", "another stream under big copies", bench_copy_isolation),
    ("idle_poll", "idle CPU, poll", lambda c: bench_idle_cost(c, "poll")),
    ("idle_block", "idle CPU, block", lambda c: bench_idle_cost(c, "block")),
    *acl_steps(bench_raw, lambda c: bench_scheduler(c, "poll")),
]


#: the steps that run on ``BenchConfig.backend``; the others measure the sim (their kernels are
#: sim user kernels or the sim's time model) or host-side work only
BACKEND_STEPS = ("raw", "naive", "unbatched", "poll", "block", "traced")


def machine_metadata() -> dict[str, Any]:
    """Where and when the numbers were taken (so that a reader can tell noise from change)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_implementation() + " " + platform.python_version(),
        "platform": platform.platform(),
        "aio_ascend": __version__,
        # the hot path compiled with mypyc (AIO_ASCEND_COMPILE=1 at install) or pure Python
        "compiled": is_compiled(),
        # the acl backend's native batch submit built (a C compiler at install) or not
        "native_submit": native_submit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def run_bench(cfg: BenchConfig, only: list[str] | None = None) -> dict[str, Any]:
    """Run the suite; return every measurement plus the derived ratios and target verdicts."""
    steps = [step for step in STEPS if only is None or step[0] in only]
    grouped = round_groups(steps, cfg.repeats)
    extra = sum(len(group) for key, group in grouped.items() if group[0][0] == key)
    progress = Progress(cfg.progress, len(steps) + extra * (cfg.repeats - 1), title="bench")
    results = cfg.results
    results["config"] = {
        "scale": cfg.scale,
        "launchers": cfg.launchers,
        "backend": cfg.backend,
        "loop": cfg.loop,
        "repeats": cfg.repeats,
        "python": sys.version.split()[0],
        "compiled": is_compiled(),
        "native_submit": native_submit(),
    }
    results["machine"] = machine_metadata()
    for key, label, fn in steps:
        if key in grouped:
            if grouped[key][0][0] == key:  # the group runs, in rounds, where its first row is
                results.update(run_rounds(cfg, grouped[key], progress))
            continue
        progress.begin(label)
        gc.collect()  # each step starts without the previous steps' garbage to collect
        results[key] = fn(cfg)
        progress.step()
    results["ratios"] = ratios(results)
    return results


def format_table(r: dict[str, Any]) -> str:
    """A plain-text report of a :func:`run_bench` result."""
    lines = []

    def row(label: str, value: str) -> None:
        lines.append(f"  {label:<52} {value}")

    config = r.get("config", {})
    lines.append(f"aio-ascend bench  ({json.dumps(config)})")
    if any(key in r for key in BACKEND_STEPS):
        backend = config.get("backend", "sim")
        lines.append(
            "throughput (noop kernels, sim device-time model off)"
            if backend == "sim"
            else f"throughput (noop kernels on the {backend} backend)"
        )
    for key, label in [
        ("raw", "(a) raw synchronous runtime loop"),
        ("naive", "(b) naive await to_thread(launch + sync)"),
        ("unbatched", "(b2) scheduler without batching (batch_cap=1)"),
        ("poll", "(c) scheduler, poll completion"),
        ("plan", "(c) the same through a LaunchPlan"),
        ("block", "(c') scheduler, block completion"),
        ("traced", "(c) with aio_ascend.tracing recording"),
    ]:
        if key in r:
            x = r[key]
            row(
                label,
                f"{x['launches_per_s']:>10,.0f} launches/s  "
                f"{x['cpu_us_per_launch']:6.1f} us CPU/launch",
            )
    if "handler" in r:
        x = r["handler"]
        row(
            "(c) request-handler shape (launch, then await)",
            f"{x['cpu_us_per_launch']:6.1f} us CPU/launch",
        )
    for key in ("raw", "poll", "plan", "handler"):
        if key in r and "cpu_us_spread" in r[key]:
            sp = r[key]["cpu_us_spread"]
            row(
                f"  spread of {key} over {sp['n']} repeats",
                f"min {sp['min']:.2f}  median {sp['median']:.2f}  max {sp['max']:.2f} us",
            )
    if "fanout" in r:
        x = r["fanout"]
        row(
            f"{x['launchers']} request handlers / one handler",
            f"{x['many_launches_per_s']:>10,.0f} / {x['one_launches_per_s']:,.0f} launches/s",
        )
    if "traced" in r and "poll" in r:
        extra = r["traced"]["cpu_us_per_launch"] - r["poll"]["cpu_us_per_launch"]
        row("  tracing's cost (CPU/launch, traced - (c))", f"{extra:+.1f} us")
    if any(key in r for key in ("naive", "poll", "block")):
        lines.append("latency of one launch + await at a time")
    for key, label in [
        ("naive", "(b) naive await to_thread(launch + sync)"),
        ("poll", "(c) scheduler, poll completion"),
        ("block", "(c') scheduler, block completion"),
    ]:
        if key in r:
            x = r[key]
            row(
                label,
                f"p50 {x['single_launch_p50_us']:7.1f} us  p99 {x['single_launch_p99_us']:7.1f} us",
            )
    if any(key in r for key in ("bare_wakes", "wake_poll", "wake_block", "wake_churn")):
        lines.append("wake latency (device completion -> coroutine resumed)")
    if "bare_wakes" in r:
        x = r["bare_wakes"]
        row(
            "bare threading.Event wake",
            f"p50 {x['threading_event_p50_us']:7.1f} us  p99 {x['threading_event_p99_us']:7.1f} us",
        )
        row(
            "bare call_soon_threadsafe wake",
            f"p50 {x['call_soon_threadsafe_p50_us']:7.1f} us  "
            f"p99 {x['call_soon_threadsafe_p99_us']:7.1f} us",
        )
    for key, label in [
        ("wake_poll", "scheduler, poll, idle"),
        ("wake_block", "scheduler, block, idle"),
        ("wake_churn", "scheduler, poll, 10k tasks churning"),
    ]:
        if key in r:
            x = r[key]
            row(label, f"p50 {x['p50_us']:7.1f} us  p99 {x['p99_us']:7.1f} us")
    if "loop_lag" in r:
        x = r["loop_lag"]
        lines.append(
            f"loop lag (overshoot of a 1 ms sleep), {x['outstanding_at_peak']} launches over "
            "8 streams"
        )
        row(
            "outstanding (held, then draining)",
            f"p50 {x['lag_p50_ms']:.2f} ms  p99 {x['lag_p99_ms']:.2f} ms  "
            f"max {x['lag_max_ms']:.2f} ms",
        )
        row(
            "  of which: held / draining",
            f"p99 {x['hold_p99_ms']:.2f} / {x['drain_p99_ms']:.2f} ms",
        )
        row(
            "while one coroutine issues them (not in the target)",
            f"p99 {x['issue_p99_ms']:.2f} ms  max {x['issue_max_ms']:.2f} ms",
        )
    if "roundtrip" in r:
        x = r["roundtrip"]
        lines.append("round trip, interleaved with its baseline")
        row(
            "launch + await",
            f"p50 {x['launch_await_p50_us']:7.1f} us  p99 {x['launch_await_p99_us']:7.1f} us",
        )
        row(
            "bare await to_thread(noop)",
            f"p50 {x['to_thread_noop_p50_us']:7.1f} us  p99 {x['to_thread_noop_p99_us']:7.1f} us",
        )
    if "producer_lag" in r:
        x = r["producer_lag"]
        lines.append(
            "loop lag, one producer: 10k launches over 8 streams, yield every 64, await in order"
        )
        row(
            f"{x['repeats']} repeats pooled ({x['ticks']} ticks)",
            f"p50 {x['lag_p50_ms']:.2f} ms  p99 {x['lag_p99_ms']:.2f} ms  "
            f"max {x['lag_max_ms']:.2f} ms",
        )
    if "graph" in r:
        x = r["graph"]
        lines.append(f"graphs: a captured {x['kernels_per_graph']}-kernel graph, loop-thread CPU")
        row("replayed (launch_graph)", f"{x['replay_loop_cpu_us_per_kernel']:.3f} us/kernel")
        row(
            "the kernels launched one by one", f"{x['single_loop_cpu_us_per_kernel']:.3f} us/kernel"
        )
    if "copy_isolation" in r:
        x = r["copy_isolation"]
        lines.append(
            f"another stream's 1-block launches while one stream uploads and downloads "
            f"{x['block_mib']} MiB blocks (one copy alone: {x['copy_ms']:.0f} ms)"
        )
        for name, label in (("idle", "idle device"), ("busy", "during the copies")):
            row(
                f"{label}: submit/wake delay, latency p95",
                f"{x[name + '_submit_p95_ms']:.2f} / {x[name + '_wake_p95_ms']:.2f} / "
                f"{x[name + '_latency_p95_ms']:.2f} ms",
            )
    if "idle_poll" in r or "idle_block" in r:
        lines.append("idle cost (process CPU while one coroutine awaits a 1 s kernel)")
    for key, label in [("idle_poll", "poll completion"), ("idle_block", "block completion")]:
        if key in r:
            row(label, f"{r[key]['cpu_percent']:.2f} % of one core")
    if "packing" in r:
        x = r["packing"]
        lines.append("host args (a typical launch: 3 pointers + 2 scalars + 16 B tiling)")
        row("build and pack a HostArgs", f"{x['build_and_pack_us']:.2f} us")
        row("snapshot it into a pooled pinned buffer", f"{x['snapshot_into_pool_us']:.2f} us")
    if any(key in r for key in ACL_STEPS):
        lines.append("the acl backend over its C test double (noop kernels)")
        acl_rows(r, row)
    if "ratios" in r:
        lines.append("targets (ratios measured side by side in this run)")
        for name, x in r["ratios"].items():
            verdict = "met" if x["met"] else "NOT MET"
            row(name, f"{x['value']:>9} (target {x['target']}) {verdict}")
    return "\n".join(lines)
