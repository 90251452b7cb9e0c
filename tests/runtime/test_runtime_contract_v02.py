"""The v0.2 additions to the ``Runtime`` seam, on every backend of ``backends.RUNTIME_FACTORIES``:
device-to-device copies, ``memset_async``, stream priorities and ``info()``.

Reuses the fixtures and helpers of the main contract suite (``test_runtime_contract``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import test_runtime_contract as contract
from test_runtime_contract import SYNC_MS, Dev

from aio_ascend._errors import BackendUnavailableError, InvalidParamError, RuntimeAPIError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime import Runtime
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from aio_ascend._runtime.hostmem import host_view

D2D = ACL_MEMCPY_DEVICE_TO_DEVICE

# the main contract suite's fixtures, on every backend
backend = contract.backend
rt = contract.rt
dev = contract.dev


def test_a_device_to_device_copy_moves_bytes_at_offsets(dev: Dev) -> None:
    rt = dev.rt
    source = np.arange(256, dtype=np.uint8)
    src = dev.upload(source)
    dst = dev.upload(np.zeros(256, np.uint8))
    rt.memcpy_async(dst + 64, 256 - 64, src + 16, 100, D2D, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    expected = np.zeros(256, np.uint8)
    expected[64:164] = source[16:116]
    np.testing.assert_array_equal(dev.download(dst, 256, np.uint8), expected)


def test_a_device_to_device_copy_is_ordered_after_a_kernel(dev: Dev) -> None:
    rt = dev.rt
    n = 64
    x = dev.upload(np.ones(n, np.float32))
    y = dev.upload(np.full(n, 2.0, np.float32))
    z = dev.upload(np.zeros(n, np.float32))
    out = dev.upload(np.zeros(n, np.float32))
    dev.sleep_us(2000)  # the copy must wait for the kernel queued before it
    dev.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
    rt.memcpy_async(out, 4 * n, z, 4 * n, D2D, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    np.testing.assert_array_equal(dev.download(out, n), np.full(n, 3.0, np.float32))


def test_memset_sets_only_its_range(dev: Dev) -> None:
    rt = dev.rt
    ptr = dev.upload(np.full(200, 7, np.uint8))
    rt.memset_async(ptr + 50, 150, 0xA5, 100, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    expected = np.full(200, 7, np.uint8)
    expected[50:150] = 0xA5
    np.testing.assert_array_equal(dev.download(ptr, 200, np.uint8), expected)


def test_memset_is_ordered_on_its_stream(dev: Dev) -> None:
    rt = dev.rt
    ptr = dev.upload(np.zeros(64, np.uint8))
    dev.sleep_us(2000)
    rt.memset_async(ptr, 64, 1, 64, dev.stream)
    rt.memset_async(ptr, 64, 2, 32, dev.stream)  # after the first: the front half ends at 2
    rt.synchronize_stream(dev.stream, SYNC_MS)
    expected = np.concatenate([np.full(32, 2, np.uint8), np.full(32, 1, np.uint8)])
    np.testing.assert_array_equal(dev.download(ptr, 64, np.uint8), expected)


def test_memset_beyond_its_max_is_refused(dev: Dev) -> None:
    ptr = dev.rt.malloc(64)
    with pytest.raises(InvalidParamError):
        dev.rt.memset_async(ptr, 32, 0, 64, dev.stream)
    dev.rt.free(ptr)


def priority_range(rt: Runtime) -> tuple[int, int]:
    """The runtime's priority range; skips on a release without stream priorities (acl on
    CANN 8.3: no aclrtDeviceGetStreamPriorityRange, which must then be named)."""
    try:
        return rt.stream_priority_range()
    except BackendUnavailableError as exc:
        func = exc.func
    assert func == "aclrtDeviceGetStreamPriorityRange"
    pytest.skip(f"this release has no stream priorities: {func}")


def test_the_priority_range_runs_from_least_to_greatest_urgency(rt: Runtime) -> None:
    rt.set_current_context()
    least, greatest = priority_range(rt)
    assert isinstance(least, int)
    assert isinstance(greatest, int)
    assert greatest <= least  # lower number = more urgent


def test_streams_of_every_priority_in_range_run_work(dev: Dev) -> None:
    rt = dev.rt
    least, greatest = priority_range(rt)
    ptr = dev.upload(np.zeros(16, np.uint8))
    for value, priority in enumerate(sorted({least, greatest, (least + greatest) // 2})):
        stream = rt.create_stream(priority)
        rt.memset_async(ptr, 16, value + 1, 16, stream)
        rt.synchronize_stream(stream, SYNC_MS)
        np.testing.assert_array_equal(
            dev.download(ptr, 16, np.uint8), np.full(16, value + 1, np.uint8)
        )
        rt.destroy_stream(stream)


def test_a_priority_out_of_range_is_refused(rt: Runtime) -> None:
    rt.set_current_context()
    least, greatest = priority_range(rt)
    for priority in (least + 1, greatest - 1):
        with pytest.raises(InvalidParamError):
            rt.create_stream(priority)


def test_info_reports_version_memory_and_priorities(rt: Runtime) -> None:
    rt.set_current_context()
    info = rt.info()
    assert isinstance(info["runtime_version"], str)
    assert info["runtime_version"]
    if info["memory_total"] is None:  # a release without aclrtGetMemInfo (acl before 8.5)
        assert info["memory_free"] is None
        assert info["stream_priority_least"] is info["stream_priority_greatest"] is None
        pytest.skip("this release cannot tell its memory")
    total, free = info["memory_total"], info["memory_free"]
    assert isinstance(total, int)
    assert isinstance(free, int)
    assert 0 < free <= total
    least, greatest = rt.stream_priority_range()
    assert (info["stream_priority_least"], info["stream_priority_greatest"]) == (least, greatest)


def test_free_memory_shrinks_with_an_allocation(rt: Runtime) -> None:
    rt.set_current_context()
    before = rt.info()["memory_free"]
    if before is None:
        pytest.skip("this release cannot tell its memory (no aclrtGetMemInfo)")
    ptr = rt.malloc(64 << 20)
    after = rt.info()["memory_free"]
    rt.free(ptr)
    assert isinstance(before, int)
    assert isinstance(after, int)
    assert after <= before - (64 << 20)


# --- graphs (stream capture and replay) --------------------------------------------------------


@pytest.fixture
def graph_dev(dev: Dev, backend: str) -> Dev:
    """``dev`` on a backend whose runtime capture is bound (the acl personas 8.3 on export
    model-RI capture; CANN 8.0 has none: ``test_8_0_has_no_capture`` in test_acl_devargs.py)."""
    if backend == "acl-8.0":
        pytest.skip("CANN 8.0 exports no model-RI capture (aclmdlRI*)")
    return dev


def _axpy_args(x: int, y: int, a: float, n: int) -> HostArgs:
    return HostArgs().ptr(x).ptr(y).f32(a).u32(n)


def test_captured_work_runs_only_when_replayed(graph_dev: Dev) -> None:
    dev = graph_dev
    rt = dev.rt
    n = 32
    x = dev.upload(np.ones(n, np.float32))
    y = dev.upload(np.zeros(n, np.float32))
    rt.begin_capture(dev.stream)
    dev.launch("axpy", _axpy_args(x, y, 2.0, n))
    rt.memset_async(x, 4 * n, 0, 4, dev.stream)  # x[0] = 0 on every replay
    graph = rt.end_capture(dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    np.testing.assert_array_equal(dev.download(y, n), np.zeros(n, np.float32))
    other = dev.new_stream()
    rt.launch_graph(graph, other)
    rt.launch_graph(graph, other)
    rt.synchronize_stream(other, SYNC_MS)
    expected = np.full(n, 4.0, np.float32)
    expected[0] = 2.0  # the second replay's axpy saw x[0] == 0
    np.testing.assert_array_equal(dev.download(y, n), expected)
    rt.destroy_graph(graph)


def test_a_captured_copy_reads_its_pinned_source_at_each_replay(graph_dev: Dev) -> None:
    dev = graph_dev
    rt = dev.rt
    buf = rt.malloc(16)
    src = dev.pinned(bytes(range(16)))
    rt.begin_capture(dev.stream)
    rt.memcpy_async(buf, 16, src, 16, ACL_MEMCPY_HOST_TO_DEVICE, dev.stream)
    graph = rt.end_capture(dev.stream)
    rt.launch_graph(graph, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    assert dev.download(buf, 16, np.uint8).tolist() == list(range(16))
    host_view(src, 16)[:] = bytes(16)
    rt.launch_graph(graph, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    assert dev.download(buf, 16, np.uint8).tolist() == [0] * 16
    rt.destroy_graph(graph)


def test_a_capturing_stream_refuses_records_waits_and_syncs(graph_dev: Dev) -> None:
    dev = graph_dev
    rt = dev.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.begin_capture(dev.stream)
    with pytest.raises(InvalidParamError):
        rt.record_event(event, dev.stream)
    with pytest.raises(InvalidParamError):
        rt.stream_wait_event(dev.stream, event)
    with pytest.raises(InvalidParamError):
        rt.synchronize_stream(dev.stream, SYNC_MS)
    with pytest.raises(InvalidParamError):
        rt.begin_capture(dev.stream)
    rt.destroy_graph(rt.end_capture(dev.stream))
    with pytest.raises(InvalidParamError):
        rt.end_capture(dev.stream)  # not capturing any more
    rt.record_event(event, dev.stream)  # usable again
    rt.synchronize_event(event, SYNC_MS)
    rt.destroy_event(event)


def test_a_destroyed_graph_cannot_be_replayed(graph_dev: Dev) -> None:
    dev = graph_dev
    rt = dev.rt
    rt.begin_capture(dev.stream)
    dev.launch("noop", HostArgs())
    graph = rt.end_capture(dev.stream)
    rt.destroy_graph(graph)
    with pytest.raises(RuntimeAPIError):
        rt.launch_graph(graph, dev.stream)


# --- the calling thread's current context (bind, call, give back) -------------------------------


def test_the_current_context_is_read_and_given_back(backend: str) -> None:
    first = contract._open(backend)
    try:
        assert first.get_current_context() == first.context
        second = contract._open(backend)  # binds its own context to this thread
        try:
            assert first.get_current_context() == second.context
            first.set_current_context()
            assert second.get_current_context() == first.context
            first.malloc(64)
            first.set_current_context(second.context)  # give the thread back the other one
            assert first.get_current_context() == second.context
            second.free(second.malloc(64))
        finally:
            second.close()
        first.set_current_context()
        seen: list[object] = []
        thread = threading.Thread(target=lambda: seen.append(first.get_current_context()))
        thread.start()
        thread.join()
        assert seen == [None]  # a new thread has no context
    finally:
        first.close()


def test_a_context_can_be_given_back_after_close(backend: str) -> None:
    first = contract._open(backend)
    second = contract._open(backend)
    try:
        first.set_current_context()
        first.close()
        first.set_current_context(second.context)
        assert second.get_current_context() == second.context
    finally:
        first.close()
        second.close()
