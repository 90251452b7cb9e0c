"""``HostArgs``: a pure builder for the host args buffer of ``aclrtLaunchKernelWithHostArgs``.

Layout (what an Ascend C kernel decodes): arguments are laid out left to right, each at its
alignment under the builder's :class:`ArgsLayout` (pointers and placeholder slots: 8 bytes,
8-aligned, in every layout):

* ``"ascend"`` (the default): natural alignment with a 4-byte minimum, the Ascend C compiler's
  ABI (asc-devkit's generated launch stubs: ``alignas(((alignof(T) + 3) >> 2) << 2)``;
  ``docs/cann-support.md`` §3.1), what ``aclrtlaunch_*``, ``<<<>>>`` and HCCL pass;
* ``"c"``: plain C natural alignment (a ``u8`` at any byte, a ``u16`` at an even one): what
  CUDA kernels (the ``cuda`` backend) and hand-written C structs use;
* ``"slots8"``: every argument at the next 8-byte boundary, as ``aclrtKernelArgsAppend`` places
  each parameter (§3.2): to reproduce an args-handle launch byte for byte.

The three agree when every argument is a pointer or a 64-bit value. Placeholder data goes into a
tail region after all arguments, each block at its own alignment (32 by default); the runtime
writes the device address of each block into its 8-byte slot. The total is rounded up to 8
bytes; an empty ``HostArgs`` is 8 zero bytes (the runtime refuses ``argsSize == 0``).

:meth:`HostArgs.pack` with a kernel's ``FunctionInfo`` (from the runtime) also checks the fields
against the parameters the kernel declares and adds the hidden arguments the launch path needs
(a MIX kernel's sync address before them, its overflow address after them).

No runtime, no I/O, no asyncio: the scheduler snapshots the packed image into a pooled pinned
buffer at launch, so a builder may be reused (or mutated) as soon as ``launch`` returns.
"""

from __future__ import annotations

import enum
import math
import operator
import struct
from typing import Any, Protocol

import numpy as np

from .._runtime.abi import MAX_PLACEHOLDERS, PLACEHOLDER_INFO_SIZE, UINT32_MAX
from .._runtime.base import FunctionInfo
from .._values import integer

BytesLike = bytes | bytearray | memoryview

__all__ = [
    "ArgsLayout",
    "DEFAULT_MAX_NBYTES",
    "DEFAULT_MAX_PLACEHOLDERS",
    "HostArgs",
    "PackedArgs",
    "SupportsDevicePointer",
]

#: default cap on ``nbytes`` (the runtime's args-handle path caps at 64 KiB as well)
DEFAULT_MAX_NBYTES = 64 * 1024
#: default cap on the number of placeholders: the runtime's (one per pointer parameter)
DEFAULT_MAX_PLACEHOLDERS = MAX_PLACEHOLDERS
_ARGS_SIZE_LIMIT = UINT32_MAX
_PLACEHOLDER_ENTRY = struct.Struct("<II")  # aclrtPlaceHolderInfo
assert _PLACEHOLDER_ENTRY.size == PLACEHOLDER_INFO_SIZE


class ArgsLayout(enum.Enum):
    """Where each argument of a :class:`HostArgs` starts (see the module docstring)."""

    #: natural alignment, at least 4: the Ascend C compiler's parameter ABI (the default)
    ASCEND = "ascend"
    #: plain C natural alignment (CUDA kernels, C structs)
    C = "c"
    #: every argument at the next 8-byte boundary (``aclrtKernelArgsAppend``)
    SLOTS8 = "slots8"


#: the smallest alignment of an argument under each layout (its natural one if larger)
_MIN_ALIGN = {ArgsLayout.ASCEND: 4, ArgsLayout.C: 1, ArgsLayout.SLOTS8: 8}


def _coerce_layout(layout: object) -> ArgsLayout:
    if isinstance(layout, ArgsLayout):
        return layout
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type(layout).__name__}")
    try:
        return ArgsLayout(layout)
    except ValueError:
        names = ", ".join(repr(item.value) for item in ArgsLayout)
        raise ValueError(f"layout={layout!r}: expected one of {names}") from None


