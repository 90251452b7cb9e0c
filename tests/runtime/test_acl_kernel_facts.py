"""What kernels need on real Ascend, tested on the C double's personas (docs/cann-support.md):

- load options (§5): ``kernel_type``/``lazy`` reaching ``aclrtBinaryLoadOptions``; the magic
  refused for files, a file's type read from the JSON beside it;
- hidden MIX arguments (§4): supplied on the host-args path by the library, by
  ``aclrtKernelArgsFinalize`` on the args-handle path; the double's ``mix_add`` kernel refuses to
  run without them;
- declared parameters (9.1+): a ``HostArgs`` that does not match is refused before the runtime;
- the loop thread's current context (§6): another library's context survives every short call.
"""

from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from doubles.acl_double import BUILTINS_MAGIC, build_double, double_control
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._runtime.abi import (
    ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD,
    ACL_RT_BINARY_LOAD_OPT_MAGIC,
    ACL_RT_BINARY_MAGIC_ELF_AICORE,
    ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE,
)

pytestmark = pytest.mark.anyio

F32 = np.float32
BUILTINS = BUILTINS_MAGIC + b"\nvector_add axpy scale matmul sleep fault hang noop mix_add"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _persona(backend: str) -> str:
    return backend.partition("-")[2] or "9.1"


async def _mix_add(dev: aa.Device, fn: aa.Function, n: int = 16) -> np.ndarray[Any, Any]:
    s = dev.stream()
    x, y, z = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)
    await s.upload(x, np.arange(n, dtype=F32))
    await s.upload(y, np.full(n, 10, F32))
    await s.run(fn, 2, aa.HostArgs().ptr(x).ptr(y).ptr(z).u32(n))
    result: np.ndarray[Any, Any] = await s.download(z, F32)
    return result


# --- load options -------------------------------------------------------------------------------


async def test_load_options_reach_aclrt_binary_load_options() -> None:
    ctl = double_control()
    async with open_backend("acl") as dev:
        mark = ctl.mark()
        module = dev.load_module(BUILTINS, kernel_type="vector", lazy=True)
        (load,) = ctl.calls(mark, "aclrtBinaryLoadFromData")
        assert load.args[2]  # options: not NULL
        assert ctl.last_load_options() == [
            (ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD, 1),
            (ACL_RT_BINARY_LOAD_OPT_MAGIC, ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE),
        ]
        assert ctl.binary_kernel_type(module.handle) == ("vector", True)
        assert module.kernel_type == "vector"
        mix = dev.load_module(BUILTINS, kernel_type="mix")
        assert ctl.last_load_options() == [
            (ACL_RT_BINARY_LOAD_OPT_MAGIC, ACL_RT_BINARY_MAGIC_ELF_AICORE)
        ]
        assert ctl.binary_kernel_type(mix.handle) == ("mix", False)  # ELF_AICORE on A2/A3
        plain = dev.load_module(BUILTINS)
        assert ctl.last_load() == ("", True, 0)  # no options: NULL
        # without a magic the runtime assumes CUBE on A2/A3 (cann-support.md §5.3)
        assert ctl.binary_kernel_type(plain.handle) == ("cube", False)


async def test_a_kernel_type_for_a_file_is_refused_before_the_runtime(tmp_path: Path) -> None:
    ctl = double_control()
    path = tmp_path / "kernels.o"
    path.write_bytes(BUILTINS)
    async with open_backend("acl") as dev:
        mark = ctl.mark()
        with pytest.raises(ValueError, match="refuses the magic option"):
            dev.load_module(path, kernel_type="vector")
        assert not ctl.calls(mark, "aclrtBinaryLoadFromFile")
        module = dev.load_module(path, lazy=False)
        assert ctl.last_load_options() == [(ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD, 0)]
        assert ctl.binary_kernel_type(module.handle) == ("cube", False)


def test_the_double_refuses_the_magic_for_a_file_like_cann(tmp_path: Path) -> None:
    from aio_ascend._runtime.acl import ffi
    from aio_ascend._runtime.acl.kernels import load_options
    from aio_ascend._runtime.acl.runtime import open_acl_runtime

    path = tmp_path / "kernels.o"
    path.write_bytes(BUILTINS)
    runtime = open_acl_runtime(0, library_path=build_double().library)
    try:
        options = load_options(aa._runtime.abi.KernelType.VECTOR, None, from_file=False)
        handle = ctypes.c_void_p()
        with pytest.raises(aa.RuntimeAPIError, match="does not support in load from file"):
            runtime._fn["aclrtBinaryLoadFromFile"](
                str(path).encode(), ctypes.byref(options), ctypes.byref(handle)
            )
        assert isinstance(options, ffi.AclrtBinaryLoadOptions)
    finally:
        runtime.close()


