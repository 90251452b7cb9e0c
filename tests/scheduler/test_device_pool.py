"""The caching device allocator: ``dev.malloc`` from a per-device pool of size classes, a freed
block reused only once the work queued on it has completed, ``memory_stats()``,
``empty_cache()``, ``malloc(pool=False)``, ``pool_limit_bytes``, the out-of-memory retry.

On the sim, the acl C double and the cuda backend over its fake driver (and on a real GPU
where one is present: ``cuda``, marked ``gpu``), on asyncio, uvloop and trio; the sim's poison
is checked on the sim.
"""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import assert_runtime_clean, live_resources, open_backend

import aio_ascend as aa
from aio_ascend._runtime.sim.memory import POISON_BYTE

pytestmark = pytest.mark.anyio

BACKENDS = ("sim", "acl", "cuda-fake", "cuda")
KiB = 1 << 10
MiB = 1 << 20


def sleep_args(microseconds: int) -> aa.HostArgs:
    return aa.HostArgs().u32(microseconds)


@contextmanager
def device_memory(dev: aa.Device, free_bytes: int) -> Iterator[None]:
    """The runtime below ``dev`` offers only ``free_bytes`` more device memory than it holds
    now (each backend's own control), until the block is left."""
    if dev.backend == "acl":
        from doubles.acl_double import control_for

        control = control_for(dev.runtime)
        control.set_mem_total(control.mem_used(dev.device_id) + free_bytes)
        try:
            yield
        finally:
            control.set_mem_total(None)
    elif dev.backend == "cuda":
        driver = dev.runtime._d  # type: ignore[attr-defined]
        if not hasattr(driver, "total_memory"):
            pytest.skip("the device's memory is only limited on the fake CUDA driver")
        total = driver.total_memory
        driver.total_memory = driver.allocated + free_bytes
        try:
            yield
        finally:
            driver.total_memory = total
    else:
        memory = dev.runtime._memory  # type: ignore[attr-defined]
        capacity = memory.capacity
        memory.capacity = memory.used + free_bytes
        try:
            yield
        finally:
            memory.capacity = capacity


async def test_ten_thousand_mixed_cycles_make_few_runtime_allocations(
    open_dev: Callable[..., Any],
) -> None:
    rng = random.Random(31)
    # log-uniform sizes from 1 byte to 4 MiB: every size class from 512 B up is used
    sizes = [int(2 ** rng.uniform(0, 22)) for _ in range(10_000)]
    async with open_dev() as dev:
        s = dev.stream()
        before = live_resources(dev)["device_allocations"]
        window: list[aa.DeviceBuffer] = []
        for i, nbytes in enumerate(sizes):
            buf = dev.malloc(nbytes)
            if i % 500 == 0:  # some frees wait for queued work (the poller gives them back)
                await s.memset(buf, i & 0xFF)
                await s.launch(dev.function("sleep"), 1, sleep_args(100))
                await s.memset(buf, 1)  # its task not awaited: free() must wait for it
            window.append(buf)
            if len(window) > 4:
                window.pop(rng.randrange(len(window))).free()
        await s.synchronize()
        stats = dev.memory_stats()
        assert stats["allocations"] == 10_000
        assert stats["runtime_allocations"] < 100, stats
        assert stats["pool_hits"] == 10_000 - stats["runtime_allocations"]
        assert live_resources(dev)["device_allocations"] - before == stats["runtime_allocations"]
        assert dev.stats()["device_buffers"] == len(window)
        for buf in window:
            buf.free()
        assert dev.stats()["device_buffers"] == 0
    assert_runtime_clean(dev)


