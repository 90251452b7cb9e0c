"""The everyday API: one await, views, device copies, memset,
wrapped memory, external and prioritised streams, ``dev.info``.

Each test runs on the sim, the acl C double and the cuda backend over its fake driver (and on
a real GPU where one is present: ``cuda``, marked ``gpu``), on asyncio, uvloop and trio; the
few that need the sim's controls say so.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import assert_runtime_clean, live_resources

import aio_ascend as aa

pytestmark = pytest.mark.anyio

F32 = np.float32
BACKENDS = ("sim", "acl", "cuda-fake", "cuda", "realrt")


def vector_add(x: aa.DeviceBuffer, y: aa.DeviceBuffer, z: aa.DeviceBuffer, n: int) -> aa.HostArgs:
    return aa.HostArgs().ptr(x).ptr(y).ptr(z).u32(n)


def sleep_args(microseconds: int) -> aa.HostArgs:
    return aa.HostArgs().u32(microseconds)


# --- one await -------------------------------------------------------------------------------


async def test_run_upload_download_need_one_await_each(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 1000
        x, y, z = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)
        await s.upload(x, np.arange(n, dtype=F32))
        await s.upload(y, np.full(n, 0.5, F32))
        assert await s.run(dev.function("vector_add"), 4, vector_add(x, y, z, n)) is None
        out = await s.download(z, F32)
        np.testing.assert_array_equal(out, np.arange(n, dtype=F32) + F32(0.5))
        assert dev.stats()["in_flight"] == 0


async def test_download_defaults_to_the_whole_buffer_as_bytes(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(12)
        await s.upload(buf, bytes(range(12)))
        raw = await s.download(buf)
        assert raw.dtype == np.uint8
        assert raw.shape == (12,)
        assert raw.tolist() == list(range(12))
        as_u32 = await s.download(buf, np.uint32)
        assert as_u32.shape == (3,)
        assert as_u32.tobytes() == bytes(range(12))


async def test_download_with_a_shape_reads_the_start(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        await s.upload(buf, np.arange(16, dtype=F32))
        head = await s.download(buf, F32, (2, 3))
        np.testing.assert_array_equal(head, np.arange(6, dtype=F32).reshape(2, 3))
        scalar_shape = await s.download(buf, F32, 4)
        np.testing.assert_array_equal(scalar_shape, np.arange(4, dtype=F32))
        with pytest.raises(ValueError, match=r"shape \(0,\) .* holds no bytes"):
            await s.download(buf, F32, (0,))  # (it blamed an empty copy_to_host dst)


async def test_download_into_out_returns_out(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(16)
        await s.upload(buf, np.array([1, 2, 3, 4], np.int32))
        out = np.zeros((2, 2), np.int32)
        assert await s.download(buf, out=out) is out
        assert out.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"dtype": F32}, ValueError, id="size-not-a-multiple"),
        pytest.param({"dtype": F32, "shape": (2, 2)}, ValueError, id="shape-needs-more"),
        pytest.param({"dtype": object}, TypeError, id="object-dtype"),
        pytest.param({"dtype": "no-such-type"}, TypeError, id="unknown-dtype"),
        pytest.param({"shape": (-1,)}, ValueError, id="negative-dimension"),
        pytest.param({"shape": "3"}, TypeError, id="shape-of-a-string"),
        pytest.param({"out": np.zeros(2, F32), "dtype": F32}, ValueError, id="out-and-dtype"),
        pytest.param({"out": np.zeros(8, F32)}, ValueError, id="out-too-big"),
        pytest.param({"out": np.zeros(4, np.uint8)[::2]}, ValueError, id="out-strided"),
    ],
)
async def test_bad_downloads_are_refused_before_anything_is_queued(
    open_dev: Callable[..., Any], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(10)
        before = dev.stats()["copies"]
        with pytest.raises(error):
            await s.download(buf, **kwargs)
        assert dev.stats()["copies"] == before
        assert s.in_flight == 0


async def test_a_cancelled_run_still_runs_its_kernel(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 64
        x, y, z = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)
        await s.upload(x, np.ones(n, F32))
        await s.upload(y, np.ones(n, F32))
        await s.launch(dev.function("sleep"), 1, sleep_args(100_000))
        with anyio.move_on_after(0.01) as scope:
            await s.run(dev.function("vector_add"), 1, vector_add(x, y, z, n))
        assert scope.cancelled_caught
        await s.synchronize()
        np.testing.assert_array_equal(await s.download(z, F32), np.full(n, 2, F32))


# --- views -----------------------------------------------------------------------------------


async def test_slices_follow_python_rules_without_clamping(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        buf = dev.malloc(100)
        view = buf[10:-10]
        assert (view.ptr, view.nbytes, view.offset, view.base) == (buf.ptr + 10, 80, 10, buf)
        assert buf[-20:].offset == 80
        assert buf[:].nbytes == 100
        assert buf[::1].nbytes == 100
        inner = view[5:15]
        assert (inner.offset, inner.nbytes, inner.base) == (15, 10, buf)
        assert buf.base is None
        assert buf.offset == 0
        assert buf[50:50].nbytes == 0
        for bad in (slice(0, 101), slice(-101, None), slice(60, 50), slice(0, 10, 2)):
            with pytest.raises(ValueError, match="slice"):
                buf[bad]
        with pytest.raises(TypeError):
            buf[3]  # type: ignore[index]
        with pytest.raises(TypeError):
            buf["a":"b"]  # type: ignore[misc]


async def test_views_work_in_copies_and_kernel_args(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 16
        buf = dev.malloc(3 * 4 * n)
        x, y, z = buf[: 4 * n], buf[4 * n : 8 * n], buf[8 * n :]
        await s.upload(x, np.arange(n, dtype=F32))
        await s.upload(y, np.full(n, 10, F32))
        await s.run(dev.function("vector_add"), 1, vector_add(x, y, z, n))
        whole = await s.download(buf, F32)
        np.testing.assert_array_equal(whole[2 * n :], np.arange(n, dtype=F32) + 10)
        np.testing.assert_array_equal(await s.download(z[4:8], F32), [11.0])


async def test_empty_views_are_refused_where_bytes_are_needed(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        empty = buf[32:32]
        with pytest.raises(ValueError, match="bytes"):
            await s.copy_to_device(empty, b"x")
        with pytest.raises(ValueError, match="bytes"):
            await s.copy_to_host(np.zeros(1, np.uint8), empty)
        with pytest.raises(ValueError, match="bytes"):
            await s.memset(empty, 0)
        with pytest.raises(ValueError, match="bytes"):
            await s.copy_device(buf, empty)
        with pytest.raises(ValueError, match="bytes"):
            await s.download(empty)
        assert s.in_flight == 0


async def test_a_view_cannot_be_freed_and_its_root_free_waits_for_it(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        root = dev.malloc(4096)
        view = root[1024:2048]
        with pytest.raises(ValueError, match="view"):
            view.free()
        buffers = dev.stats()["device_buffers"]
        await s.launch(dev.function("sleep"), 1, sleep_args(50_000))
        task = await s.copy_to_device(view, np.full(1024, 9, np.uint8))
        root.free()  # deferred: the queued copy on the view still uses the memory
        assert root.freed
        assert view.freed
        assert dev.stats()["device_buffers"] == buffers
        with pytest.raises(ValueError, match="freed"):
            await s.memset(view, 0)
        with pytest.raises(ValueError, match="freed"):
            root[0:1]
        await task
        assert dev.stats()["device_buffers"] == buffers - 1


async def test_a_view_keeps_its_root_alive(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        root = dev.malloc(256)
        ref = weakref.ref(root)
        view = root[128:]
        del root
        gc.collect()
        assert ref() is not None
        await s.upload(view, np.full(128, 3, np.uint8))
        assert (await s.download(view)).tolist() == [3] * 128


# --- device copies and memset ----------------------------------------------------------------


async def test_copy_device_copies_between_buffers_and_views(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        src = dev.malloc(256)
        dst = dev.malloc(512)
        data = np.arange(256, dtype=np.uint16).astype(np.uint8)
        await s.upload(src, data)
        await s.memset(dst, 0)
        await (await s.copy_device(dst[100:], src))  # nbytes: all of src
        await (await s.copy_device(dst, src[10:], 20))
        out = await s.download(dst)
        expected = np.zeros(512, np.uint8)
        expected[100:356] = data
        expected[:20] = data[10:30]
        np.testing.assert_array_equal(out, expected)
        assert dev.stats()["copies"] >= 4


async def test_copy_device_is_ordered_after_a_kernel(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        n = 32
        x, y, z, out = (dev.malloc(4 * n) for _ in range(4))
        await s.upload(x, np.ones(n, F32))
        await s.upload(y, np.ones(n, F32))
        await s.memset(z, 0)
        await s.launch(dev.function("sleep"), 1, sleep_args(20_000))
        await s.launch(dev.function("vector_add"), 1, vector_add(x, y, z, n))
        await s.copy_device(out, z)
        np.testing.assert_array_equal(await s.download(out, F32), np.full(n, 2, F32))


@pytest.mark.parametrize(
    "case",
    ["dst-too-small", "nbytes-too-big", "overlap", "not-a-buffer", "nbytes-type", "zero"],
)
async def test_bad_device_copies_are_refused_in_the_call(
    open_dev: Callable[..., Any], case: str
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        a, b = dev.malloc(128), dev.malloc(64)
        bad: dict[str, Callable[[], Any]] = {
            "dst-too-small": lambda: s.copy_device(b, a),
            "nbytes-too-big": lambda: s.copy_device(a, b, 65),
            "overlap": lambda: s.copy_device(a[10:70], a[0:60]),
            "not-a-buffer": lambda: s.copy_device(b, a.ptr),
            "nbytes-type": lambda: s.copy_device(a, b, 1.5),
            "zero": lambda: s.copy_device(a, b, 0),
        }
        with pytest.raises((TypeError, ValueError)):
            await bad[case]()
        assert s.in_flight == 0


async def test_memset_sets_bytes_and_checks_its_value(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(100)
        await s.memset(buf, 1)
        await (await s.memset(buf[10:], 0xFF, 5))
        out = await s.download(buf)
        expected = np.ones(100, np.uint8)
        expected[10:15] = 0xFF
        np.testing.assert_array_equal(out, expected)
        for value, error in ((256, ValueError), (-1, ValueError), (1.0, TypeError)):
            with pytest.raises(error):
                await s.memset(buf, value)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="nbytes"):
            await s.memset(buf, 0, 101)


# --- memory owned by someone else ------------------------------------------------------------


class Owner:
    """Stands for a torch_npu tensor that owns device memory."""


async def test_wrapped_memory_is_used_but_never_freed(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        raw = dev.runtime.malloc(256)
        allocations = live_resources(dev)["device_allocations"]
        owner = Owner()
        ref = weakref.ref(owner)
        ext = dev.wrap(raw, 256, owner=owner)
        del owner
        await s.launch(dev.function("sleep"), 1, sleep_args(30_000))
        task = await s.copy_to_device(ext[64:128], np.full(64, 5, np.uint8))
        ext.free()  # only drops the wrapper, once the queued copy is done
        gc.collect()
        assert ref() is not None, "the owner was let go while queued work used its memory"
        await task
        assert await _collected(ref), "the owner was kept after the work on its memory finished"
        assert live_resources(dev)["device_allocations"] == allocations
        check = dev.wrap(raw, 256)
        assert (await s.download(check[64:128])).tolist() == [5] * 64
        dev.runtime.free(raw)


async def test_a_collected_wrapper_lets_go_of_its_owner(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        raw = dev.runtime.malloc(64)
        owner = Owner()
        ref = weakref.ref(owner)
        task = await s.memset(dev.wrap(raw, 64, owner=owner), 7)
        del owner
        await task
        del task
        assert await _collected(ref)
        dev.runtime.free(raw)


async def _collected(ref: weakref.ref[Any], within: float = 2.0) -> bool:
    """Whether ``ref``'s object is collected within ``within`` seconds (liveness).

    The task resolves as soon as the poller has posted its completion; the poller thread may
    hold the finished request in its frame a moment longer (until it gets the GIL back), so
    the owner is let go right after, not necessarily before the awaiting coroutine resumes.
    """
    deadline = anyio.current_time() + within
    while True:
        gc.collect()
        if ref() is None:
            return True
        if anyio.current_time() > deadline:
            return False
        await anyio.sleep(0.005)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, 16), ValueError),
        ((4096, 0), ValueError),
        ((-5, 16), ValueError),
        ((1.0, 16), TypeError),
        ((4096, "16"), TypeError),
    ],
)
async def test_bad_wraps_are_refused(
    open_dev: Callable[..., Any], args: tuple[Any, Any], error: type[Exception]
) -> None:
    async with open_dev() as dev:
        with pytest.raises(error):
            dev.wrap(*args)


# --- streams ---------------------------------------------------------------------------------


async def test_an_external_stream_is_used_but_never_destroyed(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev:
        runtime = dev.runtime
        # as its owner would: in the device's context (not whatever this thread has current)
        runtime.set_current_context(runtime.context)
        handle = runtime.create_stream()
        streams = dev.stats()["streams"]
        ext = dev.external_stream(handle)
        assert dev.stats()["streams"] == streams + 1
        with pytest.raises(ValueError, match="already"):
            dev.external_stream(handle)
        buf = dev.malloc(32)
        await ext.upload(buf, np.arange(8, dtype=F32))
        np.testing.assert_array_equal(await ext.download(buf, F32), np.arange(8, dtype=F32))
        await ext.aclose()
        assert dev.stats()["streams"] == streams
        runtime.synchronize_stream(handle, 1000)  # still alive: its owner's to destroy
        runtime.destroy_stream(handle)


async def test_bad_external_streams_are_refused(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        with pytest.raises(TypeError):
            dev.external_stream("0x1234")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="handle"):
            dev.external_stream(0)
        # a handle is a pointer: one past 64 bits is refused in the call, never queued (it
        # failed in the submitter, as an InternalError on acl)
        streams = dev.stats()["streams"]
        for call in (dev.external_stream, dev.external_event):
            with pytest.raises(ValueError, match="handle"):
                call(2**64)
        with pytest.raises(ValueError, match="handle"):
            dev.external_stream(SimpleNamespace(npu_stream=2**64 + 5))
        assert dev.stats()["streams"] == streams


async def test_stream_priorities_in_range_work(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        info = dev.info
        least, greatest = info["stream_priority_least"], info["stream_priority_greatest"]
        assert isinstance(least, int)
        assert isinstance(greatest, int)
        buf = dev.malloc(16)
        for priority in (least, greatest):
            async with dev.stream(priority=priority) as s:
                await s.memset(buf, priority & 0xFF)
                assert (await s.download(buf)).tolist() == [priority & 0xFF] * 16
        with pytest.raises(ValueError, match="range"):
            dev.stream(priority=greatest - 1)
        with pytest.raises(ValueError, match="range"):
            dev.stream(priority=least + 1)
        with pytest.raises(TypeError):
            dev.stream(priority="high")  # type: ignore[arg-type]


@pytest.mark.sim_only
async def test_the_sim_serves_the_more_urgent_stream_first(open_dev: Callable[..., Any]) -> None:
    order: list[str] = []
    lib = aa.sim.KernelLibrary()

    @lib.kernel("mark")
    def mark(ctx: aa.sim.KernelContext) -> None:
        order.append("urgent" if ctx.u32(0) else "background")

    async with open_dev() as dev:
        fn = dev.load_module(lib).function("mark")
        background = dev.stream(priority=7)
        urgent = dev.stream(priority=0)
        dev.runtime.pause()
        tasks = [await background.launch(fn, 1, aa.HostArgs().u32(0)) for _ in range(3)]
        tasks += [await urgent.launch(fn, 1, aa.HostArgs().u32(1)) for _ in range(3)]
        await anyio.sleep(0.05)  # both batches reach the paused device
        dev.runtime.resume()
        for task in tasks:
            await task
        assert order == ["urgent"] * 3 + ["background"] * 3


async def test_info_describes_the_device(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        info = dev.info
        assert info["backend"] == dev.backend
        assert info["device_id"] == 0
        assert isinstance(info["runtime_version"], str)
        total, free = info["memory_total"], info["memory_free"]
        assert isinstance(total, int)
        assert isinstance(free, int)
        assert 0 < free <= total
        assert isinstance(info["launch_path"], str)
        with pytest.raises(TypeError):
            info["backend"] = "x"  # type: ignore[index]
    with pytest.raises(aa.ClosedError):
        _ = dev.info


async def test_everything_is_released_after_close(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        s = dev.stream(priority=dev.info["stream_priority_greatest"])
        buf = dev.malloc(1024)
        await s.memset(buf[512:], 1)
        await s.copy_device(buf[:512], buf[512:])
        await s.synchronize()
    assert_runtime_clean(dev)
