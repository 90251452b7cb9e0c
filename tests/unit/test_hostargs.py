"""HostArgs and LaunchConfig: layout against an independent reference model, validation."""

from __future__ import annotations

import itertools
import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aio_ascend import HostArgs, LaunchConfig
from aio_ascend._launch_config import LAUNCH_ATTR_SIZE, LaunchAttrId

# --- an independent reference model of the layout -----------------------------------------

_SCALARS: dict[str, tuple[str, int, Any]] = {
    # kind: (struct format, size == alignment, strategy)
    "u8": ("<B", 1, st.integers(0, 2**8 - 1)),
    "u16": ("<H", 2, st.integers(0, 2**16 - 1)),
    "u32": ("<I", 4, st.integers(0, 2**32 - 1)),
    "u64": ("<Q", 8, st.integers(0, 2**64 - 1)),
    "i8": ("<b", 1, st.integers(-(2**7), 2**7 - 1)),
    "i16": ("<h", 2, st.integers(-(2**15), 2**15 - 1)),
    "i32": ("<i", 4, st.integers(-(2**31), 2**31 - 1)),
    "i64": ("<q", 8, st.integers(-(2**63), 2**63 - 1)),
    "f32": ("<f", 4, st.floats(width=32, allow_nan=False)),
    "f64": ("<d", 8, st.floats(allow_nan=False)),
    "f16": ("<e", 2, st.floats(width=16, allow_nan=False)),
    "bool": ("<?", 1, st.booleans()),
    "ptr": ("<Q", 8, st.integers(0, 2**64 - 1)),
}

field_strategy = st.one_of(
    *[st.tuples(st.just(kind), strat) for kind, (_, _, strat) in _SCALARS.items()],
    st.tuples(
        st.just("placeholder"),
        st.tuples(st.binary(min_size=1, max_size=40), st.sampled_from([8, 16, 32, 64])),
    ),
    st.tuples(
        st.just("raw"), st.tuples(st.binary(min_size=1, max_size=24), st.sampled_from([1, 2, 4, 8]))
    ),
)


def _unpack_attrs(data: bytes) -> dict[int, bytes]:
    """Decode an ``aclrtLaunchKernelAttr`` array (20 bytes each: u32 id, 16 value bytes)."""
    assert len(data) % LAUNCH_ATTR_SIZE == 0
    return {
        struct.unpack_from("<I", data, offset)[0]: data[offset + 4 : offset + LAUNCH_ATTR_SIZE]
        for offset in range(0, len(data), LAUNCH_ATTR_SIZE)
    }


#: the smallest alignment of an argument per layout (docs/cann-support.md §3: the Ascend C
#: compiler aligns to max(alignof, 4); aclrtKernelArgsAppend to 8; C to alignof)
_MIN = {"ascend": 4, "c": 1, "slots8": 8}
LAYOUTS = sorted(_MIN)


