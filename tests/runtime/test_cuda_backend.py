"""The ``cuda`` backend: pure parts, a CPU fake of the driver API, and the GPU checks.

Three layers:

- Pure helpers (``LaunchExtra``, placeholder validation, staging alignment and patches, the
  staging ring, error mapping, the kernel source and its parameter layouts): no cuda-bindings.
- The cuda runtime on ``FakeDriver`` (``tests/doubles/cuda_fake.py``, a CPU model of the driver
  calls the runtime makes) and on a real GPU (``cuda``, marked ``gpu``; skipped unless
  cuda-bindings imports and a device is visible): the behaviour that is cuda's own, and a
  scheduler smoke test. ``benchmarks/gpu_check.py`` runs them on a GPU machine.

The runtime contract suite runs on both through the backend registry (``tests/backends.py``),
in the ``test_contract_*`` modules.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import itertools
import random
import re
import struct
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from backends import RUNTIME_FACTORIES
from doubles.cuda_fake import (
    MODE_GLOBAL,
    MODE_RELAXED,
    MODE_THREAD_LOCAL,
    FakeDriver,
    c_param_layout,
    fake_compile,
    parse_kernel_signatures,
)
from helpers import SYNC_MS, axpy_args, scale_args

import aio_ascend as aa
from aio_ascend._errors import (
    AICoreExceptionError,
    BackendUnavailableError,
    ClosedError,
    ContextNullError,
    DeviceFaultError,
    InvalidHandleError,
    InvalidParamError,
    MemoryAllocationError,
    RuntimeAPIError,
    TaskTimeoutError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._launch_config import LaunchConfig
from aio_ascend._runtime import Runtime, available_backends, open_runtime, probe_backend
from aio_ascend._runtime.abi import (
    ACL_EVENT_SYNC,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    read_placeholder_table,
)
from aio_ascend._runtime.abi import placeholder_problem as validate_placeholders
from aio_ascend._runtime.cuda import runtime as cuda_mod
from aio_ascend._runtime.cuda.core import CU_STREAM_NON_BLOCKING
from aio_ascend._runtime.cuda.errors import cuda_error
from aio_ascend._runtime.cuda.kernels import (
    BUILTIN_NAMES,
    BUILTIN_PARAMS,
    KERNEL_SOURCE,
    PARAM_SIZES,
    param_layout,
)
from aio_ascend._runtime.cuda.launch import (
    CU_LAUNCH_PARAM_BUFFER_POINTER,
    CU_LAUNCH_PARAM_BUFFER_SIZE,
    CU_LAUNCH_PARAM_END,
    LaunchExtra,
    apply_patches,
    placeholder_patches,
)
from aio_ascend._runtime.cuda.runtime import CudaRuntime, open_cuda_runtime
from aio_ascend._runtime.hostmem import host_view
from aio_ascend._runtime.sim.kernels import BUILTIN_KERNELS
from aio_ascend._runtime.staging import (
    MAX_STAGING_ALIGN,
    MIN_STAGING_ALIGN,
    CaptureStaging,
    StagingRing,
    staging_alignment,
)

F32 = np.float32
_HAVE_BINDINGS = importlib.util.find_spec("cuda") is not None and (
    importlib.util.find_spec("cuda.bindings") is not None
)

if TYPE_CHECKING:
    from conftest import RuntimeKit

#: the contract fixtures of tests/runtime/conftest.py (``rt``, ``kit``) on these backends
BACKENDS = ("cuda-fake", "cuda")


# =============================================================================================
# the kernel source
# =============================================================================================

_KIND_FOR_C = {"float": "f32", "unsigned int": "u32"}


def test_kernel_source_defines_every_builtin_of_the_sim() -> None:
    assert KERNEL_SOURCE.strip()
    signatures = parse_kernel_signatures(KERNEL_SOURCE)
    assert set(signatures) == set(BUILTIN_NAMES) == set(BUILTIN_KERNELS)
    for name in BUILTIN_NAMES:
        assert re.search(rf'extern "C" __global__ void {name}\(', KERNEL_SOURCE)


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_kernel_parameters_match_the_table_and_the_size(name: str) -> None:
    types = parse_kernel_signatures(KERNEL_SOURCE)[name]
    kinds = tuple("ptr" if t.endswith("*") else _KIND_FOR_C[t] for t in types)
    assert kinds == BUILTIN_PARAMS[name]
    assert c_param_layout(types)[1] == PARAM_SIZES[name] == param_layout(kinds)[1]


def _hostargs_for(name: str) -> HostArgs:
    """The args of each built-in as the contract tests pack them."""
    args = HostArgs()
    if name == "scale":
        return args.ptr(0x1000).ptr(0x2000).placeholder(struct.pack("<If", 4, 2.0))
    if name == "matmul":
        return args.ptr(0x1000).ptr(0x2000).ptr(0x3000).placeholder(struct.pack("<III", 1, 2, 3))
    for kind in BUILTIN_PARAMS[name]:
        getattr(args, kind)(1 if kind != "f32" else 1.5)
    return args


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_hostargs_packs_each_builtin_in_its_parameter_layout(name: str) -> None:
    """The packed image starts with the kernel's parameters at their C offsets, and the
    placeholder slots are the pointer parameters."""
    types = parse_kernel_signatures(KERNEL_SOURCE)[name]
    offsets, size = c_param_layout(types)
    args = _hostargs_for(name)
    assert args.nbytes >= size
    slots = {a for a, _ in args.placeholders}
    for offset, ctype in zip(offsets, types, strict=True):
        if offset in slots:
            assert ctype.endswith("*"), f"{name}: a placeholder slot must be a pointer parameter"
    # tail data (placeholder blocks) lies after the parameters
    assert all(d >= size for _, d in args.placeholders)


def test_hostargs_layout_matches_c_for_mixed_scalars() -> None:
    kinds = ("u8", "u32", "u16", "f64", "ptr", "u8", "f32")
    args = HostArgs().u8(1).u32(2).u16(3).f64(4.0).ptr(5).u8(6).f32(7.0)
    offsets, end = param_layout(kinds)
    assert offsets == [0, 4, 8, 16, 24, 32, 36]
    image = args.to_bytes()
    assert struct.unpack_from("<B", image, 0)[0] == 1
    assert struct.unpack_from("<I", image, 4)[0] == 2
    assert struct.unpack_from("<H", image, 8)[0] == 3
    assert struct.unpack_from("<d", image, 16)[0] == 4.0
    assert struct.unpack_from("<Q", image, 24)[0] == 5
    assert struct.unpack_from("<f", image, 36)[0] == 7.0
    assert end == 40 and args.nbytes == 40


def _nvrtc_available() -> bool:
    if not _HAVE_BINDINGS:
        return False
    try:
        from cuda.bindings import nvrtc

        err, _ = nvrtc.nvrtcGetSupportedArchs()
        return int(err) == 0
    except Exception:
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="needs cuda-bindings and libnvrtc (no GPU)")
@pytest.mark.parametrize("capability", [90, 80, 75])
def test_kernel_source_compiles_with_nvrtc(capability: int) -> None:
    image = cuda_mod.compile_cuda_source(KERNEL_SOURCE, capability)
    assert image.startswith(b"\x7fELF") or b".entry vector_add" in image


# =============================================================================================
# pure helpers
# =============================================================================================


def test_launch_extra_array_points_at_the_buffer_and_size() -> None:
    extra = LaunchExtra()
    buffer = (ctypes.c_uint64 * 4)(1, 2, 3, 4)
    address = extra.set(ctypes.addressof(buffer), 28)
    assert address == ctypes.addressof(extra.array)
    entries = extra.entries()
    assert entries[0] == CU_LAUNCH_PARAM_BUFFER_POINTER == 1
    assert entries[1] == ctypes.addressof(buffer)
    assert entries[2] == CU_LAUNCH_PARAM_BUFFER_SIZE == 2
    assert entries[4] == CU_LAUNCH_PARAM_END == 0
    assert ctypes.c_size_t.from_address(entries[3]).value == 28
    # reused per launch: the same array, new values
    other = (ctypes.c_uint64 * 2)()
    assert extra.set(ctypes.addressof(other), 12) == address
    assert extra.entries()[1] == ctypes.addressof(other)
    assert ctypes.c_size_t.from_address(extra.entries()[3]).value == 12


def test_launch_extra_copies_a_misaligned_buffer_to_aligned_scratch() -> None:
    raw = (ctypes.c_ubyte * 64)()
    base = ctypes.addressof(raw) + 3
    payload = bytes(range(20))
    ctypes.memmove(base, payload, len(payload))
    extra = LaunchExtra()
    extra.set(base, len(payload))
    pointer = extra.entries()[1]
    assert pointer % 8 == 0
    assert pointer != base
    assert ctypes.string_at(pointer, len(payload)) == payload
    aligned = ctypes.addressof(raw) + 8
    extra.set(aligned, 8)
    assert extra.entries()[1] == aligned


def test_read_placeholder_table_from_host_memory() -> None:
    table = HostArgs().ptr(1).placeholder(b"abcd").u32(3).placeholder(b"x" * 12, align=64)
    raw = table.placeholder_table()
    buf = ctypes.create_string_buffer(raw, len(raw))
    entries = read_placeholder_table(ctypes.addressof(buf), 2)
    assert entries == table.placeholders


@pytest.mark.parametrize(
    ("entries", "size", "field"),
    [
        ([(16, 32)], 40, None),
        ([(4, 32)], 40, "addrOffset"),
        ([(40, 32)], 40, "addrOffset"),
        ([(16, 36)], 40, "dataOffset"),
        ([(16, 40)], 40, "dataOffset"),
        ([(16, 32), (24, 33)], 40, "placeHolderArray[1].dataOffset"),
        ([(32, 0)], 40, None),
    ],
)
def test_validate_placeholders_names_the_field(
    entries: list[tuple[int, int]], size: int, field: str | None
) -> None:
    problem = validate_placeholders(entries, size)
    if field is None:
        assert problem is None
    else:
        assert problem is not None
        assert field in problem


def test_staging_alignment_keeps_each_blocks_alignment() -> None:
    assert staging_alignment([]) == MIN_STAGING_ALIGN
    assert staging_alignment([(16, 32)]) == MIN_STAGING_ALIGN
    assert staging_alignment([(16, 24), (24, 40)]) == MIN_STAGING_ALIGN
    assert staging_alignment([(16, 128)]) == 128
    assert staging_alignment([(0, 256), (8, 384)]) == 256
    assert staging_alignment([(8, 8192)]) == MAX_STAGING_ALIGN
    assert staging_alignment([(8, 0)]) == MIN_STAGING_ALIGN
    for align in (32, 64, 256, 4096):
        args = HostArgs().ptr(1).u32(2).placeholder(b"t" * 5, align=align).placeholder(b"u")
        region_align = staging_alignment(args.placeholders)
        region = 0x7F00_0000_0000 + 7 * region_align  # any region with that alignment
        for _, data_offset in args.placeholders:  # each block keeps its alignment on the device
            own = min(data_offset & -data_offset, MAX_STAGING_ALIGN)
            assert (region + data_offset) % own == 0
        first = args.placeholders[0][1]
        assert (region + first) % align == 0


def test_placeholder_patches_write_region_plus_data_offset_into_the_buffer() -> None:
    args = HostArgs().ptr(0x1111).ptr(0x2222).placeholder(b"tiling!!").u32(9).placeholder(b"z")
    image = bytearray(args.to_bytes())
    buf = (ctypes.c_ubyte * len(image)).from_buffer(image)
    region = 0x7000_0000_1000
    patches = placeholder_patches(args.placeholders, region)
    assert [offset for offset, _ in patches] == [a for a, _ in args.placeholders]
    apply_patches(ctypes.addressof(buf), patches)
    for addr_offset, data_offset in args.placeholders:
        assert struct.unpack_from("<Q", image, addr_offset)[0] == region + data_offset
    # everything else is untouched
    original = args.to_bytes()
    mask = bytearray(image)
    for addr_offset, _ in args.placeholders:
        mask[addr_offset : addr_offset + 8] = original[addr_offset : addr_offset + 8]
    assert bytes(mask) == original


@pytest.mark.parametrize(
    ("code", "cls", "name"),
    [
        (700, DeviceFaultError, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        (719, DeviceFaultError, "CUDA_ERROR_LAUNCH_FAILED"),
        (1, InvalidParamError, "CUDA_ERROR_INVALID_VALUE"),
        (2, MemoryAllocationError, "CUDA_ERROR_OUT_OF_MEMORY"),
        (400, InvalidHandleError, "CUDA_ERROR_INVALID_HANDLE"),
        (201, ContextNullError, "CUDA_ERROR_INVALID_CONTEXT"),
        (500, RuntimeAPIError, "CUDA_ERROR_NOT_FOUND"),
        (12345, RuntimeAPIError, "CUDA_ERROR_12345"),
    ],
)
def test_cuda_errors_keep_the_cuda_number_and_name_it(code: int, cls: type, name: str) -> None:
    exc = cuda_error(code, "cuSomething", "what the driver said")
    assert type(exc) is cls
    assert exc.code == code
    assert exc.func == "cuSomething"
    assert name in exc.message and str(code) in exc.message
    assert "what the driver said" in exc.message


# --- the staging ring -----------------------------------------------------------------------


class FakeRingOps:
    """Fences are dicts; ``complete_through(k)`` completes fences 0..k (FIFO, as a stream)."""

    def __init__(self) -> None:
        self.allocs: dict[int, int] = {}
        self.freed: list[int] = []
        self.fences: list[dict[str, Any]] = []
        self.released: list[dict[str, Any]] = []
        self.waits = 0
        self._next = 0x10_0000_0008  # deliberately not 4096-aligned

    def alloc(self, nbytes: int) -> int:
        addr = self._next
        self._next += nbytes + 0x10_0000
        self.allocs[addr] = nbytes
        return addr

    def free(self, address: int) -> None:
        assert address in self.allocs
        self.freed.append(address)
        del self.allocs[address]

    def record(self) -> object:
        fence = {"id": len(self.fences), "done": False}
        self.fences.append(fence)
        return fence

    def done(self, fence: object) -> bool:
        assert isinstance(fence, dict)
        return bool(fence["done"])

    def wait(self, fence: object) -> None:
        assert isinstance(fence, dict)
        self.waits += 1
        self.complete_through(fence["id"])

    def release(self, fence: object) -> None:
        assert isinstance(fence, dict)
        self.released.append(fence)

    def complete_through(self, index: int) -> None:
        for fence in self.fences[: index + 1]:
            fence["done"] = True


def test_ring_base_is_aligned_and_regions_are_aligned() -> None:
    ops = FakeRingOps()
    ring = StagingRing(ops, 64 * 1024)
    assert ring.base % MAX_STAGING_ALIGN == 0
    (raw,) = ops.allocs
    assert raw <= ring.base < raw + MAX_STAGING_ALIGN
    for align in (64, 128, 4096, 64):
        region = ring.allocate(40, align)
        assert region % align == 0
        assert ring.base <= region and region + 40 <= ring.base + ring.capacity
        ring.committed(40)


def test_ring_reuses_bytes_only_after_their_fence_completes() -> None:
    ops = FakeRingOps()
    ring = StagingRing(ops, 4096, fence_every=4)
    seen = set()
    for _ in range(4):
        seen.add(ring.allocate(256, 64))
        ring.committed(256)
    assert len(ops.fences) == 1  # 4 launches: one fence
    for _ in range(16):  # fills the ring: must wait for the first fence, not overwrite
        region = ring.allocate(256, 64)
        ring.committed(256)
        if region in seen:
            assert ops.fences[0]["done"], "a region was reused before its fence completed"
    assert ops.waits >= 1


def test_ring_wraps_around_and_never_overlaps_live_regions() -> None:
    rng = random.Random(7)
    ops = FakeRingOps()
    ring = StagingRing(ops, 16 * 1024, fence_every=3)
    # live regions: [start, end, fence or None (not fenced yet)]
    live: list[list[Any]] = []
    recorded = 0
    for step in range(3000):
        if rng.random() < 0.3 and ops.fences:  # the device progresses (FIFO)
            ops.complete_through(rng.randrange(len(ops.fences)))
        size = rng.choice([8, 40, 100, 300, 1000, 3000])
        align = rng.choice([64, 64, 128, 256, 4096])
        region = ring.allocate(size, align)
        for fence in ops.fences[recorded:]:  # fences recorded during allocate (waits)
            for entry in live:
                if entry[2] is None:
                    entry[2] = fence
        recorded = len(ops.fences)
        live = [e for e in live if e[2] is None or not e[2]["done"]]
        assert region % align == 0, step
        assert ring.base <= region and region + size <= ring.base + ring.capacity, step
        for start, end, _ in live:
            assert region + size <= start or end <= region, f"overlap at step {step}"
        live.append([region, region + size, None])
        ring.committed(size)
        for fence in ops.fences[recorded:]:
            for entry in live:
                if entry[2] is None:
                    entry[2] = fence
        recorded = len(ops.fences)
    assert ring.stats["allocations"] == 3000
    assert ring.stats["grows"] == 0


def test_ring_grows_for_a_region_larger_than_itself() -> None:
    ops = FakeRingOps()
    ring = StagingRing(ops, 4096)
    small = ring.allocate(100, 64)
    ring.committed(100)
    big = ring.allocate(10_000, 256)
    assert ring.capacity >= 10_000 + 256
    assert ring.stats["grows"] == 1
    assert ops.waits == 1, "growing waits for the work that uses the old memory"
    assert len(ops.freed) == 1
    assert big % 256 == 0 and small not in range(ring.base, ring.base + ring.capacity)
    ring.committed(10_000)
    assert ring.close() == 0
    assert not ops.allocs
    assert len(ops.released) == len(ops.fences)


def test_ring_close_can_leave_the_memory_to_the_caller() -> None:
    ops = FakeRingOps()
    ring = StagingRing(ops, 4096)
    ring.allocate(10, 64)
    ring.committed(10)
    raw = ring.close(free=False)
    assert raw in ops.allocs
    assert not ops.freed


def test_ring_rejects_bad_requests() -> None:
    ring = StagingRing(FakeRingOps(), 4096)
    with pytest.raises(ValueError, match="nbytes"):
        ring.allocate(0, 64)
    with pytest.raises(ValueError, match="align"):
        ring.allocate(8, 48)
    with pytest.raises(ValueError, match="align"):
        ring.allocate(8, 8192)
    with pytest.raises(ValueError, match="capacity"):
        StagingRing(FakeRingOps(), 100)


def test_capture_staging_carves_aligned_regions_and_never_reuses_them() -> None:
    ops = FakeRingOps()  # its addresses are deliberately not 4096-aligned
    staging = CaptureStaging(ops.alloc, chunk=4096)
    regions = [staging.allocate(100, 64) for _ in range(40)]
    assert all(r % 64 == 0 for r in regions)
    spans = sorted((r, r + 100) for r in regions)
    assert all(a_end <= b for (_, a_end), (b, _) in itertools.pairwise(spans))
    assert len(staging.blocks) == 2  # 40 regions of 128 bytes need two 4 KiB blocks
    big = staging.allocate(10_000, 4096)  # larger than a block: one of its own
    assert big % 4096 == 0 and len(staging.blocks) == 3
    assert any(b <= big and big + 10_000 <= b + ops.allocs[b] for b in staging.blocks)
    assert set(staging.blocks) == set(ops.allocs)
    with pytest.raises(ValueError, match="nbytes"):
        staging.allocate(0, 64)
    with pytest.raises(ValueError, match="align"):
        staging.allocate(8, 8192)


# --- availability -----------------------------------------------------------------------------


def test_probe_never_raises_and_explains() -> None:
    ok, why = cuda_mod.probe()
    assert isinstance(ok, bool) and why
    assert probe_backend("cuda") == (ok, why)
    if not _HAVE_BINDINGS:
        assert not ok
        assert "cuda-bindings" in why
        assert "cuda" not in available_backends()


@pytest.mark.skipif(_HAVE_BINDINGS, reason="cuda-bindings is installed here")
def test_opening_without_cuda_bindings_is_backend_unavailable() -> None:
    with pytest.raises(BackendUnavailableError, match="cuda-bindings"):
        open_runtime("cuda", 0)


def test_open_validates_its_options() -> None:
    with pytest.raises(ValueError, match="device_id"):
        open_cuda_runtime(-1, driver=FakeDriver())
    with pytest.raises(ValueError, match="block_dim"):
        open_cuda_runtime(0, block_dim=2048, driver=FakeDriver())
    with pytest.raises(ValueError, match="staging_bytes"):
        open_cuda_runtime(0, staging_bytes=10, driver=FakeDriver())
    with pytest.raises(InvalidParamError, match="device_id=3"):
        open_cuda_runtime(3, driver=FakeDriver())


# =============================================================================================
# the runtime's kit and fixtures (tests/runtime/conftest.py), on the fake driver and on a GPU
# =============================================================================================


def _fake(rt: Runtime) -> FakeDriver:
    assert isinstance(rt, CudaRuntime)
    driver = rt._d
    if not isinstance(driver, FakeDriver):
        pytest.skip("inspects the fake driver")
    return driver


# =============================================================================================
# runtime behaviour (on the fake driver; the cuda-parametrised ones also on a real GPU)
# =============================================================================================


@pytest.mark.parametrize("code", [0, 507035])
def test_a_device_fault_names_the_cuda_error_and_the_acl_code(kit: RuntimeKit, code: int) -> None:
    """The fault's message carries both; an exception without a code is an AI Core one (the
    contract's sticky-fault test covers what fails after it)."""
    kit.launch("fault", HostArgs().u32(code))
    with pytest.raises(DeviceFaultError) as info:
        kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    expected = code or 507015
    assert info.value.code == expected
    assert "CUDA_ERROR_" in info.value.message
    assert f"ACL error {expected}" in info.value.message
    assert isinstance(info.value, AICoreExceptionError) == (code == 0)


