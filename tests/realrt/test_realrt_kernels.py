"""Kernels on the real CANN runtime (built from source) over our fake driver.

The kernel object is ``make_kernel_elf.py``'s: the runtime's own ELF reader loads it
(``aclrtBinaryLoadFromData``/``FromFile``), its kernel table answers ``aclrtBinaryGetFunction``,
its metadata ``aclrtFunctionGetParamCount``/``GetParamInfo`` and the hidden-argument probe
(``aclrtKernelArgsInitByUserMem`` + ``Finalize``); at load it copies the code to device memory.
A launch's SQE carries the PC of the kernel's code there: our driver reads the kernel's marker
at that address and runs the host function of that name over the args the runtime built, which
it keeps for the tests to compare with what the library expected (``FakeHal.last_launch``).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from realrt.fixture import FakeHal, fakehal, kernel_binary, open_realrt_runtime
from realrt.make_kernel_elf import KERNELS, MARKER, SAMPLE_KERNELS, kernel_elf, write_kernel_elf

from aio_ascend._errors import DeviceFaultError, RuntimeAPIError, StreamSyncTimeoutError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_STOP_ON_FAILURE,
)
from aio_ascend._runtime.acl.argshandle import launch_with_args_handle
from aio_ascend._runtime.acl.kernels import read_function_info
from aio_ascend._runtime.acl.paths import LaunchPath
from aio_ascend._runtime.hostmem import host_view

pytestmark = pytest.mark.realrt

SYNC_MS = 10_000
F32 = np.float32
#: ACL_ERROR_RT_VECTOR_CORE_EXCEPTION: what a vector kernel's exception becomes
#: (davinci_kernel_task_v100.cc:546-562 TS_ERROR_VECTOR_CORE_EXCEPTION, error_code.cc:121)
VECTOR_CORE_EXCEPTION = 507035
#: how long the runtime may take to report a fault: milliseconds once it has read the error
#: CQE and found the driver's element in the error ringbuffer (fakehal.c,
#: fh_ringbuffer_report_locked); a liveness bound
FAULT_REPORT_S = 10.0
#: the synchronize that has the runtime read a stream's completions: it need not wait for them
LOOK_MS = 1_000


@pytest.fixture
def rt() -> Iterator[Any]:
    runtime = open_realrt_runtime()
    try:
        yield runtime
    finally:
        runtime.close()
        fakehal().reset()


@pytest.fixture
def hal(rt: Any) -> FakeHal:
    return fakehal()


class Kit:
    """A stream, the kernel object loaded once, and helpers over ``rt``."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.stream = rt.create_stream()
        rt.set_stream_failure_mode(self.stream, ACL_STOP_ON_FAILURE)
        self.binary = rt.load_binary(None)
        self.functions: dict[str, int] = {}

    def fn(self, name: str) -> int:
        if name not in self.functions:
            self.functions[name] = self.rt.get_function(self.binary, name)
        return self.functions[name]

    def pinned(self, data: bytes) -> int:
        addr: int = self.rt.malloc_host(max(len(data), 1))
        host_view(addr, len(data))[:] = data
        return addr

    def upload(self, array: np.ndarray[Any, Any]) -> int:
        data = np.ascontiguousarray(array).tobytes()
        ptr: int = self.rt.malloc(len(data))
        src = self.pinned(data)
        self.rt.memcpy_async(ptr, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, self.stream)
        self.rt.synchronize_stream(self.stream, SYNC_MS)
        return ptr

    def download(self, ptr: int, count: int) -> np.ndarray[Any, Any]:
        nbytes = count * 4
        dst = self.rt.malloc_host(nbytes)
        self.rt.memcpy_async(dst, nbytes, ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST, self.stream)
        self.rt.synchronize_stream(self.stream, SYNC_MS)
        return np.frombuffer(bytes(host_view(dst, nbytes)), dtype=F32).copy()

    def packed(self, name: str, args: HostArgs) -> tuple[bytes, tuple[tuple[int, int], ...]]:
        """The image and placeholder (slot, data) offsets the library lays out for ``name``."""
        packed = args.pack(self.rt.function_info(self.fn(name)))
        return packed.image, packed.placeholders

    def launch(self, name: str, args: HostArgs, blocks: int = 1) -> bytes:
        """Launch with host args as the library lays them out; returns the image."""
        image, placeholders = self.packed(name, args)
        table = b"".join(struct.pack("<II", slot, data) for slot, data in placeholders)
        self.rt.launch_kernel_with_host_args(
            self.fn(name),
            blocks,
            self.stream,
            None,
            self.pinned(image),
            len(image),
            self.pinned(table) if table else 0,
            len(placeholders),
        )
        return image


