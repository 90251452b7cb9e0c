"""The device-args launch path (CANN 8.0, ``aio_ascend/_runtime/acl/devargs.py``) on the C
double's 8.0 persona: the legacy loader, what crosses for each launch, the staging ring's reuse
only after completion (wrapping and growing), cancellation, close, refusals before the runtime,
and the double's own strictness (args read from device memory when the kernel runs).
"""

from __future__ import annotations

import ctypes
import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pytest
from doubles.acl_double import DoubleControl, build_double, double_control, open_double_runtime

import aio_ascend as aa
from aio_ascend._errors import (
    AICoreExceptionError,
    BackendUnavailableError,
    DeviceFaultError,
    InvalidHandleError,
    InvalidParamError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._launch_config import LaunchConfig
from aio_ascend._runtime.abi import (
    ACL_MEMCPY_HOST_TO_DEVICE,
)
from aio_ascend._runtime.acl import devargs
from aio_ascend._runtime.acl.paths import LaunchPath, choose_path
from aio_ascend._runtime.acl.runtime import AclRuntime
from aio_ascend._runtime.hostmem import host_view

F32 = np.float32
SYNC_MS = 10_000
#: what the runtime reaches the device through on this path
QUEUEING = {"aclrtMalloc", "aclrtMallocHost", "aclrtMemcpyAsync", "aclrtLaunchKernel"}

if TYPE_CHECKING:
    from conftest import RuntimeKit


@pytest.fixture
def ctl() -> DoubleControl:
    return double_control("8.0")


@pytest.fixture
def rt() -> Iterator[AclRuntime]:
    runtime = open_double_runtime(persona="8.0")
    try:
        yield runtime
    finally:
        runtime.close()


def _scale(x: int, y: int, n: int, factor: float, align: int = 8) -> HostArgs:
    return HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, factor), align=align)


# --- the path and what crosses --------------------------------------------------------------------


def test_the_path_is_chosen_by_symbols_after_the_other_two() -> None:
    device_args = {"aclrtLaunchKernel", "aclrtCreateBinary", "aclrtBinaryLoad"}
    path, missing = choose_path(device_args.__contains__)
    assert path is LaunchPath.DEVICE_ARGS
    assert set(missing) == {LaunchPath.HOST_ARGS, LaunchPath.ARGS_HANDLE}
    everything = device_args | {"aclrtLaunchKernelWithHostArgs", "aclrtBinaryLoadFromFile"}
    everything |= {"aclrtBinaryLoadFromData"}
    assert choose_path(everything.__contains__)[0] is LaunchPath.HOST_ARGS
    path, missing = choose_path((device_args - {"aclrtBinaryLoad"}).__contains__)
    assert path is None
    assert missing[LaunchPath.DEVICE_ARGS] == ["aclrtBinaryLoad"]


