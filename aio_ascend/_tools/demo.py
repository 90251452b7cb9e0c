"""The multi-stream pipeline behind ``aio-ascend demo`` and ``examples/pipeline.py``.

Every request moves two vectors through three stages, each on its own stream, chained on the
device by events (no host round trip between stages)::

    h2d stream       copy x, copy y -> device              record_event(ev_in)
    compute stream   wait_event(ev_in); axpy (y = a*x + y); scale (z = f*y)   record_event(ev_c)
    d2h stream       wait_event(ev_c); copy z -> host      record_event(ev_out)

Many requests are in flight at once (``concurrency`` workers, each with its own device
buffers), so the copy of request *k+1* overlaps the compute of request *k*. Every result is
checked against numpy.

With ``trace=True`` the run is recorded with :mod:`aio_ascend.tracing`, the hook users turn
on for their own programs: every request is a :func:`~aio_ascend.tracing.request` block, the
streams are named after their stage (``h2d #0``, ``compute #0``, ``d2h #0``, ...), and every
task of every request is a slice on its stream's track carrying its phases (queued, on the
device, and the library's wake-up of the coroutine that waited for it), linked by flow arrows,
with each stream's queued and in-flight counts beside it.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import anyio
import numpy as np
import numpy.typing as npt

from .. import Device, HostArgs, Stream, open_device
from ..tracing import TaskRecord, Tracer, request
from .progress import Progress
from .stats import percentile

__all__ = [
    "STAGES",
    "DemoConfig",
    "DemoResult",
    "format_demo",
    "make_inputs",
    "phase_summary",
    "percentile",
    "run_demo",
    "run_pipeline",
    "track_names",
]

STAGES = ("h2d", "compute", "d2h")
LOOPS = ("asyncio", "uvloop", "trio")
#: the pipeline's constants: z = FACTOR * (A * x + y)
A = 2.0
FACTOR = 0.5
BLOCKS = 8

F32Array = npt.NDArray[np.float32]


@dataclass
class DemoConfig:
    """What the pipeline runs."""

    requests: int = 2000
    #: streams per stage (the pipeline uses ``3 * streams`` streams)
    streams: int = 1
    #: requests in flight at once
    concurrency: int = 16
    #: float32 elements per vector
    n: int = 16_384
    loop: str = "asyncio"
    trace: bool = False
    progress: TextIO | None = None
    seed: int = 0
    #: distinct input pairs (requests cycle over them; each has a precomputed reference)
    distinct_inputs: int = 16

    def validate(self) -> None:
        for name in ("requests", "streams", "concurrency", "n", "distinct_inputs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.streams > 100:
            raise ValueError(f"streams={self.streams} is too many (at most 100 per stage)")
        if self.n >= 2**30:
            raise ValueError(f"n={self.n} is too large")
        if self.loop not in LOOPS:
            raise ValueError(f"loop={self.loop!r}: expected one of {', '.join(LOOPS)}")


@dataclass
class DemoResult:
    """What one pipeline run measured."""

    config: DemoConfig
    wall_s: float
    latencies_us: list[float]
    wrong: int
    errors: list[str]
    stats: dict[str, int]
    tracks: list[str]
    #: the recording of the run (``trace=True``), stopped
    tracer: Tracer | None = None

    @property
    def completed(self) -> int:
        return len(self.latencies_us)

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and not self.errors and self.completed == self.config.requests

    @property
    def throughput(self) -> float:
        """Requests per second."""
        return self.completed / self.wall_s if self.wall_s > 0 else float("nan")


class _Slot:
    """One worker's device buffers and output array (reused request after request)."""

    def __init__(self, dev: Device, n: int) -> None:
        nbytes = 4 * n
        self.x = dev.malloc(nbytes)
        self.y = dev.malloc(nbytes)
        self.z = dev.malloc(nbytes)
        self.out: F32Array = np.empty(n, np.float32)
        self.axpy_args = HostArgs().ptr(self.x).ptr(self.y).f32(A).u32(n)
        tiling = struct.pack("<If", n, FACTOR)
        self.scale_args = HostArgs().ptr(self.y).ptr(self.z).placeholder(tiling)

    def free(self) -> None:
        for buf in (self.x, self.y, self.z):
            buf.free()