@pytest.mark.parametrize(
    ("kernel_type", "lazy", "error"),
    [("warp", None, ValueError), (3, None, TypeError), (None, "yes", TypeError)],
)
@pytest.mark.backends("sim", "acl", "cuda-fake")
async def test_bad_load_options_are_refused_on_every_backend(
    backend: str, kernel_type: Any, lazy: Any, error: type[Exception]
) -> None:
    async with open_backend(backend) as dev:
        source = aa.sim.KernelLibrary() if backend == "sim" else BUILTINS
        if backend == "cuda-fake":
            source = None
        with pytest.raises(error):
            dev.load_module(source, kernel_type=kernel_type, lazy=lazy)


@pytest.mark.backends("sim", "cuda-fake")
async def test_the_other_backends_accept_and_ignore_load_options(backend: str) -> None:
    async with open_backend(backend) as dev:
        source = aa.sim.KernelLibrary() if backend == "sim" else None
        module = dev.load_module(source, kernel_type="mix", lazy=True)
        assert module.kernel_type == "mix"


# --- hidden MIX arguments -----------------------------------------------------------------------


@pytest.mark.backends("acl", "acl-8.5", "acl-8.3")
async def test_mix_kernels_get_their_hidden_arguments_on_every_path(backend: str) -> None:
    ctl = double_control(_persona(backend))
    async with open_backend(backend) as dev:
        fn = dev.load_module(BUILTINS, kernel_type="mix").function("mix_add")
        result = await _mix_add(dev, fn)
        np.testing.assert_array_equal(result, np.arange(16, dtype=F32) + 10)
        image = ctl.last_args(patched=False)
        context = dev.runtime.context
        assert struct.unpack_from("<Q", image, 0)[0] == ctl.ffts_addr()
        assert struct.unpack_from("<Q", image, 40)[0] == ctl.context_overflow(context)
        path = "args_handle" if backend == "acl-8.3" else "host_args"
        assert ctl.last_launch_path() == path
        if path == "host_args":  # supplied by the library, not the runtime
            assert fn.info is not None
            assert fn.info.prefix == (ctl.ffts_addr(),)
            assert fn.info.suffix == (ctl.context_overflow(context),)


@pytest.mark.runtime_source
@pytest.mark.backends("acl", "acl-8.5", "acl-8.3")
async def test_a_cross_core_sync_kernel_gets_its_sync_slot_whatever_the_load_magic(
    backend: str,
) -> None:
    """The runtime gives the sync slot per kernel, from its ELF metadata (crossCoreSync:
    program.cc:1105-1118), not from the load magic: mix_add loaded without a type (the chip's
    default, CUBE) still needs it, and the host-args path asks the runtime for it."""
    ctl = double_control(_persona(backend))
    async with open_backend(backend) as dev:
        fn = dev.load_module(BUILTINS).function("mix_add")  # no type: the chip's default
        result = await _mix_add(dev, fn)
        np.testing.assert_array_equal(result, np.arange(16, dtype=F32) + 10)
        image = ctl.last_args(patched=False)
        assert struct.unpack_from("<Q", image, 0)[0] == ctl.ffts_addr()
        assert struct.unpack_from("<Q", image, 40)[0] == ctl.context_overflow(dev.runtime.context)


async def test_a_mix_kernel_file_is_typed_by_its_json(tmp_path: Path) -> None:
    path = tmp_path / "mix_kernels.o"
    path.write_bytes(BUILTINS)
    (tmp_path / "mix_kernels.json").write_text(
        json.dumps({"magic": "FFTS_BINARY_MAGIC_ELF_MIX_AIC"})
    )
    async with open_backend("acl") as dev:
        module = dev.load_module(path)
        fn = module.function("mix_add")
        assert fn.info is not None
        assert fn.info.kernel_type == "mix"
        result = await _mix_add(dev, fn)
        np.testing.assert_array_equal(result, np.arange(16, dtype=F32) + 10)


