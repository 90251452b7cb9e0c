"""The ``Runtime`` protocol contract, run against every backend in ``backends.RUNTIME_FACTORIES``.

Everything here is written against the protocol only (``aio_ascend._runtime.base``); kernel
args are always packed with ``HostArgs`` into pinned buffers from ``malloc_host``. Tests that
rely on the sim's extra strictness or its test controls are marked ``sim_only``.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from backends import (
    REAL_DEVICE,
    REFUSES_ALL_AFTER_FAULT,
    RUNTIME_FACTORIES,
    backend_params,
    gpu_skip_reason,
    mark_realrt_divergence,
    skip_without_kernels,
)

from aio_ascend._errors import (
    BackendUnavailableError,
    ContextNullError,
    DeviceFaultError,
    EventSyncTimeoutError,
    InvalidHandleError,
    InvalidParamError,
    MemoryAllocationError,
    RuntimeAPIError,
    StreamSyncTimeoutError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._launch_config import LaunchConfig
from aio_ascend._runtime import Runtime
from aio_ascend._runtime.abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_EVENT_SYNC,
    ACL_EVENT_TIME_LINE,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_STOP_ON_FAILURE,
)
from aio_ascend._runtime.hostmem import host_view

F32 = np.float32
COMPLETE = ACL_EVENT_RECORDED_STATUS_COMPLETE
NOT_READY = ACL_EVENT_RECORDED_STATUS_NOT_READY
SYNC_MS = 10_000  # generous bound for waits that must succeed


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name != "sim" and request.node.get_closest_marker("sim_only") is not None:
        pytest.skip("relies on the sim backend's strictness or test controls")
    if name in REAL_DEVICE and (reason := gpu_skip_reason()):
        pytest.skip(reason)
    mark_realrt_divergence(request, name)
    return name


def _open(backend: str) -> Runtime:
    return RUNTIME_FACTORIES[backend]()


@pytest.fixture
def rt(backend: str) -> Iterator[Runtime]:
    runtime = _open(backend)
    try:
        yield runtime
    finally:
        runtime.close()


class Dev:
    """Thin helpers over a Runtime: pinned args packing, uploads, downloads."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._binary: int | None = None
        self._functions: dict[str, int] = {}
        self.stream = runtime.create_stream()
        runtime.set_stream_failure_mode(self.stream, ACL_STOP_ON_FAILURE)

    @property
    def binary(self) -> int:
        """The built-in kernels, loaded on first use (a test without kernels never loads them)."""
        if self._binary is None:
            skip_without_kernels(self.rt)
            self._binary = self.rt.load_binary(None)
        return self._binary

    def fn(self, name: str) -> int:
        if name not in self._functions:
            self._functions[name] = self.rt.get_function(self.binary, name)
        return self._functions[name]

    def new_stream(self) -> int:
        stream = self.rt.create_stream()
        self.rt.set_stream_failure_mode(stream, ACL_STOP_ON_FAILURE)
        return stream

    def pinned(self, data: bytes) -> int:
        addr = self.rt.malloc_host(len(data))
        host_view(addr, len(data))[:] = data
        return addr

    def pack(self, args: HostArgs) -> tuple[int, int, int, int]:
        """(args addr, args size, table addr, placeholder count), all in pinned memory."""
        image = args.to_bytes()
        table = args.placeholder_table()
        table_addr = self.pinned(table) if table else 0
        return self.pinned(image), len(image), table_addr, len(args.placeholders)

    def launch(
        self,
        name: str,
        args: HostArgs,
        stream: int | None = None,
        blocks: int = 1,
        cfg: LaunchConfig | None = None,
    ) -> int:
        addr, size, table, count = self.pack(args)
        self.rt.launch_kernel_with_host_args(
            self.fn(name),
            blocks,
            self.stream if stream is None else stream,
            cfg,
            addr,
            size,
            table,
            count,
        )
        return addr

    def upload(self, array: np.ndarray[Any, Any], stream: int | None = None) -> int:
        data = np.ascontiguousarray(array).tobytes()
        ptr = self.rt.malloc(len(data))
        src = self.pinned(data)
        stream = self.stream if stream is None else stream
        self.rt.memcpy_async(ptr, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, stream)
        self.rt.synchronize_stream(stream, SYNC_MS)
        return ptr

    def download(
        self, ptr: int, count: int, dtype: Any = F32, stream: int | None = None
    ) -> np.ndarray[Any, Any]:
        nbytes = count * np.dtype(dtype).itemsize
        dst = self.rt.malloc_host(nbytes)
        stream = self.stream if stream is None else stream
        self.rt.memcpy_async(dst, nbytes, ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST, stream)
        self.rt.synchronize_stream(stream, SYNC_MS)
        return np.frombuffer(bytes(host_view(dst, nbytes)), dtype=dtype).copy()

    def sleep_us(self, microseconds: int, stream: int | None = None) -> None:
        self.launch("sleep", HostArgs().u32(microseconds), stream)

    def hang(self, stream: int) -> None:
        self.launch("hang", HostArgs(), stream)


