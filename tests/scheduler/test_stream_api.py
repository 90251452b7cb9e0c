"""Stream API parity with torch.npu.Stream / CuPy: ``wait_stream``, ``query``,
``launch_host_func``, ``copy_device`` from another device, ``aa.device_count``.

Each test runs on the sim, the acl C double and the cuda backend over its fake driver, on
asyncio, uvloop and trio; the few that need the sim's controls say so.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import aio_ascend as aa

pytestmark = pytest.mark.anyio

BACKENDS = ("sim", "acl", "cuda-fake", "realrt")
SLOW_US = 30_000  # a kernel long enough for the host to act while it runs


@pytest.fixture
def two_devices(device_backend: str) -> Iterator[None]:
    """Device 1 exists too (the acl double shows one device unless told otherwise)."""
    if device_backend == "cuda-fake":
        pytest.skip("the fake CUDA driver has one device")
    if device_backend != "acl":
        yield
        return
    from doubles.acl_double import double_control

    control = double_control()
    control.set_device_count(2)
    try:
        yield
    finally:
        control.set_device_count(1)


def sleep_args(microseconds: int) -> aa.HostArgs:
    return aa.HostArgs().u32(microseconds)


# --- wait_stream ------------------------------------------------------------------------------


async def test_wait_stream_orders_later_work_after_the_other_streams(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        a, b = dev.stream(), dev.stream()
        src, dst = dev.malloc(64), dev.malloc(64)
        await b.memset(src, 0)
        await b.memset(dst, 0)
        await b.synchronize()
        await a.launch(dev.function("sleep"), 1, sleep_args(SLOW_US))
        await a.memset(src, 7)  # lands after the sleep
        wait = await b.wait_stream(a)
        await b.copy_device(dst, src)  # without the wait it would read src before the 7s
        assert (await b.download(dst)).tolist() == [7] * 64
        await wait
        # a's work is done on the device; the library observes it on the poller's next round
        # (`query` answers what it has observed): a liveness bound, 10x+ a round's time
        with anyio.fail_after(5):
            while not a.query():  # noqa: ASYNC110 - polling the observation is the point
                await anyio.sleep(0.001)


async def test_wait_stream_never_reports_its_own_record_as_an_unretrieved_failure(
    open_dev: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The event wait_stream() records on the other stream is the library's: when it failed
    # (behind a hung kernel), the close logged it as a task whose error was never retrieved,
    # though the caller had retrieved every Task it was given.
    import logging

    async with open_dev(task_timeout=0.2, close_timeout=0.5) as dev:
        a, b = dev.stream(), dev.stream()
        hung = await a.launch(dev.function("hang"), 1)
        wait = await b.wait_stream(a)
        for task in (hung, wait):
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await task
        # the hung kernel and the wait time out; the record between them is no task of the
        # caller's, and no timeout of its own
        assert dev.stats()["timeouts"] == 2
        with caplog.at_level(logging.ERROR, logger="aio_ascend"):
            await a.aclose(timeout=0)
            await b.aclose(timeout=0)
            await dev.aclose()
    unretrieved = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unretrieved == []


@pytest.mark.backends("sim")
async def test_wait_stream_leaves_nothing_running_on_the_loop(
    open_dev: Callable[..., Any], anyio_backend: tuple[str, dict[str, object]]
) -> None:
    # Its record's error was retrieved by a background task, which outlived a loop closed
    # by hand while the other stream hung ("Task was destroyed but it is pending").
    if anyio_backend[0] != "asyncio":
        pytest.skip("asyncio's task list")
    import asyncio

    async with open_dev(task_timeout=0.2, close_timeout=0.5) as dev:
        a, b = dev.stream(), dev.stream()
        hung = await a.launch(dev.function("hang"), 1)
        before = asyncio.all_tasks()
        wait = await b.wait_stream(a)
        assert asyncio.all_tasks() == before
        for task in (hung, wait):
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await task
        await a.aclose(timeout=0)


async def test_wait_stream_misuse_is_refused(
    open_dev: Callable[..., Any], two_devices: None
) -> None:
    async with open_dev() as dev, open_dev(1) as other:
        s = dev.stream()
        with pytest.raises(TypeError, match="Stream"):
            await s.wait_stream(object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="its own"):
            await s.wait_stream(s)
        with pytest.raises(ValueError, match="different devices"):
            await s.wait_stream(other.stream())
        done = dev.stream()
        await done.aclose()
        with pytest.raises(aa.ClosedError):
            await done.wait_stream(s)


# --- query --------------------------------------------------------------------------------------


async def test_query_tells_whether_everything_queued_has_finished(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        assert s.query()  # nothing queued
        task = await s.launch(dev.function("sleep"), 1, sleep_args(SLOW_US))
        assert not s.query()  # queued, not even submitted yet (same loop tick)
        await anyio.sleep(0.005)
        assert not s.query()  # submitted, running
        await task
        assert s.query()
        failing = await s.launch(dev.function("sleep"), 1, sleep_args(1))
        await failing
        assert s.query()


@pytest.mark.sim_only("refuse_launches")
async def test_a_failed_latest_task_leaves_query_and_synchronize_waiting_for_its_elders(
    open_dev: Callable[..., Any],
) -> None:
    # A failed task is let go of as its stream's latest (its traceback may reach the user's
    # frames); query() then answered True and synchronize() returned at once while the work
    # queued before it still ran.
    from aio_ascend import testing

    async with open_dev() as dev:
        s = dev.stream()
        slow = await s.launch(dev.function("sleep"), 1, sleep_args(300_000))
        await anyio.sleep(0.01)
        testing.refuse_launches(dev)
        refused = await s.launch(dev.function("noop"), 1)
        with anyio.fail_after(10), pytest.raises(aa.RuntimeAPIError):
            await refused  # refused at once: the sleep still runs
        assert not slow.done()
        assert not s.query()
        with anyio.fail_after(10):
            await s.synchronize()
        assert slow.done() and s.query()


async def test_synchronize_waits_for_what_was_queued_before_it_not_for_a_producer(
    open_dev: Callable[..., Any],
) -> None:
    # A first fix for a failed latest task waited until the stream had nothing admitted at
    # all: a coroutine that kept launching held synchronize() off for good.
    async with open_dev() as dev:
        s = dev.stream()
        sleep = dev.function("sleep")
        producing = True

        async def producer() -> None:
            while producing:
                await s.launch(sleep, 1, sleep_args(200))
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.sleep(0.02)
            with anyio.fail_after(5):  # expected well under 0.5 s
                await s.synchronize()
            producing = False


async def test_query_belongs_to_the_loop_thread(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with pytest.raises(RuntimeError, match="thread"):
            await anyio.to_thread.run_sync(s.query)


# --- launch_host_func ---------------------------------------------------------------------------


async def test_a_host_function_runs_after_earlier_work_and_holds_later_work(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(16)
        earlier = await s.launch(dev.function("sleep"), 1, sleep_args(SLOW_US))
        release = threading.Event()
        seen: list[tuple[str, bool]] = []

        def fn() -> None:
            seen.append((threading.current_thread().name, earlier.done()))
            release.wait(10)

        host = await s.launch_host_func(fn)
        assert not s.query()
        # later work waits for fn: the call is held (cancelled there, nothing is queued)
        with anyio.move_on_after(0.2) as scope:
            await s.memset(buf, 1)
        assert scope.cancelled_caught
        assert seen == [(f"aio_ascend-hostfunc-{dev.device_id}", True)]
        assert not host.done()
        release.set()
        later = await s.memset(buf, 2)
        assert host.done()
        await host
        await later
        assert (await s.download(buf)).tolist() == [2] * 16
        assert s.query()


async def test_a_plan_launch_waits_for_a_host_function_as_every_operation_does(
    open_dev: Callable[..., Any],
) -> None:
    # A launch plan queues on its stream through the stream's own admission: a host function
    # queued before holds it, as it holds a plain launch.
    async with open_dev() as dev:
        s = dev.stream()
        x = dev.malloc(16)
        y = dev.malloc(16)
        await s.upload(x, np.ones(4, np.float32))
        await s.upload(y, np.zeros(4, np.float32))
        plan = s.plan(dev.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(7.0).u32(4))
        release = threading.Event()
        host = await s.launch_host_func(lambda: release.wait(10))
        with anyio.move_on_after(0.2) as scope:
            await plan.launch()
        assert scope.cancelled_caught, "the plan's launch overtook the host function"
        release.set()
        task = await plan.launch()
        assert host.done()
        await task
        assert (await s.download(y, np.float32, 4)).tolist() == [7.0] * 4
        plan.close()


async def test_calls_held_behind_a_host_function_go_on_in_the_order_they_came(
    open_dev: Callable[..., Any],
) -> None:
    """A launch waits behind a running host function; eight callers that came after it
    queue host functions again and again. The launch goes first once the host function has
    returned (before: woken together, the calls raced, and on trio, which wakes in random
    order, the launch was overtaken nearly every time, once for 6 s and 60 host functions)."""
    async with open_dev() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        ran_before: list[int] = []
        launched = anyio.Event()
        release = threading.Event()
        await s.launch_host_func(lambda: release.wait(10))

        async def first() -> None:
            await s.launch(noop, 1)  # waits in the call
            ran_before.append(host_runs)
            launched.set()

        host_runs = 0

        def host() -> None:
            nonlocal host_runs
            host_runs += 1
            time.sleep(0.005)

        async def later() -> None:
            await anyio.sleep(0.05)  # after the launch is waiting
            while not launched.is_set():
                await s.launch_host_func(host)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                for _ in range(8):
                    tg.start_soon(later)
                await anyio.sleep(0.1)  # all nine wait behind the first host function
                release.set()
            await s.synchronize()
        assert ran_before == [0]  # none of the later host functions overtook it


async def test_a_held_call_cancelled_in_line_passes_its_turn_on(
    open_dev: Callable[..., Any],
) -> None:
    """Three launches wait in line behind a host function; the first and the second are
    cancelled while they wait: the third still goes once the host function has returned, and
    nothing of the cancelled two was queued."""
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(4)
        await s.memset(buf, 0, 4)
        release = threading.Event()
        await s.launch_host_func(lambda: release.wait(10))
        order: list[int] = []

        async def call(i: int, scope: anyio.CancelScope) -> None:
            with scope:
                await s.memset(buf, i, 4)
                order.append(i)

        scopes = [anyio.CancelScope() for _ in range(3)]
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i, scope in enumerate(scopes, start=1):
                    tg.start_soon(call, i, scope)
                    await anyio.sleep(0.01)
                scopes[0].cancel()  # the first in line (waiting for the host function)
                scopes[1].cancel()
                await anyio.sleep(0.01)
                release.set()
            await s.synchronize()
        assert order == [3]
        assert (await s.download(buf, np.uint8, 4)).tolist() == [3] * 4


async def test_an_exception_in_a_host_function_fails_its_task_not_the_stream(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(8)

        def boom() -> None:
            raise KeyError("from fn")

        host = await s.launch_host_func(boom)
        with pytest.raises(KeyError, match="from fn"):
            await host
        await s.memset(buf, 3)
        assert (await s.download(buf)).tolist() == [3] * 8
        await s.synchronize()  # the error was retrieved: nothing raised
        assert dev.fault is None


async def test_an_async_host_function_is_refused_not_left_unawaited(
    open_dev: Callable[..., Any],
) -> None:
    """``fn`` runs on a thread: a coroutine function is refused in the call, and an async
    callable object (not recognisable before it is called) fails its Task. Both were
    accepted: the coroutine was never awaited (a RuntimeWarning) and the Task succeeded."""
    import warnings

    async def handler() -> None:
        raise AssertionError("never runs")

    class AsyncCallable:
        async def __call__(self) -> None:
            raise AssertionError("never runs")

    async with open_dev() as dev:
        s = dev.stream()
        with pytest.raises(TypeError, match="cannot await"):
            await s.launch_host_func(handler)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no "coroutine was never awaited")
            task = await s.launch_host_func(AsyncCallable())
            with pytest.raises(TypeError, match="cannot await"):
                await task
        await s.run(dev.function("noop"), 1)  # the stream goes on


async def test_host_functions_run_in_stream_order_and_synchronize_waits_for_them(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        a, b = dev.stream(), dev.stream()
        order: list[str] = []
        # (10x SLOW_US: b1 must run before the kernel ends even on a loaded machine, where
        # the host-function thread's first start took longer than SLOW_US on realrt)
        await a.launch(dev.function("sleep"), 1, sleep_args(10 * SLOW_US))
        await a.launch_host_func(lambda: order.append("a1"))
        await b.launch_host_func(lambda: order.append("b1"))  # b has nothing before it
        await a.launch_host_func(lambda: order.append("a2"))
        await a.synchronize()
        await b.synchronize()
        assert order.index("a1") < order.index("a2")
        assert order[0] == "b1"


@pytest.mark.sim_only
async def test_a_host_function_after_failed_work_never_runs(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        ran: list[int] = []
        fault = await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
        host = await s.launch_host_func(lambda: ran.append(1))
        with pytest.raises(aa.DeviceFaultError):
            await host
        with pytest.raises(aa.DeviceFaultError):
            await fault
        assert ran == []
    assert dev.closed


async def test_a_host_function_cancelled_before_admission_never_runs(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=1)
        busy = await s.launch(dev.function("sleep"), 1, sleep_args(SLOW_US))
        ran: list[int] = []
        with anyio.move_on_after(0.005) as scope:
            await s.launch_host_func(lambda: ran.append(1))  # waits for the slot: cancelled
        assert scope.cancelled_caught
        await busy
        buf = dev.malloc(8)
        await s.memset(buf, 4)  # nothing holds the stream
        assert (await s.download(buf)).tolist() == [4] * 8
        assert ran == [] and s.query()


async def test_launch_host_func_misuse_is_refused(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with pytest.raises(TypeError, match="callable"):
            await s.launch_host_func(42)  # type: ignore[arg-type]
        await s.aclose()
        with pytest.raises(aa.ClosedError):
            await s.launch_host_func(lambda: None)


async def test_the_close_waits_for_a_running_host_function(open_dev: Callable[..., Any]) -> None:
    finished = threading.Event()

    def slow() -> None:
        finished.wait(0.3)
        finished.set()

    async with open_dev() as dev:
        s = dev.stream()
        host = await s.launch_host_func(slow)
    assert finished.is_set()
    assert host.done()
    await host
    assert not [t for t in threading.enumerate() if t.name.startswith("aio_ascend-hostfunc")]


async def launch_stuck(s: aa.Stream, after: Callable[[], object] = lambda: None) -> Any:
    """A host function on ``s`` that runs until ``release`` is set (then calls ``after``), once
    it has started: ``(its task, release)``."""
    started, release = threading.Event(), threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(30)
        after()

    host = await s.launch_host_func(stuck)
    await anyio.to_thread.run_sync(started.wait, 10)
    return host, release


async def test_a_close_abandons_a_host_function_past_its_timeout(
    open_dev: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    dev = await open_dev()
    s = dev.stream()
    host, release = await launch_stuck(s)
    start = time.monotonic()
    await dev.aclose(timeout=0.1)
    waited = time.monotonic() - start
    # within its timeout (plus a 10x liveness margin): it waited 0.1 s for the device, 0.1 s
    # more for the host function, then 2 s for the thread the function holds, before
    assert waited < 1.9, waited
    assert "did not return" in caplog.text
    with pytest.raises(aa.TaskTimeoutError, match="did not finish before aclose"):
        await host  # as a forced close's tasks fail (it was a ClosedError)
    assert dev.stats()["timeouts"] == 1  # counted as device work's are (it was not)
    release.set()  # the abandoned function returns; its thread exits
    for thread in threading.enumerate():
        if thread.name.startswith("aio_ascend-hostfunc"):
            await anyio.to_thread.run_sync(thread.join, 10)


async def test_an_escalated_close_ends_the_patient_one_too_with_a_host_function_running(
    open_dev: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain ``aclose()`` waiting for a running host function, then ``aclose(timeout=0.2)``:
    the earliest deadline wins for both. The patient close, woken by the other's abandonment,
    went on to join the thread the abandoned function holds (``STUCK_AFTER_S`` more; made
    long here so that this shows)."""
    from aio_ascend import _hostfunc

    monkeypatch.setattr(_hostfunc, "STUCK_AFTER_S", 20.0)
    dev = await open_dev()
    s = dev.stream()
    host, release = await launch_stuck(s)
    returned: dict[str, float] = {}
    start = time.monotonic()

    async def close(name: str, **kwargs: Any) -> None:
        await dev.aclose(**kwargs)
        returned[name] = time.monotonic() - start

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(close, "patient")
            await anyio.sleep(0.1)
            tg.start_soon(functools.partial(close, "escalated", timeout=0.2))
    finally:
        release.set()
    # both at about 0.3 s (10x margin); the patient one took 20 s more
    assert returned["patient"] < 5.0 and returned["escalated"] < 5.0, returned
    with pytest.raises(aa.TaskTimeoutError):
        await host
    for thread in threading.enumerate():
        if thread.name.startswith("aio_ascend-hostfunc"):
            await anyio.to_thread.run_sync(thread.join, 10)


