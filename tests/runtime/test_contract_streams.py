"""The ``Runtime`` contract for streams, on every backend of ``backends.RUNTIME_FACTORIES``:
handles, synchronize timeouts, destroying a busy or hung stream, stream priorities."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
from backends import ALL_BACKENDS
from helpers import F32, NOT_READY, SYNC_MS, axpy_args

from aio_ascend._errors import (
    BackendUnavailableError,
    EventSyncTimeoutError,
    InvalidHandleError,
    InvalidParamError,
    StreamSyncTimeoutError,
)
from aio_ascend._runtime import Runtime
from aio_ascend._runtime.abi import ACL_EVENT_SYNC

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


def test_stream_handles_are_distinct_and_never_zero(rt: Runtime) -> None:
    streams = [rt.create_stream() for _ in range(5)]
    assert 0 not in streams
    assert len(set(streams)) == 5
    for stream in streams:
        rt.destroy_stream(stream)


def test_timeout_zero_is_rejected(kit: RuntimeKit) -> None:
    event = kit.rt.create_event(ACL_EVENT_SYNC)
    with pytest.raises(InvalidParamError):
        kit.rt.synchronize_stream(kit.stream, 0)
    with pytest.raises(InvalidParamError):
        kit.rt.synchronize_event(event, 0)


def test_synchronize_times_out_on_a_hung_stream(kit: RuntimeKit) -> None:
    rt = kit.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    kit.hang(kit.stream)
    rt.record_event(event, kit.stream)
    with pytest.raises(EventSyncTimeoutError) as event_info:
        rt.synchronize_event(event, 100)
    assert event_info.value.code == 507047
    with pytest.raises(StreamSyncTimeoutError) as stream_info:
        rt.synchronize_stream(kit.stream, 100)
    assert stream_info.value.code == 507046
    assert rt.query_event_status(event) == NOT_READY


def test_destroy_stream_force_discards_a_hung_stream(kit: RuntimeKit) -> None:
    rt = kit.rt
    stuck = kit.new_stream()
    kit.hang(stuck)
    kit.sleep_us(10, stuck)
    rt.destroy_stream_force(stuck)
    with pytest.raises(InvalidHandleError):
        rt.synchronize_stream(stuck, 100)
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    kit.launch("axpy", axpy_args(x, y, 3.0, n))
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 4.0, F32))


def test_destroy_stream_waits_for_queued_work(kit: RuntimeKit) -> None:
    rt = kit.rt
    work = kit.new_stream()
    n = 16
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
    kit.sleep_us(100_000, work)
    kit.launch("axpy", axpy_args(x, y, 5.0, n), work)
    rt.destroy_stream(work)
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 5.0, F32))
    with pytest.raises(InvalidHandleError):
        rt.destroy_stream(work)


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


def test_streams_of_every_priority_in_range_run_work(kit: RuntimeKit) -> None:
    rt = kit.rt
    least, greatest = priority_range(rt)
    ptr = kit.upload(np.zeros(16, np.uint8))
    for value, priority in enumerate(sorted({least, greatest, (least + greatest) // 2})):
        stream = rt.create_stream(priority)
        rt.memset_async(ptr, 16, value + 1, 16, stream)
        rt.synchronize_stream(stream, SYNC_MS)
        np.testing.assert_array_equal(
            kit.download(ptr, 16, np.uint8), np.full(16, value + 1, np.uint8)
        )
        rt.destroy_stream(stream)


def test_a_priority_out_of_range_is_refused(rt: Runtime) -> None:
    rt.set_current_context()
    least, greatest = priority_range(rt)
    for priority in (least + 1, greatest - 1):
        with pytest.raises(InvalidParamError):
            rt.create_stream(priority)