@pytest.fixture
def dev(rt: Runtime) -> Dev:
    return Dev(rt)


def scale_args(x: int, y: int, n: int, factor: float) -> HostArgs:
    return HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, factor))


def axpy_args(x: int, y: int, a: float, n: int) -> HostArgs:
    return HostArgs().ptr(x).ptr(y).f32(a).u32(n)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException], list[Any]]:
    errors: list[BaseException] = []
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="contract-helper", daemon=True)
    thread.start()
    return thread, errors, results


# --- ordering and kernels ---------------------------------------------------------------------


def test_many_axpy_launches_give_the_sequential_result(dev: Dev) -> None:
    n = 257
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal(n).astype(F32)
    y_host = rng.standard_normal(n).astype(F32)
    x, y = dev.upload(x_host), dev.upload(y_host)
    coefficients = [float(F32(v)) for v in rng.uniform(-2, 2, size=64)]
    expected = y_host.copy()
    for a in coefficients:
        dev.launch("axpy", axpy_args(x, y, a, n))
        expected += F32(a) * x_host
    dev.rt.synchronize_stream(dev.stream, SYNC_MS)
    np.testing.assert_array_equal(dev.download(y, n), expected)


def _apply(order: list[str], x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> Any:
    y = y.copy()
    for step in order:
        if step == "axpy":
            y += F32(2.0) * x
        else:
            y *= F32(3.0)
    return y


@pytest.mark.parametrize(
    "order", [["axpy", "scale", "axpy"], ["scale", "axpy", "axpy"], ["axpy", "axpy", "scale"]]
)
def test_in_place_scale_interleaved_with_axpy_follows_stream_order(
    dev: Dev, order: list[str]
) -> None:
    n = 64
    x_host = np.arange(n, dtype=F32)
    y_host = np.full(n, 1.0, dtype=F32)
    x, y = dev.upload(x_host), dev.upload(y_host)
    for step in order:
        if step == "axpy":
            dev.launch("axpy", axpy_args(x, y, 2.0, n))
        else:
            dev.launch("scale", scale_args(y, y, n, 3.0))
    expected = _apply(order, x_host, y_host)
    others = [o for o in (["axpy", "scale", "axpy"], ["scale", "axpy", "axpy"]) if o != order]
    assert all(not np.array_equal(expected, _apply(o, x_host, y_host)) for o in others)
    np.testing.assert_array_equal(dev.download(y, n), expected)


def test_placeholder_addresses_are_patched_into_the_callers_buffer(dev: Dev) -> None:
    if getattr(dev.rt, "launch_path", "host_args") in ("args_handle", "device_args"):
        pytest.skip("on the args-handle and device-args paths the caller's buffer is not patched")
    n = 16
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.zeros(n, F32))
    args = (
        HostArgs()
        .ptr(x)
        .ptr(y)
        .placeholder(struct.pack("<If", n, 2.0))
        .u32(7)
        .placeholder(b"12345678", align=64)
    )
    image = args.to_bytes()
    placeholders = args.placeholders
    addr, size, table, count = dev.pack(args)
    dev.rt.launch_kernel_with_host_args(
        dev.fn("scale"), 1, dev.stream, None, addr, size, table, count
    )
    after = bytes(host_view(addr, size))
    slots = [struct.unpack_from("<Q", after, a)[0] for a, _ in placeholders]
    bases = {slot - data_offset for slot, (_, data_offset) in zip(slots, placeholders, strict=True)}
    assert len(bases) == 1, "every slot must hold region + dataOffset of one args region"
    (region,) = bases
    assert region != 0
    assert region != addr
    assert all(slot % 8 == 0 for slot in slots)
    # everything outside the slots is unchanged
    mask = bytearray(after)
    for a, _ in placeholders:
        mask[a : a + 8] = image[a : a + 8]
    assert bytes(mask) == image
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 2.0, F32))