async def test_a_freed_block_is_reused_only_after_its_queued_work_completed(
    open_dev: Callable[..., Any],
) -> None:
    """The canary: a slow kernel, then a write into a buffer freed right after queueing. The
    next malloc of its size gets another block until the write has finished; then the same
    block, whose write landed in it and nowhere else."""
    async with open_dev() as dev:
        s = dev.stream()
        n = 4096
        a = dev.malloc(n)
        first = a.ptr
        await s.launch(dev.function("sleep"), 1, sleep_args(50_000))
        write = await s.memset(a, 0x11)
        a.free()
        b = dev.malloc(n)  # the write is still queued behind the sleep
        assert not write.done()
        assert b.ptr != first
        await s.upload(b, np.full(n, 0x22, np.uint8))
        await write
        c = dev.malloc(n)
        assert c.ptr == first, "the block was not reused once its work had completed"
        assert (await s.download(b)).tolist() == [0x22] * n  # the write never reached b
        if dev.backend == "sim":  # poisoned when it came back, after the write had landed
            assert (await s.download(c)).tolist() == [POISON_BYTE] * n
        stats = dev.memory_stats()
        assert (stats["runtime_allocations"], stats["pool_hits"]) == (2, 1)
        b.free()
        c.free()


async def test_a_late_reader_of_a_pooled_block_sees_the_poison_on_the_sim(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        if dev.backend != "sim":
            pytest.skip("the poison is the sim's")
        s = dev.stream()
        a = dev.malloc(256)
        await s.upload(a, np.arange(256, dtype=np.uint8))
        stale = a.ptr
        a.free()  # nothing queued: back in the pool at once
        assert dev.memory_stats()["cached_blocks"] == 1
        out = dev.malloc(256, pool=False)
        # a kernel reading the freed block through the address it kept
        await s.run(
            dev.function("vector_add"), 1, aa.HostArgs().ptr(stale).ptr(stale).ptr(out).u32(64)
        )
        poison = np.full(4, POISON_BYTE, np.uint8).view(np.float32)[0]
        assert (await s.download(out, np.float32)).tolist() == [float(poison * 2)] * 64
        # a copy reading it
        assert (await s.download(dev.wrap(stale, 256))).tolist() == [POISON_BYTE] * 256
        out.free()


async def test_the_sim_faults_past_the_request_not_past_the_block(
    anyio_backend: object,
) -> None:
    """A pooled block is larger than its request (1000 bytes: a 1024-byte block); a kernel
    running past the request faults on the sim as in an allocation of exactly that size, on a
    new block and on a cached one serving a smaller request."""
    fn = "vector_add"
    for reused in (False, True):
        async with open_backend("sim") as dev:
            s = dev.stream()
            a = dev.malloc(1000)
            if reused:  # a block of 1024 cached, then serving a request of 600
                a.free()
                a = dev.malloc(600)
                assert dev.memory_stats()["pool_hits"] == 1
            n = a.nbytes // 4
            ok = await s.launch(dev.function(fn), 1, aa.HostArgs().ptr(a).ptr(a).ptr(a).u32(n))
            await ok
            args = aa.HostArgs().ptr(a).ptr(a).ptr(a).u32(n + 1)
            bad = await s.launch(dev.function(fn), 1, args)
            with pytest.raises(aa.DeviceFaultError, match="runs past the end") as info:
                await bad
            assert info.value.code == 507015
            assert f"({a.nbytes} bytes)" in str(info.value)


async def test_out_of_memory_empties_the_cache_and_retries_once(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with device_memory(dev, 1 * MiB):
            a = dev.malloc(600 * KiB)  # a 640 KiB block
            a.free()
            b = dev.malloc(700 * KiB)  # 768 KiB: fits only once the cached block is gone
            stats = dev.memory_stats()
            assert stats["oom_retries"] == 1 and stats["runtime_frees"] == 1, stats
            assert stats["cached_bytes"] == 0 and stats["reserved_bytes"] == 768 * KiB
            await s.memset(b, 3)
            assert (await s.download(b[:16])).tolist() == [3] * 16
            with pytest.raises(MemoryError) as info:  # nothing cached to give back
                dev.malloc(700 * KiB)
            assert isinstance(info.value, aa.RuntimeAPIError)  # the runtime's own refusal
            assert dev.memory_stats()["oom_retries"] == 1
            b.free()
    assert_runtime_clean(dev)


async def test_a_request_near_the_largest_size_is_out_of_memory_pooled_or_not(
    open_dev: Callable[..., Any],
) -> None:
    # The pool rounds a request up to its block: just below 2**64 that rounding went past
    # what a runtime can be asked for, and the error named a size nobody passed
    async with open_dev() as dev:
        for nbytes in (2**64 - 1, 2**64 - 4096, 2**63 + 1):
            for pooled in (True, False):
                with pytest.raises(aa.MemoryAllocationError) as info:
                    dev.malloc(nbytes, pool=pooled)
                assert str(2**64) not in str(info.value)
        assert dev.memory_stats()["allocated_bytes"] == 0
        buf = dev.malloc(64)  # and the device goes on
        await dev.stream().memset(buf, 1)
        buf.free()
    assert_runtime_clean(dev)


async def test_pool_limit_bytes_caps_what_the_device_holds(open_dev: Callable[..., Any]) -> None:
    async with open_dev(pool_limit_bytes=1 * MiB) as dev:
        a = dev.malloc(600 * KiB)
        a.free()
        b = dev.malloc(700 * KiB)  # over the limit with the cached block: the cache goes
        stats = dev.memory_stats()
        assert stats["limit_bytes"] == 1 * MiB
        assert stats["runtime_frees"] == 1 and stats["reserved_bytes"] == 768 * KiB, stats
        assert stats["oom_retries"] == 0  # the runtime never refused
        with pytest.raises(MemoryError, match="pool_limit_bytes"):
            dev.malloc(400 * KiB, pool=False)  # direct allocations count too
        assert dev.memory_stats()["runtime_allocations"] == 2  # the runtime was not asked
        small = dev.malloc(200 * KiB)  # 224 KiB: still within the limit
        b.free()
        small.free()
        assert dev.memory_stats()["peak_reserved_bytes"] <= 1 * MiB
    assert_runtime_clean(dev)


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)],
)
def test_a_bad_pool_limit_is_refused_in_the_call(limit: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="pool_limit_bytes"):
        aa.open_device(0, backend="sim", pool_limit_bytes=limit)  # type: ignore[arg-type]


