"""A three-stage, multi-stream pipeline: copy in / compute / copy out, overlapped.

Runs on the embedded simulator (``sim``)::

    python examples/pipeline.py                        # 2000 requests
    python examples/pipeline.py --requests 200 --streams 2 --loop trio

Each request copies two vectors to the device on one stream, computes ``z = f * (a*x + y)``
(``axpy`` then ``scale``) on a second, and copies ``z`` back on a third. The stages are chained
on the device with events (``record_event`` / ``wait_event``), so the host never waits between
them, and many requests are in flight at once. Every result is checked against numpy.

This is the pipelined, two-await form: each stage call returns a ``Task`` once *queued*, and
only the last stage is awaited. (``aio-ascend demo`` runs the same pipeline with a progress bar,
a trace and latency figures.)
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Sequence

import anyio
import numpy as np

import aio_ascend as aa


class Stages:
    """The streams of each stage (round-robin per request) and the kernels."""

    def __init__(self, dev: aa.Device, streams: int) -> None:
        self.copy_in = [dev.stream() for _ in range(streams)]
        self.compute = [dev.stream() for _ in range(streams)]
        self.copy_out = [dev.stream() for _ in range(streams)]
        self.axpy = dev.function("axpy")
        self.scale = dev.function("scale")


async def one_request(
    dev: aa.Device, stages: Stages, index: int, x: np.ndarray, y: np.ndarray, a: float, f: float
) -> bool:
    n = x.size
    lane = index % len(stages.copy_in)
    s_in, s_c, s_out = stages.copy_in[lane], stages.compute[lane], stages.copy_out[lane]
    root = dev.malloc(3 * 4 * n)  # one allocation, three views
    dx, dy, dz = root[: 4 * n], root[4 * n : 8 * n], root[8 * n :]
    out = np.empty(n, np.float32)

    await s_in.copy_to_device(dx, x)
    await s_in.copy_to_device(dy, y)
    ev_in = await s_in.record_event()

    await s_c.wait_event(ev_in)
    await s_c.launch(stages.axpy, 8, aa.HostArgs().ptr(dx).ptr(dy).f32(a).u32(n))
    tiling = struct.pack("<If", n, f)
    await s_c.launch(stages.scale, 8, aa.HostArgs().ptr(dy).ptr(dz).placeholder(tiling))
    ev_c = await s_c.record_event()

    await s_out.wait_event(ev_c)
    await s_out.download(dz, out=out)  # the one await: `out` is filled when it returns
    root.free()  # the queued work is done: freed now (it would be deferred otherwise)
    expected = np.float32(f) * (np.float32(a) * x + y)
    return bool(np.allclose(out, expected, rtol=1e-6))


async def run(
    requests: int, streams: int, concurrency: int, n: int, progress: bool
) -> tuple[int, float, int]:
    rng = np.random.default_rng(0)
    ok = done = 0
    step = max(requests // 10, 1)
    async with aa.open_device(0, backend="sim") as dev:
        stages = Stages(dev, streams)
        indices = iter(range(requests))

        # ``concurrency`` workers, each taking the next request when it is done with one: at
        # most that many requests (and their inputs) exist at once, however many are asked for
        async def worker() -> None:
            nonlocal ok, done
            for index in indices:
                x = rng.standard_normal(n, dtype=np.float32)
                y = rng.standard_normal(n, dtype=np.float32)
                a, f = float(rng.uniform(-2, 2)), float(rng.uniform(0.5, 2))
                matched = await one_request(dev, stages, index, x, y, a, f)
                ok += matched  # (not `ok += await ...`: that reads `ok` before the await)
                done += 1
                if progress and (done % step == 0 or done == requests):
                    print(f"  {done}/{requests} requests done", file=sys.stderr)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, requests)):
                tg.start_soon(worker)
        elapsed = time.perf_counter() - started
        opened = dev.stats()["streams"]
    return ok, elapsed, opened


def _interrupted(exc: BaseException) -> bool:
    # Ctrl-C: on trio it arrives inside the task group's BaseExceptionGroup
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(KeyboardInterrupt)[0] is not None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="copy/compute/copy pipeline on the sim backend")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1, help="streams per stage")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--size", type=int, default=16_384, help="float32 elements per vector")
    parser.add_argument("--loop", choices=["asyncio", "uvloop", "trio"], default="asyncio")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    args = parser.parse_args(argv)
    for name in ("requests", "streams", "concurrency", "size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    backend, options = (
        ("asyncio", {"use_uvloop": True}) if args.loop == "uvloop" else (args.loop, {})
    )
    if not args.quiet:
        print(f"running {args.requests} requests on {args.loop} ...", file=sys.stderr)
    try:
        ok, elapsed, streams = anyio.run(
            run,
            args.requests,
            args.streams,
            args.concurrency,
            args.size,
            not args.quiet,
            backend=backend,
            backend_options=options,
        )
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        print("interrupted", file=sys.stderr)  # (the device was closed on the way out)
        return 130
    print(
        f"{ok}/{args.requests} results match numpy; {streams} streams; "
        f"{args.requests / elapsed:,.0f} requests/s ({elapsed:.2f} s)"
    )
    return 0 if ok == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