@pytest.fixture
def kit(rt: Any) -> Kit:
    return Kit(rt)


def u64(data: bytes, offset: int) -> int:
    value: int = struct.unpack_from("<Q", data, offset)[0]
    return value


# --- the object and the loader ---------------------------------------------------------------


def test_the_object_is_an_elf_with_a_marker_per_kernel() -> None:
    data = kernel_elf()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELFCLASS64
    assert data.count(MARKER) == sum(2 if k.mix else 1 for k in KERNELS)


@pytest.mark.parametrize("source", ["bytes", "file"])
def test_load_and_look_up_every_kernel(rt: Any, source: str) -> None:
    path = kernel_binary()
    binary = rt.load_binary(path.read_bytes() if source == "bytes" else str(path))
    handles = {k.name: rt.get_function(binary, k.name) for k in KERNELS}
    assert len(set(handles.values())) == len(KERNELS)
    rt.unload_binary(binary)


def test_a_mix_kernels_halves_are_one_function(rt: Any) -> None:
    """``<name>_mix_aic`` + ``<name>_mix_aiv`` merge into ``<name>`` (program.cc:1543-1563,
    1736-1813); the halves' own names are not functions."""
    binary = rt.load_binary(None)
    assert rt.get_function(binary, "mix_vector_add")
    with pytest.raises(RuntimeAPIError):
        rt.get_function(binary, "mix_vector_add_mix_aic")


def test_an_object_without_kernels_is_refused(rt: Any) -> None:
    """No ``STT_FUNC`` symbol: elf.cc:1273 ("funcNum is error"), the load fails."""
    with pytest.raises(RuntimeAPIError):
        rt.load_binary(kernel_elf(())[:64] + bytes(64))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_parameters_are_the_objects(rt: Any, kernel: Any) -> None:
    """``aclrtFunctionGetParamCount``/``GetParamInfo`` answer the PARAM_SUMMARY/PARAM_INFO TLVs
    (elf.cc:594-640, kernel.cc:427-448)."""
    binary = rt.load_binary(None)
    info = rt.function_info(rt.get_function(binary, kernel.name))
    offsets = []
    offset = 0
    for size in kernel.params:
        offset = -(-offset // size) * size
        offsets.append((offset, size))
        offset += size
    assert info.params == tuple(offsets)


def test_the_probe_finds_the_hidden_arguments(rt: Any) -> None:
    """A plain AIV kernel: no slot in front, the overflow slot after its parameters; a MIX
    kernel: the inter-core sync slot in front too (program.cc:1105-1120 SetKernelAttribute)."""
    binary = rt.load_binary(None)
    overflow = ctypes.c_void_p()
    rt._fn["aclrtCtxGetFloatOverflowAddr"](ctypes.byref(overflow))
    plain = rt.function_info(rt.get_function(binary, "vector_add"))
    assert plain.prefix == ()
    assert plain.suffix == (overflow.value,)
    sync = ctypes.c_void_p()
    rt._fn["aclrtGetHardwareSyncAddr"](ctypes.byref(sync))
    assert sync.value  # our driver maps the C2C control register (halMemCtl ADDR_MAP)
    mix = rt.function_info(rt.get_function(binary, "mix_vector_add"))
    assert mix.prefix == (sync.value,)
    assert mix.suffix == (overflow.value,)


# --- launches --------------------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [1, 8])
def test_vector_add_gives_the_sum(kit: Kit, hal: FakeHal, blocks: int) -> None:
    n = 300
    x_host = np.arange(n, dtype=F32)
    y_host = np.full(n, 0.5, dtype=F32)
    x, y, z = kit.upload(x_host), kit.upload(y_host), kit.upload(np.zeros(n, F32))
    before = hal.launch_count()
    kit.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n), blocks)
    np.testing.assert_array_equal(kit.download(z, n), x_host + y_host)
    launch = hal.last_launch()
    assert hal.launch_count() == before + 1
    assert (launch.name, launch.block_dim, launch.mix) == ("vector_add", blocks, False)


def test_axpy_launches_run_in_stream_order(kit: Kit) -> None:
    n = 64
    x_host = np.linspace(-1, 1, n, dtype=F32)
    y_host = np.ones(n, F32)
    x, y = kit.upload(x_host), kit.upload(y_host)
    expected = y_host.copy()
    for a in (0.5, -2.0, 3.25, 1.0):
        kit.launch("axpy", HostArgs().ptr(x).ptr(y).f32(a).u32(n))
        expected += F32(a) * x_host
    np.testing.assert_array_equal(kit.download(y, n), expected)