def test_a_launch_stages_copies_and_launches_in_stream_order(
    rt: AclRuntime, ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    assert rt.launch_path == "device_args"
    assert rt.info()["launch_path"] == "device_args"
    kit = make_kit(rt)
    n = 8
    x = kit.upload(np.arange(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    args = _scale(x, y, n, 3.0, align=64)
    mark = ctl.mark()
    addr = kit.launch("scale", args)
    size = args.nbytes
    calls = [c for c in ctl.calls(mark) if c.name in ("aclrtMemcpyAsync", "aclrtLaunchKernel")]
    assert [c.name for c in calls] == ["aclrtMemcpyAsync", "aclrtLaunchKernel"]
    copy, launch = calls
    region = launch.args[2]
    # the copy: host to device, into the region the kernel gets, from pinned memory of the ring
    assert (copy.args[0], copy.args[1], copy.args[3], copy.args[4]) == (region, size, size, 1)
    assert copy.args[5] == launch.args[4] == kit.stream
    assert copy.args[2] != addr  # not the caller's buffer: the ring's pinned mirror
    assert (launch.args[1], launch.args[3]) == (1, size)
    assert region % 64 == 0  # the 64-aligned data block keeps its alignment on the device
    assert ctl.last_launch_path() == "device_args"
    np.testing.assert_array_equal(kit.download(y, n), 3.0 * np.arange(n, dtype=F32))
    # the caller's buffer is read during the call, never patched
    assert bytes(host_view(addr, size)) == args.to_bytes()
    # the device image: the slot holds region + dataOffset, the rest is the caller's image
    ((slot, data),) = args.placeholders
    image = kit.read(region, size)
    assert struct.unpack_from("<Q", image, slot)[0] == region + data
    assert image[data:] == args.to_bytes()[data:]


def test_launches_without_placeholders_and_with_several(
    rt: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(rt)
    n = 5
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.full(n, 2.0, dtype=F32))
    kit.launch("axpy", HostArgs().ptr(x).ptr(y).f32(3.0).u32(n))  # no placeholder
    m, k, p = 3, 4, 2
    a_host = np.arange(m * k, dtype=F32).reshape(m, k)
    b_host = np.arange(k * p, dtype=F32).reshape(k, p)
    a, b, c = kit.upload(a_host), kit.upload(b_host), rt.malloc(m * p * 4)
    kit.launch("matmul", HostArgs().ptr(a).ptr(b).ptr(c).placeholder(struct.pack("<III", m, p, k)))
    kit.launch("noop", HostArgs())
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 5.0, F32))
    np.testing.assert_allclose(kit.download(c, m * p).reshape(m, p), a_host @ b_host)


# --- the ring: reuse only after completion --------------------------------------------------------


def _small_ring(rt: AclRuntime, capacity: int = 4096) -> devargs.DeviceArgsPath:
    path = rt._devargs
    assert path is not None
    path.capacity = capacity  # read when a stream's ring is created (its first launch)
    return path


def test_the_ring_wraps_only_after_the_fenced_work_completed(
    rt: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    path = _small_ring(rt)
    kit = make_kit(rt)
    n = 4
    count = 200  # 200 images of >= 64 bytes through a 4 KiB ring: it wraps several times
    x = kit.upload(np.ones(n, dtype=F32))
    outputs = [rt.malloc(4 * n) for _ in range(count)]
    # a kernel at the head of the stream keeps every later copy queued: each slot's pinned
    # source is read only when its copy runs, so a slot reused early would hand a later launch's
    # factor to an earlier kernel; sleeps in between fault if their own args are overwritten
    kit.launch("sleep", HostArgs().u32(20_000))
    for index, out in enumerate(outputs):
        kit.launch("scale", _scale(x, out, n, float(index)))
        if index % 50 == 0:
            kit.launch("sleep", HostArgs().u32(2_000))
    rt.synchronize_stream(kit.stream, SYNC_MS)
    for index, out in enumerate(outputs):
        np.testing.assert_array_equal(kit.download(out, n), np.full(n, float(index), F32))
    stats = path.stats(kit.stream)
    assert stats["capacity"] == 4096
    assert stats["waits"] > 0  # the ring was full while the sleep held the stream
    assert stats["fences"] > 0
    assert stats["grows"] == 0


def test_the_ring_grows_for_an_image_larger_than_itself(
    rt: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    path = _small_ring(rt)
    kit = make_kit(rt)
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    small, big = rt.malloc(4 * n), rt.malloc(4 * n)
    kit.launch("sleep", HostArgs().u32(5_000))
    kit.launch("scale", _scale(x, small, n, 2.0))
    # 10 KiB of padding before the tiling: the image is larger than the 4 KiB ring
    kit.launch("scale", _scale(x, big, n, 7.0, align=2048).placeholder(bytes(10_000)))
    kit.launch("scale", _scale(x, small, n, 3.0))
    rt.synchronize_stream(kit.stream, SYNC_MS)
    assert path.stats(kit.stream)["grows"] == 1
    assert path.stats(kit.stream)["capacity"] >= 16 * 1024
    np.testing.assert_array_equal(kit.download(big, n), np.full(n, 7.0, F32))
    np.testing.assert_array_equal(kit.download(small, n), np.full(n, 3.0, F32))


def test_each_stream_has_its_own_ring(rt: AclRuntime, make_kit: Callable[..., RuntimeKit]) -> None:
    path = _small_ring(rt)
    kit = make_kit(rt)
    other = rt.create_stream()
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    rt.synchronize_stream(kit.stream, SYNC_MS)
    ys = [rt.malloc(4 * n) for _ in range(60)]
    kit.launch("sleep", HostArgs().u32(10_000), stream=other)
    for index, y in enumerate(ys):
        kit.launch("scale", _scale(x, y, n, float(index)), stream=(kit.stream, other)[index % 2])
    rt.synchronize_stream(other, SYNC_MS)
    for index, y in enumerate(ys):
        np.testing.assert_array_equal(kit.download(y, n), np.full(n, float(index), F32))
    assert path.stats(kit.stream)["allocations"] == 30
    assert path.stats(other)["allocations"] == 31  # and the sleep


# --- lifetime: destroy, close ---------------------------------------------------------------------


def test_close_frees_the_rings_and_their_fences(
    ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    before = ctl.live_counts()
    runtime = open_double_runtime(persona="8.0")
    _small_ring(runtime)
    kit = make_kit(runtime)
    forced = runtime.create_stream()
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    for index in range(100):
        kit.launch("scale", _scale(x, y, n, float(index)), stream=(kit.stream, forced)[index % 2])
    kit.launch("sleep", HostArgs().u32(100_000), stream=forced)
    runtime.destroy_stream_force(forced)  # its ring stays until close: a kernel may read it
    runtime.synchronize_stream(kit.stream, SYNC_MS)
    assert ctl.live_counts()["events"] > before["events"]  # the fences
    runtime.close()
    assert runtime.close_errors == ()
    after = ctl.live_counts()
    for key in ("device_allocs", "host_allocs", "events", "streams", "queued_tasks"):
        assert after[key] == before[key], key


def test_destroying_a_drained_stream_frees_its_ring_at_once(
    rt: AclRuntime, ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(rt)
    stream = rt.create_stream()
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    rt.synchronize_stream(kit.stream, SYNC_MS)
    before = ctl.live_counts()
    kit.launch("scale", _scale(x, y, n, 2.0), stream=stream)
    assert ctl.live_counts()["device_allocs"] == before["device_allocs"] + 1
    assert ctl.live_counts()["host_allocs"] > before["host_allocs"]
    rt.destroy_stream(stream)  # waits for its work, then the ring goes
    assert ctl.live_counts()["device_allocs"] == before["device_allocs"]
    assert rt._devargs is not None and rt._devargs.stats(stream)["allocations"] == 0
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))


# --- refusals before the runtime ------------------------------------------------------------------


def test_bad_input_is_refused_before_anything_is_queued(
    rt: AclRuntime, ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(rt)
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    rt.synchronize_stream(kit.stream, SYNC_MS)
    args = _scale(x, y, n, 2.0)
    image, table = args.to_bytes(), args.placeholder_table()
    addr, table_addr = kit.pinned(image), kit.pinned(table)
    good: dict[str, Any] = {
        "func": kit.fn("scale"),
        "num_blocks": 1,
        "stream": kit.stream,
        "cfg": None,
        "args_addr": addr,
        "args_size": len(image),
        "placeholders_addr": table_addr,
        "placeholder_count": 1,
    }
    bad_table = kit.pinned(struct.pack("<II", 4, 32))
    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"func": 0xDEAD}, InvalidHandleError),
        ({"stream": 0xBEEF}, InvalidHandleError),
        ({"num_blocks": 0}, InvalidParamError),
        ({"args_size": 0}, InvalidParamError),
        ({"placeholders_addr": bad_table}, InvalidParamError),
        ({"cfg": {"timeout_s": 1}}, InvalidParamError),
        ({"cfg": LaunchConfig(timeout_us=5)}, BackendUnavailableError),
        ({"cfg": LaunchConfig(schedule_mode="batch")}, BackendUnavailableError),
    ]
    mark = ctl.mark()
    for override, error in cases:
        with pytest.raises(error):
            rt.launch_kernel_with_host_args(**{**good, **override})
    assert not [c.name for c in ctl.calls(mark) if c.name in QUEUEING]
    assert bytes(host_view(addr, len(image))) == image
    rt.launch_kernel_with_host_args(**good)
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))


