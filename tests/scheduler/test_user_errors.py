"""What a user's mistake gets: a typed error at the call, before anything reaches the runtime,
with nothing lost and the device still healthy (wrong kernel arguments, calls from another
thread, odd but valid integer types, sizes no device can have, calls after close).

On the sim, the acl C double and the cuda backend over its fake driver where the backend
matters, on asyncio, uvloop and trio.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import open_backend

import aio_ascend as aa
from aio_ascend import testing
from aio_ascend.sim import KernelContext, KernelLibrary

pytestmark = pytest.mark.anyio

BACKENDS = ("sim", "acl", "cuda-fake", "realrt")


WRONG_ARGS: dict[str, Callable[[], aa.HostArgs]] = {
    "vector_add": lambda: aa.HostArgs().u32(3),
    "axpy": lambda: aa.HostArgs().ptr(0).ptr(0).u32(1).u32(1).u32(1),
    "scale": lambda: aa.HostArgs().ptr(0).ptr(0),
    "matmul": lambda: aa.HostArgs().ptr(0).ptr(0).ptr(0).u32(1),
    "sleep": lambda: aa.HostArgs().u64(1000),
    "fault": lambda: aa.HostArgs(),
    "hang": lambda: aa.HostArgs().u32(1),
    "noop": lambda: aa.HostArgs().ptr(0),
}


@pytest.mark.parametrize("kernel", sorted(WRONG_ARGS))
async def test_wrong_args_for_a_builtin_kernel_fail_at_the_call_and_the_device_stays_healthy(
    kernel: str, anyio_backend: object
) -> None:
    async with open_backend("sim") as dev:
        s, other = dev.stream(), dev.stream()
        with pytest.raises(ValueError, match=rf"kernel {kernel!r}.*parameter"):
            await s.launch(dev.function(kernel), 1, WRONG_ARGS[kernel]())
        assert s.in_flight == 0
        await other.run(dev.function("noop"), 1)  # another stream is unharmed
        await s.run(dev.function("sleep"), 1, aa.HostArgs().u32(10))  # so is this one
        assert dev.fault is None


async def test_wrong_args_on_another_backend_fail_at_the_call_too(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s, other = dev.stream(), dev.stream()
        x = dev.malloc(64)
        with pytest.raises(ValueError, match="vector_add"):
            await s.launch(dev.function("vector_add"), 1, aa.HostArgs().ptr(x).u32(4))
        await other.run(dev.function("noop"), 1)
        assert dev.fault is None


def test_cuda_builtins_declare_the_same_parameters_as_the_sim() -> None:
    from aio_ascend._runtime.cuda.kernels import BUILTIN_INFO
    from aio_ascend._runtime.sim.kernels import BUILTIN_LIBRARY

    sim = BUILTIN_LIBRARY.snapshot()
    assert set(sim) == set(BUILTIN_INFO)
    for name, spec in sim.items():
        assert spec.info.params == BUILTIN_INFO[name].params, name


async def test_a_users_sim_kernel_may_declare_its_parameters(anyio_backend: object) -> None:
    lib = KernelLibrary("mine")

    @lib.kernel("fill", params=("ptr", "u32", "f32"))
    def fill(ctx: KernelContext) -> None:
        ctx.array(ctx.ptr(0), ctx.u32(8), np.float32)[:] = ctx.f32(12)

    lib.add("loose", fill)  # declares nothing: any HostArgs is launched

    async with open_backend("sim") as dev:
        s = dev.stream()
        module = dev.load_module(lib)
        buf = dev.malloc(16)
        with pytest.raises(ValueError, match=r"'fill'.*argument 2 is 8 byte"):
            await s.launch(module.function("fill"), 1, aa.HostArgs().ptr(buf).u32(4).f64(1.0))
        await s.run(module.function("fill"), 1, aa.HostArgs().ptr(buf).u32(4).f32(2.5))
        assert (await s.download(buf, np.float32)).tolist() == [2.5] * 4
        await s.run(module.function("loose"), 1, aa.HostArgs().ptr(buf).u32(4).f32(1.0))
        assert dev.fault is None


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ("ptr", TypeError),
        ([1.5], TypeError),
        ([True], TypeError),
        (["pointer"], ValueError),
        ([0], ValueError),
        (7, TypeError),
    ],
)
def test_a_bad_declaration_is_refused_when_made(params: Any, error: type[Exception]) -> None:
    lib = KernelLibrary()
    with pytest.raises(error, match="kernel 'k'"):
        lib.add("k", lambda ctx: None, params=params)
    assert "k" not in lib


# --- the device's calls belong to its event loop's thread -------------------------------------


def _other_thread_calls(
    dev: aa.Device, buf: aa.DeviceBuffer, event: aa.Event, module: Any, graph: Any
) -> dict[str, Callable[[], object]]:
    """Every synchronous call the loop-thread rule covers, ready to make from another thread."""
    return {
        "malloc": lambda: dev.malloc(64),
        "free": buf.free,
        "wrap": lambda: dev.wrap(buf.ptr, 8),
        "load_module": lambda: dev.load_module(None),
        "function": lambda: dev.function("noop"),
        "module.function": lambda: module.function("noop"),
        "info": lambda: dev.info,
        "stream": dev.stream,
        "stream(priority=)": lambda: dev.stream(priority=0),
        "event.query": event.query,
        "event.elapsed_ms": lambda: event.elapsed_ms(event),
        "graph.close": graph.close,
    }


CALLS = [
    "malloc",
    "free",
    "wrap",
    "load_module",
    "function",
    "module.function",
    "info",
    "stream",
    "stream(priority=)",
    "event.query",
    "event.elapsed_ms",
    "graph.close",
]


@pytest.mark.parametrize("call", CALLS)
async def test_a_call_from_another_thread_raises_runtime_error_and_changes_nothing(
    call: str, anyio_backend: object
) -> None:
    import anyio

    async with open_backend("sim") as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        event = await s.record_event(timing=True)
        await event
        module = dev.load_module(None)
        async with s.capture() as capture:
            capture.memset(buf, 0)
        graph = capture.graph
        keys = ("streams", "device_buffers", "graphs", "in_flight", "launches", "copies")
        before = {key: dev.stats()[key] for key in keys}
        fn = _other_thread_calls(dev, buf, event, module, graph)[call]
        with pytest.raises(aa.WrongLoopError, match="different event loop \\(or thread\\)"):
            await anyio.to_thread.run_sync(fn)  # (a ValueError and a RuntimeError)
        assert {key: dev.stats()[key] for key in keys} == before
        assert not buf.freed and not graph.closed
        fn()  # the same call on the loop thread works
        await s.run(dev.function("noop"), 1)


async def test_the_documented_readers_work_from_another_thread(anyio_backend: object) -> None:
    """What the Device docstring and the cancellation guide list as readable from any thread
    (a metrics collector's reads) answers there, with the values the loop sees."""
    import anyio

    async with open_backend("sim") as dev:
        buf = dev.malloc(4096)

        def read() -> tuple[object, ...]:
            return (
                dict(dev.stats()),
                dict(dev.memory_stats()),
                dev.fault,
                dev.closed,
                buf[1024:2048].nbytes,
            )

        stats, memory, fault, closed, sliced = await anyio.to_thread.run_sync(read)
        assert stats["device_buffers"] == dev.stats()["device_buffers"] == 1
        assert memory["allocated_bytes"] == dev.memory_stats()["allocated_bytes"] >= 4096
        assert fault is None and closed is False and sliced == 1024
        buf.free()


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_stream_aclose_from_another_event_loop_raises_and_changes_nothing(
    busy: bool, anyio_backend: object
) -> None:
    # It destroyed an idle stream from the foreign thread, and marked a busy one closed
    # before refusing (its owner's next launch got ClosedError)
    import asyncio

    import anyio

    async with open_backend("sim") as dev:
        s = dev.stream()
        streams = dev.stats()["streams"]
        with testing.paused(dev) if busy else contextlib.nullcontext():
            if busy:
                await s.launch(dev.function("noop"), 1)
            with pytest.raises(RuntimeError, match="different event loop \\(or thread\\)"):
                await anyio.to_thread.run_sync(lambda: asyncio.run(s.aclose()))
        assert not s.closed and dev.stats()["streams"] == streams
        await s.run(dev.function("noop"), 1)  # the owner's stream works on
        await s.aclose()
        assert s.closed
        await anyio.to_thread.run_sync(lambda: asyncio.run(s.aclose()))  # gone: nothing to do


async def test_stats_and_state_may_be_read_from_any_thread(anyio_backend: object) -> None:
    """What metrics collectors read (stats, fault, closed) is not bound to the loop."""
    import anyio

    async with open_backend("sim") as dev:
        stats = await anyio.to_thread.run_sync(dev.stats)
        assert stats["in_flight"] == 0
        assert await anyio.to_thread.run_sync(lambda: (dev.fault, dev.closed)) == (None, False)


# --- paper cuts ---------------------------------------------------------------------------------


def test_tracing_record_checks_its_path_before_the_block_runs(tmp_path: Any) -> None:
    from aio_ascend import tracing

    ran = []
    with pytest.raises(FileNotFoundError), tracing.record(tmp_path / "missing" / "t.json"):
        ran.append(True)
    assert not ran
    with pytest.raises(IsADirectoryError), tracing.record(tmp_path):
        ran.append(True)
    assert not ran


def test_tracing_record_never_masks_the_blocks_exception(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    from aio_ascend import tracing

    folder = tmp_path / "traces"
    folder.mkdir()

    def app() -> None:
        with tracing.record(folder / "t.json"):
            shutil.rmtree(folder)  # the trace cannot be written at the end any more
            raise KeyError("the app's own")

    with pytest.raises(KeyError, match="the app's own") as info:
        app()
    assert any("could not write the trace" in note for note in info.value.__notes__)
    assert "could not write the trace" in caplog.text


def test_rough_inputs_get_clear_typed_errors_in_the_call(tmp_path: Any) -> None:
    import decimal

    with pytest.raises(TypeError, match=r"unknown LaunchConfig field.*1"):
        aa.LaunchConfig.coerce({1: 2, "x": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="runtime_options must be a mapping"):
        aa.device_count("sim", runtime_options=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"device_id must be an int in 0\.\."):
        aa.open_device(2**31)
    for value in (np.longdouble("1e4000"),):
        with pytest.raises(ValueError, match="does not fit"):
            aa.HostArgs().f64(value)
    with pytest.raises(TypeError, match="real number"):
        aa.HostArgs().f32(decimal.Decimal("1e400"))  # type: ignore[arg-type]
    assert aa.HostArgs().f64(np.longdouble("inf")).pack().nbytes == 8  # inf is inf


async def test_rough_inputs_of_an_open_device(anyio_backend: object) -> None:
    async with open_backend("sim") as dev:
        buf = dev.malloc(64)
        s = dev.stream()
        for dtype in ("M8", "m8", np.dtype("M8")):
            with pytest.raises(TypeError, match="needs a unit"):
                await s.download(buf, dtype)
            with pytest.raises(TypeError, match="needs a unit"):
                dev.pinned_empty(4, dtype)
        assert (await s.download(buf, "M8[ns]")).dtype == np.dtype("M8[ns]")
        with pytest.raises(ValueError, match="the path is empty"):
            dev.load_module("")
        with pytest.raises(ValueError, match="holds a NUL"):
            dev.load_module("/tmp/kernels\0.o")
        module = dev.load_module(KernelLibrary())
        # kernel names: one check (UTF-8, not empty, no NUL) for the lookup and the sim's library
        for name in ("", "no\0op", "noop\ud800"):
            with pytest.raises(ValueError, match="not a valid kernel name"):
                module.function(name)
            with pytest.raises(ValueError, match="not a valid kernel name"):
                dev.function(name)
            with pytest.raises(ValueError, match="not a valid kernel name"):
                KernelLibrary().add(name, lambda ctx: None)
        with pytest.raises(TypeError, match="must be a str"):
            module.function(b"noop")  # type: ignore[arg-type]
        assert dev.stats()["in_flight"] == 0


@pytest.mark.parametrize("setter", ["raw", "placeholder"])
@pytest.mark.parametrize(
    "array",
    [np.array([1, "x"], dtype=object), np.zeros(2, dtype=[("a", "i4"), ("b", object)])],
    ids=["object", "struct-with-object"],
)
def test_hostargs_refuses_arrays_of_python_objects(setter: str, array: Any) -> None:
    args = aa.HostArgs().u32(1)
    with pytest.raises(TypeError, match=f"HostArgs.{setter}.*Python objects"):
        getattr(args, setter)(array)
    assert args.pack().nbytes == 8  # unchanged


async def test_numpy_integers_are_integers_and_bools_are_not(anyio_backend: object) -> None:
    async with open_backend("sim") as dev:
        buf = dev.malloc(np.int64(64))
        assert buf.nbytes == 64 and type(buf.nbytes) is int
        wrapped = dev.wrap(np.uint64(buf.ptr), np.int32(16))
        assert (wrapped.ptr, wrapped.nbytes) == (buf.ptr, 16)
        least = dev.info["stream_priority_least"]
        assert isinstance(least, int)
        s = dev.stream(priority=np.int16(least), max_in_flight=np.int64(8))
        await s.run(dev.function("noop"), 1)
        noop = dev.function("noop")
        await s.run(noop, np.int64(2))  # (a block count worked out with numpy: refused before)
        assert noop.launch_specs.keys() == {1, 2}
        assert all(type(blocks) is int for blocks in noop.launch_specs)
        plan = s.plan(noop, np.int32(3))
        assert plan.blocks == 3 and type(plan.blocks) is int
        await plan.run()
        plan.close()
        # the same rule for every size, field, id and shape (some refused numpy's integers,
        # some took a bool)
        other = dev.malloc(64)
        await s.memset(buf, 7, nbytes=np.int64(16))
        await s.copy_device(other, buf, nbytes=np.uint32(16))
        assert (await s.download(other[: np.int8(16)], np.uint8)).tolist() == [7] * 16
        assert (await s.download(buf, np.uint8, shape=np.int64(4))).shape == (4,)
        assert buf[np.int64(8) : 16 : np.int64(1)].nbytes == 8
        config = aa.LaunchConfig(block_dim_offset=np.uint16(0))
        await s.run(noop, 1, config=config)
        packed = aa.HostArgs(max_nbytes=np.int64(64)).raw(b"abcd", align=np.int64(8)).pack()
        assert packed.nbytes == 8
        async with aa.open_device(np.int64(0), backend="sim", task_timeout=np.float32(5)):
            pass
        await s.aclose(timeout=np.float32(1))
        s = dev.stream()
        for call in (
            lambda: dev.malloc(True),
            lambda: dev.wrap(buf.ptr, np.bool_(True)),
            lambda: dev.stream(priority=False),
            lambda: dev.stream(max_in_flight=np.float64(2.0)),
            lambda: s.plan(noop, np.bool_(True)),
            lambda: s.plan(noop, True),
            lambda: buf[True:8],
            lambda: buf[0:8:True],
            lambda: buf[0:8:1.0],
            lambda: dev.pinned_empty(True, np.float32),
            lambda: aa.LaunchConfig(block_dim_offset=True),
            lambda: aa.HostArgs().raw(b"ab", align=True),
            lambda: aa.HostArgs(max_nbytes=np.bool_(True)),
        ):
            with pytest.raises(TypeError, match="an int"):
                call()
        for coroutine in (
            lambda: s.memset(buf, 0, nbytes=True),
            lambda: s.download(buf, np.uint8, shape=(True, 2)),
        ):
            with pytest.raises(TypeError, match="an int"):
                await coroutine()
        await s.run(noop, 1)  # nothing of those reached the stream
        assert dev.stats()["in_flight"] == 0
        # seconds past a float's range: as long as infinity (an OverflowError escaped)
        with pytest.raises(ValueError, match="finite"):
            await aa.open_device(0, backend="sim", task_timeout=10**400)
        with pytest.raises(ValueError, match="must be None or >= 0"):
            await s.aclose(timeout=-(10**400))
        await s.aclose(timeout=10**400)  # (an unbounded wait: idle, so at once)


async def test_malloc_beyond_the_address_space_is_refused_before_the_runtime(
    anyio_backend: object,
) -> None:
    async with open_backend("sim") as dev:
        calls = []
        dev.runtime.malloc = lambda *a: calls.append(a)  # type: ignore[method-assign]
        for nbytes in (2**64, 2**100):
            with pytest.raises(ValueError, match="64-bit device address space"):
                dev.malloc(nbytes)
        assert calls == []


async def test_swapped_copy_arguments_get_a_message_that_says_so(anyio_backend: object) -> None:
    async with open_backend("sim") as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        array = np.zeros(16, np.float32)
        with pytest.raises(TypeError, match=r"download\(buf, out=array\)"):
            await s.download(array, buf)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="swap them"):
            await s.upload(array, buf)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="swap them"):
            await s.copy_to_host(buf, array)  # type: ignore[arg-type]
        assert s.in_flight == 0


@pytest.mark.parametrize(
    ("backend", "options", "error", "text"),
    [
        ("sim", {"bogus": 1}, TypeError, "no option 'bogus'.*time_model, max_queue_depth"),
        ("sim", {"max_queue_depth": "8"}, TypeError, "'max_queue_depth'.*must be int, got str"),
        ("sim", {"time_model": "yes"}, TypeError, "'time_model'.*must be bool"),
        ("sim", {"max_queue_depth": 1}, ValueError, "at least 2 runtime queue entries"),
        ("acl", {"library_path": 5}, TypeError, "'library_path'.*str"),
        ("acl", {"stream_capacity": 1}, ValueError, "at least 2 runtime queue entries"),
        ("acl", {"bogus": 1}, TypeError, "library_path, stream_capacity"),
        # ranges too (they passed the call and failed at await, on the opener thread)
        ("sim", {"memory_bytes": 0}, ValueError, "memory_bytes=0 must be >= 1"),
        ("sim", {"memory_bytes": -1}, ValueError, "memory_bytes=-1 must be >= 1"),
        ("acl", {"stream_capacity": 2**40}, ValueError, "stream_capacity=.* out of range"),
        ("acl", {"exception_callback": 1}, TypeError, "exception_callback"),
        ("cuda", {"block_dim": 0}, ValueError, "block_dim=0"),
        ("cuda", {"staging_bytes": 1}, ValueError, "staging_bytes=1"),
        # "auto": an option no backend has, in the call; the rest once the backend is chosen
        ("auto", {"bogus": 1}, TypeError, "no backend has an option 'bogus'"),
    ],
)
def test_runtime_options_are_checked_in_the_open_device_call(
    backend: str, options: dict[str, Any], error: type[Exception], text: str
) -> None:
    # no event loop and no await: the call itself refuses them, before any runtime opens
    with pytest.raises(error, match=text):
        aa.open_device(0, backend=backend, runtime_options=options)


@pytest.mark.parametrize(
    ("device_id", "error"),
    [("0", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError), (-1, ValueError)],
)
def test_a_bad_device_id_is_refused_in_the_open_device_call(
    device_id: Any, error: type[Exception]
) -> None:
    # typed, in the call (a str id was a ValueError, and only once the device was opened)
    with pytest.raises(error, match="device_id"):
        aa.open_device(device_id)


async def test_a_bad_runtime_option_with_auto_fails_before_the_runtime_opens(
    anyio_backend: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIO_ASCEND_BACKEND", "sim")
    opened = []
    monkeypatch.setattr(aa._device, "open_runtime", lambda *a, **k: opened.append(a))
    with pytest.raises(TypeError, match="no backend has an option 'bogus'"):
        await aa.open_device(0, runtime_options={"bogus": 1})
    assert opened == []
    # an option of another backend's: known (so not refused in the call), wrong for the sim
    opener = aa.open_device(0, runtime_options={"stream_capacity": 64})
    with pytest.raises(TypeError, match="sim backend has no option 'stream_capacity'"):
        await opener
    assert opened == []


# --- every public call after close ----------------------------------------------------------------


class _Closed:
    """A device closed after one of everything was made (a stream, buffers, an event, a module,
    a graph, a capture entered and one not)."""

    dev: aa.Device
    s: aa.Stream
    s2: aa.Stream
    buf: aa.DeviceBuffer
    other: aa.DeviceBuffer
    event: aa.Event
    module: aa.Module
    fn: aa.Function
    graph: aa.Graph
    capture: Any
    recording: Any
    plan: aa.LaunchPlan

    @classmethod
    async def make(cls, backend: str) -> _Closed:
        c = cls()
        c.dev = dev = await open_backend(backend)
        c.s, c.s2 = dev.stream(), dev.stream()
        c.buf, c.other = dev.malloc(64), dev.malloc(64)
        c.event = await c.s.record_event(timing=True)
        await c.event
        c.module = dev.load_module(None)
        c.fn = c.module.function("noop")
        async with c.s.capture() as capture:
            capture.memset(c.buf, 0)
        c.graph = capture.graph
        c.capture = c.s.capture()
        c.recording = c.s.capture()
        await c.recording.__aenter__()
        c.plan = c.s.plan(c.fn, 1)
        await dev.aclose()
        return c


def _host() -> Any:
    return np.zeros(8, np.uint8)


#: every public call that needs the open device: ClosedError after close
AFTER_CLOSE: dict[str, Callable[[_Closed], object]] = {
    "Device.__aenter__": lambda c: c.dev.__aenter__(),
    "Device.external_event": lambda c: c.dev.external_event(0x1234),
    "Device.external_stream": lambda c: c.dev.external_stream(0x1234),
    "Device.function": lambda c: c.dev.function("noop"),
    "Device.info": lambda c: c.dev.info,
    "Device.load_module": lambda c: c.dev.load_module(None),
    "Device.aload_module": lambda c: c.dev.aload_module(None),
    "Device.malloc": lambda c: c.dev.malloc(64),
    "Device.pinned_empty": lambda c: c.dev.pinned_empty(8, np.uint8),
    "Device.pinned_like": lambda c: c.dev.pinned_like(_host()),
    "Device.malloc(pool=False)": lambda c: c.dev.malloc(64, pool=False),
    "Device.empty_cache": lambda c: c.dev.empty_cache(),
    "Device.stream": lambda c: c.dev.stream(),
    "Device.stream(priority)": lambda c: c.dev.stream(priority=0),
    "Device.wrap": lambda c: c.dev.wrap(c.buf.ptr, 8),
    "Stream.__aenter__": lambda c: c.s.__aenter__(),
    "Stream.capture": lambda c: c.s.capture(),
    "Stream.copy_device": lambda c: c.s.copy_device(c.other, c.buf),
    "Stream.copy_to_device": lambda c: c.s.copy_to_device(c.buf, _host()),
    "Stream.copy_to_host": lambda c: c.s.copy_to_host(_host(), c.buf),
    "Stream.download": lambda c: c.s.download(c.buf),
    "Stream.launch": lambda c: c.s.launch(c.fn, 1),
    "Stream.launch_graph": lambda c: c.s.launch_graph(c.graph),
    "Stream.memset": lambda c: c.s.memset(c.buf, 0),
    "Stream.plan": lambda c: c.s.plan(c.fn, 1),
    "Stream.record_event": lambda c: c.s.record_event(),
    "Stream.run": lambda c: c.s.run(c.fn, 1),
    "Stream.run_graph": lambda c: c.s.run_graph(c.graph),
    "Stream.upload": lambda c: c.s.upload(c.buf, _host()),
    "Stream.wait_event": lambda c: c.s.wait_event(c.event),
    "Stream.wait_stream": lambda c: c.s.wait_stream(c.s2),
    "Stream.launch_host_func": lambda c: c.s.launch_host_func(lambda: None),
    # (returning would read as success, also for work a forced close failed)
    "Device.synchronize": lambda c: c.dev.synchronize(),
    "Stream.synchronize": lambda c: c.s.synchronize(),
    "GraphCapture.__aenter__": lambda c: c.capture.__aenter__(),
    "GraphCapture.copy_device": lambda c: c.recording.copy_device(c.other, c.buf),
    "GraphCapture.copy_to_device": lambda c: c.recording.copy_to_device(c.buf, _host()),
    "GraphCapture.launch": lambda c: c.recording.launch(c.fn, 1),
    "GraphCapture.memset": lambda c: c.recording.memset(c.buf, 0),
    "DeviceBuffer.__getitem__": lambda c: c.buf[0:8],
    "Event.elapsed_ms": lambda c: c.event.elapsed_ms(c.event),
    "Module.function": lambda c: c.module.function("noop"),
    "LaunchPlan.__aenter__": lambda c: c.plan.__aenter__(),
    "LaunchPlan.launch": lambda c: c.plan.launch(),
    "LaunchPlan.run": lambda c: c.plan.run(),
}

#: public calls that keep working after close, and why
STILL_ANSWER = {
    "Device.aclose": "idempotent: a second close returns at once",
    "Stream.aclose": "idempotent",
    "DeviceBuffer.free": "idempotent cleanup (the close released the memory)",
    "Graph.close": "idempotent cleanup (the close destroyed the graph)",
    "LaunchPlan.close": "idempotent cleanup (the close released what it held)",
    "LaunchPlan.closed": "state",
    "Module.close": "idempotent cleanup (the close unloaded the binary)",
    "Module.closed": "state",
    "Device.stats": "a read of counters (metrics collectors read it at any time)",
    "Device.memory_stats": "a read of counters (all zero but the totals after the close)",
    "Device.closed": "state",
    "Device.fault": "state",
    "Device.runtime": "the runtime object (closed), for diagnostics",
    "Stream.closed": "state",
    "Stream.in_flight": "state",
    "Stream.query": "state: what was queued before the close has finished or failed",
    "DeviceBuffer.base": "state",
    "DeviceBuffer.root": "state",
    "DeviceBuffer.freed": "state",
    "Graph.closed": "state",
    "Graph.record": "state",
    "Event.__await__": "the recorded work's outcome, known before the close",
    "Event.done": "the recorded work's outcome, known before the close",
    "Event.failure": "the recorded work's outcome, known before the close",
    "Event.query": "the recorded work's outcome, known before the close",
    "Event.recorded": "state: whether the record reached the runtime",
    "DeviceBuffer.uses": "state: queued requests still using it (none after the close)",
}


def _public_calls() -> set[str]:
    from aio_ascend._stream import GraphCapture

    names = set()
    classes = (aa.Device, aa.Stream, GraphCapture, aa.DeviceBuffer, aa.Event, aa.Module, aa.Graph)
    for cls in (*classes, aa.LaunchPlan):
        for klass in cls.__mro__[:-1]:
            for name, value in vars(klass).items():
                if name.startswith("_") and name not in ("__aenter__", "__getitem__", "__await__"):
                    continue
                if callable(value) or isinstance(value, property):
                    names.add(f"{cls.__name__}.{name}")
    return names


def test_every_public_call_is_covered_after_close() -> None:
    covered = {name.partition("(")[0] for name in AFTER_CLOSE} | set(STILL_ANSWER)
    assert _public_calls() - covered == set()


@pytest.mark.backends("sim", "acl")
@pytest.mark.parametrize("call", sorted(AFTER_CLOSE))
async def test_every_public_call_after_close_raises_closed_error(
    call: str, device_backend: str, anyio_backend: object
) -> None:
    import inspect

    c = await _Closed.make(device_backend)

    async def make_the_call() -> None:
        result = AFTER_CLOSE[call](c)
        if inspect.isawaitable(result):
            await result

    # The same words on every backend: the device's close comes first (it closed the
    # streams too); a stream's own enter speaks of the stream.
    words = "stream is closed" if call == "Stream.__aenter__" else "the device is closed"
    with pytest.raises(aa.ClosedError, match=words):
        await make_the_call()


#: the calls on a stream that need it open (its device staying open)
ON_A_CLOSED_STREAM: dict[str, Callable[[_Closed], object]] = {
    name: call for name, call in AFTER_CLOSE.items() if name.startswith("Stream.")
}


@pytest.mark.backends("sim", "acl")
@pytest.mark.parametrize("call", sorted(ON_A_CLOSED_STREAM))
async def test_a_closed_stream_refuses_every_call_that_needs_it_open(
    call: str, device_backend: str, anyio_backend: object
) -> None:
    """Each says "the stream is closed", its device still open (one rule for all of them:
    ``check_usable(lane)``), and the device keeps working."""
    import inspect

    async with await open_backend(device_backend) as dev:
        c = _Closed()
        c.dev = dev
        c.s, c.s2 = dev.stream(), dev.stream()
        c.buf, c.other = dev.malloc(64), dev.malloc(64)
        c.event = await c.s2.record_event()
        c.fn = dev.function("noop")
        async with c.s2.capture() as capture:
            capture.memset(c.buf, 0)
        c.graph = capture.graph
        await c.s.aclose()

        async def make_the_call() -> None:
            result = ON_A_CLOSED_STREAM[call](c)
            if inspect.isawaitable(result):
                await result

        with pytest.raises(aa.ClosedError, match="stream is closed"):
            await make_the_call()
        await c.s2.run(c.fn, 1)


async def test_the_calls_that_still_answer_after_close(anyio_backend: object) -> None:
    c = await _Closed.make("sim")
    await c.dev.aclose()
    await c.s.aclose()
    c.buf.free()
    c.graph.close()
    assert c.dev.closed and c.s.closed and c.graph.closed and c.buf.freed
    assert c.event.query() and c.event.done() and c.event.failure() is None
    await c.event
    assert c.dev.stats()["in_flight"] == 0


# --- the faults guide's recovery recipe ---------------------------------------------------------


def _recipe() -> Any:
    """The ``ReopeningDevice`` class of docs/guide/faults.md, as the page shows it."""
    import pathlib
    import re

    page = pathlib.Path(__file__).parents[2] / "docs" / "guide" / "faults.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    (source,) = [block for block in blocks if "class ReopeningDevice" in block]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(page), "exec"), namespace)
    return namespace["ReopeningDevice"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_recovery_recipe_replaces_a_faulted_device_once(anyio_backend: object) -> None:
    import anyio

    from aio_ascend import testing

    holder = _recipe()(backend="sim")
    dev = await holder.device()
    assert await holder.device() is dev
    s, other = dev.stream(), dev.stream()
    with testing.paused(dev):
        fault = await testing.inject_fault(s)
        in_flight = await other.launch(dev.function("sleep"), 1, aa.HostArgs().u32(10))
    for task in (fault, in_flight):
        with pytest.raises(aa.DeviceFaultError):
            await task
    assert dev.fault is not None

    got: list[aa.Device] = []

    async def request() -> None:
        got.append(await holder.device())

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(request)
    new = got[0]
    assert all(d is new for d in got) and new is not dev and holder.reopened == 1
    assert dev.closed and new.fault is None
    with pytest.raises(aa.ClosedError):
        await s.run(dev.function("noop"), 1)
    await new.stream().run(new.function("noop"), 1)
    await holder.aclose()
    assert new.closed


async def test_a_max_in_flight_above_the_runtime_queue_is_bounded_by_the_entry_budget(
    anyio_backend: object,
) -> None:
    # max_in_flight above 2000 was refused; the stream's entry budget (below its runtime
    # queue's capacity) is what keeps the queue from filling, whatever max_in_flight is.
    async with aa.open_device(0, backend="sim", runtime_options={"max_queue_depth": 16}) as dev:
        s = dev.stream(max_in_flight=100_000)
        assert s.max_in_flight == 100_000
        sleep = dev.function("sleep")
        tasks = [await s.launch(sleep, 1, aa.HostArgs().u32(200)) for _ in range(64)]
        assert dev.stats()["peak_in_flight"] < 16
        for task in tasks:
            await task
    for bad in (0, (1 << 20) + 1):
        with pytest.raises(ValueError, match="max_in_flight"):
            dev.stream(max_in_flight=bad)


async def test_objects_that_stand_for_a_runtime_resource_are_never_copied_or_pickled() -> None:
    """A copy would name the same handle without its bookkeeping (a buffer freed twice; an
    Event that outlives its handle, which the runtime then reuses); a deep copy or a pickle
    would drag the loop and the threads along. Each refuses with a TypeError; nothing changes."""
    import copy
    import pickle

    async with open_backend("sim") as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        task = await s.memset(buf, 3)
        event = await s.record_event()
        plan = s.plan(dev.function("noop"), 1)
        module = dev.load_module(KernelLibrary())
        objects = [dev, s, buf, buf[0:32], task, event, plan, module]
        for obj in objects:
            for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(TypeError, match=r"cannot be (copied|pickled)"):
                    attempt(obj)
        await task
        plan.close()
        assert (await s.download(buf) == 3).all()