def reference_layout(
    fields: list[tuple[str, Any]], layout: str = "ascend"
) -> tuple[bytes, list[tuple[int, int]]]:
    """Walk the fields the way the docs describe, with no code shared with HostArgs."""
    floor = _MIN[layout]
    cursor = 0
    pieces: list[tuple[int, bytes]] = []
    tails: list[tuple[int, bytes, int]] = []
    for kind, value in fields:
        if kind == "placeholder":
            data, align = value
            cursor = -(-cursor // 8) * 8
            tails.append((cursor, data, align))
            cursor += 8
        elif kind == "raw":
            data, align = value
            align = max(align, floor)
            cursor = -(-cursor // align) * align
            pieces.append((cursor, data))
            cursor += len(data)
        else:
            fmt, size, _ = _SCALARS[kind]
            align = max(size, floor)
            cursor = -(-cursor // align) * align
            pieces.append((cursor, struct.pack(fmt, value)))
            cursor += size
    placeholders = []
    for slot, data, align in tails:
        cursor = -(-cursor // align) * align
        placeholders.append((slot, cursor))
        pieces.append((cursor, data))
        cursor += len(data)
    total = max(-(-cursor // 8) * 8, 8)
    image = bytearray(total)
    for offset, data in pieces:
        image[offset : offset + len(data)] = data
    return bytes(image), placeholders


def build(fields: list[tuple[str, Any]], layout: str = "ascend") -> HostArgs:
    args = HostArgs(layout=layout)
    for kind, value in fields:
        if kind == "placeholder":
            args.placeholder(value[0], align=value[1])
        elif kind == "raw":
            args.raw(value[0], align=value[1])
        else:
            getattr(args, kind)(value)
    return args


@settings(max_examples=300, deadline=None)
@given(st.lists(field_strategy, max_size=24), st.sampled_from(LAYOUTS))
def test_layout_matches_the_reference_model(fields: list[tuple[str, Any]], layout: str) -> None:
    args = build(fields, layout)
    image, placeholders = reference_layout(fields, layout)
    assert args.to_bytes() == image
    assert args.placeholders == placeholders
    assert args.nbytes == len(image) and args.nbytes % 8 == 0 and args.nbytes >= 8
    table = args.placeholder_table()
    assert len(table) == 8 * len(placeholders)
    assert [struct.unpack_from("<II", table, 8 * i) for i in range(len(placeholders))] == (
        placeholders
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(field_strategy, max_size=24))
def test_placeholders_never_overlap_and_fit(fields: list[tuple[str, Any]]) -> None:
    args = build(fields)
    sizes = [len(v[0]) for k, v in fields if k == "placeholder"]
    regions = []
    arg_end = max((a + 8 for a, _ in args.placeholders), default=0)
    for (addr, data), size in zip(args.placeholders, sizes, strict=True):
        assert addr % 8 == 0 and addr + 8 <= args.nbytes
        assert data % 8 == 0 and data + size <= args.nbytes
        assert data >= arg_end  # tail data after every argument slot
        regions.append((data, data + size))
    regions.sort()
    for (_, end), (start, _) in itertools.pairwise(regions):
        assert end <= start


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(set(_SCALARS) - {"bool"})), max_size=16), st.data())
def test_decoding_like_a_kernel_returns_the_values(kinds: list[str], data: Any) -> None:
    values = [data.draw(_SCALARS[k][2]) for k in kinds]
    args = build(list(zip(kinds, values, strict=True)))
    image = args.to_bytes()
    offset = 0
    for kind, value in zip(kinds, values, strict=True):
        fmt, size, _ = _SCALARS[kind]
        offset = -(-offset // max(size, 4)) * max(size, 4)
        (decoded,) = struct.unpack_from(fmt, image, offset)
        if kind.startswith("f"):
            expected = struct.unpack(fmt, struct.pack(fmt, value))[0]
            assert decoded == expected or (math.isnan(decoded) and math.isnan(expected))
        else:
            assert decoded == value
        offset += size


def test_empty_args_pack_to_eight_zero_bytes() -> None:
    args = HostArgs()
    assert args.nbytes == 8
    assert args.to_bytes() == b"\0" * 8
    assert args.placeholders == []


def test_typical_launch_layout() -> None:
    args = HostArgs().ptr(0x10).ptr(0x20).ptr(0x30).u32(7).f32(1.5).placeholder(b"t" * 16)
    assert args.placeholders == [(32, 64)]
    assert args.nbytes == 80
    image = args.to_bytes()
    assert struct.unpack_from("<QQQIf", image, 0) == (0x10, 0x20, 0x30, 7, 1.5)
    assert image[64:80] == b"t" * 16


@pytest.mark.parametrize(
    ("method", "value", "error"),
    [
        ("u32", 2**32, ValueError),
        ("u32", -1, ValueError),
        ("u8", 256, ValueError),
        ("i8", -129, ValueError),
        ("i64", 2**63, ValueError),
        ("u64", 2**64, ValueError),
        ("u32", float("nan"), TypeError),
        ("u32", 1.0, TypeError),
        ("u32", "1", TypeError),
        ("f32", float("1e39"), ValueError),
        ("f16", 1e6, ValueError),
        ("f32", "x", TypeError),
        ("bool", 1, TypeError),
        ("ptr", -1, ValueError),
        ("ptr", 2**64, ValueError),
        ("ptr", 1.5, TypeError),
    ],
)
def test_out_of_range_values_raise(method: str, value: Any, error: type[Exception]) -> None:
    args = HostArgs().u32(1)
    before = args.to_bytes()
    with pytest.raises(error, match=method):
        getattr(args, method)(value)
    assert args.to_bytes() == before  # nothing half-added


def test_size_and_placeholder_caps() -> None:
    with pytest.raises(ValueError, match="cap"):
        HostArgs(max_nbytes=64).raw(b"x" * 65)
    with pytest.raises(ValueError, match="cap"):
        HostArgs(max_nbytes=64).ptr(0).placeholder(b"x" * 40, align=32)
    capped = HostArgs(max_placeholders=2).placeholder(b"a").placeholder(b"b")
    with pytest.raises(ValueError, match="more than 2 placeholders"):
        capped.placeholder(b"c")
    with pytest.raises(ValueError, match="max_nbytes"):
        HostArgs(max_nbytes=2**32)
    with pytest.raises(ValueError, match="power of two"):
        HostArgs().placeholder(b"a", align=3)
    with pytest.raises(TypeError, match="placeholder"):
        HostArgs().placeholder("text")  # type: ignore[arg-type]


def test_ndarray_fields_and_pack_into() -> None:
    arr = np.arange(3, dtype=np.float64)
    args = HostArgs().u8(1).raw(arr).placeholder(np.array([1, 2], dtype=np.uint32))
    assert args.to_bytes()[8:32] == arr.tobytes()
    buf = bytearray(args.nbytes + 16)
    assert args.pack_into(buf, 16) == args.nbytes
    assert bytes(buf[16:]) == args.to_bytes()
    with pytest.raises(ValueError, match="do not fit"):
        args.pack_into(bytearray(4))
    with pytest.raises(TypeError, match="writable"):
        args.pack_into(b"\0" * 128)


def test_device_buffers_are_reported_for_lifetime_tracking() -> None:
    class Buf:
        ptr = 0x1234_5678_9ABC_0000

    b = Buf()
    args = HostArgs().ptr(b).ptr(0x40)
    assert args.buffers == (b,)
    assert struct.unpack_from("<Q", args.to_bytes())[0] == Buf.ptr


# --- LaunchConfig -------------------------------------------------------------------------


def test_launch_config_packs_the_c_layout() -> None:
    cfg = LaunchConfig(
        schedule_mode="batch",
        timeout_us=2**33 + 5,
        engine_type="aiv",
        block_dim_offset=3,
        prefetch_disabled=True,
        dump=False,
    )
    packed = cfg.pack_attrs()
    assert len(packed) == cfg.num_attrs * LAUNCH_ATTR_SIZE == 6 * 20
    attrs = _unpack_attrs(packed)
    assert attrs[LaunchAttrId.SCHEM_MODE][0] == 1
    assert struct.unpack_from("<II", attrs[LaunchAttrId.TIMEOUT_US]) == (5, 2)
    assert struct.unpack_from("<i", attrs[LaunchAttrId.ENGINE_TYPE])[0] == 1
    assert struct.unpack_from("<I", attrs[LaunchAttrId.BLOCKDIM_OFFSET])[0] == 3
    assert attrs[LaunchAttrId.BLOCK_TASK_PREFETCH][0] == 1
    assert attrs[LaunchAttrId.DATA_DUMP][0] == 0
    assert all(len(v) == 16 for v in attrs.values())
    assert LaunchConfig(timeout_s=30).attrs == ((LaunchAttrId.TIMEOUT, struct.pack("<H", 30)),)
    assert LaunchConfig().num_attrs == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"timeout_s": 1, "timeout_us": 1}, ValueError, "mutually exclusive"),
        ({"timeout_s": 2**16}, ValueError, "timeout_s"),
        ({"timeout_us": -1}, ValueError, "timeout_us"),
        ({"schedule_mode": 2}, ValueError, "schedule_mode"),
        ({"schedule_mode": "fast"}, ValueError, "schedule_mode"),
        ({"engine_type": "gpu"}, ValueError, "engine_type"),
        ({"prefetch_disabled": 1}, TypeError, "prefetch_disabled"),
        ({"block_dim": 0}, ValueError, "block_dim"),
        ({"block_dim_offset": 1.5}, TypeError, "block_dim_offset"),
        ({"timeout_s": float("nan")}, TypeError, "timeout_s"),
    ],
)
def test_launch_config_validation(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        LaunchConfig(**kwargs)


def test_launch_config_is_frozen_and_coerces_dicts() -> None:
    cfg = LaunchConfig.coerce({"schedule_mode": "normal"})
    assert cfg == LaunchConfig(schedule_mode="normal")
    with pytest.raises(AttributeError):
        cfg.timeout_s = 3  # type: ignore[misc, union-attr]
    with pytest.raises(TypeError, match="config"):
        LaunchConfig.coerce(3)  # type: ignore[arg-type]


# --- layouts (docs/cann-support.md §3) --------------------------------------------------------


def test_the_default_layout_is_the_ascend_c_compilers() -> None:
    # the VectorAddKernel of hicann/runtime's custom-kernel sample (cann-support.md §3.1):
    # (float* a, float* b, float* c, float alpha, uint32_t n): n at 28 (natural, min 4), not 32
    args = HostArgs().ptr(1).ptr(2).ptr(3).f32(0.5).u32(7)
    assert args.fields == [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)]
    slots8 = HostArgs(layout="slots8").ptr(1).ptr(2).ptr(3).f32(0.5).u32(7)
    assert slots8.fields == [(0, 8), (8, 8), (16, 8), (24, 4), (32, 4)]
    # small scalars: 4-aligned under the compiler's rule, packed under C's
    assert HostArgs().u8(1).u8(2).u16(3).fields == [(0, 1), (4, 1), (8, 2)]
    assert HostArgs(layout="c").u8(1).u8(2).u16(3).fields == [(0, 1), (1, 1), (2, 2)]
    # HCCL's AIV args: three u32 4 bytes apart after pointers (cann-support.md §3.3)
    hccl = HostArgs().ptr(0).u64(1).u64(2).u32(3).u32(4).u32(5)
    assert [offset for offset, _ in hccl.fields] == [0, 8, 16, 24, 28, 32]


