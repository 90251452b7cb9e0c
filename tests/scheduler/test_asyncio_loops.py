"""asyncio-specific behaviour (pytest-asyncio): loop affinity and the wake-up path."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import anyio
import pytest
from helpers import in_forked_child, open_sim

import aio_ascend as aa
from aio_ascend.testing import assert_no_library_threads


@pytest.mark.asyncio
async def test_using_a_device_from_another_event_loop_is_a_clear_error() -> None:
    async with open_sim() as dev:
        s = dev.stream()
        task = await s.launch(dev.function("noop"), 1)
        errors: list[BaseException] = []

        async def elsewhere() -> None:
            try:
                await s.launch(dev.function("noop"), 1)
            except BaseException as exc:
                errors.append(exc)
            try:
                await task
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=asyncio.run, args=(elsewhere(),))
        thread.start()
        thread.join()
        assert len(errors) == 2
        assert all(isinstance(e, RuntimeError) and "different event loop" in str(e) for e in errors)
        await task
        assert dev.stats()["launches"] == 1


@pytest.mark.asyncio
async def test_completions_come_back_through_call_soon_threadsafe_in_batches() -> None:
    loop = asyncio.get_running_loop()
    calls = 0
    original = loop.call_soon_threadsafe

    def counting(*args: object, **kwargs: object) -> asyncio.Handle:
        nonlocal calls
        if threading.current_thread().name.startswith("aio_ascend-poll"):
            calls += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        async with open_sim() as dev:
            s = dev.stream()
            tasks = [await s.launch(dev.function("noop"), 1) for _ in range(2000)]
            for task in tasks:
                await task
        # read after close: the poller counts a wake-up only once its hop has been handed over
        assert calls == dev.stats()["wakeups"]
        assert 1 <= calls < 100  # one hop per poll round, not one per task
    finally:
        del loop.call_soon_threadsafe


@pytest.mark.asyncio
async def test_cancelling_one_waiter_leaves_the_others_waiting() -> None:
    async with open_sim() as dev:
        s = dev.stream()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(30_000))

        async def waiter() -> None:
            await task

        first = asyncio.ensure_future(waiter())
        second = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.005)
        first.cancel()
        await second
        assert first.cancelled() and task.done() and task.exception() is None


async def _close_cancelled_by_asyncio(dev: aa.Device, cancel_with: str) -> None:
    if cancel_with == "wait_for":
        await asyncio.wait_for(dev.aclose(), 0.05)
    elif cancel_with == "timeout":
        async with asyncio.timeout(0.05):
            await dev.aclose()
    else:
        closing = asyncio.ensure_future(dev.aclose())
        await asyncio.sleep(0.05)
        closing.cancel()
        await closing


@pytest.mark.asyncio
@pytest.mark.parametrize("cancel_with", ["wait_for", "timeout", "task.cancel"])
async def test_asyncio_own_cancellation_never_leaves_a_device_close_half_done(
    cancel_with: str,
) -> None:
    # The close is shielded; anyio's shield held off only anyio's cancellation. asyncio's own
    # (wait_for, asyncio.timeout, task.cancel(): what shutdown hooks use) stopped the close
    # half way: the device stayed "closing" with its threads running, and every later close
    # (even aclose(timeout=...)) waited for a wake-up nobody would send.
    dev = await aa.open_device(0, backend="sim")
    s = dev.stream()
    await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(300_000))  # 0.3 s
    t0 = time.perf_counter()
    with pytest.raises((TimeoutError, asyncio.CancelledError)):
        await _close_cancelled_by_asyncio(dev, cancel_with)
    elapsed = time.perf_counter() - t0
    assert dev.closed, dev  # finished first (shielded), then the cancellation was raised
    assert 0.2 < elapsed < 5, elapsed  # (the kernel's 0.3 s: expected ~0.3 s)
    assert not [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]
    with anyio.fail_after(5):
        await dev.aclose()  # closed: returns at once


@pytest.mark.parametrize("timeout", [None, 0.2])
def test_a_close_under_way_as_asyncio_run_ends_still_finishes(timeout: float | None) -> None:
    # asyncio.run cancels the tasks left as its main coroutine returns (or a second Ctrl-C
    # ends it). That cancelled the shielded close's own task: the device stayed "closing"
    # with its runtime open, and a later aclose() from another loop waited for good. The
    # close's task now refuses cancellation (asyncio.run waits for it), and its timeout is a
    # timer: a close bounded by one still ends on time with a kernel that runs on.
    seconds = 0.3 if timeout is None else 60.0  # (the kernel: waited for, or forced)

    async def main() -> aa.Device:
        dev = await aa.open_device(0, backend="sim")
        dev.malloc(1 << 20)  # (held by the device until its close)
        await dev.stream().launch(dev.function("sleep"), 1, aa.HostArgs().u32(int(seconds * 1e6)))
        asyncio.get_running_loop().create_task(dev.aclose(timeout=timeout))
        await asyncio.sleep(0.01)  # the close is under way: main returns
        return dev

    t0 = time.perf_counter()
    dev = asyncio.run(main())
    elapsed = time.perf_counter() - t0
    assert dev.closed, dev
    assert elapsed < 10, elapsed  # (expected ~0.3 s, or ~0.2 s and the forced close's settle)
    assert not [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]  # sim's too
    assert dev.memory_stats()["reserved_bytes"] == 0

    async def again() -> None:
        with anyio.fail_after(5):
            await dev.aclose()  # closed: a no-op, from a later loop too (it raised there)

    asyncio.run(again())


@pytest.mark.parametrize("pending", ["launch", "plan launch", "memset"])
def test_completions_a_finished_loop_dropped_reach_a_close_from_the_next_one(
    pending: str,
) -> None:
    # asyncio.run closes its loop once the main coroutine has returned: a completion the
    # poller posted in between (its call_soon_threadsafe succeeded) was dropped with the
    # loop's other callbacks. A close from the next asyncio.run then waited for good for that
    # task (or, bounded, destroyed the streams by force over work long done). Here the loop
    # is run and closed by hand, with the completion posted in between, every time.
    loop = asyncio.new_event_loop()

    async def queue_work() -> tuple[aa.Device, aa.Task, Any]:
        dev = await aa.open_device(0, backend="sim")
        s = dev.stream()
        buf = dev.malloc(64)
        await (await s.memset(buf, 0))  # (one awaited operation first, as the report had)
        plan = s.plan(dev.function("noop"), 1)
        if pending == "launch":
            task = await s.launch(dev.function("noop"), 1)
        elif pending == "plan launch":
            task = await plan.launch()
        else:
            task = await s.memset(buf, 1)
        return dev, task, plan

    dev, task, plan = loop.run_until_complete(queue_work())
    posting = dev._scheduler._posting
    deadline = time.monotonic() + 10
    while not posting._in_transit:  # (the poller has posted the completion; nobody runs it)
        assert time.monotonic() < deadline
        time.sleep(0.001)
    loop.close()  # (as asyncio.run does: the queued callback goes with it)
    assert not task.done()

    async def close() -> float:
        started = time.perf_counter()
        await dev.aclose(timeout=5)
        return time.perf_counter() - started

    elapsed = asyncio.run(close())
    assert task.done() and task.exception() is None, task  # finished: delivered, not forced
    assert elapsed < 2, elapsed  # (waited for nothing: the work was long done)
    assert dev.closed and plan.closed  # (the plan, open, goes with its device)
    assert_no_library_threads(10)


def test_a_close_left_pending_in_a_closed_loop_is_refused_later_not_waited_for() -> None:
    # A loop closed by hand with the device's close still pending (no asyncio.run to finish
    # it): a later aclose() from another loop waited for that close for good.
    loop = asyncio.new_event_loop()

    async def start_closing() -> aa.Device:
        dev = await aa.open_device(0, backend="sim")
        await dev.stream().launch(dev.function("sleep"), 1, aa.HostArgs().u32(300_000))
        asyncio.get_running_loop().create_task(dev.aclose())
        await asyncio.sleep(0.01)
        return dev

    dev = loop.run_until_complete(start_closing())
    loop.close()

    async def again() -> None:
        with anyio.fail_after(5), pytest.raises(RuntimeError, match="half way"):
            await dev.aclose()  # (its threads are stopped and its runtime closed)
        with anyio.fail_after(5):
            await dev.aclose()  # closed now: a no-op

    asyncio.run(again())
    assert dev.closed
    assert_no_library_threads(10)


@pytest.mark.parametrize("where", ["waiting for the work", "inside the shutdown"])
def test_a_close_stopped_half_way_is_refused_once_then_its_device_is_released(
    where: str,
) -> None:
    # Two ways a close stopped half way (its loop closed by hand under it) went wrong later:
    # - its work finished meanwhile: the adopting loop delivered the completion, whose wake
    #   of a waiter of the closed loop raised "Event loop is closed", and the next aclose()
    #   waited for good;
    # - it had asked the threads to stop: the poller had exited, so the runtime, whose close
    #   was left to the poller's way out, stayed open (and the sim's thread with it).
    loop = asyncio.new_event_loop()

    async def start_closing() -> aa.Device:
        dev = await aa.open_device(0, backend="sim")
        if where == "waiting for the work":
            await dev.stream().launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))
        asyncio.get_running_loop().create_task(dev.aclose())
        poller = dev._scheduler._poller
        deadline = time.monotonic() + 10
        while where == "inside the shutdown" and not poller._stop_asked:
            assert time.monotonic() < deadline
            await asyncio.sleep(0)  # (until the close has asked the threads to stop)
        if where == "waiting for the work":
            await asyncio.sleep(0.01)
        return dev

    dev = loop.run_until_complete(start_closing())
    loop.close()
    time.sleep(0.3)  # (the kernel has finished: its completion waits, undelivered)

    async def again() -> None:
        with anyio.fail_after(5), pytest.raises(RuntimeError, match="half way"):
            await dev.aclose()
        with anyio.fail_after(5):
            await dev.aclose()  # closed now: a no-op

    asyncio.run(again())
    assert dev.closed
    assert_no_library_threads(10)  # the sim's thread too: its runtime was closed


def test_synchronous_calls_from_another_loop_on_the_same_thread_are_refused() -> None:
    # The rule compared thread ids only: a second asyncio.run (or trio.run) on the thread,
    # or no loop at all once the first had finished, allocated and loaded through a device
    # whose loop was gone. Between two runs of its own loop (run_until_complete) they work.
    import trio

    async def opened() -> aa.Device:
        return await aa.open_device(0, backend="sim")

    loop = asyncio.new_event_loop()
    dev = loop.run_until_complete(opened())
    dev.malloc(64).free()  # its own loop, between runs: allowed
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    calls = {
        "malloc": lambda: dev.malloc(64),
        "function": lambda: dev.function("noop"),
        "info": lambda: dev.info,
        "empty_cache": dev.empty_cache,
    }

    async def in_a_loop() -> list[str]:
        refused = []
        for name, call in calls.items():
            with pytest.raises(RuntimeError, match="different event loop"):
                call()
            refused.append(name)
        return refused

    assert asyncio.run(in_a_loop()) == list(calls)
    assert trio.run(in_a_loop) == list(calls)
    for call in calls.values():  # no loop at all: the device's has finished
        with pytest.raises(RuntimeError, match="different event loop"):
            call()
    asyncio.run(dev.aclose())  # a later loop may close it
    assert dev.closed


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.asyncio
async def test_a_forked_child_refuses_every_call_clearly() -> None:
    # Forked inside the running loop, the child ran on with the device's loop but without its
    # threads: malloc was served from the parent's pool cache, and a launch was queued for a
    # submitter that did not exist there (its await never ended).
    async with open_sim() as dev:
        s = dev.stream()
        dev.malloc(4096).free()  # a cached block a child could have been handed

        def child() -> list[str]:  # pragma: no cover - runs in the child
            lines = []
            for name, call in (
                ("malloc", lambda: dev.malloc(4096)),
                ("launch", lambda: s.launch(dev.function("noop"), 1).send(None)),
                ("stream", dev.stream),
            ):
                try:
                    call()
                    lines.append(f"{name}: no error")
                except RuntimeError as exc:
                    lines.append(f"{name}: {exc}")
            return lines

        lines = in_forked_child(child)
        assert len(lines) == 3, lines
        assert all("forked from the one that opened it" in line for line in lines), lines
        await s.run(dev.function("noop"), 1)  # the parent's device works on
        dev.malloc(64).free()


def test_a_forked_child_refuses_to_close_a_device_whose_loop_has_finished() -> None:
    # With the opening loop finished, a close from another loop takes the device over: in a
    # forked child that took over the parent's device (and would have closed its runtime).
    async def opened() -> aa.Device:
        return await aa.open_device(0, backend="sim")

    dev = asyncio.run(opened())

    def child() -> list[str]:  # pragma: no cover - runs in the child
        try:
            asyncio.run(dev.aclose())
        except RuntimeError as exc:
            return [str(exc)]
        return ["no error"]

    lines = in_forked_child(child)
    assert len(lines) == 1 and "forked from the one that opened it" in lines[0], lines
    asyncio.run(dev.aclose())  # the parent's close: from another loop, allowed
    assert dev.closed


@pytest.mark.asyncio
async def test_asyncio_own_cancellation_of_a_close_still_ends_its_host_functions() -> None:
    # The scheduler's part of the close was shielded, the rest not: the cancellation was
    # raised after it, and the host-function thread (and the objects' finalizers) were left.
    dev = await aa.open_device(0, backend="sim")
    s = dev.stream()
    await s.launch_host_func(lambda: time.sleep(0.3))
    await asyncio.sleep(0.05)  # (running)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(dev.aclose(), 0.05)
    assert dev.closed
    assert not [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]


@pytest.mark.asyncio
async def test_asyncio_own_cancellation_never_lets_torch_overtake_a_queued_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On an external (torch) stream an operation is queued, then the call waits until it has
    # reached the runtime, so that a torch op issued next follows it. That wait was shielded
    # from anyio's cancellation only: asyncio's own (Task.cancel, asyncio.timeout) ended it at
    # once, and torch's next op ran before ours. The call now returns (or raises that
    # cancellation) only once the operation has reached the runtime.
    from doubles.torch_npu_queue import FakeTorchStream

    async with open_sim() as dev:
        runtime = dev.runtime
        memset = runtime.memset_async

        def late_memset(*args: Any) -> None:  # ours, from the submitter: it reaches it late
            if threading.current_thread().name.startswith("aio_ascend-submit"):
                time.sleep(0.2)
            memset(*args)

        monkeypatch.setattr(runtime, "memset_async", late_memset)
        runtime.set_current_context(runtime.context)
        handle = runtime.create_stream()
        torch = FakeTorchStream(runtime, handle, lag_s=60.0)
        try:
            x, y = dev.malloc(64), dev.malloc(64)
            setup = dev.stream()
            await setup.memset(y, 0)
            await setup.synchronize()
            ours = dev.external_stream(torch)
            call = asyncio.ensure_future(ours.memset(x, 9))
            await asyncio.sleep(0)  # (queued: now in the wait for its submission)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # The cancellation is raised from the call, not held to the caller's next await:
            # an asyncio.timeout block ending with the call still raises TimeoutError in it,
            # and nothing is left pending on the task after it
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.02):
                    await ours.memset(x, 9)
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0
            await asyncio.sleep(0.01)  # (a held cancellation would be raised here)
            torch.enqueue(
                lambda rt, stream: rt.memcpy_async(y.ptr, 64, x.ptr, 64, 3, stream), "copy"
            )  # (3: ACL_MEMCPY_DEVICE_TO_DEVICE)
            torch.npu_stream  # noqa: B018 - torch launches its copy now
            runtime.synchronize_stream(handle, 5000)  # (this thread is bound to its context)
            assert (await setup.download(y)).tolist() == [9] * 64
            await ours.aclose()
            await setup.aclose()
        finally:
            torch.close()
            runtime.set_current_context(runtime.context)
            runtime.synchronize_stream(handle, 5000)
            runtime.destroy_stream(handle)


@pytest.mark.asyncio
async def test_a_call_cancelled_as_its_turn_behind_a_host_function_came_reopens_the_fast_path() -> (
    None
):
    """asyncio's own cancellation (``task.cancel()``: ``wait_for``, ``TaskGroup``) reaches a
    call that was just given its turn in the line behind a host function, before it ran: the
    line empties all the same, and the stream's launches take the fast path again (before:
    every later launch went the slow way, until the next host function)."""
    async with open_sim() as dev:
        s = dev.stream()
        noop = dev.function("noop")
        release = threading.Event()
        await s.launch_host_func(lambda: release.wait(10))
        second: list[asyncio.Task[Any]] = []

        async def first() -> None:
            await s.launch(noop, 1)
            second[0].cancel()  # its turn was just given; it has not run since

        one = asyncio.create_task(first())
        await asyncio.sleep(0.02)
        second.append(asyncio.create_task(s.launch(noop, 1)))
        await asyncio.sleep(0.02)
        release.set()
        await asyncio.wait_for(one, 10)
        with pytest.raises(asyncio.CancelledError):
            await second[0]
        await s.synchronize()
        assert not s._line
        assert s._plain
