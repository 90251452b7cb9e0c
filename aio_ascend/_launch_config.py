"""``LaunchConfig``: the ``aclrtLaunchKernelCfg`` attributes as a frozen, validated value."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ._values import integer

__all__ = [
    "LAUNCH_ATTR_SIZE",
    "LAUNCH_CFG_SIZE",
    "LaunchAttrId",
    "LaunchConfig",
    "LaunchConfigDict",
]

#: ``sizeof(aclrtLaunchKernelAttr)``: uint32 id + 16-byte value union.
LAUNCH_ATTR_SIZE = 20
#: ``sizeof(aclrtLaunchKernelCfg)`` on LP64: attrs pointer + size_t numAttrs.
LAUNCH_CFG_SIZE = 16


class LaunchAttrId:
    """``aclrtLaunchKernelAttrId`` values (from the CANN headers)."""

    SCHEM_MODE = 1
    DYN_UBUF_SIZE = 2
    ENGINE_TYPE = 3
    BLOCKDIM_OFFSET = 4
    BLOCK_TASK_PREFETCH = 5
    DATA_DUMP = 6
    TIMEOUT = 7
    TIMEOUT_US = 8


_SCHEDULE_MODES = {"normal": 0, "batch": 1}
_ENGINE_TYPES = {"aic": 0, "aiv": 1}


def _check_uint(name: str, value: object, bits: int) -> int:
    value = integer(f"LaunchConfig.{name}", value)
    if not 0 <= value < 2**bits:
        raise ValueError(f"LaunchConfig.{name}={value} is out of range 0..{2**bits - 1}")
    return value


def _check_choice(name: str, value: object, choices: dict[str, int]) -> int:
    if isinstance(value, str):
        try:
            return choices[value]
        except KeyError:
            raise ValueError(
                f"LaunchConfig.{name}={value!r}: expected one of {sorted(choices)}"
            ) from None
    number = _check_uint(name, value, 32)
    if number not in choices.values():
        raise ValueError(f"LaunchConfig.{name}={value}: expected one of {sorted(choices.values())}")
    return number


class LaunchConfigDict(TypedDict, total=False):
    """The ``config=`` of ``Stream.launch``/``run`` as a dict: :class:`LaunchConfig`'s fields,
    so that a type checker catches a misspelt key."""

    schedule_mode: int | Literal["normal", "batch"] | None
    timeout_s: int | None
    timeout_us: int | None
    block_dim_offset: int | None
    engine_type: int | Literal["aic", "aiv"] | None
    prefetch_disabled: bool | None
    dump: bool | None
    dyn_ubuf_size: int | None
    block_dim: int | None


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Per-launch attributes (``aclrtLaunchKernelCfg``), validated at construction.

    Every field is optional; only the fields that are set become attributes.

    :param schedule_mode: ``"normal"``/0 (start as cores free up) or ``"batch"``/1 (wait until
        all blocks can start together).
    :param timeout_s: kernel execution timeout in seconds (uint16, 0 = forever).
    :param timeout_us: the same in microseconds (uint64); mutually exclusive with ``timeout_s``.
    :param block_dim_offset: ``BLOCKDIM_OFFSET`` (uint32, 310P AIC+AIV split).
    :param engine_type: ``"aic"``/0 or ``"aiv"``/1.
    :param prefetch_disabled: ``BLOCK_TASK_PREFETCH`` (True prevents HW prefetch of the task).
    :param dump: ``DATA_DUMP``.
    :param dyn_ubuf_size: ``DYN_UBUF_SIZE`` (uint32; SIMT kernels only).
    :param block_dim: threads per block, for the ``cuda`` backend only (ignored by ACL).
    """

    schedule_mode: int | Literal["normal", "batch"] | None = None
    timeout_s: int | None = None
    timeout_us: int | None = None
    block_dim_offset: int | None = None
    engine_type: int | Literal["aic", "aiv"] | None = None
    prefetch_disabled: bool | None = None
    dump: bool | None = None
    dyn_ubuf_size: int | None = None
    block_dim: int | None = None
    _attrs: tuple[tuple[int, bytes], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        attrs: list[tuple[int, bytes]] = []
        if self.schedule_mode is not None:
            mode = _check_choice("schedule_mode", self.schedule_mode, _SCHEDULE_MODES)
            attrs.append((LaunchAttrId.SCHEM_MODE, struct.pack("<B", mode)))
        if self.dyn_ubuf_size is not None:
            size = self._uint("dyn_ubuf_size", 32)
            attrs.append((LaunchAttrId.DYN_UBUF_SIZE, struct.pack("<I", size)))
        if self.engine_type is not None:
            engine = _check_choice("engine_type", self.engine_type, _ENGINE_TYPES)
            attrs.append((LaunchAttrId.ENGINE_TYPE, struct.pack("<i", engine)))
        if self.block_dim_offset is not None:
            offset = self._uint("block_dim_offset", 32)
            attrs.append((LaunchAttrId.BLOCKDIM_OFFSET, struct.pack("<I", offset)))
        for name, attr_id in (
            ("prefetch_disabled", LaunchAttrId.BLOCK_TASK_PREFETCH),
            ("dump", LaunchAttrId.DATA_DUMP),
        ):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, bool):
                    raise TypeError(f"LaunchConfig.{name} must be a bool, got {value!r}")
                attrs.append((attr_id, struct.pack("<B", int(value))))
        if self.timeout_s is not None and self.timeout_us is not None:
            raise ValueError("LaunchConfig.timeout_s and timeout_us are mutually exclusive")
        if self.timeout_s is not None:
            seconds = self._uint("timeout_s", 16)
            attrs.append((LaunchAttrId.TIMEOUT, struct.pack("<H", seconds)))
        if self.timeout_us is not None:
            micros = self._uint("timeout_us", 64)
            attrs.append(
                (LaunchAttrId.TIMEOUT_US, struct.pack("<II", micros & 0xFFFFFFFF, micros >> 32))
            )
        if self.block_dim is not None:
            dim = self._uint("block_dim", 32)
            if not 1 <= dim <= 1024:
                raise ValueError(f"LaunchConfig.block_dim={dim} is out of range 1..1024")
        object.__setattr__(self, "_attrs", tuple(attrs))

    def _uint(self, name: str, bits: int) -> int:
        # a field checked, and kept as a Python int (numpy's integers are taken too)
        value = _check_uint(name, getattr(self, name), bits)
        object.__setattr__(self, name, value)
        return value

    @property
    def kernel_timeout(self) -> float | None:
        """The kernel execution timeout in seconds (``timeout_s`` or ``timeout_us``); ``None``
        when neither is set or it is 0 (wait forever). A kernel running longer fails with
        ``ACL_ERROR_RT_AICORE_TIMEOUT`` (507014), as the runtime applies the attribute."""
        if self.timeout_s:
            return float(self.timeout_s)
        if self.timeout_us:
            return self.timeout_us / 1e6
        return None

    @property
    def attrs(self) -> tuple[tuple[int, bytes], ...]:
        """``(attr id, value bytes)`` pairs in the order they are packed."""
        return self._attrs

    @property
    def num_attrs(self) -> int:
        """``numAttrs`` of the packed cfg."""
        return len(self._attrs)

    def pack_attrs(self) -> bytes:
        """The ``aclrtLaunchKernelAttr`` array: ``num_attrs`` x 20 bytes, little-endian."""
        return b"".join(
            struct.pack("<I", attr_id) + value.ljust(16, b"\0") for attr_id, value in self._attrs
        )

    @classmethod
    def coerce(
        cls, value: LaunchConfig | LaunchConfigDict | dict[str, object] | None
    ) -> LaunchConfig | None:
        """Accept a ``LaunchConfig``, a dict of its fields, or ``None``."""
        if value is None or isinstance(value, LaunchConfig):
            return value
        if isinstance(value, dict):
            unknown = sorted(map(repr, set(value) - set(LaunchConfigDict.__annotations__)))
            if unknown:
                raise TypeError(
                    f"config: unknown LaunchConfig field(s) {unknown}; expected some of "
                    f"{sorted(LaunchConfigDict.__annotations__)}"
                )
            return cls(**value)
        raise TypeError(
            f"config must be a LaunchConfig, a dict or None, got {type(value).__name__}"
        )
