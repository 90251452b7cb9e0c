"""Graphs: ``Stream.capture()`` records work once, ``run_graph``/``launch_graph`` replay it with
one runtime call; what the replays read lives as long as the graph.

On the backends that implement the runtime's capture (``BACKENDS``), on asyncio, uvloop
and trio.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import assert_runtime_clean, close_while_waiting

import aio_ascend as aa
from aio_ascend import testing

pytestmark = pytest.mark.anyio

F32 = np.float32
BACKENDS = ("sim", "cuda-fake", "acl", "realrt")


def axpy(x: aa.DeviceBuffer, y: aa.DeviceBuffer, a: float, n: int) -> aa.HostArgs:
    return aa.HostArgs().ptr(x).ptr(y).f32(a).u32(n)


async def test_a_graph_runs_only_when_replayed_on_any_stream(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s, t = dev.stream(), dev.stream()
        n = 64
        x, y = dev.malloc(4 * n), dev.malloc(4 * n)
        await s.upload(x, np.ones(n, F32))
        await s.memset(y, 0)
        fn = dev.function("axpy")
        async with s.capture() as capture:
            for _ in range(5):
                capture.launch(fn, 2, axpy(x, y, 1.0, n))
        graph = capture.graph
        assert isinstance(graph, aa.Graph)
        assert graph.operations == 5
        assert (await s.download(y, F32)).tolist() == [0.0] * n  # captured, not run
        await t.run_graph(graph)
        assert (await t.download(y, F32)).tolist() == [5.0] * n
        tasks = [await s.launch_graph(graph) for _ in range(3)]
        await tasks[-1]
        assert all(task.done() and task.exception() is None for task in tasks)
        assert (await s.download(y, F32)).tolist() == [20.0] * n
        graph.close()
        assert dev.stats()["graphs"] == 0


async def test_a_captured_upload_copies_the_bytes_given_at_capture(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(16)
        data = np.arange(16, dtype=np.uint8)
        async with s.capture() as capture:
            capture.copy_to_device(buf, data)
            capture.memset(buf[8:], 0xFF, 4)
        data[:] = 0  # the graph copies what it was given
        await s.memset(buf, 7)
        await s.run_graph(capture.graph)
        expected = list(range(16))
        expected[8:12] = [0xFF] * 4
        assert (await s.download(buf)).tolist() == expected
        capture.graph.close()


async def test_the_graph_keeps_its_buffers_until_closed_and_replayed(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        src, dst = dev.malloc(256), dev.malloc(256)
        await s.memset(src, 3)
        buffers = dev.stats()["device_buffers"]
        async with s.capture() as capture:
            capture.copy_device(dst, src)
        graph = capture.graph
        src.free()  # deferred: the graph uses it
        assert dev.stats()["device_buffers"] == buffers
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))
        replay = await s.launch_graph(graph)
        graph.close()  # deferred: a replay is queued
        assert graph.closed
        assert dev.stats()["graphs"] == 1
        with pytest.raises(aa.ClosedError, match="closed"):  # (a ValueError, unlike a plan's)
            await s.launch_graph(graph)
        await replay
        assert dev.stats()["graphs"] == 0
        assert dev.stats()["device_buffers"] == buffers - 1
        assert (await s.download(dst)).tolist() == [3] * 256


async def test_an_exception_in_the_block_captures_nothing(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(4096)
        in_use = dev.stats()["host_buffers_in_use"]
        capture = s.capture()

        async def record_then_fail() -> None:
            async with capture:
                capture.copy_to_device(buf, np.ones(4096, np.uint8))
                capture.launch(dev.function("noop"), 1)
                raise KeyError("user code failed")

        with pytest.raises(KeyError):
            await record_then_fail()
        assert capture.graph is None
        assert dev.stats()["host_buffers_in_use"] == in_use
        assert dev.stats()["graphs"] == 0
        buf.free()
        assert dev.stats()["device_buffers"] == 0  # nothing kept it in use


async def test_bad_captures_are_refused_in_the_call(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as other, open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        with pytest.raises(ValueError, match="nothing was captured"):
            async with s.capture():
                pass
        capture = s.capture()
        with pytest.raises(RuntimeError, match="inside"):
            capture.memset(buf, 0)
        async with capture:
            with pytest.raises(TypeError):
                capture.launch("noop", 1)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="blocks"):
                capture.launch(dev.function("noop"), 0)
            with pytest.raises(ValueError, match="different device"):
                capture.launch(other.function("noop"), 1)
            with pytest.raises(ValueError, match="overlap"):
                capture.copy_device(buf[10:40], buf[0:30])
            with pytest.raises(ValueError, match="byte"):
                capture.memset(buf, 300)
            capture.memset(buf, 1)  # the capture is still usable
        assert capture.graph is not None
        assert capture.graph.operations == 1
        with pytest.raises(TypeError):
            await s.launch_graph("graph")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="different device"):
            await other.stream().launch_graph(capture.graph)


async def test_a_fault_in_a_replay_fails_the_replay(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        async with s.capture() as capture:
            capture.launch(dev.function("noop"), 1)
            capture.launch(dev.function("fault"), 1, aa.HostArgs().u32(0))
        with anyio.fail_after(10), pytest.raises(aa.DeviceFaultError):
            await s.run_graph(capture.graph)
        with pytest.raises(aa.DeviceFaultError):
            await s.synchronize()


async def test_graphs_left_open_are_released_at_close(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(1 << 20)
        kept = []  # left open, not dropped (a dropped graph is closed when collected)
        for _ in range(3):
            async with s.capture() as capture:
                capture.copy_to_device(buf, np.ones(1 << 20, np.uint8))
                capture.launch(dev.function("noop"), 1)
            await s.launch_graph(capture.graph)
            kept.append(capture.graph)
        assert dev.stats()["graphs"] == 3
    assert_runtime_clean(dev)
    assert all(graph.closed for graph in kept)


async def _drop_and_wait_for_no_graph(dev: aa.Device, held: list[Any]) -> None:
    held.clear()
    gc.collect()
    with anyio.fail_after(10):
        while dev.stats()["graphs"]:  # noqa: ASYNC110 - the loop closes it
            await anyio.sleep(0.001)


async def test_a_graph_dropped_unclosed_is_closed_with_a_warning_after_its_replays(
    open_dev: Callable[..., Any],
) -> None:
    """Dropped without ``close()`` right after queuing a replay: the replay still runs (the
    graph goes once it has finished), then the graph and what it held are gone, with a
    ResourceWarning; they stayed until the device closed before."""
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(4096)
        out = np.zeros(1024, np.float32)
        async with s.capture() as capture:
            capture.copy_to_device(buf, np.full(1024, 3.0, np.float32))
        replay = await s.launch_graph(capture.graph)
        held = [capture]
        del capture
        with pytest.warns(ResourceWarning, match="Graph of 1 operation"):
            await _drop_and_wait_for_no_graph(dev, held)
        await replay
        await s.download(buf, out=out)
        assert (out == 3.0).all()
        buf.free()
        assert dev.stats()["device_buffers"] == 0
        assert dev.stats()["graphs"] == 0
    assert_runtime_clean(dev)


async def _memset_graph(
    dev: aa.Device, stream: aa.Stream, nbytes: int = 64, values: Iterable[int] = (1,)
) -> tuple[aa.DeviceBuffer, aa.Graph]:
    """A buffer and a graph captured on ``stream`` that memsets it to each of ``values``."""
    buf = dev.malloc(nbytes)
    async with stream.capture() as capture:
        for value in values:
            capture.memset(buf, value)
    assert capture.graph is not None
    return buf, capture.graph


async def test_replays_of_one_graph_on_two_streams_run_one_at_a_time(
    open_dev: Callable[..., Any],
) -> None:
    """Replays of one graph queued on two streams at once: each starts only once the one
    before it has finished (the device refuses a replay that starts while another runs: over
    realrt's driver both streams faulted, 507001), and every one succeeds."""
    async with open_dev(task_timeout=30.0) as dev:
        s1, s2 = dev.stream(), dev.stream()
        buf, graph = await _memset_graph(dev, s1, 1 << 16, values=range(4))
        tasks = []
        with anyio.fail_after(20):
            for _ in range(4):
                tasks.append(await s1.launch_graph(graph))
                tasks.append(await s2.launch_graph(graph))
            for task in tasks:
                await task
        for before, after in itertools.pairwise(tasks):
            assert after.submitted_at >= before.completed_at, (before, after)
        assert dev.fault is None
        assert (await s2.download(buf)).tolist() == [3] * (1 << 16)
        graph.close()


async def test_closing_a_graph_turns_away_a_replay_waiting_for_one_on_another_stream(
    open_dev: Callable[..., Any],
) -> None:
    """A replay on s2 waits for the graph's last replay, on s1 behind a hung kernel; the
    graph's close fails it at once with ``ClosedError``, nothing of it queued."""
    async with open_dev(task_timeout=30.0) as dev:
        s1, s2 = dev.stream(), dev.stream()
        _, graph = await _memset_graph(dev, s1)
        hung = await testing.inject_hang(s1)
        first = await s1.launch_graph(graph)
        outcome: list[BaseException] = []

        async def second() -> None:
            try:
                await s2.launch_graph(graph)
            except aa.ClosedError as exc:
                outcome.append(exc)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await anyio.sleep(0.05)  # (waiting for the first replay)
                assert not outcome and s2.in_flight == 0
                graph.close()
        assert len(outcome) == 1 and "graph" in str(outcome[0]), outcome
        assert s2.in_flight == 0
        await s1.aclose(timeout=0.05)
        for task in (hung, first):
            with pytest.raises(aa.TaskTimeoutError):
                await task


@pytest.mark.sim_only("testing.paused holds the sim's device")
async def test_a_replay_on_another_stream_is_refused_while_a_timed_out_one_may_still_run(
    open_dev: Callable[..., Any],
) -> None:
    """The watchdog failed the graph's last replay (on s1), which the device has not run yet:
    a replay on s2 is refused in the call (the two could run at once), and one on s1, after
    it in stream order, is queued."""
    async with open_dev(task_timeout=0.3) as dev:
        s1, s2 = dev.stream(), dev.stream()
        _, graph = await _memset_graph(dev, s1)
        with testing.paused(dev):
            first = await s1.launch_graph(graph)
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await first
            with pytest.raises(aa.TaskTimeoutError, match="may still run"):
                await s2.launch_graph(graph)
            assert s2.in_flight == 0
            again = await s1.launch_graph(graph)
        with anyio.fail_after(10):
            await again
        await s2.run_graph(graph)  # (the device is done with both now)
        graph.close()


async def test_closing_a_graph_turns_away_its_replays_waiting_for_admission(
    open_dev: Callable[..., Any],
) -> None:
    """Replays waiting for a slot behind a hung kernel: ``graph.close()`` fails them at once
    with ``ClosedError`` (as a plan's close does its launches), nothing of them is queued, and
    the graph is destroyed."""
    async with open_dev(task_timeout=30.0) as dev:
        s = dev.stream(max_in_flight=1)
        buf = dev.malloc(64)
        async with s.capture() as capture:
            capture.memset(buf, 1)
        graph = capture.graph
        hung = await testing.inject_hang(s)
        outcomes = await close_while_waiting(lambda: s.launch_graph(graph), graph.close)
        assert len(outcomes) == 3
        assert all(isinstance(o, aa.ClosedError) and "graph" in str(o) for o in outcomes)
        assert s.in_flight == 1  # only the hung kernel: no replay was queued
        assert dev.stats()["graphs"] == 0
        await s.aclose(timeout=0.05)
        with pytest.raises(aa.TaskTimeoutError):
            await hung


#: a captured upload this big has a pinned allocation of its own
BIG_CAPTURED = 1 << 20


async def _close_while_capturing(dev: aa.Device, then: BaseException | None = None) -> None:
    """Record a big upload, close the device inside the block, then leave it (by ``then``)."""
    s = dev.stream()
    buf = dev.malloc(BIG_CAPTURED)
    async with s.capture() as capture:
        capture.copy_to_device(buf, np.zeros(BIG_CAPTURED, np.uint8))
        await dev.aclose()
        if then is not None:
            raise then


async def test_a_capture_recording_while_the_device_closes_leaves_nothing_behind(
    open_dev: Callable[..., Any],
) -> None:
    """The device closes while a capture block records (another task's shutdown): leaving
    the block raises ``ClosedError``, and the recorded operations' pinned copies went with
    the device. Before, the block made a graph after the close, counted for good, and its
    pinned buffer was never given back (the pool warned; the sim leaked the allocation)."""
    async with open_dev() as dev:
        with pytest.raises(aa.ClosedError):
            await _close_while_capturing(dev)
    assert dev.stats()["graphs"] == 0
    assert_runtime_clean(dev)


async def test_an_exception_in_a_capture_block_after_the_device_closed_is_not_masked(
    open_dev: Callable[..., Any],
) -> None:
    """The block is left by the user's own exception after the device closed: that exception
    comes out, not a runtime error from releasing what was recorded into a closed runtime."""
    async with open_dev() as dev:
        with pytest.raises(KeyError, match="the user's"):
            await _close_while_capturing(dev, then=KeyError("the user's"))
    assert dev.stats()["host_pool_bytes"] == 0
    assert_runtime_clean(dev)
