"""The host side of a ``cuLaunchKernel`` parameter-buffer launch: the ``extra`` array and the
placeholder patches written into the caller's args buffer (:mod:`..staging`'s, re-exported).
Pure: no cuda-bindings needed."""

from __future__ import annotations

import ctypes
from typing import Any

from ..staging import apply_patches, placeholder_patches

__all__ = [
    "CU_LAUNCH_PARAM_BUFFER_POINTER",
    "CU_LAUNCH_PARAM_BUFFER_SIZE",
    "CU_LAUNCH_PARAM_END",
    "LaunchExtra",
    "apply_patches",
    "placeholder_patches",
]

#: ``extra`` markers of ``cuLaunchKernel`` (``((void*)0x01)``, ``0x02``, ``0x00``)
CU_LAUNCH_PARAM_BUFFER_POINTER = 0x01
CU_LAUNCH_PARAM_BUFFER_SIZE = 0x02
CU_LAUNCH_PARAM_END = 0x00


class LaunchExtra:
    """The ``extra`` array of ``cuLaunchKernel`` for a parameter-buffer launch.

    ``{CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
    CU_LAUNCH_PARAM_END}``: five pointers and the ``size_t`` the fourth points to. One instance
    per thread is reused by every launch (the driver reads it only during the call).

    The driver copies the parameter buffer with the kernel's parameter layout, which is the C
    struct layout of its parameter list: ``HostArgs`` packs every argument at its natural
    alignment, so the packed image is that layout as it is. Only the size must be exact (the
    driver refuses a buffer size that includes tail padding or placeholder data), so the size is
    the kernel's parameter size, not ``argsSize``. A buffer at an address that is not 8-aligned is
    first copied into an aligned scratch area (:meth:`set`).
    """

    __slots__ = ("_scratch", "_scratch_addr", "_scratch_size", "address", "array", "size")

    def __init__(self) -> None:
        self.array = (ctypes.c_void_p * 5)()
        self.size = ctypes.c_size_t(0)
        self.array[0] = CU_LAUNCH_PARAM_BUFFER_POINTER
        self.array[1] = None
        self.array[2] = CU_LAUNCH_PARAM_BUFFER_SIZE
        self.array[3] = ctypes.addressof(self.size)
        self.array[4] = CU_LAUNCH_PARAM_END
        #: the value to pass as ``extra``
        self.address = ctypes.addressof(self.array)
        self._scratch: Any = None
        self._scratch_addr = 0
        self._scratch_size = 0

    def set(self, buffer: int, size: int) -> int:
        """Point the array at ``size`` bytes at host address ``buffer``; returns :attr:`address`."""
        if buffer & 7:
            buffer = self._aligned_copy(buffer, size)
        self.array[1] = buffer
        self.size.value = size
        return self.address

    def _aligned_copy(self, buffer: int, size: int) -> int:
        if size > self._scratch_size:
            self._scratch = (ctypes.c_uint64 * ((size + 7) // 8))()
            self._scratch_addr = ctypes.addressof(self._scratch)
            self._scratch_size = size
        ctypes.memmove(self._scratch_addr, buffer, size)
        return self._scratch_addr

    def entries(self) -> list[int]:
        """The five pointer values as ints (for diagnostics and tests)."""
        return [int(v or 0) for v in self.array]