def test_scale_reads_its_tiling_through_the_patched_placeholder(kit: Kit, hal: FakeHal) -> None:
    """The runtime copies the image to device memory and patches the placeholder slot with the
    device address of its data (the data follows the arguments there)."""
    n = 40
    x_host = np.arange(n, dtype=F32)
    x, y = kit.upload(x_host), kit.upload(np.zeros(n, F32))
    tiling = struct.pack("<If", n, -1.5)
    image = kit.launch("scale", HostArgs().ptr(x).ptr(y).placeholder(tiling))
    np.testing.assert_array_equal(kit.download(y, n), x_host * F32(-1.5))
    launch = hal.last_launch()
    args = launch.args
    assert (u64(args, 0), u64(args, 8)) == (x, y)
    slot = u64(args, 16)
    assert slot != u64(image, 16)  # patched
    data_offset = slot - launch.args_addr
    assert 0 < data_offset < len(args)
    assert args[data_offset : data_offset + 8] == tiling
    # the rest of the image is the library's, byte for byte (the overflow slot included)
    assert args[24:data_offset] == image[24:data_offset]


def test_matmul_gives_the_product(kit: Kit) -> None:
    m, n, k = 5, 7, 3
    rng = np.random.default_rng(7)
    a_host = rng.standard_normal((m, k)).astype(F32)
    b_host = rng.standard_normal((k, n)).astype(F32)
    a, b, c = kit.upload(a_host), kit.upload(b_host), kit.upload(np.zeros(m * n, F32))
    kit.launch("matmul", HostArgs().ptr(a).ptr(b).ptr(c).placeholder(struct.pack("<III", m, n, k)))
    got = kit.download(c, m * n).reshape(m, n)
    np.testing.assert_allclose(got, a_host @ b_host, rtol=1e-5, atol=1e-5)


def test_the_device_sees_the_library_image(kit: Kit, hal: FakeHal) -> None:
    """No placeholder: the args the device reads are the library's image, the overflow slot
    (the function info's suffix) after the parameters."""
    n = 4
    x, y, z = (kit.upload(np.ones(n, F32)) for _ in range(3))
    image = kit.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
    kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    args = hal.last_launch().args
    assert args[: len(image)] == image
    suffix = kit.rt.function_info(kit.fn("vector_add")).suffix
    assert u64(args, 32) == suffix[0]


def test_a_mix_kernel_goes_as_an_ffts_plus_task(kit: Kit, hal: FakeHal) -> None:
    """A MIX kernel is launched through an FFTS+ SQE and its context in device memory
    (davinci_kernel_task_v100.cc:392-421, 649-769); the args carry the sync slot the library
    laid out in front of the parameters, and the whole image (the context's size)."""
    n = 16
    x_host = np.arange(n, dtype=F32)
    x, z = kit.upload(x_host), kit.upload(np.zeros(n, F32))
    image = kit.launch("mix_vector_add", HostArgs().ptr(x).ptr(x).ptr(z).u32(n), blocks=2)
    np.testing.assert_array_equal(kit.download(z, n), 2 * x_host)
    launch = hal.last_launch()
    assert (launch.name, launch.mix, launch.block_dim) == ("mix_vector_add", True, 2)
    assert launch.args == image
    sync = ctypes.c_void_p()
    kit.rt._fn["aclrtGetHardwareSyncAddr"](ctypes.byref(sync))
    assert (u64(launch.args, 0), u64(launch.args, 8)) == (sync.value, x)


def test_the_args_handle_path_runs_on_the_real_runtime(kit: Kit, hal: FakeHal) -> None:
    """The library's args-handle launch (``aclrtKernelArgsInit``/``Append``/
    ``AppendPlaceHolder``/``GetPlaceHolderBuffer``/``Finalize`` + ``aclrtLaunchKernelWithConfig``,
    the CANN 8.2/8.3 path) against the real runtime: the runtime adds the overflow slot and
    places the data itself."""
    rt = kit.rt
    func = kit.fn("scale")
    info = read_function_info(rt._fn, rt._library.has, func, None, LaunchPath.ARGS_HANDLE)
    assert info.data_align == 8
    n = 12
    x_host = np.arange(n, dtype=F32)
    x, y = kit.upload(x_host), kit.upload(np.zeros(n, F32))
    tiling = struct.pack("<If", n, 4.0)
    packed = HostArgs().ptr(x).ptr(y).placeholder(tiling).pack(info)
    image = packed.image
    launch_with_args_handle(
        rt._fn, func, 1, kit.stream, None, kit.pinned(image), len(image), list(packed.placeholders)
    )
    np.testing.assert_array_equal(kit.download(y, n), x_host * F32(4.0))
    args = hal.last_launch().args
    assert (u64(args, 0), u64(args, 8)) == (x, y)
    data_offset = u64(args, 16) - hal.last_launch().args_addr
    assert args[data_offset : data_offset + 8] == tiling


