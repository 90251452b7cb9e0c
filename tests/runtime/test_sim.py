"""Behaviour specific to the ``sim`` backend: address space, time model, test controls,
user kernels, resource accounting, shutdown."""

from __future__ import annotations

import array
import itertools
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from helpers import SYNC_MS

from aio_ascend._errors import (
    AICoreExceptionError,
    ContextNullError,
    DeviceFaultError,
    InvalidHandleError,
    InvalidParamError,
    RuntimeAPIError,
    StreamAbortError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime import Runtime, open_runtime
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from aio_ascend._runtime.hostmem import host_view
from aio_ascend._runtime.sim.memory import DEVICE_BASE, POISON_BYTE
from aio_ascend.sim import (
    BUILTIN_KERNELS,
    KernelContext,
    KernelLibrary,
    SimRuntime,
    open_sim_runtime,
)

F32 = np.float32

if TYPE_CHECKING:
    from conftest import RuntimeKit


@pytest.fixture
def rt() -> Iterator[SimRuntime]:
    runtime = open_sim_runtime(0)
    try:
        yield runtime
    finally:
        runtime.close()


def sim_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aio_ascend-sim-")]


# --- opening, exports, shutdown ---------------------------------------------------------------


def test_exports_and_registry() -> None:
    import aio_ascend.sim as sim

    assert isinstance(sim.__all__, tuple)
    assert set(sim.__all__) == {
        "BUILTIN_KERNELS",
        "KernelContext",
        "KernelLibrary",
        "SimRuntime",
        "open_sim_runtime",
    }
    assert set(BUILTIN_KERNELS) == {
        "vector_add",
        "axpy",
        "scale",
        "matmul",
        "sleep",
        "fault",
        "hang",
        "noop",
    }
    runtime = open_runtime("sim", 3)
    try:
        assert isinstance(runtime, SimRuntime)
        assert isinstance(runtime, Runtime)
        assert (runtime.name, runtime.device_id) == ("sim", 3)
        assert runtime._thread.name == "aio_ascend-sim-3"
        assert runtime._thread.daemon
        runtime.create_stream()  # the opener's thread is bound already
    finally:
        runtime.close()


def test_close_joins_the_device_thread_and_is_final(make_kit: Callable[..., RuntimeKit]) -> None:
    runtime = open_sim_runtime(7)
    h = make_kit(runtime)
    h.launch("hang", HostArgs())
    h.launch("sleep", HostArgs().u32(5_000_000), runtime.create_stream())
    assert any(t.name == "aio_ascend-sim-7" for t in sim_threads())
    started = time.monotonic()
    runtime.close()
    assert time.monotonic() - started < 2.0, "close must not wait for hung or sleeping work"
    assert not runtime._thread.is_alive()
    assert not sim_threads()
    runtime.close()  # idempotent
    with pytest.raises(ContextNullError):
        runtime.create_stream()
    with pytest.raises(ContextNullError):
        runtime.set_current_context()


def test_close_wakes_blocked_waiters(make_kit: Callable[..., RuntimeKit]) -> None:
    runtime = open_sim_runtime(0)
    h = make_kit(runtime)
    event = runtime.create_event(ACL_EVENT_SYNC)
    h.launch("hang", HostArgs())
    runtime.record_event(event, h.stream)
    errors: list[BaseException] = []

    def wait() -> None:
        runtime.set_current_context()
        try:
            runtime.synchronize_event(event, -1)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(0.1)
    assert thread.is_alive()
    runtime.close()
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], ContextNullError)


# --- address space ----------------------------------------------------------------------------


def test_device_addresses_are_high_aligned_and_disjoint(rt: SimRuntime) -> None:
    sizes = [1, 100, 4096, 10_000]
    ptrs = [rt.malloc(size) for size in sizes]
    assert all(ptr >= DEVICE_BASE and ptr % 64 == 0 for ptr in ptrs)
    spans = sorted(zip(ptrs, sizes, strict=True))
    for (a, size), (b, _) in itertools.pairwise(spans):
        assert a + size <= b
    with pytest.raises(InvalidParamError):
        rt.malloc(-1)
    with pytest.raises(InvalidParamError):
        rt.malloc_host(0)


