"""Raw host memory access by address (pinned buffers handed out by a runtime)."""

from __future__ import annotations

import ctypes

__all__ = ["host_view"]


def host_view(addr: int, size: int) -> memoryview:
    """A writable byte view of ``size`` bytes at host address ``addr``.

    The caller guarantees the memory stays valid while the view is used (it does not own it).
    """
    if addr <= 0 or size <= 0:
        raise ValueError(f"invalid host range addr={addr:#x} size={size}")
    return memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")