class SupportsDevicePointer(Protocol):
    """Anything with a device address (``DeviceBuffer``)."""

    @property
    def ptr(self) -> int: ...


# (struct format, low, high) for integer scalars (their alignment is their size)
_INT_TYPES: dict[str, tuple[str, int, int]] = {
    "u8": ("<B", 0, 2**8 - 1),
    "u16": ("<H", 0, 2**16 - 1),
    "u32": ("<I", 0, 2**32 - 1),
    "u64": ("<Q", 0, 2**64 - 1),
    "i8": ("<b", -(2**7), 2**7 - 1),
    "i16": ("<h", -(2**15), 2**15 - 1),
    "i32": ("<i", -(2**31), 2**31 - 1),
    "i64": ("<q", -(2**63), 2**63 - 1),
}
_FLOAT_TYPES: dict[str, str] = {"f16": "<e", "f32": "<f", "f64": "<d"}
_INT_PACKERS = {
    kind: (struct.Struct(fmt), low, high) for kind, (fmt, low, high) in _INT_TYPES.items()
}
_FLOAT_PACKERS = {kind: struct.Struct(fmt) for kind, fmt in _FLOAT_TYPES.items()}
_REAL_TYPES = (int, float, np.floating, np.integer)


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _check_cap(name: str, value: object, low: int, high: int, why: str) -> int:
    # A HostArgs cap that is no plain int in range: as an int, or refused
    number = integer(name, value)
    if not low <= number <= high:
        raise ValueError(f"{name}={number} must be in {low}..{high}{why}")
    return number


def _check_alignment(name: str, align: object) -> int:
    align = integer(name, align)
    if align <= 0 or align & (align - 1) or align > 4096:
        raise ValueError(f"{name}={align} must be a power of two in 1..4096")
    return align


def _as_bytes(kind: str, data: object) -> bytes:
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:  # its bytes are host pointers to Python objects
            raise TypeError(
                f"{kind} data: an array of dtype {data.dtype} holds Python objects, which have "
                "no device representation; use a numeric dtype"
            )
        return np.ascontiguousarray(data).tobytes()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(
        f"{kind} data must be bytes, bytearray, memoryview or ndarray, got {type(data).__name__}"
    )


