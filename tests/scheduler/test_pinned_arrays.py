"""Pinned host arrays (``dev.pinned_empty``, ``dev.pinned_like``): copies from and to them go
straight to the device, with no staging; their memory lives as long as the array, its views and
the copies queued on it, and never dangles, even past the device's close.

Each test runs on the sim and the acl C double (both read a pinned copy's host side when the
copy *executes*, and the double faults on a freed one), on asyncio, uvloop and trio.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import warnings

import anyio
import numpy as np
import pytest
from helpers import (
    OpenDevice,
    assert_runtime_clean,
    live_resources,
    on_real_runtime,
    open_backend,
    upload,
)

import aio_ascend as aa
from aio_ascend._sched.work import STAGE_AT_HAND_BYTES
from aio_ascend.testing import library_threads

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True

#: a kernel that keeps the stream busy this long, so that what is queued behind it executes late
SLEEP_US = 300_000


def _staged(dev: aa.Device) -> int:
    """Pinned staging buffers the device's pool ever handed out."""
    stats = dev.stats()
    return stats["host_buffer_allocations"] + stats["host_buffers_high_water"]


def _memcpy_host_sides(dev: aa.Device, since: int) -> list[int]:
    """acl: the host address of every aclrtMemcpyAsync since ``since`` (H2D src, D2H dst)."""
    from doubles.acl_double import control_for

    sides = []
    for call in control_for(dev.runtime).calls(since, "aclrtMemcpyAsync"):
        dst, _, src, _, kind, _ = call.args
        sides.append(src if kind == 1 else dst)  # ACL_MEMCPY_HOST_TO_DEVICE is 1
    return sides


def _mark(dev: aa.Device) -> int:
    if dev.backend != "acl":
        return 0
    if on_real_runtime(dev):
        pytest.skip("reads the C double's call log (which host address each copy used)")
    from doubles.acl_double import control_for

    return control_for(dev.runtime).mark()


