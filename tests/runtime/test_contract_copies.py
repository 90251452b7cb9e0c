"""The ``Runtime`` contract for copies and memset, on every backend of
``backends.RUNTIME_FACTORIES``: host-device round trips, device-to-device copies at offsets,
``memset_async``, their ordering on a stream and their bounds; on the sim, when a pinned
source is read and how long a pageable copy blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from backends import ALL_BACKENDS
from helpers import D2D, F32, SYNC_MS, in_thread

from aio_ascend._errors import InvalidParamError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from aio_ascend._runtime.hostmem import host_view

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


def test_memcpy_round_trip_pinned(kit: RuntimeKit) -> None:
    rt = kit.rt
    data = np.arange(1000, dtype=np.uint8).tobytes()
    src = kit.pinned(data)
    a, b = rt.malloc(len(data)), rt.malloc(len(data) + 100)
    dst = rt.malloc_host(len(data))
    rt.memcpy_async(a, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
    rt.memcpy_async(b, len(data) + 100, a, len(data), ACL_MEMCPY_DEVICE_TO_DEVICE, kit.stream)
    rt.memcpy_async(dst, len(data), b, len(data), ACL_MEMCPY_DEVICE_TO_HOST, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    assert bytes(host_view(dst, len(data))) == data


def test_memcpy_count_larger_than_dst_max_is_rejected(kit: RuntimeKit) -> None:
    rt = kit.rt
    src = rt.malloc_host(64)
    dst = rt.malloc(64)
    with pytest.raises(InvalidParamError):
        rt.memcpy_async(dst, 32, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
    with pytest.raises(InvalidParamError):
        rt.memcpy_async(dst, 64, src, 64, 99, kit.stream)


@pytest.mark.sim_only
def test_pinned_copy_source_is_read_when_the_copy_executes(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    src = kit.pinned(b"A" * 64)
    dst = rt.malloc(64)
    rt.pause()
    try:
        rt.memcpy_async(dst, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
        host_view(src, 64)[:] = b"B" * 64
    finally:
        rt.resume()
    assert kit.download(dst, 64, np.uint8).tobytes() == b"B" * 64


@pytest.mark.sim_only
def test_pageable_copies_block_until_the_stream_reaches_them(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    n = 256
    src = np.arange(n, dtype=F32)
    dst = np.zeros(n, dtype=F32)
    device = rt.malloc(src.nbytes)

    def copy() -> None:
        rt.set_current_context()
        rt.memcpy_async(
            device, src.nbytes, src.ctypes.data, src.nbytes, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream
        )

    rt.pause()
    try:
        thread, errors, _ = in_thread(copy)
        thread.join(0.2)
        assert thread.is_alive(), "a pageable copy must block while the stream has not reached it"
    finally:
        rt.resume()
    thread.join(SYNC_MS / 1000)
    assert not thread.is_alive()
    assert not errors, errors
    rt.memcpy_async(
        dst.ctypes.data, dst.nbytes, device, dst.nbytes, ACL_MEMCPY_DEVICE_TO_HOST, kit.stream
    )
    np.testing.assert_array_equal(dst, src)  # done when the call returns


def test_a_device_to_device_copy_moves_bytes_at_offsets(kit: RuntimeKit) -> None:
    rt = kit.rt
    source = np.arange(256, dtype=np.uint8)
    src = kit.upload(source)
    dst = kit.upload(np.zeros(256, np.uint8))
    rt.memcpy_async(dst + 64, 256 - 64, src + 16, 100, D2D, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    expected = np.zeros(256, np.uint8)
    expected[64:164] = source[16:116]
    np.testing.assert_array_equal(kit.download(dst, 256, np.uint8), expected)


def test_a_device_to_device_copy_is_ordered_after_a_kernel(kit: RuntimeKit) -> None:
    rt = kit.rt
    n = 64
    x = kit.upload(np.ones(n, np.float32))
    y = kit.upload(np.full(n, 2.0, np.float32))
    z = kit.upload(np.zeros(n, np.float32))
    out = kit.upload(np.zeros(n, np.float32))
    kit.sleep_us(2000)  # the copy must wait for the kernel queued before it
    kit.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
    rt.memcpy_async(out, 4 * n, z, 4 * n, D2D, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(out, n), np.full(n, 3.0, np.float32))


def test_memset_sets_only_its_range(kit: RuntimeKit) -> None:
    rt = kit.rt
    ptr = kit.upload(np.full(200, 7, np.uint8))
    rt.memset_async(ptr + 50, 150, 0xA5, 100, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    expected = np.full(200, 7, np.uint8)
    expected[50:150] = 0xA5
    np.testing.assert_array_equal(kit.download(ptr, 200, np.uint8), expected)


def test_memset_is_ordered_on_its_stream(kit: RuntimeKit) -> None:
    rt = kit.rt
    ptr = kit.upload(np.zeros(64, np.uint8))
    kit.sleep_us(2000)
    rt.memset_async(ptr, 64, 1, 64, kit.stream)
    rt.memset_async(ptr, 64, 2, 32, kit.stream)  # after the first: the front half ends at 2
    rt.synchronize_stream(kit.stream, SYNC_MS)
    expected = np.concatenate([np.full(32, 2, np.uint8), np.full(32, 1, np.uint8)])
    np.testing.assert_array_equal(kit.download(ptr, 64, np.uint8), expected)


def test_memset_beyond_its_max_is_refused(kit: RuntimeKit) -> None:
    ptr = kit.rt.malloc(64)
    with pytest.raises(InvalidParamError):
        kit.rt.memset_async(ptr, 32, 0, 64, kit.stream)
    kit.rt.free(ptr)
