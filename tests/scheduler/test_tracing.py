"""``aio_ascend.tracing``: recording users' programs, the trace as Perfetto reads it, flows,
and that nothing observes (or costs) once a recording ends."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import check_trace

import aio_ascend as aa
from aio_ascend import testing, tracing
from aio_ascend._sched.hooks import HOOKS

pytestmark = pytest.mark.anyio


async def test_record_writes_every_devices_tasks(sim_device: Any, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    async with sim_device() as dev, sim_device() as other:
        s, t = dev.stream(), dev.stream()
        u = other.stream()
        with tracing.record(path) as tracer:
            tracer.name_stream(s, "main")
            await s.run(dev.function("noop"), 1)
            await t.run(dev.function("sleep"), 1, aa.HostArgs().u32(100))
            await u.run(other.function("noop"), 1)
        assert HOOKS.observers == ()
        await s.run(dev.function("noop"), 1)  # after the recording: not in it
    assert len(tracer.records) == 3
    summary = check_trace(json.loads(path.read_text()))
    # one process per device (device 0 opened twice: the second is told apart)
    assert summary["tracks"] == {
        "device 0 (sim)": {"main": 1, "stream 1": 1},
        "device 0 (sim) #2": {"stream 1": 1},
    }
    assert {"noop", "sleep"} <= summary["slices"]
    by_kernel = {r.kernel: r for r in tracer.records}
    sleep = by_kernel["sleep"]
    assert sleep.stream_name == "stream 1" and sleep.kind == "launch"
    assert sleep.queued is not None and sleep.on_device is not None and sleep.wake is not None
    assert sleep.on_device >= 100e-6  # the 100 us kernel ran in that phase
    assert sleep.end == sleep.resumed


async def test_a_request_block_links_its_tasks_in_order(sim_device: Any) -> None:
    async with sim_device() as dev:
        a, b = dev.stream(), dev.stream()
        noop = dev.function("noop")

        async def handle(i: int) -> None:
            with tracing.request(f"req {i}"):
                await a.run(noop, 1)
                await b.run(noop, 1)
                await a.run(noop, 1)

        with tracing.record() as tracer:
            tracer.name_stream(a, "a")
            tracer.name_stream(b, "b")
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(handle, i)
    assert [scope.name for scope in tracer.requests] != []
    assert {scope.name for scope in tracer.requests} == {f"req {i}" for i in range(4)}
    summary = check_trace(tracer.trace())
    assert summary["tracks"]["requests"] == {"requests": 4}
    assert len(summary["flows"]) == 4
    for chain in summary["flows"].values():
        assert chain == ["requests", "a", "b", "a"]
    records = tracer.records
    assert {r.request for r in records} == {f"req {i}" for i in range(4)}
    for i in range(4):
        mine = [r for r in records if r.request == f"req {i}"]
        assert len(mine) == 3 and len({r.flow for r in mine}) == 1


async def test_without_a_request_block_the_tasks_of_one_async_task_are_one_flow(
    sim_device: Any,
) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        noop = dev.function("noop")

        async def worker() -> None:
            await s.run(noop, 1)
            await s.run(noop, 1)

        with tracing.record() as tracer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                tg.start_soon(worker)
    flows = check_trace(tracer.trace())["flows"]
    assert sorted(len(chain) for chain in flows.values()) == [2, 2]
    with tracing.record(flows=False) as quiet:
        pass
    assert check_trace(quiet.trace())["flows"] == {}


async def test_failures_and_tasks_nobody_awaited(sim_device: Any) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        with tracing.record() as tracer:
            with testing.paused(dev):
                quiet = await s.launch(dev.function("noop"), 1)
                fault = await testing.inject_fault(s)
            with pytest.raises(aa.DeviceFaultError):
                await fault
            await quiet
    by_kind = {r.kernel: r for r in tracer.records}
    assert by_kind["noop"].error is None and by_kind["noop"].wake is None  # nobody waited
    error = fault.exception()
    assert isinstance(error, aa.DeviceFaultError)
    assert by_kind["fault"].error == type(error).__name__
    assert by_kind["fault"].completed is None and by_kind["fault"].on_device is None
    trace = tracer.trace()
    check_trace(trace)
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert [e["name"] for e in instants] == [f"failed: {type(error).__name__}"]


@pytest.mark.parametrize("close", ["cancel", "forced", "stream cancel"])
async def test_tasks_a_close_fails_are_traced_as_failures(sim_device: Any, close: str) -> None:
    """Dropped by ``aclose(cancel=True)`` (the device's or the stream's) or failed by a forced
    close: each is a record with its error, as any failed task is (they reached no observer:
    traces, metrics and spans lost them)."""
    with tracing.record() as tracer:
        dev = await sim_device()
        s = dev.stream()
        if close == "forced":
            await testing.inject_hang(s)
        else:
            await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))
            await anyio.sleep(0.02)  # submitted: it runs to the end
        behind = [await s.launch(dev.function("noop"), 1) for _ in range(3)]
        if close == "forced":
            await dev.aclose(timeout=0.1)
        elif close == "cancel":
            await dev.aclose(cancel=True)
        else:
            await s.aclose(cancel=True)
            await dev.aclose()
    errors = {type(task.exception()).__name__ for task in behind}
    assert errors == {"TaskTimeoutError" if close == "forced" else "ClosedError"}, errors
    assert len(tracer.records) == 4
    noops = [r for r in tracer.records if r.kernel == "noop"]
    assert [r.error for r in noops] == [errors.pop()] * 3


async def test_host_functions_are_slices_on_their_streams_track(sim_device: Any) -> None:
    """A host function is a slice of its stream (handed to its thread -> returned), between
    the work before it and the work after it; one that raised is marked failed."""
    async with sim_device() as dev:
        s = dev.stream()
        noop = dev.function("noop")

        def boom() -> None:
            raise KeyError("in the host function")

        with tracing.record() as tracer:
            tracer.name_stream(s, "main")
            await s.run(noop, 1)
            host = await s.launch_host_func(lambda: time.sleep(0.002))
            await host
            await s.run(noop, 1)
            failed = await s.launch_host_func(boom)
            with pytest.raises(KeyError):
                await failed
    records = [r for r in tracer.records if r.kind != "record_event"]  # (the host fences)
    assert [r.kind for r in records] == ["launch", "host_func", "launch", "host_func"]
    first, ran, after, raised = records
    assert ran.stream == first.stream and ran.stream_name == "main"
    assert ran.submitted is not None and ran.completed is not None and ran.error is None
    assert ran.completed - ran.submitted >= 0.002 and ran.wake is not None
    assert first.completed is not None and after.submitted is not None
    assert first.completed <= ran.submitted and ran.completed <= after.submitted
    assert raised.error == "KeyError"
    summary = check_trace(tracer.trace())  # (the stream's slices never overlap)
    assert summary["tracks"][f"device 0 ({dev.backend})"]["main"] == 6
    assert "host_func" in summary["slices"]


async def test_two_streams_given_one_name_get_a_track_each(sim_device: Any) -> None:
    async with sim_device() as dev:
        s, t, u = dev.stream(), dev.stream(), dev.stream()
        noop = dev.function("noop")
        with tracing.record() as tracer:
            tracer.name_stream(s, "worker")
            tracer.name_stream(t, "worker")
            tracer.name_stream(u, "stream 1")  # the name an unnamed stream would get
            v = dev.stream()  # unnamed: "stream 1" too
            with testing.paused(dev):  # in flight at once on every stream
                tasks = [await x.launch(noop, 1) for x in (s, t, t, u, v, v, v)]
            for task in tasks:
                await task
    names = {r.stream: r.stream_name for r in tracer.records}  # (one name per stream)
    # the first stream seen keeps the name, the other's handle tells it apart
    for (a, b), name in (((s, t), "worker"), ((u, v), "stream 1")):
        assert {names[a.handle], names[b.handle]} in (
            {name, f"{name} ({b.handle:#x})"},
            {name, f"{name} ({a.handle:#x})"},
        )
    tracks = check_trace(tracer.trace())["tracks"][f"device 0 ({dev.backend})"]
    assert tracks == {names[x.handle]: n for x, n in ((s, 1), (t, 2), (u, 1), (v, 3))}


async def test_max_tasks_bounds_the_memory_and_counts_the_rest(sim_device: Any) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        with tracing.Tracer(max_tasks=3) as tracer:
            for _ in range(5):
                await s.run(dev.function("noop"), 1)
    assert len(tracer.records) == 3
    assert tracer.dropped == 2
    assert tracer.trace()["otherData"]["dropped_tasks"] == 2


async def test_a_tracer_can_record_twice_and_two_can_record_at_once(sim_device: Any) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        outer = tracing.Tracer()
        async with outer:
            await s.run(noop, 1)
            with tracing.record() as inner:
                await s.run(noop, 1)
        assert HOOKS.observers == ()
        await s.run(noop, 1)
        with outer:
            await s.run(noop, 1)
    assert len(outer.records) == 3 and len(inner.records) == 1


async def test_the_recording_ends_with_the_block_even_on_an_error(
    sim_device: Any, tmp_path: Path
) -> None:
    path = tmp_path / "t.json"

    async def fails(dev: aa.Device) -> None:
        with tracing.record(path):
            await dev.stream().run(dev.function("noop"), 1)
            raise ZeroDivisionError

    async with sim_device() as dev:
        with pytest.raises(ZeroDivisionError):
            await fails(dev)
    assert HOOKS.observers == () and HOOKS.capture is None
    assert check_trace(json.loads(path.read_text()))["tracks"]  # written all the same


async def test_an_observer_that_raises_is_dropped_and_logged(
    sim_device: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        wants_capture = True

        def capture(self) -> object:
            raise RuntimeError("capture broke")

        def delivered(self, source: Any, deliveries: Any) -> None:
            raise RuntimeError("delivered broke")

        def resumed(self, task: Any) -> None:
            raise RuntimeError("resumed broke")

    broken = Broken()
    caplog.set_level(logging.ERROR, "aio_ascend")
    async with sim_device() as dev:
        s = dev.stream()
        HOOKS.add(broken)
        try:
            await s.run(dev.function("noop"), 1)  # the work is unaffected
            assert broken not in HOOKS.observers
        finally:
            HOOKS.remove(broken)
    assert "failed" in caplog.text and "broke" in caplog.text


async def test_an_observer_whose_capture_raises_is_dropped_and_logged_once(
    sim_device: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Capturing:
        wants_capture = True

        def capture(self) -> object:
            raise RuntimeError("capture broke")

        def delivered(self, source: Any, deliveries: Any) -> None:
            pass

        def resumed(self, task: Any) -> None:
            pass

    broken = Capturing()
    caplog.set_level(logging.ERROR, "aio_ascend")
    async with sim_device() as dev:
        s = dev.stream()
        HOOKS.add(broken)
        try:
            for _ in range(5):
                await s.run(dev.function("noop"), 1)  # the work is unaffected
            assert broken not in HOOKS.observers and HOOKS.capture is None
        finally:
            HOOKS.remove(broken)
    logged = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(logged) == 1, logged  # not once per task


def test_a_request_block_without_a_tracer_is_harmless() -> None:
    with tracing.request("alone") as scope:
        assert scope.name == "alone" and scope.end is None
    assert scope.end is not None and scope.end >= scope.start
    with pytest.raises(ValueError, match="max_tasks"):
        tracing.Tracer(max_tasks=-1)


async def test_one_track_per_stream_with_queued_and_in_flight_counters(sim_device: Any) -> None:
    async with sim_device() as dev:
        s, t = dev.stream(), dev.stream()
        noop = dev.function("noop")
        with tracing.record() as tracer:
            with testing.paused(dev):  # all of them in flight at once, overlapping
                tasks = [await s.launch(noop, 1) for _ in range(5)]
                tasks += [await t.launch(noop, 1) for _ in range(3)]
            for task in tasks:
                await task
    trace = tracer.trace()
    summary = check_trace(trace)
    events = trace["traceEvents"]
    process = f"device 0 ({dev.backend})"
    (pid,) = (e["pid"] for e in events if e["ph"] == "M" and e["args"].get("name") == process)
    threads = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }
    # one track per stream, every task a slice on it (no async slice: each would be a track)
    assert sorted(threads.values()) == ["stream 1", "stream 2"]
    assert summary["tracks"] == {process: {"stream 1": 5, "stream 2": 3}}
    mine = [e for e in events if e["pid"] == pid and e["ph"] != "M"]
    assert {e["ph"] for e in mine} == {"X", "C"}
    assert {threads[e["tid"]] for e in mine if e["ph"] == "X"} == {"stream 1", "stream 2"}

    def peak(counter: str, series: str) -> int:
        return max(e["args"][series] for e in mine if e["ph"] == "C" and e["name"] == counter)

    assert set(summary["counters"][process]) == {"all streams", "stream 1", "stream 2"}
    assert peak("stream 1", "in flight") == 5 and peak("stream 2", "in flight") == 3
    assert peak("all streams", "in flight") == 8
    assert peak("stream 1", "queued") >= 1  # admitted before its batch was submitted