@pytest.mark.anyio
async def test_a_kernel_timeout_is_refused_not_ignored(anyio_backend: object) -> None:
    from helpers import open_backend

    async with open_backend("acl-8.0") as dev:
        s = dev.stream()
        with pytest.raises(BackendUnavailableError, match="aclrtLaunchKernelV2") as info:
            await s.run(dev.function("noop"), 1, config=aa.LaunchConfig(timeout_us=20_000))
        assert info.value.func == "aclrtLaunchKernelV2"
        await s.run(dev.function("noop"), 1)  # nothing stuck, nothing faulted


def test_8_0_has_no_capture(rt: AclRuntime) -> None:
    stream = rt.create_stream()
    with pytest.raises(BackendUnavailableError, match="aclmdlRICaptureBegin"):
        rt.begin_capture(stream)


# --- the loader -----------------------------------------------------------------------------------


def test_the_legacy_loader_loads_bytes_and_files(
    rt: AclRuntime, ctl: DoubleControl, tmp_path: Path
) -> None:
    data = build_double("8.0").builtins.read_bytes()
    mark = ctl.mark()
    binary = rt.load_binary(data)
    names = [c.name for c in ctl.calls(mark) if c.name.startswith(("aclrtCreate", "aclrtBinary"))]
    assert names == ["aclrtCreateBinary", "aclrtBinaryLoad"]  # no aclrtDestroyBinary on 8.0
    (create,) = ctl.calls(mark, "aclrtCreateBinary")
    assert create.args[1] == len(data)
    assert rt.get_function(binary, "noop")
    rt.unload_binary(binary)
    path = tmp_path / "kernels.o"
    path.write_bytes(data)
    mark = ctl.mark()
    binary = rt.load_binary(path)
    assert not ctl.calls(mark, "aclrtBinaryLoadFromFile")
    (create,) = ctl.calls(mark, "aclrtCreateBinary")
    assert create.args[1] == len(data)  # the file, read and loaded as bytes
    assert ctl.binary_kernel_type(binary) == ("cube", False)  # the chip's default (A2/A3)
    rt.unload_binary(binary)


