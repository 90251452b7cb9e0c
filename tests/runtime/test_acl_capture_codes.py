"""Capture error codes on the acl backend: the runtime's named codes (107024-107040, 507903)
become typed errors, the C double returns them where the runtime's source does, and a capture
the runtime invalidated ends with a typed error, nothing leaked and the stream usable."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator

import anyio
import numpy as np
import pytest
from doubles.acl_double import DoubleControl, build_double, double_control
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._errors import (
    AclCode,
    CaptureError,
    CaptureInvalidatedError,
    StreamAbortError,
    error_for_code,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime import abi
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

F32 = np.float32
H2D, D2H = abi.ACL_MEMCPY_HOST_TO_DEVICE, abi.ACL_MEMCPY_DEVICE_TO_HOST


@pytest.fixture
def ctl() -> DoubleControl:
    return double_control()


@pytest.fixture
def rt() -> Iterator[AclRuntime]:
    runtime = open_acl_runtime(0, library_path=build_double().library)
    yield runtime
    runtime.close()


@pytest.fixture(params=["acl", pytest.param("realrt", marks=pytest.mark.realrt)])
def any_rt(request: pytest.FixtureRequest) -> Iterator[AclRuntime]:
    """The acl backend over the C double, and over the real runtime (``tests/realrt``): for
    the tests that hold the double to what the runtime answers, without the double's controls."""
    if request.param == "realrt":
        from realrt.fixture import open_realrt_runtime

        runtime: AclRuntime = open_realrt_runtime()
    else:
        runtime = open_acl_runtime(0, library_path=build_double().library)
    yield runtime
    runtime.close()


def _invalidate(ctl: DoubleControl, stream: int) -> bool:
    fn = ctl.lib.double_invalidate_capture
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    return bool(fn(stream))


def _invalidate_all(ctl: DoubleControl, on: bool) -> None:
    fn = ctl.lib.double_invalidate_captures
    fn.argtypes, fn.restype = [ctypes.c_int], None
    fn(int(on))


def _launch_scale(rt: AclRuntime, stream: int, x: int, y: int, n: int, a: float) -> None:
    binary = rt.load_binary(build_double().builtins)
    func = rt.get_function(binary, "scale")
    packed = (
        HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, a)).pack(rt.function_info(func))
    )
    image = ctypes.create_string_buffer(packed.image, len(packed.image))
    table = b"".join(struct.pack("<II", a_, d) for a_, d in packed.placeholders)
    tbuf = ctypes.create_string_buffer(table, max(len(table), 1))
    rt.launch_kernel_with_host_args(
        func,
        1,
        stream,
        None,
        ctypes.addressof(image),
        len(packed.image),
        ctypes.addressof(tbuf) if table else 0,
        len(packed.placeholders),
    )


def test_every_named_capture_code_has_a_typed_error() -> None:
    """rt_error_codes.h:44-61 and 154: the capture codes are CaptureError, 507903 its
    invalidated kind; 107035 (a task-abort code among them) is a StreamAbortError."""
    capture_codes = [c for c in range(107024, 107041) if c != 107035]
    for code in capture_codes:
        err = error_for_code(code, "aclmdlRICaptureEnd")
        assert type(err) is CaptureError and err.code == code, code
        assert isinstance(err, aa.RuntimeAPIError)
    invalidated = error_for_code(AclCode.RT_STREAM_CAPTURE_INVALIDATED, "aclmdlRICaptureEnd")
    assert type(invalidated) is CaptureInvalidatedError and invalidated.code == 507903
    assert isinstance(invalidated, CaptureError)
    assert type(error_for_code(107035)) is StreamAbortError
    assert abi.ACL_ERROR_RT_STREAM_CAPTURED == 107027
    assert abi.ACL_ERROR_RT_STREAM_NOT_CAPTURED == 107029


