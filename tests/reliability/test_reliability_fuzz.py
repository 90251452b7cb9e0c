"""Reliability: hostile input, fuzzed with hypothesis against reference validators written here.

The promise: every invalid input raises the documented error (``ValueError``/``TypeError``
naming the field) before anything reaches the runtime -- the library's and the sim's launch and
copy counters do not move -- no valid input is rejected, and nothing writes outside a buffer
(host arrays are slices of guarded arrays, device buffers sit between canary allocations).

* ``HostArgs``: random sequences of builder calls with hostile values (out of range, wrong
  types, floats that overflow, bad alignments, size and placeholder caps); a refused call must
  leave the builder unchanged, and the final image must match the reference layout.
* Launches: random ``blocks``, ``config`` (``LaunchConfig`` fields or dicts) and args with
  placeholders, launched through a capture kernel that records what the device saw: the args
  bytes, the patched placeholder addresses and the data behind them.
* Copies: random sources/destinations (dtypes, shapes, strides, read-only, empty, oversized).

Async code under hypothesis: one event loop per test, run by hand around each example.
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Callable
from typing import Any

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reliability_helpers import (
    STRESS,
    open_tracked,
    report,
    sim_leak_check,  # noqa: F401 - fixture
    sim_peek,
    stress_timeout,
)

import aio_ascend as aa

pytestmark = pytest.mark.usefixtures("sim_leak_check")

FUZZ = settings(
    max_examples=1000 if STRESS else 200,
    deadline=None,
    derandomize=not STRESS,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- the reference validator and layout ------------------------------------------------------

_INTS: dict[str, tuple[str, int, int]] = {
    "u8": ("<B", 0, 2**8 - 1),
    "u16": ("<H", 0, 2**16 - 1),
    "u32": ("<I", 0, 2**32 - 1),
    "u64": ("<Q", 0, 2**64 - 1),
    "i8": ("<b", -(2**7), 2**7 - 1),
    "i16": ("<h", -(2**15), 2**15 - 1),
    "i32": ("<i", -(2**31), 2**31 - 1),
    "i64": ("<q", -(2**63), 2**63 - 1),
}
_FLOATS: dict[str, type[np.floating[Any]]] = {
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
}


class Invalid(Exception):
    """The reference says the call is invalid: ``types`` it may raise, ``field`` to be named."""

    def __init__(self, types: tuple[type[Exception], ...], field: str) -> None:
        super().__init__(field)
        self.types = types
        self.field = field


def _ref_align(field: str, align: object) -> int:
    if isinstance(align, bool) or not isinstance(align, int):
        raise Invalid((TypeError,), field)
    if align < 1 or align > 4096 or align & (align - 1):
        raise Invalid((ValueError,), field)
    return align


def _ref_payload(field: str, data: object) -> bytes:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).tobytes()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise Invalid((TypeError,), field)


class RefArgs:
    """What the docs promise about HostArgs, written without looking at its code paths."""

    def __init__(self, max_nbytes: int = 64 * 1024, max_placeholders: int = 128) -> None:
        self.max_nbytes = max_nbytes
        self.max_placeholders = max_placeholders
        self.fields: list[tuple[int, bytes]] = []
        self.cursor = 0
        self.tail: list[tuple[int, bytes, int]] = []  # slot, data, align

    @staticmethod
    def _size(cursor: int, tail: list[tuple[int, bytes, int]]) -> int:
        end = cursor
        for _, data, align in tail:
            end = -(-end // align) * align + len(data)
        return max(-(-end // 8) * 8, 8)

    def apply(self, kind: str, value: Any, align: Any = None) -> None:
        """Apply one builder call, or raise ``Invalid`` (leaving the model unchanged)."""
        field = f"HostArgs.{kind}"
        tail = self.tail
        if kind == "ptr":
            if value is None:
                value = 0
            if isinstance(value, bool) or not isinstance(value, int):
                raise Invalid((TypeError,), field)
            if not 0 <= value < 2**64:
                raise Invalid((ValueError,), field)
            data, al = struct.pack("<Q", value), 8
        elif kind in _INTS:
            fmt, low, high = _INTS[kind]
            if isinstance(value, float | np.floating) or not isinstance(value, int | np.integer):
                raise Invalid((TypeError,), field)
            if not low <= int(value) <= high:
                raise Invalid((ValueError,), field)
            data = struct.pack(fmt, int(value))
            al = len(data)
        elif kind in _FLOATS:
            if isinstance(value, bool | np.bool_) or not isinstance(
                value, int | float | np.integer | np.floating
            ):
                raise Invalid((TypeError,), field)
            try:
                as_float = float(value)
            except OverflowError:  # an int beyond the float range
                raise Invalid((ValueError,), field) from None
            with np.errstate(over="ignore"):
                typed = _FLOATS[kind](as_float)
            if math.isfinite(as_float) and not np.isfinite(typed):
                raise Invalid((ValueError,), field)
            data = typed.astype(typed.dtype.newbyteorder("<")).tobytes()
            al = len(data)
        elif kind == "bool":
            if not isinstance(value, bool | np.bool_):
                raise Invalid((TypeError,), field)
            data, al = bytes([bool(value)]), 1
        elif kind == "raw":
            al = _ref_align(field, align)
            data = _ref_payload(field, value)
            if isinstance(value, np.ndarray):
                al = max(al, value.dtype.alignment)
        elif kind == "placeholder":
            al = max(_ref_align(field, align), 8)
            data = _ref_payload(field, value)
            if not data:  # its dataOffset would equal argsSize: the runtime refuses that
                raise Invalid((ValueError,), field)
            if len(tail) >= self.max_placeholders:
                raise Invalid((ValueError,), field)
            slot = -(-self.cursor // 8) * 8
            new_tail = [*tail, (slot, data, al)]
            if self._size(slot + 8, new_tail) > self.max_nbytes:
                raise Invalid((ValueError,), field)
            self.fields.append((slot, b"\0" * 8))
            self.cursor = slot + 8
            self.tail = new_tail
            return
        else:  # pragma: no cover
            raise AssertionError(kind)
        al = max(al, 4)  # the default layout: the Ascend C compiler's, at least 4-aligned
        offset = -(-self.cursor // al) * al
        if self._size(offset + len(data), tail) > self.max_nbytes:
            raise Invalid((ValueError,), field)
        self.fields.append((offset, data))
        self.cursor = offset + len(data)

    def layout(self) -> tuple[bytes, list[tuple[int, int, bytes]]]:
        """(image with zero slots, [(slot, data offset, data)])."""
        end = self.cursor
        places = []
        for slot, data, align in self.tail:
            end = -(-end // align) * align
            places.append((slot, end, data))
            end += len(data)
        image = bytearray(max(-(-end // 8) * 8, 8))
        for offset, data in self.fields:
            image[offset : offset + len(data)] = data
        for _, offset, data in places:
            image[offset : offset + len(data)] = data
        return bytes(image), places


def _call(args: aa.HostArgs, kind: str, value: Any, align: Any) -> None:
    method = getattr(args, kind)
    if kind in ("raw", "placeholder"):
        method(value, align=align)
    else:
        method(value)


# --- strategies ------------------------------------------------------------------------------

_junk = st.sampled_from([None, "7", b"\x01", 1.5, [1], object()])
_aligns = st.one_of(
    st.sampled_from([1, 2, 4, 8, 16, 32, 64, 4096]),
    st.sampled_from([0, -8, 3, 24, 8192, True, 8.0, "8", None]),
)
_arrays = hnp.arrays(
    dtype=st.sampled_from([np.uint8, np.int16, np.float32, np.float64, np.complex64]),
    shape=hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5),
).map(lambda a: a[::2] if a.ndim == 1 and a.shape[0] > 2 else a)  # some non-contiguous
_payloads = st.one_of(
    st.binary(min_size=1, max_size=48), st.builds(bytearray, st.binary(min_size=1, max_size=8))
)


def _int_values(kind: str) -> st.SearchStrategy[Any]:
    _, low, high = _INTS[kind]
    return st.one_of(
        st.integers(low, high),
        st.integers(low - 1000, low - 1) | st.integers(high + 1, high + 1000),
        st.integers(-(2**80), 2**80),
        st.sampled_from([np.int64(-1), np.uint8(7), np.uint64(2**64 - 1), np.float32(1.0)]),
        st.floats(allow_nan=False),
        _junk,
    )


def _float_values(kind: str) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.floats(allow_nan=False),
        st.sampled_from([65504.0, 65519.0, 65520.0, 3.4028235e38, 3.5e38, -1e39, math.inf]),
        st.integers(-(2**1000), 2**1000),
        st.integers(-(2**1100), 2**1100),  # also beyond the float range
        st.sampled_from([np.float64(1e300), np.float32(2.5), np.int32(-3)]),
        st.sampled_from([True, np.bool_(False)]),
        _junk,
    )


_op = st.one_of(
    st.tuples(
        st.just("ptr"),
        st.one_of(st.none(), st.integers(-(2**65), 2**65), st.sampled_from([True, 1.0, "0x10"])),
        st.none(),
    ),
    *[st.tuples(st.just(k), _int_values(k), st.none()) for k in _INTS],
    *[st.tuples(st.just(k), _float_values(k), st.none()) for k in _FLOATS],
    st.tuples(st.just("bool"), st.one_of(st.booleans(), st.sampled_from([0, 1, None])), st.none()),
    st.tuples(st.just("raw"), st.one_of(_payloads, _arrays, st.just(b""), _junk), _aligns),
    st.tuples(
        st.just("placeholder"),
        st.one_of(_payloads, _arrays, st.sampled_from([b"", np.zeros(0, np.float32)]), _junk),
        _aligns,
    ),
)


# --- HostArgs --------------------------------------------------------------------------------


@stress_timeout
@FUZZ
@given(
    ops=st.lists(_op, max_size=20),
    max_nbytes=st.one_of(st.just(64 * 1024), st.integers(8, 400)),
    max_placeholders=st.integers(0, 4) | st.just(128),
)
def test_hostargs_against_the_reference_validator(
    ops: list[tuple[str, Any, Any]], max_nbytes: int, max_placeholders: int
) -> None:
    args = aa.HostArgs(max_nbytes=max_nbytes, max_placeholders=max_placeholders)
    ref = RefArgs(max_nbytes, max_placeholders)
    for kind, value, align in ops:
        before = (args.to_bytes(), args.placeholder_table())
        invalid: Invalid | None = None
        try:
            ref.apply(kind, value, align)
        except Invalid as exc:
            invalid = exc
        if invalid is not None:
            with pytest.raises(invalid.types) as info:
                _call(args, kind, value, align)
            assert invalid.field.split(" ")[0] in str(info.value), (kind, str(info.value))
            # a refused call leaves the builder as it was
            assert (args.to_bytes(), args.placeholder_table()) == before
            _STATS["refused"] += 1
        else:
            _call(args, kind, value, align)  # a valid call is never refused
            _STATS["accepted"] += 1
    image, places = ref.layout()
    assert args.nbytes == len(image)
    assert args.to_bytes() == image
    assert args.placeholders == [(slot, offset) for slot, offset, _ in places]
    table = b"".join(struct.pack("<II", slot, offset) for slot, offset, _ in places)
    assert args.placeholder_table() == table


@FUZZ
@given(
    max_nbytes=st.one_of(st.integers(-10, 2**33), st.sampled_from([True, 8.0, "64", None])),
    max_placeholders=st.one_of(st.integers(-5, 300), st.sampled_from([False, 1.0, None])),
)
def test_hostargs_caps_against_the_reference(max_nbytes: Any, max_placeholders: Any) -> None:
    problems: list[tuple[type[Exception], str]] = []
    if isinstance(max_nbytes, bool) or not isinstance(max_nbytes, int):
        problems.append((TypeError, "max_nbytes"))
    elif not 8 <= max_nbytes <= 2**32 - 1:
        problems.append((ValueError, "max_nbytes"))
    if isinstance(max_placeholders, bool) or not isinstance(max_placeholders, int):
        problems.append((TypeError, "max_placeholders"))
    elif not 0 <= max_placeholders <= 128:  # the runtime's placeholder limit
        problems.append((ValueError, "max_placeholders"))
    if not problems:
        aa.HostArgs(max_nbytes=max_nbytes, max_placeholders=max_placeholders)
        return
    with pytest.raises((TypeError, ValueError)) as info:
        aa.HostArgs(max_nbytes=max_nbytes, max_placeholders=max_placeholders)
    assert any(
        isinstance(info.value, kind) and name in str(info.value) for kind, name in problems
    ), (problems, info.value)


@pytest.mark.parametrize("kind", ["f16", "f32", "f64"])
def test_float_fields_refuse_huge_ints(kind: str) -> None:
    # Regression (found by this suite): OverflowError from float(value), not ValueError
    with pytest.raises(ValueError, match=f"HostArgs.{kind}"):
        getattr(aa.HostArgs(), kind)(10**400)


# --- launches through a capture kernel -------------------------------------------------------

_capture = aa.sim.KernelLibrary("capture")
_SEEN: dict[int, dict[str, Any]] = {}
_EXPECT: dict[int, list[tuple[int, int]]] = {}  # token -> [(slot offset, data length)]
_STATS: dict[str, int] = dict.fromkeys(
    (
        "refused",
        "accepted",
        "launches_valid",
        "launches_invalid",
        "copies_valid",
        "copies_invalid",
        "guard_bytes_checked",
    ),
    0,
)


@_capture.kernel("capture")
def _capture_kernel(ctx: Any) -> None:
    (token,) = ctx.unpack("<Q", 0)
    seen = {"blocks": ctx.blocks, "args": ctx.args, "args_addr": ctx.args_addr, "data": []}
    for slot, length in _EXPECT.pop(token, []):
        seen["data"].append(ctx.read(ctx.ptr(slot), length) if length else b"")
    _SEEN[token] = seen


def _run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, 10))


async def _open_with_stream() -> tuple[aa.Device, aa.Stream]:
    dev = await open_tracked(debug=True)
    return dev, dev.stream()


_CONFIG_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "schedule_mode": st.one_of(st.sampled_from(["normal", "batch", "fast", 0, 1, 2, True, None])),
    "timeout_s": st.one_of(st.integers(-2, 2**16 + 2), st.sampled_from([1.0, None, "5"])),
    "timeout_us": st.one_of(st.integers(-2, 2**64 + 2), st.sampled_from([2.5, None])),
    "block_dim_offset": st.one_of(st.integers(-1, 2**32 + 1), st.just(None)),
    "engine_type": st.sampled_from(["aic", "aiv", "gpu", 0, 1, 5, None, False]),
    "prefetch_disabled": st.sampled_from([True, False, None, 1, "yes"]),
    "dump": st.sampled_from([True, False, None, 0]),
    "dyn_ubuf_size": st.one_of(st.integers(-1, 2**32 + 1), st.just(None)),
    "block_dim": st.one_of(st.integers(-1, 1100), st.just(None), st.just(2**32)),
    "no_such_field": st.just(1),
}


def _ref_uint(value: Any, bits: int) -> type[Exception] | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return TypeError
    return None if 0 <= value < 2**bits else ValueError


def _ref_choice(value: Any, names: dict[str, int]) -> type[Exception] | None:
    if isinstance(value, str):
        return None if value in names else ValueError
    err = _ref_uint(value, 32)
    if err is not None:
        return err
    return None if value in names.values() else ValueError


def _ref_config(fields: dict[str, Any]) -> list[tuple[type[Exception], str]]:
    """The problems the reference sees in LaunchConfig(**fields) (empty: valid)."""
    problems: list[tuple[type[Exception], str]] = []
    checks: dict[str, Callable[[Any], type[Exception] | None]] = {
        "schedule_mode": lambda v: _ref_choice(v, {"normal": 0, "batch": 1}),
        "timeout_s": lambda v: _ref_uint(v, 16),
        "timeout_us": lambda v: _ref_uint(v, 64),
        "block_dim_offset": lambda v: _ref_uint(v, 32),
        "engine_type": lambda v: _ref_choice(v, {"aic": 0, "aiv": 1}),
        "prefetch_disabled": lambda v: None if isinstance(v, bool) else TypeError,
        "dump": lambda v: None if isinstance(v, bool) else TypeError,
        "dyn_ubuf_size": lambda v: _ref_uint(v, 32),
        "block_dim": lambda v: _ref_uint(v, 32) or (None if 1 <= v <= 1024 else ValueError),
    }
    for name, value in fields.items():
        if name not in checks:
            problems.append((TypeError, name))
        elif value is not None and (err := checks[name](value)) is not None:
            problems.append((err, name))
    if fields.get("timeout_s") is not None and fields.get("timeout_us") is not None:
        problems.append((ValueError, "timeout_"))
    return problems


_blocks = st.one_of(
    st.integers(1, 65535),
    st.integers(-3, 0) | st.integers(65536, 70000),
    st.sampled_from([True, 1.0, "1", None, np.int32(4), np.int64(70000), np.bool_(True)]),
)


@stress_timeout
def test_launch_fuzz_against_the_reference() -> None:
    loop = asyncio.new_event_loop()
    try:
        dev, stream = _run(loop, _open_with_stream())
        sim = dev.runtime
        fn = dev.load_module(_capture).function("capture")
        bufs = [dev.malloc(64) for _ in range(3)]
        tokens = iter(range(1, 1 << 62))

        @FUZZ
        @given(
            ops=st.lists(
                st.one_of(
                    st.tuples(st.just("placeholder"), _payloads, st.sampled_from([8, 16, 32, 64])),
                    st.tuples(st.just("u32"), st.integers(0, 2**32 - 1), st.none()),
                    st.tuples(st.just("f16"), st.floats(width=16, allow_nan=False), st.none()),
                    st.tuples(st.just("raw"), _payloads, st.sampled_from([1, 4, 8, 32])),
                    st.tuples(st.just("buf"), st.integers(0, 2), st.none()),
                ),
                max_size=10,
            ),
            blocks=_blocks,
            config=st.one_of(
                st.none(),
                st.dictionaries(
                    st.sampled_from(sorted(_CONFIG_FIELDS)), st.just(0), max_size=3
                ).flatmap(lambda d: st.fixed_dictionaries({k: _CONFIG_FIELDS[k] for k in d})),
                st.sampled_from(["config", 7]),
            ),
            as_object=st.booleans(),
        )
        # numpy's integers are block counts, its bools are not: in every run
        @hypothesis.example(ops=[], blocks=np.int32(4), config=None, as_object=False)
        @hypothesis.example(ops=[], blocks=np.bool_(True), config=None, as_object=False)
        def example(
            ops: list[tuple[str, Any, Any]], blocks: Any, config: Any, as_object: bool
        ) -> None:
            token = next(tokens)
            args = aa.HostArgs().u64(token)
            ref = RefArgs()
            ref.apply("u64", token)
            for kind, value, align in ops:
                if kind == "buf":
                    args.ptr(bufs[value])
                    ref.apply("ptr", bufs[value].ptr)
                    continue
                try:
                    ref.apply(kind, value, align)
                except Invalid:
                    continue  # builder refusals: test_hostargs_against_the_reference_validator
                _call(args, kind, value, align)
            problems: list[tuple[type[Exception], str]] = []
            # any integer type (numpy's too), never a bool
            if isinstance(blocks, bool | np.bool_) or not isinstance(blocks, int | np.integer):
                problems.append((TypeError, "blocks"))
            elif not 1 <= blocks <= 65535:
                problems.append((ValueError, "blocks"))
            cfg: Any = config
            if isinstance(config, dict):
                config_problems = _ref_config(config)
                if as_object and not config_problems:
                    cfg = aa.LaunchConfig(**config)
                problems += config_problems
            elif config is not None:
                problems.append((TypeError, "config"))
            image, places = ref.layout()
            _EXPECT[token] = [(slot, len(data)) for slot, _, data in places]
            before = (dev.stats()["launches"], sim.counters["launches"])  # type: ignore[attr-defined]

            async def go() -> Any:
                task = await stream.launch(fn, blocks, args, config=cfg)
                await task
                return task

            if problems:
                _EXPECT.pop(token)
                with pytest.raises((TypeError, ValueError)) as info:
                    _run(loop, go())
                _run(loop, asyncio.sleep(0.001))  # a loop tick: nothing was queued either
                after = (dev.stats()["launches"], sim.counters["launches"])  # type: ignore[attr-defined]
                assert after == before, (problems, info.value)
                assert not isinstance(info.value, aa.AscendError), info.value  # not the runtime
                assert any(
                    isinstance(info.value, kind) and name in str(info.value)
                    for kind, name in problems
                ), (problems, info.value)
                _STATS["launches_invalid"] += 1
                return
            _run(loop, go())  # a valid launch is never refused, and it runs
            seen = _SEEN.pop(token)
            assert seen["blocks"] == blocks
            got = bytearray(seen["args"])
            for (slot, offset, data), read in zip(places, seen["data"], strict=True):
                (patched,) = struct.unpack_from("<Q", got, slot)
                assert patched == seen["args_addr"] + offset  # the runtime patched the slot
                assert read == data  # and the device reads the placeholder data through it
                got[slot : slot + 8] = b"\0" * 8
            assert bytes(got) == image
            _STATS["launches_valid"] += 1

        example()
        stats = dev.stats()
        assert stats["host_buffer_violations"] == 0
    finally:
        _run(loop, dev.aclose())
        loop.close()
    report(
        "fuzz_launch",
        valid_launches=_STATS["launches_valid"],
        invalid_launches_refused_before_runtime=_STATS["launches_invalid"],
        host_buffer_violations=stats["host_buffer_violations"],
    )
    assert _STATS["launches_valid"] > 5 and _STATS["launches_invalid"] > 5


def test_empty_placeholder_is_refused_by_hostargs() -> None:
    # Regression (found by this suite): placeholder(b"") was accepted, its table entry had
    # dataOffset == argsSize, and the runtime refused the launch (107000) at submission
    for data in (b"", bytearray(), np.zeros(0, np.float32)):
        with pytest.raises(ValueError, match="placeholder"):
            aa.HostArgs().u32(1).placeholder(data)


# --- copies ----------------------------------------------------------------------------------

_GUARD = 0x5A
_CANARY = 0xC3


@stress_timeout
def test_copy_fuzz_against_the_reference() -> None:
    loop = asyncio.new_event_loop()
    try:
        dev, stream = _run(loop, _open_with_stream())
        sim = dev.runtime
        sizes = [4, 8, 60, 64, 256]
        # every target buffer between two canary allocations
        layout = []
        for size in sizes:
            layout += [dev.malloc(64), dev.malloc(size), dev.malloc(64)]
        canaries = [b for i, b in enumerate(layout) if i % 3 != 1]
        targets = [b for i, b in enumerate(layout) if i % 3 == 1]
        for buf in canaries:
            _run(loop, _copy_in(stream, buf, bytes([_CANARY]) * buf.nbytes))

        src_values = st.one_of(
            hnp.arrays(
                dtype=st.sampled_from([np.uint8, np.int16, np.float32, np.float64]),
                shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
            ),
            st.binary(max_size=300),
            st.builds(bytearray, st.binary(max_size=80)),
            st.sampled_from([[1, 2, 3], "abcd", None, 5]),
        )

        @FUZZ
        @given(
            direction=st.sampled_from(["to_device", "to_host"]),
            target=st.integers(0, len(targets) - 1),
            src=src_values,
            strided=st.booleans(),
            readonly=st.booleans(),
            lead=st.integers(0, 16),
        )
        def example(
            direction: str, target: int, src: Any, strided: bool, readonly: bool, lead: int
        ) -> None:
            buf = targets[target]
            before = (dev.stats()["copies"], sim.counters["copies"])  # type: ignore[attr-defined]
            if direction == "to_device":
                if isinstance(src, np.ndarray) and strided and src.ndim >= 1 and src.shape[0] > 1:
                    src = src[::2]
                problems = _ref_copy_to_device(src, buf.nbytes)
                pattern = bytes([(target * 37 + 11) & 0xFF]) * buf.nbytes
                _run(loop, _copy_in(stream, buf, pattern))
                before = (dev.stats()["copies"], sim.counters["copies"])  # type: ignore[attr-defined]
                if problems:
                    _expect_refused(loop, stream.copy_to_device(buf, src), problems)
                else:
                    _run(loop, _await_task(stream.copy_to_device(buf, src)))
                    data = _ref_bytes(src)
                    got = sim_peek(dev, buf.ptr, buf.nbytes, np.uint8).tobytes()
                    assert got[: len(data)] == data
                    assert got[len(data) :] == pattern[len(data) :]  # nothing past the count
            else:
                if not isinstance(src, np.ndarray):
                    dst: Any = src
                    parent = None
                else:
                    # dst: a slice of a guarded parent array
                    flat = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
                    parent = np.full(flat.nbytes + lead + 64, _GUARD, np.uint8)
                    window = parent[lead : lead + flat.nbytes]
                    dst = window.view(src.dtype).reshape(src.shape) if flat.nbytes else src
                    if strided and dst.ndim >= 1 and dst.shape[0] > 1:
                        dst = dst[::2]
                    if readonly:
                        dst.flags.writeable = False
                problems = _ref_copy_to_host(dst, buf.nbytes)
                if problems:
                    _expect_refused(loop, stream.copy_to_host(dst, buf), problems)
                    if parent is not None:
                        assert np.all(parent == _GUARD)  # untouched
                else:
                    _run(loop, _await_task(stream.copy_to_host(dst, buf)))
                    got = _ref_bytes(dst)
                    assert got == sim_peek(dev, buf.ptr, len(got), np.uint8).tobytes()
                    if parent is None:  # a bytearray, written in place
                        return
                    start = dst.__array_interface__["data"][0] - parent.ctypes.data
                    outside = np.concatenate([parent[:start], parent[start + dst.nbytes :]])
                    assert np.all(outside == _GUARD)  # guard bytes around the slice untouched
                    _STATS["guard_bytes_checked"] += outside.size
            after = (dev.stats()["copies"], sim.counters["copies"])  # type: ignore[attr-defined]
            if problems:
                assert after == before
                _STATS["copies_invalid"] += 1
            else:
                assert after[0] == before[0] + 1
                _STATS["copies_valid"] += 1

        example()
        for buf in canaries:
            got = sim_peek(dev, buf.ptr, buf.nbytes, np.uint8)
            assert np.all(got == _CANARY), "a copy wrote into a neighbouring allocation"
        violations = dev.stats()["host_buffer_violations"]
        assert violations == 0
    finally:
        _run(loop, dev.aclose())
        loop.close()
    report(
        "fuzz_copies",
        valid_copies=_STATS["copies_valid"],
        invalid_copies_refused_before_runtime=_STATS["copies_invalid"],
        host_guard_bytes_checked=_STATS["guard_bytes_checked"],
        device_canary_allocations_intact=len(canaries),
        host_buffer_violations=violations,
    )
    assert _STATS["copies_valid"] > 5 and _STATS["copies_invalid"] > 5


def _ref_bytes(src: Any) -> bytes:
    if isinstance(src, np.ndarray):
        return np.ascontiguousarray(src).tobytes()
    return bytes(memoryview(src).cast("B"))


def _ref_copy_to_device(src: Any, capacity: int) -> list[tuple[type[Exception], str]]:
    if isinstance(src, np.ndarray):
        count = src.nbytes
    elif isinstance(src, bytes | bytearray | memoryview):
        count = memoryview(src).nbytes
    else:
        return [(TypeError, "src")]
    if count == 0:
        return [(ValueError, "empty")]
    if count > capacity:
        return [(ValueError, "dst buffer only")]
    return []


def _ref_copy_to_host(dst: Any, capacity: int) -> list[tuple[type[Exception], str]]:
    # a destination is written in place: an ndarray, or a buffer (bytes is read-only)
    problems: list[tuple[type[Exception], str]] = []
    if isinstance(dst, np.ndarray):
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            problems.append((ValueError, "dst"))
        nbytes = dst.nbytes
    elif isinstance(dst, bytes | bytearray | memoryview):
        if memoryview(dst).readonly:
            problems.append((ValueError, "dst"))
        nbytes = memoryview(dst).nbytes
    else:
        return [(TypeError, "dst")]
    if nbytes == 0:
        problems.append((ValueError, "empty"))
    elif nbytes > capacity:
        problems.append((ValueError, "src buffer only"))
    return problems


def _expect_refused(
    loop: asyncio.AbstractEventLoop, coro: Any, problems: list[tuple[type[Exception], str]]
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        _run(loop, coro)
    assert not isinstance(info.value, aa.AscendError), info.value
    assert any(
        isinstance(info.value, kind) and name in str(info.value) for kind, name in problems
    ), (problems, info.value)


async def _await_task(coro: Any) -> None:
    await (await coro)


async def _copy_in(stream: aa.Stream, buf: aa.DeviceBuffer, data: bytes) -> None:
    await (await stream.copy_to_device(buf, data))


def test_fuzz_counts() -> None:
    # runs last in this module: the builder fuzz's accepted/refused counts
    report("fuzz_hostargs", calls_accepted=_STATS["accepted"], calls_refused=_STATS["refused"])
    if _STATS["accepted"] + _STATS["refused"]:
        assert _STATS["accepted"] > 0 and _STATS["refused"] > 0