def test_the_legacy_loader_takes_no_options(rt: AclRuntime, ctl: DoubleControl) -> None:
    data = build_double("8.0").builtins.read_bytes()
    mark = ctl.mark()
    with pytest.raises(ValueError, match="kernel_type cannot be given"):
        rt.load_binary(data, kernel_type="vector")
    with pytest.raises(ValueError, match="lazy cannot be given"):
        rt.load_binary(data, lazy=True)
    with pytest.raises(ValueError, match="empty"):
        rt.load_binary(b"")
    with pytest.raises(TypeError):
        rt.load_binary(42)
    assert not ctl.calls(mark, "aclrtCreateBinary")


def test_a_refused_binary_names_the_runtimes_reason(rt: AclRuntime) -> None:
    with pytest.raises(InvalidParamError, match="not a kernel binary"):
        rt.load_binary(b"not a kernel")


def test_a_mix_kernel_is_refused_on_8_0(rt: AclRuntime, tmp_path: Path) -> None:
    path = tmp_path / "mix.o"
    path.write_bytes(build_double("8.0").builtins.read_bytes())
    path.with_suffix(".json").write_text(json.dumps({"magic": "FFTS_BINARY_MAGIC_ELF_MIX_AIC"}))
    binary = rt.load_binary(path)
    func = rt.get_function(binary, "mix_add")
    with pytest.raises(BackendUnavailableError, match="MIX kernel"):
        rt.function_info(func)
    info = rt.function_info(rt.get_function(rt.load_binary(None), "noop"))
    assert info.params is None and info.prefix == () and len(info.suffix) == 1  # the overflow


def test_the_descriptor_is_destroyed_where_the_release_exports_it() -> None:
    calls: list[tuple[str, tuple[object, ...]]] = []

    def record(name: str, result: object = 0) -> Any:
        def call(*args: object) -> object:
            calls.append((name, args))
            if name == "aclrtBinaryLoad":
                ctypes.cast(args[1], ctypes.POINTER(ctypes.c_void_p))[0] = 0x5000
            return result

        return call

    table = {
        "aclrtCreateBinary": record("aclrtCreateBinary", 0x1234),
        "aclrtBinaryLoad": record("aclrtBinaryLoad"),
        "aclrtDestroyBinary": record("aclrtDestroyBinary"),
    }
    for present in (True, False):
        calls.clear()
        handle, kept, kind = devargs.load_legacy(
            table, lambda name, p=present: p, b"kernel", None, None, str
        )
        assert (handle, kept, kind) == (0x5000, b"kernel", None)
        expected = ["aclrtCreateBinary", "aclrtBinaryLoad"] + ["aclrtDestroyBinary"] * present
        assert [name for name, _ in calls] == expected
        if present:
            assert calls[-1][1] == (0x1234,)


