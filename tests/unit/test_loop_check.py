"""``LoopAdapter.is_current``: the one "is this call on the device's loop" rule, made on
every launch (asyncio's own loops answer it by their recorded thread, without ``getpid``)."""

from __future__ import annotations

import asyncio
import threading

import trio

from aio_ascend._sched.loop import LoopAdapter, current_loop_adapter


def _adapter_of_a_finished_asyncio_loop() -> LoopAdapter:
    async def make() -> LoopAdapter:
        adapter = current_loop_adapter()
        assert adapter.is_current()
        answers: list[bool] = []
        thread = threading.Thread(target=lambda: answers.append(adapter.is_current()))
        thread.start()
        thread.join()
        assert answers == [False]  # another thread
        return adapter

    return asyncio.run(make())


def test_an_asyncio_adapter_answers_for_its_own_running_loop_only() -> None:
    adapter = _adapter_of_a_finished_asyncio_loop()
    assert not adapter.is_current()  # its loop has finished

    async def another_loop_on_the_same_thread() -> bool:
        return adapter.is_current()

    assert asyncio.run(another_loop_on_the_same_thread()) is False


def test_a_trio_adapter_answers_for_its_own_run_only() -> None:
    async def make() -> LoopAdapter:
        adapter = current_loop_adapter()
        assert adapter.is_current()
        return adapter

    adapter = trio.run(make)
    assert not adapter.is_current()

    async def another_run() -> bool:
        return adapter.is_current()

    assert trio.run(another_run) is False
