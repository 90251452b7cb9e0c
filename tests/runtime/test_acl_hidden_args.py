"""Hidden kernel arguments and kernel loading on the acl backend, against a C double that builds
args handles as the CANN runtime's source does (hicann/runtime@681ef76, cited in the double).

- the double: ``aclrtKernelArgsInitByUserMem`` + ``Append`` + ``Finalize`` lay out the leading
  sync slot per kernel (cross-core sync, MIX type, no ``g_sysFftsAddr`` of its own, an A2/A3
  chip) and the overflow slot for every kernel;
- the library: on the host-args path it asks the runtime through that sequence, once per
  function, and packs exactly those slots; without the probe's functions the load magic decides;
- loading bytes on the args-handle path (8.2/8.3, whose ``aclrtBinaryLoadFromData`` is for AI CPU
  kernels only) goes through a private temporary file that is gone after the load.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from doubles.acl_double import BUILTINS_MAGIC, DoubleControl, build_double, double_control
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._errors import InvalidParamError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD,
    ACL_RT_BINARY_MAGIC_ELF_AICORE,
    KernelType,
)
from aio_ascend._runtime.acl.loaders import type_json
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

F32 = np.float32
BUILTINS = BUILTINS_MAGIC + b"\nvector_add axpy scale matmul sleep fault hang noop mix_add"
FILL = 0x5E
UNWRITTEN = int.from_bytes(bytes([FILL]) * 8, "little")
MARKER = 0x1122334455667788


def _set_meta(ctl: DoubleControl, kernel: str, *, cross_core_sync: bool, own_ffts: bool) -> None:
    fn = ctl.lib.double_set_kernel_meta
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int], ctypes.c_int
    assert fn(kernel.encode(), int(cross_core_sync), int(own_ffts)) == 0


@pytest.fixture
def ctl() -> Iterator[DoubleControl]:
    control = double_control()
    yield control
    _set_meta(control, "mix_add", cross_core_sync=True, own_ffts=False)
    for kernel in ("vector_add", "noop"):
        _set_meta(control, kernel, cross_core_sync=False, own_ffts=False)
    control.set_chip_a2a3(True)
    control.clear_injections()


@pytest.fixture
def rt() -> Iterator[AclRuntime]:
    runtime = open_acl_runtime(0, library_path=build_double().library)
    yield runtime
    runtime.close()


def _function(rt: AclRuntime, name: str, kernel_type: KernelType | None = None) -> int:
    return rt.get_function(rt.load_binary(BUILTINS, kernel_type=kernel_type), name)


def _user_mem_args(
    rt: AclRuntime, func: int, params: list[int]
) -> tuple[list[int], int, ctypes.Array[ctypes.c_char]]:
    """Build ``func``'s args through the user-memory handle: the buffer's 8-byte slots after
    init + appends + finalize, its size and the buffer."""
    fn = rt._fn
    handle_size, size = ctypes.c_size_t(), ctypes.c_size_t()
    fn["aclrtKernelArgsGetHandleMemSize"](func, ctypes.byref(handle_size))
    fn["aclrtKernelArgsGetMemSize"](func, 8 * len(params), ctypes.byref(size))
    handle = ctypes.create_string_buffer(handle_size.value)
    buffer = ctypes.create_string_buffer(bytes([FILL]) * size.value, size.value)
    fn["aclrtKernelArgsInitByUserMem"](func, handle, buffer, size.value)
    assert set(buffer.raw) == {FILL}  # init writes nothing into the caller's buffer
    param = ctypes.c_void_p()
    for value in params:
        word = ctypes.c_uint64(value)
        fn["aclrtKernelArgsAppend"](handle, ctypes.byref(word), 8, ctypes.byref(param))
    fn["aclrtKernelArgsFinalize"](handle)
    raw = buffer.raw
    return (
        [int.from_bytes(raw[i : i + 8], "little") for i in range(0, size.value - 7, 8)],
        (size.value),
        buffer,
    )


# --- the double: the user-memory args handle as the runtime builds it --------------------------


@pytest.mark.runtime_source
def test_the_user_memory_buffer_size_is_the_runtimes_formula(rt: AclRuntime) -> None:
    """api_impl.cc:8547-8556: user args + 8 system slots + 8 bytes per user parameter."""
    for name, params in (("vector_add", 4), ("sleep", 1), ("noop", 0)):
        func = _function(rt, name)
        size = ctypes.c_size_t()
        rt._fn["aclrtKernelArgsGetMemSize"](func, 24, ctypes.byref(size))
        assert size.value == 24 + 8 * 8 + 8 * params, name


@pytest.mark.runtime_source
def test_a_cross_core_sync_kernel_gets_the_sync_slot_and_the_overflow_after_its_args(
    rt: AclRuntime, ctl: DoubleControl
) -> None:
    """program.cc:1105-1118 (the sync slot), api_impl.cc:8489-8510 (Finalize writes it into
    slot 0) and 8422-8458 (the overflow address in the next 8-aligned slot)."""
    slots, _, _ = _user_mem_args(rt, _function(rt, "mix_add"), [MARKER])
    assert slots[:3] == [ctl.ffts_addr(), MARKER, ctl.context_overflow(rt.context)]
    assert set(slots[3:]) == {UNWRITTEN}


@pytest.mark.runtime_source
def test_a_plain_kernel_gets_only_the_overflow_slot(rt: AclRuntime, ctl: DoubleControl) -> None:
    """kernel.hpp:274: every non-CPU kernel supports overflow; no sync slot without MIX or
    cross-core sync."""
    slots, _, _ = _user_mem_args(rt, _function(rt, "vector_add"), [MARKER])
    assert slots[:2] == [MARKER, ctl.context_overflow(rt.context)]
    assert set(slots[2:]) == {UNWRITTEN}


@pytest.mark.runtime_source
def test_a_kernel_with_its_own_ffts_symbol_gets_no_sync_slot(
    rt: AclRuntime, ctl: DoubleControl
) -> None:
    """program.cc:1111 (!IsMetaFlagSupprotFfts): an ELF with g_sysFftsAddr fills it itself."""
    _set_meta(ctl, "mix_add", cross_core_sync=True, own_ffts=True)
    slots, _, _ = _user_mem_args(rt, _function(rt, "mix_add", KernelType.MIX), [MARKER])
    assert slots[:2] == [MARKER, ctl.context_overflow(rt.context)]


@pytest.mark.runtime_source
def test_off_a2_a3_the_sync_slot_is_not_there(rt: AclRuntime, ctl: DoubleControl) -> None:
    """program.cc:1109-1110: only a chip with FFTS+ gives the slot."""
    ctl.set_chip_a2a3(False)
    slots, _, _ = _user_mem_args(rt, _function(rt, "mix_add", KernelType.MIX), [MARKER])
    assert slots[:2] == [MARKER, ctl.context_overflow(rt.context)]


@pytest.mark.runtime_source
def test_a_user_memory_handle_takes_no_more_params_than_the_kernel_declares(
    rt: AclRuntime,
) -> None:
    """api_impl.cc:8514-8518, 8715-8718: maxUserParamNum is the kernel's parameter count."""
    with pytest.raises(InvalidParamError, match="more than 0 parameters"):
        _user_mem_args(rt, _function(rt, "noop"), [MARKER])
    with pytest.raises(InvalidParamError, match="more than 1 parameters"):
        _user_mem_args(rt, _function(rt, "sleep"), [MARKER, MARKER])