def test_launch_passes_the_args_through_the_parameter_buffer(kit: RuntimeKit) -> None:
    fake = _fake(kit.rt)
    n = 16
    x, y, z = (kit.rt.malloc(4 * n) for _ in range(3))
    args = HostArgs().ptr(x).ptr(y).ptr(z).u32(n)
    kit.launch("vector_add", args, blocks=7, cfg=LaunchConfig(block_dim=64))
    launch = fake.launches[-1]
    assert launch["name"] == "vector_add"
    assert (launch["grid"], launch["block"]) == (7, 64)
    assert launch["params"] == args.to_bytes()[:28]  # exact size: no tail padding
    assert launch["extra"][0::2] == [1, 2, 0]
    kit.launch("noop", HostArgs())
    assert fake.launches[-1]["extra"] == []  # no parameters: extra is NULL
    assert fake.launches[-1]["block"] == cuda_mod.DEFAULT_BLOCK_DIM


def test_launch_refuses_args_smaller_than_the_kernels_parameters(kit: RuntimeKit) -> None:
    with pytest.raises(InvalidParamError, match="argsSize=8 is smaller than the 28 bytes"):
        kit.launch("vector_add", HostArgs().u32(1))


def test_placeholder_data_is_staged_on_the_device(kit: RuntimeKit) -> None:
    rt = kit.rt
    fake = _fake(rt)
    n = 8
    x, y = kit.upload(np.arange(n, dtype=F32)), kit.upload(np.zeros(n, F32))
    args = scale_args(x, y, n, 2.5)
    addr = kit.launch("scale", args)
    slot = struct.unpack_from("<Q", bytes(host_view(addr, args.nbytes)), 16)[0]
    assert fake.in_device(slot, 8), "the slot points at device memory (the staging ring)"
    assert fake.launches[-1]["params"][16:24] == struct.pack("<Q", slot)
    assert slot % MIN_STAGING_ALIGN == 32 % MIN_STAGING_ALIGN
    np.testing.assert_array_equal(kit.download(y, n), np.arange(n, dtype=F32) * F32(2.5))
    assert isinstance(rt, CudaRuntime)
    assert rt.staging_stats(kit.stream)["allocations"] == 1