@pytest.mark.parametrize("nbytes", [4096, 2 * STAGE_AT_HAND_BYTES], ids=["small", "big"])
async def test_copies_from_and_to_a_pinned_array_skip_staging(
    open_dev: OpenDevice, nbytes: int
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        src = dev.pinned_empty(nbytes // 4, np.float32)
        src[:] = np.arange(src.size, dtype=np.float32)
        buf = dev.malloc(nbytes)
        out = dev.pinned_like(src)
        assert out.shape == src.shape and out.dtype == src.dtype
        assert out.flags.c_contiguous and out.flags.writeable
        mark = _mark(dev)
        await s.upload(buf, src)
        assert await s.download(buf, out=out) is out
        np.testing.assert_array_equal(out, src)
        assert _staged(dev) == 0, "a copy from or to a pinned array was staged"
        assert dev.stats()["copies"] == 2
        if dev.backend == "acl":  # the runtime got the arrays' own addresses
            assert _memcpy_host_sides(dev, mark) == [src.ctypes.data, out.ctypes.data]
        ordinary = await s.download(buf, np.float32)  # the check above can see staging
        np.testing.assert_array_equal(ordinary, src)
        assert _staged(dev) > 0
        assert dev.stats()["pinned_arrays"] == 2
        assert dev.stats()["pinned_bytes"] == 2 * nbytes
        del src, out
        gc.collect()
        await anyio.sleep(0.01)  # the loop frees what was collected
        assert dev.stats()["pinned_arrays"] == 0
    assert_runtime_clean(dev)


async def test_views_of_a_pinned_array(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        pinned = dev.pinned_empty((8, 16), np.int32)
        pinned[:] = np.arange(128, dtype=np.int32).reshape(8, 16)
        buf = dev.malloc(pinned.nbytes)
        mark = _mark(dev)
        await s.upload(buf, pinned[2:4])  # contiguous rows: direct, from their own address
        await s.upload(buf, pinned[:, 0])  # strided: gathered into a staging buffer
        column = await s.download(buf, np.int32, 8)
        np.testing.assert_array_equal(column, np.arange(0, 128, 16))
        await s.upload(buf, pinned[2:4])
        back = np.empty((2, 16), np.int32)
        await s.download(buf, out=back)
        np.testing.assert_array_equal(back, pinned[2:4])
        if dev.backend == "acl":
            assert _memcpy_host_sides(dev, mark)[0] == pinned[2:4].ctypes.data
        view = pinned[4:].reshape(-1).view(np.uint8)  # it keeps the memory when the array goes
        del pinned
        gc.collect()
        await anyio.sleep(0.01)
        assert dev.stats()["pinned_arrays"] == 1
        await s.download(buf, out=view[: back.nbytes])  # and copies into it still go direct
        np.testing.assert_array_equal(view[: back.nbytes].view(np.int32), back.reshape(-1))
        del view
        gc.collect()
        await anyio.sleep(0.01)
        assert dev.stats()["pinned_arrays"] == 0
    assert_runtime_clean(dev)


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype([("x", "u1"), ("y", "f8")], align=True),  # padding between fields
        np.dtype({"names": ["b", "a"], "formats": ["<i4", "<i4"], "offsets": [4, 0]}),
        np.dtype(("i4", (3,))),  # a subarray: its dimensions join the shape
        np.dtype(">f8"),
    ],
    ids=["padded", "out-of-order", "subarray", "big-endian"],
)
async def test_a_pinned_array_has_the_dtype_and_shape_numpy_gives(
    open_dev: OpenDevice, dtype: np.dtype[object]
) -> None:
    # The array was rebuilt from an interface's typestr and descr, which cannot carry every
    # dtype: padded structs came back with extra fields (``p[...] = a`` then raised), a
    # subarray dtype as (2,) of V12, and out-of-order fields raised numpy's own error.
    async with open_dev() as dev:
        s = dev.stream()
        expected = np.zeros(2, dtype)
        expected.view(np.uint8).reshape(-1)[:] = np.arange(expected.nbytes) % 251
        pinned = dev.pinned_empty(2, dtype)
        assert (pinned.dtype, pinned.shape) == (expected.dtype, expected.shape)
        like = dev.pinned_like(expected)
        like[...] = expected  # (the fields: a struct's padding is not assigned)
        for name in dtype.names or [None]:
            field = (lambda a: a) if name is None else (lambda a: a[name])  # noqa: B023
            assert field(like).tobytes() == field(expected).tobytes()
        buf = dev.malloc(expected.nbytes)
        await s.upload(buf, like)
        await s.download(buf, out=pinned)
        assert pinned.tobytes() == like.tobytes()
        del pinned, like
    assert_runtime_clean(dev)


async def test_a_pinned_array_dropped_while_its_copy_is_queued_is_not_freed_early(
    open_dev: OpenDevice,
) -> None:
    # The copy executes after the sleep: had the array's memory been freed when the user let
    # go of it, the sim would copy poison and the double would fault.
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(4096)
        src = dev.pinned_empty(4096, np.uint8)
        src[:] = 7
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(SLEEP_US))
        up = await s.copy_to_device(buf, src)
        dst = dev.pinned_empty(4096, np.uint8)
        down = await s.copy_to_host(dst, buf)
        del src, dst
        gc.collect()
        await anyio.sleep(0.02)  # the loop had every chance to free them (the sleep: 0.3 s)
        assert not up.done()
        assert dev.stats()["pinned_arrays"] == 2, "a pinned array was freed under its copy"
        with anyio.fail_after(5):
            await up
            await down
        np.testing.assert_array_equal(await s.download(buf), np.full(4096, 7, np.uint8))
        await anyio.sleep(0.01)
        assert dev.stats()["pinned_arrays"] == 0
    assert_runtime_clean(dev)


