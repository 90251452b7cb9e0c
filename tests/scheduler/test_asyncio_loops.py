"""asyncio-specific behaviour (pytest-asyncio): loop affinity and the wake-up path."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import open_sim

import aio_ascend as aa


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