def test_scale_reads_its_tiling_through_the_placeholder(dev: Dev) -> None:
    n = 100
    x_host = np.linspace(-1, 1, n, dtype=F32)
    x, y = dev.upload(x_host), dev.upload(np.zeros(n, F32))
    dev.launch("scale", scale_args(x, y, n, -1.5))
    np.testing.assert_array_equal(dev.download(y, n), x_host * F32(-1.5))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (7, 5, 3), (32, 16, 24)])
def test_matmul_through_placeholder(dev: Dev, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 100 + n)
    a_host = rng.standard_normal((m, k)).astype(F32)
    b_host = rng.standard_normal((k, n)).astype(F32)
    a, b = dev.upload(a_host), dev.upload(b_host)
    c = dev.rt.malloc(m * n * 4)
    args = HostArgs().ptr(a).ptr(b).ptr(c).placeholder(struct.pack("<III", m, n, k))
    dev.launch("matmul", args, blocks=4)
    result = dev.download(c, m * n).reshape(m, n)
    np.testing.assert_allclose(result, a_host @ b_host, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 3, 8, 1000, 65535])
def test_vector_add_split_over_blocks(dev: Dev, blocks: int) -> None:
    n = 1001
    x_host = np.arange(n, dtype=F32)
    y_host = np.arange(n, dtype=F32)[::-1].copy() * F32(0.5)
    x, y = dev.upload(x_host), dev.upload(y_host)
    z = dev.upload(np.full(n, -7.0, F32))
    dev.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n), blocks=blocks)
    np.testing.assert_array_equal(dev.download(z, n), x_host + y_host)


def test_launch_accepts_a_launch_config(dev: Dev) -> None:
    n = 8
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.ones(n, F32))
    cfg = LaunchConfig(schedule_mode="batch", timeout_s=5)
    if getattr(dev.rt, "launch_path", None) == "device_args":
        # aclrtLaunchKernel takes no config (aclrtLaunchKernelV2 is 8.5+): refused, not ignored
        with pytest.raises(BackendUnavailableError, match="aclrtLaunchKernelV2"):
            dev.launch("axpy", axpy_args(x, y, 1.0, n), cfg=cfg)
        dev.launch("axpy", axpy_args(x, y, 1.0, n), cfg=LaunchConfig())  # no attributes: none
        np.testing.assert_array_equal(dev.download(y, n), np.full(n, 2.0, F32))
        return
    dev.launch("axpy", axpy_args(x, y, 1.0, n), cfg=cfg)
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 2.0, F32))


def test_unknown_kernel_name_is_symbol_not_found(dev: Dev) -> None:
    with pytest.raises(RuntimeAPIError) as info:
        dev.rt.get_function(dev.binary, "no_such_kernel")
    assert info.value.code == 107042


def test_stream_handles_are_distinct_and_never_zero(rt: Runtime) -> None:
    streams = [rt.create_stream() for _ in range(5)]
    assert 0 not in streams
    assert len(set(streams)) == 5
    for stream in streams:
        rt.destroy_stream(stream)


# --- events -----------------------------------------------------------------------------------


def test_never_recorded_ex_event_is_complete(rt: Runtime) -> None:
    for flags in (0, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE):
        event = rt.create_event(flags)
        assert rt.query_event_status(event) == COMPLETE
        rt.synchronize_event(event, 1000)
        rt.destroy_event(event)


