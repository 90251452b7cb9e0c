"""HostBufferPool: reuse by size class, statistics, debug poison and canaries, close."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from aio_ascend._errors import InternalError
from aio_ascend._host.pool import POISON_BYTE, HostBufferPool, size_class
from aio_ascend._runtime import Runtime, open_runtime
from aio_ascend._runtime.hostmem import host_view


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = open_runtime("sim", 0)
    yield rt
    rt.close()


def test_size_classes() -> None:
    assert [size_class(n) for n in (1, 64, 65, 128, 129, 4096, 4097)] == [
        64,
        64,
        128,
        128,
        256,
        4096,
        8192,
    ]


def test_steady_state_allocates_nothing(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host)
    bufs = [pool.acquire(100) for _ in range(600)]  # 128-byte class: 512 per 64 KiB slab
    assert pool.stats()["allocations"] == 2
    assert pool.stats()["in_use"] == 600
    assert len({buf.addr for buf in bufs}) == 600
    for buf in bufs:
        pool.release(buf)
    warm = pool.stats()["allocations"]
    for _ in range(1000):
        batch = [pool.acquire(n) for n in (1, 100, 128, 5000)]
        for buf in batch:
            pool.release(buf)
    stats = pool.stats()
    assert stats["allocations"] == warm + 2  # one 64-byte slab, one 8 KiB buffer
    assert stats["in_use"] == 0 and stats["free"] == stats["high_water"] == 1024 + 1024 + 1
    assert pool.close() == 0
    assert runtime.live_resources()["host_allocations"] == 0  # type: ignore[attr-defined]


def test_buffers_are_writable_pinned_memory(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host)
    buf = pool.acquire(16)
    buf.view[:4] = b"abcd"
    assert bytes(host_view(buf.addr, 4)) == b"abcd"
    assert buf.addr % 64 == 0 and buf.capacity == 64
    pool.release(buf)
    pool.close()


def test_double_release_is_an_internal_error(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host)
    buf = pool.acquire(8)
    pool.release(buf)
    with pytest.raises(InternalError, match="twice"):
        pool.release(buf)
    pool.close()


def test_debug_mode_poisons_and_catches_use_after_release(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host, debug=True)
    buf = pool.acquire(32)
    buf.view[:8] = b"payload!"
    pool.release(buf)
    assert bytes(buf.view) == bytes([POISON_BYTE]) * buf.capacity
    buf.view[0] = 0  # a write after release
    with pytest.warns(RuntimeWarning, match="use after free"):
        again = pool.acquire(32)
    assert again is buf
    assert pool.stats()["violations"] == 1
    pool.release(again)
    pool.close()


def test_debug_mode_catches_an_overrun(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host, debug=True)
    buf = pool.acquire(64)
    host_view(buf.addr + buf.capacity, 1)[0] = 0  # one byte past the end
    with pytest.warns(RuntimeWarning, match="overrun"):
        pool.release(buf)
    assert pool.stats()["violations"] == 1
    pool.close()


def test_clean_reuse_raises_no_warning(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host, debug=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(50):
            buf = pool.acquire(40)
            buf.view[:40] = b"x" * 40
            pool.release(buf)
    assert pool.stats()["violations"] == 0
    pool.close()


def test_close_reports_buffers_still_in_use(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host)
    kept = pool.acquire(8)
    pool.release(pool.acquire(8))
    with pytest.warns(ResourceWarning, match="1 buffer"):
        assert pool.close() == 1
    with pytest.raises(InternalError):
        pool.acquire(8)
    assert runtime.live_resources()["host_allocations"] == 0  # type: ignore[attr-defined]
    pool.release(kept)  # a late release after close is harmless (its slab is gone)


def test_large_classes_are_not_cached(runtime: Runtime) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host, max_cached_class=1024)
    pool.release(pool.acquire(4096))
    assert pool.stats()["free"] == 0
    assert runtime.live_resources()["host_allocations"] == 0  # type: ignore[attr-defined]
    pool.close()


def test_a_pinned_buffer_is_shared_until_unpinned_and_never_counted_in_use(
    runtime: Runtime,
) -> None:
    pool = HostBufferPool(runtime.malloc_host, runtime.free_host, debug=True)
    image = bytes(range(16))
    buf = pool.pin(image)
    assert buf.shared and buf.view[:16] == image
    assert pool.stats()["in_use"] == 0  # a plan's image, not a request's buffer
    pool.unpin(buf)
    assert not buf.shared and pool.stats()["violations"] == 0
    pool.unpin(buf)  # given back once
    assert pool.stats()["free"] >= 1
    kept = pool.pin(image)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not reported as a leak: its owner outlives the pool
        assert pool.close() == 0
    pool.unpin(kept)  # after the close: freed already, nothing to do


def test_only_an_image_the_runtime_never_writes_is_shared() -> None:
    from aio_ascend._host.hostargs import HostArgs
    from aio_ascend._host.snapshot import shareable
    from aio_ascend._runtime.base import FunctionInfo

    assert shareable(HostArgs().u32(1).pack())
    # hidden arguments are laid in by the packer (the runtime adds and writes none)
    mix = FunctionInfo(prefix=(0x1000,), suffix=(0x2000,), kernel_type="mix")
    assert shareable(HostArgs().u32(1).pack(mix))
    assert not shareable(HostArgs().u32(1).placeholder(b"tiling!!").pack())
