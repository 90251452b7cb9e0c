"""A failed task that event queries cannot see: the poller probes the stream.

On the real runtime (STARS chips) a failed task stops its stream, but only a stream
synchronize reads the error: the event recorded after it reads NOT_READY for ever (see
``aio_ascend/_sched/stalls.py``; ``tests/realrt/test_realrt_scheduler.py`` shows it on the
real runtime's code). The sim's ``unread_faults`` option models that. Without the probe each
test below would wait for the task timeout; the bounds are far below it and far above the
probe's first wait (0.05 s).
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._errors import EventSyncTimeoutError, StreamSyncTimeoutError
from aio_ascend._runtime.abi import ACL_EVENT_RECORDED_STATUS_NOT_READY
from aio_ascend._runtime.hostmem import host_view
from aio_ascend._runtime.sim.runtime import open_sim_runtime
from aio_ascend.testing import assert_no_leaks

TASK_TIMEOUT_S = 120.0  # what the tests would wait for without the probe
BOUND_S = 20.0  # liveness bound: hundreds of times the probe's first wait


@asynccontextmanager
async def _open(backend: str) -> AsyncIterator[aa.Device]:
    """The device on ``backend`` with unread faults: the sim's runtime option, the acl C
    double's control (``g_unread_faults`` in its source)."""
    if backend == "sim":
        async with aa.open_device(
            0, backend="sim", runtime_options={"unread_faults": True}, task_timeout=TASK_TIMEOUT_S
        ) as dev:
            yield dev
        return
    from doubles.acl_double import double_control

    control = double_control()
    control.set_unread_faults(True)
    try:
        async with open_backend("acl", task_timeout=TASK_TIMEOUT_S) as dev:
            yield dev
    finally:
        control.set_unread_faults(False)


def test_the_sim_hides_an_unread_fault_from_event_queries() -> None:
    rt = open_sim_runtime(0, unread_faults=True)
    try:
        stream = rt.create_stream()
        fault = rt.get_function(rt.load_binary(None), "fault")
        args = rt.malloc_host(8)
        host_view(args, 4)[:] = struct.pack("<I", 507015)
        rt.launch_kernel_with_host_args(fault, 1, stream, None, args, 8, 0, 0)
        event = rt.create_event(0)
        rt.record_event(event, stream)
        time.sleep(0.05)  # the device thread has run (and failed) the kernel by now
        # unread: the event never completes, its synchronize times out, other calls work
        assert rt.query_event_status(event) == ACL_EVENT_RECORDED_STATUS_NOT_READY
        with pytest.raises(EventSyncTimeoutError):
            rt.synchronize_event(event, 20)
        rt.synchronize_stream(rt.create_stream(), 1000)  # an idle stream: done
        with pytest.raises(aa.DeviceFaultError) as caught:  # the stream's synchronize reads it
            rt.synchronize_stream(stream, 1000)
        assert caught.value.code == 507015
        with pytest.raises(aa.DeviceFaultError):  # read: every call sees it from then on
            rt.query_event_status(event)
    finally:
        rt.close()


@pytest.mark.anyio
async def test_a_failed_launch_fails_its_task_without_waiting_for_the_timeout(
    device_backend: str,
) -> None:
    async with _open(device_backend) as dev:
        s = dev.stream()
        with anyio.fail_after(BOUND_S):
            await s.run(dev.function("noop"), 1)  # the stream worked before
        bad = await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
        after = await s.launch(dev.function("noop"), 1)
        with anyio.fail_after(BOUND_S):
            with pytest.raises(aa.DeviceFaultError) as caught:
                await bad
            assert caught.value.code == 507015
            with pytest.raises(aa.DeviceFaultError):
                await after
        with pytest.raises(aa.DeviceFaultError):  # sticky, as a fault seen by a query is
            await s.launch(dev.function("noop"), 1)
    assert_no_leaks(dev)


@pytest.mark.anyio
async def test_a_stream_synchronize_behind_a_failed_task_ends(device_backend: str) -> None:
    async with _open(device_backend) as dev:
        s, other = dev.stream(), dev.stream()
        await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
        with anyio.fail_after(BOUND_S), pytest.raises(aa.DeviceFaultError):
            await s.synchronize()
        with anyio.fail_after(BOUND_S), pytest.raises(aa.DeviceFaultError):
            await other.synchronize()  # the device's fault: every stream sees it
    assert_no_leaks(dev)


@pytest.mark.anyio
async def test_a_long_kernel_is_probed_but_not_failed(device_backend: str) -> None:
    async with _open(device_backend) as dev:
        s = dev.stream()
        with anyio.fail_after(BOUND_S):
            # 0.4 s: several probes (0.05 s, then 0.1, 0.2 ...), each answered "still running"
            await s.run(dev.function("sleep"), 1, aa.HostArgs().u32(400_000))
            await s.run(dev.function("noop"), 1)
    assert_no_leaks(dev)


def test_a_host_thread_in_a_synchronize_does_not_take_the_devices_wake_up() -> None:
    """The sim's device thread and host threads in a synchronize wait on one condition; a
    submission woke only one of them (``notify``), so a waiting host thread could take the
    device's wake-up and leave a new launch unrun for up to WAIT_SLICE_S (0.5 s): the poller's
    stream probe made that frequent (the model test's 0.3 s task timeout fired)."""
    rt = open_sim_runtime(0)
    try:
        binary = rt.load_binary(None)
        hang, noop = rt.get_function(binary, "hang"), rt.get_function(binary, "noop")
        held, other = rt.create_stream(), rt.create_stream()
        args = rt.malloc_host(8)
        rt.launch_kernel_with_host_args(hang, 1, held, None, args, 8, 0, 0)
        time.sleep(0.05)  # the device ran it and is idle now (nothing else to run)

        def wait_on_held() -> None:
            rt.set_current_context()
            with contextlib.suppress(StreamSyncTimeoutError):
                rt.synchronize_stream(held, 1500)

        waiters = [threading.Thread(target=wait_on_held) for _ in range(3)]
        for thread in waiters:
            thread.start()
        # the device's idle wait (0.5 s slices, begun at ~0 s) ran out at ~0.5 s and began
        # again behind the waiters (slices begun at ~0.05 s, next at ~0.55 s): launch then
        time.sleep(0.475)
        event = rt.create_event(0)
        start = time.perf_counter()
        rt.launch_kernel_with_host_args(noop, 1, other, None, args, 8, 0, 0)
        rt.record_event(event, other)
        rt.synchronize_event(event, 5000)
        took = time.perf_counter() - start
        for thread in waiters:
            thread.join()
        assert took < 0.25, f"the noop ran {took:.3f} s after its launch"
    finally:
        rt.close()
