"""Reliability: device faults, hung kernels and the watchdog.

The fault matrix runs many trials, each on a fresh device: a random multi-stream workload
(``axpy`` into unique slots, short ``sleep`` stalls, device-to-host copies, cross-stream event
dependencies, sometimes a ``hang``) with exactly one device fault injected at a random position
(the ``fault`` kernel with a random 507xxx code, ``vector_add`` on a bad raw address, or a user
kernel whose body raises). Per trial:

* the fault surfaces (``dev.fault`` is a ``DeviceFaultError``) and the faulting task fails with it;
* no task reports success with a wrong result (slots read back from the sim's memory, copies
  checked against what was written before them on the device);
* every task that fails, and every launch refused after the fault, fails with the first fault
  itself or with it as ``__cause__``; nothing queued behind the fault on its stream succeeds;
* nothing hangs (every trial is bounded), ``aclose()`` works and leaves nothing behind, and the
  next trial's open (a reopen of device 0) works.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pytest
from reliability_helpers import (
    assert_sim_clean,
    fault_caused,
    live_resources,
    open_tracked,
    report,
    scaled,
    sim_leak_check,  # noqa: F401 - fixture
    sim_peek,
    stress_timeout,
    tracked_device,
)

import aio_ascend as aa

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("sim_leak_check")]

SLOT = 8
BAD_ADDRESS = 0xDEAD0000
#: codes for the ``fault`` kernel: 0 (-> 507015), registered 507xxx codes, and codes the library
#: has no class for (an unknown 507xxx, a non-507 code): all must surface as the device fault
FAULT_CODES = (0, 507015, 507011, 507035, 507014, 507899, 12345)

_raising = aa.sim.KernelLibrary("raising")


@_raising.kernel("divide_by_zero")
def _divide_by_zero(ctx: Any) -> None:
    raise ZeroDivisionError(f"kernel body bug ({ctx.u32(0)})")


@dataclass
class Op:
    kind: str
    stream: int
    index: int
    awaitable: Any = None  # Task or Event
    refused: BaseException | None = None  # raised by the launch/copy call itself
    slot: int = -1
    expected: float = 0.0
    host: np.ndarray[Any, Any] | None = None
    outcome: BaseException | None = None
    succeeded: bool = False


@dataclass
class Totals:
    trials: int = 0
    faults_surfaced: int = 0
    fault_kinds: dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    succeeded: int = 0
    failed: int = 0
    refused_after_fault: int = 0
    succeeded_but_wrong: int = 0
    failures_not_caused_by_first_fault: int = 0
    successes_behind_fault_on_its_stream: int = 0
    faulting_task_not_failed_with_fault: int = 0
    hangs: int = 0
    closes_ok: int = 0
    user_events_left_at_close: int = 0
    hung_kernels_in_trials: int = 0
    close_seconds_max: float = 0.0
    trial_seconds_max: float = 0.0


async def _fault_trial(seed: int, totals: Totals) -> None:
    rng = random.Random(seed)
    completion = rng.choice(("poll", "block"))
    kind = rng.choice(("fault_kernel", "bad_address", "kernel_raises"))
    code = rng.choice(FAULT_CODES)
    n_streams = rng.randint(2, 5)
    n_ops = rng.randint(20, 120)
    fault_at = rng.randrange(3, n_ops)
    with_hang = rng.random() < 0.25
    t0 = time.perf_counter()
    dev = await open_tracked(completion=completion, task_timeout=30.0)
    ops: list[Op] = []
    try:
        with anyio.fail_after(20):
            streams = [
                dev.stream(max_in_flight=rng.choice((4, 16, 1024))) for _ in range(n_streams)
            ]
            axpy, sleep = dev.function("axpy"), dev.function("sleep")
            x = dev.malloc(SLOT * 4)
            # one output buffer per op (copy_to_host reads from the start of a buffer)
            ys = [dev.malloc(SLOT * 4) for _ in range(n_ops)]
            z = dev.malloc(SLOT * 4)
            await (await streams[0].copy_to_device(x, np.ones(SLOT, np.float32)))
            written: dict[int, list[int]] = {i: [] for i in range(n_streams)}
            hang_stream = rng.randrange(n_streams) if with_hang else -1
            for index in range(n_ops):
                si = rng.randrange(n_streams)
                if si == hang_stream and index <= fault_at:
                    si = (si + 1) % n_streams  # keep the hung stream out of the fault's way
                s = streams[si]
                if index == fault_at:
                    op = Op(kind, si, index)
                elif with_hang and index == fault_at // 2:
                    op = Op("hang", hang_stream, index)
                    s = streams[hang_stream]
                else:
                    roll = rng.random()
                    if roll < 0.6:
                        op = Op("axpy", si, index, slot=index, expected=float(index + 1))
                    elif roll < 0.75:
                        op = Op("sleep", si, index)
                    elif roll < 0.9 and written[si]:
                        op = Op("copy", si, index, slot=rng.choice(written[si]))
                    else:
                        op = Op("xdep", si, index)
                ops.append(op)
                try:
                    if op.kind == "axpy":
                        args = aa.HostArgs().ptr(x).ptr(ys[op.slot])
                        op.awaitable = await s.launch(axpy, 1, args.f32(op.expected).u32(SLOT))
                        written[si].append(op.slot)
                    elif op.kind == "sleep":
                        args = aa.HostArgs().u32(rng.randint(50, 1500))
                        op.awaitable = await s.launch(sleep, 1, args)
                    elif op.kind == "copy":
                        op.expected = float(op.slot + 1)
                        op.host = np.full(SLOT, -7.0, np.float32)
                        op.awaitable = await s.copy_to_host(op.host, ys[op.slot])
                    elif op.kind == "xdep":
                        # another stream waits for this stream's work so far, then reads a slot
                        # this stream wrote before the event
                        other = (si + 1) % n_streams
                        if other == hang_stream:
                            other = (other + 1) % n_streams
                        if other == si:
                            op.kind = "sleep"
                            op.awaitable = await s.launch(sleep, 1, aa.HostArgs().u32(100))
                            continue
                        ev = await s.record_event()
                        wait = await streams[other].wait_event(ev)
                        op.awaitable = ev
                        if written[si]:
                            follow = Op("copy", other, index, slot=rng.choice(written[si]))
                            follow.expected = float(follow.slot + 1)
                            follow.host = np.full(SLOT, -7.0, np.float32)
                            ops.append(follow)
                            follow.awaitable = await streams[other].copy_to_host(
                                follow.host, ys[follow.slot]
                            )
                        ops.append(Op("wait", other, index, awaitable=wait))
                        del ev, wait  # hold Events only through `ops` (dropped before close)
                    elif op.kind == "hang":
                        op.awaitable = await s.launch(dev.function("hang"), 1)
                    elif op.kind == "fault_kernel":
                        args = aa.HostArgs().u32(code)
                        op.awaitable = await s.launch(dev.function("fault"), 1, args)
                    elif op.kind == "bad_address":
                        args = aa.HostArgs().ptr(BAD_ADDRESS).ptr(z).ptr(z).u32(SLOT)
                        op.awaitable = await s.launch(dev.function("vector_add"), 1, args)
                    elif op.kind == "kernel_raises":
                        fn = dev.load_module(_raising).function("divide_by_zero")
                        op.awaitable = await s.launch(fn, 1, aa.HostArgs().u32(index))
                except aa.AscendError as exc:
                    op.refused = exc
                if rng.random() < 0.15:
                    await anyio.sleep(rng.choice((0, 0.0005, 0.002)))
            for op in ops:
                if op.awaitable is None:
                    continue
                if op.kind == "hang" and dev.fault is None:
                    continue
                try:
                    await op.awaitable
                    op.succeeded = True
                except aa.AscendError as exc:
                    op.outcome = exc
            fault = dev.fault
            # evaluate before close: the sim's memory still holds the results
            totals.trials += 1
            totals.fault_kinds[kind] = totals.fault_kinds.get(kind, 0) + 1
            totals.hung_kernels_in_trials += with_hang
            if isinstance(fault, aa.DeviceFaultError):
                totals.faults_surfaced += 1
                want = 507015 if kind != "fault_kernel" or code == 0 else code
                assert fault.code == want, (fault, kind, code)
            fault_op = next(op for op in ops if op.index == fault_at and op.kind == kind)
            if not fault_caused(fault_op.outcome, fault):
                totals.faulting_task_not_failed_with_fault += 1
            behind = False
            for op in ops:
                if op.kind == "hang" and op.outcome is None and not op.succeeded:
                    continue  # not awaited (no fault reached it)
                if op is fault_op:
                    behind = True
                    continue
                if op.refused is not None:
                    if fault_caused(op.refused, fault):
                        totals.refused_after_fault += 1
                    else:
                        totals.failures_not_caused_by_first_fault += 1
                    continue
                totals.tasks += 1
                if op.succeeded:
                    totals.succeeded += 1
                    if behind and op.stream == fault_op.stream:
                        totals.successes_behind_fault_on_its_stream += 1
                    if op.kind == "axpy":
                        got = sim_peek(dev, ys[op.slot].ptr, SLOT)
                        if not np.all(got == np.float32(op.expected)):
                            totals.succeeded_but_wrong += 1
                    elif op.kind == "copy":
                        assert op.host is not None
                        if not np.all(op.host == np.float32(op.expected)):
                            totals.succeeded_but_wrong += 1
                elif op.outcome is not None:
                    totals.failed += 1
                    if not fault_caused(op.outcome, fault):
                        totals.failures_not_caused_by_first_fault += 1
    except TimeoutError:
        totals.hangs += 1
    finally:
        # (our Events, tasks and their errors stay referenced across the close on purpose)
        c0 = time.perf_counter()
        with anyio.fail_after(15):
            await dev.aclose(timeout=2.0)
        totals.close_seconds_max = max(totals.close_seconds_max, time.perf_counter() - c0)
    totals.user_events_left_at_close += live_resources(dev)["events"]
    assert_sim_clean(dev)
    totals.closes_ok += 1
    totals.trial_seconds_max = max(totals.trial_seconds_max, time.perf_counter() - t0)


@stress_timeout
async def test_fault_matrix(anyio_backend: Any) -> None:
    totals = Totals()
    trials = scaled(20, 200)
    base = {"asyncio": 1000, "trio": 2000}[anyio_backend[0]] + (500 if anyio_backend[1] else 0)
    for seed in range(base, base + trials):
        await _fault_trial(seed, totals)
    # a reopen after the whole matrix still works
    async with tracked_device() as dev:
        await (await dev.stream().launch(dev.function("noop"), 1))
        assert dev.fault is None
    loop = anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")
    figures = dict(vars(totals))
    report(f"fault_matrix[{loop}]", **figures)
    assert totals.hangs == 0, figures
    assert totals.faults_surfaced == totals.trials == trials, figures
    assert totals.closes_ok == trials, figures
    assert totals.succeeded_but_wrong == 0, figures
    assert totals.failures_not_caused_by_first_fault == 0, figures
    assert totals.successes_behind_fault_on_its_stream == 0, figures
    assert totals.faulting_task_not_failed_with_fault == 0, figures


@pytest.mark.parametrize("completion", ["poll", "block"])
async def test_hang_fails_within_task_timeout_and_aclose_timeout_returns(
    anyio_backend: Any, completion: str
) -> None:
    # 1 s: 10x what the other stream's 200 noops take (~0.05 s; 0.30 s once on a loaded CI)
    task_timeout = 1.0
    dev = await open_tracked(task_timeout=task_timeout, completion=completion)
    hung_stream, busy = dev.stream(), dev.stream()
    t0 = time.perf_counter()
    hung = await hung_stream.launch(dev.function("hang"), 1)
    behind = await hung_stream.launch(dev.function("noop"), 1)
    # other streams keep working while one is hung
    ok = [await busy.launch(dev.function("noop"), 1) for _ in range(200)]
    for task in ok:
        await task
    others_done_s = time.perf_counter() - t0
    with pytest.raises(aa.TaskTimeoutError), anyio.fail_after(task_timeout + 5):
        await hung
    timeout_s = time.perf_counter() - t0
    with pytest.raises(aa.TaskTimeoutError), anyio.fail_after(5):
        await behind
    assert isinstance(hung.exception(), TimeoutError)
    # the device is still running the hung kernel: its stream slots stay taken
    still_hung = hung_stream.in_flight
    # and the device is not faulted: other streams still work after the timeout
    await (await busy.launch(dev.function("noop"), 1))
    c0 = time.perf_counter()
    with anyio.fail_after(5):
        await dev.aclose(timeout=0.2)
    close_s = time.perf_counter() - c0
    assert_sim_clean(dev)
    loop = anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")
    figures = report(
        f"hang_watchdog[{loop},{completion}]",
        task_timeout_s=task_timeout,
        hung_task_failed_after_s=timeout_s,
        other_stream_200_tasks_done_s=others_done_s,
        hung_stream_slots_still_taken=still_hung,
        aclose_timeout_s=0.2,
        aclose_returned_after_s=close_s,
    )
    assert others_done_s < task_timeout, figures
    assert task_timeout <= timeout_s < task_timeout + 1.0, figures
    assert still_hung == 2, figures
    assert close_s < 0.2 + 1.0, figures


async def test_aclose_timeout_with_hung_kernels_on_several_streams(anyio_backend: Any) -> None:
    # no watchdog in time: aclose(timeout=) alone ends the hung work, and everything queued
    # behind it, with TaskTimeoutError; requests waiting for admission fail with ClosedError
    dev = await open_tracked()
    streams = [dev.stream(max_in_flight=4) for _ in range(3)]
    tasks = []
    for s in streams:
        tasks.append(await s.launch(dev.function("hang"), 1))
        tasks += [await s.launch(dev.function("noop"), 1) for _ in range(3)]
    refused: list[BaseException] = []

    async def blocked_launch(s: aa.Stream) -> None:
        try:
            await s.launch(dev.function("noop"), 1)
        except aa.ClosedError as exc:
            refused.append(exc)

    c0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for s in streams:
            tg.start_soon(blocked_launch, s)
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await dev.aclose(timeout=0.2)
    close_s = time.perf_counter() - c0
    assert_sim_clean(dev)
    assert all(isinstance(t.exception(), aa.TaskTimeoutError) for t in tasks)
    assert len(refused) == len(streams)
    loop = anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")
    report(
        f"aclose_timeout_hung[{loop}]",
        hung_streams=len(streams),
        tasks_failed_with_task_timeout=len(tasks),
        admission_waiters_closed=len(refused),
        aclose_returned_after_s=close_s,
    )
    assert close_s < 1.5


@pytest.mark.parametrize("code", [507899, 12345])
async def test_fault_with_an_unregistered_code_fails_the_task(code: int) -> None:
    # Regression (found by this suite): a fault code the library has no class for made
    # aclrtQueryEventStatus raise a plain RuntimeAPIError that killed the poller thread; the
    # task never resolved, the watchdog was gone and aclose() without a timeout hung forever.
    dev = await open_tracked(task_timeout=1.0)
    try:
        s, other = dev.stream(), dev.stream()
        blocked = await other.launch(dev.function("sleep"), 1, aa.HostArgs().u32(50_000))
        task = await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(code))
        with pytest.raises(aa.DeviceFaultError) as info, anyio.fail_after(1.5):
            await task
        assert info.value.code == code
        assert fault_caused(info.value, dev.fault)
        with pytest.raises(aa.DeviceFaultError) as later, anyio.fail_after(1.5):
            await blocked
        assert fault_caused(later.value, dev.fault)
        with pytest.raises(aa.DeviceFaultError) as refused:
            await s.launch(dev.function("noop"), 1)
        assert fault_caused(refused.value, dev.fault)
    finally:
        with anyio.fail_after(20):
            await dev.aclose(timeout=0.5)


@pytest.mark.parametrize("code", [507899, 12345])
async def test_unregistered_fault_code_seen_by_the_submitter_chains_to_the_fault(
    code: int,
) -> None:
    # Regression (found by this suite): a submission call refused because of a sticky fault
    # whose code has no class was taken as a plain refusal (RuntimeAPIError, not chained to
    # the first fault, dev.fault still None)
    dev = await open_tracked()
    try:
        s1, s2 = dev.stream(), dev.stream()
        fault = await s1.launch(dev.function("fault"), 1, aa.HostArgs().u32(code))
        # same tick, same hop (fewer than the 256 requests after which a launch yields to the
        # loop): the device faults while the submitter is still submitting
        tasks = [await s2.launch(dev.function("noop"), 1) for _ in range(250)]
        unchained = 0
        with anyio.fail_after(10):
            for task in [fault, *tasks]:
                try:
                    await task
                except aa.AscendError as exc:
                    unchained += not fault_caused(exc, dev.fault)
        assert isinstance(dev.fault, aa.DeviceFaultError)
        assert unchained == 0, f"{unchained} failed tasks not chained to the first fault"
    finally:
        with anyio.fail_after(20):
            await dev.aclose(timeout=1.0)