def test_recorded_event_is_not_ready_until_the_work_is_done(dev: Dev) -> None:
    event = dev.rt.create_event(ACL_EVENT_SYNC)
    dev.sleep_us(200_000)
    dev.rt.record_event(event, dev.stream)
    assert dev.rt.query_event_status(event) == NOT_READY
    dev.rt.synchronize_event(event, SYNC_MS)
    assert dev.rt.query_event_status(event) == COMPLETE


def test_re_record_replaces_the_captured_work(dev: Dev) -> None:
    rt = dev.rt
    busy, idle = dev.stream, dev.new_stream()
    event, marker = rt.create_event(ACL_EVENT_SYNC), rt.create_event(ACL_EVENT_SYNC)
    dev.hang(busy)
    rt.record_event(event, busy)
    rt.record_event(marker, busy)
    assert rt.query_event_status(event) == NOT_READY
    rt.record_event(event, idle)  # now captures the (empty) work of the idle stream
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == COMPLETE
    assert rt.query_event_status(marker) == NOT_READY
    for _ in range(5):  # reusable: every re-record replaces the captured work again
        rt.record_event(event, busy)
        assert rt.query_event_status(event) == NOT_READY
        rt.record_event(event, idle)
        rt.synchronize_event(event, SYNC_MS)
        assert rt.query_event_status(event) == COMPLETE


def test_stale_recording_does_not_complete_a_newer_one(dev: Dev) -> None:
    rt = dev.rt
    quick, stuck = dev.stream, dev.new_stream()
    event, done = rt.create_event(ACL_EVENT_SYNC), rt.create_event(ACL_EVENT_SYNC)
    dev.sleep_us(100_000, quick)
    rt.record_event(event, quick)  # first recording: finishes after the sleep
    rt.record_event(done, quick)
    dev.hang(stuck)
    rt.record_event(event, stuck)  # second recording: never finishes
    rt.synchronize_event(done, SYNC_MS)  # the first recording has now executed
    assert rt.query_event_status(event) == NOT_READY


def test_stream_wait_event_orders_consumer_after_producer(dev: Dev) -> None:
    rt = dev.rt
    producer, consumer = dev.stream, dev.new_stream()
    n = 32
    x_host = np.arange(n, dtype=F32)
    x = dev.upload(x_host, producer)
    y = dev.upload(np.zeros(n, F32), consumer)
    ready = rt.create_event(ACL_EVENT_SYNC)
    dev.sleep_us(150_000, producer)
    dev.launch("scale", scale_args(x, x, n, 10.0), producer)  # x *= 10, late
    rt.record_event(ready, producer)
    rt.stream_wait_event(consumer, ready)
    dev.launch("axpy", axpy_args(x, y, 1.0, n), consumer)  # y = x: must see the scaled x
    rt.synchronize_stream(consumer, SYNC_MS)
    np.testing.assert_array_equal(dev.download(y, n, stream=consumer), x_host * F32(10.0))


def test_stream_wait_event_refers_to_the_recording_at_call_time(dev: Dev) -> None:
    rt = dev.rt
    stuck, idle, waiter = dev.stream, dev.new_stream(), dev.new_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    dev.hang(stuck)
    rt.record_event(event, stuck)
    rt.stream_wait_event(waiter, event)
    rt.record_event(event, idle)  # a later re-record does not release the earlier wait
    rt.synchronize_event(event, SYNC_MS)
    with pytest.raises(StreamSyncTimeoutError):
        rt.synchronize_stream(waiter, 200)


def test_waiting_on_a_never_recorded_event_does_not_wait(dev: Dev) -> None:
    rt = dev.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.stream_wait_event(dev.stream, event)
    n = 4
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.ones(n, F32))
    dev.launch("axpy", axpy_args(x, y, 1.0, n))
    rt.synchronize_stream(dev.stream, 2000)
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 2.0, F32))


def test_elapsed_time_between_time_line_events(dev: Dev) -> None:
    rt = dev.rt
    start, end = rt.create_event(ACL_EVENT_TIME_LINE), rt.create_event(ACL_EVENT_TIME_LINE)
    rt.record_event(start, dev.stream)
    dev.sleep_us(50_000)
    rt.record_event(end, dev.stream)
    rt.synchronize_event(end, SYNC_MS)
    elapsed = rt.event_elapsed_time(start, end)
    assert 45.0 <= elapsed < 5000.0


