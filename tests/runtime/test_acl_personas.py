"""The acl backend across CANN releases: the C double's personas (``docs/cann-support.md`` §9).

Each persona exports exactly its release's symbols; the backend binds per symbol, reads the
release, chooses the launch path by the symbols present, and refuses a release without a usable
path loudly, naming the release, the missing symbols and the paths tried; ``backend="auto"``
then raises instead of simulating. The args-handle path (8.3) is checked call by call.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from doubles.acl_double import (
    PERSONA_SYMBOLS,
    PERSONAS,
    DoubleControl,
    build_double,
    build_unusable_double,
    double_control,
    open_double_runtime,
)

import aio_ascend as aa
from aio_ascend._errors import BackendUnavailableError, InvalidParamError
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime import choose_backend, open_runtime
from aio_ascend._runtime.acl import library as acl_library
from aio_ascend._runtime.acl import runtime as acl_runtime
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

F32 = np.float32
SYNC_MS = 10_000
ALL_SYMBOLS = frozenset().union(*PERSONA_SYMBOLS.values())

if TYPE_CHECKING:
    from conftest import RuntimeKit


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CANN install anywhere but where a test puts one."""
    for var in (*acl_library.HOME_ENV_VARS, "AIO_ASCEND_BACKEND", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(acl_library.ctypes.util, "find_library", lambda name: None)
    return monkeypatch


def _home(persona: str) -> Path:
    return build_double(persona).home


def _unusable_home() -> Path:
    """An install no launch path is complete for: 8.0's symbols without aclrtLaunchKernel."""
    return build_unusable_double().home


# --- what each persona exports ---------------------------------------------------------------


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_each_persona_exports_exactly_its_releases_symbols(persona: str) -> None:
    cdll = ctypes.CDLL(str(build_double(persona).library))
    exported = set()
    for name in ALL_SYMBOLS:
        try:
            cdll[name]
        except AttributeError:
            continue
        exported.add(name)
    assert exported == PERSONA_SYMBOLS[persona]
    assert DoubleControl(build_double(persona).library).persona() == PERSONAS[persona]


def test_the_persona_lists_follow_the_research() -> None:
    # cann-support.md §9: 8.3 has no host args, 8.5 no parameter info, 8.0 no args handle
    # (only the legacy loader and aclrtLaunchKernel, without aclrtDestroyBinary)
    assert "aclrtLaunchKernelWithHostArgs" not in PERSONA_SYMBOLS["8.3"]
    assert "aclrtKernelArgsInit" in PERSONA_SYMBOLS["8.3"]
    assert "aclrtFunctionGetParamCount" not in PERSONA_SYMBOLS["8.5"]
    assert "aclrtFunctionGetParamCount" in PERSONA_SYMBOLS["9.1"]
    assert not {"aclrtKernelArgsInit", "aclrtBinaryLoadFromFile"} & PERSONA_SYMBOLS["8.0"]
    assert {"aclrtCreateBinary", "aclrtBinaryLoad", "aclrtLaunchKernel"} <= PERSONA_SYMBOLS["8.0"]
    assert "aclrtDestroyBinary" not in PERSONA_SYMBOLS["8.0"]
    assert PERSONA_SYMBOLS["8.0"] < PERSONA_SYMBOLS["8.3"] < PERSONA_SYMBOLS["8.5"]
    assert PERSONA_SYMBOLS["8.5"] < PERSONA_SYMBOLS["9.1"]


# --- release and launch path ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "version", "path"),
    [
        ("8.0", None, "device_args"),
        ("8.3", "8.3.RC1", "args_handle"),
        ("8.5", "8.5.0", "host_args"),
        ("9.1", "9.1.0", "host_args"),
    ],
)
def test_the_release_and_its_launch_path_are_read(
    persona: str, version: str | None, path: str
) -> None:
    runtime = open_double_runtime(persona=persona)
    try:
        assert runtime.cann_version == version
        assert runtime.launch_path == path
        info = runtime.info()
        assert (info["cann_version"], info["launch_path"]) == (version, path)
    finally:
        runtime.close()


def test_a_release_without_a_usable_path_is_refused_loudly() -> None:
    library = build_unusable_double().library
    with pytest.raises(BackendUnavailableError) as info:
        open_acl_runtime(0, library_path=library)
    message = str(info.value)
    assert str(library) in message
    assert "CANN release unknown" in message  # no aclsysGetCANNVersion: older than 8.2
    assert "host args" in message
    assert "args handle" in message
    assert "missing aclrtLaunchKernelWithHostArgs, aclrtBinaryLoadFromFile" in message
    assert "aclrtKernelArgsInit" in message
    # the device-args path is tried last and names the one symbol it lacks
    assert "device args (aclrtCreateBinary + aclrtBinaryLoad + aclrtLaunchKernel" in message
    assert message.count("missing aclrtLaunchKernel\n") == 1