def test_staging_memory_is_reused_after_completion(
    backend: str, make_kit: Callable[..., RuntimeKit]
) -> None:
    runtime = RUNTIME_FACTORIES[backend]()
    try:
        assert isinstance(runtime, CudaRuntime)
        d = make_kit(runtime)
        n = 64
        x_host = np.arange(n, dtype=F32)
        x, y = d.upload(x_host), d.upload(np.zeros(n, F32))
        factors = [float(F32(1 + i / 7)) for i in range(2000)]
        slots = set()
        for i, factor in enumerate(factors):
            addr = d.launch("scale", scale_args(x, y, n, factor))
            slots.add(struct.unpack_from("<Q", bytes(host_view(addr, 24)), 16)[0])
            if i % 500 == 499:
                np.testing.assert_array_equal(d.download(y, n), x_host * F32(factor))
        stats = runtime.staging_stats(d.stream)
        assert stats["allocations"] == 2000
        assert stats["grows"] == 0
        assert len(slots) <= stats["capacity"] // MIN_STAGING_ALIGN
        np.testing.assert_array_equal(d.download(y, n), x_host * F32(factors[-1]))
    finally:
        runtime.close()


def test_staging_ring_waits_when_full_of_unfinished_work(
    make_kit: Callable[..., RuntimeKit],
) -> None:
    fake = FakeDriver()
    runtime = open_cuda_runtime(0, driver=fake, compiler=fake_compile, staging_bytes=4096)
    try:
        d = make_kit(runtime)
        n = 4
        x, y = d.upload(np.ones(n, F32)), d.upload(np.zeros(n, F32))
        d.sleep_us(1_000_000)  # 10x what filling the ring takes on a loaded machine
        t0 = time.monotonic()
        for _ in range(200):  # 64 B each: the 4 KiB ring is full after 64 launches
            d.launch("scale", scale_args(x, y, n, 3.0))
        assert time.monotonic() - t0 >= 0.09, "a full ring must wait for the queued work"
        assert runtime.staging_stats(d.stream)["waits"] >= 1
        np.testing.assert_array_equal(d.download(y, n), np.full(n, 3.0, F32))
    finally:
        runtime.close()