def test_elapsed_time_needs_time_line_and_completed_events(dev: Dev) -> None:
    rt = dev.rt
    plain = rt.create_event(ACL_EVENT_SYNC)
    timed = rt.create_event(ACL_EVENT_TIME_LINE)
    pending = rt.create_event(ACL_EVENT_TIME_LINE)
    rt.record_event(plain, dev.stream)
    rt.record_event(timed, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    with pytest.raises(InvalidParamError):
        rt.event_elapsed_time(plain, timed)
    stuck = dev.new_stream()
    dev.hang(stuck)
    rt.record_event(pending, stuck)
    with pytest.raises(InvalidParamError):
        rt.event_elapsed_time(timed, pending)


# --- synchronize timeouts ---------------------------------------------------------------------


def test_timeout_zero_is_rejected(dev: Dev) -> None:
    event = dev.rt.create_event(ACL_EVENT_SYNC)
    with pytest.raises(InvalidParamError):
        dev.rt.synchronize_stream(dev.stream, 0)
    with pytest.raises(InvalidParamError):
        dev.rt.synchronize_event(event, 0)


def test_synchronize_times_out_on_a_hung_stream(dev: Dev) -> None:
    rt = dev.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    dev.hang(dev.stream)
    rt.record_event(event, dev.stream)
    with pytest.raises(EventSyncTimeoutError) as event_info:
        rt.synchronize_event(event, 100)
    assert event_info.value.code == 507047
    with pytest.raises(StreamSyncTimeoutError) as stream_info:
        rt.synchronize_stream(dev.stream, 100)
    assert stream_info.value.code == 507046
    assert rt.query_event_status(event) == NOT_READY


def test_destroy_stream_force_discards_a_hung_stream(dev: Dev) -> None:
    rt = dev.rt
    stuck = dev.new_stream()
    dev.hang(stuck)
    dev.sleep_us(10, stuck)
    rt.destroy_stream_force(stuck)
    with pytest.raises(InvalidHandleError):
        rt.synchronize_stream(stuck, 100)
    n = 4
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.ones(n, F32))
    dev.launch("axpy", axpy_args(x, y, 3.0, n))
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 4.0, F32))


def test_destroy_stream_waits_for_queued_work(dev: Dev) -> None:
    rt = dev.rt
    work = dev.new_stream()
    n = 16
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.zeros(n, F32))
    dev.sleep_us(100_000, work)
    dev.launch("axpy", axpy_args(x, y, 5.0, n), work)
    rt.destroy_stream(work)
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 5.0, F32))
    with pytest.raises(InvalidHandleError):
        rt.destroy_stream(work)


# --- memory -----------------------------------------------------------------------------------


def test_memcpy_round_trip_pinned(dev: Dev) -> None:
    rt = dev.rt
    data = np.arange(1000, dtype=np.uint8).tobytes()
    src = dev.pinned(data)
    a, b = rt.malloc(len(data)), rt.malloc(len(data) + 100)
    dst = rt.malloc_host(len(data))
    rt.memcpy_async(a, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, dev.stream)
    rt.memcpy_async(b, len(data) + 100, a, len(data), ACL_MEMCPY_DEVICE_TO_DEVICE, dev.stream)
    rt.memcpy_async(dst, len(data), b, len(data), ACL_MEMCPY_DEVICE_TO_HOST, dev.stream)
    rt.synchronize_stream(dev.stream, SYNC_MS)
    assert bytes(host_view(dst, len(data))) == data


def test_memcpy_count_larger_than_dst_max_is_rejected(dev: Dev) -> None:
    rt = dev.rt
    src = rt.malloc_host(64)
    dst = rt.malloc(64)
    with pytest.raises(InvalidParamError):
        rt.memcpy_async(dst, 32, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, dev.stream)
    with pytest.raises(InvalidParamError):
        rt.memcpy_async(dst, 64, src, 64, 99, dev.stream)


