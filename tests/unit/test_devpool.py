"""``DevicePool``, the caching device allocator, as plain code over a fake runtime: size
classes, reuse, the limit, the out-of-memory retry, the close."""

from __future__ import annotations

import random

import pytest

from aio_ascend._errors import MemoryAllocationError
from aio_ascend._sched import devpool
from aio_ascend._sched.devpool import (
    LARGE_BLOCK,
    LARGE_STEP,
    MAX_OVERSIZE,
    MIN_BLOCK,
    DevicePool,
    block_size,
)

MiB = 1 << 20


class FakeRuntime:
    """malloc/free over a capacity, counting calls."""

    def __init__(self, capacity: int = 1 << 40) -> None:
        self.capacity = capacity
        self.live: dict[int, int] = {}
        self.next = 0x1000
        self.mallocs = 0
        self.poisoned: list[int] = []

    def malloc(self, size: int) -> int:
        if sum(self.live.values()) + size > self.capacity:
            raise MemoryAllocationError("out of memory", code=207001)
        self.mallocs += 1
        ptr = self.next
        self.next += size + 4096
        self.live[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        del self.live[ptr]

    def pool(self, limit: int | None = None) -> DevicePool:
        return DevicePool(self.malloc, self.free, poison=self.poisoned.append, limit=limit)


@pytest.mark.parametrize("nbytes", [1, 2, 511, 512, 513, 1000, 4097, 12345, 1 << 20, 3 << 24])
def test_a_class_holds_the_request_and_wastes_at_most_a_quarter(nbytes: int) -> None:
    size = block_size(nbytes)
    assert size >= nbytes and size % 128 == 0  # (64-byte alignment is what the runtime gives)
    assert size == MIN_BLOCK or size <= nbytes * 1.25


def test_classes_are_four_per_power_of_two_then_multiples_of_2_mib() -> None:
    assert [block_size(n) for n in (513, 641, 769, 897, 1024)] == [640, 768, 896, 1024, 1024]
    assert block_size(LARGE_BLOCK) == LARGE_BLOCK
    assert block_size(LARGE_BLOCK + 1) == LARGE_BLOCK + LARGE_STEP
    assert block_size(100 * MiB + 1) == 102 * MiB


def test_a_cached_block_serves_its_class_and_smaller_ones_down_to_half() -> None:
    runtime = FakeRuntime()
    pool = runtime.pool()
    ptr, size = pool.allocate(4000)
    assert size == 4096
    pool.give_back(ptr, size, 4000, pooled=True)
    assert runtime.poisoned == [ptr]
    assert pool.allocate(1500) != (ptr, size)  # a 1536-byte class: 4096 is over twice it
    assert pool.allocate(2048) == (ptr, size)  # half of it: served by it
    stats = pool.stats()
    assert stats["pool_hits"] == 1 and stats["runtime_allocations"] == 2
    assert stats["allocated_bytes"] == 4096 + 1536 and stats["requested_bytes"] == 2048 + 1500


def test_the_smallest_fitting_block_is_taken() -> None:
    runtime = FakeRuntime()
    pool = runtime.pool()
    blocks = [pool.allocate(n) for n in (3000, 2000, 2500)]
    for (ptr, size), n in zip(blocks, (3000, 2000, 2500), strict=True):
        pool.give_back(ptr, size, n, pooled=True)
    assert pool.allocate(1900) == blocks[1]  # 2048 for a 2048 class, not 2560 or 3072
    assert pool.allocate(1900) == blocks[2]


def test_out_of_memory_empties_the_cache_and_retries_once() -> None:
    runtime = FakeRuntime(capacity=10_000)
    pool = runtime.pool()
    ptr, size = pool.allocate(6000)  # 6144
    pool.give_back(ptr, size, 6000, pooled=True)
    new, big = pool.allocate(7000)  # 7168: fits once the cached block is freed
    assert big == 7168 and runtime.live == {new: 7168}
    assert pool.stats()["oom_retries"] == 1
    with pytest.raises(MemoryAllocationError):  # nothing cached: no retry
        pool.allocate(7000)
    assert pool.stats()["oom_retries"] == 1


def test_the_limit_counts_every_block_held_and_empties_the_cache_first() -> None:
    runtime = FakeRuntime()
    pool = runtime.pool(limit=8192)
    ptr, size = pool.allocate(4096)
    pool.give_back(ptr, size, 4096, pooled=True)
    pool.allocate(6000)  # 6144 + the cached 4096 > 8192: the cache goes first
    assert runtime.live.keys() != {ptr} and pool.stats()["runtime_frees"] == 1
    with pytest.raises(MemoryAllocationError, match="pool_limit_bytes=8192"):
        pool.allocate(3000, pooled=False)
    assert runtime.mallocs == 2


def test_a_direct_block_goes_back_to_the_runtime_at_once() -> None:
    runtime = FakeRuntime()
    pool = runtime.pool()
    ptr, size = pool.allocate(1000, pooled=False)
    assert size == 1000
    pool.give_back(ptr, size, 1000, pooled=False)
    assert runtime.live == {} and runtime.poisoned == []
    assert pool.stats()["reserved_bytes"] == 0


def test_each_pooled_block_is_bounded_to_its_request() -> None:
    """``extent`` (the sim's ``limit_device``) hears the request of every pooled block, new or
    cached; a direct allocation is exactly its request already."""
    runtime = FakeRuntime()
    extents: list[tuple[int, int]] = []
    pool = DevicePool(runtime.malloc, runtime.free, extent=lambda p, n: extents.append((p, n)))
    ptr, size = pool.allocate(1000)
    pool.give_back(ptr, size, 1000, pooled=True)
    assert pool.allocate(600) == (ptr, size)
    pool.allocate(700, pooled=False)
    assert extents == [(ptr, 1000), (ptr, 600)]


def test_close_frees_the_cache_and_the_live_blocks_and_nothing_after() -> None:
    runtime = FakeRuntime()
    pool = runtime.pool()
    live = pool.allocate(100)
    cached = pool.allocate(5000)
    pool.give_back(*cached, 5000, pooled=True)
    pool.close([live])
    assert runtime.live == {}
    pool.give_back(*live, 100, pooled=True)  # a late release: the close freed it already
    stats = pool.stats()
    assert stats["runtime_frees"] == stats["runtime_allocations"] == 2
    assert stats["reserved_bytes"] == stats["allocated_bytes"] == stats["cached_bytes"] == 0


def test_a_free_that_raises_in_empty_cache_strands_no_other_block() -> None:
    """Every cached block is tried; the one whose free raised stays cached and counted (the
    next ``empty_cache`` frees it), and the error still reaches the caller."""
    runtime = FakeRuntime()
    refused: set[int] = set()

    def free(ptr: int) -> None:
        if ptr in refused:
            raise RuntimeError("free refused")
        runtime.free(ptr)

    pool = DevicePool(runtime.malloc, free)
    blocks = [pool.allocate(n) for n in (600, 5000, 70_000)]
    for (ptr, size), n in zip(blocks, (600, 5000, 70_000), strict=True):
        pool.give_back(ptr, size, n, pooled=True)
    bad, bad_size = blocks[0]
    refused.add(bad)
    with pytest.raises(RuntimeError, match="free refused"):
        pool.empty_cache()
    assert runtime.live == {bad: bad_size}  # the others were freed
    stats = pool.stats()
    assert stats["cached_blocks"] == 1 and stats["cached_bytes"] == bad_size
    assert stats["reserved_bytes"] == bad_size and stats["runtime_frees"] == 2
    assert pool.allocate(600) == blocks[0]  # still the pool's: it serves its class
    pool.give_back(bad, bad_size, 600, pooled=True)
    refused.clear()
    assert pool.empty_cache() == bad_size
    assert runtime.live == {} and pool.stats()["reserved_bytes"] == 0


def _mixed_cycles(seed: int) -> int:
    """Runtime allocations of 10,000 malloc/free cycles of log-uniform sizes (1 B .. 4 MiB),
    five buffers alive at a time, one of them freed at random after each malloc."""
    rng = random.Random(seed)
    runtime = FakeRuntime()
    pool = runtime.pool()
    window: list[tuple[int, int, int]] = []
    for _ in range(10_000):
        nbytes = int(2 ** rng.uniform(0, 22))
        window.append((*pool.allocate(nbytes), nbytes))
        if len(window) > 4:
            ptr, size, n = window.pop(rng.randrange(len(window)))
            pool.give_back(ptr, size, n, pooled=True)
    return pool.stats()["runtime_allocations"]


def test_ten_thousand_mixed_cycles_need_few_runtime_allocations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The figures in ``devpool``'s docstring: blocks up to twice the class (the default)
    against exact classes and four times."""
    assert MAX_OVERSIZE == 2
    figures = {}
    for oversize in (1, 2, 4):
        monkeypatch.setattr(devpool, "MAX_OVERSIZE", oversize)
        figures[oversize] = _mixed_cycles(31)
    assert figures == {1: 109, 2: 44, 4: 34}, figures