def test_large_placeholder_data_grows_the_ring(make_kit: Callable[..., RuntimeKit]) -> None:
    runtime = open_cuda_runtime(0, driver=FakeDriver(), compiler=fake_compile, staging_bytes=4096)
    try:
        d = make_kit(runtime)
        n = 4
        x, y = d.upload(np.ones(n, F32)), d.upload(np.zeros(n, F32))
        tiling = struct.pack("<If", n, 4.0) + bytes(10_000)
        args = HostArgs().ptr(x).ptr(y).placeholder(tiling, align=256)
        d.launch("scale", args)
        np.testing.assert_array_equal(d.download(y, n), np.full(n, 4.0, F32))
        assert runtime.staging_stats(d.stream)["grows"] == 1
    finally:
        runtime.close()


def test_a_closed_runtime_refuses_calls(backend: str) -> None:
    runtime = RUNTIME_FACTORIES[backend]()
    runtime.close()
    with pytest.raises(ClosedError):
        runtime.create_stream()
    with pytest.raises(ClosedError):
        runtime.set_current_context()
    runtime.close()


def test_close_releases_everything_and_hung_kernels(make_kit: Callable[..., RuntimeKit]) -> None:
    fake = FakeDriver()
    runtime = open_cuda_runtime(0, driver=fake, compiler=fake_compile)
    d = make_kit(runtime)
    d.hang(d.stream)
    runtime.malloc(100)
    runtime.malloc_host(100)
    runtime.create_event(0)
    d.launch("scale", scale_args(runtime.malloc(16), runtime.malloc(16), 4, 1.0))
    runtime.close()
    assert runtime.close_errors == ()
    assert fake.refcount == 0
    assert not fake.host, "pinned memory (and the control block) freed"
    assert fake.resets == 0, "no fault: the primary context is released, not reset"


def test_close_after_a_fault_resets_the_primary_context(
    make_kit: Callable[..., RuntimeKit],
) -> None:
    fake = FakeDriver()
    runtime = open_cuda_runtime(0, driver=fake, compiler=fake_compile)
    d = make_kit(runtime)
    d.launch("fault", HostArgs().u32(0))
    with pytest.raises(DeviceFaultError):
        runtime.synchronize_stream(d.stream, 1000)
    assert isinstance(runtime, CudaRuntime) and runtime._fault is not None
    runtime.close()
    assert fake.resets == 1


def test_a_kernel_fault_without_the_fault_kernel_carries_the_cuda_code(kit: RuntimeKit) -> None:
    n = 4
    x = kit.upload(np.ones(n, F32))
    kit.launch("axpy", axpy_args(x, 0x1234_0000, 1.0, n))  # y is not device memory
    with pytest.raises(DeviceFaultError) as info:
        kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    assert info.value.code == 700
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (700)" in info.value.message


def test_pageable_copies_are_done_when_the_call_returns(kit: RuntimeKit) -> None:
    rt = kit.rt
    n = 256
    src = np.arange(n, dtype=F32)
    dst = np.zeros(n, dtype=F32)
    device = rt.malloc(src.nbytes)
    kit.sleep_us(50_000)
    rt.memcpy_async(
        device, src.nbytes, src.ctypes.data, src.nbytes, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream
    )
    rt.memcpy_async(
        dst.ctypes.data, dst.nbytes, device, dst.nbytes, ACL_MEMCPY_DEVICE_TO_HOST, kit.stream
    )
    np.testing.assert_array_equal(dst, src)


def test_pinned_memory_is_recognised(rt: Runtime) -> None:
    assert isinstance(rt, CudaRuntime)
    a = rt.malloc_host(1000)
    b = rt.malloc_host(64)
    assert rt.is_pinned(a, 1000) and rt.is_pinned(a + 10, 990) and rt.is_pinned(b, 64)
    assert not rt.is_pinned(a, 1001) or b == a + 1000
    assert not rt.is_pinned(a - 1, 1)
    rt.free_host(a)
    assert not rt.is_pinned(a, 1)


def test_user_modules_from_cu_files(tmp_path: Any) -> None:
    source = 'extern "C" __global__ void mine(float* x, unsigned int n, double d) {}\n'
    path = tmp_path / "mine.cu"
    path.write_text(source)
    runtime = open_cuda_runtime(0, driver=FakeDriver(), compiler=fake_compile)
    try:
        binary = runtime.load_binary(path)
        func = runtime.get_function(binary, "mine")
        assert runtime._functions[func].param_size == 24  # from cuFuncGetParamInfo
        with pytest.raises(RuntimeAPIError) as info:
            runtime.get_function(binary, "theirs")
        assert info.value.code == 107042
        with pytest.raises(TypeError, match="cuda backend loads"):
            runtime.load_binary(42)
        with pytest.raises(FileNotFoundError):
            runtime.load_binary(tmp_path / "missing.ptx")
        runtime.unload_binary(binary)
        with pytest.raises(InvalidHandleError):
            runtime.get_function(binary, "mine")
    finally:
        runtime.close()


_FILL_SOURCE = """
extern "C" __global__ void fill(float* out, float value, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = value;
}
"""


def test_a_cu_file_is_compiled_loaded_and_launched(
    kit: RuntimeKit, backend: str, tmp_path: Any
) -> None:
    """A user kernel: NVRTC, cuModuleLoadData, cuFuncGetParamInfo, a parameter-buffer launch."""
    if backend != "cuda":
        pytest.skip("the fake driver does not run user kernels")
    path = tmp_path / "fill.cu"
    path.write_text(_FILL_SOURCE)
    rt = kit.rt
    assert isinstance(rt, CudaRuntime)
    binary = rt.load_binary(path)
    func = rt.get_function(binary, "fill")
    assert rt._functions[func].param_size == 16
    n = 1000
    out = rt.malloc(4 * n)
    addr, size, table, count = kit.pack(HostArgs().ptr(out).f32(2.5).u32(n))
    rt.launch_kernel_with_host_args(
        func, 3, kit.stream, LaunchConfig(block_dim=128), addr, size, table, count
    )
    np.testing.assert_array_equal(kit.download(out, n), np.full(n, 2.5, F32))


def test_builtin_parameter_sizes_agree_with_the_driver(rt: Runtime) -> None:
    """On a GPU this compares the table with ``cuFuncGetParamInfo`` on the compiled kernels."""
    assert isinstance(rt, CudaRuntime)
    binary = rt.load_binary(None)
    for name in BUILTIN_NAMES:
        func = rt.get_function(binary, name)
        queried = rt._param_size(rt._functions[func].cu)
        if queried is None:
            pytest.skip("the driver predates cuFuncGetParamInfo")
        assert queried == PARAM_SIZES[name], name