def test_malloc_is_aligned_and_frees_are_checked(rt: Runtime) -> None:
    ptrs = [rt.malloc(size) for size in (1, 63, 64, 1000)]
    assert all(ptr % 64 == 0 for ptr in ptrs)
    host = rt.malloc_host(100)
    assert host % 64 == 0
    for ptr in ptrs:
        rt.free(ptr)
    with pytest.raises(InvalidParamError):
        rt.free(ptrs[0])  # double free
    with pytest.raises(InvalidParamError):
        rt.free(0x1234_5678_9AB0)  # never allocated
    with pytest.raises(InvalidParamError):
        rt.malloc(0)
    rt.free_host(host)
    with pytest.raises(InvalidParamError):
        rt.free_host(host)


# --- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 507035])
def test_device_fault_is_sticky_for_every_stream(dev: Dev, backend: str, code: int) -> None:
    if backend in REFUSES_ALL_AFTER_FAULT:
        pytest.skip("malloc fails after a fault here: test_device_fault_is_sticky_on_cuda")
    rt = dev.rt
    other = dev.new_stream()
    event = rt.create_event(ACL_EVENT_SYNC)
    expected = code or 507015
    n = 4
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.ones(n, F32))
    dev.launch("fault", HostArgs().u32(code))
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(dev.stream, SYNC_MS)
    assert info.value.code == expected
    assert rt.get_recent_error_message()
    checks: list[Callable[[], object]] = [
        lambda: rt.query_event_status(event),
        lambda: rt.synchronize_event(event, 1000),
        lambda: rt.synchronize_stream(other, 1000),
        lambda: rt.record_event(event, other),
        lambda: rt.stream_wait_event(other, event),
        lambda: dev.launch("axpy", axpy_args(x, y, 1.0, n), other),
        lambda: rt.memcpy_async(y, 16, x, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, other),
    ]
    for check in checks * 2:  # sticky: the second round fails the same way
        with pytest.raises(DeviceFaultError) as info_again:
            check()
        assert info_again.value.code == expected
        assert info_again.value.message == info.value.message
    # cleanup still works on a faulted device
    rt.free(x)
    rt.destroy_event(event)
    rt.destroy_stream(other)
    assert rt.malloc(64)


def test_a_new_runtime_after_a_fault_works(backend: str) -> None:
    first = _open(backend)
    try:
        d = Dev(first)
        d.launch("fault", HostArgs().u32(0))
        with pytest.raises(DeviceFaultError):
            first.synchronize_stream(d.stream, SYNC_MS)
    finally:
        first.close()
    second = _open(backend)
    try:
        d = Dev(second)
        n = 8
        x, y = d.upload(np.ones(n, F32)), d.upload(np.ones(n, F32))
        d.launch("axpy", axpy_args(x, y, 1.0, n))
        np.testing.assert_array_equal(d.download(y, n), np.full(n, 2.0, F32))
    finally:
        second.close()


# --- context binding --------------------------------------------------------------------------


def test_a_thread_needs_set_current_context(rt: Runtime) -> None:
    def body() -> int:
        assert rt.get_recent_error_message() == ""  # callable unbound
        with pytest.raises(ContextNullError) as info:
            rt.create_stream()
        assert info.value.code == 107002
        with pytest.raises(ContextNullError):
            rt.malloc(64)
        assert rt.get_recent_error_message()
        rt.set_current_context()
        rt.set_current_context()  # idempotent
        stream = rt.create_stream()
        rt.destroy_stream(stream)
        return stream

    thread, errors, results = in_thread(body)
    thread.join(SYNC_MS / 1000)
    assert not errors, errors
    assert results
    assert results[0] != 0


def test_close_is_idempotent_and_works_from_another_thread(backend: str) -> None:
    runtime = _open(backend)
    d = Dev(runtime)
    d.sleep_us(10)
    thread, errors, _ = in_thread(runtime.close)
    thread.join(SYNC_MS / 1000)
    assert not errors, errors
    runtime.close()


# --- launch validation ------------------------------------------------------------------------