async def test_a_timed_out_download_into_a_pinned_array_keeps_it_until_the_device_is_done(
    open_dev: OpenDevice,
) -> None:
    # The one place where failed work may write user memory (documented): the array's memory
    # must stay valid until the device has really finished the copy.
    async with open_dev(task_timeout=0.1) as dev:
        s = dev.stream()
        buf = await upload(dev, s, np.full(4096, 5, np.uint8))
        # 3 s: the device is still busy when the check below runs (~0.13 s in), 20x over
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(3_000_000))
        dst = dev.pinned_empty(4096, np.uint8)
        task = await s.copy_to_host(dst, buf)
        with anyio.fail_after(5), pytest.raises(aa.TaskTimeoutError):
            await task
        del dst
        gc.collect()
        await anyio.sleep(0.01)
        assert dev.stats()["pinned_arrays"] == 1, "freed while the device may still write it"
        with anyio.fail_after(5), pytest.raises(aa.TaskTimeoutError):
            await s.synchronize()  # (the sleep timed out too)
        with anyio.fail_after(20):
            while dev.stats()["pinned_arrays"]:  # noqa: ASYNC110 - a counter
                await anyio.sleep(0.01)
        assert dev.fault is None
    assert_runtime_clean(dev)


async def test_pinned_arrays_refuse_bad_input_in_the_call(open_dev: OpenDevice) -> None:
    async with open_dev() as dev, open_dev() as other:
        s = dev.stream()
        with pytest.raises(TypeError, match="shape"):
            dev.pinned_empty(2.5, np.float32)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="negative"):
            dev.pinned_empty((4, -1), np.float32)
        with pytest.raises(TypeError, match="dtype"):
            dev.pinned_empty(4, object)
        with pytest.raises(TypeError, match="dtype is required"):
            dev.pinned_empty(4, None)
        with pytest.raises(TypeError, match="dtype"):
            dev.pinned_empty(4, "not a dtype")
        with pytest.raises(TypeError, match="pinned_like"):
            dev.pinned_like(12345)
        assert dev.pinned_empty((2, np.int64(3)), "i2").shape == (2, 3)
        assert dev.pinned_empty(0, np.float32).size == 0
        like = dev.pinned_like(bytearray(10))
        assert like.shape == (10,) and like.dtype == np.uint8

        buf = dev.malloc(64)
        theirs = other.pinned_empty(16, np.float32)
        with pytest.raises(ValueError, match="pinned array of another device"):
            await s.copy_to_device(buf, theirs)
        with pytest.raises(ValueError, match="pinned array of another device"):
            await s.download(buf, out=theirs)
        with pytest.raises(ValueError, match="pinned array of another device"):
            await s.copy_to_device(buf, theirs[::2])  # (a strided view would be staged)
        small = dev.pinned_empty(2, np.float32)
        with pytest.raises(ValueError, match="src buffer only"):
            await s.download(dev.malloc(4), out=small)
        with pytest.raises(ValueError, match="C-contiguous"):
            await s.download(buf, out=dev.pinned_empty((4, 4), np.float32)[:, 0])
        assert dev.stats()["copies"] == 0 and dev.stats()["in_flight"] == 0
    with pytest.raises(aa.ClosedError):
        dev.pinned_empty(4, np.float32)
    async with open_dev() as third:
        with pytest.raises(ValueError, match=r"another device \(closed\)"):
            await third.stream().upload(third.malloc(64), small)
    del theirs, small, like
    gc.collect()
    for device in (dev, other, third):
        assert_runtime_clean(device)