def test_memcpy_between_all_kinds_round_trips(kit: RuntimeKit) -> None:
    rt = kit.rt
    data = bytes(range(256)) * 4
    a, b = rt.malloc(len(data)), rt.malloc(len(data))
    src, dst = kit.pinned(data), rt.malloc_host(len(data))
    rt.memcpy_async(a, len(data), src, len(data), ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
    rt.memcpy_async(b, len(data), a, len(data), ACL_MEMCPY_DEVICE_TO_DEVICE, kit.stream)
    rt.memcpy_async(dst, len(data), b, len(data), ACL_MEMCPY_DEVICE_TO_HOST, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    assert bytes(host_view(dst, len(data))) == data


# --- stream priorities, memset, info, device-to-device copies ----------------------------------


def _open_fake(fake: FakeDriver) -> CudaRuntime:
    return open_cuda_runtime(0, driver=fake, compiler=fake_compile)


def _spy(fake: FakeDriver, name: str) -> list[tuple[Any, ...]]:
    """Record the arguments of every call of the fake's ``name`` (then call it)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(fake, name)

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(fake, name, spy)
    return calls


def test_a_priority_stream_is_created_non_blocking_with_that_priority(rt: Runtime) -> None:
    """On a GPU too: ``cuStreamGetPriority``/``cuStreamGetFlags`` read back what was asked."""
    assert isinstance(rt, CudaRuntime)
    least, greatest = rt.stream_priority_range()
    for priority in sorted({least, greatest}):
        handle = rt.create_stream(priority)
        cu = rt._streams[handle].cu
        err, got = rt._d.cuStreamGetPriority(cu)
        assert int(err) == 0 and int(got) == priority
        err, flags = rt._d.cuStreamGetFlags(cu)
        assert int(err) == 0 and int(flags) & CU_STREAM_NON_BLOCKING
        rt.destroy_stream(handle)
    handle = rt.create_stream()  # no priority: the default one
    err, got = rt._d.cuStreamGetPriority(rt._streams[handle].cu)
    assert int(err) == 0 and int(got) == 0
    rt.destroy_stream(handle)


def test_create_stream_passes_flags_and_priority_to_the_driver() -> None:
    fake = FakeDriver(priority_range=(0, -3))
    rt = _open_fake(fake)
    try:
        with_priority = _spy(fake, "cuStreamCreateWithPriority")
        plain = _spy(fake, "cuStreamCreate")
        assert rt.stream_priority_range() == (0, -3)
        handle = rt.create_stream(-2)
        assert with_priority == [(CU_STREAM_NON_BLOCKING, -2)]
        assert fake.streams[handle].priority == -2
        rt.create_stream()
        rt.create_stream(None)
        assert plain == [(CU_STREAM_NON_BLOCKING,)] * 2
        assert len(with_priority) == 1
    finally:
        rt.close()


@pytest.mark.parametrize("priority", [1, -4, 100, True, 1.0, "0"])
def test_a_bad_priority_is_refused_before_the_driver_sees_it(priority: Any) -> None:
    """CUDA would clamp an out-of-range priority; the backend refuses it with 107000."""
    fake = FakeDriver(priority_range=(0, -3))
    rt = _open_fake(fake)
    try:
        calls = _spy(fake, "cuStreamCreateWithPriority")
        streams = len(fake.streams)
        with pytest.raises(InvalidParamError, match="priority") as info:
            rt.create_stream(priority)
        assert info.value.code == 107000
        assert calls == [] and len(fake.streams) == streams
        assert "priority" in rt.get_recent_error_message()
    finally:
        rt.close()


def test_memset_passes_its_arguments_to_cuMemsetD8Async(kit: RuntimeKit) -> None:
    fake = _fake(kit.rt)
    calls = _spy(fake, "cuMemsetD8Async")
    ptr = kit.upload(np.zeros(64, np.uint8))
    kit.rt.memset_async(ptr + 8, 56, 0xA5, 16, kit.stream)
    cu = kit.rt._streams[kit.stream].cu  # type: ignore[attr-defined]
    assert calls == [(ptr + 8, 0xA5, 16, cu)]
    assert fake.memsets[-1] == {"dst": ptr + 8, "value": 0xA5, "count": 16, "stream": cu}
    expected = np.zeros(64, np.uint8)
    expected[8:24] = 0xA5
    np.testing.assert_array_equal(kit.download(ptr, 64, np.uint8), expected)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 16, 0, 16), "NULL"),
        ((None, 16, 1, 32), "larger than destMax"),
        ((None, 16, 256, 16), "value=256"),
        ((None, 16, -1, 16), "value=-1"),
        ((None, -1, 0, 0), "destMax"),
        ((None, 16, 0, True), "count"),
    ],
)
def test_memset_arguments_are_checked_before_the_driver(
    kit: RuntimeKit, args: tuple[Any, int, Any, Any], match: str
) -> None:
    fake = _fake(kit.rt)
    calls = _spy(fake, "cuMemsetD8Async")
    ptr = kit.rt.malloc(64)
    target, dst_max, value, count = args
    with pytest.raises(InvalidParamError, match=match) as info:
        kit.rt.memset_async(ptr if target is None else target, dst_max, value, count, kit.stream)
    assert info.value.code == 107000
    assert calls == []


def test_memset_outside_a_live_allocation_is_refused_by_the_driver(kit: RuntimeKit) -> None:
    """The fake answers as the driver does: CUDA_ERROR_INVALID_VALUE at the call."""
    _fake(kit.rt)
    ptr = kit.rt.malloc(64)
    for target, count in ((ptr + 32, 64), (0x1234_0000, 16)):
        with pytest.raises(InvalidParamError) as info:
            kit.rt.memset_async(target, count, 0, count, kit.stream)
        assert info.value.code == 1
        assert "CUDA_ERROR_INVALID_VALUE (1)" in info.value.message
    assert kit.rt._fault is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("op", ["memset", "copy"])
def test_memory_freed_before_a_queued_task_runs_faults_the_device(kit: RuntimeKit, op: str) -> None:
    rt = kit.rt
    _fake(rt)
    ptr, other = rt.malloc(64), rt.malloc(64)
    kit.sleep_us(20_000)
    if op == "memset":
        rt.memset_async(ptr, 64, 1, 64, kit.stream)
    else:
        rt.memcpy_async(ptr, 64, other, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, kit.stream)
    rt.free(ptr)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(kit.stream, SYNC_MS)
    assert info.value.code == 700


def test_a_device_to_device_copy_outside_an_allocation_is_refused(kit: RuntimeKit) -> None:
    _fake(kit.rt)
    a = kit.rt.malloc(64)
    with pytest.raises(InvalidParamError) as info:
        kit.rt.memcpy_async(a, 64, a + 32, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, kit.stream)
    assert info.value.code == 1


@pytest.mark.parametrize(
    ("version", "text"), [(12040, "12.4"), (11080, "11.8"), (13000, "13.0"), (12090, "12.9")]
)
def test_the_driver_version_is_formatted_major_dot_minor(version: int, text: str) -> None:
    assert cuda_mod.cuda_version_string(version) == text
    rt = _open_fake(FakeDriver(driver_version=version))
    try:
        assert rt.info()["runtime_version"] == text
    finally:
        rt.close()


def test_the_device_name_is_cut_at_its_nul() -> None:
    assert cuda_mod.device_name_string(b"NVIDIA H200\0    ") == "NVIDIA H200"
    assert cuda_mod.device_name_string(b"NVIDIA H200") == "NVIDIA H200"
    fake = FakeDriver(device_name="X" * 300, capability=(8, 6))
    rt = _open_fake(fake)
    try:
        info = rt.info()
        assert info["device_name"] == "X" * 255  # cuDeviceGetName(256, dev) keeps 255 + NUL
        assert info["compute_capability"] == "8.6"
        assert rt.capability == 86
    finally:
        rt.close()


def test_info_reports_the_fake_devices_memory_exactly() -> None:
    fake = FakeDriver(total_memory=1 << 30)
    rt = _open_fake(fake)
    try:
        info = rt.info()
        assert info == {
            "runtime_version": "12.4",
            "memory_free": (1 << 30) - fake.allocated,
            "memory_total": 1 << 30,
            "stream_priority_least": 0,
            "stream_priority_greatest": -5,
            "device_name": "Fake CUDA Device",
            "compute_capability": "9.0",
        }
        ptr = rt.malloc(1 << 20)
        assert rt.info()["memory_free"] == info["memory_free"] - (1 << 20)  # type: ignore[operator]
        with pytest.raises(MemoryAllocationError) as error:
            rt.malloc(1 << 30)
        assert error.value.code == 2
        rt.free(ptr)
        assert rt.info()["memory_free"] == info["memory_free"]
    finally:
        rt.close()


def test_info_describes_the_device(rt: Runtime) -> None:
    """On a GPU too: the values are plain and agree with what the runtime knows."""
    assert isinstance(rt, CudaRuntime)
    info = rt.info()
    assert re.fullmatch(r"\d+\.\d", str(info["runtime_version"]))
    assert isinstance(info["device_name"], str) and info["device_name"]
    assert "\0" not in info["device_name"]
    assert info["compute_capability"] == f"{rt.capability // 10}.{rt.capability % 10}"
    assert (info["stream_priority_least"], info["stream_priority_greatest"]) == (
        rt.stream_priority_range()
    )
    free, total = info["memory_free"], info["memory_total"]
    assert isinstance(free, int) and isinstance(total, int) and 0 < free <= total


def test_the_new_calls_after_close_and_without_a_context(backend: str) -> None:
    runtime = RUNTIME_FACTORIES[backend]()
    stream = runtime.create_stream()
    ptr = runtime.malloc(64)
    errors: list[BaseException] = []

    def other_thread() -> None:
        for call in (
            runtime.info,
            runtime.stream_priority_range,
            lambda: runtime.create_stream(0),
            lambda: runtime.memset_async(ptr, 64, 0, 64, stream),
        ):
            try:
                call()
            except BaseException as exc:
                errors.append(exc)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert [type(e) for e in errors] == [ContextNullError] * 4
    runtime.close()
    for call in (
        runtime.info,
        runtime.stream_priority_range,
        lambda: runtime.create_stream(0),
        lambda: runtime.memset_async(ptr, 64, 0, 64, stream),
    ):
        with pytest.raises(ClosedError):
            call()


# --- graphs: stream capture and replay -------------------------------------------------------


def _open_small_ring(backend: str) -> CudaRuntime:
    """A runtime whose staging rings start at 4 KiB: 64 placeholder launches fill one."""
    if backend == "cuda":
        return open_cuda_runtime(0, staging_bytes=4096)
    return open_cuda_runtime(0, driver=FakeDriver(), compiler=fake_compile, staging_bytes=4096)


def _slot(addr: int) -> int:
    """The device address patched into the ``scale`` args' placeholder slot (offset 16)."""
    value: int = struct.unpack_from("<Q", bytes(host_view(addr, 24)), 16)[0]
    return value


def _capture_status(rt: CudaRuntime, stream: int) -> int:
    err, status = rt._d.cuStreamIsCapturing(rt._streams[stream].cu)
    assert int(err) == 0
    return int(status)  # NONE 0, ACTIVE 1, INVALIDATED 2


def test_begin_capture_asks_cuda_for_the_relaxed_mode(kit: RuntimeKit) -> None:
    rt = kit.rt
    assert isinstance(rt, CudaRuntime)
    calls = _spy(rt._d, "cuStreamBeginCapture") if isinstance(rt._d, FakeDriver) else None
    rt.begin_capture(kit.stream)
    assert rt._streams[kit.stream].capturing
    assert _capture_status(rt, kit.stream) == 1
    if calls is not None:
        assert calls == [(rt._streams[kit.stream].cu, MODE_RELAXED)]
    graph = rt.end_capture(kit.stream)
    assert not rt._streams[kit.stream].capturing
    assert _capture_status(rt, kit.stream) == 0
    rt.destroy_graph(graph)


def test_in_the_global_mode_a_capture_could_not_stage_placeholders(
    make_kit: Callable[..., RuntimeKit],
) -> None:
    """Why relaxed: the global mode makes ``cuMemAlloc`` (a captured launch's staging, or any
    allocation by another thread) illegal, and it breaks the capture (the fake, as CUDA)."""
    fake = FakeDriver()
    fake.CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_RELAXED=MODE_GLOBAL)
    rt = _open_fake(fake)
    try:
        d = make_kit(rt)
        n = 4
        x, y = d.upload(np.ones(n, F32)), d.upload(np.zeros(n, F32))
        rt.begin_capture(d.stream)
        with pytest.raises(RuntimeAPIError) as info:
            d.launch("scale", scale_args(x, y, n, 2.0))
        assert info.value.code == 900
        assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in info.value.message
        with pytest.raises(RuntimeAPIError) as info:
            rt.end_capture(d.stream)
        assert info.value.code == 901  # invalidated: no graph
        assert not rt._streams[d.stream].capturing
        assert not fake.graphs
    finally:
        rt.close()


def test_placeholders_in_a_capture_are_staged_in_memory_the_graph_owns(
    kit: RuntimeKit,
) -> None:
    rt = kit.rt
    fake = _fake(rt)
    assert isinstance(rt, CudaRuntime)
    n = 8
    x_host = np.arange(n, dtype=F32)
    x, y = kit.upload(x_host), kit.upload(np.zeros(n, F32))
    kit.launch("scale", scale_args(x, y, n, 1.0))  # the stream's ring exists
    ring = rt._streams[kit.stream].ring
    assert ring is not None
    ring_stats = rt.staging_stats(kit.stream)
    before = fake.allocated
    rt.begin_capture(kit.stream)
    slot = _slot(kit.launch("scale", scale_args(x, y, n, 2.5)))
    graph = rt.end_capture(kit.stream)
    assert rt.staging_stats(kit.stream) == ring_stats, "the ring was not used"
    assert not ring.base <= slot < ring.base + ring.capacity
    assert fake.in_device(slot, 8) and fake.allocated > before
    (block,) = rt._graphs[graph].blocks
    assert block <= slot < block + 4096
    assert fake.launches[-1]["captured"]
    rt.launch_graph(graph, kit.stream)
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n), x_host * F32(2.5))
    rt.destroy_graph(graph)
    assert fake.allocated == before, "destroy_graph freed the staging memory"
    assert not fake.graphs and not fake.execs
    assert not rt._graphs