BAD_LAUNCHES: dict[str, tuple[dict[str, Any], type[RuntimeAPIError], str]] = {
    "unknown func": ({"func": 0xDEAD}, InvalidHandleError, ""),
    "unknown stream": ({"stream": 0xBEEF}, InvalidHandleError, ""),
    "zero blocks": ({"num_blocks": 0}, InvalidParamError, "numBlocks"),
    "too many blocks": ({"num_blocks": 65536}, InvalidParamError, "numBlocks"),
    "null args": ({"args_addr": 0}, InvalidParamError, "hostArgs"),
    "zero args size": ({"args_size": 0}, InvalidParamError, "argsSize"),
    "args size over 32 bits": ({"args_size": 2**32}, InvalidParamError, "argsSize"),
    "null placeholder table": ({"placeholders_addr": 0}, InvalidParamError, "placeHolderArray"),
    "misaligned addrOffset": ({"table": [(4, 32)]}, InvalidParamError, "addrOffset"),
    "addrOffset past the end": ({"table": [(40, 32)]}, InvalidParamError, "addrOffset"),
    "misaligned dataOffset": ({"table": [(16, 36)]}, InvalidParamError, "dataOffset"),
    "dataOffset past the end": ({"table": [(16, 40)]}, InvalidParamError, "dataOffset"),
    "second entry bad": ({"table": [(16, 32), (24, 33)]}, InvalidParamError, "dataOffset"),
    "cfg of the wrong type": ({"cfg": {"schedule_mode": 1}}, InvalidParamError, "cfg"),
}


@pytest.mark.parametrize("case", sorted(BAD_LAUNCHES))
def test_bad_launch_inputs_are_rejected(dev: Dev, backend: str, case: str) -> None:
    rt = dev.rt
    shared_overrides, error, field = BAD_LAUNCHES[case]
    overrides = dict(shared_overrides)
    n = 4
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.ones(n, F32))
    args = scale_args(x, y, n, 2.0)  # 40 bytes: slot at 16, data at 32
    addr, size, table, count = dev.pack(args)
    assert (size, args.placeholders) == (40, [(16, 32)])
    before = bytes(host_view(addr, size))
    if "table" in overrides:
        entries = overrides.pop("table")
        table = dev.pinned(b"".join(struct.pack("<II", a, d) for a, d in entries))
        count = len(entries)
    call: dict[str, Any] = {
        "func": dev.fn("scale"),
        "num_blocks": 1,
        "stream": dev.stream,
        "cfg": None,
        "args_addr": addr,
        "args_size": size,
        "placeholders_addr": table,
        "placeholder_count": count,
    }
    call.update(overrides)
    with pytest.raises(error) as info:
        rt.launch_kernel_with_host_args(**call)
    assert info.value.code in error.codes
    if backend == "sim" and field:
        assert field in info.value.message
    assert bytes(host_view(addr, size)) == before, "a refused launch must not patch the args"
    # nothing was queued: y is untouched once the stream drains
    rt.synchronize_stream(dev.stream, SYNC_MS)
    np.testing.assert_array_equal(dev.download(y, n), np.ones(n, F32))


# --- sim-only: strictness and test controls ---------------------------------------------------


@pytest.mark.sim_only
def test_pinned_args_are_read_when_the_kernel_executes(dev: Dev) -> None:
    rt: Any = dev.rt
    n = 8
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.zeros(n, F32))
    rt.pause()
    try:
        addr = dev.launch("axpy", axpy_args(x, y, 1.0, n))
        host_view(addr, 24)[16:20] = struct.pack("<f", 7.0)  # change `a` after the launch
    finally:
        rt.resume()
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 7.0, F32))


@pytest.mark.sim_only
def test_pinned_copy_source_is_read_when_the_copy_executes(dev: Dev) -> None:
    rt: Any = dev.rt
    src = dev.pinned(b"A" * 64)
    dst = rt.malloc(64)
    rt.pause()
    try:
        rt.memcpy_async(dst, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE, dev.stream)
        host_view(src, 64)[:] = b"B" * 64
    finally:
        rt.resume()
    assert dev.download(dst, 64, np.uint8).tobytes() == b"B" * 64


@pytest.mark.sim_only
def test_record_event_reads_not_ready_when_the_call_returns(dev: Dev) -> None:
    rt: Any = dev.rt
    event = rt.create_event(ACL_EVENT_SYNC)
    rt.pause()
    try:
        rt.record_event(event, dev.stream)
        assert rt.query_event_status(event) == NOT_READY
        with pytest.raises(EventSyncTimeoutError):
            rt.synchronize_event(event, 50)
    finally:
        rt.resume()
    rt.synchronize_event(event, SYNC_MS)
    assert rt.query_event_status(event) == COMPLETE