async def test_no_sync_address_off_a2_a3() -> None:
    ctl = double_control()
    ctl.set_chip_a2a3(False)
    try:
        async with open_backend("acl") as dev:
            fn = dev.load_module(BUILTINS, kernel_type="mix").function("mix_add")
            assert fn.info is not None
            assert fn.info.prefix == ()  # aclrtGetHardwareSyncAddr: 207000 off A2/A3
            assert fn.info.suffix == (ctl.context_overflow(dev.runtime.context),)
    finally:
        ctl.set_chip_a2a3(True)


# --- declared parameters ------------------------------------------------------------------------


async def test_args_that_do_not_match_the_kernel_are_refused_before_the_runtime() -> None:
    ctl = double_control()
    async with open_backend("acl") as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        fn = dev.function("vector_add")
        assert fn.info is not None
        assert fn.info.params == ((0, 8), (8, 8), (16, 8), (24, 4))
        mark = ctl.mark()
        with pytest.raises(ValueError, match=r"kernel 'vector_add'.*3 argument.*declares 4"):
            await s.launch(fn, 1, aa.HostArgs().ptr(buf).ptr(buf).ptr(buf))
        with pytest.raises(ValueError, match=r"argument 3 is 8 byte.*parameter 3 is 4 byte"):
            await s.launch(fn, 1, aa.HostArgs().ptr(buf).ptr(buf).ptr(buf).u64(4))
        assert not ctl.calls(mark, "aclrtLaunchKernelWithHostArgs")
        await s.run(fn, 1, aa.HostArgs().ptr(buf).ptr(buf).ptr(buf).u32(16))  # matches


async def test_without_parameter_info_nothing_is_checked() -> None:
    async with open_backend("acl-8.5") as dev:
        info = dev.function("vector_add").info
        assert info is not None and info.params is None  # 8.5: no aclrtFunctionGetParamInfo
        await dev.stream().launch(dev.function("noop"), 1, aa.HostArgs().u32(1).u32(2).u64(3))


# --- the loop thread's current context ----------------------------------------------------------


class OtherLibrary:
    """Another library on the loop thread (torch_npu): its own context and stream, made with
    the same libascendcl.so."""

    def __init__(self, persona: str) -> None:
        lib = ctypes.CDLL(str(build_double(persona).library))
        self.lib = lib
        assert lib.aclrtSetDevice(0) == 0  # as torch_npu does (a reference on the device)
        self.context = ctypes.c_void_p()
        assert lib.aclrtCreateContext(ctypes.byref(self.context), 0) == 0  # makes it current
        self.stream = ctypes.c_void_p()
        assert lib.aclrtCreateStream(ctypes.byref(self.stream)) == 0
        lib.aclrtSynchronizeStreamWithTimeout.argtypes = [ctypes.c_void_p, ctypes.c_int32]

    def works(self) -> int:
        """What its next call on its stream returns (0; 107003 if our context were current)."""
        rc: int = self.lib.aclrtSynchronizeStreamWithTimeout(self.stream, 1000)
        return rc

    def close(self) -> None:
        self.lib.aclrtDestroyStream(self.stream)
        self.lib.aclrtDestroyContext(self.context)
        self.lib.aclrtResetDevice(0)


@pytest.mark.backends("acl", "acl-8.3")
async def test_another_librarys_context_survives_every_short_call(backend: str) -> None:
    ctl = double_control(_persona(backend))
    other = OtherLibrary(_persona(backend))
    try:
        checks: list[str] = []

        def check(what: str) -> None:
            assert ctl.current_context() == other.context.value, f"after {what}"
            assert other.works() == 0, f"after {what}"
            checks.append(what)

        async with open_backend(backend) as dev:
            check("open_device")
            buf = dev.malloc(64)
            check("malloc")
            s = dev.stream()
            check("stream")
            ev = await s.record_event()
            check("record_event")
            await ev
            ev.query()
            check("event query")
            fn = dev.function("vector_add")
            check("load_module and function")
            await s.run(fn, 1, aa.HostArgs().ptr(buf).ptr(buf).ptr(buf).u32(16))
            check("run")
            _ = dev.info
            check("info")
            buf.free()
            check("free")
            await s.aclose()
            check("stream close")
        check("aclose")
        assert len(checks) == 11
    finally:
        other.close()