async def test_a_pinned_array_outlives_its_device(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        kept = dev.pinned_empty(1024, np.float32)
        kept[:] = 3.0
        buf = dev.malloc(kept.nbytes)
        await s.upload(buf, kept)
        await s.download(buf, out=kept[:512])
        gone = dev.pinned_empty(64, np.uint8)
        del gone
    assert dev.closed
    # Its memory is still there (the runtime that owns it stays open for it) ...
    np.testing.assert_array_equal(kept, 3.0)
    kept[:] = 4.0
    np.testing.assert_array_equal(kept, 4.0)
    assert dev.stats()["pinned_arrays"] == 1
    assert live_resources(dev)["host_allocations"] == 1
    # ... and goes with the array, the runtime with it.
    del kept
    gc.collect()
    assert dev.stats()["pinned_arrays"] == 0
    assert_runtime_clean(dev)


async def test_a_pinned_array_whose_download_a_forced_close_failed_is_collected(
    anyio_backend: object,
) -> None:
    # The failed download's traceback holds its frame, and the frame the array. The device
    # kept the failure (a stall probe's batch), and the array's finalizer, a root, kept the
    # device's loop side through its hook to the loop: the array was never collected, and
    # the sim's thread, which a pinned array keeps, never ended (5 trials in 20).
    import weakref

    refs = []
    for _ in range(20):
        dev = await aa.open_device(0, backend="sim")
        s = dev.stream()
        src = dev.malloc(4096)
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(3000))
        out = dev.pinned_empty(1024, np.float32)
        refs.append(weakref.ref(out))
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(dev.aclose, timeout=0.001))
            with contextlib.suppress(aa.ClosedError, aa.TaskTimeoutError):
                await s.download(src, out=out)
        del dev, s, src, out
    gc.collect()
    assert not [ref for ref in refs if ref() is not None]
    with anyio.fail_after(10):
        while library_threads():  # noqa: ASYNC110 - the sims' threads end with their arrays
            await anyio.sleep(0.01)


async def test_the_last_pinned_array_collected_on_another_thread_after_the_close(
    open_dev: OpenDevice,
) -> None:
    """Past the close, the array's free and the deferred runtime close run in the finalizer,
    on whatever thread collects it: each binds the closed device's context for its calls and
    gives the thread its own back (here another open device's), and nothing is left."""
    async with open_dev() as other:
        async with open_dev() as dev:
            kept = [dev.pinned_empty(256, np.float32)]
        assert live_resources(dev)["host_allocations"] == 1
        contexts: list[object] = []

        def collect() -> None:
            other.runtime.set_current_context()  # the thread works with the other device
            kept.clear()
            gc.collect()
            contexts.append(other.runtime.get_current_context())
            other.runtime.release_thread()  # (a thread ending with a context current keeps it)

        thread = threading.Thread(target=collect)
        thread.start()
        await anyio.to_thread.run_sync(thread.join, 10.0)
        assert not thread.is_alive() and contexts == [other.runtime.context]
        assert dev.stats()["pinned_arrays"] == 0
        assert_runtime_clean(dev)


@pytest.mark.sim_only("the device is collected without aclose(): the sim's leak counts")
async def test_a_pinned_array_outlives_a_device_collected_without_close(
    open_dev: OpenDevice,
) -> None:
    dev = await open_dev()
    kept = dev.pinned_empty(256, np.int64)
    kept[:] = 9
    runtime = dev.runtime
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del dev
        gc.collect()
    # The poller stops, and leaves the runtime (and the sim's thread) open for `kept`.
    with anyio.fail_after(5):
        while [t for t in library_threads() if not t.name.startswith("aio_ascend-sim")]:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    np.testing.assert_array_equal(kept, 9)
    assert runtime.live_resources()["host_allocations"] == 1
    del kept
    gc.collect()
    assert runtime.live_resources()["host_allocations"] == 0
    assert not library_threads(), "the runtime was not closed after its last pinned array"


@pytest.mark.backends("cuda-fake", "cuda")
async def test_pinned_arrays_on_cuda(device_backend: str) -> None:
    # The cuda backend's malloc_host is cuMemHostAlloc: copies from and to it are direct too.
    async with open_backend(device_backend) as dev:
        s = dev.stream()
        src = dev.pinned_empty(2 * STAGE_AT_HAND_BYTES // 4, np.float32)
        src[:] = np.arange(src.size, dtype=np.float32)
        buf = dev.malloc(src.nbytes)
        out = dev.pinned_like(src)
        await s.upload(buf, src)
        await s.download(buf, out=out)
        np.testing.assert_array_equal(out, src)
        assert _staged(dev) == 0
        del src, out
    assert_runtime_clean(dev)