def test_auto_never_simulates_a_found_but_unusable_install(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("ASCEND_HOME_PATH", str(_unusable_home()))
    with pytest.raises(BackendUnavailableError, match="was found") as info:
        choose_backend("auto")
    assert "backend='sim'" in str(info.value)
    assert "aclrtLaunchKernelWithHostArgs" in str(info.value)
    with pytest.raises(BackendUnavailableError):
        open_runtime("auto", 0)
    with pytest.raises(BackendUnavailableError):
        open_runtime("acl", 0)
    assert aa.available_backends() == ["sim"] or "acl" not in aa.available_backends()


@pytest.mark.anyio
async def test_open_device_auto_raises_on_an_unusable_install(
    clean_env: pytest.MonkeyPatch, anyio_backend: object
) -> None:
    clean_env.setenv("ASCEND_TOOLKIT_HOME", str(_unusable_home()))
    with pytest.raises(BackendUnavailableError, match="cannot be used"):
        async with aa.open_device(0):
            pass  # pragma: no cover - never reached


def test_the_sim_is_chosen_explicitly_beside_an_unusable_install(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("ASCEND_HOME_PATH", str(_unusable_home()))
    clean_env.setenv("AIO_ASCEND_BACKEND", "sim")
    assert choose_backend("auto")[0] == "sim"
    assert choose_backend("sim")[0] == "sim"


def test_without_an_install_auto_is_the_sim(clean_env: pytest.MonkeyPatch) -> None:
    name, why = choose_backend("auto")
    assert name == "sim"
    assert "no CANN install found" in why


@pytest.mark.parametrize("persona", ["8.0", "8.3", "8.5", "9.1"])
def test_auto_picks_a_usable_install(clean_env: pytest.MonkeyPatch, persona: str) -> None:
    clean_env.setenv("ASCEND_HOME_PATH", str(_home(persona)))
    name, why = choose_backend("auto")
    assert name == "acl"
    assert "launch path" in why


def test_a_found_install_without_a_device_is_not_simulated(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("ASCEND_HOME_PATH", str(_home("8.5")))
    control = double_control("8.5")
    control.set_device_count(0)
    try:
        with pytest.raises(BackendUnavailableError, match="no Ascend device"):
            choose_backend("auto")
    finally:
        control.set_device_count(1)


def test_found_means_the_env_dirs_or_the_loader(clean_env: pytest.MonkeyPatch) -> None:
    assert acl_library.find_install() is None
    clean_env.setenv("ASCEND_TOOLKIT_HOME", str(_home("9.1")))
    assert acl_library.find_install() == str(_home("9.1") / "lib64" / "libascendcl.so")
    clean_env.delenv("ASCEND_TOOLKIT_HOME")
    clean_env.setattr(acl_library.ctypes.util, "find_library", lambda name: "libascendcl.so.1")
    assert acl_library.find_install() == "libascendcl.so.1"


# --- the args-handle path, call by call ---------------------------------------------------------


@pytest.fixture
def rt83() -> Iterator[AclRuntime]:
    runtime = open_double_runtime(persona="8.3")
    try:
        yield runtime
    finally:
        runtime.close()


def test_the_args_handle_path_replays_the_image_in_runs(
    rt83: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    ctl = double_control("8.3")
    kit = make_kit(rt83, stop_on_failure=False)
    n = 8
    x = kit.upload(np.arange(n, dtype=F32))
    y = kit.upload(np.zeros(n, dtype=F32))
    mark = ctl.mark()
    # data right after the arguments (align=8): the argument area ends where the data starts,
    # as the library packs it for this path (an align=32 block would leave 8 bytes of padding
    # that the runtime cannot tell from an argument, and would append as one)
    tiling = struct.pack("<If", n, 3.0)
    kit.launch("scale", HostArgs().ptr(x).ptr(y).placeholder(tiling, align=8))
    calls = [c.name for c in ctl.calls(mark) if c.name.startswith("aclrtKernelArgs")]
    assert calls == [
        "aclrtKernelArgsInit",
        "aclrtKernelArgsAppend",  # x and y: one run of 16 bytes
        "aclrtKernelArgsAppendPlaceHolder",
        "aclrtKernelArgsGetPlaceHolderBuffer",
        "aclrtKernelArgsFinalize",
    ]
    (append,) = ctl.calls(mark, "aclrtKernelArgsAppend")
    assert append.args[2] == 16
    (buffer,) = ctl.calls(mark, "aclrtKernelArgsGetPlaceHolderBuffer")
    assert buffer.args[2] >= 8  # the tiling data (with its padding to the image's end)
    assert ctl.last_launch_path() == "args_handle"
    (launch,) = ctl.calls(mark, "aclrtLaunchKernelWithConfig")
    assert launch.args[5] == 0  # reserve: NULL
    np.testing.assert_array_equal(kit.download(y, n), 3.0 * np.arange(n, dtype=F32))
    # the buffer the runtime built: x, y, the slot, then its overflow address, then the data
    built = ctl.last_args(patched=False)
    assert struct.unpack_from("<QQ", built, 0) == (x, y)
    overflow = ctl.context_overflow(rt83.context)
    assert struct.unpack_from("<Q", built, 24)[0] == overflow
    assert struct.unpack_from("<If", built, 32) == (n, 3.0)


def test_natural_scalars_keep_their_offsets_on_the_args_handle_path(
    rt83: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    # axpy: ptr x, ptr y, f32 a at 16, u32 n at 20 (natural): one run, not one Append each,
    # which would put n at 24 (cann-support.md §3.2)
    ctl = double_control("8.3")
    kit = make_kit(rt83, stop_on_failure=False)
    n = 4
    x = kit.upload(np.ones(n, dtype=F32))
    y = kit.upload(np.ones(n, dtype=F32))
    mark = ctl.mark()
    kit.launch("axpy", HostArgs().ptr(x).ptr(y).f32(2.0).u32(n))
    (append,) = ctl.calls(mark, "aclrtKernelArgsAppend")
    assert append.args[2] == 24
    np.testing.assert_array_equal(kit.download(y, n), np.full(n, 3.0, F32))
    assert struct.unpack_from("<fI", ctl.last_args(patched=False), 16) == (2.0, n)


def test_a_slot_inside_the_data_area_is_refused_on_the_args_handle_path(
    rt83: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(rt83, stop_on_failure=False)
    image = bytes(32)
    table = struct.pack("<II", 16, 8)  # data at 8, slot at 16: the slot is in the data area
    with pytest.raises(InvalidParamError, match="data area"):
        rt83.launch_kernel_with_host_args(
            rt83.get_function(kit.binary, "noop"),
            1,
            kit.stream,
            None,
            kit.pinned(image),
            32,
            kit.pinned(table),
            1,
        )


def test_a_priority_on_8_5_is_given_at_creation(ctl85: DoubleControl) -> None:
    runtime = open_double_runtime(persona="8.5")
    try:
        mark = ctl85.mark()
        stream = runtime.create_stream(3)
        (call,) = ctl85.calls(mark, "aclrtCreateStreamWithConfig")
        assert (call.args[1], call.args[2]) == (3, 0)
        assert not ctl85.calls(mark, "aclrtSetStreamAttribute")
        assert ctl85.stream_priority(stream) == 3
    finally:
        runtime.close()


def test_8_5_refuses_the_priority_attribute_of_9_1() -> None:
    # the double models H850, which lacks ACL_STREAM_ATTR_PRIORITY (cann-support.md row 42)
    runtime = open_double_runtime(persona="8.5")
    try:
        stream = runtime.create_stream()
        value = acl_runtime.ffi.AclrtStreamAttrValue()
        value.streamPriority = 1
        with pytest.raises(InvalidParamError, match="unknown stream attribute 5"):
            runtime._fn["aclrtSetStreamAttribute"](
                stream, acl_runtime.ACL_STREAM_ATTR_PRIORITY, ctypes.byref(value)
            )
    finally:
        runtime.close()


def test_8_3_has_no_stream_priorities() -> None:
    runtime = open_double_runtime(persona="8.3")
    try:
        with pytest.raises(BackendUnavailableError) as info:
            runtime.create_stream(0)
        assert info.value.func == "aclrtDeviceGetStreamPriorityRange"
        assert runtime.create_stream() != 0
    finally:
        runtime.close()


@pytest.fixture
def ctl85() -> DoubleControl:
    return double_control("8.5")


# --- dev.info on each persona -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        ("9.1", {"cann_version": "9.1.0", "runtime_version": "1.17.0", "launch_path": "host_args"}),
        ("8.5", {"cann_version": "8.5.0", "runtime_version": "1.16.0", "launch_path": "host_args"}),
        ("8.3", {"cann_version": "8.3.RC1", "runtime_version": "8.3.RC1", "memory_total": None}),
    ],
)
async def test_dev_info_holds_the_facts_kernels_need(
    anyio_backend: object, persona: str, expected: dict[str, object]
) -> None:
    from helpers import open_backend

    async with open_backend(f"acl-{persona}") as dev:
        info = dev.info
        assert info["backend"] == "acl"
        assert info["soc_name"] == "Ascend910B_double"
        assert (info["ai_core_count"], info["cube_core_count"], info["vector_core_count"]) == (
            24,
            24,
            48,
        )
        for key, value in expected.items():
            assert info[key] == value, key
        assert info["launch_path"] == dev.runtime.launch_path


def test_the_cli_shows_the_device_facts(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aio_ascend._tools.cli import main

    clean_env.setenv("ASCEND_HOME_PATH", str(_home("8.3")))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "auto picks: acl" in out
    assert "device 0 (acl):" in out
    assert "launch_path       args_handle" in out
    assert "cann_version      8.3.RC1" in out
    assert "vector_core_count 48" in out
    assert "memory_total      unknown (this release cannot tell)" in out


def test_the_cli_says_why_an_install_cannot_be_used(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aio_ascend._tools.cli import main

    clean_env.setenv("ASCEND_HOME_PATH", str(_unusable_home()))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "auto picks: nothing" in out
    assert "was found" in out