@pytest.mark.runtime_source
def test_an_invalidated_capture_ends_typed_with_nothing_left(
    rt: AclRuntime, ctl: DoubleControl
) -> None:
    """context_aclgraph.cc:544-561: CaptureEnd of an invalidated capture returns 507903, clears
    the model and leaves the stream out of capture mode; the stream works after it."""
    stream = rt.create_stream()
    n = 4
    x, y = rt.malloc(4 * n), rt.malloc(4 * n)
    models = ctl.live_counts()["models"]
    rt.begin_capture(stream)
    _launch_scale(rt, stream, x, y, n, 2.0)
    assert _invalidate(ctl, stream)
    with pytest.raises(CaptureInvalidatedError) as info:
        rt.end_capture(stream)
    assert info.value.code == 507903 and info.value.func == "aclmdlRICaptureEnd"
    assert not rt._capturing and not rt.capture.graphs
    assert ctl.live_counts()["models"] == models
    src = np.arange(n, dtype=F32)
    rt.memcpy_async(x, 4 * n, src.ctypes.data, 4 * n, H2D, stream)
    _launch_scale(rt, stream, x, y, n, 3.0)
    out = np.zeros(n, F32)
    rt.memcpy_async(out.ctypes.data, 4 * n, y, 4 * n, D2H, stream)
    rt.synchronize_stream(stream, 5000)
    np.testing.assert_array_equal(out, 3.0 * src)
    rt.begin_capture(stream)  # and it can capture again
    graph = rt.end_capture(stream)
    rt.destroy_graph(graph)
    rt.destroy_stream(stream)


@pytest.mark.runtime_source
def test_the_double_refuses_a_sync_of_a_capturing_stream_with_107027(any_rt: AclRuntime) -> None:
    """api_error.cc:1446-1449 (sync), 4056-4058 (model execution), 1390-1392 (destroy)."""
    rt = any_rt
    stream, other = rt.create_stream(), rt.create_stream()
    rt.begin_capture(other)
    empty = rt.end_capture(other)
    fn = rt._fn
    fn["aclmdlRICaptureBegin"](stream, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    for name, args in (
        ("aclrtSynchronizeStreamWithTimeout", (stream, 1000)),
        ("aclmdlRIExecuteAsync", (rt.capture.graphs[empty], stream)),
        ("aclrtDestroyStreamForce", (stream,)),
    ):
        with pytest.raises(CaptureError) as info:
            fn[name](*args)
        assert info.value.code == abi.ACL_ERROR_RT_STREAM_CAPTURED, name
    model = ctypes.c_void_p()
    fn["aclmdlRICaptureEnd"](stream, ctypes.byref(model))
    fn["aclmdlRIDestroy"](model.value)
    rt.destroy_graph(empty)
    rt.destroy_stream(stream)
    rt.destroy_stream(other)


@pytest.mark.runtime_source
def test_a_captured_event_record_runs_at_each_replay(rt: AclRuntime, ctl: DoubleControl) -> None:
    """api_impl.cc:2150-2160: a record on a capturing stream is captured (only the external
    flag checks the capture); the event is recorded when the model runs."""
    stream, replay = rt.create_stream(), rt.create_stream()
    event = rt.create_event(abi.ACL_EVENT_SYNC | abi.ACL_EVENT_TIME_LINE)
    fn = rt._fn
    fn["aclmdlRICaptureBegin"](stream, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    fn["aclrtRecordEvent"](event, stream)
    model = ctypes.c_void_p()
    fn["aclmdlRICaptureEnd"](stream, ctypes.byref(model))
    assert ctl.model_tasks(model.value) == (1, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    generation = ctl.event_generation(event)
    fn["aclmdlRIExecuteAsync"](model.value, replay)
    rt.synchronize_stream(replay, 5000)
    assert ctl.event_generation(event) == generation  # the capture did not re-record it
    fn["aclmdlRIDestroy"](model.value)
    rt.destroy_event(event)
    rt.destroy_stream(stream)
    rt.destroy_stream(replay)


@pytest.mark.runtime_source
@pytest.mark.anyio
async def test_a_stream_capture_the_runtime_invalidates_fails_typed_and_leaks_nothing(
    ctl: DoubleControl, anyio_backend: object
) -> None:
    """Stream.capture() whose CaptureEnd returns 507903: the capture raises
    CaptureInvalidatedError, no graph is left, and the stream keeps working."""
    async with open_backend("acl") as dev:
        s = dev.stream()
        n = 16
        x, y = dev.malloc(4 * n), dev.malloc(4 * n)
        await s.upload(x, np.ones(n, F32))
        await s.memset(y, 0)
        fn = dev.function("axpy")
        buffers = dev.stats()["device_buffers"]
        models = ctl.live_counts()["models"]
        _invalidate_all(ctl, True)
        try:
            with pytest.raises(CaptureInvalidatedError):
                async with s.capture() as capture:
                    capture.launch(fn, 1, HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
        finally:
            _invalidate_all(ctl, False)
        assert dev.stats()["graphs"] == 0
        assert dev.stats()["device_buffers"] == buffers
        assert ctl.live_counts()["models"] == models
        await s.launch(fn, 1, HostArgs().ptr(x).ptr(y).f32(2.0).u32(n))
        assert (await s.download(y, F32)).tolist() == [2.0] * n
        with anyio.fail_after(10):
            await s.synchronize()