class PackedArgs:
    """The immutable result of packing a :class:`HostArgs` (what the scheduler snapshots).

    :ivar image: the args buffer, ``nbytes`` long, with zeros in placeholder slots
    :ivar table: the ``aclrtPlaceHolderInfo`` array (8 bytes per placeholder)
    :ivar placeholders: ``(addrOffset, dataOffset)`` pairs
    :ivar buffers: the device buffers the args point to (kept alive until completion)
    :ivar table_offset: where the placeholder table goes after the image in the one buffer a
        launch reads: the next 8-byte boundary
    """

    __slots__ = (
        "buffers",
        "fields",
        "image",
        "nbytes",
        "placeholder_count",
        "placeholders",
        "table",
        "table_offset",
    )

    def __init__(
        self,
        image: bytes,
        placeholders: tuple[tuple[int, int], ...],
        buffers: tuple[SupportsDevicePointer, ...],
        fields: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.image = image
        #: ``(offset, size)`` of each argument (a placeholder: its 8-byte slot), in order
        self.fields = fields
        self.nbytes = len(image)
        self.table_offset = (self.nbytes + 7) & ~7
        self.placeholders = placeholders
        self.placeholder_count = len(placeholders)
        self.table = (
            b"".join([_PLACEHOLDER_ENTRY.pack(a, d) for a, d in placeholders])
            if placeholders
            else b""
        )
        self.buffers = buffers


class HostArgs:
    """Chainable builder for a kernel's host args buffer.

    >>> args = HostArgs().ptr(0x1000).u32(16).placeholder(b"tiling!!", align=32)
    >>> args.nbytes, args.placeholders
    (40, [(16, 32)])

    :param layout: where arguments start: ``"ascend"`` (the default: natural alignment, at
        least 4, the Ascend C compiler's ABI), ``"c"`` (plain C natural alignment) or
        ``"slots8"`` (every argument 8-aligned, as ``aclrtKernelArgsAppend``); see
        :class:`ArgsLayout`
    :param max_nbytes: refuse layouts larger than this (default 64 KiB; at most 2**32 - 1)
    :param max_placeholders: refuse more placeholders than this (default 128)

    Bad values raise ``TypeError``/``ValueError`` naming the field when they are added, never
    later: no silent wrap-around (``u32(2**32)`` raises), no float where an int is due.
    """

    __slots__ = (
        "_buffers",
        "_fields",
        "_image",
        "_items",
        "_layout_kind",
        "_max_nbytes",
        "_max_placeholders",
        "_min_align",
        "_packed",
        "_packed_for",
        "_placeholder_data",
        "_tail_size",
    )

    def __init__(
        self,
        *,
        layout: ArgsLayout | str = ArgsLayout.ASCEND,
        max_nbytes: int = DEFAULT_MAX_NBYTES,
        max_placeholders: int = DEFAULT_MAX_PLACEHOLDERS,
    ) -> None:
        # (a builder is made per launch: the defaults take no call and no isinstance)
        if layout is not ArgsLayout.ASCEND:
            layout = _coerce_layout(layout)
        self._layout_kind = layout
        self._min_align = _MIN_ALIGN[layout]
        if type(max_nbytes) is not int or not 8 <= max_nbytes <= _ARGS_SIZE_LIMIT:
            max_nbytes = _check_cap("max_nbytes", max_nbytes, 8, _ARGS_SIZE_LIMIT, "")
        if type(max_placeholders) is not int or not 0 <= max_placeholders <= MAX_PLACEHOLDERS:
            max_placeholders = _check_cap(
                "max_placeholders",
                max_placeholders,
                0,
                MAX_PLACEHOLDERS,
                " (the runtime's placeholder limit)",
            )
        self._max_nbytes = max_nbytes
        self._max_placeholders = max_placeholders
        # the argument area, laid out as arguments are added (its length is where the next
        # one may start); tail data is placed by _layout
        self._image = bytearray()
        # (slot offset, data, alignment) of each placeholder
        self._placeholder_data: list[tuple[int, bytes, int]] = []
        self._tail_size = 0  # worst-case bytes of tail data, for the early size check
        self._buffers: list[SupportsDevicePointer] = []
        self._packed: PackedArgs | None = None
        self._packed_for: tuple[FunctionInfo, PackedArgs] | None = None
        # (offset, size) of each argument; (data or None for a placeholder slot, alignment)
        self._fields: list[tuple[int, int]] = []
        self._items: list[tuple[bytes | None, int]] = []

    @property
    def layout(self) -> ArgsLayout:
        """Where arguments start (:class:`ArgsLayout`)."""
        return self._layout_kind

    # --- builders ------------------------------------------------------------------------

    def _append(self, field: str, data: bytes, align: int) -> HostArgs:
        if align < self._min_align:
            align = self._min_align
        image = self._image
        cursor = len(image)
        offset = (cursor + align - 1) & -align
        size = len(data)
        end = offset + size
        # Cheap upper bound first (every tail block padded by its full alignment); the exact
        # layout is computed only near the cap, so no valid layout is refused.
        if end + self._tail_size + 8 > self._max_nbytes:
            self._check_size(field, end, self._placeholder_data)
        if offset != cursor:
            image.extend(bytes(offset - cursor))
        image += data
        self._fields.append((offset, size))
        self._items.append((data, align))
        self._packed = self._packed_for = None
        return self

    def _check_size(
        self, field: str, cursor: int, placeholders: list[tuple[int, bytes, int]]
    ) -> None:
        total = _layout_size(cursor, placeholders)
        limit = self._max_nbytes
        if total > limit:
            raise ValueError(
                f"HostArgs.{field}: the args would take {total} bytes, over the cap of {limit}"
            )

    def ptr(self, value: SupportsDevicePointer | int | None) -> HostArgs:
        """A device pointer: 8 bytes, 8-aligned. ``None`` packs a NULL pointer."""
        if type(value) is int:
            address = value
        elif value is None:
            address = 0
        elif isinstance(value, int | np.integer) and not isinstance(value, bool):
            address = int(value)
        elif hasattr(value, "ptr") and not isinstance(value, bool | np.bool_):
            address = value.ptr
            if not isinstance(address, int):
                raise TypeError(f"HostArgs.ptr: {type(value).__name__}.ptr is not an int")
            self._buffers.append(value)
        else:
            raise TypeError(
                f"HostArgs.ptr takes a DeviceBuffer, an int address or None, "
                f"got {type(value).__name__}"
            )
        if not 0 <= address < 2**64:
            raise ValueError(f"HostArgs.ptr: address {address} is out of range 0..2**64-1")
        return self._append("ptr", address.to_bytes(8, "little"), 8)

    def _int(self, kind: str, value: object) -> HostArgs:
        packer, low, high = _INT_PACKERS[kind]
        if type(value) is int:
            number = value
        elif isinstance(value, float | bool | np.bool_):
            # one rule for every setter: numpy scalars of the right kind are accepted, a bool
            # only where bool is the declared type (HostArgs.bool)
            raise TypeError(
                f"HostArgs.{kind} takes an integer, got {type(value).__name__} {value!r}"
            )
        else:
            try:
                number = operator.index(value)  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(
                    f"HostArgs.{kind} takes an integer, got {type(value).__name__}"
                ) from None
        if not low <= number <= high:
            raise ValueError(f"HostArgs.{kind}: {number} is out of range {low}..{high}")
        return self._append(kind, packer.pack(number), packer.size)

    def u8(self, value: int) -> HostArgs:
        """An unsigned 8-bit integer."""
        return self._int("u8", value)

    def u16(self, value: int) -> HostArgs:
        """An unsigned 16-bit integer (2-aligned)."""
        return self._int("u16", value)

    def u32(self, value: int) -> HostArgs:
        """An unsigned 32-bit integer (4-aligned)."""
        return self._int("u32", value)

    def u64(self, value: int) -> HostArgs:
        """An unsigned 64-bit integer (8-aligned)."""
        return self._int("u64", value)

    def i8(self, value: int) -> HostArgs:
        """A signed 8-bit integer."""
        return self._int("i8", value)

    def i16(self, value: int) -> HostArgs:
        """A signed 16-bit integer (2-aligned)."""
        return self._int("i16", value)

    def i32(self, value: int) -> HostArgs:
        """A signed 32-bit integer (4-aligned)."""
        return self._int("i32", value)

    def i64(self, value: int) -> HostArgs:
        """A signed 64-bit integer (8-aligned)."""
        return self._int("i64", value)

    def _float(self, kind: str, value: object) -> HostArgs:
        packer = _FLOAT_PACKERS[kind]
        if type(value) is not float and (
            isinstance(value, bool) or not isinstance(value, _REAL_TYPES)
        ):
            raise TypeError(f"HostArgs.{kind} takes a real number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"HostArgs.{kind}: {value!r} does not fit {kind}") from None
        if math.isinf(number) and value != number:  # a finite longdouble or Decimal past it
            raise ValueError(f"HostArgs.{kind}: {value!r} does not fit {kind}")
        try:
            data = packer.pack(number)
        except (OverflowError, struct.error):
            raise ValueError(f"HostArgs.{kind}: {number!r} does not fit {kind}") from None
        if kind == "f32" and not math.isfinite(packer.unpack(data)[0]) and math.isfinite(number):
            raise ValueError(f"HostArgs.{kind}: {number!r} does not fit {kind}")
        return self._append(kind, data, packer.size)

    def f16(self, value: float) -> HostArgs:
        """An IEEE half-precision float (2-aligned)."""
        return self._float("f16", value)

    def f32(self, value: float) -> HostArgs:
        """An IEEE single-precision float (4-aligned)."""
        return self._float("f32", value)

    def f64(self, value: float) -> HostArgs:
        """An IEEE double-precision float (8-aligned)."""
        return self._float("f64", value)

    def bool(self, value: bool) -> HostArgs:
        """A C ``bool`` (1 byte)."""
        if not isinstance(value, bool | np.bool_):
            raise TypeError(f"HostArgs.bool takes a bool, got {type(value).__name__}")
        return self._append("bool", b"\x01" if value else b"\x00", 1)

    def raw(self, data: BytesLike | np.ndarray[Any, Any], align: int = 1) -> HostArgs:
        """Raw bytes copied in place (an ndarray is copied in C order), at ``align``.

        For an ndarray the alignment is at least its dtype's natural alignment.
        """
        align = _check_alignment("HostArgs.raw align", align)
        if isinstance(data, np.ndarray):
            align = max(align, data.dtype.alignment)
        payload = _as_bytes("HostArgs.raw", data)
        return self._append("raw", payload, align)

    def placeholder(self, data: BytesLike | np.ndarray[Any, Any], align: int = 32) -> HostArgs:
        """An 8-byte slot (addrOffset) the runtime fills with the device address of ``data``.

        ``data`` itself is placed in the tail after all arguments (dataOffset), at an offset
        aligned to ``align`` (at least 8) from the start of the args buffer. Its device
        address is aligned as far as the runtime aligns the buffer's device copy, which it
        chooses: on the real runtime at least 8 bytes (its stream pool hands out args space in
        8-byte steps, ``stars_arg_manager.cc:131``), so data a kernel must read with a larger
        alignment belongs in a device buffer (:meth:`ptr`).
        """
        align = max(_check_alignment("HostArgs.placeholder align", align), 8)
        payload = _as_bytes("HostArgs.placeholder", data)
        if not payload:
            # its dataOffset would equal argsSize, which the runtime refuses
            raise ValueError("HostArgs.placeholder: data must not be empty")
        if len(self._placeholder_data) >= self._max_placeholders:
            raise ValueError(
                f"HostArgs.placeholder: more than {self._max_placeholders} placeholders"
            )
        image = self._image
        slot = (len(image) + 7) & -8
        entry = (slot, payload, align)
        tail_size = self._tail_size + len(payload) + align - 1
        # the same cheap upper bound as _append's, the exact layout only near the cap
        if slot + 8 + tail_size + 8 > self._max_nbytes:
            self._check_size("placeholder", slot + 8, [*self._placeholder_data, entry])
        self._placeholder_data.append(entry)
        self._tail_size = tail_size
        image.extend(bytes(slot + 8 - len(image)))
        self._fields.append((slot, 8))
        self._items.append((None, 8))
        self._packed = self._packed_for = None
        return self

    # --- results -------------------------------------------------------------------------

    def pack(self, info: FunctionInfo | None = None) -> PackedArgs:
        """Lay out the buffer (cached until the builder changes).

        With ``info`` (a kernel's :class:`~aio_ascend._runtime.base.FunctionInfo`, from the
        runtime), for a launch of that kernel: the fields are checked against the parameters
        it declares (``ValueError`` when their number or sizes differ), its hidden arguments
        are laid out before and after the fields, and placeholder data is placed as its launch
        path needs.
        """
        if info is None or info.plain:
            packed = self._packed
            if packed is None:
                packed = self._packed = self._layout()
            return packed
        cached = self._packed_for
        if cached is not None and (cached[0] is info or cached[0] == info):
            return cached[1]
        self._check_params(info)
        if not info.prefix and not info.suffix and info.data_align is None:
            packed = self.pack()  # checked; laid out as the builder has it
        else:
            packed = self._layout_for(info)
        self._packed_for = (info, packed)
        return packed

    def _layout(self) -> PackedArgs:
        image = bytearray(self._image)
        placeholders = []
        for slot, data, align in self._placeholder_data:
            data_offset = (len(image) + align - 1) & -align
            image.extend(bytes(data_offset - len(image)))
            image += data
            placeholders.append((slot, data_offset))
        size = len(image)
        total = max((size + 7) & -8, 8)
        if total != size:
            image.extend(bytes(total - size))
        return PackedArgs(
            bytes(image), tuple(placeholders), tuple(self._buffers), tuple(self._fields)
        )

    def _check_params(self, info: FunctionInfo) -> None:
        """The fields against the kernel's declared parameters (count and sizes)."""
        declared = info.params
        if declared is None:
            return
        sizes = [size for _, size in self._fields]
        expected = [size for _, size in declared]
        if len(sizes) != len(expected):
            raise ValueError(
                f"HostArgs has {len(sizes)} argument(s) but the kernel declares "
                f"{len(expected)} parameter(s), of sizes {expected} bytes"
            )
        for index, (size, want) in enumerate(zip(sizes, expected, strict=True)):
            if size != want:
                raise ValueError(
                    f"HostArgs argument {index} is {size} byte(s) but the kernel's parameter "
                    f"{index} is {want} byte(s)"
                )

    def _layout_for(self, info: FunctionInfo) -> PackedArgs:
        """The layout with ``info``'s hidden arguments and data placement."""
        image = bytearray()
        for value in info.prefix:
            image += value.to_bytes(8, "little")
        fields: list[tuple[int, int]] = []
        slots: list[int] = []
        for data, align in self._items:
            offset = (len(image) + align - 1) & -align
            image.extend(bytes(offset - len(image)))
            if data is None:
                slots.append(offset)
                image += bytes(8)
                fields.append((offset, 8))
            else:
                image += data
                fields.append((offset, len(data)))
        if info.suffix:
            image.extend(bytes(-len(image) % 8))
            for value in info.suffix:
                image += value.to_bytes(8, "little")
        placeholders = []
        if info.data_align is not None:
            image.extend(bytes(-len(image) % 8))  # the argument area ends 8-aligned
        for slot, (_, data, align) in zip(slots, self._placeholder_data, strict=True):
            align = align if info.data_align is None else info.data_align
            data_offset = (len(image) + align - 1) & -align
            image.extend(bytes(data_offset - len(image)))
            image += data
            placeholders.append((slot, data_offset))
        total = max((len(image) + 7) & -8, 8)
        image.extend(bytes(total - len(image)))
        if total > self._max_nbytes:
            raise ValueError(
                f"HostArgs: the args with the kernel's hidden arguments take {total} bytes, "
                f"over the cap of {self._max_nbytes}"
            )
        return PackedArgs(bytes(image), tuple(placeholders), tuple(self._buffers), tuple(fields))

    @property
    def nbytes(self) -> int:
        """Size of the packed buffer (``argsSize``), a multiple of 8, at least 8."""
        return self.pack().nbytes

    @property
    def placeholders(self) -> list[tuple[int, int]]:
        """``(addrOffset, dataOffset)`` of each placeholder, in the order they were added."""
        return list(self.pack().placeholders)

    @property
    def buffers(self) -> tuple[SupportsDevicePointer, ...]:
        """Device buffers passed to :meth:`ptr` (retained by a launch until it completes)."""
        return tuple(self._buffers)

    def to_bytes(self) -> bytes:
        """The packed args image (placeholder slots zero until the runtime patches them)."""
        return self.pack().image

    def placeholder_table(self) -> bytes:
        """The ``aclrtPlaceHolderInfo`` array: ``<II`` (addrOffset, dataOffset) per entry."""
        return self.pack().table

    def pack_into(self, buffer: bytearray | memoryview, offset: int = 0) -> int:
        """Write the packed image into a writable buffer at ``offset``; returns ``nbytes``."""
        packed = self.pack()
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise TypeError("HostArgs.pack_into needs a writable buffer")
        end = offset + packed.nbytes
        if offset < 0 or end > len(view):
            raise ValueError(
                f"HostArgs.pack_into: {packed.nbytes} bytes at offset {offset} do not fit a "
                f"buffer of {len(view)} bytes"
            )
        view[offset:end] = packed.image
        return packed.nbytes

    def __len__(self) -> int:
        return self.nbytes

    @property
    def fields(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of each argument in order (a placeholder: its 8-byte slot)."""
        return list(self._fields)

    def __repr__(self) -> str:
        layout = (
            ""
            if self._layout_kind is ArgsLayout.ASCEND
            else f"layout={self._layout_kind.value!r}, "
        )
        return (
            f"HostArgs({layout}fields={len(self._fields)}, "
            f"placeholders={len(self._placeholder_data)}, nbytes={self.nbytes})"
        )


def _layout_size(cursor: int, placeholders: list[tuple[int, bytes, int]]) -> int:
    tail = cursor
    for _, data, align in placeholders:
        tail = _align_up(tail, align) + len(data)
    return max(_align_up(tail, 8), 8)
