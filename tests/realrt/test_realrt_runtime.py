"""The acl backend over the real CANN runtime (built from source) over our fake driver.

Each test opens ``open_acl_runtime(0, library_path=<fixture>/libacl_rt.so)``: the runtime's own
``aclrt*`` implementation, its streams, tasks, events and memory management, down to the driver
calls our ``tests/realrt/fakehal`` answers. Skipped (one reason) until ``tests/realrt/build.sh``
has built the fixture.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from realrt.fixture import FakeHal, fakehal, open_realrt_runtime, realrt_library, stream_id

from aio_ascend._errors import (
    DeviceFaultError,
    EventSyncTimeoutError,
    RuntimeAPIError,
    StreamSyncTimeoutError,
)
from aio_ascend._runtime.abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_EVENT_SYNC,
    ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_STOP_ON_FAILURE,
)
from aio_ascend._runtime.hostmem import host_view

pytestmark = pytest.mark.realrt

SYNC_MS = 10_000
#: ACL_ERROR_RT_TS_ERROR (rt_error_codes.h:93): a task the device reported failed
ACL_ERROR_RT_TS_ERROR = 507001


@pytest.fixture
def rt() -> Iterator[Any]:
    runtime = open_realrt_runtime()
    try:
        yield runtime
    finally:
        runtime.close()
        fakehal().reset()


@pytest.fixture
def hal(rt: Any) -> FakeHal:
    return fakehal()


def pinned(rt: Any, data: bytes) -> int:
    addr: int = rt.malloc_host(len(data))
    host_view(addr, len(data))[:] = data
    return addr


def upload(rt: Any, stream: int, data: bytes) -> int:
    ptr: int = rt.malloc(len(data))
    src = pinned(rt, data)
    rt.memcpy_async(ptr, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    rt.free_host(src)
    return ptr


def download(rt: Any, stream: int, ptr: int, size: int) -> bytes:
    dst = rt.malloc_host(size)
    rt.memcpy_async(dst, size, ptr, size, ACL_MEMCPY_DEVICE_TO_HOST, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    out = bytes(host_view(dst, size))
    rt.free_host(dst)
    return out


def _wait_for(condition: Callable[[], object], seconds: float) -> None:
    """Poll ``condition`` every 10 ms until it holds or ``seconds`` have passed (the caller
    asserts what it needs afterwards)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


# --- the library in use is the source build ------------------------------------------------


def test_the_library_is_the_runtime_built_from_source() -> None:
    """The runtime's own symbols are exported and it answers as the 910B1 our driver plays."""
    library = ctypes.CDLL(str(realrt_library()))
    assert hasattr(library, "rtSetSocVersion")
    assert hasattr(library, "rtGetSocVersion")
    runtime = open_realrt_runtime()
    try:
        assert runtime.info()["soc_name"] == "Ascend910B1"
    finally:
        runtime.close()


def test_device_count_is_the_drivers(rt: Any) -> None:
    count = ctypes.c_uint32()
    rt._fn["aclrtGetDeviceCount"](ctypes.byref(count))
    assert count.value == 1


# --- streams ---------------------------------------------------------------------------------


def test_streams_are_distinct_and_each_gets_a_queue(rt: Any, hal: FakeHal) -> None:
    before = hal.live_queues()
    streams = [rt.create_stream() for _ in range(4)]
    assert len(set(streams)) == 4 and 0 not in streams
    assert hal.live_queues() >= before + 4
    for stream in streams:
        rt.destroy_stream(stream)
    assert hal.live_queues() == before


def test_synchronize_an_empty_stream(rt: Any) -> None:
    stream = rt.create_stream()
    rt.synchronize_stream(stream, SYNC_MS)
    rt.destroy_stream(stream)


def test_synchronize_times_out_while_the_device_is_busy(rt: Any, hal: FakeHal) -> None:
    stream = rt.create_stream()
    ptr = rt.malloc(64)
    hal.hold(stream)
    try:
        rt.memset_async(ptr, 64, 1, 64, stream)
        with pytest.raises(StreamSyncTimeoutError):
            rt.synchronize_stream(stream, 50)
    finally:
        hal.hold(stream, held=False)
    rt.synchronize_stream(stream, SYNC_MS)
    rt.destroy_stream(stream)
    rt.free(ptr)