def test_device_addresses_wrap_round_the_range_and_a_failed_malloc_takes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Addresses only ever went up: after 1 TiB of allocations in all (16k cycles of 64 MiB
    # with the pool emptied) every malloc failed with nothing allocated, and each failure
    # kept its size counted as used. Now a freed address comes back only once the
    # allocations have gone round the range (a stale pointer faults until then).
    from aio_ascend._runtime.sim import memory

    monkeypatch.setattr(memory, "DEVICE_LIMIT", DEVICE_BASE + (1 << 20))  # a 1 MiB range
    mem = memory.DeviceMemory(capacity=1 << 30)
    first = mem.malloc(64 << 10)
    assert first == DEVICE_BASE
    mem.free(first)
    second = mem.malloc(64 << 10)
    assert second > first  # not reused at once
    with pytest.raises(MemoryError, match="address space"):
        mem.malloc(2 << 20)  # larger than the range: refused...
    assert mem.used == 64 << 10  # ...and it takes nothing
    live: dict[int, int] = {second: 64 << 10}
    rng = np.random.default_rng(7)
    for _ in range(2_000):  # ~100x the range in all
        if live and (len(live) > 6 or rng.random() < 0.5):
            addr = int(rng.choice(list(live)))
            assert mem.free(addr)
            del live[addr]
        size = int(rng.integers(1, 96 << 10))
        addr = mem.malloc(size)
        assert addr % 64 == 0 and addr >= DEVICE_BASE and addr + size <= memory.DEVICE_LIMIT
        live[addr] = size
        spans = sorted(live.items())
        for (a, n), (b, _) in itertools.pairwise(spans):
            assert a + n <= b, (hex(a), n, hex(b))  # live allocations never overlap
        mem.view(addr, size, "check")[:] = 1
    assert mem.used == sum(live.values())


def test_out_of_bounds_kernel_access_is_an_mmu_fault(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    n = 16
    x = h.upload(np.ones(n, F32))
    y = h.upload(np.ones(n, F32))
    h.launch("axpy", HostArgs().ptr(x).ptr(y).f32(1.0).u32(n + 1))  # one element too many
    with pytest.raises(AICoreExceptionError) as info:
        rt.synchronize_stream(h.stream, SYNC_MS)
    assert info.value.code == 507015
    assert f"{x:#x}" in info.value.message
    assert "MMU fault" in info.value.message
    assert rt._fault is not None
    assert "MMU fault" in rt.get_recent_error_message()


def test_use_after_free_faults(rt: SimRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    h = make_kit(rt)
    n = 8
    x, y = h.upload(np.ones(n, F32)), h.upload(np.ones(n, F32))
    rt.free(x)
    h.launch("axpy", HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(h.stream, SYNC_MS)
    assert f"{x:#x}" in info.value.message


def test_copy_from_freed_device_memory_faults(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    src = h.upload(np.ones(16, F32))
    dst = rt.malloc(64)
    rt.free(src)
    rt.memcpy_async(dst, 64, src, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, h.stream)
    with pytest.raises(DeviceFaultError, match="memcpy source"):
        rt.synchronize_stream(h.stream, SYNC_MS)


def test_freed_pinned_memory_reads_as_poison(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    src = h.pinned(b"\x11" * 64)
    dst = rt.malloc(64)
    rt.pause()
    try:
        rt.memcpy_async(dst, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, h.stream)
        rt.free_host(src)  # a lifetime bug: wrong data, never a crash
    finally:
        rt.resume()
    assert h.download(dst, 64, np.uint8).tobytes() == bytes([POISON_BYTE]) * 64


def test_poison_device_fills_a_live_allocation_only(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    """The pool's poisoning of a block it takes back: the whole block reads 0xCD."""
    h = make_kit(rt)
    x = h.upload(np.arange(64, dtype=np.uint8))
    rt.poison_device(x)
    assert h.download(x, 64, np.uint8).tobytes() == bytes([POISON_BYTE]) * 64
    with pytest.raises(InvalidParamError, match="not a live allocation"):
        rt.poison_device(x + 64)
    rt.free(x)
    with pytest.raises(InvalidParamError, match="not a live allocation"):
        rt.poison_device(x)


def test_limit_device_bounds_accesses_to_the_request_in_a_larger_block(
    rt: SimRuntime,
    make_kit: Callable[..., RuntimeKit],
) -> None:
    """The pool's limit of a block to its request: copies and kernels reach the request
    only (past it: a fault); the poison and the free still cover the whole block."""
    h = make_kit(rt)
    free_before = rt.info()["memory_free"]
    x = h.upload(np.arange(256, dtype=np.uint8))
    rt.limit_device(x, 100)
    assert h.download(x, 100, np.uint8).tolist() == list(range(100))
    rt.poison_device(x)
    rt.limit_device(x, 256)
    assert h.download(x, 256, np.uint8).tobytes() == bytes([POISON_BYTE]) * 256
    rt.limit_device(x, 100)
    with pytest.raises(InvalidParamError, match="not a live allocation"):
        rt.limit_device(x + 64, 10)
    h.launch("vector_add", HostArgs().ptr(x).ptr(x).ptr(x).u32(26))  # 104 bytes
    with pytest.raises(DeviceFaultError, match=r"runs past the end .*\(100 bytes\)"):
        rt.synchronize_stream(h.stream, SYNC_MS)
    rt.free(x)
    assert rt.info()["memory_free"] == free_before


def test_internal_args_regions_are_not_user_allocations(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    n = 4
    x = h.upload(np.ones(n, F32))
    before = rt.live_resources()["device_allocations"]
    rt.pause()
    try:
        addr = h.launch("scale", HostArgs().ptr(x).ptr(x).placeholder(struct.pack("<If", n, 2.0)))
        slot = struct.unpack_from("<Q", bytes(host_view(addr, 24)), 16)[0]
        region = slot - 32
        assert region >= DEVICE_BASE
        assert rt.live_resources()["device_allocations"] == before
        with pytest.raises(InvalidParamError):
            rt.free(region)
    finally:
        rt.resume()
    np.testing.assert_array_equal(h.download(x, n), np.full(n, 2.0, F32))


def test_pinned_range_overrunning_its_allocation_is_rejected(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    src = rt.malloc_host(64)
    dst = rt.malloc(128)
    with pytest.raises(InvalidParamError, match="past the end"):
        rt.memcpy_async(dst, 128, src + 32, 64, ACL_MEMCPY_HOST_TO_DEVICE, h.stream)
    with pytest.raises(InvalidParamError, match="device address"):
        rt.memcpy_async(dst, 128, dst, 64, ACL_MEMCPY_HOST_TO_DEVICE, h.stream)


# --- streams, time model, test controls --------------------------------------------------------


def test_two_sleeping_streams_overlap(rt: SimRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    h = make_kit(rt)
    a, b = h.stream, rt.create_stream()
    started = time.perf_counter()
    h.launch("sleep", HostArgs().u32(250_000), a)
    h.launch("sleep", HostArgs().u32(250_000), b)
    rt.synchronize_stream(a, SYNC_MS)
    rt.synchronize_stream(b, SYNC_MS)
    elapsed = time.perf_counter() - started
    assert 0.24 <= elapsed < 0.45, elapsed  # ~ max (0.25 s), not the sum (0.5 s)


def test_sleeps_on_one_stream_add_up(rt: SimRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    h = make_kit(rt)
    started = time.perf_counter()
    h.launch("sleep", HostArgs().u32(100_000))
    h.launch("sleep", HostArgs().u32(100_000))
    rt.synchronize_stream(h.stream, SYNC_MS)
    assert time.perf_counter() - started >= 0.19


def test_time_model_charges_kernel_cost_and_streams_overlap(
    make_kit: Callable[..., RuntimeKit],
) -> None:
    lib = KernelLibrary("timed")

    @lib.kernel("work", cost=lambda ctx: ctx.u32(0) / 1e6)
    def work(ctx: KernelContext) -> None:
        pass

    timed = open_sim_runtime(0, time_model=True)
    try:
        h = make_kit(timed, library=lib)
        a, b = h.stream, timed.create_stream()
        start = timed.create_event(ACL_EVENT_TIME_LINE)
        end = timed.create_event(ACL_EVENT_TIME_LINE)
        began = time.perf_counter()
        timed.record_event(start, a)
        h.launch("work", HostArgs().u32(250_000), a)
        h.launch("work", HostArgs().u32(250_000), b)
        timed.record_event(end, a)
        timed.synchronize_stream(a, SYNC_MS)
        timed.synchronize_stream(b, SYNC_MS)
        wall = time.perf_counter() - began
        assert 0.24 <= wall < 0.45, wall  # ~ max (0.25 s), not the sum (0.5 s)
        assert timed.event_elapsed_time(start, end) >= 249.0
    finally:
        timed.close()
    untimed = open_sim_runtime(0)
    try:
        h = make_kit(untimed, library=lib)
        began = time.perf_counter()
        h.launch("work", HostArgs().u32(5_000_000))
        untimed.synchronize_stream(h.stream, SYNC_MS)
        assert time.perf_counter() - began < 1.0, "cost is ignored without time_model"
    finally:
        untimed.close()


@pytest.mark.parametrize(
    ("body", "cost", "said"),
    [
        (sys.exit, None, "SystemExit"),
        (KeyboardInterrupt, None, "KeyboardInterrupt"),
        (None, float("nan"), "cost returned nan"),
        (None, -1.0, "cost returned -1.0"),
    ],
    ids=["sys.exit", "KeyboardInterrupt", "nan-cost", "negative-cost"],
)
def test_a_kernel_that_exits_or_costs_no_time_faults_the_device_and_it_lives_on(
    make_kit: Callable[..., RuntimeKit], body: Any, cost: float | None, said: str
) -> None:
    # A user's kernel that raised SystemExit or KeyboardInterrupt ended the device thread
    # with no fault: every later task on every stream waited for the watchdog. A NaN cost
    # (time_model) left its kernel running for good.
    lib = KernelLibrary("rude")

    @lib.kernel("rude", cost=None if cost is None else (lambda ctx: cost))
    def rude(ctx: KernelContext) -> None:
        if body is not None:
            raise body()

    @lib.kernel("fine")
    def fine(ctx: KernelContext) -> None:
        pass

    for _ in range(2):  # and a reopened device works
        rt = open_sim_runtime(0, time_model=True)
        try:
            h = make_kit(rt, library=lib)
            h.launch("fine", HostArgs().u32(0))
            rt.synchronize_stream(h.stream, SYNC_MS)
            h.launch("rude", HostArgs().u32(0))
            with pytest.raises(AICoreExceptionError, match=said):
                rt.synchronize_stream(h.stream, SYNC_MS)
            assert any(t.name.startswith("aio_ascend-sim") for t in threading.enumerate())
        finally:
            rt.close()


def test_hang_ends_with_destroy_stream_force(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    stuck = rt.create_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    h.launch("hang", HostArgs(), stuck)
    rt.record_event(event, stuck)
    assert rt.live_resources()["streams"] == 2
    rt.destroy_stream_force(stuck)
    assert rt.live_resources()["streams"] == 1
    with pytest.raises(InvalidHandleError):
        rt.destroy_stream_force(stuck)
    n = 4
    x, y = h.upload(np.ones(n, F32)), h.upload(np.ones(n, F32))
    h.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(y).u32(n))
    np.testing.assert_array_equal(h.download(y, n), np.full(n, 2.0, F32))


def test_force_destroy_fails_a_blocked_pageable_copy(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    stuck = rt.create_stream()
    h.launch("hang", HostArgs(), stuck)
    device = rt.malloc(64)
    host = np.zeros(16, F32)
    errors: list[BaseException] = []

    def copy() -> None:
        rt.set_current_context()
        try:
            rt.memcpy_async(host.ctypes.data, 64, device, 64, ACL_MEMCPY_DEVICE_TO_HOST, stuck)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    thread.join(0.1)
    assert thread.is_alive()
    rt.destroy_stream_force(stuck)
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], StreamAbortError)


def test_fault_wakes_blocked_callers(make_kit: Callable[..., RuntimeKit]) -> None:
    runtime = open_sim_runtime(1, max_queue_depth=2)
    try:
        h = make_kit(runtime)
        runtime.pause()
        h.launch("fault", HostArgs().u32(0))
        h.launch("noop", HostArgs())
        errors: list[BaseException] = []

        def third_launch() -> None:
            runtime.set_current_context()
            try:
                h.launch("noop", HostArgs())
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=third_launch, daemon=True)
        thread.start()
        thread.join(0.1)
        assert thread.is_alive()
        runtime.resume()
        thread.join(5)
        assert not thread.is_alive()
        assert len(errors) == 1
        assert isinstance(errors[0], AICoreExceptionError)
    finally:
        runtime.close()


def test_pause_stops_execution_deterministically(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    rt.pause()
    rt.pause()  # idempotent
    try:
        for _ in range(10):
            h.launch("noop", HostArgs())
        assert rt.counters["launches"] == 10
        assert rt.counters["kernels_executed"] == 0
    finally:
        rt.resume()
    rt.synchronize_stream(h.stream, SYNC_MS)
    assert rt.counters["kernels_executed"] == 10


def test_counters(rt: SimRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    h = make_kit(rt)
    event = rt.create_event(0)
    x = h.upload(np.ones(4, F32))
    h.launch("noop", HostArgs())
    h.launch("axpy", HostArgs().ptr(x).ptr(x).f32(1.0).u32(4))
    rt.record_event(event, h.stream)
    rt.synchronize_event(event, SYNC_MS)
    assert rt.counters == {"launches": 2, "kernels_executed": 2, "copies": 1, "events_recorded": 1}


# --- user kernels -----------------------------------------------------------------------------


def test_user_kernel_library(rt: SimRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    lib = KernelLibrary("mine")
    seen: dict[str, Any] = {}

    @lib.kernel("fill")
    def fill(ctx: KernelContext) -> None:
        out = ctx.array(ctx.ptr(0), ctx.u32(8), np.float32)
        out[:] = ctx.f32(12)
        seen.update(
            blocks=ctx.blocks,
            name=ctx.name,
            args=ctx.args,
            args_addr=ctx.args_addr,
            tiling=ctx.read(ctx.ptr(16), 4),
            unpacked=ctx.unpack("<QI", 0),
        )

    h = make_kit(rt, library=lib)
    n = 10
    out = rt.malloc(n * 4)
    args = HostArgs().ptr(out).u32(n).f32(2.5).placeholder(b"TILE")
    h.launch("fill", args, blocks=5)
    np.testing.assert_array_equal(h.download(out, n), np.full(n, 2.5, F32))
    assert seen["blocks"] == 5
    assert seen["name"] == "fill"
    assert seen["tiling"] == b"TILE"
    assert seen["unpacked"] == (out, n)
    assert seen["args_addr"] >= DEVICE_BASE
    assert struct.unpack_from("<Q", seen["args"], 16)[0] == seen["args_addr"] + 32
    assert len(seen["args"]) == args.nbytes


def test_library_is_snapshotted_at_load(rt: SimRuntime) -> None:
    lib = KernelLibrary()

    @lib.kernel("first")
    def first(ctx: KernelContext) -> None:
        pass

    binary = rt.load_binary(lib)
    lib.add("second", first)
    assert rt.get_function(binary, "first") == rt.get_function(binary, "first")
    with pytest.raises(RuntimeAPIError) as info:
        rt.get_function(binary, "second")
    assert info.value.code == 107042
    assert rt.get_function(rt.load_binary(lib), "second")
    with pytest.raises(ValueError, match="already registered"):
        lib.add("first", first)
    with pytest.raises(InvalidParamError):
        rt.load_binary(b"\x7fELF")


def test_unloaded_binary_invalidates_its_functions(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    noop = rt.get_function(h.binary, "noop")
    rt.unload_binary(h.binary)
    args = h.pinned(bytes(8))
    with pytest.raises(InvalidHandleError):
        rt.launch_kernel_with_host_args(noop, 1, h.stream, None, args, 8, 0, 0)
    with pytest.raises(InvalidHandleError):
        rt.unload_binary(h.binary)


def test_exception_in_a_user_kernel_is_a_device_fault(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    lib = KernelLibrary()

    @lib.kernel("broken")
    def broken(ctx: KernelContext) -> None:
        raise ZeroDivisionError("no tiling")

    h = make_kit(rt, library=lib)
    h.launch("broken", HostArgs())
    with pytest.raises(AICoreExceptionError) as info:
        rt.synchronize_stream(h.stream, SYNC_MS)
    assert "ZeroDivisionError: no tiling" in info.value.message
    assert "in broken" in info.value.message


def test_a_swallowed_mmu_fault_still_faults_the_device(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    lib = KernelLibrary()

    @lib.kernel("sloppy")
    def sloppy(ctx: KernelContext) -> None:
        try:
            ctx.array(0x10, 4, np.float32)
        except Exception:
            pass

    h = make_kit(rt, library=lib)
    h.launch("sloppy", HostArgs())
    with pytest.raises(DeviceFaultError, match="0x10"):
        rt.synchronize_stream(h.stream, SYNC_MS)


def test_kernel_context_fault_with_a_code(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    lib = KernelLibrary()

    @lib.kernel("trap")
    def trap(ctx: KernelContext) -> None:
        ctx.fault(507016, "trap!")

    h = make_kit(rt, library=lib)
    h.launch("trap", HostArgs())
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(h.stream, SYNC_MS)
    assert (info.value.code, info.value.message) == (507016, "trap!")


# --- accounting and errors --------------------------------------------------------------------


def test_live_resources_accounting() -> None:
    runtime = open_sim_runtime(0)
    empty = {
        "device_allocations": 0,
        "host_allocations": 0,
        "streams": 0,
        "events": 0,
        "binaries": 0,
        "graphs": 0,
    }
    try:
        assert runtime.live_resources() == empty
        ptr, host = runtime.malloc(64), runtime.malloc_host(64)
        stream, event = runtime.create_stream(), runtime.create_event(0)
        binary = runtime.load_binary(None)
        runtime.begin_capture(stream)
        runtime.memset_async(ptr, 64, 0, 64, stream)
        graph = runtime.end_capture(stream)
        assert runtime.live_resources() == dict.fromkeys(empty, 1)
        runtime.destroy_graph(graph)
        runtime.free(ptr)
        runtime.free_host(host)
        runtime.destroy_stream(stream)
        runtime.destroy_event(event)
        runtime.unload_binary(binary)
        assert runtime.live_resources() == empty
        runtime.malloc(8)
        runtime.create_stream()
    finally:
        runtime.close()
    assert runtime.live_resources() == {**empty, "device_allocations": 1, "streams": 1}


def test_recent_error_message_is_per_thread(rt: SimRuntime) -> None:
    with pytest.raises(InvalidParamError):
        rt.malloc(0)
    assert "size=0" in rt.get_recent_error_message()
    other: list[str] = []
    thread = threading.Thread(target=lambda: other.append(rt.get_recent_error_message()))
    thread.start()
    thread.join()
    assert other == [""]


def test_failure_mode_is_validated(rt: SimRuntime) -> None:
    stream = rt.create_stream()
    rt.set_stream_failure_mode(stream, 0)
    rt.set_stream_failure_mode(stream, 1)
    with pytest.raises(InvalidParamError):
        rt.set_stream_failure_mode(stream, 2)
    with pytest.raises(InvalidHandleError):
        rt.set_stream_failure_mode(12345, 1)


def test_sticky_fault_blocks_new_work_but_not_cleanup(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    host = rt.malloc_host(64)
    h.launch("fault", HostArgs().u32(507035))
    with pytest.raises(DeviceFaultError):
        rt.synchronize_stream(h.stream, SYNC_MS)
    with pytest.raises(DeviceFaultError) as info:
        h.launch("noop", HostArgs())
    assert info.value.code == 507035
    assert info.value.func == "aclrtLaunchKernelWithHostArgs"
    rt.free_host(host)
    rt.destroy_stream(h.stream)
    rt.unload_binary(h.binary)


def test_bad_pause_free_inputs(rt: SimRuntime) -> None:
    with pytest.raises(ValueError, match="code"):
        rt.inject_launch_error(0)
    with pytest.raises(ValueError, match="after"):
        rt.inject_launch_error(107000, after=-1)
    with pytest.raises(ValueError, match="max_queue_depth"):
        open_sim_runtime(0, max_queue_depth=0)


def test_an_idle_or_hung_device_does_not_spin(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    h.launch("hang", HostArgs())
    h.launch("sleep", HostArgs().u32(10_000_000), rt.create_stream())
    waiter = rt.create_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.record_event(event, h.stream)
    rt.stream_wait_event(waiter, event)  # a stream blocked on a hung one
    cpu_before = time.process_time()
    time.sleep(0.3)  # measuring CPU use while idle, not synchronizing
    assert time.process_time() - cpu_before < 0.05


def test_many_small_kernels_under_the_time_model(make_kit: Callable[..., RuntimeKit]) -> None:
    runtime = open_sim_runtime(0, time_model=True)
    try:
        h = make_kit(runtime)
        noop = runtime.get_function(h.binary, "noop")
        args = h.pinned(bytes(8))
        started = time.perf_counter()
        for _ in range(1000):
            runtime.launch_kernel_with_host_args(noop, 1, h.stream, None, args, 8, 0, 0)
        runtime.synchronize_stream(h.stream, SYNC_MS)
        assert time.perf_counter() - started < 2.0
        assert runtime.counters["kernels_executed"] == 1000
    finally:
        runtime.close()


def test_table_packed_after_the_args_in_one_pinned_buffer(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    h = make_kit(rt)
    n = 8
    x = h.upload(np.arange(n, dtype=F32))
    args = HostArgs().ptr(x).ptr(x).placeholder(struct.pack("<If", n, 0.5))
    image, table = args.to_bytes(), args.placeholder_table()
    buffer = h.pinned(image + table)  # the scheduler's layout: table right after the args
    scale = rt.get_function(h.binary, "scale")
    rt.launch_kernel_with_host_args(
        scale, 1, h.stream, None, buffer, len(image), buffer + len(image), 1
    )
    np.testing.assert_array_equal(h.download(x, n), np.arange(n, dtype=F32) * F32(0.5))
    with pytest.raises(InvalidParamError, match="placeHolderArray"):  # runs off the buffer
        rt.launch_kernel_with_host_args(
            scale, 1, h.stream, None, buffer, len(image), buffer + len(image) + 4, 1
        )


def test_args_regions_are_exact_and_released_after_the_kernel(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    lib = KernelLibrary()
    stash: list[int] = []

    @lib.kernel("keep")
    def keep(ctx: KernelContext) -> None:
        assert ctx.read(ctx.args_addr, len(ctx.args)) == ctx.args
        stash.append(ctx.args_addr)

    @lib.kernel("stale")
    def stale(ctx: KernelContext) -> None:
        ctx.read(ctx.ptr(0), 8)

    @lib.kernel("overrun")
    def overrun(ctx: KernelContext) -> None:
        ctx.read(ctx.args_addr, len(ctx.args) + 1)

    h = make_kit(rt, library=lib)
    h.launch("keep", HostArgs().placeholder(b"x" * 8))
    rt.synchronize_stream(h.stream, SYNC_MS)
    h.launch("stale", HostArgs().u64(stash[0]))
    with pytest.raises(DeviceFaultError, match="not inside any live device allocation"):
        rt.synchronize_stream(h.stream, SYNC_MS)
    rt.close()
    fresh = open_sim_runtime(0)
    try:
        h = make_kit(fresh, library=lib)
        h.launch("overrun", HostArgs().placeholder(b"y" * 8))
        with pytest.raises(DeviceFaultError, match="past the end"):
            fresh.synchronize_stream(h.stream, SYNC_MS)
    finally:
        fresh.close()


def test_args_inside_a_pinned_slab_are_read_when_the_kernel_runs(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    # The scheduler's pooled args buffers sit inside one pinned slab; the launch path's O(1)
    # lookup of the slab must give the same late read as PinnedMemory.find, and never a
    # freed slab.
    lib = KernelLibrary()
    seen: list[bytes] = []

    @lib.kernel("record")
    def record(ctx: KernelContext) -> None:
        seen.append(bytes(ctx.args))

    h = make_kit(rt, library=lib)
    fn = rt.get_function(h.binary, "record")
    slab = rt.malloc_host(256)
    for offset in (64, 128, 64):  # the second and third hit the cached slab
        host_view(slab + offset, 8)[:] = b"early..."
        rt.pause()
        try:
            rt.launch_kernel_with_host_args(fn, 1, h.stream, None, slab + offset, 8, 0, 0)
            host_view(slab + offset, 8)[:] = struct.pack("<Q", offset)  # before it runs
        finally:
            rt.resume()
        rt.synchronize_stream(h.stream, SYNC_MS)
    assert seen == [struct.pack("<Q", offset) for offset in (64, 128, 64)]
    with pytest.raises(InvalidParamError, match="past the end"):
        rt.launch_kernel_with_host_args(fn, 1, h.stream, None, slab + 240, 24, 0, 0)
    rt.free_host(slab)
    assert rt._pinned.last_hit is None  # the cache must not outlive the slab


def test_a_source_no_backend_loads_is_a_type_error(rt: SimRuntime, tmp_path: Path) -> None:
    """``load_module(123)``: a ``TypeError`` in the call, as acl and cuda answer it (it was
    the runtime's InvalidParamError); a binary file or bytes stay the runtime's refusal."""
    with pytest.raises(TypeError, match="KernelLibrary"):
        rt.load_binary(123)
    binary = tmp_path / "kernels.o"
    binary.write_bytes(b"\x7fELF")
    data = b"\x7fELF"
    bytes_like = (data, np.frombuffer(data, np.uint8), array.array("B", data))
    for source in (binary, str(binary), *bytes_like):
        with pytest.raises(InvalidParamError):
            rt.load_binary(source)


def test_args_regions_are_only_as_aligned_as_the_real_runtime_promises(
    rt: SimRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    """The real runtime's stream pool hands out args space in 8-byte steps
    (stars_arg_manager.cc:131): the sim's regions sit 8 bytes past a large boundary, so a
    kernel relying on more alignment of its placeholder data sees it here. The bytes before
    a region are no one's."""
    lib = KernelLibrary()
    seen: list[int] = []

    @lib.kernel("where")
    def where(ctx: KernelContext) -> None:
        seen.append(ctx.args_addr)
        seen.append(ctx.ptr(0))  # the placeholder's data, align=64 in the args buffer

    @lib.kernel("before")
    def before(ctx: KernelContext) -> None:
        ctx.read(ctx.args_addr - 8, 8)

    h = make_kit(rt, library=lib)
    h.launch("where", HostArgs().placeholder(b"z" * 8, align=64))
    rt.synchronize_stream(h.stream, SYNC_MS)
    region, data = seen
    assert region % 8 == 0 and region % 16 == 8
    assert (data - region) % 64 == 0 and data % 64 == 8
    h.launch("before", HostArgs().placeholder(b"w" * 8))
    with pytest.raises(DeviceFaultError, match="not inside any live device allocation"):
        rt.synchronize_stream(h.stream, SYNC_MS)
