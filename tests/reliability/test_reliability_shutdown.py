"""Reliability: shutdown and lifecycle.

* ``aclose()`` with work in flight, at random points, in drain mode and with ``cancel=True``:
  every task ends; a task that succeeded ran exactly once (successes == kernels the sim
  executed), a task dropped with ``ClosedError`` never ran, admission waiters get ``ClosedError``;
  nothing is left behind.
* ``aclose()`` twice, concurrently; every public operation after close raises ``ClosedError``.
* The loop closes before a completion arrives; a device is garbage-collected without
  ``aclose()``; the interpreter exits with work in flight (these run in subprocesses: the
  interpreter's stderr must stay empty, the exit code 0).
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Any

import anyio
import numpy as np
import pytest
from reliability_helpers import (
    assert_sim_clean,
    live_resources,
    open_tracked,
    report,
    scaled,
    sim_leak_check,  # noqa: F401 - fixture
    stress_timeout,
)

import aio_ascend as aa

pytestmark = pytest.mark.usefixtures("sim_leak_check")
anyio_test = pytest.mark.anyio

N = 16  # floats per copy


def _loop_name(anyio_backend: Any) -> str:
    return anyio_backend[0] + ("+uvloop" if anyio_backend[1] else "")


# --- aclose with work in flight --------------------------------------------------------------


async def _close_trial(seed: int, cancel: bool, totals: dict[str, Any]) -> None:
    rng = random.Random(seed)
    dev = await open_tracked()
    sim = dev.runtime
    n_streams = rng.randint(1, 4)
    streams = [dev.stream(max_in_flight=rng.choice((2, 8, 64))) for _ in range(n_streams)]
    data = np.arange(N, dtype=np.float32) + seed
    src = dev.malloc(N * 4)
    await (await streams[0].copy_to_device(src, data))
    kernels_before = sim.counters["kernels_executed"]  # type: ignore[attr-defined]
    launches: list[aa.Task] = []
    copies: list[tuple[aa.Task, np.ndarray[Any, Any]]] = []
    refused: list[BaseException] = []
    unexpected: list[BaseException] = []
    fns = [dev.function("noop"), dev.function("sleep")]

    async def producer(s: aa.Stream) -> None:
        while True:
            try:
                roll = rng.random()
                if roll < 0.15:
                    out = np.full(N, -1.0, np.float32)
                    copies.append((await s.copy_to_host(out, src), out))
                elif roll < 0.5:
                    args = aa.HostArgs().u32(rng.randint(10, 400))
                    launches.append(await s.launch(fns[1], 1, args))
                else:
                    launches.append(await s.launch(fns[0], 1))
            except aa.ClosedError as exc:
                refused.append(exc)
                return
            except Exception as exc:  # pragma: no cover - reported below
                unexpected.append(exc)
                return
            if rng.random() < 0.1:
                await anyio.sleep(rng.choice((0, 0.0002, 0.001)))

    paused = rng.random() < 0.3
    t0 = time.perf_counter()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for s in streams:
                tg.start_soon(producer, s)
            await anyio.sleep(rng.uniform(0, 0.01))
            if paused:
                # work piles up submitted-but-not-run; close must still wait for it
                sim.pause()  # type: ignore[attr-defined]

                async def resume_later() -> None:
                    await anyio.sleep(0.005)
                    sim.resume()  # type: ignore[attr-defined]

                tg.start_soon(resume_later)
            await dev.aclose(cancel=cancel)
    close_s = time.perf_counter() - t0
    executed = sim.counters["kernels_executed"] - kernels_before  # type: ignore[attr-defined]
    ok = [t for t in launches if t.done() and t.exception() is None]
    closed = [t for t in launches if isinstance(t.exception(), aa.ClosedError)]
    other = [t for t in launches if not t.done() or (t.exception() and t not in closed)]
    copies_ok = [out for t, out in copies if t.exception() is None]
    totals["trials"] += 1
    totals["tasks"] += len(launches) + len(copies)
    totals["succeeded"] += len(ok) + len(copies_ok)
    totals["dropped_with_closed_error"] += len(closed) + len(copies) - len(copies_ok)
    totals["admission_refused_with_closed_error"] += len(refused)
    totals["other_outcomes"] += len(other) + len(unexpected)
    totals["succeeded_but_not_executed_or_vice_versa"] += abs(executed - len(ok))
    totals["copies_wrong"] += sum(not np.array_equal(out, data) for out in copies_ok)
    totals["close_seconds_max"] = max(totals["close_seconds_max"], close_s)
    assert_sim_clean(dev)
    if not cancel:
        assert not closed, "drain mode dropped admitted work"
    assert not other and not unexpected, (other[:3], unexpected[:3])
    assert executed == len(ok), (executed, len(ok), len(closed))


@stress_timeout
@anyio_test
@pytest.mark.parametrize("cancel", [False, True], ids=["drain", "cancel"])
async def test_aclose_with_work_in_flight_at_random_points(
    anyio_backend: Any, cancel: bool
) -> None:
    totals: dict[str, Any] = dict.fromkeys(
        (
            "trials",
            "tasks",
            "succeeded",
            "dropped_with_closed_error",
            "admission_refused_with_closed_error",
            "other_outcomes",
            "succeeded_but_not_executed_or_vice_versa",
            "copies_wrong",
        ),
        0,
    )
    totals["close_seconds_max"] = 0.0
    for seed in range(scaled(15, 150)):
        await _close_trial(seed, cancel, totals)
    figures = report(
        f"aclose_in_flight[{_loop_name(anyio_backend)},{'cancel' if cancel else 'drain'}]", **totals
    )
    assert totals["other_outcomes"] == 0, figures
    assert totals["succeeded_but_not_executed_or_vice_versa"] == 0, figures
    assert totals["copies_wrong"] == 0, figures
    if not cancel:
        assert totals["dropped_with_closed_error"] == 0, figures
    assert totals["admission_refused_with_closed_error"] > 0, figures


@anyio_test
async def test_aclose_cancel_drops_exactly_the_unsubmitted_requests() -> None:
    dev = await open_tracked()
    sim = dev.runtime
    s = dev.stream()
    sim.pause()  # type: ignore[attr-defined]
    submitted = [await s.launch(dev.function("noop"), 1) for _ in range(20)]
    await anyio.sleep(0.01)  # one loop tick: these 20 went to the runtime
    pending = [await s.launch(dev.function("noop"), 1) for _ in range(30)]  # same tick: not yet
    assert dev.stats()["launches"] == 20

    async def resume_soon() -> None:
        await anyio.sleep(0.02)
        sim.resume()  # type: ignore[attr-defined]

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume_soon)
            await dev.aclose(cancel=True)
    assert all(t.exception() is None for t in submitted)
    assert all(isinstance(t.exception(), aa.ClosedError) for t in pending)
    assert sim.counters["kernels_executed"] == 20  # type: ignore[attr-defined]
    assert dev.stats()["launches"] == 20


@anyio_test
async def test_aclose_twice_and_concurrently(anyio_backend: Any) -> None:
    dev = await open_tracked()
    s = dev.stream()
    tasks = [await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(500)) for _ in range(20)]
    returned: list[float] = []
    t0 = time.perf_counter()

    async def closer() -> None:
        await dev.aclose()
        # every caller returns only once the device is closed
        assert "closed" in repr(dev)
        returned.append(time.perf_counter() - t0)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(closer)
        await dev.aclose()
        await dev.aclose(cancel=True, timeout=0.1)
    assert len(returned) == 4
    assert all(t.done() and t.exception() is None for t in tasks)
    assert_sim_clean(dev)


@anyio_test
async def test_aclose_is_shielded_from_cancellation_once_started() -> None:
    dev = await open_tracked()
    s = dev.stream()
    tasks = [await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(2000)) for _ in range(10)]
    with anyio.move_on_after(0.001):
        await dev.aclose()
    # the close ran to the end regardless of the outer deadline
    assert "closed" in repr(dev)
    assert all(t.done() and t.exception() is None for t in tasks)
    assert_sim_clean(dev)


@anyio_test
async def test_every_operation_after_close_raises_closed_error(anyio_backend: Any) -> None:
    dev = await open_tracked()  # (holds Events across the close: they are destroyed too)
    s = dev.stream()
    other = dev.stream()
    buf = dev.malloc(64)
    noop = dev.function("noop")
    start = await s.record_event(timing=True)
    task = await s.launch(noop, 1)
    end = await s.record_event(timing=True)
    await end
    await dev.aclose()
    checks: dict[str, str] = {}

    async def expect_closed(name: str, coro_or_fn: Any) -> None:
        try:
            result = coro_or_fn()
            if hasattr(result, "__await__"):
                await result
        except aa.ClosedError:
            checks[name] = "ClosedError"
        except Exception as exc:
            checks[name] = f"{type(exc).__name__}: {exc}"
        else:
            checks[name] = "no error"

    await expect_closed("launch", lambda: s.launch(noop, 1))
    fresh = np.zeros(4, np.float32)
    await expect_closed("copy_to_device(host bytes)", lambda: s.copy_to_device(buf, b"1234"))
    await expect_closed("copy_to_host(fresh array)", lambda: s.copy_to_host(fresh, buf))
    await expect_closed("record_event", lambda: s.record_event())
    await expect_closed("wait_event", lambda: other.wait_event(end))
    await expect_closed("stream", lambda: dev.stream())
    await expect_closed("malloc", lambda: dev.malloc(64))
    await expect_closed("load_module", lambda: dev.load_module(aa.sim.KernelLibrary()))
    await expect_closed("elapsed_ms", lambda: start.elapsed_ms(end))
    report(f"use_after_close[{_loop_name(anyio_backend)}]", **checks)
    assert all(v == "ClosedError" for v in checks.values()), checks
    # harmless after close: no error, no double free
    await task
    buf.free()
    await s.aclose()
    await dev.aclose()
    assert end.done() and end.query()  # answered from the observed completion
    assert_sim_clean(dev)


@anyio_test
async def test_copies_after_close_raise_closed_error() -> None:
    # Regression (found by this suite): ValueError("... has been freed") instead of ClosedError
    dev = await open_tracked()
    s = dev.stream()
    buf = dev.malloc(64)
    await dev.aclose()
    with pytest.raises(aa.ClosedError):
        await s.copy_to_device(buf, np.zeros(4, np.float32))
    with pytest.raises(aa.ClosedError):
        await s.copy_to_host(np.zeros(4, np.float32), buf)


@anyio_test
async def test_aclose_destroys_events_still_referenced() -> None:
    # Regression (found by this suite): aclose() destroyed only the events of Event objects
    # already collected; one still referenced (by the caller, a stale library reference or a
    # traceback cycle) kept its runtime event alive after close
    dev = await open_tracked(exempt=("events",))  # asserted here, with a clearer message
    s, other = dev.stream(), dev.stream()
    kept = [await s.record_event(timing=timing) for timing in (False, True)]
    await other.wait_event(kept[0])
    await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(0))
    failed = await s.record_event()
    with pytest.raises(aa.DeviceFaultError):
        await failed  # a failed Event: its error's traceback references it
    await dev.aclose()
    assert live_resources(dev)["events"] == 0, live_resources(dev)
    assert kept[0].done() and failed.done()


# --- subprocess scenarios: loop closed, garbage collection, interpreter exit ----------------

_GC_SCENARIO = textwrap.dedent(
    """
    import asyncio, gc, json, sys, threading, time, warnings, weakref
    import aio_ascend as aa

    caught = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda m, c, *a, **k: caught.append(f"{c.__name__}: {m}")
    scenario = sys.argv[1]

    def lib_threads():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-"))

    async def open_and_work(work, wait):
        dev = await aa.open_device(0, backend="sim")
        task = None
        if work:
            s = dev.stream()
            await (await s.launch(dev.function("noop"), 1))
            task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(200_000))
            if wait:
                await task
        return weakref.ref(dev), task

    done = None
    if scenario == "loop_closed_before_completion":
        loop = asyncio.new_event_loop()
        ref, task = loop.run_until_complete(open_and_work(True, False))
        loop.close()
        time.sleep(0.4)  # the completion arrives now, after the loop closed
        done = task.done()
        del task
    elif scenario == "idle_unclosed":
        ref, _ = asyncio.run(open_and_work(False, False))
    elif scenario == "worked_unclosed_asyncio":
        ref, task = asyncio.run(open_and_work(True, True))
        del task  # (a Task references its device)
    elif scenario == "worked_unclosed_trio":
        import trio
        ref, task = trio.run(open_and_work, True, True)
        del task
    # (collect again while waiting: a library thread may still hold the last batch for a
    # moment after the loop saw it complete, so the first pass can come too early)
    deadline = time.monotonic() + 2.0
    gc.collect()
    while lib_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    print(json.dumps({
        "collected": ref() is None,
        "threads_left": lib_threads(),
        "warnings": caught,
        "task_done_after_loop_closed": done,
    }))
    """
)


@functools.cache
def _run_gc_scenario(scenario: str) -> tuple[int, str, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-c", _GC_SCENARIO, scenario],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": ""},
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    report(
        f"gc_unclosed[{scenario}]",
        rc=proc.returncode,
        stderr_bytes=len(proc.stderr),
        collected=out.get("collected"),
        threads_left=len(out.get("threads_left", [])),
        resource_warnings=sum(w.startswith("ResourceWarning") for w in out.get("warnings", [])),
        task_done_after_loop_closed=out.get("task_done_after_loop_closed"),
    )
    return proc.returncode, proc.stderr, out


def test_completion_after_the_loop_closed_is_dropped_quietly() -> None:
    # asyncio loop run by hand; a long sleep kernel is in flight when the loop is closed
    rc, stderr, out = _run_gc_scenario("loop_closed_before_completion")
    assert rc == 0, stderr
    assert stderr == "", stderr  # no traceback from the poller's hand-off to a closed loop
    assert out["task_done_after_loop_closed"] is False  # nothing ran on the closed loop


@pytest.mark.parametrize(
    "scenario",
    [
        "idle_unclosed",
        "worked_unclosed_asyncio",
        "worked_unclosed_trio",
        "loop_closed_before_completion",
    ],
)
def test_unclosed_device_is_collected_with_a_resource_warning(scenario: str) -> None:
    # Regression (found by this suite): a device that had run any work was never collected
    # (the submitter and poller threads kept their last work item in a frame local, whose
    # requests referenced the Stream/Task and so the Device): no ResourceWarning, and its
    # three threads ran until the process exited
    rc, stderr, out = _run_gc_scenario(scenario)
    assert rc == 0, stderr
    assert stderr == "", stderr  # no traceback, no "Exception ignored in"
    assert out["collected"], out
    assert out["threads_left"] == [], out
    assert any(w.startswith("ResourceWarning") for w in out["warnings"]), out


_HUNG_SCENARIO = textwrap.dedent(
    """
    import asyncio, gc, json, threading, time, warnings
    import numpy as np
    import aio_ascend as aa

    BIG = 4 << 20
    released = threading.Event()
    closes = []  # the staging thread's state when the runtime was closed

    async def main():
        dev = await aa.open_device(0, backend="sim")
        submitter = dev._scheduler._submitter
        acquire = submitter._stage

        def hung(nbytes):  # a big copy's staging: its pinned buffer, then a hang
            host = acquire(nbytes)
            released.wait(60)
            return host

        submitter._stage = hung
        close = dev.runtime.close
        stage = submitter.stage_thread

        def closing():
            closes.append(stage.is_alive())
            close()

        dev.runtime.close = closing
        s, buf = dev.stream(), dev.malloc(BIG)
        await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        while not stage.is_alive():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # (inside the hung call)
        del s, buf, submitter
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del dev
            gc.collect()

    asyncio.run(main())
    time.sleep(5.0)  # past the 2 s per thread (two here) the delayed close used to wait
    before = list(closes)
    released.set()
    deadline = time.monotonic() + 20
    while not closes and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    left = [t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-")]
    print(json.dumps({"before": before, "after": closes, "threads_left": left}))
    """
)


def test_a_collected_device_closes_its_runtime_only_once_a_hung_call_returned() -> None:
    """A device collected without ``aclose()`` while its staging thread hangs in a call: its
    delayed close waits for the call however long it takes, then closes the runtime. It used
    to close it under the call after 2 s per thread, and the staging call then wrote into
    freed pinned memory (the process died: SIGSEGV)."""
    proc = subprocess.run(
        [sys.executable, "-c", _HUNG_SCENARIO],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": ""},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == [], out  # not closed under the hung call
    assert out["after"] == [False], out  # closed once, after the staging thread exited
    assert out["threads_left"] == [], out


_EXIT_SCENARIO = textwrap.dedent(
    """
    import sys
    import aio_ascend as aa
    how = sys.argv[1]

    async def main():
        dev = await aa.open_device(0, backend="sim")
        s, hung, full = dev.stream(), dev.stream(), dev.stream(max_in_flight=2)
        for _ in range(50):
            await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))
        await hung.launch(dev.function("hang"), 1)
        for _ in range(2):
            await full.launch(dev.function("hang"), 1)
        buf = dev.malloc(1 << 16)
        await s.copy_to_device(buf, bytearray(1 << 16))
        if how.endswith("exit"):
            sys.exit(0)

    if how.startswith("asyncio"):
        import asyncio
        asyncio.run(main())
    elif how.startswith("uvloop"):
        import uvloop
        uvloop.run(main())
    else:
        import trio
        trio.run(main)
    print("ok")
    """
)


@stress_timeout
def test_interpreter_exit_with_work_in_flight() -> None:
    pytest.importorskip("uvloop")
    hows = ["asyncio", "uvloop", "trio", "asyncio-sys.exit", "trio-sys.exit"]
    repeats = scaled(3, 10)
    t0 = time.perf_counter()
    procs = [
        (
            how,
            subprocess.Popen(
                [sys.executable, "-c", _EXIT_SCENARIO, how],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for how in hows
        for _ in range(repeats)
    ]
    results = []
    for how, proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append((how, proc.returncode, out, err))
    elapsed = time.perf_counter() - t0
    bad = [r for r in results if r[1] != 0 or r[3] != "" or ("exit" not in r[0] and r[2] != "ok\n")]
    report(
        "interpreter_exit_in_flight",
        runs=len(results),
        variants=len(hows),
        nonzero_exit=sum(r[1] != 0 for r in results),
        nonempty_stderr=sum(r[3] != "" for r in results),
        wall_s_all_runs=elapsed,
    )
    assert not bad, bad[:2]