def test_a_failed_capture_frees_its_staging_memory(kit: RuntimeKit) -> None:
    rt = kit.rt
    fake = _fake(rt)
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
    before = fake.allocated
    rt.begin_capture(kit.stream)
    kit.launch("scale", scale_args(x, y, n, 2.0))
    assert fake.allocated > before
    assert fake.cuStreamQuery(rt._streams[kit.stream].cu) == (900,)  # breaks it, as in CUDA
    with pytest.raises(RuntimeAPIError) as info:
        rt.end_capture(kit.stream)
    assert info.value.code == 901
    assert "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)" in info.value.message
    assert fake.allocated == before
    assert not rt._graphs
    kit.launch("scale", scale_args(x, y, n, 3.0))  # the stream works again
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 3.0, F32))


def test_a_replay_reads_its_own_staging_after_the_ring_moved_on(
    backend: str, make_kit: Callable[..., RuntimeKit]
) -> None:
    """The capture stream's ring reuses its slots, grows (freeing its first memory) and goes
    away with its stream: replays on another stream still read the captured args image."""
    rt = _open_small_ring(backend)
    try:
        d = make_kit(rt)
        n = 64
        x_host = np.arange(n, dtype=F32)
        x, y, z = d.upload(x_host), d.upload(np.zeros(n, F32)), d.upload(np.zeros(n, F32))
        capture_stream = d.new_stream()
        d.launch("scale", scale_args(x, z, n, 1.0), capture_stream)  # ring created
        rt.synchronize_stream(capture_stream, SYNC_MS)
        rt.begin_capture(capture_stream)
        captured = _slot(d.launch("scale", scale_args(x, y, n, 3.0), capture_stream))
        graph = rt.end_capture(capture_stream)
        slots = set()
        for i in range(200):  # 64 bytes each: the 4 KiB ring wraps around three times
            factor = float(F32(5 + i % 3))
            slots.add(_slot(d.launch("scale", scale_args(x, z, n, factor), capture_stream)))
        assert captured not in slots
        rt.launch_graph(graph, capture_stream)
        rt.synchronize_stream(capture_stream, SYNC_MS)
        np.testing.assert_array_equal(d.download(y, n), x_host * F32(3))
        np.testing.assert_array_equal(d.download(z, n), x_host * F32(5 + 199 % 3))
        tiling = struct.pack("<If", n, 4.0) + bytes(10_000)  # grows the ring
        d.launch("scale", HostArgs().ptr(x).ptr(z).placeholder(tiling, align=256), capture_stream)
        assert rt.staging_stats(capture_stream)["grows"] == 1
        rt.destroy_stream(capture_stream)  # its ring is freed
        rt.memset_async(y, 4 * n, 0, 4 * n, d.stream)
        rt.launch_graph(graph, d.stream)
        rt.launch_graph(graph, d.stream)
        rt.synchronize_stream(d.stream, SYNC_MS)
        np.testing.assert_array_equal(d.download(y, n), x_host * F32(3))
        rt.destroy_graph(graph)
    finally:
        rt.close()


