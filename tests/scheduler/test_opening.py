"""Opening a device: the runtime is opened off the event loop (loading a runtime library and
initialising a device take seconds on real hardware), on a thread of its own that is gone when
``open_device`` returns, and a cancelled open closes the runtime it opened meanwhile.

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
    with anyio.move_on_after(SLOW_OPEN_S / 5) as scope:
        await aa.open_device(0, "sim")
    assert scope.cancelled_caught
    deadline = time.monotonic() + 10 * SLOW_OPEN_S
    # (polled: a thread's progress wakes no one)
    while (not slow_open or not slow_open[0]._closed) and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.01)
    assert len(slow_open) == 1 and slow_open[0]._closed
    while opener_threads() and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.01)
    assert opener_threads() == []
    # and the same device opens again
    async with aa.open_device(0, "sim") as dev:
        await dev.stream().synchronize()


async def test_a_failing_open_raises_its_error_in_the_call(
    anyio_backend: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise aa.BackendUnavailableError("no runtime here")

    monkeypatch.setattr(aa._device, "open_runtime", refuse)
    with pytest.raises(aa.BackendUnavailableError, match="no runtime here"):
        await aa.open_device(0, "sim")
    assert opener_threads() == []