@pytest.mark.sim_only
def test_pageable_copies_block_until_the_stream_reaches_them(dev: Dev) -> None:
    rt: Any = dev.rt
    n = 256
    src = np.arange(n, dtype=F32)
    dst = np.zeros(n, dtype=F32)
    device = rt.malloc(src.nbytes)

    def copy() -> None:
        rt.set_current_context()
        rt.memcpy_async(
            device, src.nbytes, src.ctypes.data, src.nbytes, ACL_MEMCPY_HOST_TO_DEVICE, dev.stream
        )

    rt.pause()
    try:
        thread, errors, _ = in_thread(copy)
        thread.join(0.2)
        assert thread.is_alive(), "a pageable copy must block while the stream has not reached it"
    finally:
        rt.resume()
    thread.join(SYNC_MS / 1000)
    assert not thread.is_alive()
    assert not errors, errors
    rt.memcpy_async(
        dst.ctypes.data, dst.nbytes, device, dst.nbytes, ACL_MEMCPY_DEVICE_TO_HOST, dev.stream
    )
    np.testing.assert_array_equal(dst, src)  # done when the call returns


@pytest.mark.sim_only
def test_pageable_args_are_snapshotted_during_the_call(dev: Dev) -> None:
    rt: Any = dev.rt
    n = 8
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.zeros(n, F32))
    args = scale_args(x, y, n, 3.0)
    buffer = bytearray(args.to_bytes())
    raw = np.frombuffer(buffer, dtype=np.uint8)
    table = np.frombuffer(bytearray(args.placeholder_table()), dtype=np.uint8)
    rt.pause()
    try:
        rt.launch_kernel_with_host_args(
            dev.fn("scale"),
            1,
            dev.stream,
            None,
            raw.ctypes.data,
            len(buffer),
            table.ctypes.data,
            1,
        )
        slot = struct.unpack_from("<Q", buffer, 16)[0]
        assert slot != 0, "placeholders are patched into pageable buffers too"
        struct.pack_into("<f", buffer, 36, 100.0)  # too late: the snapshot was taken
    finally:
        rt.resume()
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 3.0, F32))


@pytest.mark.sim_only
def test_inject_launch_error_refuses_one_launch(dev: Dev) -> None:
    rt: Any = dev.rt
    n = 4
    x, y = dev.upload(np.ones(n, F32)), dev.upload(np.zeros(n, F32))
    rt.inject_launch_error(207001, after=2)
    launched = rt.counters["launches"]
    dev.launch("axpy", axpy_args(x, y, 1.0, n))
    dev.launch("axpy", axpy_args(x, y, 1.0, n))
    with pytest.raises(MemoryAllocationError) as info:
        dev.launch("axpy", axpy_args(x, y, 1.0, n))
    assert info.value.code == 207001
    dev.launch("axpy", axpy_args(x, y, 1.0, n))
    assert rt.counters["launches"] == launched + 3
    np.testing.assert_array_equal(dev.download(y, n), np.full(n, 3.0, F32))
    assert not rt.is_faulted


@pytest.mark.sim_only
def test_launch_blocks_while_the_stream_queue_is_full() -> None:
    from aio_ascend.sim import open_sim_runtime

    rt = open_sim_runtime(0, max_queue_depth=4)
    try:
        d = Dev(rt)
        rt.pause()
        try:
            for _ in range(4):
                d.launch("noop", HostArgs())

            def fifth() -> None:
                rt.set_current_context()
                d.launch("noop", HostArgs())

            thread, errors, _ = in_thread(fifth)
            thread.join(0.2)
            assert thread.is_alive(), "the fifth launch must block on a full queue"
            assert rt.counters["launches"] == 4
        finally:
            rt.resume()
        thread.join(SYNC_MS / 1000)
        assert not thread.is_alive()
        assert not errors, errors
        rt.synchronize_stream(d.stream, SYNC_MS)
        assert rt.counters["kernels_executed"] == 5
    finally:
        rt.close()
