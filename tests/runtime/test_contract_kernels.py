"""The ``Runtime`` contract for kernels, on every backend of ``backends.RUNTIME_FACTORIES``:
launches run in stream order with their args (placeholders patched and their data read),
block counts and launch configs; bad launch inputs are refused without queuing anything; and,
on the sim, args are read when the kernel runs (pinned) or during the call (pageable)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from backends import ALL_BACKENDS
from helpers import F32, SYNC_MS, axpy_args, in_thread, scale_args

from aio_ascend._errors import (
    BackendUnavailableError,
    InvalidHandleError,
    InvalidParamError,
    MemoryAllocationError,
    RuntimeAPIError,
)
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._launch_config import LaunchConfig
from aio_ascend._runtime.hostmem import host_view

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


def test_many_axpy_launches_give_the_sequential_result(kit: RuntimeKit) -> None:
    n = 257
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal(n).astype(F32)
    y_host = rng.standard_normal(n).astype(F32)
    x, y = kit.upload(x_host), kit.upload(y_host)
    coefficients = [float(F32(v)) for v in rng.uniform(-2, 2, size=64)]
    expected = y_host.copy()
    for a in coefficients:
        kit.launch("axpy", axpy_args(x, y, a, n))
        expected += F32(a) * x_host
    kit.rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n), expected)


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
    kit: RuntimeKit, order: list[str]
) -> None:
    n = 64
    x_host = np.arange(n, dtype=F32)
    y_host = np.full(n, 1.0, dtype=F32)
    x, y = kit.upload(x_host), kit.upload(y_host)
    for step in order:
        if step == "axpy":
            kit.launch("axpy", axpy_args(x, y, 2.0, n))
        else:
            kit.launch("scale", scale_args(y, y, n, 3.0))
    expected = _apply(order, x_host, y_host)
    others = [o for o in (["axpy", "scale", "axpy"], ["scale", "axpy", "axpy"]) if o != order]
    assert all(not np.array_equal(expected, _apply(o, x_host, y_host)) for o in others)
    np.testing.assert_array_equal(kit.download(y, n), expected)


def test_placeholder_addresses_are_patched_into_the_callers_buffer(kit: RuntimeKit) -> None:
    if getattr(kit.rt, "launch_path", "host_args") in ("args_handle", "device_args"):
        pytest.skip("on the args-handle and device-args paths the caller's buffer is not patched")
    n = 16
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
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
    addr, size, table, count = kit.pack(args)
    kit.rt.launch_kernel_with_host_args(
        kit.fn("scale"), 1, kit.stream, None, addr, size, table, count
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
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))


def test_scale_reads_its_tiling_through_the_placeholder(kit: RuntimeKit) -> None:
    n = 100
    x_host = np.linspace(-1, 1, n, dtype=F32)
    x, y = kit.upload(x_host), kit.upload(np.zeros(n, F32))
    kit.launch("scale", scale_args(x, y, n, -1.5))
    np.testing.assert_array_equal(kit.download(y, n), x_host * F32(-1.5))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (7, 5, 3), (32, 16, 24)])
def test_matmul_through_placeholder(kit: RuntimeKit, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 100 + n)
    a_host = rng.standard_normal((m, k)).astype(F32)
    b_host = rng.standard_normal((k, n)).astype(F32)
    a, b = kit.upload(a_host), kit.upload(b_host)
    c = kit.rt.malloc(m * n * 4)
    args = HostArgs().ptr(a).ptr(b).ptr(c).placeholder(struct.pack("<III", m, n, k))
    kit.launch("matmul", args, blocks=4)
    result = kit.download(c, m * n).reshape(m, n)
    np.testing.assert_allclose(result, a_host @ b_host, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 3, 8, 1000, 65535])
def test_vector_add_split_over_blocks(kit: RuntimeKit, blocks: int) -> None:
    n = 1001
    x_host = np.arange(n, dtype=F32)
    y_host = np.arange(n, dtype=F32)[::-1].copy() * F32(0.5)
    x, y = kit.upload(x_host), kit.upload(y_host)
    z = kit.upload(np.full(n, -7.0, F32))
    kit.launch("vector_add", HostArgs().ptr(x).ptr(y).ptr(z).u32(n), blocks=blocks)
    np.testing.assert_array_equal(kit.download(z, n), x_host + y_host)


def test_launch_accepts_a_launch_config(kit: RuntimeKit) -> None:
    n = 8
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    cfg = LaunchConfig(schedule_mode="batch", timeout_s=5)
    if getattr(kit.rt, "launch_path", None) == "device_args":
        # aclrtLaunchKernel takes no config (aclrtLaunchKernelV2 is 8.5+): refused, not ignored
        with pytest.raises(BackendUnavailableError, match="aclrtLaunchKernelV2"):
            kit.launch("axpy", axpy_args(x, y, 1.0, n), cfg=cfg)
        kit.launch("axpy", axpy_args(x, y, 1.0, n), cfg=LaunchConfig())  # no attributes: none
        np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))
        return
    kit.launch("axpy", axpy_args(x, y, 1.0, n), cfg=cfg)
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 2.0, F32))


def test_unknown_kernel_name_is_symbol_not_found(kit: RuntimeKit) -> None:
    with pytest.raises(RuntimeAPIError) as info:
        kit.rt.get_function(kit.binary, "no_such_kernel")
    assert info.value.code == 107042


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        (b"", ValueError, "data is empty"),
        (bytearray(), ValueError, "data is empty"),
        ("", ValueError, "path is empty"),
        ("/tmp/kernels\0.o", ValueError, "holds a NUL"),
        ("/no/such/dir/kernels.o", FileNotFoundError, "no kernel binary at"),
    ],
    ids=["empty bytes", "empty bytearray", "empty path", "NUL in the path", "missing file"],
)
def test_a_binary_source_no_backend_could_load_is_refused_alike(
    kit: RuntimeKit, source: object, error: type[Exception], match: str
) -> None:
    # Before, the sim answered the runtime's InvalidParamError where acl raised these
    with pytest.raises(error, match=match):
        kit.rt.load_binary(source)


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
def test_bad_launch_inputs_are_rejected(kit: RuntimeKit, backend: str, case: str) -> None:
    rt = kit.rt
    shared_overrides, error, field = BAD_LAUNCHES[case]
    overrides = dict(shared_overrides)
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.ones(n, F32))
    args = scale_args(x, y, n, 2.0)  # 40 bytes: slot at 16, data at 32
    addr, size, table, count = kit.pack(args)
    assert (size, args.placeholders) == (40, [(16, 32)])
    before = bytes(host_view(addr, size))
    if "table" in overrides:
        entries = overrides.pop("table")
        table = kit.pinned(b"".join(struct.pack("<II", a, d) for a, d in entries))
        count = len(entries)
    call: dict[str, Any] = {
        "func": kit.fn("scale"),
        "num_blocks": 1,
        "stream": kit.stream,
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
    rt.synchronize_stream(kit.stream, SYNC_MS)
    np.testing.assert_array_equal(kit.download(y, n), np.ones(n, F32))


@pytest.mark.sim_only
def test_pinned_args_are_read_when_the_kernel_executes(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    n = 8
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
    rt.pause()
    try:
        addr = kit.launch("axpy", axpy_args(x, y, 1.0, n))
        host_view(addr, 24)[16:20] = struct.pack("<f", 7.0)  # change `a` after the launch
    finally:
        rt.resume()
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 7.0, F32))


@pytest.mark.sim_only
def test_pageable_args_are_snapshotted_during_the_call(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    n = 8
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
    args = scale_args(x, y, n, 3.0)
    buffer = bytearray(args.to_bytes())
    raw = np.frombuffer(buffer, dtype=np.uint8)
    table = np.frombuffer(bytearray(args.placeholder_table()), dtype=np.uint8)
    rt.pause()
    try:
        rt.launch_kernel_with_host_args(
            kit.fn("scale"),
            1,
            kit.stream,
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
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 3.0, F32))


@pytest.mark.sim_only
def test_inject_launch_error_refuses_one_launch(kit: RuntimeKit) -> None:
    rt: Any = kit.rt
    n = 4
    x, y = kit.upload(np.ones(n, F32)), kit.upload(np.zeros(n, F32))
    rt.inject_launch_error(207001, after=2)
    launched = rt.counters["launches"]
    kit.launch("axpy", axpy_args(x, y, 1.0, n))
    kit.launch("axpy", axpy_args(x, y, 1.0, n))
    with pytest.raises(MemoryAllocationError) as info:
        kit.launch("axpy", axpy_args(x, y, 1.0, n))
    assert info.value.code == 207001
    kit.launch("axpy", axpy_args(x, y, 1.0, n))
    assert rt.counters["launches"] == launched + 3
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 3.0, F32))
    assert rt._fault is None


@pytest.mark.sim_only
def test_launch_blocks_while_the_stream_queue_is_full(make_kit: Callable[..., RuntimeKit]) -> None:
    from aio_ascend.sim import open_sim_runtime

    rt = open_sim_runtime(0, max_queue_depth=4)
    try:
        d = make_kit(rt)
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
