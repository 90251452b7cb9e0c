"""Closing a module: its binary is unloaded once nothing can run its kernels any more (the
launches queued before, open plans and graphs), never under them; nothing new may use it.

A server swapping kernel binaries must be able to drop the old one while it serves. On the sim
and the acl double (whose live binaries are counted), on asyncio, uvloop and trio; the rest of
each test also runs on the real runtime (realrt).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from helpers import (
    OpenDevice,
    assert_runtime_clean,
    download,
    in_thread,
    live_resources,
    on_real_runtime,
    upload,
)

import aio_ascend as aa
from aio_ascend import testing

pytestmark = pytest.mark.anyio
REALRT_TOO = True

F32 = np.float32
#: a sleep long enough for the checks made while it runs (microseconds)
HOLD_US = 200_000


def binaries(dev: aa.Device) -> int | None:
    """The binaries the runtime holds (None on the real runtime: not counted there)."""
    return None if on_real_runtime(dev) else live_resources(dev)["binaries"]


def baseline(dev: aa.Device) -> int | None:
    """:func:`binaries` once the device's own module (``dev.function``'s) is loaded."""
    dev.function("noop")
    return binaries(dev)


async def reaches(read: Callable[[], object], value: object) -> None:
    """Wait (up to 10 s: what a completion releases follows it by microseconds) until
    ``read()`` returns ``value``."""
    with anyio.fail_after(10):
        while read() != value:  # noqa: ASYNC110 - a runtime counter
            await anyio.sleep(0.002)


async def unloaded_to(dev: aa.Device, count: int | None) -> None:
    await reaches(lambda: binaries(dev), count)


def hold(module: aa.Module) -> tuple[aa.Function, aa.HostArgs]:
    return module.function("sleep"), aa.HostArgs().u32(HOLD_US)


async def test_a_closed_module_is_unloaded_after_its_queued_launches(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = baseline(dev)
        module = dev.load_module(None)
        assert binaries(dev) == (None if before is None else before + 1)
        sleep, args = hold(module)
        task = await s.launch(sleep, 1, args)
        noop = await s.launch(module.function("noop"), 1)  # queued behind it, on its image
        module.close()
        assert module.closed
        module.close()  # idempotent
        await anyio.sleep(0.02)
        assert not task.done()
        assert binaries(dev) == (None if before is None else before + 1)  # still running
        await noop
        await task
        await unloaded_to(dev, before)
    assert_runtime_clean(dev)


async def test_nothing_new_may_use_a_closed_module(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with dev.load_module(None) as module:
            noop = module.function("noop")
            await s.run(noop, 1)  # (its launch spec and image are cached now)
        assert module.closed
        buf = dev.malloc(64)
        with pytest.raises(aa.ClosedError, match="module is closed"):
            await s.launch(noop, 1)
        with pytest.raises(aa.ClosedError, match="module is closed"):
            await s.launch(noop, 1, aa.HostArgs().ptr(buf))
        with pytest.raises(aa.ClosedError, match="module is closed"):
            s.plan(noop, 1)
        with pytest.raises(aa.ClosedError):
            module.function("noop")
        with pytest.raises(aa.ClosedError):
            module.function("axpy")  # never looked up before
        with pytest.raises(aa.ClosedError, match="module is closed"):
            async with s.capture() as capture:
                capture.launch(noop, 1)
        assert s.in_flight == 0
        await s.run(dev.function("noop"), 1)  # the stream and the device go on
        buf.free()
    assert_runtime_clean(dev)


async def test_the_built_in_module_cannot_be_closed(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        module = dev.function("noop").module
        with pytest.raises(ValueError, match="built-in module"):
            module.close()
        assert not module.closed
        await dev.stream().run(dev.function("noop"), 1)


async def test_an_open_plan_keeps_its_module_loaded(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 32
        x = await upload(dev, s, np.ones(n, F32))
        y = await upload(dev, s, np.zeros(n, F32))
        before = baseline(dev)
        module = dev.load_module(None)
        plan = s.plan(module.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(2.0).u32(n))
        module.close()
        await anyio.sleep(0.02)
        assert binaries(dev) == (None if before is None else before + 1)
        for _ in range(3):  # the plan still launches: it holds the module
            await plan.run()
        assert np.array_equal(await download(s, y, n), np.full(n, 6.0, F32))
        task = await s.launch(*hold_builtin(dev))  # the plan's next launch waits behind it
        last = await plan.launch()
        plan.close()
        await anyio.sleep(0.02)
        assert binaries(dev) == (None if before is None else before + 1)  # last is queued
        await task
        await last
        await unloaded_to(dev, before)
        x.free()
        y.free()
    assert_runtime_clean(dev)


def hold_builtin(dev: aa.Device) -> tuple[aa.Function, int, aa.HostArgs]:
    return dev.function("sleep"), 1, aa.HostArgs().u32(HOLD_US)


async def test_a_graph_keeps_its_module_loaded_until_closed(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 16
        x = await upload(dev, s, np.ones(n, F32))
        y = await upload(dev, s, np.zeros(n, F32))
        before = binaries(dev)
        module = dev.load_module(None)
        async with s.capture() as capture:
            capture.launch(module.function("axpy"), 1, aa.HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
        graph = capture.graph
        assert graph is not None
        module.close()
        await s.run_graph(graph)  # replays still run its kernel: the graph holds it
        await s.run_graph(graph)
        assert binaries(dev) == (None if before is None else before + 1)
        assert np.array_equal(await download(s, y, n), np.full(n, 2.0, F32))
        graph.close()
        await unloaded_to(dev, before)
        x.free()
        y.free()
    assert_runtime_clean(dev)


async def test_a_launch_waiting_for_admission_is_refused_when_its_module_closes(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream(max_in_flight=1)
        before = baseline(dev)
        module = dev.load_module(None)
        noop = module.function("noop")
        first = await s.launch(*hold_builtin(dev))
        errors: list[BaseException] = []

        async def waiting() -> None:
            try:
                await s.launch(noop, 1)
            except aa.ClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.sleep(0.02)  # it waits for the one slot
            module.close()
        assert len(errors) == 1 and "module is closed" in str(errors[0])
        await first
        await s.run(dev.function("noop"), 1)  # the slot it waited for was given back
        assert s.in_flight == 0
        await unloaded_to(dev, before)
    assert_runtime_clean(dev)


async def test_swapping_modules_while_serving_holds_no_more_than_one(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = baseline(dev)
        in_use = dev.stats()["host_buffers_in_use"]
        tasks: list[aa.Task] = []
        for _ in range(40):
            module = dev.load_module(None)
            tasks.append(await s.launch(module.function("noop"), 1))
            tasks.append(await s.launch(module.function("noop"), 2))
            module.close()
        for task in tasks:
            await task
        await unloaded_to(dev, before)
        # the kernels' shared empty-args images went with their modules
        await reaches(lambda: dev.stats()["host_buffers_in_use"], in_use)
    assert_runtime_clean(dev)


async def test_close_belongs_to_the_loop_thread(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        module = dev.load_module(None)
        thread, errors, _ = in_thread(module.close)
        thread.join(timeout=10)
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        assert not module.closed
        await dev.stream().run(module.function("noop"), 1)
    assert module.closed  # (the device's close unloaded it)
    module.close()  # nothing to do then
    assert_runtime_clean(dev)


async def test_the_device_close_unloads_modules_still_held(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        kept = dev.load_module(None)
        closed = dev.load_module(None)
        plan = s.plan(closed.function("noop"), 1)
        closed.close()  # (held by the open plan)
        await s.run(kept.function("noop"), 1)
        await plan.run()
    assert plan.closed
    assert_runtime_clean(dev)


@pytest.mark.sim_only
async def test_a_faulted_device_loads_no_module(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        with pytest.raises(aa.DeviceFaultError):
            await (await testing.inject_fault(s))
        before = binaries(dev)
        with pytest.raises(aa.DeviceFaultError):
            dev.load_module(None)
        assert binaries(dev) == before


async def test_a_module_collected_unclosed_is_unloaded_after_its_work(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = baseline(dev)
        module = dev.load_module(None)
        sleep, args = hold(module)
        task = await s.launch(sleep, 1, args)
        del module, sleep
        gc.collect()
        await anyio.sleep(0.02)
        assert not task.done()
        assert binaries(dev) == (None if before is None else before + 1)  # its work runs
        await task
        await unloaded_to(dev, before)
        # a function keeps its module (and so the binary) alive
        fn = dev.load_module(None).function("noop")
        gc.collect()
        await anyio.sleep(0.02)
        await s.run(fn, 1)
        assert binaries(dev) == (None if before is None else before + 1)
    assert_runtime_clean(dev)


class SlowLoads:
    """The runtime's ``load_binary`` held until :meth:`release` (a big binary's load)."""

    def __init__(self, dev: aa.Device) -> None:
        self.runtime = dev.runtime
        self.started = threading.Event()
        self._go = threading.Event()
        self._load = self.runtime.load_binary
        self.threads: list[str] = []

    def __enter__(self) -> SlowLoads:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.threads.append(threading.current_thread().name)
            self.started.set()
            assert self._go.wait(10)
            return self._load(*args, **kwargs)

        self.runtime.load_binary = held  # type: ignore[method-assign]
        return self

    def release(self) -> None:
        self._go.set()

    def __exit__(self, *exc: object) -> None:
        self.release()
        del self.runtime.load_binary  # type: ignore[method-assign]

    async def wait_started(self) -> None:
        await reaches(self.started.is_set, True)


async def test_aload_module_loads_off_the_loop(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        before = baseline(dev)
        got: list[aa.Module] = []
        with SlowLoads(dev) as loads:
            async with anyio.create_task_group() as tg:

                async def load() -> None:
                    got.append(await dev.aload_module(None))

                tg.start_soon(load)
                await loads.wait_started()
                for _ in range(5):  # the loop and the device go on while it loads
                    await s.run(dev.function("noop"), 1)
                assert not got
                loads.release()
        assert loads.threads == [f"aio_ascend-load-{dev.device_id}"]
        (module,) = got
        await s.run(module.function("noop"), 1)
        assert binaries(dev) == (None if before is None else before + 1)
        module.close()
        await unloaded_to(dev, before)
    assert_runtime_clean(dev)


async def test_a_cancelled_aload_module_unloads_what_it_loaded(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        before = baseline(dev)
        with SlowLoads(dev) as loads:
            with anyio.move_on_after(10) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(dev.aload_module, None)
                    await loads.wait_started()
                    tg.cancel_scope.cancel()  # it waits for the load, then unloads it
                    loads.release()
            assert not scope.cancelled_caught
        await unloaded_to(dev, before)
        await dev.stream().run(dev.function("noop"), 1)
    assert_runtime_clean(dev)


async def test_the_device_close_waits_for_a_load_under_way(open_dev: OpenDevice) -> None:
    dev = await open_dev().__aenter__()
    errors: list[BaseException] = []
    with SlowLoads(dev) as loads:

        async def load() -> None:
            try:
                await dev.aload_module(None)
            except aa.ClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(load)
            await loads.wait_started()
            tg.start_soon(dev.aclose)
            await anyio.sleep(0.05)
            assert not dev.closed  # the runtime stays open for the load
            loads.release()
    assert dev.closed
    assert len(errors) == 1
    assert_runtime_clean(dev)  # the close unloaded what the load loaded


async def test_aload_module_refuses_bad_input_before_any_thread(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        before = binaries(dev)
        with pytest.raises(ValueError, match="kernel_type"):
            await dev.aload_module(None, kernel_type="bogus")
        with pytest.raises(TypeError, match="lazy"):
            await dev.aload_module(None, lazy="yes")  # type: ignore[arg-type]
        with pytest.raises(FileNotFoundError):
            await dev.aload_module("/nonexistent/kernels.o")
        thread, errors, _ = in_thread(lambda: dev.aload_module(None).send(None))
        thread.join(timeout=10)
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        assert binaries(dev) == before
    assert_runtime_clean(dev)


@pytest.mark.sim_only
async def test_a_cancelled_load_is_unloaded_before_the_close_closes_the_runtime(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="aio_ascend")
    dev = await open_dev().__aenter__()
    runtime = dev.runtime
    unload = runtime.unload_binary
    seen: list[tuple[str, bool]] = []

    def slow_unload(binary: int) -> None:
        name = threading.current_thread().name
        if name.startswith("aio_ascend-load-"):
            time.sleep(0.3)  # the unload of the cancelled load's binary takes a while
        seen.append((name, runtime._closed))
        unload(binary)

    monkeypatch.setattr(runtime, "unload_binary", slow_unload)
    with SlowLoads(dev) as loads:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def load() -> None:
                with scope:
                    await dev.aload_module(None)

            tg.start_soon(load)
            await loads.wait_started()
            tg.start_soon(dev.aclose)
            await anyio.sleep(0.02)
            scope.cancel()  # it waits for the load, then unloads the binary on a thread
            loads.release()
    assert dev.closed
    # unloaded once: on a thread after the load (or, if the close came first between the
    # load's end and that thread's start, by the close, on the loop)
    ((thread, closed),) = seen
    assert thread in (f"aio_ascend-load-{dev.device_id}", threading.main_thread().name)
    assert closed is False  # not on a closed runtime: the close waited for it
    assert not [r for r in caplog.records if "unload_binary" in r.getMessage()]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-load")]
    assert_runtime_clean(dev)


@pytest.mark.sim_only
@pytest.mark.parametrize("cancel", [False, True], ids=["load-refused", "load-cancelled"])
async def test_a_close_with_a_timeout_does_not_wait_for_a_hung_load(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture, cancel: bool
) -> None:
    """As for any runtime call stuck past the close: the close returns on time, the runtime
    is closed once the load has returned, not under it, and nothing is freed or unloaded in
    between (a buffer's free, a module's close, the cancelled load's unload do nothing)."""
    caplog.set_level(logging.ERROR, logger="aio_ascend")
    dev = await open_dev().__aenter__()
    buf = dev.malloc(64, pool=False)
    module = dev.load_module(None)
    took: list[float] = []
    with SlowLoads(dev) as loads:
        scope = anyio.CancelScope()

        async def load() -> None:
            with scope, pytest.raises(aa.ClosedError):
                await dev.aload_module(None)

        async def close_for_good() -> None:
            await dev.aclose()  # (no timeout: the next close's bounds both)

        async with anyio.create_task_group() as tg:
            tg.start_soon(load)
            await loads.wait_started()
            tg.start_soon(close_for_good)
            await anyio.sleep(0.05)
            start = time.monotonic()
            await dev.aclose(timeout=0.1)  # the timeout, then the grace of a stuck call (2 s)
            took.append(time.monotonic() - start)
            assert not dev.runtime._closed  # type: ignore[attr-defined]  # (the load runs)
            buf.free()  # nothing to do: as after any close
            module.close()
            if cancel:
                scope.cancel()
            loads.release()
    assert took[0] < 8  # (the load was held for 10 s)
    assert [r.getMessage() for r in caplog.records if "aio_ascend-load" in r.getMessage()]
    await reaches(lambda: dev.runtime._closed, True)  # type: ignore[attr-defined]
    await reaches(lambda: [t for t in threading.enumerate() if "aio_ascend" in t.name], [])
    buf.free()
    module.close()
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == []  # no unload, no free under or after the runtime's close
    caplog.clear()


@pytest.mark.backends("acl")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (a race between threads: any loop)
async def test_unloads_on_library_threads_keep_the_acl_records_of_live_modules(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture, anyio_backend: object
) -> None:
    """A closed module's binary is unloaded by the release of its last launch (the poller's
    thread, mostly) while the loop loads modules and looks kernels up: the acl runtime's
    records of the live ones stay whole (the unload's are taken first, under a lock: the
    runtime hands the handles out again once unloaded)."""
    caplog.set_level(logging.ERROR, logger="aio_ascend")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as they can come
    try:
        async with open_dev() as dev:
            runtime: Any = dev.runtime
            s = dev.stream()
            keep = [dev.load_module(None) for _ in range(300)]
            for module in keep:
                for name in ("noop", "axpy", "scale", "vector_add", "sleep"):
                    module.function(name)
            tasks = []
            for i in range(300):
                module = dev.load_module(None)
                tasks.append(await s.launch(module.function("noop"), 1))
                module.close()  # unloaded once that launch is done
                await anyio.lowlevel.checkpoint()
                for _ in range(6):
                    fresh = dev.load_module(None)
                    fresh.function("noop")
                    keep.append(fresh)
                if i % 25 == 0:
                    for task in tasks:
                        await task
                    tasks.clear()
            for task in tasks:
                await task
            await anyio.sleep(0.05)
            assert [m for m in keep if m.handle not in runtime._binaries] == []
            lost = [
                f
                for m in keep
                for f in m._functions.values()
                if runtime._function_binary.get(f.handle) != m.handle
            ]
            assert lost == []
            assert [r.getMessage() for r in caplog.records] == []
    finally:
        sys.setswitchinterval(switch)