async def test_without_the_restore_the_other_library_would_fail() -> None:
    # the double models what the restore prevents: a stream used under another context, 107003
    other = OtherLibrary("9.1")
    try:
        async with open_backend("acl") as dev:
            # leave ours current, as the library did before the restore
            dev.runtime.set_current_context()
            assert other.works() == 107003
            dev.runtime.set_current_context(other.context.value)
            assert other.works() == 0
    finally:
        other.close()


async def test_another_sim_runtimes_context_survives_on_the_sim() -> None:
    from aio_ascend._runtime import open_runtime

    other = open_runtime("sim", 1)  # binds its context to this thread
    try:
        async with open_backend("sim") as dev:
            assert other.get_current_context() == other.context
            buf = dev.malloc(64)
            await dev.stream().memset(buf, 1)
            _ = dev.info
            assert other.get_current_context() == other.context
            other.malloc(64)  # still usable on this thread: its context is current
    finally:
        other.close()


# --- fault attribution through the runtime's exception info -------------------------------------


@pytest.mark.runtime_source
@pytest.mark.backends("acl", "acl-8.3")
async def test_the_faulting_task_gets_the_primary_error(backend: str) -> None:
    # One batch: a sleep, three noops, the fault, two noops. The batch's completion event fails;
    # only the exception report can tell that the tasks before the fault finished and which task
    # faulted (without it the first task of the batch would get the fault). The sleep (200 ms,
    # over 100x what submitting the batch takes) keeps the fault from running before the whole
    # batch is submitted (a refused submission is attributed without the report).
    async with open_backend(backend) as dev:
        s = dev.stream()
        noop, fault = dev.function("noop"), dev.function("fault")
        before = [await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(200_000))]
        before += [await s.launch(noop, 1) for _ in range(3)]
        bad = await s.launch(fault, 1, aa.HostArgs().u32(507015))
        after = [await s.launch(noop, 1) for _ in range(2)]
        with pytest.raises(aa.DeviceFaultError) as info:
            await bad
        primary = info.value
        assert primary.code == 507015
        assert primary.__cause__ is None
        # the report names the failed task, never which finished: their batch never completed
        for task in before + after:
            with pytest.raises(aa.DeviceFaultError) as later:
                await task
            assert later.value.__cause__ is primary
        site = dev.runtime.fault_site()
        assert site is not None
        assert site[1] == 4  # the fifth task submitted to the stream
        with pytest.raises(aa.DeviceFaultError):
            await dev.synchronize()


def test_exception_reports_name_stream_and_task() -> None:
    from aio_ascend._runtime.acl.runtime import open_acl_runtime

    runtime = open_acl_runtime(0, library_path=build_double().library)
    try:
        stream = runtime.create_stream()
        binary = runtime.load_binary(BUILTINS)
        image = runtime.malloc_host(8)
        ctypes.memmove(image, struct.pack("<I", 507035), 4)
        for name in ("noop", "fault"):
            runtime.launch_kernel_with_host_args(
                runtime.get_function(binary, name), 1, stream, None, image, 8, 0, 0
            )
        with pytest.raises(aa.DeviceFaultError):
            runtime.synchronize_stream(stream, 10_000)
        assert runtime.fault_site() == (stream, 1)
        other = runtime.create_stream()
        assert runtime.fault_site() == (stream, 1)  # another stream's id is not the site
        assert other != stream
    finally:
        runtime.close()


def test_the_last_error_is_the_threads_last_code() -> None:
    """``aclrtPeekAtLastError`` keeps the calling thread's last code; ``aclrtGetLastError``
    clears it (both at thread level), as the library binds them."""
    from aio_ascend._runtime.abi import ACL_RT_THREAD_LEVEL
    from aio_ascend._runtime.acl.runtime import open_acl_runtime

    runtime = open_acl_runtime(0, library_path=build_double().library)
    functions = runtime._library.functions

    def last_error(*, clear: bool = False) -> int:
        code: int = functions["aclrtGetLastError" if clear else "aclrtPeekAtLastError"](
            ACL_RT_THREAD_LEVEL
        )
        return code

    try:
        last_error(clear=True)
        assert last_error() == 0
        with pytest.raises(aa.RuntimeAPIError):
            runtime.free(0x1234)
        assert last_error() == 107000  # peek: kept
        assert last_error(clear=True) == 107000
        assert last_error() == 0
    finally:
        runtime.close()