def test_a_device_args_launch_runs_on_the_real_runtime(kit: Kit, hal: FakeHal) -> None:
    """``aclrtLaunchKernel`` with args already in device memory (the CANN 8.0 path's call): the
    device reads that buffer as it is."""
    rt = kit.rt
    n = 8
    x_host = np.arange(n, dtype=F32)
    x, y, z = kit.upload(x_host), kit.upload(x_host), kit.upload(np.zeros(n, F32))
    image, _ = kit.packed("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
    device_args = kit.upload(np.frombuffer(image, dtype=np.uint8))
    rt._fn["aclrtLaunchKernel"](kit.fn("vector_add"), 1, device_args, len(image), kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(z, n), 2 * x_host)
    assert hal.last_launch().args[: len(image)] == image


def test_sleep_holds_the_stream(kit: Kit) -> None:
    start = time.monotonic()
    kit.launch("sleep", HostArgs().u32(50_000))
    kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    assert time.monotonic() - start >= 0.045


def test_noop_launches_are_counted(kit: Kit, hal: FakeHal) -> None:
    before = hal.launch_count()
    for _ in range(20):
        kit.launch("noop", HostArgs())
    kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    assert hal.launch_count() == before + 20
    assert hal.last_launch().name == "noop"


def test_a_hung_kernel_times_out_and_its_stream_is_destroyed_by_force(kit: Kit) -> None:
    rt = kit.rt
    stream = rt.create_stream()
    image, _ = kit.packed("hang", HostArgs())
    rt.launch_kernel_with_host_args(
        kit.fn("hang"), 1, stream, None, kit.pinned(image), len(image), 0, 0
    )
    with pytest.raises(RuntimeAPIError):
        rt.synchronize_stream(stream, 100)
    rt.destroy_stream_force(stream)


# --- faults and attribution ------------------------------------------------------------------


def _wait_for_site(rt: Any, stream: int) -> tuple[int, int] | None:
    """The fault site, once the runtime reported it. A synchronize first: the runtime reads a
    stream's completions when it synchronizes it, and handles the error CQE there (reading the
    driver's element in the error ringbuffer: device_error_proc.cc:638-744). It ends with the
    fault, or by its timeout: the kit's stream stops on failure, and the runtime leaves its
    queue stopped at the failed SQE (no ``EnableSq`` in abort-on-failure mode:
    stars_engine.cc:1508-1514)."""
    with contextlib.suppress(DeviceFaultError, StreamSyncTimeoutError):
        rt.synchronize_stream(stream, LOOK_MS)
    deadline = time.monotonic() + FAULT_REPORT_S
    while time.monotonic() < deadline:
        site: tuple[int, int] | None = rt.fault_site()
        if site is not None:
            return site
        time.sleep(0.02)
    return None


def test_a_kernel_fault_reaches_the_runtime_through_the_error_ringbuffer(
    kit: Kit, hal: FakeHal
) -> None:
    """The runtime hands the device its error ringbuffer at open; a faulting kernel gets the
    firmware's element there, and the runtime reads it (its head catches up with the tail) when
    it handles the error CQE: the fault is reported at once, not after the runtime's 12 s of
    polling for a record (device_error_proc.cc:638-744)."""
    length, _, _, before = hal.error_ringbuffer()
    assert length == 10  # RINGBUFFER_LEN elements (device_error_info.hpp:46)
    image, _ = kit.packed("fault", HostArgs().u32(0))
    args = kit.pinned(image)
    kit.rt.launch_kernel_with_host_args(
        kit.fn("fault"), 1, kit.stream, None, args, len(image), 0, 0
    )
    task = kit.rt.last_task_id()
    assert _wait_for_site(kit.rt, kit.stream) == (kit.stream, task)
    _, head, tail, written = hal.error_ringbuffer()
    assert written == before + 1
    assert head == tail  # the runtime consumed it


def test_an_error_completion_on_a_chosen_launch_is_blamed_on_that_task(
    kit: Kit, hal: FakeHal
) -> None:
    """Five noop launches, the fourth's SQE completes with an error CQE: the runtime's exception
    info names that task (its stream id and task id, ``aclrtGetThreadLastTaskId`` after its
    submission), the library's ``fault_site`` maps it to the stream, and every later call fails
    with the runtime's vector-core exception, sticky."""
    rt = kit.rt
    image, _ = kit.packed("noop", HostArgs())
    args = kit.pinned(image)
    hal.fail_next(kit.stream, after=3)
    ids = []
    for _ in range(5):
        rt.launch_kernel_with_host_args(kit.fn("noop"), 1, kit.stream, None, args, len(image), 0, 0)
        ids.append(rt.last_task_id())
    assert len(set(ids)) == 5
    assert _wait_for_site(rt, kit.stream) == (kit.stream, ids[3])
    with pytest.raises(DeviceFaultError) as caught:
        rt.synchronize_stream(kit.stream, SYNC_MS)
    assert caught.value.code == VECTOR_CORE_EXCEPTION


def test_the_fault_kernel_is_blamed_on_its_launch(kit: Kit) -> None:
    """The ``fault`` kernel's own error completion (its host function fails the SQE)."""
    rt = kit.rt
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    kit.launch("axpy", HostArgs().ptr(x).ptr(y).f32(1.0).u32(n))
    kit.launch("fault", HostArgs().u32(0))
    blamed = rt.last_task_id()
    assert _wait_for_site(rt, kit.stream) == (kit.stream, blamed)


def test_a_kernel_reading_unallocated_memory_faults(kit: Kit) -> None:
    """Our driver checks every device address a kernel reads: a bad pointer fails the SQE."""
    rt = kit.rt
    n = 4
    z = kit.upload(np.zeros(n, F32))
    kit.launch("vector_add", HostArgs().ptr(0x10).ptr(0x10).ptr(z).u32(n))
    blamed = rt.last_task_id()
    assert _wait_for_site(rt, kit.stream) == (kit.stream, blamed)


# --- device memory misused: the driver never writes the process's heap ------------------------


def test_a_free_under_a_kernel_writing_waits_for_it_and_is_counted(
    kit: Kit, hal: FakeHal, tmp_path: Path
) -> None:
    """Our driver's device memory is the test process's heap: memory freed while a kernel still
    writes it is given back only after the kernel (a device would write memory handed to someone
    else; here the kernel would corrupt the heap), and the free is counted, which fails any
    other test that does it (``tests/conftest.py``)."""
    rt = kit.rt
    binary = rt.load_binary(write_kernel_elf(tmp_path / "k.o", SAMPLE_KERNELS["multi_stream"]))
    long_op = rt.get_function(binary, "LongOPf")  # pins x, sleeps 300 ms, then x[b] += 1
    x = rt.malloc(64)
    before = hal.memory_misuse()
    launches = hal.launch_count()
    image = HostArgs().ptr(x).pack(rt.function_info(long_op)).image
    rt.launch_kernel_with_host_args(
        long_op, 4, kit.stream, None, kit.pinned(image), len(image), 0, 0
    )
    _wait_for_launch(hal, launches)
    time.sleep(0.05)  # (the kernel pins x microseconds after the launch is counted)
    rt.free(x)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    try:
        assert hal.memory_misuse() == (before[0] + 1, before[1])
    finally:
        hal.forgive_misuse()
    rt.unload_binary(binary)


def test_a_kernel_writing_freed_memory_faults_and_is_counted(kit: Kit, hal: FakeHal) -> None:
    """Freed device memory is unmapped: a kernel that writes it fails with the core's exception
    instead of writing, and the write is counted."""
    rt = kit.rt
    n = 4
    x = kit.upload(np.ones(n, F32))
    z = rt.malloc(1 << 20)  # (big: its address is not handed out again by the next allocation)
    rt.free(z)
    before = hal.memory_misuse()
    kit.launch("vector_add", HostArgs().ptr(x).ptr(x).ptr(z).u32(n))
    blamed = rt.last_task_id()
    try:
        assert _wait_for_site(rt, kit.stream) == (kit.stream, blamed)
        assert hal.memory_misuse() == (before[0], before[1] + 1)
    finally:
        hal.forgive_misuse()


def _wait_for_launch(hal: FakeHal, launches: int) -> None:
    deadline = time.monotonic() + FAULT_REPORT_S
    while hal.launch_count() == launches and time.monotonic() < deadline:
        time.sleep(0.001)
    assert hal.launch_count() > launches


def test_the_kernel_object_is_written_once(tmp_path: Path) -> None:
    assert kernel_binary() == kernel_binary()
    assert kernel_binary().read_bytes() == kernel_elf()
