"""The async scheduler end to end on the sim, on asyncio, uvloop and trio (anyio plugin)."""

from __future__ import annotations

import random

import anyio
import numpy as np
import pytest
from helpers import OpenDevice, assert_runtime_clean, download, live_resources, tiling, upload

import aio_ascend as aa
from aio_ascend import testing
from aio_ascend._errors import InvalidParamError

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True

# Every test runs on each backend of the registry (tests/conftest.py: sim, and acl over its C
# test double) and on each loop: the ``open_dev`` fixture opens a device on this test's backend.
# Those marked ``personas`` also run on the double's CANN 8.5 and 8.3 personas (8.3: the
# args-handle launch path).


@pytest.mark.personas
async def test_vector_add_roundtrip(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 1000
        x = np.arange(n, dtype=np.float32)
        y = np.full(n, 2.5, dtype=np.float32)
        bx, by = await upload(dev, s, x), await upload(dev, s, y)
        bz = dev.malloc(n * 4)
        args = aa.HostArgs().ptr(bx).ptr(by).ptr(bz).u32(n)
        task = await s.launch(dev.function("vector_add"), 4, args)
        await task
        assert task.done() and task.exception() is None
        np.testing.assert_array_equal(await download(s, bz, n), x + y)
    assert_runtime_clean(dev)


@pytest.mark.personas
async def test_many_axpy_give_the_exact_sequential_result(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x = np.ones(n, dtype=np.float32)
        bx = await upload(dev, s, x)
        by = await upload(dev, s, np.zeros(n, dtype=np.float32))
        axpy, scale = dev.function("axpy"), dev.function("scale")
        expected = np.zeros(n, dtype=np.float32)
        tasks = []
        for i in range(300):
            if i % 50 == 49:
                factor = 0.5
                tasks.append(
                    await s.launch(
                        scale,
                        1,
                        aa.HostArgs()
                        .ptr(by)
                        .ptr(by)
                        .placeholder(tiling([("I", n), ("f", factor)])),
                    )
                )
                expected = (expected * np.float32(factor)).astype(np.float32)
            else:
                a = float(i % 7)
                tasks.append(await s.launch(axpy, 2, aa.HostArgs().ptr(bx).ptr(by).f32(a).u32(n)))
                expected = (np.float32(a) * x + expected).astype(np.float32)
        for task in tasks:
            await task
        np.testing.assert_array_equal(await download(s, by, n), expected)


@pytest.mark.personas
async def test_matmul_through_a_placeholder(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        rng = np.random.default_rng(1)
        m, k, n = 5, 7, 3
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        ba, bb = await upload(dev, s, a), await upload(dev, s, b)
        bc = dev.malloc(m * n * 4)
        args = (
            aa.HostArgs()
            .ptr(ba)
            .ptr(bb)
            .ptr(bc)
            .placeholder(tiling([("I", m), ("I", n), ("I", k)]))
        )
        await (await s.launch(dev.function("matmul"), 2, args))
        c = (await download(s, bc, m * n)).reshape(m, n)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5)


@pytest.mark.personas
async def test_cross_stream_pipeline_with_events(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        copy_in, compute, copy_out = dev.stream(), dev.stream(), dev.stream()
        n = 256
        results = []
        for i in range(8):
            x = np.full(n, float(i), dtype=np.float32)
            bx, by = dev.malloc(n * 4), dev.malloc(n * 4)
            await copy_in.copy_to_device(bx, x)
            await copy_in.copy_to_device(by, x)
            uploaded = await copy_in.record_event()
            await compute.wait_event(uploaded)
            await compute.launch(
                dev.function("axpy"), 1, aa.HostArgs().ptr(bx).ptr(by).f32(2.0).u32(n)
            )
            computed = await compute.record_event()
            await copy_out.wait_event(computed)
            out = np.empty(n, dtype=np.float32)
            results.append((i, out, await copy_out.copy_to_host(out, by)))
        for i, out, task in results:
            await task
            np.testing.assert_array_equal(out, np.full(n, 3.0 * i, dtype=np.float32))


@pytest.mark.personas
async def test_a_thousand_launches_in_one_tick_cross_in_a_handful_of_hops(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        before = dev.stats()
        tasks = [await s.launch(noop, 1) for _ in range(1000)]
        for task in tasks:
            await task
        stats = dev.stats()
        assert stats["launches"] - before["launches"] == 1000
        batches = stats["batches"] - before["batches"]
        assert 1 <= batches <= 4, stats
        # completions are coalesced: far fewer wakeups than tasks
        assert stats["wakeups"] - before["wakeups"] <= 20, stats
        assert stats["in_flight"] == 0


async def test_a_finished_await_has_been_counted_in_wakeups(open_dev: OpenDevice) -> None:
    # The library thread counted its hop after handing it over: the woken coroutine could
    # read stats() before the count (3-8 in 300 awaits on asyncio and trio).
    async with open_dev() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        base = dev.stats()["wakeups"]
        behind = []
        for i in range(1, 301):
            await s.run(noop, 1)  # each completion needs one delivery of its own
            if dev.stats()["wakeups"] - base < i:
                behind.append(i)
        assert behind == []


@pytest.mark.sim_only("pause/resume")
async def test_backpressure_holds_a_fast_producer_at_max_in_flight(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=8)
        tasks: list[aa.Task] = []

        async def producer() -> None:
            for _ in range(30):
                tasks.append(await s.launch(dev.function("noop"), 1))

        async with anyio.create_task_group() as tg:
            with testing.paused(dev):
                tg.start_soon(producer)
                await anyio.wait_all_tasks_blocked()
                assert len(tasks) == 8
                assert s.in_flight == 8
        for task in tasks:
            await task
        assert len(tasks) == 30
        assert dev.stats()["peak_in_flight"] == 8


@pytest.mark.sim_only("pause/resume")
async def test_in_flight_counts_requests_not_the_slots_granted_ahead(open_dev: OpenDevice) -> None:
    # A launcher woken from the admission queue is granted slots for its next calls as well;
    # until it makes them they are no requests, and in_flight (the stream's, the device's
    # stats, the repr) must not count them.
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=8)
        noop = dev.function("noop")
        seen: list[tuple[int, int, int]] = []

        async def late() -> None:
            task = await s.launch(noop, 1)  # waits for a slot, then gets several
            unfinished = sum(not t.done() for t in (*first, task))
            seen.append((s.in_flight, dev.stats()["in_flight"], unfinished))
            assert f"in_flight={unfinished}/8" in repr(s)

        async with anyio.create_task_group() as tg:
            with testing.paused(dev):
                first = [await s.launch(noop, 1) for _ in range(8)]
                tg.start_soon(late)
                await anyio.wait_all_tasks_blocked()
                assert s.in_flight == 8
        assert len(seen) == 1
        in_flight, device_in_flight, unfinished = seen[0]
        assert in_flight == device_in_flight == unfinished
        await s.synchronize()
        assert s.in_flight == 0 and dev.stats()["in_flight"] == 0


@pytest.mark.sim_only("pause/resume")
async def test_admission_is_first_come_first_served(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=1)
        order: list[int] = []

        async def waiter(i: int) -> None:
            await s.launch(dev.function("noop"), 1)
            order.append(i)

        async with anyio.create_task_group() as tg:
            with testing.paused(dev):
                await s.launch(dev.function("noop"), 1)
                for i in range(5):
                    tg.start_soon(waiter, i)
                    await anyio.wait_all_tasks_blocked()
        assert order == [0, 1, 2, 3, 4]


@pytest.mark.sim_only("pause/resume")
async def test_cancelling_a_launch_waiting_for_admission_means_it_never_happens(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=1)
        with testing.paused(dev):
            first = await s.launch(dev.function("noop"), 1)
            with anyio.move_on_after(0.05) as scope:
                await s.launch(dev.function("noop"), 1)
            assert scope.cancelled_caught
        await first
        await s.synchronize()
        assert dev.stats()["launches"] == 1


@pytest.mark.personas
async def test_cancelled_awaits_never_release_args_early(open_dev: OpenDevice) -> None:
    rng = random.Random(7)
    async with open_dev(debug=True) as dev:
        s1, s2 = dev.stream(), dev.stream()
        n = 32
        bx = await upload(dev, s1, np.ones(n, dtype=np.float32))
        outputs = [dev.malloc(n * 4) for _ in range(200)]
        for out in outputs:
            await s1.copy_to_device(out, np.zeros(n, dtype=np.float32))
        await s1.synchronize()
        axpy = dev.function("sleep"), dev.function("axpy")
        cancelled = 0
        tasks = []
        for i, out in enumerate(outputs):
            stream = s1 if i % 2 else s2
            if i % 10 == 0:
                await stream.launch(axpy[0], 1, aa.HostArgs().u32(200))
            task = await stream.launch(axpy[1], 1, aa.HostArgs().ptr(bx).ptr(out).f32(i).u32(n))
            tasks.append(task)
            if rng.random() < 0.3:
                with anyio.move_on_after(0) as scope:
                    await task
                cancelled += scope.cancelled_caught
        assert cancelled > 20
        await dev.synchronize()
        for i, out in enumerate(outputs):
            assert tasks[i].exception() is None
            np.testing.assert_array_equal(await download(s1, out, n), np.full(n, i, np.float32))
        assert dev.stats()["host_buffer_violations"] == 0
    assert_runtime_clean(dev)


async def test_fail_after_cancels_the_waiter_not_the_work(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.01):
                await task
        assert not task.done()
        await task
        assert task.done() and task.exception() is None


@pytest.mark.personas
async def test_device_fault_is_sticky_and_reopen_works(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s1, s2 = dev.stream(), dev.stream()
        blocker = await s2.launch(dev.function("sleep"), 1, aa.HostArgs().u32(20_000))
        bad = await s1.launch(dev.function("fault"), 1, aa.HostArgs().u32(0))
        with pytest.raises(aa.DeviceFaultError) as info:
            await bad
        assert info.value.code == 507015
        first = dev.fault
        assert first is not None
        with pytest.raises(aa.DeviceFaultError) as later:
            await blocker
        assert later.value is first or later.value.__cause__ is first
        with pytest.raises(aa.DeviceFaultError) as refused:
            await s2.launch(dev.function("noop"), 1)
        assert refused.value.__cause__ is first
    assert_runtime_clean(dev)
    async with open_dev() as dev2:
        await (await dev2.stream().launch(dev2.function("noop"), 1))
        assert dev2.fault is None


@pytest.mark.personas
async def test_hang_fails_by_watchdog_and_aclose_timeout_returns(open_dev: OpenDevice) -> None:
    dev = await open_dev(task_timeout=0.2)
    s = dev.stream()
    hung = await s.launch(dev.function("hang"), 1)
    with pytest.raises(aa.TaskTimeoutError):
        with anyio.fail_after(5):
            await hung
    assert isinstance(hung.exception(), TimeoutError)
    with anyio.fail_after(5):
        await dev.aclose(timeout=0.1)
    assert_runtime_clean(dev)


async def test_aclose_timeout_fails_unfinished_tasks_with_task_timeout(
    open_dev: OpenDevice,
) -> None:
    dev = await open_dev()
    s = dev.stream()
    hung = await s.launch(dev.function("hang"), 1)
    behind = await s.launch(dev.function("noop"), 1)
    with anyio.fail_after(5):
        await dev.aclose(timeout=0.1)
    for task in (hung, behind):
        assert isinstance(task.exception(), aa.TaskTimeoutError)
    assert_runtime_clean(dev)


@pytest.mark.personas
async def test_aclose_waits_for_work_in_flight(open_dev: OpenDevice) -> None:
    dev = await open_dev()
    s = dev.stream()
    tasks = [await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(2000)) for _ in range(20)]
    await dev.aclose()
    assert all(t.done() and t.exception() is None for t in tasks)
    assert_runtime_clean(dev)


async def test_aclose_cancel_drops_unsubmitted_requests(open_dev: OpenDevice) -> None:
    dev = await open_dev()
    s = dev.stream()
    tasks = [await s.launch(dev.function("noop"), 1) for _ in range(10)]
    await dev.aclose(cancel=True)  # same tick: nothing was handed to the runtime yet
    assert all(isinstance(t.exception(), aa.ClosedError) for t in tasks)
    assert_runtime_clean(dev)


async def test_use_after_close_raises_closed_error(open_dev: OpenDevice) -> None:
    dev = await open_dev()
    s = dev.stream()
    buf = dev.malloc(64)
    await dev.aclose()
    await dev.aclose()  # idempotent
    with pytest.raises(aa.ClosedError):
        await s.launch(dev.function("noop"), 1)
    with pytest.raises(aa.ClosedError):
        dev.malloc(64)
    with pytest.raises(aa.ClosedError):
        dev.stream()
    buf.free()  # freed by close already: no error, no double free


@pytest.mark.personas
async def test_free_is_deferred_while_queued_work_uses_the_buffer(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(256, pool=False)  # given back to the runtime itself once done

        def live() -> dict[str, int]:
            return live_resources(dev)

        await s.run(dev.function("noop"), 1)  # on CANN 8.0 this allocates the stream's args ring
        before = live()["device_allocations"]
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))
        task = await s.launch(
            dev.function("axpy"), 1, aa.HostArgs().ptr(buf).ptr(buf).f32(1).u32(8)
        )
        buf.free()
        assert live()["device_allocations"] == before  # still allocated: in use
        with pytest.raises(ValueError, match="freed"):
            await s.launch(dev.function("axpy"), 1, aa.HostArgs().ptr(buf).ptr(buf).f32(1).u32(8))
        await task
        await s.synchronize()
        assert live()["device_allocations"] == before - 1


@pytest.mark.sim_only("inject_launch_error(after=)")
async def test_a_batch_partly_refused_by_the_runtime(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        dev.runtime.inject_launch_error(107000, after=2)  # type: ignore[attr-defined]
        tasks = [await s.launch(dev.function("noop"), 1) for _ in range(5)]
        for task in tasks[:2]:
            await task
        with pytest.raises(InvalidParamError) as refused:
            await tasks[2]
        for task in tasks[3:]:
            with pytest.raises(aa.RuntimeAPIError) as later:
                await task
            assert later.value.__cause__ is refused.value
        assert dev.stats()["launches"] == 2
        # the stream keeps working afterwards
        await (await s.launch(dev.function("noop"), 1))


@pytest.mark.personas
async def test_event_timing(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        start = await s.record_event(timing=True)
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(20_000))
        end = await s.record_event(timing=True)
        await end
        await start
        assert start.query() and end.query()
        assert 15.0 <= start.elapsed_ms(end) < 2000
        untimed = await s.record_event()
        await untimed
        with pytest.raises(ValueError, match="timing"):
            start.elapsed_ms(untimed)


@pytest.mark.personas
async def test_bad_input_is_refused_before_the_runtime(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        with pytest.raises(ValueError, match="blocks"):
            await s.launch(noop, 0)
        with pytest.raises(ValueError, match="blocks"):
            await s.launch(noop, 65536)
        with pytest.raises(TypeError, match="blocks"):
            await s.launch(noop, 1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="args"):
            await s.launch(noop, 1, b"\0" * 8)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="fn"):
            await s.launch("noop", 1)  # type: ignore[arg-type]
        buf = dev.malloc(16)
        with pytest.raises(ValueError, match="dst buffer only 16"):
            await s.copy_to_device(buf, np.zeros(8, np.float32))
        with pytest.raises(ValueError, match="src buffer only 16"):
            await s.copy_to_host(np.zeros(8, np.float32), buf)
        with pytest.raises(ValueError, match="C-contiguous"):
            await s.copy_to_host(np.zeros((4, 4), np.float32)[:, :1], buf)
        with pytest.raises(ValueError, match="max_in_flight"):
            dev.stream(max_in_flight=0)
        assert dev.stats()["launches"] == 0 and dev.stats()["copies"] == 0


async def test_stream_async_with_and_close(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        async with dev.stream() as s:
            task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(1000))
        assert task.done()
        with pytest.raises(aa.ClosedError):
            await s.launch(dev.function("noop"), 1)
        assert live_resources(dev)["streams"] == 0


@pytest.mark.personas
async def test_two_devices_on_one_loop_keep_their_contexts_apart(
    open_dev: OpenDevice, device_backend: str
) -> None:
    if device_backend.startswith("acl"):
        from doubles.acl_double import DEFAULT_PERSONA, double_control

        double_control(device_backend.partition("-")[2] or DEFAULT_PERSONA).set_device_count(2)
    try:
        await _two_devices(open_dev)
    finally:
        if device_backend.startswith("acl"):  # later tests (in any order) see one
            double_control(device_backend.partition("-")[2] or DEFAULT_PERSONA).set_device_count(1)


async def _two_devices(open_dev: OpenDevice) -> None:
    async with open_dev(0) as dev0, open_dev(1) as dev1:
        n = 16
        results = []
        for dev, value in ((dev0, 1.0), (dev1, 2.0), (dev0, 3.0)):
            s = dev.stream()
            buf = await upload(dev, s, np.full(n, value, dtype=np.float32))
            await s.launch(dev.function("axpy"), 1, aa.HostArgs().ptr(buf).ptr(buf).f32(1).u32(n))
            results.append((value, await download(s, buf, n)))
            buf.free()
        for value, out in results:
            np.testing.assert_array_equal(out, np.full(n, 2 * value, dtype=np.float32))


async def test_dropped_user_events_are_recycled_not_leaked(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s, other = dev.stream(), dev.stream()
        handles = set()
        for _ in range(200):
            event = await s.record_event()
            await (await other.wait_event(event))
            handles.add(event.handle)
            del event  # its finalizer hands the handle back for reuse
        assert len(handles) <= 3
        assert live_resources(dev)["events"] <= 6
    assert_runtime_clean(dev)


async def test_awaiting_many_finished_tasks_lets_the_loop_run(open_dev: OpenDevice) -> None:
    """A coroutine awaiting thousands of already finished tasks in a row (the "issue, then
    await them in order" shape) does not hold the loop: it checkpoints now and then."""
    async with open_dev() as dev:
        s = dev.stream()
        tasks = [await s.launch(dev.function("noop"), 1) for _ in range(1000)]
        await s.synchronize()
        assert all(task.done() for task in tasks)
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.lowlevel.checkpoint()  # the ticker starts
            before = ticks
            for task in tasks:
                await task
            during = ticks - before
            done = True
        assert during >= 1000 // 256, f"the loop ran {during} times during 1000 awaits"
