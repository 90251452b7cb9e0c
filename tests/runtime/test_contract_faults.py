"""The ``Runtime`` contract for device faults, on every backend of
``backends.RUNTIME_FACTORIES``: a fault is sticky for every stream of the runtime, and a new
runtime after it works."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest
from backends import ALL_BACKENDS, REFUSES_ALL_AFTER_FAULT, RUNTIME_FACTORIES
from helpers import F32, SYNC_MS, axpy_args

from aio_ascend._errors import DeviceFaultError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
)

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


@pytest.mark.parametrize("code", [0, 507035])
def test_device_fault_is_sticky_for_every_stream(kit: RuntimeKit, backend: str, code: int) -> None:
    """Every call that submits or observes work fails with the fault's own error, twice over;
    cleanup still works. Where a fault poisons the whole context (CUDA), allocation and capture
    fail the same way; elsewhere ``malloc`` still works."""
    rt = kit.rt
    refuses_all = backend in REFUSES_ALL_AFTER_FAULT
    other = kit.new_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    expected = code or 507015
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    kit.launch("fault", HostArgs().u32(code))
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(kit.stream, SYNC_MS)
    assert info.value.code == expected
    assert rt.get_recent_error_message()
    checks: list[Callable[[], object]] = [
        lambda: rt.query_event_status(event),
        lambda: rt.synchronize_event(event, 1000),
        lambda: rt.synchronize_stream(other, 1000),
        lambda: rt.record_event(event, other),
        lambda: rt.stream_wait_event(other, event),
        lambda: kit.launch("axpy", axpy_args(x, y, 1.0, n), other),
        lambda: rt.memcpy_async(y, 16, x, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, other),
    ]
    if refuses_all:
        checks += [
            lambda: rt.memset_async(y, 16, 0, 16, other),
            lambda: rt.malloc(64),
            lambda: rt.begin_capture(other),
        ]
    for check in checks * 2:  # sticky: the second round fails the same way
        with pytest.raises(DeviceFaultError) as info_again:
            check()
        assert info_again.value.code == expected
        assert info_again.value.message == info.value.message
    # cleanup still works on a faulted device
    rt.free(x)
    rt.destroy_event(event)
    rt.destroy_stream(other)
    if not refuses_all:
        assert rt.malloc(64)


def test_a_new_runtime_after_a_fault_works(
    backend: str, make_kit: Callable[..., RuntimeKit]
) -> None:
    first = RUNTIME_FACTORIES[backend]()
    try:
        d = make_kit(first)
        d.launch("fault", HostArgs().u32(0))
        with pytest.raises(DeviceFaultError):
            first.synchronize_stream(d.stream, SYNC_MS)
    finally:
        first.close()
    second = RUNTIME_FACTORIES[backend]()
    try:
        d = make_kit(second)
        n = 8
        x, y = d.upload(np.ones(n, F32)), d.upload(np.ones(n, F32))
        d.launch("axpy", axpy_args(x, y, 1.0, n))
        np.testing.assert_array_equal(d.download(y, n), np.full(n, 2.0, F32))
    finally:
        second.close()