async def test_a_stream_close_waits_for_its_host_function(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        ran = threading.Event()

        def slow() -> None:
            threading.Event().wait(0.05)
            ran.set()

        host = await s.launch_host_func(slow)
        await s.aclose()
        assert ran.is_set() and host.done()


async def test_the_watchdog_fails_a_host_function_that_does_not_return(
    open_dev: Callable[..., Any],
) -> None:
    """``task_timeout`` bounds a host function's task as it bounds device work (it never
    fired: a stuck ``fn`` left its task, and every wait on it, pending for good). As with a
    timed-out kernel, what comes after it on the stream still waits for it: it runs once
    ``fn`` returns, never beside it."""
    order: list[str] = []
    async with open_dev(task_timeout=0.2) as dev:
        s = dev.stream()
        host, release = await launch_stuck(s, lambda: order.append("fn returned"))
        with anyio.fail_after(10):  # 0.2 s expected
            with pytest.raises(aa.TaskTimeoutError, match="did not return within task_timeout"):
                await host
        assert not release.is_set()
        assert dev.stats()["timeouts"] == 1  # counted as device work's are (it was not)
        later_done = anyio.Event()

        async def later() -> None:
            await s.launch_host_func(lambda: order.append("later ran"))
            later_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            await anyio.sleep(0.1)
            assert not later_done.is_set()  # held behind the running fn
            release.set()
        await s.synchronize()
        assert order == ["fn returned", "later ran"]
        assert dev.stats()["timeouts"] == 1  # once, not again when fn returned


async def test_a_host_function_behind_a_hung_kernel_is_one_timeout(
    open_dev: Callable[..., Any],
) -> None:
    # Its own event record (the library's) timed out with the kernel and was counted too
    async with open_dev(task_timeout=0.2, close_timeout=0.5) as dev:
        s = dev.stream()
        hung = await s.launch(dev.function("hang"), 1)
        host = await s.launch_host_func(lambda: None)
        for task in (hung, host):
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await task
        assert dev.stats()["timeouts"] == 2
        await s.aclose(timeout=0)


async def test_a_host_function_a_forced_stream_close_gives_up_on_is_a_timeout(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        host, release = await launch_stuck(s)
        try:
            await s.aclose(timeout=0.1)
            with pytest.raises(aa.TaskTimeoutError):
                await host
            assert dev.stats()["timeouts"] == 1  # (it was not counted)
        finally:
            release.set()


async def test_a_stream_close_refuses_calls_held_behind_a_host_function_at_once(
    open_dev: Callable[..., Any],
) -> None:
    """A call waiting behind a host function the watchdog failed (``fn`` runs on) stayed
    blocked after its stream's close until ``fn`` returned; it is refused with the close."""
    async with open_dev(task_timeout=0.2) as dev:
        s = dev.stream()
        host, release = await launch_stuck(s)
        try:
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await host
            refused = anyio.Event()

            async def held() -> None:
                with pytest.raises(aa.ClosedError):
                    await s.launch(dev.function("noop"), 1)
                refused.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(held)
                await anyio.sleep(0.05)
                await s.aclose()
                with anyio.fail_after(10):  # at once expected; before: when fn returned
                    await refused.wait()
                assert not release.is_set()
        finally:
            release.set()


async def test_a_forced_stream_close_gives_up_on_a_running_host_function(
    open_dev: Callable[..., Any],
) -> None:
    """``s.aclose(timeout=...)`` waited for a host function that never returned, shielded,
    for good (it logged "0 task(s) unfinished"). It now returns within its timeout; the
    task fails as the forced close's tasks do, and the function's thread is the device
    close's to wait for (which abandons it past its own timeout)."""
    dev = await open_dev()
    try:
        s = dev.stream()
        host, release = await launch_stuck(s)
        with anyio.fail_after(10):  # 0.2 s expected
            await s.aclose(timeout=0.2)
        with pytest.raises(aa.TaskTimeoutError, match="did not finish before aclose") as caught:
            await host
        assert caught.value.by_close
        await dev.stream().run(dev.function("noop"), 1)  # the device works on
    finally:
        release.set()
        with anyio.fail_after(10):
            await dev.aclose()
    assert not [t for t in threading.enumerate() if t.name.startswith("aio_ascend-hostfunc")]


# --- copy_device from another device ------------------------------------------------------------


async def test_copy_device_reads_a_buffer_of_another_device(
    open_dev: Callable[..., Any], two_devices: None
) -> None:
    async with open_dev(0) as dev, open_dev(1) as other:
        here, there = dev.stream(), other.stream()
        src = other.malloc(32)
        dst = dev.malloc(32)
        await there.launch(other.function("sleep"), 1, sleep_args(SLOW_US))
        await there.upload(src, np.arange(8, dtype=np.float32))
        task = await here.copy_device(dst, src, src_stream=there)  # after there's work
        await task
        got = await here.download(dst, np.float32)
        np.testing.assert_array_equal(got, np.arange(8, dtype=np.float32))
        part = dev.malloc(8)
        await here.copy_device(part, src, 8, src_stream=there)
        np.testing.assert_array_equal(await here.download(part, np.float32), [0, 1])


async def test_copy_device_across_devices_misuse_is_refused(
    open_dev: Callable[..., Any], two_devices: None
) -> None:
    async with open_dev(0) as dev, open_dev(1) as other:
        here, there = dev.stream(), other.stream()
        src, dst = other.malloc(32), dev.malloc(16)
        with pytest.raises(ValueError, match="src_stream"):
            await here.copy_device(dst, src)
        with pytest.raises(ValueError, match=r"src_stream .* another device than src's"):
            await here.copy_device(dst, src, 16, src_stream=here)  # a stream of the wrong device
        with pytest.raises(TypeError, match="src_stream"):
            await here.copy_device(dst, src, src_stream=object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="16"):
            await here.copy_device(dst, src, src_stream=there)  # 32 bytes do not fit in 16
        local = dev.malloc(16)
        with pytest.raises(ValueError, match=r"src_stream .* another device than src's"):
            await here.copy_device(dst, local, src_stream=there)  # (it was let through)
        closed = dev.stream()
        await closed.aclose()
        with pytest.raises(aa.ClosedError):  # (refused after the read there had run)
            await closed.copy_device(dst, src, 16, src_stream=there)
        assert there.query()  # nothing was queued by the refused calls
        assert other.stats()["copies"] == 0
    # the source's device closed: a use after its close (it said "has been freed")
    with pytest.raises(aa.ClosedError, match="closed device"):
        async with open_dev(0) as dev:
            await dev.stream().copy_device(dev.malloc(16), src, 16, src_stream=there)


# --- device_count ---------------------------------------------------------------------------------


def test_device_count_asks_the_backend() -> None:
    assert aa.device_count("sim") == 1
    from backends import fake_driver

    assert aa.device_count("cuda", runtime_options={"driver": fake_driver()}) == 1
    from doubles.acl_double import DEFAULT_PERSONA, build_double, double_control

    library = str(build_double(DEFAULT_PERSONA).library)
    double_control().set_device_count(3)
    try:
        assert aa.device_count("acl", runtime_options={"library_path": library}) == 3
    finally:
        double_control().set_device_count(1)
    with pytest.raises(ValueError, match="backend"):
        aa.device_count("tpu")
    with pytest.raises(TypeError):
        aa.device_count(backend=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aa.device_count("acl", runtime_options={"nonsense": 1})


def test_device_count_auto_follows_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIO_ASCEND_BACKEND", "sim")
    assert aa.device_count() == 1


@pytest.mark.parametrize("anyio_backend", ["trio", "asyncio"])
async def test_a_device_close_cancelled_half_way_still_stops_the_host_function_thread(
    anyio_backend: str,
) -> None:
    # The device's close is shielded once started, its host functions' part included: a
    # cancelled scope around the device leaves no hostfunc thread behind.
    release = threading.Event()
    with anyio.move_on_after(0.3):
        async with await aa.open_device(0, backend="sim", task_timeout=5.0) as dev:
            s = dev.stream()
            await s.launch_host_func(lambda: release.wait(2))
            await anyio.sleep(10)
    release.set()
    name = f"aio_ascend-hostfunc-{dev.device_id}"
    deadline = time.monotonic() + 10
    while any(t.name == name for t in threading.enumerate()) and time.monotonic() < deadline:  # noqa: ASYNC110 - a thread list
        await anyio.sleep(0.01)
    assert not any(t.name == name for t in threading.enumerate())
    assert dev.closed


async def test_an_event_and_the_work_before_it_complete_without_the_work_after_it(
    open_dev: Callable[..., Any],
) -> None:
    """A record, with a hanging kernel queued after it in the same loop tick: ``await event``
    and the kernel before the record return once that kernel is done (they waited for the
    whole batch, and so for the hang, until the watchdog failed all three)."""
    async with open_dev(task_timeout=30, close_timeout=0.5) as dev:
        s = dev.stream()
        before = await s.launch(dev.function("sleep"), 1, sleep_args(20_000))
        event = await s.record_event()
        hung = await s.launch(dev.function("hang"), 1)  # (the same tick: one hop)
        with anyio.fail_after(10):
            await event
            await before
        assert event.query() and not hung.done()
        await s.aclose(timeout=0)
        with pytest.raises(aa.TaskTimeoutError):
            await hung
