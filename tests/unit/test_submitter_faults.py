"""The submitter's errors when the device faults while it submits: every request it cannot
submit fails with an error caused *directly* by the device's first fault, whichever thread
noted that fault first (the poller may note it between two of the submitter's calls)."""

from __future__ import annotations

import time
from typing import Any

from aio_ascend import HostArgs
from aio_ascend._errors import DeviceFaultError
from aio_ascend._host.pool import HostBuffer
from aio_ascend._sched.batching import Hop, form_batches
from aio_ascend._sched.faults import FaultState
from aio_ascend._sched.lane import Lane
from aio_ascend._sched.submitter import Submitter
from aio_ascend._sched.work import Delivery, Launch, LaunchSpec, Request


class _Released:
    def release(self, requests: Any) -> None:
        pass


class _FaultingRuntime:
    """Refuses every launch with the sticky fault's code; the first refusal races the poller,
    which notes the device's fault (another object) just before the refusal surfaces."""

    def __init__(self, faults: FaultState, poller_fault: DeviceFaultError) -> None:
        self.faults = faults
        self.poller_fault = poller_fault
        self.calls = 0

    def launch_kernel_with_host_args(self, *args: Any) -> None:
        self.calls += 1
        self.faults.note(self.poller_fault)  # the poller got there first
        raise DeviceFaultError("aclrtLaunchKernelWithHostArgs: the device has faulted", code=507015)

    def last_task_id(self) -> int | None:
        return None


def test_every_unsubmitted_request_is_caused_by_the_first_fault() -> None:
    faults = FaultState()
    first = DeviceFaultError("the 'fault' kernel raised ACL error 507015", code=507015)
    runtime = _FaultingRuntime(faults, first)
    posted: list[Delivery] = []
    submitter = Submitter(
        runtime=runtime,  # type: ignore[arg-type]
        device_id=0,
        faults=faults,
        lifetimes=_Released(),  # type: ignore[arg-type]
        batch_events=None,  # type: ignore[arg-type]
        post=lambda deliveries: posted.extend(deliveries),
        stage=None,  # type: ignore[arg-type]
        to_poller=lambda batch: None,
        task_timeout=60.0,
    )
    lane = Lane(1, 100, 200)
    host = HostBuffer(0, 4096, 4096, 64, memoryview(bytearray(64)))
    spec = LaunchSpec(7, 1, None, HostArgs().u64(0).pack(), host)  # 8 bytes of args
    requests: list[Request] = [Launch(lane, spec) for _ in range(4)]
    form_batches(requests, 512)
    submitter._hop(Hop(requests, time.monotonic() + 60))
    assert runtime.calls == 1  # the rest of the stream's hop is not submitted
    assert [req for req, _, _ in posted] == requests
    for _, error, _ in posted:
        assert isinstance(error, DeviceFaultError)
        assert error.__cause__ is first, (error, error.__cause__)
