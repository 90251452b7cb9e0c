"""Per-task timestamps: admitted, submitted, completed (as observed), resumed; one clock.

Every backend x loop (``open_dev``); the sim-only ones use the sim's controls through the
project's own plugin (``aio_ascend.testing``).
"""

from __future__ import annotations

import time

import anyio
import pytest
from helpers import OpenDevice

import aio_ascend as aa
from aio_ascend import testing
from aio_ascend._sched.hooks import HOOKS

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True


async def test_an_awaited_task_has_every_stamp_in_order(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = time.perf_counter()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(2000))
        assert task.submitted_at is None and task.completed_at is None
        await task
        after = time.perf_counter()
        stamps = [task.admitted_at, task.submitted_at, task.completed_at, task.resumed_at]
        assert all(isinstance(t, float) for t in stamps), stamps
        assert before <= stamps[0] <= stamps[1] <= stamps[2] <= stamps[3] <= after  # type: ignore[operator]
        # a 2 ms kernel runs between admission and its observed completion (the device may
        # start it before the batch's submitted_at: only admitted -> completed is bounded)
        assert stamps[2] - stamps[0] >= 0.002  # type: ignore[operator]
        assert task.captured is None  # nobody observes: nothing captured


async def test_one_batch_shares_its_submission_and_one_round_its_completion(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        tasks = [await s.launch(noop, 1) for _ in range(5)]  # one tick: one batch
        await s.synchronize()
        assert len({t.submitted_at for t in tasks}) == 1
        assert len({t.completed_at for t in tasks}) == 1
        assert tasks[0].admitted_at < tasks[-1].admitted_at
        # synchronize() waited for the last one; nobody waited for the others: no wake-up
        assert all(t.resumed_at is None for t in tasks[:-1])
        assert tasks[-1].resumed_at is not None
        await tasks[0]  # a finished task: returns at once, still no wake-up to time
        assert tasks[0].resumed_at is None


async def test_only_the_first_waiter_stamps_the_resumption(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(5000))
        resumed: list[float] = []

        async def waiter() -> None:
            await task
            resumed.append(time.perf_counter())

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
        assert task.resumed_at is not None
        assert task.completed_at is not None
        assert task.completed_at <= task.resumed_at <= min(resumed)


@pytest.mark.sim_only("refuse_launches")
async def test_a_refused_task_was_never_submitted(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        testing.refuse_launches(dev, after=1)
        ok = await s.launch(dev.function("noop"), 1)
        refused = await s.launch(dev.function("noop"), 1)
        with pytest.raises(aa.RuntimeAPIError):
            await refused
        await ok
        assert ok.submitted_at is not None and ok.completed_at is not None
        assert refused.submitted_at is None and refused.completed_at is None
        assert refused.resumed_at is not None  # its waiter resumed (to get the error)


@pytest.mark.sim_only("inject_fault")
async def test_a_fault_completes_the_work_before_it_only(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with testing.paused(dev):  # all three in one batch
            before = await s.launch(dev.function("noop"), 1)
            fault = await testing.inject_fault(s)
            after = await s.launch(dev.function("noop"), 1)
        for task in (before, fault, after):
            await task.wait_finished()
            assert task.submitted_at is not None
        assert before.exception() is None and before.completed_at is not None
        assert isinstance(fault.exception(), aa.DeviceFaultError)
        assert isinstance(after.exception(), aa.DeviceFaultError)
        assert fault.completed_at is None and after.completed_at is None


@pytest.mark.sim_only("inject_hang")
async def test_a_timed_out_task_was_submitted_but_never_completed(open_dev: OpenDevice) -> None:
    async with open_dev(task_timeout=0.2, close_timeout=1.0) as dev:
        s = dev.stream()
        hung = await testing.inject_hang(s)
        with pytest.raises(aa.TaskTimeoutError):
            await hung
        assert hung.submitted_at is not None
        assert hung.completed_at is None
        assert hung.resumed_at is not None
        await dev.aclose(timeout=0.5)


def test_the_stamps_are_slots_not_a_dict() -> None:
    assert not hasattr(aa.Task, "__dict__") or "__dict__" not in aa.Task.__slots__
    for name in ("admitted_at", "submitted_at", "completed_at", "resumed_at", "captured"):
        assert name in aa.Task.__slots__
    assert HOOKS.observers == () and HOOKS.capture is None  # nothing observes by default