def test_a_capturing_stream_refuses_before_the_driver_sees_it(kit: RuntimeKit) -> None:
    """Refused with 107000 and never passed on: the fake would have broken the capture (a
    query, a pageable copy) or made the event a capture dependency (a record)."""
    rt = kit.rt
    fake = _fake(rt)
    assert isinstance(rt, CudaRuntime)
    n = 16
    event = rt.create_event(ACL_EVENT_SYNC)
    buf = rt.malloc(4 * n)
    pageable = np.zeros(4 * n, np.uint8)
    pinned = kit.pinned(bytes(range(4 * n)))
    other = kit.new_stream()
    rt.begin_capture(other)
    kit.launch("noop", HostArgs(), other)
    other_graph = rt.end_capture(other)
    names = (
        "cuEventRecord",
        "cuStreamWaitEvent",
        "cuStreamQuery",
        "cuMemcpyHtoDAsync",
        "cuMemcpyDtoHAsync",
        "cuStreamBeginCapture",
        "cuGraphLaunch",
        "cuMemAlloc",
    )
    spies = {name: _spy(fake, name) for name in names}
    for name in names:  # the runtime keeps bound methods of its hot paths
        if hasattr(rt, f"_{name}"):
            setattr(rt, f"_{name}", getattr(fake, name))
    rt.begin_capture(kit.stream)
    assert len(spies["cuStreamBeginCapture"]) == 1
    addr = pageable.ctypes.data
    refused: list[Callable[[], object]] = [
        lambda: rt.record_event(event, kit.stream),
        lambda: rt.stream_wait_event(kit.stream, event),
        lambda: rt.synchronize_stream(kit.stream, SYNC_MS),
        lambda: rt.memcpy_async(buf, 4 * n, addr, 4 * n, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream),
        lambda: rt.memcpy_async(addr, 4 * n, buf, 4 * n, ACL_MEMCPY_DEVICE_TO_HOST, kit.stream),
        lambda: rt.begin_capture(kit.stream),
        lambda: rt.launch_graph(other_graph, kit.stream),
    ]
    for call in refused:
        with pytest.raises(InvalidParamError) as info:
            call()
        assert info.value.code == 107000
        assert "capturing" in info.value.message
    # a launch with placeholders whose args are not pinned: every replay would copy them
    args = scale_args(buf, buf, 4, 2.0)
    image = (ctypes.c_uint64 * 8).from_buffer_copy(args.to_bytes().ljust(64, b"\0"))
    table = kit.pinned(args.placeholder_table())
    with pytest.raises(InvalidParamError, match="pinned"):
        rt.launch_kernel_with_host_args(
            kit.fn("scale"), 1, kit.stream, None, ctypes.addressof(image), 64, table, 1
        )
    assert all(not spies[name] for name in names if name != "cuStreamBeginCapture")
    assert len(spies["cuStreamBeginCapture"]) == 1
    # a pinned copy is captured
    rt.memcpy_async(buf, 4 * n, pinned, 4 * n, ACL_MEMCPY_HOST_TO_DEVICE, kit.stream)
    assert len(spies["cuMemcpyHtoDAsync"]) == 1
    graph = rt.end_capture(kit.stream)  # still a valid capture: the driver saw nothing wrong
    with pytest.raises(InvalidParamError, match="not capturing") as info:
        rt.end_capture(kit.stream)
    assert info.value.code == 107000
    rt.destroy_graph(graph)
    rt.destroy_graph(other_graph)


def test_an_unknown_or_destroyed_graph_is_a_bad_handle(kit: RuntimeKit) -> None:
    rt = kit.rt
    assert isinstance(rt, CudaRuntime)
    rt.begin_capture(kit.stream)
    kit.launch("noop", HostArgs())
    graph = rt.end_capture(kit.stream)
    rt.destroy_graph(graph)
    launches = _spy(rt._d, "cuGraphLaunch") if isinstance(rt._d, FakeDriver) else []
    for call in (
        lambda: rt.launch_graph(graph, kit.stream),
        lambda: rt.destroy_graph(graph),
        lambda: rt.launch_graph(12345, kit.stream),
    ):
        with pytest.raises(InvalidHandleError, match="not a live graph"):
            call()
    assert launches == []
    rt.begin_capture(kit.stream)
    kit.launch("noop", HostArgs())
    again = rt.end_capture(kit.stream)
    assert again != graph, "handles are never reused"
    rt.destroy_graph(again)


def test_destroying_a_capturing_stream_or_closing_ends_the_capture(
    make_kit: Callable[..., RuntimeKit],
) -> None:
    fake = FakeDriver()
    rt = _open_fake(fake)
    d = make_kit(rt)
    n = 4
    x, y = d.upload(np.ones(n, F32)), d.upload(np.zeros(n, F32))
    before = fake.allocated
    stream = d.new_stream()
    rt.begin_capture(stream)
    d.launch("scale", scale_args(x, y, n, 2.0), stream)
    rt.destroy_stream(stream)
    assert fake.allocated == before and not fake.graphs
    rt.begin_capture(d.stream)
    d.launch("scale", scale_args(x, y, n, 2.0))
    graph = rt.end_capture(d.stream)
    rt.launch_graph(graph, d.stream)
    rt.begin_capture(d.stream)  # left open, with its staging
    d.launch("scale", scale_args(x, y, n, 3.0))
    ended = _spy(fake, "cuStreamEndCapture")
    destroyed = _spy(fake, "cuGraphExecDestroy")
    freed = _spy(fake, "cuMemFree")
    rt.close()
    assert rt.close_errors == ()
    assert len(ended) == 1 and len(destroyed) == 1
    assert len(freed) >= 2 + 2  # x, y, and the staging of the graph and of the open capture