def test_a_bad_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout='natural'"):
        HostArgs(layout="natural")
    with pytest.raises(TypeError):
        HostArgs(layout=4)  # type: ignore[arg-type]
    assert HostArgs(layout="slots8").layout.value == "slots8"
    assert "slots8" in repr(HostArgs(layout="slots8"))


def test_packing_for_a_function_adds_its_hidden_arguments() -> None:
    from aio_ascend._runtime.base import FunctionInfo

    args = HostArgs().ptr(0x10).ptr(0x20).ptr(0x30).u32(5).placeholder(b"tiling!!")
    info = FunctionInfo(prefix=(0xFF75,), suffix=(0x0F10,))
    packed = args.pack(info)
    assert struct.unpack_from("<QQQQI", packed.image, 0) == (0xFF75, 0x10, 0x20, 0x30, 5)
    # the slot after n (36 -> 40), the overflow address right after it (48), then the data
    assert packed.fields == ((8, 8), (16, 8), (24, 8), (32, 4), (40, 8))
    assert struct.unpack_from("<Q", packed.image, 48)[0] == 0x0F10
    ((slot, data),) = packed.placeholders
    assert slot == 40 and data == 64 and packed.image[64:72] == b"tiling!!"
    assert args.pack(info) is packed  # cached for the same info
    assert args.pack() is not packed and args.pack().fields == (
        (0, 8),
        (8, 8),
        (16, 8),
        (24, 4),
        (32, 8),
    )


def test_packing_for_the_args_handle_path_puts_data_right_after_the_arguments() -> None:
    from aio_ascend._runtime.base import FunctionInfo

    args = HostArgs().ptr(1).u32(2).placeholder(b"x" * 12, align=64)
    packed = args.pack(FunctionInfo(data_align=8))
    ((slot, data),) = packed.placeholders
    assert (slot, data) == (16, 24)  # not 64: the argument area must end where data starts


def test_packing_checks_the_declared_parameters() -> None:
    from aio_ascend._runtime.base import FunctionInfo

    info = FunctionInfo(params=((0, 8), (8, 8), (16, 8), (24, 4)))
    HostArgs().ptr(1).ptr(2).ptr(3).u32(4).pack(info)
    with pytest.raises(ValueError, match=r"3 argument.*declares 4 parameter"):
        HostArgs().ptr(1).ptr(2).ptr(3).pack(info)
    with pytest.raises(ValueError, match=r"argument 3 is 8 byte.*parameter 3 is 4 byte"):
        HostArgs().ptr(1).ptr(2).ptr(3).u64(4).pack(info)