# --- memory ----------------------------------------------------------------------------------


def test_device_allocations_are_distinct_and_counted(rt: Any, hal: FakeHal) -> None:
    before = hal.device_bytes()
    ptrs = [rt.malloc(1000) for _ in range(8)]
    assert len(set(ptrs)) == 8
    assert hal.device_bytes() >= before + 8 * 1000
    for ptr in ptrs:
        rt.free(ptr)
    assert hal.device_bytes() == before


@pytest.mark.parametrize("size", [1, 4096, 1 << 20])
def test_copies_round_trip(rt: Any, size: int) -> None:
    stream = rt.create_stream()
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    ptr = upload(rt, stream, data)
    assert download(rt, stream, ptr, size) == data
    rt.free(ptr)
    rt.destroy_stream(stream)


def test_device_to_device_copy(rt: Any) -> None:
    stream = rt.create_stream()
    data = bytes(range(256)) * 16
    src = upload(rt, stream, data)
    dst = rt.malloc(len(data))
    rt.memcpy_async(dst, len(data), src, len(data), ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    assert download(rt, stream, dst, len(data)) == data
    rt.free(src)
    rt.free(dst)
    rt.destroy_stream(stream)


@pytest.mark.parametrize("value", [0, 0x5A, 0xFF])
def test_memset_sets_every_byte(rt: Any, value: int) -> None:
    stream = rt.create_stream()
    ptr = upload(rt, stream, b"\x01" * 4096)
    rt.memset_async(ptr, 4096, value, 4096, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    assert download(rt, stream, ptr, 4096) == bytes([value]) * 4096
    rt.free(ptr)
    rt.destroy_stream(stream)


def test_pinned_host_memory_is_usable_and_freed(rt: Any) -> None:
    addr = rt.malloc_host(8192)
    view = host_view(addr, 8192)
    view[:] = b"\x07" * 8192
    assert bytes(view[:4]) == b"\x07" * 4
    rt.free_host(addr)


def test_copies_on_one_stream_run_in_order(rt: Any) -> None:
    stream = rt.create_stream()
    ptr = rt.malloc(1024)
    sources = [pinned(rt, bytes([i]) * 1024) for i in range(1, 9)]
    for src in sources:
        rt.memcpy_async(ptr, 1024, src, 1024, ACL_MEMCPY_HOST_TO_DEVICE, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    assert download(rt, stream, ptr, 1024) == bytes([8]) * 1024
    for src in sources:
        rt.free_host(src)
    rt.free(ptr)
    rt.destroy_stream(stream)


# --- events ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE])
def test_record_then_synchronize_and_query(rt: Any, flags: int) -> None:
    stream = rt.create_stream()
    event = rt.create_event(flags)
    rt.record_event(event, stream)
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == ACL_EVENT_RECORDED_STATUS_COMPLETE
    rt.destroy_event(event)
    rt.destroy_stream(stream)


def test_event_is_not_ready_while_the_device_is_busy(rt: Any, hal: FakeHal) -> None:
    stream = rt.create_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    ptr = rt.malloc(64)
    hal.hold(stream)
    try:
        rt.memset_async(ptr, 64, 0, 64, stream)
        rt.record_event(event, stream)
        assert rt.query_event_status(event) == ACL_EVENT_RECORDED_STATUS_NOT_READY
        with pytest.raises(EventSyncTimeoutError):
            rt.synchronize_event(event, 50)
    finally:
        hal.hold(stream, held=False)
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == ACL_EVENT_RECORDED_STATUS_COMPLETE
    rt.destroy_event(event)
    rt.destroy_stream(stream)
    rt.free(ptr)


def test_stream_wait_event_orders_two_streams(rt: Any, hal: FakeHal) -> None:
    producer, consumer = rt.create_stream(), rt.create_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    a = upload(rt, producer, b"\x00" * 256)
    b = rt.malloc(256)
    src = pinned(rt, b"\x33" * 256)
    hal.set_delay_us(20_000)
    rt.memcpy_async(a, 256, src, 256, ACL_MEMCPY_HOST_TO_DEVICE, producer)
    rt.record_event(event, producer)
    rt.stream_wait_event(consumer, event)
    rt.memcpy_async(b, 256, a, 256, ACL_MEMCPY_DEVICE_TO_DEVICE, consumer)
    rt.synchronize_stream(consumer, SYNC_MS)
    hal.set_delay_us(0)
    assert download(rt, consumer, b, 256) == b"\x33" * 256
    for stream in (producer, consumer):
        rt.destroy_stream(stream)
    rt.destroy_event(event)
    rt.free(a)
    rt.free(b)
    rt.free_host(src)


def test_elapsed_time_between_time_line_events(rt: Any, hal: FakeHal) -> None:
    """The runtime reads a CQE's timestamp in the chip's timestamp ticks (50 MHz on a 910B,
    event.cc:1272-1276): our driver stamped nanoseconds, and a 40 ms interval read as 800."""
    stream = rt.create_stream()
    start, end = rt.create_event(ACL_EVENT_TIME_LINE), rt.create_event(ACL_EVENT_TIME_LINE)
    ptr = rt.malloc(64)
    hal.set_delay_us(20_000)  # every SQE: the start's record, the memset, the end's record
    try:
        rt.record_event(start, stream)
        rt.memset_async(ptr, 64, 0, 64, stream)
        rt.record_event(end, stream)
        rt.synchronize_stream(stream, SYNC_MS)
    finally:
        hal.set_delay_us(0)
    # two SQEs of 20 ms between the two completions; at most 10x that on a busy machine
    assert 35.0 <= rt.event_elapsed_time(start, end) <= 400.0
    for event in (start, end):
        rt.destroy_event(event)
    rt.free(ptr)
    rt.destroy_stream(stream)


# --- faults ----------------------------------------------------------------------------------


def test_an_error_completion_fails_the_synchronize_then_the_stream_runs_on(
    rt: Any, hal: FakeHal
) -> None:
    """A copy SQE whose CQE carries STARS error bits: the runtime reads the CQE (our driver
    says one waits, halSqCqQuery SQ_CQE_STATUS), maps it to TS_ERROR_SDMA_ERROR
    (memory_memcpy_async_task.cc:730-741) and reports ACL_ERROR_RT_TS_ERROR
    (errcode_manage.cc:477) from the synchronize; the next copy on the stream succeeds."""
    stream = rt.create_stream()
    ptr = upload(rt, stream, b"\x00" * 64)
    src = pinned(rt, b"\x11" * 64)
    # A synchronize may return by the SQ head before it reads the copy's CQE; read late,
    # together with the error CQE, it hid the error in ~1 of 10 runs of this file (not yet
    # understood). A second synchronize reads it (our driver says a CQE waits); in a full
    # `-m realrt` run (the kernel tests before it) it took more than one now and then: a few
    # more, bounded (a liveness bound: a 5 s one failed a CI run when our driver wrote no
    # error ringbuffer and the runtime's recycle thread polled it for ~6 s a call after an
    # earlier test's kernel fault, reading no CQE meanwhile: device_error_proc.cc:655-657).
    deadline = time.monotonic() + 30.0
    rt.synchronize_stream(stream, SYNC_MS)
    while hal.unread_completions(stream) and time.monotonic() < deadline:
        time.sleep(0.01)
        rt.synchronize_stream(stream, SYNC_MS)
    assert hal.unread_completions(stream) == 0
    hal.fail_next(stream, error_type=1, error_code=1)
    rt.memcpy_async(ptr, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream)
    with pytest.raises(RuntimeAPIError) as caught:
        rt.synchronize_stream(stream, SYNC_MS)
    assert caught.value.code == ACL_ERROR_RT_TS_ERROR
    assert not isinstance(caught.value, (StreamSyncTimeoutError, DeviceFaultError))
    rt.memcpy_async(ptr, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream)
    rt.synchronize_stream(stream, SYNC_MS)
    assert download(rt, stream, ptr, 64) == b"\x11" * 64
    rt.free_host(src)
    rt.free(ptr)
    rt.destroy_stream(stream)


def test_a_stream_that_stops_on_failure_stays_stopped_after_an_error_completion(
    rt: Any, hal: FakeHal
) -> None:
    """In stop-on-failure mode the runtime handles a failed SQE's error CQE, moves the queue's
    head past it and leaves the queue stopped (no ``EnableSq`` in abort-on-failure mode:
    stars_engine.cc:1502-1514): the copy queued behind the failed one never runs. A stream in
    the default mode runs on (the test above): the driver resumes a queue only where the
    runtime says so (``halSqCqConfig``), not when the error CQE is read."""
    stream = rt.create_stream()
    rt.set_stream_failure_mode(stream, ACL_STOP_ON_FAILURE)
    ptr = upload(rt, stream, b"\x00" * 64)
    src = pinned(rt, b"\x22" * 64)
    hal.fail_next(stream)
    hal.hold(stream)  # (both queued before the first fails: then the context refuses new work)
    rt.memcpy_async(ptr, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream)  # fails
    rt.memcpy_async(ptr, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream)  # behind it
    hal.hold(stream, held=False)
    with pytest.raises(RuntimeAPIError):
        rt.synchronize_stream(stream, 2_000)
    _wait_for(lambda: not hal.unread_completions(stream), 30.0)  # the runtime read the error
    assert hal.unread_completions(stream) == 0
    time.sleep(0.5)  # (a resumed queue runs a 64-byte copy in microseconds)
    assert ctypes.string_at(ptr, 64) == b"\x00" * 64  # device memory is host memory here
    rt.destroy_stream_force(stream)
    rt.free_host(src)
    rt.free(ptr)


# --- close -----------------------------------------------------------------------------------


def _stuck_stream(rt: Any, hal: FakeHal, ptr: int) -> int:
    """A new stream whose memset of ``ptr`` the driver holds (a hung task): its synchronize
    times out."""
    stream: int = rt.create_stream()
    hal.hold(stream)
    rt.memset_async(ptr, 64, 1, 64, stream)
    with pytest.raises(StreamSyncTimeoutError):
        rt.synchronize_stream(stream, 50)
    return stream


def test_force_destroy_a_stream_whose_work_is_stuck(rt: Any, hal: FakeHal) -> None:
    """aclrtDestroyStreamForce returns while the stream's SQE never runs, and frees its queue
    (our driver stops the queue's worker in halSqCqFree)."""
    before = hal.live_queues()
    ptr = rt.malloc(64)
    stream = _stuck_stream(rt, hal, ptr)
    rt.destroy_stream_force(stream)
    # the runtime may free the queue after the call returns (seen once in ~6 runs)
    _wait_for(lambda: hal.live_queues() <= before, 5.0)
    assert hal.live_queues() == before
    rt.free(ptr)


def test_a_hold_ends_with_its_stream_when_the_runtime_reuses_its_id(rt: Any, hal: FakeHal) -> None:
    """The runtime gives a destroyed stream's id to its next stream; the driver's hold (a
    test's hung kernel) was on the old stream only, so the new one runs. Kept by id, the hold
    once hung the runtime's own temporary stream (its timeout snapshot) for good."""
    ptr = rt.malloc(64)
    held = _stuck_stream(rt, hal, ptr)
    held_id = stream_id(held)
    rt.destroy_stream_force(held)
    # The driver hands out the lowest free id, and the runtime may give the held stream's back
    # a moment after the call returns: streams made meanwhile take other ids (kept till the end)
    others = []
    fresh = rt.create_stream()
    deadline = time.monotonic() + 5.0
    while stream_id(fresh) != held_id and time.monotonic() < deadline:
        others.append(fresh)
        time.sleep(0.05)
        fresh = rt.create_stream()
    assert stream_id(fresh) == held_id  # (the reuse this is about)
    rt.memset_async(ptr, 64, 2, 64, fresh)
    rt.synchronize_stream(fresh, SYNC_MS)
    assert ctypes.string_at(ptr, 64) == b"\x02" * 64  # device memory is host memory here
    for stream in (fresh, *others):
        rt.destroy_stream(stream)
    rt.free(ptr)


def test_reopen_after_close(hal: FakeHal) -> None:
    for _ in range(3):
        runtime = open_realrt_runtime()
        stream = runtime.create_stream()
        runtime.synchronize_stream(stream, SYNC_MS)
        runtime.destroy_stream(stream)
        runtime.close()
    assert hal.live_queues() >= 0
