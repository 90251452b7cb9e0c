"""The ``Runtime`` contract for graphs (stream capture and replay), on every backend of
``backends.RUNTIME_FACTORIES`` that can capture: captured work runs only when replayed, a
captured copy reads its pinned source at each replay, a capturing stream refuses what cannot be
captured, a destroyed graph cannot be replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
from backends import ALL_BACKENDS
from helpers import SYNC_MS, axpy_args

from aio_ascend._errors import (
    InvalidParamError,
    RuntimeAPIError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from aio_ascend._runtime.hostmem import host_view

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS

# every test here captures: deselected on a backend without capture (acl-8.0)
pytestmark = pytest.mark.needs("capture")


def test_captured_work_runs_only_when_replayed(kit: RuntimeKit) -> None:
    rt = kit.rt
    n = 32
    x = kit.upload(np.ones(n, np.float32))
    y = kit.upload(np.zeros(n, np.float32))
    rt.begin_capture(kit.stream)
    kit.launch("axpy", axpy_args(x, y, 2.0, n))
    rt.memset_async(x, 4 * n, 0, 4, kit.stream)  # x[0] = 0 on every replay
    graph = rt.end_capture(kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n), np.zeros(n, np.float32))
    other = kit.new_stream()
    rt.launch_graph(graph, other)
    rt.launch_graph(graph, other)
    rt.synchronize_stream(other, SYNC_MS)
    expected = np.full(n, 4.0, np.float32)
    expected[0] = 2.0  # the second replay's axpy saw x[0] == 0
    np.testing.assert_array_equal(kit.download(y, n), expected)
    rt.destroy_graph(graph)


def test_a_captured_copy_reads_its_pinned_source_at_each_replay(kit: RuntimeKit) -> None:
    rt = kit.rt
    buf = rt.malloc(16)
    src = kit.pinned(bytes(range(16)))
    rt.begin_capture(kit.stream)
    rt.memcpy_async(buf, 16, src, 16, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
    graph = rt.end_capture(kit.stream)
    rt.launch_graph(graph, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    assert kit.download(buf, 16, np.uint8).tolist() == list(range(16))
    host_view(src, 16)[:] = bytes(16)
    rt.launch_graph(graph, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    assert kit.download(buf, 16, np.uint8).tolist() == [0] * 16
    rt.destroy_graph(graph)


def test_a_capturing_stream_refuses_records_waits_and_syncs(kit: RuntimeKit) -> None:
    rt = kit.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.begin_capture(kit.stream)
    with pytest.raises(InvalidParamError):
        rt.record_event(event, kit.stream)
    with pytest.raises(InvalidParamError):
        rt.stream_wait_event(kit.stream, event)
    with pytest.raises(InvalidParamError):
        rt.synchronize_stream(kit.stream, SYNC_MS)
    with pytest.raises(InvalidParamError):
        rt.begin_capture(kit.stream)
    rt.destroy_graph(rt.end_capture(kit.stream))
    with pytest.raises(InvalidParamError):
        rt.end_capture(kit.stream)  # not capturing any more
    rt.record_event(event, kit.stream)  # usable again
    rt.synchronize_event(event, SYNC_MS)
    rt.destroy_event(event)


def test_a_destroyed_graph_cannot_be_replayed(kit: RuntimeKit) -> None:
    rt = kit.rt
    rt.begin_capture(kit.stream)
    kit.launch("noop", HostArgs())
    graph = rt.end_capture(kit.stream)
    rt.destroy_graph(graph)
    with pytest.raises(RuntimeAPIError):
        rt.launch_graph(graph, kit.stream)