# --- the double is as strict as the device --------------------------------------------------------


def _raw_launch(rt: AclRuntime, kit: RuntimeKit, name: str, args_ptr: int, size: int) -> None:
    rt._fn["aclrtLaunchKernel"](kit.fn(name), 1, args_ptr, size, kit.stream)


def test_the_double_faults_args_outside_device_memory(
    rt: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(rt)
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    image = HostArgs().ptr(x).ptr(y).f32(1.0).u32(n).to_bytes()
    _raw_launch(rt, kit, "axpy", kit.pinned(image), len(image))  # host memory: not device args
    with pytest.raises(AICoreExceptionError, match="illegal args address"):
        rt.synchronize_stream(kit.stream, SYNC_MS)


def test_the_double_faults_args_freed_before_the_kernel_runs(
    ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    runtime = open_double_runtime(persona="8.0")
    try:
        kit = make_kit(runtime)
        n = 4
        x = kit.upload(np.ones(n, dtype=F32))
        image = HostArgs().ptr(x).ptr(x).f32(1.0).u32(n).to_bytes()
        args = kit.upload(np.frombuffer(image, dtype=np.uint8))
        runtime.synchronize_stream(kit.stream, SYNC_MS)  # the args are on the device
        kit.launch("sleep", HostArgs().u32(20_000))
        _raw_launch(runtime, kit, "axpy", args, len(image))
        runtime.free(args)  # freed while the kernel that reads it is still queued
        with pytest.raises(DeviceFaultError, match="illegal args address"):
            runtime.synchronize_stream(kit.stream, SYNC_MS)
    finally:
        runtime.close()


def test_the_double_faults_args_overwritten_while_the_kernel_runs(
    ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    runtime = open_double_runtime(persona="8.0")
    try:
        kit = make_kit(runtime)
        image = HostArgs().u32(30_000).to_bytes()  # sleep 30 ms
        args = kit.upload(np.frombuffer(image, dtype=np.uint8))
        runtime.synchronize_stream(kit.stream, SYNC_MS)
        _raw_launch(runtime, kit, "sleep", args, len(image))
        other = runtime.create_stream()
        src = kit.pinned(bytes(len(image)))
        time.sleep(0.005)  # the sleep kernel has started (the device thread is quick)
        runtime.memcpy_async(args, len(image), src, len(image), ACL_MEMCPY_HOST_TO_DEVICE, other)
        runtime.synchronize_stream(other, SYNC_MS)
        with pytest.raises(DeviceFaultError, match="overwritten while the kernel ran"):
            runtime.synchronize_stream(kit.stream, SYNC_MS)
    finally:
        runtime.close()


# --- the scheduler on top: cancellation does not free early ---------------------------------------


@pytest.mark.anyio
async def test_cancelled_waits_leave_the_staged_args_alone(anyio_backend: object) -> None:
    from helpers import assert_runtime_clean, download, open_backend, upload

    async with open_backend("acl-8.0") as dev:
        devargs_path = dev.runtime._devargs
        assert devargs_path is not None
        devargs_path.capacity = 4096  # 80 launches wrap it while the sleep holds the stream
        s = dev.stream()
        n = 4
        x = await upload(dev, s, np.ones(n, dtype=F32))
        outs = [dev.malloc(4 * n) for _ in range(80)]
        await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(20_000))
        for index, out in enumerate(outs):
            args = aa.HostArgs().ptr(x).ptr(out)
            task = await s.launch(
                dev.function("scale"), 1, args.placeholder(struct.pack("<If", n, float(index)))
            )
            with anyio.move_on_after(0):  # only the wait is cancelled: the kernel runs
                await task
        await s.synchronize()
        for index, out in enumerate(outs):
            np.testing.assert_array_equal(await download(s, out, n), np.full(n, float(index), F32))
    assert_runtime_clean(dev)
