"""``LaunchConfig(timeout_s=/timeout_us=)``: a kernel running past its timeout fails with the
runtime's AI Core timeout (507014, ``AICoreTimeoutError``) instead of running (or hanging) on.

The sim models the attribute as the runtime applies it; the acl C double does too (so the
backend is seen to pass it). Waits are bounded by ``fail_after`` far above the timeouts.
"""

from __future__ import annotations

import anyio
import pytest
from helpers import OpenDevice

import aio_ascend as aa

# CANN 8.0's device-args launch (aclrtLaunchKernel) carries no kernel timeout: deselected there
# (test_acl_devargs.py checks that a launch config is refused on it)
pytestmark = [pytest.mark.anyio, pytest.mark.personas, pytest.mark.needs("launch_config")]


BOUND_S = 30.0  # liveness bound: hundreds of times the timeouts below


async def test_a_hang_kernel_with_a_timeout_fails_with_the_runtimes_timeout_code(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with anyio.fail_after(BOUND_S), pytest.raises(aa.DeviceFaultError) as info:
            await s.run(dev.function("hang"), 1, config=aa.LaunchConfig(timeout_us=20_000))
        assert info.value.code == 507014
        assert type(info.value).__name__ == "AICoreTimeoutError"
        with pytest.raises(aa.DeviceFaultError):
            await s.run(dev.function("noop"), 1)  # a fault is sticky for the device


async def test_a_kernel_within_its_timeout_completes(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with anyio.fail_after(BOUND_S):
            await s.run(
                dev.function("sleep"),
                1,
                aa.HostArgs().u32(1_000),
                config=aa.LaunchConfig(timeout_s=60),
            )
            await s.run(dev.function("noop"), 1, config={"timeout_us": 0})  # 0: forever


async def test_a_slow_kernel_past_its_timeout_faults_as_the_task_that_ran(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        first = await s.launch(dev.function("noop"), 1)
        # its own batch: a fault's batch never completes, so nothing in it is reported done
        with anyio.fail_after(BOUND_S):
            await first
        slow = await s.launch(
            dev.function("sleep"),
            1,
            aa.HostArgs().u32(60_000_000),  # a minute
            config=aa.LaunchConfig(timeout_us=10_000),
        )
        with anyio.fail_after(BOUND_S), pytest.raises(aa.DeviceFaultError) as info:
            await slow
        assert info.value.code == 507014
        assert info.value.__cause__ is None  # the task that timed out got the primary error


def test_the_timeout_of_a_launch_config() -> None:
    assert aa.LaunchConfig(timeout_s=3).kernel_timeout == 3.0
    assert aa.LaunchConfig(timeout_us=1500).kernel_timeout == 0.0015
    assert aa.LaunchConfig(timeout_us=0).kernel_timeout is None
    assert aa.LaunchConfig().kernel_timeout is None
