"""Launch plans: ``stream.plan(fn, blocks, args)`` checked, packed and pinned once, launched
again and again; what the plan holds lives until it is closed and its launches are done.

On the sim and the acl double (the personas too: their three launch paths read a shared image
differently), on asyncio, uvloop and trio.
"""

from __future__ import annotations

import gc
import threading
import warnings

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from helpers import (
    OpenDevice,
    assert_runtime_clean,
    close_while_waiting,
    download,
    tiling,
    upload,
)

import aio_ascend as aa
from aio_ascend import testing

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True

F32 = np.float32


@pytest.mark.personas
async def test_a_plan_launches_again_and_again_with_the_right_results(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x = await upload(dev, s, np.ones(n, F32))
        y = await upload(dev, s, np.zeros(n, F32))
        args = aa.HostArgs().ptr(x).ptr(y).f32(2.0).u32(n)
        plan = s.plan(dev.function("axpy"), 2, args)  # no placeholder: one shared image
        args.f32(99.0)  # the plan snapshotted its args: changing the builder changes nothing
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))  # holds them queued
        in_use = dev.stats()["host_buffers_in_use"]
        tasks = [await plan.launch() for _ in range(10)]
        # all read the plan's one image: a kernel's hidden arguments (acl) are the packer's,
        # the runtime writes nothing into it
        assert dev.stats()["host_buffers_in_use"] == in_use
        await plan.run()
        for task in tasks:
            await task
        assert isinstance(tasks[0], aa.Task) and tasks[0].kind == "launch"
        assert tasks[0].stream is s
        expected = np.full(n, 22.0, F32)
        np.testing.assert_array_equal(await download(s, y, n), expected)
        # with a placeholder: each launch gets its own copy of the plan's image
        halve = tiling([("I", n), ("f", 0.5)])
        async with s.plan(
            dev.function("scale"), 1, aa.HostArgs().ptr(y).ptr(y).placeholder(halve)
        ) as scale:
            for _ in range(3):
                await scale.launch()
            await scale.run()
        assert scale.closed
        np.testing.assert_array_equal(await download(s, y, n), expected / 16)
        plan.close()
        assert dev.stats()["host_buffers_in_use"] == 0
    assert_runtime_clean(dev)


async def _ones_and_zeros(
    dev: aa.Device, s: aa.Stream, n: int
) -> tuple[aa.DeviceBuffer, aa.DeviceBuffer, int]:
    """x (ones) and y (zeros) on the device, and the device's buffer count with them."""
    x = await upload(dev, s, np.ones(n, F32))
    y = await upload(dev, s, np.zeros(n, F32))
    return x, y, dev.stats()["device_buffers"]


async def test_a_plan_keeps_its_buffers_until_closed_and_its_launches_are_done(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x, y, buffers = await _ones_and_zeros(dev, s, n)
        plan = s.plan(dev.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
        x.free()  # deferred: the plan holds it, launched or not
        assert dev.stats()["device_buffers"] == buffers
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))
        task = await plan.launch()
        plan.close()  # deferred: a launch is queued
        assert plan.closed
        plan.close()  # idempotent
        with pytest.raises(aa.ClosedError, match="plan is closed"):
            await plan.launch()
        with pytest.raises(aa.ClosedError, match="plan is closed"):
            await plan.run()
        assert dev.stats()["device_buffers"] == buffers
        await task
        assert dev.stats()["device_buffers"] == buffers - 1  # now the free went through
        np.testing.assert_array_equal(await download(s, y, n), np.ones(n, F32))
        assert dev.stats()["host_buffers_in_use"] == 0
    assert_runtime_clean(dev)


async def test_a_plan_dropped_without_close_lets_its_buffers_go_after_its_launches(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x, y, buffers = await _ones_and_zeros(dev, s, n)
        plan = s.plan(dev.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
        x.free()  # deferred: the plan holds it
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))
        task = await plan.launch()
        # (warned, as a dropped stream or graph is: it was silent)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del plan
            gc.collect()
            await anyio.lowlevel.checkpoint()  # (the release is handed to the loop)
            assert dev.stats()["device_buffers"] == buffers  # its launch is still queued
            await task
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == [
            "a LaunchPlan on device 0 was garbage-collected without close(); what it holds is "
            "released once its queued launches have finished"
        ]
        assert dev.stats()["device_buffers"] == buffers - 1  # now x's free went through
        np.testing.assert_array_equal(await download(s, y, n), np.ones(n, F32))
        assert dev.stats()["host_buffers_in_use"] == 0
    assert_runtime_clean(dev)


async def test_a_cancelled_plan_run_keeps_the_image_and_buffers_until_the_launch_is_done(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x, y, buffers = await _ones_and_zeros(dev, s, n)
        plan = s.plan(dev.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(3.0).u32(n))
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(200_000))
        with anyio.move_on_after(0.02) as scope:
            await plan.run()  # admitted and queued, then its wait is cancelled
        assert scope.cancelled_caught
        plan.close()
        x.free()
        # launches of other args reuse what is free in the pool meanwhile: never the image
        other = dev.malloc(4 * n)
        for _ in range(8):
            await s.launch(
                dev.function("axpy"), 1, aa.HostArgs().ptr(other).ptr(other).f32(0.0).u32(n)
            )
        assert dev.stats()["device_buffers"] == buffers + 1  # x is still in use
        await s.synchronize()
        assert dev.stats()["device_buffers"] == buffers  # x freed, `other` allocated
        np.testing.assert_array_equal(await download(s, y, n), np.full(n, 3.0, F32))
    assert_runtime_clean(dev)


