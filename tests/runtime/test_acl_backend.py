"""The acl backend on the C test double: what crosses the ctypes boundary, byte for byte.

The double (tests/doubles/acl_double.c) logs every ACL call with its raw arguments and keeps a
copy of the last launch as it arrived (cfg attributes, placeholder table, args before and after
patching); its device addresses lie above 2**52, so any truncation shows.
"""

from __future__ import annotations

import array
import ctypes
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from doubles.acl_double import (
    BUILTINS_MAGIC,
    Call,
    DoubleControl,
    build_double,
    build_legacy_double,
    double_control,
)
from helpers import in_forked_child

import aio_ascend as aa
from aio_ascend._errors import (
    AICoreExceptionError,
    BackendUnavailableError,
    CaptureError,
    ClosedError,
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
from aio_ascend._launch_config import LaunchAttrId, LaunchConfig
from aio_ascend._runtime import abi, open_runtime, probe_backend
from aio_ascend._runtime.acl import ffi
from aio_ascend._runtime.acl import runtime as _acl
from aio_ascend._runtime.acl.batch import native_submit
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

F32 = np.float32
H2D, D2H = abi.ACL_MEMCPY_HOST_TO_DEVICE, abi.ACL_MEMCPY_DEVICE_TO_HOST
COMPLETE, NOT_READY = (
    abi.ACL_EVENT_RECORDED_STATUS_COMPLETE,
    abi.ACL_EVENT_RECORDED_STATUS_NOT_READY,
)

if TYPE_CHECKING:
    from conftest import RuntimeKit


@pytest.fixture
def ctl() -> DoubleControl:
    return double_control()


@pytest.fixture
def rt() -> Iterator[AclRuntime]:
    built = build_double()
    runtime = open_acl_runtime(0, library_path=built.library)
    try:
        yield runtime
    finally:
        runtime.close()


#: the kit (tests/runtime/conftest.py) over the double's built-ins, with pageable args and
#: copies: what crosses the ctypes boundary is the caller's own memory, byte for byte
KIT_OPTIONS = {"library": BUILTINS_MAGIC, "host": "pageable"}


def _only(calls: list[Call]) -> Call:
    assert len(calls) == 1, calls
    return calls[0]


# --- pointers ---------------------------------------------------------------------------------


def test_device_pointers_above_2_47_cross_intact(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    n = 64
    x_host, y_host = np.arange(n, dtype=F32), np.full(n, 0.5, F32)
    mark = ctl.mark()
    x, y = kit.upload(x_host), kit.upload(y_host)
    z = rt.malloc(4 * n)
    for ptr in (x, y, z):
        assert ptr >= ctl.dev_base() > 2**52
        assert ptr % 64 == 0
    copies = ctl.calls(mark, "aclrtMemcpyAsync")
    assert [c.args for c in copies] == [
        (x, 4 * n, x_host.ctypes.data, 4 * n, H2D, kit.stream),
        (y, 4 * n, y_host.ctypes.data, 4 * n, H2D, kit.stream),
    ]
    assert all(c.rc == 0 for c in copies)
    args = HostArgs().ptr(x).ptr(y).ptr(z).u32(n)
    addr = kit.launch("vector_add", args, blocks=8)
    func, blocks, stream, cfg, host_args, size, table, count = ctl.last_launch()
    assert (func, blocks, stream, cfg) == (kit.fn("vector_add"), 8, kit.stream, 0)
    assert (host_args, size, table, count) == (addr, args.nbytes, 0, 0)
    sent = ctl.last_args(patched=False)
    assert sent == args.to_bytes()
    assert struct.unpack_from("<QQQI", sent) == (x, y, z, n)
    np.testing.assert_array_equal(kit.download(z, n), x_host + y_host)
    # the D2H copy crossed with the exact device address too
    assert _only(ctl.calls(ctl.mark() - 1, "aclrtMemcpyAsync")).args[2] == z


def test_handles_round_trip_unchanged(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    event = rt.create_event(abi.ACL_EVENT_SYNC)
    mark = ctl.mark()
    rt.record_event(event, kit.stream)
    rt.stream_wait_event(kit.stream, event)
    rt.synchronize_event(event, 1000)
    assert rt.query_event_status(event) == COMPLETE
    calls = [c for c in ctl.calls(mark) if c.name != "aclGetRecentErrMsg"]
    assert [(c.name, c.args[:2]) for c in calls] == [
        ("aclrtRecordEvent", (event, kit.stream)),
        ("aclrtStreamWaitEvent", (kit.stream, event)),
        ("aclrtSynchronizeEventWithTimeout", (event, 1000)),
        ("aclrtQueryEventStatus", (event, calls[3].args[1])),
    ]
    created = _only(ctl.calls(0, "aclrtCreateEventExWithFlag")[-1:])
    assert created.args[1] == abi.ACL_EVENT_SYNC


# --- placeholders -----------------------------------------------------------------------------


def test_placeholder_table_crosses_and_the_callers_buffer_is_patched(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    n = 16
    x_host = np.arange(n, dtype=F32)
    x, y = kit.upload(x_host), kit.rt.malloc(4 * n)
    args = HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, 3.0))
    ((addr_offset, data_offset),) = args.placeholders
    image = args.to_bytes()
    addr = kit.launch("scale", args)
    table_addr = kit.last_table
    raw = ctl.last_launch()
    assert raw[6] == table_addr
    assert raw[7] == 1
    assert (
        ctl.last_placeholders()
        == args.placeholder_table()
        == struct.pack("<II", addr_offset, data_offset)
    )
    dev_args = ctl.last_dev_args()
    assert dev_args > 2**52
    patched = bytearray(image)
    patched[addr_offset : addr_offset + 8] = struct.pack("<Q", dev_args + data_offset)
    assert ctl.last_args(patched=False) == image  # slot still zero on the way in
    assert ctypes.string_at(addr, len(image)) == bytes(patched)  # written into OUR buffer ...
    assert ctl.last_args(patched=True) == bytes(patched)  # ... before the runtime copied it
    np.testing.assert_array_equal(kit.download(y, n), 3.0 * x_host)


def test_matmul_reads_its_tiling_through_a_placeholder(kit: RuntimeKit) -> None:
    m, n, k = 3, 4, 5
    rng = np.random.default_rng(1)
    a_host = rng.standard_normal((m, k)).astype(F32)
    b_host = rng.standard_normal((k, n)).astype(F32)
    a, b, c = kit.upload(a_host), kit.upload(b_host), kit.rt.malloc(4 * m * n)
    args = HostArgs().ptr(a).ptr(b).ptr(c).placeholder(struct.pack("<III", m, n, k))
    kit.launch("matmul", args)
    np.testing.assert_allclose(kit.download(c, m * n).reshape(m, n), a_host @ b_host, rtol=1e-5)


def test_the_placeholder_table_is_checked_before_the_call(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    args = HostArgs().ptr(0).ptr(0).placeholder(b"\0" * 8)
    buf = kit.buffer(args.to_bytes())
    for entry in [(4, 24), (8, 20)]:  # misaligned slot, misaligned data
        table = kit.buffer(struct.pack("<II", *entry))
        mark = ctl.mark()
        with pytest.raises(InvalidParamError, match="not 8-aligned"):
            kit.rt.launch_kernel_with_host_args(
                kit.fn("scale"), 1, kit.stream, None, ctypes.addressof(buf), args.nbytes,
                ctypes.addressof(table), 1,
            )  # fmt: skip
        assert ctl.calls(mark, "aclrtLaunchKernelWithHostArgs") == []


# --- launch configs ---------------------------------------------------------------------------

CONFIGS = {
    "batch": LaunchConfig(schedule_mode="batch"),
    "timeout seconds": LaunchConfig(timeout_s=7),
    "timeout micros": LaunchConfig(timeout_us=(3 << 32) | 5),
    "everything": LaunchConfig(
        schedule_mode="normal",
        engine_type="aiv",
        block_dim_offset=3,
        prefetch_disabled=True,
        dump=False,
        dyn_ubuf_size=0,
        timeout_s=1,
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cfg_attributes_cross_byte_for_byte(kit: RuntimeKit, ctl: DoubleControl, name: str) -> None:
    cfg = CONFIGS[name]
    kit.launch("noop", HostArgs(), cfg=cfg)
    attrs = ctl.last_cfg()
    assert attrs is not None
    assert len(attrs) == 20 * cfg.num_attrs
    assert attrs == cfg.pack_attrs()
    assert ctl.last_launch()[3] != 0
    kit.rt.synchronize_stream(kit.stream, 2000)


def test_timeout_and_timeout_us_are_different_attributes(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    kit.launch("noop", HostArgs(), cfg=LaunchConfig(timeout_s=300))
    seconds = ctl.last_cfg()
    assert seconds is not None
    assert struct.unpack("<IH", seconds[:6]) == (LaunchAttrId.TIMEOUT, 300)
    assert seconds[6:] == b"\0" * 14
    kit.launch("noop", HostArgs(), cfg=LaunchConfig(timeout_us=300_000_000 + (1 << 33)))
    micros = ctl.last_cfg()
    assert micros is not None
    low, high = (300_000_000 + (1 << 33)) & 0xFFFFFFFF, 2
    assert struct.unpack("<III", micros[:12]) == (LaunchAttrId.TIMEOUT_US, low, high)
    assert micros[12:] == b"\0" * 8


def test_no_cfg_and_an_empty_cfg_pass_null(kit: RuntimeKit, ctl: DoubleControl) -> None:
    for cfg in (None, LaunchConfig(), LaunchConfig(block_dim=128)):
        kit.launch("noop", HostArgs(), cfg=cfg)
        assert ctl.last_cfg() is None
        assert ctl.last_launch()[3] == 0


def test_a_reused_config_reuses_its_packed_struct(kit: RuntimeKit, ctl: DoubleControl) -> None:
    cfg = LaunchConfig(schedule_mode="batch")
    kit.launch("noop", HostArgs(), cfg=cfg)
    first = ctl.last_launch()[3]
    kit.launch("noop", HostArgs(), cfg=cfg)
    assert ctl.last_launch()[3] == first
    kit.launch("noop", HostArgs(), cfg=LaunchConfig(schedule_mode="batch"))
    assert ctl.last_cfg() == cfg.pack_attrs()


# --- the double validates like CANN (raw calls through the bound functions) --------------------


def _raw_launch(kit: RuntimeKit, **overrides: object) -> None:
    args = kit.buffer(b"\0" * 16)
    call: dict[str, object] = {
        "func": kit.fn("noop"),
        "blocks": 1,
        "stream": kit.stream,
        "cfg": None,
        "args": ctypes.addressof(args),
        "size": 16,
        "table": None,
        "count": 0,
    }
    call.update(overrides)
    kit.rt._fn["aclrtLaunchKernelWithHostArgs"](*call.values())


def _table(kit: RuntimeKit, *entries: tuple[int, int]) -> int:
    return ctypes.addressof(kit.buffer(b"".join(struct.pack("<II", *e) for e in entries)))


def _cfg(*attrs: tuple[int, str, object]) -> object:
    array = (ffi.AclrtLaunchKernelAttr * max(len(attrs), 1))()
    for index, (attr_id, member, value) in enumerate(attrs):
        array[index].id = attr_id
        if member == "timeoutUs":
            array[index].value.timeoutUs = ffi.AclrtTimeoutUs(*value)  # type: ignore[misc]
        else:
            setattr(array[index].value, member, value)
    cfg = ffi.AclrtLaunchKernelCfg(
        ctypes.cast(array, ctypes.POINTER(ffi.AclrtLaunchKernelAttr)), len(attrs)
    )
    cfg._keep = array
    return ctypes.byref(cfg)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ({"blocks": 0}, "numBlocks"),
        ({"blocks": 65536}, "numBlocks"),
        ({"size": 0}, "argsSize"),
        ({"args": None}, "hostArgs"),
        ({"count": 1}, "placeHolderArray"),
        ("addr", "addrOffset"),
        ("data", "dataOffset"),
        ("both timeouts", "mutually exclusive"),
        ("schem", "schemMode"),
        ("null attrs", "attrs"),
    ],
)
def test_the_double_validates_launches_like_cann(
    kit: RuntimeKit, case: object, message: str
) -> None:
    if case == "addr":
        case = {"table": _table(kit, (0, 8), (9, 8)), "count": 2}  # 9 + 8 > 16
    elif case == "data":
        case = {"table": _table(kit, (0, 16)), "count": 1}  # dataOffset == argsSize
    elif case == "both timeouts":
        case = {"cfg": _cfg((7, "timeout", 1), (8, "timeoutUs", (1, 0)))}
    elif case == "schem":
        case = {"cfg": _cfg((1, "schemMode", 2))}
    elif case == "null attrs":
        case = {"cfg": ctypes.byref(ffi.AclrtLaunchKernelCfg(None, 0))}
    assert isinstance(case, dict)
    with pytest.raises(InvalidParamError, match=message) as info:
        _raw_launch(kit, **case)
    assert info.value.code == 107000
    assert info.value.func == "aclrtLaunchKernelWithHostArgs"


def test_a_valid_raw_cfg_is_accepted(kit: RuntimeKit, ctl: DoubleControl) -> None:
    _raw_launch(kit, cfg=_cfg((1, "schemMode", 1), (8, "timeoutUs", (5, 0))))
    assert ctl.last_cfg() == LaunchConfig(schedule_mode="batch", timeout_us=5).pack_attrs()


# --- synchronize timeouts ---------------------------------------------------------------------


def test_sync_timeouts_cross_in_milliseconds(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    stuck = rt.create_stream()
    event = rt.create_event(abi.ACL_EVENT_SYNC)
    kit.launch("hang", HostArgs(), stream=stuck)
    rt.record_event(event, stuck)
    assert rt.query_event_status(event) == NOT_READY
    mark = ctl.mark()
    started = time.monotonic()
    with pytest.raises(EventSyncTimeoutError) as event_info:
        rt.synchronize_event(event, 30)
    with pytest.raises(StreamSyncTimeoutError) as stream_info:
        rt.synchronize_stream(stuck, 25)
    assert 0.05 <= time.monotonic() - started < 2.0
    assert (event_info.value.code, stream_info.value.code) == (507047, 507046)
    assert "30 ms" in event_info.value.message
    assert "25 ms" in stream_info.value.message
    sync_event = _only(ctl.calls(mark, "aclrtSynchronizeEventWithTimeout"))
    sync_stream = _only(ctl.calls(mark, "aclrtSynchronizeStreamWithTimeout"))
    assert sync_event.args == (event, 30)
    assert sync_event.rc == 507047
    assert sync_stream.args == (stuck, 25)
    assert sync_stream.rc == 507046
    # -1 (forever) crosses as -1
    idle = rt.create_event(abi.ACL_EVENT_SYNC)
    rt.record_event(idle, kit.stream)
    mark = ctl.mark()
    rt.synchronize_event(idle, -1)
    rt.synchronize_stream(kit.stream, -1)
    assert [c.signed(1) for c in ctl.calls(mark) if "Synchronize" in c.name] == [-1, -1]
    rt.destroy_stream_force(stuck)


@pytest.mark.parametrize(("timeout", "error"), [(0, InvalidParamError), (-2, InvalidParamError),
                                                (2**31, ValueError), (1.5, TypeError)])  # fmt: skip
def test_bad_timeouts_never_reach_the_runtime(
    kit: RuntimeKit, ctl: DoubleControl, timeout: object, error: type[Exception]
) -> None:
    event = kit.rt.create_event(abi.ACL_EVENT_SYNC)
    mark = ctl.mark()
    with pytest.raises(error, match="timeout_ms"):
        kit.rt.synchronize_event(event, timeout)  # type: ignore[arg-type]
    with pytest.raises(error, match="timeout_ms"):
        kit.rt.synchronize_stream(kit.stream, timeout)  # type: ignore[arg-type]
    assert ctl.calls(mark) == []


def test_the_zero_timeout_error_looks_like_the_runtimes(kit: RuntimeKit) -> None:
    with pytest.raises(InvalidParamError) as info:
        kit.rt.synchronize_stream(kit.stream, 0)
    assert (info.value.code, info.value.func) == (107000, "aclrtSynchronizeStreamWithTimeout")


# --- error mapping ----------------------------------------------------------------------------

INJECTED = [
    ("aclrtMalloc", 207001, MemoryAllocationError, lambda k: k.rt.malloc(64)),
    ("aclrtCreateEventExWithFlag", 107017, InvalidHandleError, lambda k: k.rt.create_event(1)),
    ("aclrtRecordEvent", 507015, AICoreExceptionError,
     lambda k: k.rt.record_event(k.rt.create_event(1), k.stream)),
    ("aclrtQueryEventStatus", 507035, DeviceFaultError,
     lambda k: k.rt.query_event_status(k.rt.create_event(1))),
    ("aclrtSynchronizeStreamWithTimeout", 507046, StreamSyncTimeoutError,
     lambda k: k.rt.synchronize_stream(k.stream, 10)),
    ("aclrtCreateStream", 424242, RuntimeAPIError, lambda k: k.rt.create_stream()),
    ("aclrtBinaryGetFunction", 107042, RuntimeAPIError, lambda k: k.fn("noop")),
]  # fmt: skip


@pytest.mark.parametrize(("func", "code", "error", "call"), INJECTED, ids=[i[0] for i in INJECTED])
def test_codes_map_to_typed_errors_with_the_runtime_message(
    kit: RuntimeKit, ctl: DoubleControl, func: str, code: int, error: type[Exception], call: object
) -> None:
    message = f"EE9999: injected failure of {func} (code {code})"
    ctl.inject_error(func, code, message)
    mark = ctl.mark()
    try:
        with pytest.raises(error) as info:
            call(kit)  # type: ignore[operator]
    finally:
        ctl.clear_injections()
    assert type(info.value) is error
    assert (info.value.code, info.value.func, info.value.message) == (code, func, message)  # type: ignore[attr-defined]
    assert kit.rt.get_recent_error_message() == message
    names = [c.name for c in ctl.calls(mark)]
    failing = names.index(func)
    assert names[failing + 1] == "aclGetRecentErrMsg"  # fetched right after, on the same thread


def test_unknown_kernel_names_are_symbol_not_found(kit: RuntimeKit) -> None:
    with pytest.raises(RuntimeAPIError, match="no_such_kernel") as info:
        kit.fn("no_such_kernel")
    assert info.value.code == 107042


def test_an_unbound_thread_gets_context_null(rt: AclRuntime) -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            rt.create_stream()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(5)
    (error,) = errors
    assert isinstance(error, ContextNullError)
    assert (error.code, error.func) == (107002, "aclrtCreateStream")
    assert "no current context" in error.message


def test_a_thread_bound_to_a_closed_context_is_unbound() -> None:
    built = build_double()
    first = open_acl_runtime(0, library_path=built.library)
    bound, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    second: list[AclRuntime] = []

    def body() -> None:
        first.set_current_context()
        bound.set()
        go.wait(5)
        try:
            second[0].create_stream()  # this thread never bound the second context
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    try:
        assert bound.wait(5)
        first.close()
        second.append(open_acl_runtime(0, library_path=built.library))
        go.set()
        thread.join(5)
    finally:
        go.set()
        for runtime in second:
            runtime.close()
    (error,) = errors
    assert isinstance(error, ContextNullError)


def test_continue_mode_reports_a_fault_once_on_its_stream(kit: RuntimeKit) -> None:
    rt = kit.rt
    lenient = rt.create_stream()
    rt.set_stream_failure_mode(lenient, abi.ACL_CONTINUE_ON_FAILURE)
    kit.launch("fault", HostArgs().u32(507035), stream=lenient)
    with pytest.raises(DeviceFaultError) as info:
        rt.synchronize_stream(lenient, 2000)
    assert info.value.code == 507035
    rt.synchronize_stream(lenient, 2000)  # reported once, not sticky
    kit.launch("noop", HostArgs())
    rt.synchronize_stream(kit.stream, 2000)  # other streams unaffected


def test_double_free_is_invalid_param(rt: AclRuntime) -> None:
    ptr = rt.malloc(128)
    rt.free(ptr)
    with pytest.raises(InvalidParamError, match="double free") as info:
        rt.free(ptr)
    assert info.value.func == "aclrtFree"
    host = rt.malloc_host(64)
    rt.free_host(host)
    with pytest.raises(InvalidParamError, match="double free"):
        rt.free_host(host)


def test_a_device_fault_is_sticky_with_the_fault_text(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    kit.launch("fault", HostArgs().u32(0))
    with pytest.raises(AICoreExceptionError) as info:
        rt.synchronize_stream(kit.stream, 2000)
    assert "fault kernel" in info.value.message
    assert ctl.context_fault(rt.context) == 507015
    with pytest.raises(AICoreExceptionError) as again:
        kit.launch("noop", HostArgs())
    assert again.value.message == info.value.message
    assert again.value.func == "aclrtLaunchKernelWithHostArgs"


def test_later_reports_of_a_fault_keep_the_first_text(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    kit.launch("fault", HostArgs().u32(507035))
    with pytest.raises(DeviceFaultError) as first:
        rt.synchronize_stream(kit.stream, 2000)
    # whatever the runtime says for later calls, they carry the first fault's text
    ctl.inject_error("aclrtRecordEvent", 507035, "context is abnormal")
    with pytest.raises(DeviceFaultError) as later:
        rt.record_event(rt.create_event(1), kit.stream)
    assert (later.value.code, later.value.func) == (507035, "aclrtRecordEvent")
    assert later.value.message == first.value.message
    # a different code keeps its own text
    ctl.inject_error("aclrtStreamWaitEvent", 507053, "memory error")
    with pytest.raises(DeviceFaultError, match="memory error"):
        rt.stream_wait_event(kit.stream, rt.create_event(1))


def test_injected_fault_reaches_queries(kit: RuntimeKit, ctl: DoubleControl) -> None:
    event = kit.rt.create_event(abi.ACL_EVENT_SYNC)
    assert ctl.set_fault(kit.rt.context, 507053, "HBM went away") == 1
    with pytest.raises(DeviceFaultError, match="HBM went away") as info:
        kit.rt.query_event_status(event)
    assert info.value.code == 507053


# --- range checks: nothing out of range reaches ctypes ----------------------------------------

BAD_CALLS: dict[str, tuple[Callable[[RuntimeKit], object], type[Exception], str]] = {
    "negative pointer": (lambda k: k.rt.free(-1), ValueError, "ptr"),
    "pointer past 64 bits": (lambda k: k.rt.free(2**64), ValueError, "ptr"),
    "float pointer": (lambda k: k.rt.free(1.0), TypeError, "ptr"),  # type: ignore[arg-type]
    "bool handle": (lambda k: k.rt.destroy_event(True), TypeError, "event"),
    "negative size": (lambda k: k.rt.malloc(-1), ValueError, "size"),
    "size past size_t": (lambda k: k.rt.malloc_host(2**64), ValueError, "size"),
    "event past 64 bits": (lambda k: k.rt.query_event_status(2**64), ValueError, "event"),
    "stream past 64 bits": (lambda k: k.rt.record_event(1, 2**64), ValueError, "stream"),
    "flags past 32 bits": (lambda k: k.rt.create_event(2**32), ValueError, "flags"),
    "mode past 64 bits": (lambda k: k.rt.set_stream_failure_mode(k.stream, 2**64), ValueError,
                          "mode"),
    "copy count negative": (lambda k: k.rt.memcpy_async(1, 8, 2, -1, H2D, k.stream), ValueError,
                            "count"),
    "copy kind past int32": (lambda k: k.rt.memcpy_async(1, 8, 2, 8, 2**31, k.stream),
                             ValueError, "kind"),
    "copy dst past 64 bits": (lambda k: k.rt.memcpy_async(2**64, 8, 2, 8, H2D, k.stream),
                              ValueError, "dst"),
    "blocks past uint16": (lambda k: _launch(k, num_blocks=65536), InvalidParamError,
                           "num_blocks"),
    "blocks past uint32": (lambda k: _launch(k, num_blocks=2**32), InvalidParamError,
                           "num_blocks"),
    "negative blocks": (lambda k: _launch(k, num_blocks=-1), InvalidParamError, "num_blocks"),
    "args size past uint32": (lambda k: _launch(k, args_size=2**32), InvalidParamError,
                              "args_size"),
    "func past 64 bits": (lambda k: _launch(k, func=2**64), ValueError, "func"),
    "args negative": (lambda k: _launch(k, args_addr=-8), ValueError, "args_addr"),
    "null table with entries": (lambda k: _launch(k, placeholder_count=1), InvalidParamError,
                                "placeHolderArray"),
    "cfg of the wrong type": (lambda k: _launch(k, cfg={"schedule_mode": 1}), InvalidParamError,
                              "cfg"),
    "device id past int32": (lambda k: open_acl_runtime(2**31), ValueError, "device_id"),
    "bool priority": (lambda k: k.rt.create_stream(True), TypeError, "priority"),
    "float priority": (lambda k: k.rt.create_stream(1.0), TypeError,  # type: ignore[arg-type]
                       "priority"),
    "memset past maxCount": (lambda k: k.rt.memset_async(k.scratch, 32, 0, 64, k.stream),
                             InvalidParamError, "maxCount"),
    "memset value past a byte": (lambda k: k.rt.memset_async(k.scratch, 64, 256, 64, k.stream),
                                 InvalidParamError, "value"),
    "memset negative value": (lambda k: k.rt.memset_async(k.scratch, 64, -1, 64, k.stream),
                              InvalidParamError, "value"),
    "memset NULL": (lambda k: k.rt.memset_async(0, 64, 0, 64, k.stream), InvalidParamError,
                    "devPtr"),
    "memset max past size_t": (lambda k: k.rt.memset_async(k.scratch, 2**64, 0, 64, k.stream),
                               ValueError, "dst_max"),
    "memset count negative": (lambda k: k.rt.memset_async(k.scratch, 64, 0, -1, k.stream),
                              ValueError, "count"),
    "memset stream past 64 bits": (lambda k: k.rt.memset_async(k.scratch, 64, 0, 64, 2**64),
                                   ValueError, "stream"),
}  # fmt: skip


def _launch(kit: RuntimeKit, **overrides: object) -> None:
    buf = kit.buffer(b"\0" * 8)
    call: dict[str, object] = {
        "func": kit.fn("noop"),
        "num_blocks": 1,
        "stream": kit.stream,
        "cfg": None,
        "args_addr": ctypes.addressof(buf),
        "args_size": 8,
        "placeholders_addr": 0,
        "placeholder_count": 0,
    }
    call.update(overrides)
    kit.rt.launch_kernel_with_host_args(**call)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_out_of_range_values_never_reach_the_library(
    kit: RuntimeKit, ctl: DoubleControl, case: str
) -> None:
    call, error, field = BAD_CALLS[case]
    kit.fn("noop")  # resolve before the mark
    assert kit.scratch
    mark = ctl.mark()
    with pytest.raises(error, match=field):
        call(kit)
    assert ctl.calls(mark) == [], "a refused value reached the library"


def test_blocks_at_the_limits_reach_the_library(kit: RuntimeKit, ctl: DoubleControl) -> None:
    _launch(kit, num_blocks=65535)
    assert ctl.last_launch()[1] == 65535
    mark = ctl.mark()
    with pytest.raises(InvalidParamError) as info:
        _launch(kit, num_blocks=0)  # the shared abi check, as the sim and cuda backends
    assert ctl.calls(mark, "aclrtLaunchKernelWithHostArgs") == []
    assert (info.value.code, info.value.func) == (107000, "aclrtLaunchKernelWithHostArgs")
    assert "numBlocks" in info.value.message


# --- memory copies ----------------------------------------------------------------------------


def test_pinned_copies_are_late_and_pageable_copies_block(kit: RuntimeKit) -> None:
    rt = kit.rt
    n = 4
    dev = kit.upload(np.full(n, 7.0, F32))
    rt.synchronize_stream(kit.stream, 2000)
    pinned = rt.malloc_host(4 * n)
    view = np.frombuffer(memoryview((ctypes.c_char * (4 * n)).from_address(pinned)), dtype=F32)
    kit.launch("sleep", HostArgs().u32(150_000))
    started = time.monotonic()
    rt.memcpy_async(pinned, 4 * n, dev, 4 * n, D2H, kit.stream)
    assert time.monotonic() - started < 0.1  # queued, not done
    assert not view.any()
    kit.launch("sleep", HostArgs().u32(100_000))
    pageable = np.zeros(n, F32)
    started = time.monotonic()
    rt.memcpy_async(pageable.ctypes.data, 4 * n, dev, 4 * n, D2H, kit.stream)
    assert time.monotonic() - started >= 0.08  # waited for the stream to reach it
    np.testing.assert_array_equal(pageable, np.full(n, 7.0, F32))
    np.testing.assert_array_equal(view, np.full(n, 7.0, F32))
    rt.free_host(pinned)


def test_a_copy_larger_than_its_destination_is_refused(kit: RuntimeKit) -> None:
    dev = kit.rt.malloc(16)
    src = np.zeros(8, F32)
    with pytest.raises(InvalidParamError, match="destMax"):
        kit.rt.memcpy_async(dev, 16, src.ctypes.data, 32, H2D, kit.stream)


# --- events -----------------------------------------------------------------------------------


def test_ex_events_and_their_generations(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    event = rt.create_event(abi.ACL_EVENT_SYNC | abi.ACL_EVENT_TIME_LINE)
    assert rt.query_event_status(event) == COMPLETE  # never recorded
    assert ctl.event_generation(event) == 0
    rt.record_event(event, kit.stream)
    rt.record_event(event, kit.stream)
    assert ctl.event_generation(event) == 2
    rt.synchronize_event(event, 2000)
    assert rt.query_event_status(event) == COMPLETE
    end = rt.create_event(abi.ACL_EVENT_TIME_LINE)
    kit.launch("sleep", HostArgs().u32(20_000))
    rt.record_event(end, kit.stream)
    rt.synchronize_event(end, 2000)
    assert 15.0 <= rt.event_elapsed_time(event, end) < 2000.0


def test_status_values_are_compared_by_name(
    kit: RuntimeKit, ctl: DoubleControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # whatever the runtime writes that is not COMPLETE reads as NOT_READY
    event = kit.rt.create_event(1)

    def query(event: int, status_ref: Any) -> int:
        ctypes.cast(status_ref, ctypes.POINTER(ctypes.c_int))[0] = 7
        return 0

    fn = dict(kit.rt._fn)
    fn["aclrtQueryEventStatus"] = query
    monkeypatch.setattr(kit.rt, "_fn", fn)
    assert kit.rt.query_event_status(event) == NOT_READY


def test_a_blocking_wait_releases_the_gil(kit: RuntimeKit) -> None:
    rt = kit.rt
    stuck = rt.create_stream()
    kit.launch("hang", HostArgs(), stream=stuck)
    done = threading.Event()

    def wait() -> None:
        rt.set_current_context()
        try:
            rt.synchronize_stream(stuck, 300)
        except StreamSyncTimeoutError:
            done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    spins = 0
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:
        spins += 1
    thread.join(5)
    assert done.is_set()
    assert spins > 10_000
    rt.destroy_stream_force(stuck)


# --- kernel binaries --------------------------------------------------------------------------


def test_binaries_load_from_a_relative_path_as_absolute(
    rt: AclRuntime, ctl: DoubleControl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kernels.o").write_bytes(BUILTINS_MAGIC)
    monkeypatch.chdir(tmp_path)
    binary = rt.load_binary("kernels.o")
    assert ctl.last_load() == (str(tmp_path / "kernels.o"), True, 0)  # absolute, options NULL
    assert rt.get_function(binary, "vector_add")
    rt.unload_binary(binary)
    binary = rt.load_binary(tmp_path / "kernels.o")  # PathLike
    rt.unload_binary(binary)


def test_binaries_load_from_bytes(rt: AclRuntime, ctl: DoubleControl) -> None:
    mark = ctl.mark()
    binary = rt.load_binary(bytearray(BUILTINS_MAGIC))
    call = _only(ctl.calls(mark, "aclrtBinaryLoadFromData"))
    assert call.args[1] == len(BUILTINS_MAGIC)
    assert call.args[2] == 0
    assert ctl.last_load() == ("", True, 0)
    func = rt.get_function(binary, "noop")
    rt.unload_binary(binary)
    with pytest.raises(InvalidHandleError):
        rt.get_function(binary, "noop")
    assert func


@pytest.mark.parametrize(
    "wrap",
    [
        lambda data: np.frombuffer(data, np.uint8),
        lambda data: np.frombuffer(data, "<u4"),  # its bytes, not its elements
        lambda data: array.array("B", data),
        lambda data: memoryview(data),
    ],
    ids=["uint8 array", "uint32 array", "array.array", "memoryview"],
)
def test_binaries_load_from_any_bytes_like_data(
    rt: AclRuntime, ctl: DoubleControl, wrap: Callable[[bytes], Any]
) -> None:
    data = BUILTINS_MAGIC + b"\0" * (-len(BUILTINS_MAGIC) % 4)  # (whole uint32 words)
    source = wrap(data)
    mark = ctl.mark()
    binary = rt.load_binary(source)
    call = _only(ctl.calls(mark, "aclrtBinaryLoadFromData"))
    assert call.args[1] == memoryview(source).nbytes
    assert rt.get_function(binary, "noop")
    rt.unload_binary(binary)
    with pytest.raises(ValueError, match="empty"):
        rt.load_binary(wrap(b""))


def test_bad_binaries(rt: AclRuntime, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        rt.load_binary(tmp_path / "missing.o")
    with pytest.raises(TypeError):
        rt.load_binary(42)
    for not_data in (np.array([1, 2], dtype=object), np.zeros(2, "datetime64[s]")):
        with pytest.raises(TypeError, match="bytes-like"):  # (pointers; no buffer NumPy gives)
            rt.load_binary(not_data)
    with pytest.raises(ValueError, match="empty"):
        rt.load_binary(b"")
    with pytest.raises(InvalidParamError, match="not a kernel binary"):
        rt.load_binary(b"\x7fELF not ours")


def test_builtins_come_from_the_environment(
    rt: AclRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_acl.ENV_BUILTINS, str(build_double().builtins))
    assert rt.get_function(rt.load_binary(None), "matmul")
    monkeypatch.delenv(_acl.ENV_BUILTINS)
    with pytest.raises(BackendUnavailableError, match=_acl.ENV_BUILTINS):
        rt.load_binary(None)


# --- lifecycle --------------------------------------------------------------------------------


def test_close_releases_everything_and_is_idempotent(
    ctl: DoubleControl, make_kit: Callable[..., RuntimeKit]
) -> None:
    built = build_double()
    before = ctl.live_counts()
    rt = open_acl_runtime(0, library_path=built.library)
    kit = make_kit(rt, **KIT_OPTIONS)
    kit.upload(np.ones(4, F32))
    rt.malloc_host(64)
    rt.create_event(1)
    stuck = rt.create_stream()
    # running when the close forces its stream: the close waits for it before freeing (a hung
    # kernel would leak instead: tests/runtime/test_acl_faults.py)
    kit.launch("sleep", HostArgs().u32(100_000), stream=stuck)
    during = ctl.live_counts()
    assert during["streams"] == before["streams"] + 2
    assert during["device0_refs"] == before["device0_refs"] + 1
    rt.close()
    assert ctl.live_counts() == before
    rt.close()
    with pytest.raises(ClosedError):
        rt.create_stream()
    with pytest.raises(ClosedError):
        rt.set_current_context()
    assert isinstance(rt.get_recent_error_message(), str)


def test_close_leaves_the_threads_other_context_bound(ctl: DoubleControl) -> None:
    built = build_double()
    first = open_acl_runtime(0, library_path=built.library)
    second = open_acl_runtime(0, library_path=built.library)
    try:
        first.set_current_context()
        second.close()  # binds its own context to close, then restores the first
        first.destroy_stream(first.create_stream())
    finally:
        second.close()
        first.close()


def test_open_failures_are_typed_and_leave_nothing(ctl: DoubleControl) -> None:
    built = build_double()
    before = ctl.live_counts()
    with pytest.raises(RuntimeAPIError) as info:
        open_acl_runtime(3, library_path=built.library)
    assert (info.value.code, info.value.func) == (107001, "aclrtSetDevice")
    ctl.inject_error("aclrtCreateContext", 207001, "no memory for a context")
    with pytest.raises(MemoryAllocationError, match="no memory for a context"):
        open_acl_runtime(0, library_path=built.library)
    assert ctl.live_counts() == before


def test_the_registry_opens_acl_with_options() -> None:
    runtime = open_runtime("acl", 0, library_path=build_double().library)
    try:
        assert runtime.name == "acl"
        assert runtime.device_id == 0
    finally:
        runtime.close()


# --- loading ----------------------------------------------------------------------------------


def _real_acl_installed() -> bool:
    import ctypes.util

    return bool(ctypes.util.find_library("ascendcl"))


def test_library_not_found_lists_every_path_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _real_acl_installed():
        pytest.skip("a real libascendcl.so is on the loader path")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "home"))
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "toolkit"))
    with pytest.raises(BackendUnavailableError) as info:
        open_acl_runtime(0)
    message = str(info.value)
    assert f"{tmp_path / 'home' / 'lib64' / 'libascendcl.so'}: no such file" in message
    assert f"{tmp_path / 'toolkit' / 'lib64' / 'libascendcl.so'}: no such file" in message
    assert "\n  libascendcl.so: " in message  # the loader was asked too
    assert "ASCEND_HOME_PATH" in message
    ok, reason = _acl.probe()
    assert not ok
    assert "libascendcl.so" in reason
    assert probe_backend("acl") == (ok, reason)


def test_an_explicit_library_path_is_the_only_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASCEND_HOME_PATH", str(build_double().home))
    missing = tmp_path / "libascendcl.so"
    with pytest.raises(BackendUnavailableError) as info:
        open_acl_runtime(0, library_path=missing)
    assert str(info.value).count("\n  ") == 1
    assert f"{missing}: no such file" in str(info.value)
    not_a_library = tmp_path / "text.so"
    not_a_library.write_text("hello")
    with pytest.raises(BackendUnavailableError, match=r"text\.so"):
        open_acl_runtime(0, library_path=not_a_library)


def test_a_library_without_the_symbols_is_refused() -> None:
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if not libc:
        pytest.skip("no libc to load")
    with pytest.raises(BackendUnavailableError, match="lacks functions every CANN release") as info:
        open_acl_runtime(0, library_path=libc)
    assert "aclrtCreateContext" in str(info.value)


def test_an_empty_library_path_is_refused_not_the_process_itself() -> None:
    # dlopen("") is the running program: it "loaded", then lacked every ACL function
    with pytest.raises(ValueError, match="library_path is empty"):
        _acl.library_candidates("")
    with pytest.raises(ValueError, match="library_path is empty"):
        aa.device_count("acl", runtime_options={"library_path": ""})


def test_probe_finds_the_library_through_ascend_home_path(
    ctl: DoubleControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_double()
    monkeypatch.setenv("ASCEND_HOME_PATH", str(built.home))
    ok, reason = _acl.probe()
    assert ok, reason
    assert str(built.library) in reason
    assert "1 device" in reason
    assert _acl.library_candidates()[0] == str(built.library)
    ctl.set_device_count(0)
    try:
        ok, reason = _acl.probe()
    finally:
        ctl.set_device_count(1)
    assert not ok
    assert "no Ascend device" in reason


# --- fork -------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_refuses_clearly(rt: AclRuntime) -> None:
    def child() -> list[str]:  # pragma: no cover - runs in the child
        lines = []
        for attempt in (
            rt.create_stream,
            lambda: open_acl_runtime(0, library_path=rt.library_path),
        ):
            try:
                attempt()
                lines.append("no error")
            except BackendUnavailableError as exc:
                lines.append(f"refused: {exc}")
            except BaseException as exc:
                lines.append(f"wrong error: {type(exc).__name__}: {exc}")
        rt.close()  # must not touch ACL, must not raise
        lines.append("closed")
        return lines

    lines = in_forked_child(child)
    assert len(lines) == 3, lines
    assert all(line.startswith("refused: ") and "fork" in line for line in lines[:2]), lines
    assert lines[2] == "closed"
    # the parent is unaffected
    rt.destroy_stream(rt.create_stream())


# --- stream priorities, memset, info ---------------------------------------------------------


def test_a_priority_crosses_as_the_stream_attribute(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    mark = ctl.mark()
    stream = rt.create_stream(3)
    calls = [c for c in ctl.calls(mark) if c.name != "aclGetRecentErrMsg"]
    assert [c.name for c in calls] == [
        "aclrtDeviceGetStreamPriorityRange",
        "aclrtCreateStream",
        "aclrtSetStreamAttribute",
        "aclrtStreamGetId",  # for the exception reports (fault attribution)
    ]
    assert all(c.rc == 0 for c in calls)
    attr = calls[2]
    assert attr.args[:2] == (stream, _acl.ACL_STREAM_ATTR_PRIORITY)
    assert attr.args[2]  # a pointer to the value
    # the whole 16-byte union crossed: the priority as uint32 at offset 0, the rest zero
    assert ctl.last_stream_attr() == (5, struct.pack("<I", 3) + bytes(12))
    assert ctl.stream_priority(stream) == 3
    rt.synchronize_stream(stream, 1000)
    rt.destroy_stream(stream)
    assert ctl.stream_priority(stream) == -1


def test_no_priority_sets_no_attribute(kit: RuntimeKit, ctl: DoubleControl) -> None:
    mark = ctl.mark()
    stream = kit.rt.create_stream()
    assert [c.name for c in ctl.calls(mark)] == ["aclrtCreateStream", "aclrtStreamGetId"]
    assert ctl.stream_priority(stream) == 0  # the runtime's default
    stream = kit.rt.create_stream(None)
    assert ctl.calls(mark, "aclrtSetStreamAttribute") == []


def test_the_priority_range_is_the_runtimes(rt: AclRuntime, ctl: DoubleControl) -> None:
    mark = ctl.mark()
    assert rt.stream_priority_range() == (7, 0)
    call = _only(ctl.calls(mark, "aclrtDeviceGetStreamPriorityRange"))
    assert call.rc == 0
    assert call.args[0] and call.args[1]


@pytest.mark.parametrize("priority", [8, -1, 2**40])
def test_a_priority_out_of_range_never_creates_a_stream(
    rt: AclRuntime, ctl: DoubleControl, priority: int
) -> None:
    before = ctl.live_counts()["streams"]
    mark = ctl.mark()
    with pytest.raises(InvalidParamError, match=r"priority \(streamPriority\)") as info:
        rt.create_stream(priority)
    assert (info.value.code, info.value.func) == (107000, "aclrtSetStreamAttribute")
    assert "0..7" in info.value.message
    assert [c.name for c in ctl.calls(mark)] == ["aclrtDeviceGetStreamPriorityRange"]
    assert ctl.live_counts()["streams"] == before


def test_a_failed_priority_destroys_the_new_stream(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    before = ctl.live_counts()["streams"]
    ctl.inject_error("aclrtSetStreamAttribute", 107000, "EE1001: priority not supported")
    mark = ctl.mark()
    try:
        with pytest.raises(InvalidParamError, match="priority not supported"):
            rt.create_stream(2)
    finally:
        ctl.clear_injections()
    created = _only(ctl.calls(mark, "aclrtCreateStream"))
    assert created.rc == 0
    destroyed = _only(ctl.calls(mark, "aclrtDestroyStreamForce"))
    stream = destroyed.args[0]
    assert stream and destroyed.rc == 0
    assert ctl.stream_priority(stream) == -1
    assert ctl.live_counts()["streams"] == before
    assert stream not in rt._streams
    rt.close()  # nothing left to release twice
    assert rt.close_errors == ()


def _set_attribute(rt: AclRuntime, stream: int, attr: int, raw: bytes) -> None:
    value = ffi.AclrtStreamAttrValue.from_buffer_copy(raw)
    rt._fn["aclrtSetStreamAttribute"](stream, attr, ctypes.byref(value))


@pytest.mark.parametrize(
    ("attr", "raw", "message"),
    [
        (5, struct.pack("<I", 8) + bytes(12), "streamPriority 8"),
        (5, struct.pack("<I", 2**32 - 1) + bytes(12), "out of range"),
        (1, struct.pack("<Q", 2) + bytes(8), "failureMode 2"),
        (0, bytes(16), "unknown stream attribute 0"),
        (6, bytes(16), "unknown stream attribute 6"),
    ],
)
def test_the_double_checks_stream_attributes_like_cann(
    kit: RuntimeKit, attr: int, raw: bytes, message: str
) -> None:
    with pytest.raises(InvalidParamError, match=message) as info:
        _set_attribute(kit.rt, kit.stream, attr, raw)
    assert info.value.code == 107000


def test_the_double_accepts_the_other_stream_attributes(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    lenient = kit.rt.create_stream()
    for attr in (2, 3, 4):
        _set_attribute(kit.rt, lenient, attr, struct.pack("<I", 1) + bytes(12))
    # FAILURE_MODE through the attribute is aclrtSetStreamFailureMode: a fault is now sticky
    _set_attribute(kit.rt, lenient, 1, struct.pack("<Q", 1) + bytes(8))
    kit.launch("fault", HostArgs().u32(507035), stream=lenient)
    with pytest.raises(DeviceFaultError):
        kit.rt.synchronize_stream(lenient, 2000)
    assert ctl.context_fault(kit.rt.context) == 507035


def test_memset_crosses_with_its_arguments(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    ptr = kit.upload(np.zeros(16, F32))
    mark = ctl.mark()
    rt.memset_async(ptr + 8, 56, 0xA5, 40, kit.stream)
    call = _only(ctl.calls(mark, "aclrtMemsetAsync"))
    assert call.args == (ptr + 8, 56, 0xA5, 40, kit.stream)
    assert call.rc == 0
    raw = kit.download(ptr, 16).tobytes()
    assert raw == bytes(8) + b"\xa5" * 40 + bytes(16)


def test_memset_and_copies_run_in_stream_order(kit: RuntimeKit) -> None:
    rt = kit.rt
    ptr = kit.upload(np.ones(4, F32))
    kit.launch("sleep", HostArgs().u32(20_000))
    rt.memset_async(ptr, 16, 0, 16, kit.stream)
    data = np.full(2, 2.0, F32)
    rt.memcpy_async(ptr, 16, data.ctypes.data, 8, H2D, kit.stream)
    np.testing.assert_array_equal(kit.download(ptr, 4), np.array([2.0, 2.0, 0.0, 0.0], F32))


def test_a_memset_past_its_allocation_is_accepted_and_faults_when_it_runs(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    # The runtime checks only devPtr and count <= maxCount at the call (api_error.cc,
    # ApiErrorDecorator::MemsetAsync), as the double now does: the address is the device's
    # to find wrong (the double refused it at the call, which the real runtime never does)
    rt = kit.rt
    ptr = rt.malloc(64)
    rt.memset_async(ptr + 64, 0, 0, 0, kit.stream)  # nothing to set: nothing checked
    with pytest.raises(InvalidParamError) as refused:
        rt.memset_async(ptr, 8, 0, 16, kit.stream)  # count > maxCount
    assert refused.value.code == 107000
    rt.memset_async(ptr, 65, 0, 65, kit.stream)  # one byte past its end
    with pytest.raises(DeviceFaultError, match="not inside one live allocation") as info:
        rt.synchronize_stream(kit.stream, 2000)
    assert info.value.code == 507053
    assert ctl.context_fault(rt.context) == 507053


def test_memory_freed_before_a_memset_runs_faults_the_device(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    rt = kit.rt
    ptr = rt.malloc(64)
    kit.launch("sleep", HostArgs().u32(50_000))
    rt.memset_async(ptr, 64, 1, 64, kit.stream)
    rt.free(ptr)  # at once, while the memset is still queued
    with pytest.raises(DeviceFaultError, match="not inside one live allocation") as info:
        rt.synchronize_stream(kit.stream, 2000)
    assert info.value.code == 507053
    assert ctl.context_fault(rt.context) == 507053


def test_a_memset_after_a_fault_gets_the_fault(kit: RuntimeKit, ctl: DoubleControl) -> None:
    ptr = kit.rt.malloc(64)
    ctl.set_fault(kit.rt.context, 507015, "EZ9999: the first fault")
    with pytest.raises(AICoreExceptionError, match="the first fault") as info:
        kit.rt.memset_async(ptr, 64, 0, 64, kit.stream)
    assert info.value.func == "aclrtMemsetAsync"
    # later reports keep the first fault's text, as for the other submitting calls
    ctl.inject_error("aclrtMemsetAsync", 507015, "context is abnormal")
    with pytest.raises(AICoreExceptionError, match="the first fault"):
        kit.rt.memset_async(ptr, 64, 0, 64, kit.stream)
    kit.rt.free(ptr)  # cleanup keeps working


def test_info_reports_what_the_library_says(rt: AclRuntime, ctl: DoubleControl) -> None:
    used = ctl.mem_used(0)
    mark = ctl.mark()
    info = rt.info()
    assert info == {
        "runtime_version": "1.17.0",
        "cann_version": "9.1.0",
        "launch_path": "host_args",
        "memory_free": (32 << 30) - used,
        "memory_total": 32 << 30,
        "stream_priority_least": 7,
        "stream_priority_greatest": 0,
        "soc_name": "Ascend910B_double",
        "ai_core_count": 24,
        "cube_core_count": 24,
        "vector_core_count": 48,
        "library_path": str(build_double().library),
        # the host-args path submits runs of launches natively where the extension is built
        "native_submit": native_submit(),
    }
    mem = _only(ctl.calls(mark, "aclrtGetMemInfo"))
    assert mem.args[0] == _acl.ACL_HBM_MEM == 1
    assert mem.args[1] and mem.args[2]
    names = [c.name for c in ctl.calls(mark)]
    assert names == [
        "aclrtGetVersion",
        "aclrtGetMemInfo",
        "aclrtDeviceGetStreamPriorityRange",
        "aclrtGetSocName",
        "aclrtGetDeviceInfo",
        "aclrtGetDeviceInfo",
        "aclrtGetDeviceInfo",
    ]
    attrs = [c.args[1] for c in ctl.calls(mark, "aclrtGetDeviceInfo")]
    assert attrs == [101, 102, 201]  # ACL_DEV_ATTR_AICORE/CUBE/VECTOR_CORE_NUM


def test_device_memory_has_a_capacity(rt: AclRuntime, ctl: DoubleControl) -> None:
    used = ctl.mem_used(0)
    total = used + (1 << 20)
    ctl.set_mem_total(total)
    try:
        assert (rt.info()["memory_free"], rt.info()["memory_total"]) == (1 << 20, total)
        ptr = rt.malloc(1000)  # counted rounded up to 64 bytes
        assert rt.info()["memory_free"] == (1 << 20) - 1024
        with pytest.raises(MemoryAllocationError, match="cannot allocate") as info:
            rt.malloc(1 << 20)
        assert (info.value.code, info.value.func) == (207001, "aclrtMalloc")
        rt.free(ptr)
        rt.free(rt.malloc(1 << 20))  # everything free again: fits exactly
        assert rt.info()["memory_free"] == 1 << 20
    finally:
        ctl.set_mem_total(None)
    assert rt.info()["memory_total"] == 32 << 30


def test_the_double_refuses_memory_attributes_it_does_not_model(rt: AclRuntime) -> None:
    free, total = ctypes.c_size_t(1), ctypes.c_size_t(1)
    rt._fn["aclrtGetMemInfo"](0, ctypes.byref(free), ctypes.byref(total))  # ACL_DDR_MEM
    assert (free.value, total.value) == (0, 0)
    with pytest.raises(InvalidParamError, match="memory attribute 4"):
        rt._fn["aclrtGetMemInfo"](4, ctypes.byref(free), ctypes.byref(total))


def test_closed_runtimes_refuse_priorities_memset_and_info(ctl: DoubleControl) -> None:
    rt = open_acl_runtime(0, library_path=build_double().library)
    stream, ptr = rt.create_stream(), rt.malloc(64)
    rt.close()
    mark = ctl.mark()
    for call in (
        lambda: rt.create_stream(1),
        rt.stream_priority_range,
        lambda: rt.memset_async(ptr, 64, 0, 64, stream),
        rt.info,
    ):
        with pytest.raises(ClosedError):
            call()
    assert ctl.calls(mark) == []


# --- optional functions a library lacks -------------------------------------------------------


@pytest.fixture
def legacy() -> Iterator[AclRuntime]:
    """The backend on a double without the optional functions (an older CANN release)."""
    runtime = open_acl_runtime(0, library_path=build_legacy_double().library)
    try:
        yield runtime
    finally:
        runtime.close()


def test_a_library_without_the_optional_functions_still_opens(
    legacy: AclRuntime, make_kit: Callable[..., RuntimeKit]
) -> None:
    kit = make_kit(legacy, **KIT_OPTIONS)
    x = kit.upload(np.arange(4, dtype=F32))
    np.testing.assert_array_equal(kit.download(x, 4), np.arange(4, dtype=F32))
    legacy.destroy_stream(legacy.create_stream())
    assert legacy._library.missing == {
        "aclrtSetStreamAttribute", "aclrtDeviceGetStreamPriorityRange", "aclrtMemsetAsync",
        "aclrtGetVersion", "aclrtGetMemInfo", "aclrtGetSocName",
        "aclmdlRICaptureBegin", "aclmdlRICaptureEnd", "aclmdlRIExecuteAsync", "aclmdlRIDestroy",
        "aclrtGetThreadLastTaskId", "aclrtSynchronizeDeviceWithTimeout",
        "aclrtExceptionInfoCallbackRegister", "aclrtExceptionInfoCallbackUnregister",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("symbol", "call"),
    [
        ("aclrtDeviceGetStreamPriorityRange", lambda rt: rt.stream_priority_range()),
        ("aclrtDeviceGetStreamPriorityRange", lambda rt: rt.create_stream(0)),
        ("aclrtMemsetAsync", lambda rt: rt.memset_async(rt.malloc(64), 64, 0, 64, 1)),
    ],
)
def test_a_missing_optional_function_is_named_with_the_library(
    legacy: AclRuntime, symbol: str, call: Callable[[AclRuntime], object]
) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        call(legacy)
    assert info.value.func == symbol
    assert symbol in str(info.value)
    assert str(build_legacy_double().library) in str(info.value)


def test_a_missing_set_attribute_leaves_no_stream(
    rt: AclRuntime, ctl: DoubleControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a library with the range query but without aclrtSetStreamAttribute: the stand-in the
    # loader puts in place of a missing symbol, in an otherwise complete table
    from aio_ascend._runtime.acl.library import _missing_function

    # (in the table itself: a copy would hold only the symbols bound so far in this process,
    # and the test failed whenever it ran before anything had bound the priority range query)
    missing = _missing_function("aclrtSetStreamAttribute", rt.library_path)
    monkeypatch.setitem(rt._fn, "aclrtSetStreamAttribute", missing)
    before = ctl.live_counts()["streams"]
    with pytest.raises(BackendUnavailableError, match="aclrtSetStreamAttribute"):
        rt.create_stream(1)
    assert ctl.live_counts()["streams"] == before
    assert rt.create_stream() in rt._streams  # without a priority it needs no attribute


def test_info_says_none_for_what_the_library_cannot_tell(legacy: AclRuntime) -> None:
    info = legacy.info()
    for key in ("memory_free", "memory_total", "stream_priority_least", "soc_name"):
        assert info[key] is None, key
    assert info["runtime_version"] == info["cann_version"] == "9.1.0"


def test_a_closed_legacy_runtime_says_closed(legacy: AclRuntime) -> None:
    legacy.close()
    with pytest.raises(ClosedError):
        legacy.info()


# --- graphs (model-RI capture) ---------------------------------------------------------------


def _model_ri(rt: AclRuntime, graph: int) -> int:
    model: int = rt.capture.graphs[graph]
    return model


def test_capture_begins_relaxed_and_the_model_round_trips(
    kit: RuntimeKit, ctl: DoubleControl
) -> None:
    rt, stream = kit.rt, kit.stream
    n = 8
    x, y = kit.upload(np.arange(n, dtype=F32)), rt.malloc(4 * n)
    rt.synchronize_stream(stream, 5000)
    mark = ctl.mark()
    rt.begin_capture(stream)
    (begin,) = ctl.calls(mark, "aclmdlRICaptureBegin")
    assert begin.args == (stream, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED) and begin.rc == 0
    kit.launch("scale", HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, 2.0)))
    rt.memset_async(x, 4 * n, 0, 4, stream)  # x[0] = 0 from the first replay on
    graph = rt.end_capture(stream)
    (end,) = ctl.calls(mark, "aclmdlRICaptureEnd")
    assert end.args[0] == stream and end.args[1] != 0 and end.rc == 0
    model = _model_ri(rt, graph)
    assert model != graph  # the backend's own handle: a destroyed one never aliases a model
    assert ctl.model_tasks(model) == (2, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    assert ctl.live_counts()["models"] == 1
    rt.synchronize_stream(stream, 5000)
    assert kit.download(y, n).tolist() == [0.0] * n  # recorded, not run
    other = rt.create_stream()
    mark = ctl.mark()
    rt.launch_graph(graph, other)
    rt.launch_graph(graph, other)
    assert [c.args for c in ctl.calls(mark, "aclmdlRIExecuteAsync")] == [(model, other)] * 2
    rt.synchronize_stream(other, 5000)
    expected = 2.0 * np.arange(n, dtype=F32)
    expected[0] = 0.0
    np.testing.assert_array_equal(kit.download(y, n), expected)
    mark = ctl.mark()
    rt.destroy_graph(graph)
    assert [c.args for c in ctl.calls(mark, "aclmdlRIDestroy")] == [(model,)]
    assert ctl.live_counts()["models"] == 0 and not rt.capture.graphs
    rt.destroy_stream(other)


def test_a_capturing_stream_refuses_before_the_runtime(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt, stream = kit.rt, kit.stream
    event = rt.create_event(abi.ACL_EVENT_SYNC)
    buf = rt.malloc(16)
    pageable = np.zeros(16, np.uint8)
    pinned = rt.malloc_host(16)
    rt.begin_capture(stream)
    graph_other = rt.end_capture(stream)  # an empty model to replay
    rt.begin_capture(stream)
    mark = ctl.mark()
    refused: list[Callable[[], object]] = [
        lambda: rt.record_event(event, stream),
        lambda: rt.stream_wait_event(stream, event),
        lambda: rt.synchronize_stream(stream, 5000),
        lambda: rt.memcpy_async(buf, 16, pageable.ctypes.data, 16, H2D, stream),
        lambda: rt.memcpy_async(pageable.ctypes.data, 16, buf, 16, D2H, stream),
        lambda: rt.launch_graph(graph_other, stream),
        lambda: rt.begin_capture(stream),
    ]
    for call in refused:
        with pytest.raises(InvalidParamError, match="capturing"):
            call()
    assert ctl.calls(mark) == []  # nothing reached ACL
    rt.memcpy_async(buf, 16, pinned, 16, H2D, stream)  # pinned: recorded
    rt.memcpy_async(pinned, 16, buf, 16, D2H, stream)
    graph = rt.end_capture(stream)
    assert ctl.model_tasks(_model_ri(rt, graph)) == (2, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    with pytest.raises(InvalidParamError, match="not capturing"):
        rt.end_capture(stream)
    rt.record_event(event, stream)  # usable again
    rt.synchronize_event(event, 5000)
    for handle in (graph, graph_other):
        rt.destroy_graph(handle)
    rt.destroy_event(event)
    rt.free_host(pinned)


@pytest.mark.runtime_source
def test_the_double_refuses_what_a_capture_cannot_hold(kit: RuntimeKit, ctl: DoubleControl) -> None:
    """The double's own answers on a capturing stream (the calls made straight through the
    bindings), as the runtime's source gives them: a sync or a second begin is refused with
    107027, a pageable copy with 107000, an event record and wait are captured."""
    rt, stream, fn = kit.rt, kit.stream, kit.rt._fn
    event = rt.create_event(abi.ACL_EVENT_SYNC)
    buf, pageable = rt.malloc(16), np.zeros(16, np.uint8)
    fn["aclmdlRICaptureBegin"](stream, abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    captured, invalid = abi.ACL_ERROR_RT_STREAM_CAPTURED, abi.ACL_ERROR_RT_PARAM_INVALID
    relaxed = abi.ACL_MODEL_RI_CAPTURE_MODE_RELAXED
    for name, args, code in (
        ("aclrtSynchronizeStreamWithTimeout", (stream, 1000), captured),
        ("aclrtMemcpyAsync", (buf, 16, pageable.ctypes.data, 16, H2D, stream), invalid),
        ("aclmdlRICaptureBegin", (stream, relaxed), captured),
        ("aclrtDestroyStream", (stream,), captured),
    ):
        with pytest.raises(RuntimeAPIError) as info:
            fn[name](*args)
        assert info.value.code == code, name
    fn["aclrtRecordEvent"](event, stream)  # captured, not refused
    fn["aclrtStreamWaitEvent"](stream, event)
    model = ctypes.c_void_p()
    fn["aclmdlRICaptureEnd"](stream, ctypes.byref(model))
    assert model.value and ctl.model_tasks(model.value) == (2, 2)
    with pytest.raises(CaptureError) as not_capturing:
        fn["aclmdlRICaptureEnd"](stream, ctypes.byref(model))
    assert not_capturing.value.code == abi.ACL_ERROR_RT_STREAM_NOT_CAPTURED
    with pytest.raises(InvalidParamError):
        fn["aclmdlRICaptureBegin"](stream, 3)  # not an aclmdlRICaptureMode
    fn["aclmdlRIDestroy"](model.value)
    with pytest.raises(InvalidHandleError):
        fn["aclmdlRIExecuteAsync"](model.value, stream)
    with pytest.raises(InvalidHandleError):
        fn["aclmdlRIDestroy"](model.value)
    rt.destroy_event(event)


def test_a_destroyed_graph_is_refused_before_acl(kit: RuntimeKit, ctl: DoubleControl) -> None:
    rt = kit.rt
    rt.begin_capture(kit.stream)
    graph = rt.end_capture(kit.stream)
    rt.destroy_graph(graph)
    mark = ctl.mark()
    with pytest.raises(InvalidHandleError):
        rt.launch_graph(graph, kit.stream)
    with pytest.raises(InvalidHandleError):
        rt.destroy_graph(graph)
    assert ctl.calls(mark) == []


def test_a_replay_that_faults_fails_the_stream(kit: RuntimeKit) -> None:
    rt = kit.rt
    rt.begin_capture(kit.stream)
    kit.launch("fault", HostArgs())
    graph = rt.end_capture(kit.stream)
    rt.launch_graph(graph, kit.stream)
    with pytest.raises(DeviceFaultError):
        rt.synchronize_stream(kit.stream, 5000)


def test_captures_and_graphs_left_open_go_with_their_stream_and_close(ctl: DoubleControl) -> None:
    rt = open_acl_runtime(0, library_path=build_double().library)
    before = ctl.live_counts()["models"]
    stream = rt.create_stream()
    rt.begin_capture(stream)
    rt.destroy_stream(stream)  # its capture is ended and the model destroyed first
    assert ctl.live_counts()["models"] == before and not rt._capturing
    kept, capturing = rt.create_stream(), rt.create_stream()
    rt.begin_capture(kept)
    rt.end_capture(kept)
    rt.begin_capture(capturing)
    assert ctl.live_counts()["models"] == before + 1
    mark = ctl.mark()
    rt.close()
    assert rt.close_errors == ()
    names = [call.name for call in ctl.calls(mark)]
    assert names.index("aclmdlRIDestroy") < names.index("aclrtDestroyStreamForce")
    assert ctl.live_counts()["models"] == before


@pytest.mark.parametrize("persona", ["8.3", "8.5"])
def test_a_captured_launch_with_placeholders_replays_on_each_path(
    persona: str, make_kit: Callable[..., RuntimeKit]
) -> None:
    """8.3: the args-handle path (aclrtLaunchKernelWithConfig inside the capture); 8.5: host
    args. The placeholder data is read from the capture's copy at every replay."""
    rt = open_acl_runtime(0, library_path=build_double(persona).library)
    try:
        kit = make_kit(rt, **KIT_OPTIONS)
        n = 8
        x, y = kit.upload(np.arange(n, dtype=F32)), rt.malloc(4 * n)
        rt.begin_capture(kit.stream)
        args = HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, 3.0))
        addr = kit.launch("scale", args)
        graph = rt.end_capture(kit.stream)
        ctypes.memset(addr, 0, args.nbytes)  # the runtime copied the args during the call
        for _ in range(2):
            rt.launch_graph(graph, kit.stream)
        np.testing.assert_array_equal(kit.download(y, n), 3.0 * np.arange(n, dtype=F32))
        rt.destroy_graph(graph)
    finally:
        rt.close()


def test_a_library_without_model_ri_refuses_capture_naming_the_symbol(legacy: AclRuntime) -> None:
    stream = legacy.create_stream()
    with pytest.raises(BackendUnavailableError) as info:
        legacy.begin_capture(stream)
    assert info.value.func == "aclmdlRICaptureBegin"
    assert "aclmdlRICaptureBegin" in str(info.value)
    assert str(build_legacy_double().library) in str(info.value)
    assert not legacy._capturing
    event = legacy.create_event(abi.ACL_EVENT_SYNC)
    legacy.record_event(event, stream)  # the stream is not capturing
    legacy.synchronize_event(event, 5000)
    legacy.destroy_event(event)
    legacy.destroy_stream(stream)


def test_a_builtins_path_naming_no_file_is_file_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$AIO_ASCEND_ACL_BUILTINS`` naming no file is refused as a missing file before the
    runtime is called, as a path given to ``load_binary`` is."""
    from aio_ascend._runtime.acl.runtime import ENV_BUILTINS

    rt = open_acl_runtime(0, library_path=build_double().library)
    try:
        monkeypatch.setenv(ENV_BUILTINS, str(tmp_path / "missing.o"))
        with pytest.raises(FileNotFoundError, match="no kernel binary at"):
            rt.load_binary(None)
    finally:
        rt.close()
