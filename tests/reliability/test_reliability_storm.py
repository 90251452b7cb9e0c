"""Reliability: a cancellation storm loses no result, frees nothing early and leaks nothing.

Thousands of ``axpy`` launches over 8 streams with small ``max_in_flight`` (so launches queue
for admission), ~30 % of the awaits cancelled at random points: while waiting for admission,
while the request sits in the not-yet-flushed batch, and while it is in flight. Each launch adds
its own unique scalar into its own output slot, and the sim reads pinned args only when the
kernel executes, so a host args buffer reused or freed early shows up as a wrong slot (and, with
``debug=True``, as a pool canary violation).

Rules checked per launch:
* ``launch`` cancelled before it returned a Task -> the kernel never runs (its slot stays 0);
* ``launch`` returned a Task -> the kernel runs to the end whatever happens to the awaiters
  (slot == its scalar), and the task ends without error.
"""

from __future__ import annotations

import ctypes
import random
import time
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from reliability_helpers import (
    live_resources,
    report,
    scaled,
    sim_leak_check,  # noqa: F401 - fixture
    stress_only,
    stress_timeout,
    tracked_device,
)

import aio_ascend as aa

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("sim_leak_check")]

SLOT = 16  # floats per output slot


async def _storm(
    *,
    launches: int,
    streams: int = 8,
    max_in_flight: int = 16,
    cancel_fraction: float = 0.3,
    concurrency: int = 384,
    seed: int = 1234,
    completion: str = "poll",
    sabotage_every: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    async with tracked_device(debug=True, completion=completion) as dev:
        sim = dev.runtime
        if sabotage_every:
            _sabotage(sim, sabotage_every)
        setup = dev.stream()
        ss = [dev.stream(max_in_flight=max_in_flight) for _ in range(streams)]
        x = dev.malloc(SLOT * 4)
        await (await setup.copy_to_device(x, np.ones(SLOT, np.float32)))
        y = dev.malloc(launches * SLOT * 4)
        await (await setup.copy_to_device(y, np.zeros(launches * SLOT, np.float32)))
        axpy, sleep = dev.function("axpy"), dev.function("sleep")
        kernels_before = sim.counters["kernels_executed"]  # type: ignore[attr-defined]
        launches_before = dev.stats()["launches"]

        tasks: list[aa.Task | None] = [None] * launches
        where: dict[str, int] = {"admission": 0, "batched": 0, "in_flight": 0}
        errors: list[BaseException] = []
        sleeps = 0
        limiter = anyio.CapacityLimiter(concurrency)
        chaos_done = anyio.Event()

        async def one(i: int, mode: str, delay: float, stream: aa.Stream) -> None:
            # unique scalar per launch (exact in float32), into slot i
            args = aa.HostArgs().ptr(x).ptr(y.ptr + i * SLOT * 4).f32(float(i + 1)).u32(SLOT)
            async with limiter:
                if mode == "admission":
                    # a deadline that usually fires while the launch waits for admission (the
                    # stream holds only max_in_flight); if admission was quick the await of the
                    # task is cancelled instead
                    with anyio.move_on_after(delay) as scope:
                        tasks[i] = await stream.launch(axpy, 1, args)
                        await tasks[i]  # type: ignore[misc]
                    if scope.cancelled_caught:
                        where["admission" if tasks[i] is None else "in_flight"] += 1
                    return
                task = tasks[i] = await stream.launch(axpy, 1, args)
                args.f32(-1.0)  # mutating the builder after launch must not matter
                if mode == "batched":
                    # cancelled before the loop ran again: the request is still in the
                    # not-yet-submitted batch
                    with anyio.CancelScope() as scope:
                        scope.cancel()
                        await task
                    if scope.cancelled_caught:
                        where["batched"] += 1
                elif mode == "in_flight":
                    with anyio.move_on_after(delay) as scope:
                        await task
                    if scope.cancelled_caught:
                        where["in_flight"] += 1
                else:
                    try:
                        await task
                    except Exception as exc:  # pragma: no cover - reported below
                        errors.append(exc)

        async def chaos() -> None:
            # hold the device now and then so that work piles up in flight and admission
            while not chaos_done.is_set():
                await anyio.sleep(rng.uniform(0.002, 0.02))
                sim.pause()  # type: ignore[attr-defined]
                await anyio.sleep(rng.uniform(0.0005, 0.004))
                sim.resume()  # type: ignore[attr-defined]

        async with anyio.create_task_group() as outer:
            outer.start_soon(chaos)
            async with anyio.create_task_group() as tg:
                for i in range(launches):
                    stream = rng.choice(ss)
                    if rng.random() < 0.02:
                        # a short device stall on some stream keeps work in flight
                        await stream.launch(sleep, 1, aa.HostArgs().u32(rng.randint(100, 800)))
                        sleeps += 1
                    if rng.random() < cancel_fraction:
                        mode = rng.choice(("admission", "batched", "in_flight"))
                    else:
                        mode = "await"
                    delay = rng.choice((0.0, rng.uniform(0.0, 0.003)))
                    tg.start_soon(one, i, mode, delay, stream)
                    if i % 64 == 0:
                        await anyio.lowlevel.checkpoint()
            chaos_done.set()
        sim.resume()  # type: ignore[attr-defined]
        await dev.synchronize()

        submitted = sum(t is not None for t in tasks)
        failed = [t for t in tasks if t is not None and t.exception() is not None]
        result = np.empty(launches * SLOT, np.float32)
        await (await setup.copy_to_host(result, y))
        slots = result.reshape(launches, SLOT)
        expected = np.zeros((launches, SLOT), np.float32)
        for i, t in enumerate(tasks):
            if t is not None:
                expected[i] = np.float32(i + 1)
        correct = int(np.sum(np.all(slots == expected, axis=1)))
        wrong = launches - correct
        executed = sim.counters["kernels_executed"] - kernels_before  # type: ignore[attr-defined]
        stats = dev.stats()
        violations = stats["host_buffer_violations"]
        peak = stats["peak_in_flight"]
        launched = stats["launches"] - launches_before
    after = dev.stats()
    figures = {
        "completion": completion,
        "launch_attempts": launches,
        "streams": streams,
        "max_in_flight": max_in_flight,
        "cancelled_before_admission": where["admission"],
        "cancelled_while_batched": where["batched"],
        "cancelled_while_in_flight": where["in_flight"],
        "cancelled_total": sum(where.values()),
        "tasks_returned": submitted,
        "kernels_executed": executed,
        "sleep_kernels": sleeps,
        "results_correct": correct,
        "results_wrong": wrong,
        "tasks_failed": len(failed) + len(errors),
        "early_frees_detected": violations,
        "host_buffers_outstanding_after_close": after["host_buffers_in_use"],
        "sim_pinned_allocations_after_close": live_resources(dev)["host_allocations"],
        "peak_in_flight": peak,
        "seconds": time.perf_counter() - t0,
    }
    if sabotage_every:
        return figures
    # every launch that returned a Task ran, exactly once; nothing else ran
    assert launched == submitted + sleeps, (launched, submitted, sleeps)
    assert executed == submitted + sleeps, figures
    assert wrong == 0, figures
    assert not failed and not errors, (failed[:3], errors[:3])
    assert violations == 0, figures
    assert after["host_buffers_in_use"] == 0, figures
    assert peak <= max_in_flight, figures
    # the storm really exercised each cancellation point
    assert where["admission"] > 0 and where["batched"] > 0 and where["in_flight"] > 0, figures
    assert 0.15 * launches < sum(where.values()) < 0.45 * launches, figures
    return figures


def _sabotage(sim: Any, every: int) -> None:
    """Make the sim's launch call zero the scalar of every ``every``-th args buffer right after
    it queued the kernel: what reusing a host args buffer too early would do."""
    real = sim.launch_kernel_with_host_args
    calls = 0

    def launch(func: int, blocks: int, stream: int, cfg: Any, addr: int, size: int, *rest: Any):
        nonlocal calls
        real(func, blocks, stream, cfg, addr, size, *rest)
        calls += 1
        if calls % every == 0 and size >= 24:
            ctypes.memset(addr + 16, 0, 4)  # axpy's f32 a

    sim.launch_kernel_with_host_args = launch


@stress_timeout
async def test_cancellation_storm(anyio_backend: Any) -> None:
    name = f"storm[{anyio_backend[0]}{'+uvloop' if anyio_backend[1] else ''}]"
    completion = "block" if anyio_backend[1] else "poll"
    report(name, **await _storm(launches=scaled(3000, 10_000), completion=completion))


async def test_the_storm_detects_args_reused_too_early(anyio_backend: Any) -> None:
    # the storm's result check has teeth: an args buffer overwritten after submission (as an
    # early reuse would) shows up as wrong slots
    figures = await _storm(launches=600, sabotage_every=10)
    loop = anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")
    report(f"storm_detector_self_check[{loop}]", **figures)
    assert figures["results_wrong"] > 0, figures


@stress_only
@pytest.mark.stress
@pytest.mark.timeout(900)
async def test_cancellation_storm_full_size(anyio_backend: Any) -> None:
    name = f"storm_full[{anyio_backend[0]}{'+uvloop' if anyio_backend[1] else ''}]"
    for seed in (1, 2, 3):
        report(f"{name}#seed{seed}", **await _storm(launches=10_000, seed=seed))
