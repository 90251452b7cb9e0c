"""The multi-stream pipeline behind ``aio-ascend demo`` and ``examples/pipeline.py``.

Every request moves two vectors through three stages, each on its own stream, chained on the
device by events (no host round trip between stages)::

    h2d stream       copy x, copy y -> device              record_event(ev_in)
    compute stream   wait_event(ev_in); axpy (y = a*x + y); scale (z = f*y)   record_event(ev_c)
    d2h stream       wait_event(ev_c); copy z -> host      record_event(ev_out)

Many requests are in flight at once (``concurrency`` workers, each with its own device
buffers), so the copy of request *k+1* overlaps the compute of request *k*. Every result is
checked against numpy.

With ``trace=True`` a tiny user kernel (``mark``, from an :class:`aio_ascend.sim.KernelLibrary`)
is launched at the end of each stage to time-stamp the moment the device finished it, and each
request contributes three phases per stage to the trace: *queued* (the first ``await
s.launch``/copy called -> the last one returned), *submitted/executing* (-> the device finished
the stage) and *completed->resumed* (-> the awaiting coroutine resumed). These are seen from the
caller: no hook inside the library is needed.
"""

from __future__ import annotations

import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import numpy as np
import numpy.typing as npt

from .. import Device, HostArgs, Stream, open_device
from .progress import Progress
from .trace import Span, percentile

__all__ = [
    "STAGES",
    "DemoConfig",
    "DemoResult",
    "format_demo",
    "make_inputs",
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
    spans: list[Span] = field(default_factory=list)

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


def _mark_library(stamps: list[float]) -> Any:
    """A user kernel that records when the device reached it: ``mark(u32 index)``."""
    from ..sim import KernelLibrary

    lib = KernelLibrary("demo-trace")
    clock = time.perf_counter

    @lib.kernel("mark")
    def mark(ctx: Any) -> None:
        stamps[ctx.u32(0)] = clock()

    return lib


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


def make_inputs(cfg: DemoConfig) -> list[tuple[F32Array, F32Array, F32Array]]:
    """The ``(x, y, expected)`` triples the requests cycle over (``expected`` from numpy)."""
    rng = np.random.default_rng(cfg.seed)
    pairs = []
    for _ in range(cfg.distinct_inputs):
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
    axpy, scale = dev.function("axpy"), dev.function("scale")
    stamps: list[float] = [0.0] * (3 * cfg.requests) if cfg.trace else []
    mark = dev.load_module(_mark_library(stamps)).function("mark") if cfg.trace else None
    workers = min(cfg.concurrency, cfg.requests)
    slots = [_Slot(dev, cfg.n) for _ in range(workers)]
    latencies: list[float] = []
    spans: list[Span] = []
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
        # stage 1: host -> device
        t_in = now()
        await s_in.copy_to_device(slot.x, x)
        await s_in.copy_to_device(slot.y, y)
        if mark is not None:
            await s_in.launch(mark, 1, HostArgs().u32(3 * i))
        ev_in = await s_in.record_event()
        # stage 2: compute, once stage 1 is done on the device
        t_c = now()
        await s_c.wait_event(ev_in)
        await s_c.launch(axpy, BLOCKS, slot.axpy_args)
        await s_c.launch(scale, BLOCKS, slot.scale_args)
        if mark is not None:
            await s_c.launch(mark, 1, HostArgs().u32(3 * i + 1))
        ev_c = await s_c.record_event()
        # stage 3: device -> host, once stage 2 is done on the device
        t_out = now()
        await s_out.wait_event(ev_c)
        copy = await s_out.copy_to_host(slot.out, slot.z)
        if mark is not None:
            await s_out.launch(mark, 1, HostArgs().u32(3 * i + 2))
        ev_out = await s_out.record_event()
        t_issued = now()
        await ev_in
        r_in = now()
        await ev_c
        r_c = now()
        await ev_out
        await copy
        r_out = now()
        latencies.append((r_out - t_in) * 1e6)
        if not np.array_equal(slot.out, expected) and not np.allclose(
            slot.out, expected, rtol=1e-5, atol=1e-6
        ):
            wrong += 1
            if len(errors) < 5:
                bad = int(np.argmax(~np.isclose(slot.out, expected, rtol=1e-5, atol=1e-6)))
                errors.append(
                    f"request {i}: element {bad} is {slot.out[bad]!r}, numpy says {expected[bad]!r}"
                )
        if mark is not None:
            stages = ((t_in, t_c, r_in), (t_c, t_out, r_c), (t_out, t_issued, r_out))
            for k, (called, issued, resumed) in enumerate(stages):
                track = names[k * cfg.streams + lane]
                done = min(max(stamps[3 * i + k], issued), resumed)
                group = (i, k)
                args = {"request": i}
                spans.append(Span(track, "queued", called, issued, group, args))
                spans.append(Span(track, "submitted/executing", issued, done, group, args))
                spans.append(Span(track, "completed->resumed", done, resumed, group, args))

    async def worker(slot: _Slot) -> None:
        nonlocal next_request
        while next_request < cfg.requests:
            i = next_request
            next_request += 1
            try:
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
    return DemoResult(cfg, wall, latencies, wrong, errors, stats, names, spans)


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
    for err in result.errors:
        lines.append(f"  ERROR        {err}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - use ``aio-ascend demo``
    print(format_demo(run_demo(DemoConfig(progress=sys.stderr))))
