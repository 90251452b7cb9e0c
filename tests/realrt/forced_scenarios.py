"""Forced closes of busy streams on the real runtime, each run in a process of its own.

``python -m realrt.forced_scenarios <scenario> <asyncio|uvloop|trio>`` from ``tests/``: prints
``scenario passed`` and exits 0, or fails with an assertion. Run by
``test_realrt_scheduler.py::test_forced_closes_of_busy_streams_return_on_time``, in a process of
its own so that a hang there touches no other test.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import numpy as np
from realrt.fixture import fakehal, realrt_library, use_kernel_binary

import aio_ascend as aa


def _open(**kwargs: Any) -> Any:
    library = realrt_library()
    fakehal().reset()
    use_kernel_binary()
    options = {"library_path": str(library)}
    return aa.open_device(0, backend="acl", runtime_options=options, **kwargs)


async def _held_streams(dev: aa.Device, count: int) -> tuple[list[aa.Stream], list[aa.Task]]:
    hal = fakehal()
    streams = [dev.stream() for _ in range(count)]
    buf = dev.malloc(256)
    tasks = []
    for i, s in enumerate(streams):
        hal.hold(s.handle)
        tasks.append(await s.memset(buf, i + 1))
    with anyio.fail_after(10):
        while dev.stats()["batches"] < count:  # noqa: ASYNC110 - every stream holds work
            await anyio.sleep(0.01)
    return streams, tasks


async def several_busy_streams_closed_by_the_device() -> None:
    dev = await _open()
    _, tasks = await _held_streams(dev, 2)
    with anyio.fail_after(10):
        await dev.aclose(timeout=0.2)
    for task in tasks:
        assert isinstance(task.exception(), aa.TaskTimeoutError), task


async def busy_streams_closed_in_turn() -> None:
    async with await _open() as dev:
        streams, tasks = await _held_streams(dev, 2)
        with anyio.fail_after(10):
            for s in streams:
                await s.aclose(cancel=True, timeout=0.2)
            for task in tasks:
                await task.wait_finished()
                assert isinstance(task.exception(), aa.TaskTimeoutError), task
            other = dev.stream()
            buf = dev.malloc(256)
            out = np.zeros(256, np.uint8)
            await (await other.copy_to_device(buf, np.full(256, 7, np.uint8)))
            await (await other.copy_to_host(out, buf))
        assert (out == 7).all()
        fakehal().reset()  # (a stall probe of a held stream may still be inside the runtime)


def main() -> None:
    scenario, loop = sys.argv[1], sys.argv[2]
    run = globals()[scenario]
    if loop == "trio":
        anyio.run(run, backend="trio")
    else:
        anyio.run(run, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})
    print("scenario passed")


if __name__ == "__main__":
    main()
