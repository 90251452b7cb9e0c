"""Failures inside the library's own threads that are not the runtime's typed refusals of work.

- A free the runtime refuses (the poller giving back what a finished request held, the
  device's close) leaks that one block and is logged: the thread goes on, later work on every
  stream flows, and the close finishes. Before, the refusal killed the poller (and with it the
  watchdog: every later await hung) or stopped the close half way.
- A retirement that lets go of the last reference to a buffer (a wrapper's owner) no longer
  deadlocks on the registry's lock.
- A defect of ours (a Python exception) in the middle of a hop fails what nobody settled, once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import OpenDevice

import aio_ascend as aa
from aio_ascend import testing

pytestmark = [pytest.mark.anyio, pytest.mark.sim_only("the sim's free calls are patched")]


def _refuse_once(runtime: Any, name: str, thread: str) -> list[str]:
    """The sim's ``name`` (under ``free_host``/``free``) raises once, on a thread named
    ``thread...``; returns the names of the threads that were refused."""
    call: Callable[..., Any] = getattr(runtime, name)
    refused: list[str] = []

    def refusing(*args: Any) -> Any:
        here = threading.current_thread().name
        if not refused and here.startswith(thread):
            refused.append(here)
            raise OSError(f"{name} refused")
        return call(*args)

    setattr(runtime, name, refusing)
    return refused


def _library_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-"))


async def _every_stream_flows(dev: aa.Device, *streams: aa.Stream) -> None:
    for s in (*streams, dev.stream()):
        with anyio.fail_after(10):
            await (await s.launch(dev.function("noop"), 1))


async def test_a_host_free_refused_on_the_poller_leaks_that_buffer_and_work_goes_on(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_dev(pinned_pool_bytes=0, task_timeout=5) as dev:  # staging freed at once
        s1, s2 = dev.stream(), dev.stream()
        refused = _refuse_once(dev.runtime, "_device_free_host", "aio_ascend-poll")
        buf = dev.malloc(4 << 20)
        with anyio.fail_after(10):
            await s1.upload(buf, np.ones(1 << 20, np.float32))
        assert refused == ["aio_ascend-poll-0"]
        await _every_stream_flows(dev, s1, s2)
        assert (await s1.download(buf, np.float32, 16) == 1).all()
        buf.free()
    assert _library_threads() == []
    assert dev.runtime.live_resources()["host_allocations"] == 1  # the refused one
    assert any(
        "free_host" in r.getMessage() and "leaking" in r.getMessage() for r in caplog.records
    )


async def test_a_device_free_refused_on_the_poller_leaks_that_block_and_work_goes_on(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_dev(task_timeout=5) as dev:
        s1, s2 = dev.stream(), dev.stream()
        refused = _refuse_once(dev.runtime, "_device_free", "aio_ascend-poll")
        n = 1024
        x, y, z = dev.malloc(4 * n, pool=False), dev.malloc(4 * n), dev.malloc(4 * n)
        await s1.launch(dev.function("sleep"), 1, aa.HostArgs().u32(20_000))
        task = await s1.launch(
            dev.function("vector_add"), 1, aa.HostArgs().ptr(x).ptr(y).ptr(z).u32(n)
        )
        x.free()  # deferred: given back by the poller once the launch is done
        with anyio.fail_after(10):
            await task
        await _every_stream_flows(dev, s1, s2)
        assert refused == ["aio_ascend-poll-0"]
        y.free()
        z.free()
    assert _library_threads() == []
    assert dev.runtime.live_resources()["device_allocations"] == 1  # the refused one
    assert any("failed" in r.getMessage() and "OSError" in r.getMessage() for r in caplog.records)


async def test_a_host_free_refused_at_the_close_leaks_that_buffer_and_the_close_finishes(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    dev = await open_dev()
    s = dev.stream()
    buf = dev.malloc(1024)
    await s.upload(buf, np.ones(256, np.float32))  # a cached staging buffer for the close
    refused = _refuse_once(dev.runtime, "_device_free_host", "")
    with anyio.fail_after(10):
        await dev.aclose()
    assert refused and dev.closed
    assert _library_threads() == []  # the runtime was closed too
    assert any("free_host" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


async def test_freeing_a_wrapper_whose_owner_is_the_last_reference_to_a_buffer(
    open_dev: OpenDevice,
) -> None:
    """``dev.wrap(buf.ptr, n, owner=buf)`` keeping only the wrapper: its retirement lets go of
    ``buf``, whose collection takes the registry's lock the retirement holds (a deadlock of
    the loop thread, and of the poller when the free was deferred, before the lock was made
    reentrant)."""
    async with open_dev(task_timeout=5) as dev:
        s = dev.stream()
        buf = dev.malloc(4096)
        wrapper = dev.wrap(buf.ptr, 4096, owner=buf)
        del buf
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapper.free()  # at once: nothing uses it
            await (await s.launch(dev.function("noop"), 1))  # (the loop gives buf back)
            other = dev.malloc(4096)
            deferred = dev.wrap(other.ptr, 4096, owner=other)
            del other
            await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(20_000))
            task = await s.memset(deferred, 1)
            deferred.free()  # deferred: retired by the poller once the memset is done
            with anyio.fail_after(10):
                await task
            await (await s.launch(dev.function("noop"), 1))
        dropped = [w for w in caught if "without free" in str(w.message)]
        assert len(dropped) == 2, [str(w.message) for w in caught]
        assert dev.stats()["device_buffers"] == 0


def _defect_after_memset(runtime: Any) -> list[bool]:
    """The submitter's first read of the runtime's task id after a memset raises (a defect
    of ours in the middle of a hop); the list records it (``[True, False]`` once raised)."""
    task_id, memset = runtime.last_task_id, runtime.memset_async
    armed: list[bool] = []

    def memset_then_arm(*args: Any) -> None:
        memset(*args)
        armed.append(True)

    def defect() -> int:
        if armed == [True] and "submit" in threading.current_thread().name:
            armed.append(False)
            raise TypeError("a defect of ours")
        return task_id()

    runtime.memset_async, runtime.last_task_id = memset_then_arm, defect
    return armed


async def test_a_defect_in_the_middle_of_a_hop_fails_only_what_nobody_settled(
    open_dev: OpenDevice,
) -> None:
    """A Python exception of ours raised in the middle of a hop (here: reading the runtime's
    task id after a memset on stream b) fails that memset with InternalError, and only it: the
    launches of stream a in the same hop were handed to the poller already and succeed, once
    (they used to fail as well and then be delivered again: admission counted them out twice,
    and a ``max_in_flight=4`` stream admitted 7 launches)."""
    async with open_dev(task_timeout=5) as dev:
        a, b = dev.stream(max_in_flight=4), dev.stream()
        armed = _defect_after_memset(dev.runtime)
        x = dev.malloc(4096)
        noop = dev.function("noop")
        tasks = [await a.launch(noop, 1) for _ in range(3)]  # one tick: one hop
        failed = await b.memset(x, 7)
        with anyio.fail_after(10):
            for task in tasks:
                await task
            with pytest.raises(aa.InternalError, match="TypeError"):
                await failed
            await (await b.launch(noop, 1))
        assert len(armed) == 2  # the defect was raised once
        admission = a._lane.admission
        assert (admission.in_flight, admission.entries) == (0, 0)
        with testing.paused(dev):
            admitted = 0
            async with anyio.create_task_group() as tg:

                async def launch() -> None:
                    nonlocal admitted
                    await a.launch(noop, 1)
                    admitted += 1

                for _ in range(8):
                    tg.start_soon(launch)
                await anyio.sleep(0.2)
                assert admitted == 4  # max_in_flight holds
                tg.cancel_scope.cancel()
        x.free()


async def test_a_waiter_whose_sleep_keeps_failing_backs_off(open_dev: OpenDevice) -> None:
    """Block mode: ``synchronize_event`` failing on every call while a 1 s kernel runs. The task
    still completes (the poller's own queries see it), and the waiter retries ever more slowly
    (about 20 tries a second once backed off) instead of about a thousand times a second."""
    async with open_dev(completion="block", task_timeout=30) as dev:
        s = dev.stream()
        await (await s.launch(dev.function("noop"), 1))
        runtime = dev.runtime
        tries: list[float] = []

        def failing(*args: Any) -> None:
            if threading.current_thread().name.startswith("aio_ascend-wait"):
                tries.append(1.0)
                raise TypeError("a defect of ours")

        runtime.synchronize_event = failing
        with anyio.fail_after(20):
            await (await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(1_000_000)))
        assert 0 < len(tries) < 200, len(tries)


async def test_a_wait_whose_submission_raises_fails_what_follows_it_in_its_hop(
    open_dev: OpenDevice,
) -> None:
    """``stream_wait_event`` raising a plain Python exception (a defect of ours, not the
    runtime's refusal) fails the wait with InternalError, and the request behind it in the same
    hop too, as a refusal would: that copy relied on the wait's order (it used to be submitted
    without it). The stream takes later work."""
    async with open_dev(task_timeout=5) as dev:
        s1, s2 = dev.stream(), dev.stream()
        runtime = dev.runtime
        wait = runtime.stream_wait_event
        refused: list[bool] = []

        def defect(*args: Any) -> None:
            if not refused:
                refused.append(True)
                raise OSError("a defect of ours")
            wait(*args)

        runtime.stream_wait_event = defect
        x = dev.malloc(64)
        record = await s1.record_event()
        waited = await s2.wait_event(record)  # one tick: one hop
        behind = await s2.memset(x, 1)
        with anyio.fail_after(10):
            with pytest.raises(aa.InternalError, match="OSError") as first:
                await waited
            assert isinstance(first.value.__cause__, OSError)
            with pytest.raises(aa.InternalError, match="an earlier request was refused"):
                await behind
            await (await s2.memset(x, 2))
        assert (await s2.download(x) == 2).all()
        assert refused == [True]


async def test_a_lost_record_does_not_park_later_waits_until_task_timeout(
    open_dev: OpenDevice,
) -> None:
    async with open_dev(task_timeout=5) as dev:
        a, b = dev.stream(), dev.stream()
        _defect_after_memset(dev.runtime)
        x = dev.malloc(4096)
        m = await a.memset(x, 7)
        ev = await a.record_event()  # same hop, after the defect: lost
        with pytest.raises(aa.InternalError):
            await ev
        w = await b.wait_event(ev)
        nxt = await b.launch(dev.function("noop"), 1)
        with anyio.fail_after(2):  # (b stayed parked until task_timeout: 5 s)
            for task in (w, nxt, m):
                with contextlib.suppress(aa.AscendError):
                    await task
        x.free()


async def test_the_hop_of_a_lost_request_does_not_outlive_it(open_dev: OpenDevice) -> None:
    async with open_dev(task_timeout=5) as dev:
        a, b = dev.stream(), dev.stream()
        _defect_after_memset(dev.runtime)
        x = dev.malloc(4096)
        ok = await a.launch(dev.function("noop"), 1)
        failed = await b.memset(x, 7)  # one hop
        await ok
        with pytest.raises(aa.InternalError):
            await failed
        await (await a.launch(dev.function("noop"), 1))
        ref = weakref.ref(ok)
        del ok
        gc.collect()
        assert ref() is None, "the defect's traceback (the InternalError's cause) holds the hop"
        x.free()


async def test_a_finished_hop_is_not_kept_by_the_submitter(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        t1 = await s.memset(dev.malloc(64), 0)
        t2 = await s.launch(dev.function("noop"), 1)  # the stream's latest task
        await t1
        await t2
        ref = weakref.ref(t1)
        del t1
        await anyio.sleep(0.2)
        gc.collect()
        assert ref() is None, "Submitter.underway.handed keeps the last hop's batches"


class _Cycle:
    """A garbage cycle: what it holds is freed only by a collection."""

    def __init__(self) -> None:
        self.me = self
        self.held: object = None


async def test_a_collection_inside_the_close_loses_no_buffer(open_dev: OpenDevice) -> None:
    """A buffer only a garbage cycle holds, collected on the closing thread inside the
    registry's close (as a gen-0 collection set off by an allocation there can be): the
    reentrant lock lets its callback in, which must leave the site to the close (it dropped
    it: that block was never freed)."""
    dev = await open_dev()
    registry = dev._scheduler.lifetimes

    class CollectingSizes(dict):  # type: ignore[type-arg]
        def values(self) -> Any:
            gc.collect()  # (stands for the collection an allocation there may set off)
            return super().values()

    gc.disable()
    try:
        cycle = _Cycle()
        cycle.held = dev.malloc(4096)
        del cycle
        registry._sizes = CollectingSizes(registry._sizes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            await dev.aclose()
    finally:
        gc.enable()
    assert dev.runtime.live_resources()["device_allocations"] == 0