async def test_malloc_pool_false_is_a_direct_allocation(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = live_resources(dev)["device_allocations"]
        buf = dev.malloc(1000, pool=False)
        stats = dev.memory_stats()
        assert stats["reserved_bytes"] == stats["allocated_bytes"] == 1000  # not rounded up
        assert live_resources(dev)["device_allocations"] == before + 1
        await s.launch(dev.function("sleep"), 1, sleep_args(30_000))
        task = await s.memset(buf, 1)
        buf.free()  # deferred: the memset still uses it
        assert live_resources(dev)["device_allocations"] == before + 1
        await task
        stats = dev.memory_stats()
        assert live_resources(dev)["device_allocations"] == before  # back to the runtime
        assert stats["runtime_frees"] == 1 and stats["cached_bytes"] == 0, stats
        assert stats["reserved_bytes"] == 0
        with pytest.raises(TypeError, match="pool"):
            dev.malloc(64, pool="no")  # type: ignore[arg-type]
        assert dev.memory_stats()["allocations"] == 1  # the refused call allocated nothing


async def test_empty_cache_gives_back_only_idle_blocks(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = live_resources(dev)["device_allocations"]
        keep, idle, busy = dev.malloc(100), dev.malloc(3000), dev.malloc(5000)
        await s.launch(dev.function("sleep"), 1, sleep_args(50_000))
        task = await s.memset(busy, 0)
        idle.free()
        busy.free()  # its memset is still queued
        assert dev.empty_cache() == 3072  # the idle block only
        assert live_resources(dev)["device_allocations"] == before + 2
        await task
        assert dev.memory_stats()["cached_blocks"] == 1  # the busy one came back
        assert dev.empty_cache() == 5120
        assert dev.empty_cache() == 0
        stats = dev.memory_stats()
        assert live_resources(dev)["device_allocations"] == before + 1
        assert stats["reserved_bytes"] == stats["allocated_bytes"] == 512, stats
        assert dev.stats()["device_buffers"] == 1
        keep.free()


async def test_memory_stats_after_close(open_dev: Callable[..., Any]) -> None:
    dev = await open_dev()
    s = dev.stream()
    live = dev.malloc(10_000)
    dev.malloc(70_000).free()  # cached
    busy = dev.malloc(2000)
    await s.launch(dev.function("sleep"), 1, sleep_args(20_000))
    await s.memset(busy, 0)  # still queued at the close
    busy.free()
    assert dev.stats()["device_buffers"] == 2
    with anyio.fail_after(10):
        await dev.aclose()
    stats = dev.memory_stats()
    assert stats["allocated_bytes"] == stats["reserved_bytes"] == stats["cached_bytes"] == 0
    assert stats["runtime_frees"] == stats["runtime_allocations"] == 3, stats
    assert stats["runtime_leaks"] == 0, stats  # (nothing was forced)
    assert dev.stats()["device_buffers"] == 0
    assert_runtime_clean(dev)
    live.free()  # freed by the close already: nothing happens
    assert dev.memory_stats()["runtime_frees"] == 3
    with pytest.raises(aa.ClosedError):
        dev.empty_cache()


async def test_a_buffer_dropped_unfreed_goes_back_to_the_pool(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        buf = dev.malloc(256)
        first = buf.ptr
        del buf
        gc.collect()
        with pytest.warns(ResourceWarning, match="garbage-collected without free"):
            again = dev.malloc(256)
        assert again.ptr == first and dev.memory_stats()["pool_hits"] == 1
        again.free()


async def _collected_and_given_back(dev: aa.Device) -> None:
    gc.collect()
    with anyio.fail_after(5):  # (one loop turn is expected)
        while dev.memory_stats()["allocated_bytes"]:  # noqa: ASYNC110 - a counter
            await anyio.sleep(0.001)


async def test_a_buffer_dropped_unfreed_is_given_back_without_waiting_for_a_malloc(
    open_dev: Callable[..., Any],
) -> None:
    """Collected, a dropped buffer's block goes back to the pool on the loop's next turn, with
    its warning: ``memory_stats()`` says so and ``empty_cache()`` can return it to the runtime
    (before: only the next malloc or launch did, and a server freeing memory for another
    library got nothing back)."""
    async with open_dev() as dev:
        buf = dev.malloc(1 << 20)
        del buf
        with pytest.warns(ResourceWarning, match="garbage-collected without free"):
            await _collected_and_given_back(dev)
        assert dev.memory_stats()["cached_bytes"] >= 1 << 20
        assert dev.empty_cache() >= 1 << 20


async def test_memory_stats_read_from_another_thread_always_add_up(
    open_dev: Callable[..., Any],
) -> None:
    """Read on another thread (a metrics scraper) while blocks are freed and cached, the
    figures agree with each other: reserved = allocated + cached, every time (before: a block
    left "allocated" before it joined the cache, 1-2 % of reads showed neither)."""
    async with open_dev() as dev:
        s = dev.stream()
        stop = threading.Event()
        torn: list[dict[str, int]] = []

        def scrape() -> None:
            while not stop.is_set():
                stats = dev.memory_stats()
                if stats["allocated_bytes"] + stats["cached_bytes"] != stats["reserved_bytes"]:
                    torn.append(dict(stats))

        thread = threading.Thread(target=scrape)
        thread.start()
        try:
            for _ in range(300):
                buf = dev.malloc(1 << 16)
                await s.memset(buf, 0)
                buf.free()  # (deferred: given back by the poller once the memset is done)
            await s.synchronize()
        finally:
            stop.set()
            thread.join()
        assert not torn, torn[:3]


async def test_a_buffer_captured_by_a_graph_is_reused_only_after_the_graph_closed(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        x = dev.malloc(256)
        first = x.ptr
        async with s.capture() as capture:
            capture.memset(x, 5)
        x.free()  # the graph's replays still write it
        other = dev.malloc(256)
        assert other.ptr != first
        await s.run_graph(capture.graph)
        capture.graph.close()
        await s.synchronize()
        again = dev.malloc(256)
        assert again.ptr == first
        other.free()
        again.free()
