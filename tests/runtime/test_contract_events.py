"""The ``Runtime`` contract for events, on every backend of ``backends.RUNTIME_FACTORIES``:
record, query, re-record, stream waits on an event and elapsed time between events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from backends import ALL_BACKENDS
from helpers import COMPLETE, F32, NOT_READY, SYNC_MS, axpy_args, scale_args

from aio_ascend._errors import (
    EventSyncTimeoutError,
    InvalidParamError,
    StreamSyncTimeoutError,
)
from aio_ascend._runtime import Runtime
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_EVENT_TIME_LINE,
)

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


def test_never_recorded_ex_event_is_complete(rt: Runtime) -> None:
    for flags in (0, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE):
        event = rt.create_event(flags)
        assert rt.query_event_status(event) == COMPLETE
        rt.synchronize_event(event, 1000)
        rt.destroy_event(event)


def test_recorded_event_is_not_ready_until_the_work_is_done(kit: RuntimeKit) -> None:
    event = kit.rt.create_event(ACL_EVENT_SYNC)
    kit.sleep_us(200_000)
    kit.rt.record_event(event, kit.stream)
    assert kit.rt.query_event_status(event) == NOT_READY
    kit.rt.synchronize_event(event, SYNC_MS)
    assert kit.rt.query_event_status(event) == COMPLETE


def test_re_record_replaces_the_captured_work(kit: RuntimeKit) -> None:
    rt = kit.rt
    busy, idle = kit.stream, kit.new_stream()
    event, marker = rt.create_event(ACL_EVENT_SYNC), rt.create_event(ACL_EVENT_SYNC)
    kit.hang(busy)
    rt.record_event(event, busy)
    rt.record_event(marker, busy)
    assert rt.query_event_status(event) == NOT_READY
    rt.record_event(event, idle)  # now captures the (empty) work of the idle stream
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == COMPLETE
    assert rt.query_event_status(marker) == NOT_READY
    for _ in range(5):  # reusable: every re-record replaces the captured work again
        rt.record_event(event, busy)
        assert rt.query_event_status(event) == NOT_READY
        rt.record_event(event, idle)
        rt.synchronize_event(event, SYNC_MS)
        assert rt.query_event_status(event) == COMPLETE


def test_stale_recording_does_not_complete_a_newer_one(kit: RuntimeKit) -> None:
    rt = kit.rt
    quick, stuck = kit.stream, kit.new_stream()
    event, done = rt.create_event(ACL_EVENT_SYNC), rt.create_event(ACL_EVENT_SYNC)
    kit.sleep_us(100_000, quick)
    rt.record_event(event, quick)  # first recording: finishes after the sleep
    rt.record_event(done, quick)
    kit.hang(stuck)
    rt.record_event(event, stuck)  # second recording: never finishes
    rt.synchronize_event(done, SYNC_MS)  # the first recording has now executed
    assert rt.query_event_status(event) == NOT_READY


def test_stream_wait_event_orders_consumer_after_producer(kit: RuntimeKit) -> None:
    rt = kit.rt
    producer, consumer = kit.stream, kit.new_stream()
    n = 32
    x_host = np.arange(n, dtype=F32)
    x = kit.upload(x_host, producer)
    y = kit.upload(np.zeros(n, F32), consumer)
    ready = rt.create_event(ACL_EVENT_SYNC)
    kit.sleep_us(150_000, producer)
    kit.launch("scale", scale_args(x, x, n, 10.0), producer)  # x *= 10, late
    rt.record_event(ready, producer)
    rt.stream_wait_event(consumer, ready)
    kit.launch("axpy", axpy_args(x, y, 1.0, n), consumer)  # y = x: must see the scaled x
    rt.synchronize_stream(consumer, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n, stream=consumer), x_host * F32(10.0))


def test_stream_wait_event_refers_to_the_recording_at_call_time(kit: RuntimeKit) -> None:
    rt = kit.rt
    stuck, idle, waiter = kit.stream, kit.new_stream(), kit.new_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    kit.hang(stuck)
    rt.record_event(event, stuck)
    rt.stream_wait_event(waiter, event)
    rt.record_event(event, idle)  # a later re-record does not release the earlier wait
    rt.synchronize_event(event, SYNC_MS)
    with pytest.raises(StreamSyncTimeoutError):
        rt.synchronize_stream(waiter, 200)


def test_waiting_on_a_never_recorded_event_does_not_wait(kit: RuntimeKit) -> None:
    rt = kit.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.stream_wait_event(kit.stream, event)
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    kit.launch("axpy", axpy_args(x, y, 1.0, n))
    rt.synchronize_stream(kit.stream, 2000)
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))


def test_elapsed_time_between_time_line_events(kit: RuntimeKit) -> None:
    rt = kit.rt
    start, end = rt.create_event(ACL_EVENT_TIME_LINE), rt.create_event(ACL_EVENT_TIME_LINE)
    rt.record_event(start, kit.stream)
    kit.sleep_us(50_000)
    rt.record_event(end, kit.stream)
    rt.synchronize_event(end, SYNC_MS)
    elapsed = rt.event_elapsed_time(start, end)
    assert 45.0 <= elapsed < 5000.0


def test_elapsed_time_needs_time_line_and_completed_events(kit: RuntimeKit) -> None:
    rt = kit.rt
    plain = rt.create_event(ACL_EVENT_SYNC)
    timed = rt.create_event(ACL_EVENT_TIME_LINE)
    pending = rt.create_event(ACL_EVENT_TIME_LINE)
    rt.record_event(plain, kit.stream)
    rt.record_event(timed, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    with pytest.raises(InvalidParamError):
        rt.event_elapsed_time(plain, timed)
    stuck = kit.new_stream()
    kit.hang(stuck)
    rt.record_event(pending, stuck)
    with pytest.raises(InvalidParamError):
        rt.event_elapsed_time(timed, pending)


@pytest.mark.sim_only
def test_record_event_reads_not_ready_when_the_call_returns(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.pause()
    try:
        rt.record_event(event, kit.stream)
        assert rt.query_event_status(event) == NOT_READY
        with pytest.raises(EventSyncTimeoutError):
            rt.synchronize_event(event, 50)
    finally:
        rt.resume()
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == COMPLETE
