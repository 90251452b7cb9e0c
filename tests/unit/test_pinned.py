"""``PinnedArrays`` without a device: who frees what when, and the runtime's close deferred
past the last array (pure code over a fake ``malloc_host``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from aio_ascend._host.pinned import PinnedArrays, PinnedHostMemory, pinned_owner


class FakeHost:
    """``malloc_host``/``free_host`` over numpy buffers; records frees and closes."""

    def __init__(self) -> None:
        self.blocks: dict[int, np.ndarray[Any, Any]] = {}
        self.freed: list[int] = []
        self.closed = 0

    def malloc_host(self, size: int) -> int:
        block = np.zeros(size + 64, np.uint8)
        addr = block.ctypes.data + (-block.ctypes.data) % 64
        self.blocks[addr] = block
        return addr

    def free_host(self, addr: int) -> None:
        self.freed.append(addr)
        self.blocks[addr][:] = 0xDB  # (the memory itself stays: this is a test)

    def close(self) -> None:
        self.closed += 1


def _registry() -> tuple[PinnedArrays, FakeHost, list[Callable[[], None]]]:
    host = FakeHost()
    posted: list[Callable[[], None]] = []
    return PinnedArrays(host, posted.append), host, posted  # type: ignore[arg-type]


def test_an_array_is_freed_by_the_loop_once_it_and_its_views_are_gone() -> None:
    pinned, host, posted = _registry()
    array = pinned.empty((4, 8), np.dtype(np.float32))
    assert array.shape == (4, 8) and array.dtype == np.float32 and array.flags.c_contiguous
    owner = pinned_owner(array)
    assert isinstance(owner, PinnedHostMemory) and owner.registry is pinned
    assert pinned_owner(array[1:].view(np.uint8)) is owner
    assert pinned_owner(np.asarray(memoryview(array))) is owner
    assert pinned_owner(np.zeros(4)) is None
    assert pinned.stats() == {"pinned_arrays": 1, "pinned_bytes": 128}
    view = array[2:]
    del array, owner
    gc.collect()
    assert not posted and not host.freed  # the view keeps it
    del view
    gc.collect()
    assert len(posted) == 1 and not host.freed  # freed on the loop, not in the collection
    posted.pop()()
    assert len(host.freed) == 1 and pinned.stats()["pinned_arrays"] == 0


def test_the_close_waits_for_the_last_array_before_closing_the_runtime() -> None:
    pinned, host, posted = _registry()
    gone = pinned.empty((16,), np.dtype(np.uint8))
    kept = pinned.empty((16,), np.dtype(np.int64))
    kept[:] = 5
    del gone
    gc.collect()
    assert pinned.close(host.close) == 1  # the collected one is freed, the runtime stays
    assert len(host.freed) == 1 and host.closed == 0 and pinned.closed
    np.testing.assert_array_equal(kept, 5)
    del kept
    gc.collect()
    assert len(host.freed) == 2 and host.closed == 1  # in the collection, once closed
    pinned.reap()  # (the loop's late call finds nothing to do)
    assert host.closed == 1 and posted == [pinned.reap]


def test_a_collection_inside_a_free_after_the_close_frees_in_the_same_pass() -> None:
    """A collection may run inside the runtime's free (any allocation can start it): past the
    close, its finalizer re-enters the registry on the same thread (a reentrant lock) and is
    freed in the same pass; the runtime closes once, after the last free."""
    host = FakeHost()
    free_host = host.free_host
    arrays: list[list[np.ndarray[Any, Any]]] = []

    closed_in_a_free: list[int] = []

    def free_collecting(addr: int) -> None:
        arrays[1].clear()  # the other array's last reference, dropped inside this free
        gc.collect()
        free_host(addr)
        closed_in_a_free.append(host.closed)  # the runtime must not close under a free

    host.free_host = free_collecting  # type: ignore[method-assign]
    pinned = PinnedArrays(host, lambda fn: None)  # type: ignore[arg-type]
    arrays += [[pinned.empty((8,), np.dtype(np.uint8))] for _ in range(2)]
    assert pinned.close(host.close) == 2
    done = threading.Event()

    def drop() -> None:  # on another thread, so that a deadlock fails the test
        arrays[0].clear()
        gc.collect()
        done.set()

    threading.Thread(target=drop, daemon=True).start()
    assert done.wait(10), "deadlocked"
    assert len(host.freed) == 2 and host.closed == 1 and closed_in_a_free == [0, 0]
    assert pinned.stats()["pinned_arrays"] == 0


def test_a_close_with_no_array_alive_closes_the_runtime_at_once() -> None:
    pinned, host, _ = _registry()
    assert pinned.close(host.close) == 0
    assert host.closed == 1


def test_structured_and_empty_arrays() -> None:
    pinned, _, _ = _registry()
    kind = np.dtype([("a", "<i4"), ("b", "<f8")])
    record = pinned.empty((3,), kind)
    assert record.dtype == kind and record.nbytes == 3 * kind.itemsize
    record["b"] = 1.5
    assert record["b"].tolist() == [1.5] * 3
    assert pinned.empty((0, 4), np.dtype(np.float32)).size == 0


def test_a_failed_array_frees_its_memory() -> None:
    pinned, host, _ = _registry()
    with pytest.raises(ValueError, match="negative"):
        pinned.empty((-1,), np.dtype(np.float32))  # (the device checks this before)
    assert pinned.stats()["pinned_arrays"] == 0 and len(host.freed) == 1