async def test_plan_misuse_is_refused_with_typed_errors(open_dev: OpenDevice) -> None:
    async with open_dev() as dev, open_dev() as other:  # two devices (of one chip)
        s = dev.stream()
        noop, axpy = dev.function("noop"), dev.function("axpy")
        with pytest.raises(TypeError, match="fn must be a Function"):
            s.plan("noop", 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="different device"):
            s.plan(other.function("noop"), 1)
        with pytest.raises(TypeError, match="blocks: expected an int"):
            s.plan(noop, 1.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="out of range"):
            s.plan(noop, 0)
        with pytest.raises(TypeError, match="args must be a HostArgs"):
            s.plan(noop, 1, b"\0" * 8)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="axpy"):  # it declares 4 parameters
            s.plan(axpy, 1)
        buf = dev.malloc(64)
        buf.free()
        with pytest.raises(ValueError, match="freed"):
            s.plan(axpy, 1, aa.HostArgs().ptr(buf).ptr(buf).f32(1.0).u32(1))
        plan = s.plan(noop, 1)
        errors: list[BaseException] = []

        def from_another_thread() -> None:
            try:
                anyio.run(plan.launch)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
        assert "different event loop" in str(errors[0])
        await plan.run()  # none of that broke it
        assert not plan.closed
        await s.aclose()
        assert plan.closed  # it can launch no more (it said "open")
        with pytest.raises(aa.ClosedError, match="stream is closed"):
            await plan.launch()
        with pytest.raises(aa.ClosedError):
            s.plan(noop, 1)
        plan.close()
        t = dev.stream()
        closed_device_plan = t.plan(noop, 1)
    assert closed_device_plan.closed
    with pytest.raises(aa.ClosedError):
        await closed_device_plan.launch()
    closed_device_plan.close()  # after the device's close: nothing left to release
    assert_runtime_clean(dev)


@pytest.mark.sim_only("a fault injected by the sim's test control")
async def test_a_plan_launch_after_a_fault_raises_the_fault(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        plan = s.plan(dev.function("noop"), 1)
        with pytest.raises(aa.DeviceFaultError):
            await (await testing.inject_fault(s))
        with pytest.raises(aa.DeviceFaultError):
            await plan.launch()
        plan.close()
        with pytest.raises(aa.DeviceFaultError):
            await dev.synchronize()


async def test_launchers_waiting_for_admission_are_admitted_first_come_first_served(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        # one slot: each completion admits one waiter (trio resumes the waiters woken in one
        # round in an order of its own, so the order is observed one at a time)
        s = dev.stream(max_in_flight=1)
        noop = dev.function("noop")
        plan = s.plan(noop, 1)
        admitted: list[int] = []
        hold = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(50_000))  # full

        async def launcher(i: int) -> None:
            for _ in range(3):  # each comes back to the end of the line after each launch
                await (plan.launch() if i % 2 else s.launch(noop, 1))
                admitted.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(launcher, i)
                await anyio.sleep(0.001)  # queued in this order
            assert admitted == []  # all waiting behind the sleep
        await hold
        assert admitted == list(range(6)) * 3
        plan.close()


async def test_a_buffer_freed_while_its_launch_waits_for_admission_refuses_the_launch(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=1)
        n = 64
        x = await upload(dev, s, np.ones(n, F32))
        buffers = dev.stats()["device_buffers"]
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))  # the stream is full
        axpy = dev.function("axpy")
        refused: list[BaseException] = []

        async def launch() -> None:
            try:
                await s.launch(axpy, 1, aa.HostArgs().ptr(x).ptr(x).f32(1.0).u32(n))
            except ValueError as exc:
                refused.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(launch)
            await anyio.sleep(0.005)  # checked, and waiting for its slot
            x.free()  # nothing queued uses it yet: freed now
        assert len(refused) == 1 and "freed while the request waited" in str(refused[0])
        assert dev.stats()["device_buffers"] == buffers - 1
        await s.synchronize()
        assert s.in_flight == 0
    assert_runtime_clean(dev)


async def test_closing_a_plan_turns_away_its_launches_waiting_for_admission(
    open_dev: OpenDevice,
) -> None:
    """Launches of a plan waiting for a slot behind a hung kernel: ``plan.close()`` fails them
    at once with ``ClosedError`` and nothing of them is queued (they waited until a slot came
    free, so behind a hung kernel until the stream's close); other launchers on the stream
    keep their place."""
    async with open_dev(task_timeout=30.0) as dev:
        s = dev.stream(max_in_flight=1)
        hung = await testing.inject_hang(s)
        plan = s.plan(dev.function("noop"), 1)
        outcomes = await close_while_waiting(plan.launch, plan.close)
        assert len(outcomes) == 3 and all(isinstance(o, aa.ClosedError) for o in outcomes)
        assert s.in_flight == 1  # only the hung kernel: nothing of the plan was queued
        await s.aclose(timeout=0.05)
        with pytest.raises(aa.TaskTimeoutError):
            await hung