def test_the_fake_models_capture_as_cuda_does() -> None:
    """The fake's own strictness (what the backend must never trigger)."""
    fake = FakeDriver()
    fake.cuDevicePrimaryCtxRetain(0)
    fake.cuCtxSetCurrent(fake.ctx)
    _, a = fake.cuStreamCreate(1)
    _, b = fake.cuStreamCreate(1)
    _, ev = fake.cuEventCreate(2)
    assert fake.cuStreamEndCapture(a) == (401, None)  # not capturing
    assert fake.cuStreamBeginCapture(a, 7) == (1,)
    assert fake.cuStreamBeginCapture(a, MODE_RELAXED) == (0,)
    assert fake.cuStreamBeginCapture(a, MODE_RELAXED) == (401,)  # already capturing
    assert fake.cuStreamIsCapturing(a) == (0, 1)
    assert fake.cuEventRecord(ev, a) == (0,)  # a capture dependency, not a graph node
    assert fake.cuEventQuery(ev) == (907,)
    assert fake.cuStreamWaitEvent(a, ev, 0) == (0,)  # the same capture: ordered already
    with pytest.raises(NotImplementedError):
        fake.cuStreamWaitEvent(b, ev, 0)  # would fork b into the capture
    assert fake.cuStreamDestroy(a) == (900,)
    err, empty = fake.cuStreamEndCapture(a)
    assert err == 0 and fake.graphs[empty] == []
    assert fake.cuGraphDestroy(empty) == (0,)
    # a wait on an event recorded outside the capture crosses its boundary: invalidated
    assert fake.cuEventRecord(ev, b) == (0,)
    assert fake.cuStreamBeginCapture(a, MODE_RELAXED) == (0,)
    assert fake.cuStreamWaitEvent(a, ev, 0) == (905,)
    assert fake.cuStreamIsCapturing(a) == (0, 2)
    assert fake.cuMemsetD8Async(0x10, 0, 0, a) == (901,)  # later ops: invalidated
    assert fake.cuStreamEndCapture(a) == (901, None)
    # a non-relaxed capture ends on its own thread only; other threads may not allocate
    assert fake.cuStreamBeginCapture(a, MODE_THREAD_LOCAL) == (0,)
    results: list[Any] = []
    worker = threading.Thread(
        target=lambda: (
            fake.cuCtxSetCurrent(fake.ctx),
            results.append(fake.cuMemAlloc(64)[0]),
            results.append(fake.cuStreamEndCapture(a)),
        )
    )
    worker.start()
    worker.join()
    assert results == [0, (908, None)]  # thread-local: other threads may allocate
    assert fake.cuMemAlloc(64) == (900, None)  # ... but not the capturing thread
    assert fake.cuStreamEndCapture(a) == (901, None)
    # a captured copy reads its host memory when a replay runs; a pageable one is refused
    dst = fake.cuMemAlloc(8)[1]
    src = fake.cuMemHostAlloc(8, 0)[1]
    pageable = ctypes.create_string_buffer(8)
    assert fake.cuStreamBeginCapture(a, MODE_RELAXED) == (0,)
    assert fake.cuMemcpyHtoDAsync(dst, ctypes.addressof(pageable), 8, a) == (900,)
    assert fake.cuStreamEndCapture(a) == (901, None)
    assert fake.cuStreamBeginCapture(a, MODE_RELAXED) == (0,)
    assert fake.cuMemcpyHtoDAsync(dst, src, 8, a) == (0,)
    err, graph = fake.cuStreamEndCapture(a)
    assert err == 0
    assert fake.cuGraphInstantiate(graph, 1) == (1, None)
    err, graph_exec = fake.cuGraphInstantiate(graph, 0)
    assert err == 0
    assert fake.cuGraphDestroy(graph) == (0,)  # the executable graph is a snapshot
    # the launches of one executable graph run one at a time, in launch order
    gate = SimpleNamespace(done=False)
    fake.streams[b].queue.append(["wait", gate])  # b is blocked
    _, c = fake.cuStreamCreate(1)
    ctypes.memmove(src, b"\x01" * 8, 8)
    assert fake.cuGraphLaunch(graph_exec, b) == (0,)
    ctypes.memmove(src, b"\x02" * 8, 8)  # read when the replay runs, not at the launch
    assert fake.cuGraphLaunch(graph_exec, c) == (0,)
    assert fake.cuStreamQuery(c) == (600,), "waits for the launch queued on b before it"
    gate.done = True
    assert fake.cuStreamQuery(c) == (0,) and fake.cuStreamQuery(b) == (0,)
    assert ctypes.string_at(dst, 8) == b"\x02" * 8
    assert fake.cuGraphExecDestroy(graph_exec) == (0,)
    assert fake.cuGraphLaunch(graph_exec, b) == (1,)  # INVALID_VALUE, as documented
    assert fake.cuGraphExecDestroy(graph_exec) == (1,)


# =============================================================================================
# the scheduler on the cuda backend
# =============================================================================================


def _runtime_options(backend: str) -> dict[str, Any]:
    if backend == "cuda":
        return {}
    return {"driver": FakeDriver(), "compiler": fake_compile}


def test_scheduler_round_trip(backend: str) -> None:
    async def main() -> None:
        options = _runtime_options(backend)
        async with aa.open_device(0, backend="cuda", runtime_options=options) as d:
            assert d.backend == "cuda"
            s = d.stream()
            n = 4096
            x_host = np.arange(n, dtype=F32)
            y_host = np.full(n, 0.5, F32)
            x, y, z = d.malloc(4 * n), d.malloc(4 * n), d.malloc(4 * n)
            await (await s.copy_to_device(x, x_host))
            await (await s.copy_to_device(y, y_host))
            args = aa.HostArgs().ptr(x).ptr(y).ptr(z).u32(n)
            await (await s.launch(d.function("vector_add"), 16, args))
            out = np.empty(n, F32)
            await (await s.copy_to_host(out, z))
            np.testing.assert_array_equal(out, x_host + y_host)
            # many launches with placeholders (staging reuse under the scheduler)
            scale = d.function("scale")
            tasks = []
            for i in range(300):
                tiling = struct.pack("<If", n, float(i % 5))
                args = aa.HostArgs().ptr(x).ptr(z).placeholder(tiling)
                tasks.append(await s.launch(scale, 8, args))
            for task in tasks:
                await task
            await (await s.copy_to_host(out, z))
            np.testing.assert_array_equal(out, x_host * F32(299 % 5))
            await s.aclose()

    asyncio.run(main())


def test_scheduler_capture_and_replay(backend: str) -> None:
    async def main() -> None:
        options = _runtime_options(backend)
        async with aa.open_device(0, backend="cuda", runtime_options=options) as d:
            s, other = d.stream(), d.stream()
            n = 1024
            x_host = np.arange(1, n + 1, dtype=F32)
            x, y, z = d.malloc(4 * n), d.malloc(4 * n), d.malloc(4 * n)
            await (await s.copy_to_device(x, x_host))
            await (await s.copy_to_device(y, np.zeros(n, F32)))
            async with s.capture() as cap:
                cap.launch(d.function("axpy"), 4, aa.HostArgs().ptr(x).ptr(y).f32(2.0).u32(n))
                tiling = struct.pack("<If", n, 0.5)
                cap.launch(d.function("scale"), 4, aa.HostArgs().ptr(y).ptr(z).placeholder(tiling))
                cap.memset(x, 0, 4)
            graph = cap.graph
            assert graph is not None and graph.operations == 3
            assert d.stats()["graphs"] == 1
            await s.run_graph(graph)
            await other.run_graph(graph)
            out = np.empty(n, F32)
            await (await s.copy_to_host(out, y))
            expected = 4 * x_host
            expected[0] = 2.0  # the second replay's axpy saw x[0] == 0
            np.testing.assert_array_equal(out, expected)
            await (await s.copy_to_host(out, z))
            np.testing.assert_array_equal(out, expected * F32(0.5))
            graph.close()
            for _ in range(100):
                if d.stats()["graphs"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert d.stats()["graphs"] == 0

    asyncio.run(main())


def test_scheduler_reports_a_device_fault(backend: str) -> None:
    async def main() -> None:
        options = _runtime_options(backend)
        async with aa.open_device(0, backend="cuda", runtime_options=options) as d:
            s = d.stream()
            noop = d.function("noop")  # after a fault CUDA refuses to look up functions too
            task = await s.launch(d.function("fault"), 1, aa.HostArgs().u32(0))
            with pytest.raises(DeviceFaultError) as info:
                await task
            assert info.value.code == 507015
            with pytest.raises(DeviceFaultError):  # refused at launch, or failed when awaited
                await (await s.launch(noop, 1))

    asyncio.run(main())


def test_scheduler_watchdog_and_forced_close_end_a_hung_kernel(backend: str) -> None:
    async def main() -> None:
        opener = aa.open_device(
            0, backend="cuda", task_timeout=0.3, runtime_options=_runtime_options(backend)
        )
        async with opener as d:
            s = d.stream()
            task = await s.launch(d.function("hang"), 1)
            with pytest.raises(TaskTimeoutError):
                await task
            await d.aclose(timeout=1.0)

    asyncio.run(main())


def test_every_driver_name_the_backend_and_the_fake_use_exists_in_cuda_bindings() -> None:
    """CI has no cuda-bindings, so the fake stands in for it: a name it offers that the real
    package lacks would hide a backend that cannot run on a GPU (``cuGraphInstantiateWithFlags``
    is not in cuda-bindings 13). Both are checked against the names read off the real one."""
    from pathlib import Path

    listing = Path(__file__).parent.parent / "doubles" / "cuda_bindings_names.txt"
    real = {line for line in listing.read_text().split("\n") if line and line[0] != "#"}
    source = "".join(path.read_text() for path in Path(cuda_mod.__file__).parent.glob("*.py"))
    used = set(re.findall(r"\b(?:_d|_driver|d|driver)\.((?:cu|CU)[A-Za-z0-9_]+)", source))
    used |= set(re.findall(r"\bnvrtc\.(nvrtc[A-Za-z0-9_]+)", source))
    assert len(used) > 40, sorted(used)  # the pattern still finds the backend's calls
    assert sorted(used - real) == []
    offered = {name for name in dir(FakeDriver) if name[:2] in ("cu", "CU")}
    assert "cuLaunchKernel" in offered
    assert sorted(offered - real) == []
