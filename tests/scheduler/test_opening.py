"""Opening a device: the runtime is opened off the event loop (loading a runtime library and
initialising a device take seconds on real hardware), on a thread of its own that is gone when
``open_device`` returns or raises, and a cancelled open closes the runtime it opened.

On asyncio, uvloop and trio, over the sim with its open slowed down.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

import aio_ascend as aa

pytestmark = pytest.mark.anyio

#: how long the slowed open takes; every bound below is 10x what the loop would otherwise see
SLOW_OPEN_S = 0.5


def opener_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-open")]


@pytest.fixture
def slow_open(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``open_runtime`` made slow (a blocking sleep, as a real device's initialisation is);
    the runtimes it opened, in order."""
    real = aa._device.open_runtime
    opened: list[Any] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_OPEN_S)
        runtime = real(*args, **kwargs)
        opened.append(runtime)
        return runtime

    monkeypatch.setattr(aa._device, "open_runtime", slow)
    return opened


async def test_opening_a_device_leaves_the_loop_running(
    anyio_backend: object, slow_open: list[Any]
) -> None:
    gaps: list[float] = []
    opening = True

    async def ticker() -> None:
        last = time.monotonic()
        while opening:
            await anyio.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        started = time.monotonic()
        dev = await aa.open_device(0, "sim")
        took = time.monotonic() - started
        opening = False
    try:
        assert took >= SLOW_OPEN_S
        # the loop ran throughout (a blocking open stops it for the whole SLOW_OPEN_S)
        assert len(gaps) > 10 and max(gaps) < SLOW_OPEN_S / 2, max(gaps)
        assert opener_threads() == []
        assert await (await dev.stream().launch(dev.function("noop"), 1)) is None
    finally:
        await dev.aclose()


async def test_a_cancelled_open_closes_the_runtime_it_opened(
    anyio_backend: object, slow_open: list[Any]
) -> None:
    # A thread cannot be interrupted: the cancelled call waits for the open (as anyio's
    # to_thread does), closes what it opened, then raises. It returned while the thread still
    # opened, and a program ending then left the runtime open (racing ACL's aclFinalize).
    started = time.monotonic()
    with anyio.move_on_after(SLOW_OPEN_S / 5) as scope:
        await aa.open_device(0, "sim")
    assert scope.cancelled_caught
    assert time.monotonic() - started >= SLOW_OPEN_S
    assert len(slow_open) == 1 and slow_open[0]._closed
    assert opener_threads() == []
    async with aa.open_device(0, "sim") as dev:  # and the same device opens again
        await dev.stream().synchronize()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncios_own_cancellation_of_an_open_closes_the_runtime_too(
    anyio_backend: object, slow_open: list[Any]
) -> None:
    import asyncio

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(aa.open_device(0, "sim"), SLOW_OPEN_S / 5)
    assert len(slow_open) == 1 and slow_open[0]._closed
    assert opener_threads() == []


async def test_a_failing_open_raises_its_error_in_the_call(
    anyio_backend: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise aa.BackendUnavailableError("no runtime here")

    monkeypatch.setattr(aa._device, "open_runtime", refuse)
    with pytest.raises(aa.BackendUnavailableError, match="no runtime here"):
        await aa.open_device(0, "sim")
    assert opener_threads() == []


async def test_one_opener_in_two_async_with_blocks_at_once_is_refused(
    anyio_backend: object,
) -> None:
    # The second block took over the opener's device: the first block's exit closed the
    # second's, and its own was never closed
    opener = aa.open_device(0, "sim")
    async with opener as dev:
        with pytest.raises(RuntimeError, match="once per block"):
            async with opener:
                pass
        assert await (await dev.stream().launch(dev.function("noop"), 1)) is None
    assert dev.closed
    async with opener as again:  # one block after the other is fine
        assert again is not dev and not again.closed
    assert again.closed
