"""What ``dev.external_stream(torch_stream)``'s handshake with torch_npu costs per call.

``python benchmarks/torch_ordering_cost.py [N]`` queues N memsets on one external stream of
the sim, opened once from the handle alone and once from a stream object (one whose
``npu_stream`` returns at once, as a torch_npu stream with an empty task queue does), and
prints the time per call. The difference is the handshake: an event recorded after each
operation and the wait until the submitter thread has handed both to the runtime.
"""

from __future__ import annotations

import sys
import time

import anyio

import aio_ascend as aa


class TorchStream:
    """A torch_npu stream whose task queue is empty: reading ``npu_stream`` costs nothing."""

    def __init__(self, handle: int) -> None:
        self.npu_stream = handle


async def per_call(ordered: bool, n: int) -> float:
    async with aa.open_device(0, backend="sim") as dev:
        handle = dev.runtime.create_stream()
        stream = dev.external_stream(TorchStream(handle) if ordered else handle)
        buf = dev.malloc(64)
        await stream.memset(buf, 0)
        await stream.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            await stream.memset(buf, 1)
        seconds = (time.perf_counter() - start) / n
        await stream.synchronize()
        await stream.aclose()
        dev.runtime.destroy_stream(handle)
        return seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for _ in range(2):
        plain = anyio.run(per_call, False, n)
        ordered = anyio.run(per_call, True, n)
        print(
            f"{n} memsets: plain handle {plain * 1e6:.1f} us/call, "
            f"torch stream object {ordered * 1e6:.1f} us/call"
        )


if __name__ == "__main__":
    main()
