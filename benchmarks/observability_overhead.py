"""What observing costs per task: host CPU per launch with nothing observing, with
``aio_ascend.tracing`` recording, with ``aio_ascend.metrics.PrometheusMetrics`` and with
``aio_ascend.metrics.OtelSpans`` (an SDK provider with no exporter) observing.

The launch storm of the bench's "(c) scheduler" row (256 coroutines launching ``noop`` on the
sim), the modes interleaved round by round so that a noisy machine drifts all of them alike;
the table gives each mode's median over the rounds and its difference from "off". A mode whose
extra is not installed is left out.

    python benchmarks/observability_overhead.py [--rounds 5] [--launches 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import anyio

import aio_ascend as aa
from aio_ascend import metrics, tracing
from aio_ascend._tools.bench import _launch_storm


def _modes() -> dict[str, Callable[[], Any]]:
    modes: dict[str, Callable[[], Any]] = {
        "off": contextlib.nullcontext,
        "tracing": lambda: tracing.Tracer(max_tasks=10**7),
    }
    try:
        import prometheus_client

        modes["prometheus"] = lambda: metrics.PrometheusMetrics(
            registry=prometheus_client.CollectorRegistry()
        )
    except ImportError:
        pass
    try:
        from opentelemetry.sdk.trace import TracerProvider

        modes["otel"] = lambda: metrics.OtelSpans(tracer_provider=TracerProvider())
    except ImportError:
        pass
    return modes


async def _one(mode: Callable[[], Any], launches: int, launchers: int) -> float:
    async with aa.open_device(0, backend="sim") as dev:
        await _launch_storm(dev, 2_000, launchers)  # warm-up: pools, events
        observer = mode()
        cpu0 = time.process_time()
        with observer:
            done = await _launch_storm(dev, launches, launchers)
        cpu = time.process_time() - cpu0
    return cpu / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=20_000)
    parser.add_argument("--launchers", type=int, default=256)
    args = parser.parse_args()
    modes = _modes()
    samples: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, mode in modes.items():
            samples[name].append(anyio.run(_one, mode, args.launches, args.launchers))
    base = statistics.median(samples["off"])
    print(f"host CPU per launch, median of {args.rounds} rounds of {args.launches} launches")
    for name, values in samples.items():
        median = statistics.median(values)
        spread = f"{min(values):.1f}..{max(values):.1f}"
        print(f"  {name:<11} {median:6.1f} us  ({spread})  {median - base:+6.1f} us per task")


if __name__ == "__main__":
    main()