# --- the library: the host-args path packs what the runtime would --------------------------------


def _expected(
    ctl: DoubleControl, context: int, *, sync: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return ((ctl.ffts_addr(),) if sync else ()), (ctl.context_overflow(context),)


@pytest.mark.runtime_source
@pytest.mark.parametrize(
    ("kernel_type", "cross_core_sync", "own_ffts", "sync"),
    [
        (None, False, False, False),
        ("vector", False, False, False),
        ("mix", False, False, True),
        ("aicore", False, False, True),  # the AI Core magic is MIX on A2/A3
        (None, True, False, True),  # cross-core sync whatever the magic
        ("mix", True, True, False),  # its own g_sysFftsAddr
    ],
)
@pytest.mark.anyio
async def test_host_args_carry_exactly_the_runtimes_hidden_slots(
    ctl: DoubleControl,
    anyio_backend: object,
    kernel_type: str | None,
    cross_core_sync: bool,
    own_ffts: bool,
    sync: bool,
) -> None:
    """vector_add with each combination of load magic and ELF metadata: the library's prefix and
    suffix are what the runtime's args handle holds, and the kernel (reading its parameters
    after the leading slot) computes the right result."""
    _set_meta(ctl, "vector_add", cross_core_sync=cross_core_sync, own_ffts=own_ffts)
    async with open_backend("acl") as dev:
        fn = dev.load_module(BUILTINS, kernel_type=kernel_type).function("vector_add")
        assert fn.info is not None
        prefix, suffix = _expected(ctl, dev.runtime.context, sync=sync)
        assert (fn.info.prefix, fn.info.suffix) == (prefix, suffix)
        n = 8
        s = dev.stream()
        x, y, z = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)
        await s.upload(x, np.arange(n, dtype=F32))
        await s.upload(y, np.ones(n, F32))
        await s.run(fn, 1, aa.HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
        np.testing.assert_array_equal(await s.download(z, F32), np.arange(n, dtype=F32) + 1)
        image = ctl.last_args(patched=False)
        lead = 8 * len(prefix)
        assert image[:lead] == b"".join(v.to_bytes(8, "little") for v in prefix)
        assert struct.unpack_from("<Q", image, lead + 32)[0] == suffix[0]


@pytest.mark.runtime_source
@pytest.mark.parametrize(
    ("kernel", "kernel_type", "cross_core_sync", "own_ffts"),
    [
        ("vector_add", None, False, False),
        ("vector_add", KernelType.MIX, False, False),
        ("vector_add", None, True, False),
        ("mix_add", KernelType.MIX, True, True),
        ("mix_add", None, True, False),
    ],
)
def test_the_host_args_image_is_the_runtimes_args_buffer(
    rt: AclRuntime,
    ctl: DoubleControl,
    kernel: str,
    kernel_type: KernelType | None,
    cross_core_sync: bool,
    own_ffts: bool,
) -> None:
    """Byte for byte (padding aside): the image the library packs for the host-args launch and
    the buffer the runtime's own args handle holds after Append of the same parameters and
    Finalize (api_impl.cc:8489-8556, 8700-8750)."""
    _set_meta(ctl, kernel, cross_core_sync=cross_core_sync, own_ffts=own_ffts)
    func = _function(rt, kernel, kernel_type)
    params = [0x1111, 0x2222, 0x3333]
    image = HostArgs().u64(params[0]).u64(params[1]).u64(params[2]).u32(16)
    packed = image.pack(rt.function_info(func)).image
    fn = rt._fn
    handle_size, size = ctypes.c_size_t(), ctypes.c_size_t()
    fn["aclrtKernelArgsGetHandleMemSize"](func, ctypes.byref(handle_size))
    fn["aclrtKernelArgsGetMemSize"](func, 32, ctypes.byref(size))
    handle = ctypes.create_string_buffer(handle_size.value)
    buffer = ctypes.create_string_buffer(size.value)
    fn["aclrtKernelArgsInitByUserMem"](func, handle, buffer, size.value)
    param = ctypes.c_void_p()
    for value, width in ((params[0], 8), (params[1], 8), (params[2], 8), (16, 4)):
        word = ctypes.create_string_buffer(value.to_bytes(width, "little"), width)
        fn["aclrtKernelArgsAppend"](handle, word, width, ctypes.byref(param))
    fn["aclrtKernelArgsFinalize"](handle)
    lead = len(packed) - 40  # the parameters take 32 bytes (28 and padding), the overflow 8
    assert lead in (0, 8)
    expected = buffer.raw[: lead + 40]
    mask = set(range(lead + 28, lead + 32))  # the padding after the u32
    assert len(packed) == len(expected)
    assert [b for i, b in enumerate(packed) if i not in mask] == [
        b for i, b in enumerate(expected) if i not in mask
    ]


@pytest.mark.runtime_source
def test_a_kernel_without_parameters_is_probed_without_a_marker(
    rt: AclRuntime, ctl: DoubleControl
) -> None:
    overflow = ctl.context_overflow(rt.context)
    info = rt.function_info(_function(rt, "noop"))
    assert (info.prefix, info.suffix) == ((), (overflow,))
    info = rt.function_info(_function(rt, "noop", KernelType.MIX))
    assert (info.prefix, info.suffix) == ((ctl.ffts_addr(),), (overflow,))


def test_the_runtime_is_asked_once_per_function(rt: AclRuntime, ctl: DoubleControl) -> None:
    func = _function(rt, "mix_add")
    mark = ctl.mark()
    first = rt.function_info(func)
    assert len(ctl.calls(mark, "aclrtKernelArgsInitByUserMem")) == 1
    mark = ctl.mark()
    assert rt.function_info(func) == first
    assert ctl.calls(mark) == []


def test_without_an_answer_the_load_magic_decides(rt: AclRuntime, ctl: DoubleControl) -> None:
    """A runtime whose probe fails (here: an injected error) gets the guess from the magic."""
    ctl.inject_error("aclrtKernelArgsInitByUserMem", 200006, "not here")
    info = rt.function_info(_function(rt, "mix_add"))  # no type: no hidden slots guessed
    assert (info.prefix, info.suffix) == ((), ())
    info = rt.function_info(_function(rt, "mix_add", KernelType.MIX))
    assert info.prefix == (ctl.ffts_addr(),)


# --- loading bytes on the args-handle path (8.2/8.3) ---------------------------------------------


def test_8_3_refuses_ai_core_kernels_from_data() -> None:
    """The 8.2/8.3 pages document aclrtBinaryLoadFromData for AI CPU kernels only."""
    runtime = open_acl_runtime(0, library_path=build_double("8.3").library)
    try:
        handle = ctypes.c_void_p()
        with pytest.raises(InvalidParamError, match="AI CPU kernels only"):
            runtime._fn["aclrtBinaryLoadFromData"](
                BUILTINS, len(BUILTINS), None, ctypes.byref(handle)
            )
    finally:
        runtime.close()


@pytest.mark.parametrize(
    ("kernel_type", "lazy", "loaded_as"),
    [(None, None, "cube"), ("vector", True, "vector"), ("mix", False, "mix")],
)
def test_8_3_loads_bytes_through_a_private_temporary_file(
    kernel_type: str | None, lazy: bool | None, loaded_as: str
) -> None:
    runtime = open_acl_runtime(0, library_path=build_double("8.3").library)
    ctl = double_control("8.3")
    try:
        mark = ctl.mark()
        kind = None if kernel_type is None else KernelType(kernel_type)
        binary = runtime.load_binary(BUILTINS, kernel_type=kind, lazy=lazy)
        assert [c.name for c in ctl.calls(mark) if "Load" in c.name] == ["aclrtBinaryLoadFromFile"]
        path, _, _ = ctl.last_load()
        assert os.path.basename(path) == "kernel.o"
        assert not os.path.exists(os.path.dirname(path))  # removed after the load
        expected = [] if lazy is None else [(ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD, int(lazy))]
        assert ctl.last_load_options() == expected  # the magic goes in the JSON
        assert ctl.binary_kernel_type(binary) == (loaded_as, bool(lazy))
        func = runtime.get_function(binary, "noop")
        assert runtime.function_info(func).kernel_type == kernel_type
    finally:
        runtime.close()


@pytest.mark.runtime_source
def test_the_json_names_a_magic_the_runtime_converts() -> None:
    """binary_loader.cc:45-59 (the names), 77-83 (intercoreSync)."""
    names = {"RT_DEV_BINARY_MAGIC_ELF", "RT_DEV_BINARY_MAGIC_ELF_AICUBE"}
    names.add("RT_DEV_BINARY_MAGIC_ELF_AIVEC")
    for kind in KernelType:
        meta: dict[str, Any] = type_json(kind)
        assert meta["magic"] in names
        assert ("intercoreSync" in meta) == (kind is KernelType.MIX)
    assert json.loads(json.dumps(type_json(KernelType.MIX)))["intercoreSync"] == 1
    assert KernelType.MIX.magic == ACL_RT_BINARY_MAGIC_ELF_AICORE


@pytest.mark.anyio
async def test_8_5_still_loads_bytes_from_data(ctl: DoubleControl, anyio_backend: object) -> None:
    ctl85 = double_control("8.5")
    async with open_backend("acl-8.5") as dev:
        mark = ctl85.mark()
        dev.load_module(BUILTINS, kernel_type="vector")
        assert [c.name for c in ctl85.calls(mark) if "Load" in c.name] == [
            "aclrtBinaryLoadFromData"
        ]


# --- an empty HostArgs on the args-handle path; the 8.0 overflow argument ------------------------


def _seam_launch(
    rt: AclRuntime, stream: int, func: int, args: HostArgs
) -> tuple[ctypes.Array[ctypes.c_char], ctypes.Array[ctypes.c_char]]:
    packed = args.pack(rt.function_info(func))
    image = ctypes.create_string_buffer(packed.image, len(packed.image))
    table = b"".join(struct.pack("<II", a, d) for a, d in packed.placeholders)
    tbuf = ctypes.create_string_buffer(table, max(len(table), 1))
    rt.launch_kernel_with_host_args(
        func, 1, stream, None, ctypes.addressof(image), len(packed.image),
        ctypes.addressof(tbuf) if table else 0, len(packed.placeholders),
    )  # fmt: skip
    return image, tbuf


@pytest.mark.runtime_source
def test_an_empty_host_args_appends_nothing_on_the_args_handle_path() -> None:
    """api_impl.cc:8422-8458: Finalize puts the overflow slot right after the appended
    parameters, so a kernel without parameters finds it at offset 0 only if nothing was
    appended (8.3's thread handle would take the 8 zero bytes of HostArgs() as a parameter)."""
    runtime = open_acl_runtime(0, library_path=build_double("8.3").library)
    ctl = double_control("8.3")
    try:
        stream = runtime.create_stream()
        func = _function(runtime, "noop")
        assert runtime.function_info(func).params == ()  # the probe's marker was refused
        mark = ctl.mark()
        _seam_launch(runtime, stream, func, HostArgs())
        assert ctl.calls(mark, "aclrtKernelArgsAppend") == []
        image = ctl.last_args(patched=False)
        assert image == ctl.context_overflow(runtime.context).to_bytes(8, "little")
        runtime.synchronize_stream(stream, 5000)
        with pytest.raises(ValueError, match="declares 0 parameter"):
            HostArgs().u32(1).pack(runtime.function_info(func))  # refused before the runtime
        vector_add = _function(runtime, "vector_add")
        assert runtime.function_info(vector_add).params is None  # it takes parameters
    finally:
        runtime.close()


@pytest.mark.anyio
async def test_an_empty_host_args_launch_runs_on_8_3(anyio_backend: object) -> None:
    async with open_backend("acl-8.3") as dev:
        await dev.stream().run(dev.function("noop"), 1)
        await dev.stream().run(dev.function("noop"), 1, HostArgs())


def test_8_0_args_end_with_an_overflow_argument_before_the_placeholder_data() -> None:
    """The asc-devkit launchers pass an overflow address after the parameters; 8.0 cannot read
    the context's (aclrtCtxGetFloatOverflowAddr is 8.5+), so a device buffer of the runtime's
    own is passed, after the parameters and before any placeholder data."""
    runtime = open_acl_runtime(0, library_path=build_double("8.0").library)
    ctl = double_control("8.0")
    try:
        devices = ctl.live_counts()
        stream = runtime.create_stream()
        binary = runtime.load_binary(None)
        scale, noop = runtime.get_function(binary, "scale"), runtime.get_function(binary, "noop")
        info = runtime.function_info(scale)
        (overflow,) = info.suffix
        assert info.prefix == () and runtime.function_info(noop).suffix == (overflow,)
        assert overflow in runtime._device_memory
        n = 4
        host = runtime.malloc_host(64)
        x, y = runtime.malloc(4 * n), runtime.malloc(4 * n)
        ctypes.memmove(host, np.arange(n, dtype=F32).tobytes(), 4 * n)
        runtime.memcpy_async(x, 4 * n, host, 4 * n, 1, stream)
        args = HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, 2.0))
        _seam_launch(runtime, stream, scale, args)
        dev_args = ctl.last_dev_args()
        runtime.memcpy_async(host, 40, dev_args, 40, 2, stream)
        runtime.synchronize_stream(stream, 5000)
        image = ctypes.string_at(host, 40)
        slot, tail = struct.unpack_from("<QQ", image, 16)
        assert tail == overflow and slot == dev_args + 32
        assert struct.unpack_from("<If", image, 32) == (n, 2.0)
        runtime.memcpy_async(host, 4 * n, y, 4 * n, 2, stream)
        runtime.synchronize_stream(stream, 5000)
        result = np.frombuffer(ctypes.string_at(host, 4 * n), dtype=F32)
        np.testing.assert_array_equal(result, 2.0 * np.arange(n, dtype=F32))
    finally:
        runtime.close()
    assert ctl.live_counts()["device_allocs"] == devices["device_allocs"]