#: host memory the demo's precomputed inputs may take
INPUTS_BUDGET_BYTES = 1 << 30


def make_inputs(cfg: DemoConfig) -> list[tuple[F32Array, F32Array, F32Array]]:
    """The ``(x, y, expected)`` triples the requests cycle over (``expected`` from numpy):
    ``distinct_inputs`` of them, but no more than there are requests, nor more than fit in
    :data:`INPUTS_BUDGET_BYTES` (at least one: ``--size 100000000`` made 19 GB of them)."""
    rng = np.random.default_rng(cfg.seed)
    pairs = []
    fit = max(1, INPUTS_BUDGET_BYTES // (3 * 4 * cfg.n))
    for _ in range(min(cfg.distinct_inputs, cfg.requests, fit)):
        x = rng.standard_normal(cfg.n, dtype=np.float32)
        y = rng.standard_normal(cfg.n, dtype=np.float32)
        expected = np.float32(FACTOR) * (np.float32(A) * x + y)
        pairs.append((x, y, expected))
    return pairs


def track_names(streams: int) -> list[str]:
    """The trace track of each stream, stage by stage."""
    return [f"{stage} #{lane}" for stage in STAGES for lane in range(streams)]


async def run_pipeline(cfg: DemoConfig, dev: Device | None = None) -> DemoResult:
    """Run the pipeline in the current event loop (opens a ``sim`` device unless given one)."""
    cfg.validate()
    if dev is None:
        async with open_device(0, backend="sim") as opened:
            return await _pipeline(cfg, opened)
    return await _pipeline(cfg, dev)


async def _pipeline(cfg: DemoConfig, dev: Device) -> DemoResult:
    inputs = make_inputs(cfg)
    lanes: list[tuple[Stream, Stream, Stream]] = [
        (dev.stream(), dev.stream(), dev.stream()) for _ in range(cfg.streams)
    ]
    names = track_names(cfg.streams)
    tracer = Tracer(max_tasks=12 * cfg.requests) if cfg.trace else None
    if tracer is not None:
        for k, stage in enumerate(zip(*lanes, strict=True)):
            for lane, stream in enumerate(stage):
                tracer.name_stream(stream, names[k * cfg.streams + lane])
    axpy, scale = dev.function("axpy"), dev.function("scale")
    workers = min(cfg.concurrency, cfg.requests)
    slots = [_Slot(dev, cfg.n) for _ in range(workers)]
    latencies: list[float] = []
    errors: list[str] = []
    wrong = 0
    next_request = 0
    bar = Progress(cfg.progress, cfg.requests, title="demo", unit="req")
    now = time.perf_counter

    async def one(i: int, slot: _Slot) -> None:
        nonlocal wrong
        x, y, expected = inputs[i % len(inputs)]
        lane = i % cfg.streams
        s_in, s_c, s_out = lanes[lane]
        t_in = now()
        # stage 1: host -> device
        await s_in.copy_to_device(slot.x, x)
        await s_in.copy_to_device(slot.y, y)
        ev_in = await s_in.record_event()
        # stage 2: compute, once stage 1 is done on the device
        await s_c.wait_event(ev_in)
        await s_c.launch(axpy, BLOCKS, slot.axpy_args)
        await s_c.launch(scale, BLOCKS, slot.scale_args)
        ev_c = await s_c.record_event()
        # stage 3: device -> host, once stage 2 is done on the device
        await s_out.wait_event(ev_c)
        copy = await s_out.copy_to_host(slot.out, slot.z)
        ev_out = await s_out.record_event()
        await ev_in
        await ev_c
        await ev_out
        await copy
        latencies.append((now() - t_in) * 1e6)
        if not np.array_equal(slot.out, expected) and not np.allclose(
            slot.out, expected, rtol=1e-5, atol=1e-6
        ):
            wrong += 1
            if len(errors) < 5:
                bad = int(np.argmax(~np.isclose(slot.out, expected, rtol=1e-5, atol=1e-6)))
                errors.append(
                    f"request {i}: element {bad} is {slot.out[bad]!r}, numpy says {expected[bad]!r}"
                )

    async def worker(slot: _Slot) -> None:
        nonlocal next_request
        while next_request < cfg.requests:
            i = next_request
            next_request += 1
            try:
                with request(f"request {i}") if tracer is not None else contextlib.nullcontext():
                    await one(i, slot)
            except Exception as exc:
                if len(errors) < 5:
                    errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                elif len(errors) == 5:
                    errors.append("... (more errors)")
                if dev.fault is not None:
                    next_request = cfg.requests  # sticky: every later request would fail too
            bar.step()

    started = now()
    try:
        with tracer if tracer is not None else contextlib.nullcontext():
            async with anyio.create_task_group() as tg:
                for slot in slots:
                    tg.start_soon(worker, slot)
        wall = now() - started
        stats = dict(dev.stats())
    finally:
        for slot in slots:
            slot.free()
        for lane_streams in lanes:
            for s in lane_streams:
                await s.aclose()
    return DemoResult(cfg, wall, latencies, wrong, errors, stats, names, tracer)


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Run the pipeline on a fresh event loop of kind ``cfg.loop``."""
    cfg.validate()
    if cfg.loop == "trio":
        result: DemoResult = anyio.run(run_pipeline, cfg, backend="trio")
    elif cfg.loop == "uvloop":
        result = anyio.run(
            run_pipeline, cfg, backend="asyncio", backend_options={"use_uvloop": True}
        )
    else:
        result = anyio.run(run_pipeline, cfg, backend="asyncio")
    return result


def format_demo(result: DemoResult) -> str:
    """A short plain-text report."""
    cfg = result.config
    lat = result.latencies_us
    moved = 3 * 4 * cfg.n * result.completed / result.wall_s if result.wall_s > 0 else 0.0
    stats = result.stats
    lines = [
        f"aio-ascend demo: {cfg.requests} requests, {3 * cfg.streams} streams "
        f"(h2d -> compute -> d2h, {cfg.streams} per stage), {min(cfg.concurrency, cfg.requests)} "
        f"in flight, n={cfg.n} float32, loop={cfg.loop}, backend=sim",
        f"  verified     {result.completed - result.wrong}/{cfg.requests} results match numpy "
        f"(z = {FACTOR} * ({A} * x + y))",
        f"  throughput   {result.throughput:,.0f} requests/s  ({moved / 1e9:.2f} GB/s copied, "
        f"{result.wall_s:.2f} s)",
        f"  latency      p50 {percentile(lat, 50):,.0f} us  p99 {percentile(lat, 99):,.0f} us  "
        f"max {max(lat, default=float('nan')):,.0f} us",
        f"  device       launches={stats.get('launches', 0)} copies={stats.get('copies', 0)} "
        f"batches={stats.get('batches', 0)} wakeups={stats.get('wakeups', 0)} "
        f"peak_in_flight={stats.get('peak_in_flight', 0)}",
    ]
    if result.tracer is not None:
        for label, (p50, p99, count) in phase_summary(result.tracer.records).items():
            lines.append(f"  {label:<12} p50 {p50:,.0f} us  p99 {p99:,.0f} us  ({count} tasks)")
    for err in result.errors:
        lines.append(f"  ERROR        {err}")
    return "\n".join(lines)


#: the phases of a task, as ``format_demo`` reports them from a trace
PHASES = {
    "queued": "admitted -> its batch handed to the runtime",
    "on device": "submitted -> observed complete (waits behind earlier work included)",
    "wake": "observed complete -> the waiting coroutine resumed (the library's wake-up)",
}


def phase_summary(records: list[TaskRecord]) -> dict[str, tuple[float, float, int]]:
    """p50, p99 (microseconds) and count of each phase over ``records`` (see ``PHASES``)."""
    series: dict[str, list[float]] = {name: [] for name in PHASES}
    for r in records:
        for name, value in (("queued", r.queued), ("on device", r.on_device), ("wake", r.wake)):
            if value is not None:
                series[name].append(value * 1e6)
    return {
        name: (percentile(values, 50), percentile(values, 99), len(values))
        for name, values in series.items()
        if values
    }


if __name__ == "__main__":  # pragma: no cover - use ``aio-ascend demo``
    print(format_demo(run_demo(DemoConfig(progress=sys.stderr))))
