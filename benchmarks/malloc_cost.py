"""What ``dev.malloc`` + ``free()`` costs on the loop thread: from the device's caching pool
(the default) against a direct runtime allocation (``malloc(pool=False)``, what every
``malloc`` was before the pool), the two interleaved round by round.

    python benchmarks/malloc_cost.py [--backend sim] [--nbytes 4096] [--pairs 20000]

On the sim a block that comes back to the pool is also poisoned (filled with ``0xCD``), which
a real device does not do.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aio_ascend as aa


async def measure(backend: str, nbytes: int, pairs: int, rounds: int) -> dict[str, float]:
    """Median microseconds per malloc+free pair, per mode."""
    results: dict[str, list[float]] = {"pool": [], "direct": []}
    async with aa.open_device(0, backend=backend) as dev:
        for _ in range(rounds):
            for mode, pooled in (("pool", True), ("direct", False)):
                started = time.perf_counter()
                for _ in range(pairs):
                    dev.malloc(nbytes, pool=pooled).free()
                results[mode].append((time.perf_counter() - started) / pairs * 1e6)
        print(f"memory_stats: {dict(dev.memory_stats())}")
    return {mode: statistics.median(values) for mode, values in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--nbytes", type=int, default=4096)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.backend, args.nbytes, args.pairs, args.rounds))
    for mode, us in figures.items():
        print(f"{args.backend} {mode:6}  {us:7.2f} us per malloc+free of {args.nbytes} bytes")


if __name__ == "__main__":
    main()
