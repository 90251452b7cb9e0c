"""One stream never costs another: streams dropped without ``aclose()`` are released, and their
number does not weigh on later work."""

from __future__ import annotations

import gc
import warnings

import pytest
from helpers import OpenDevice, live_resources

import aio_ascend as aa


def _sleep_args(us: int) -> aa.HostArgs:
    return aa.HostArgs().u32(us)


async def _drop(keep: aa.Stream, doomed: list[aa.Stream]) -> None:
    """Drop the streams of ``doomed`` (the only references) and let the loop side look at what
    was collected (a flush, through another stream's launch)."""
    doomed.clear()
    gc.collect()
    await keep.run(keep.device.function("noop"), 1)


@pytest.mark.anyio
async def test_a_dropped_stream_is_destroyed_after_its_queued_work(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        await keep.run(noop, 1)
        base = live_resources(dev)["streams"]
        doomed = [dev.stream()]
        task = await doomed[0].launch(dev.function("sleep"), 1, _sleep_args(300_000))
        after = await doomed[0].launch(noop, 1)
        with pytest.warns(ResourceWarning, match=r"Stream .* without aclose\(\)"):
            await _drop(keep, doomed)
        # its work is still queued: the runtime stream is still there, closed to nothing else
        assert not after.done()
        assert live_resources(dev)["streams"] == base + 1
        await task
        await after  # the work queued on it completed normally
        assert after.completed_at is not None
        # destroyed in the same delivery round that finished its last task
        assert live_resources(dev)["streams"] == base
        assert dev.stats()["streams"] == 1
        await keep.run(noop, 1)


@pytest.mark.anyio
async def test_a_stream_dropped_with_unflushed_work_runs_it_then_goes(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        base = live_resources(dev)["streams"]
        doomed = [dev.stream()]
        tasks = [await doomed[0].launch(noop, 1) for _ in range(5)]
        # dropped in the same loop tick: its requests are not even submitted yet
        with pytest.warns(ResourceWarning, match="without aclose"):
            await _drop(keep, doomed)
        for task in tasks:
            await task
        assert all(task.completed_at is not None for task in tasks)
        await keep.run(noop, 1)
        assert live_resources(dev)["streams"] == base
        assert dev.stats()["streams"] == 1


@pytest.mark.anyio
async def test_closed_and_external_streams_dropped_warn_nothing_and_destroy_nothing_twice(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        handle = dev.runtime.create_stream()
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                closed = dev.stream()
                await closed.run(noop, 1)
                await closed.aclose()
                external = dev.external_stream(handle)
                await external.run(noop, 1)
                del closed, external
                gc.collect()
                await keep.run(noop, 1)
            assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []
            assert dev.stats()["streams"] == 1  # the external one is let go of ...
            dev.runtime.synchronize_stream(handle, 1000)  # ... and its runtime stream is untouched
        finally:
            dev.runtime.destroy_stream(handle)


@pytest.mark.anyio
async def test_the_poller_visits_only_streams_with_work_outstanding(
    open_dev: OpenDevice,
) -> None:
    # Per-launch cost independent of the number of streams ever made: each poll round looks
    # at the streams that have batches outstanding, never at idle or dropped ones.
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        idle = [dev.stream() for _ in range(50)]
        for s in idle:
            await s.run(noop, 1)
        doomed = [dev.stream() for _ in range(200)]
        for index in range(len(doomed)):
            await doomed[index].run(noop, 1)
        with pytest.warns(ResourceWarning):
            await _drop(keep, doomed)
        poller = dev._scheduler._poller
        assert poller._outstanding == {}  # every batch observed: nothing left to visit
        slow = await keep.launch(dev.function("sleep"), 1, _sleep_args(500_000))
        await idle[0].run(noop, 1)
        assert set(poller._outstanding) == {keep.handle}
        await slow
        assert dev.stats()["streams"] == 1 + len(idle)
        assert live_resources(dev)["streams"] == 1 + len(idle)
