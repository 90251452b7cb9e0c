"""The simulator's memory: a device address space and pinned host memory, both numpy-backed.

Device memory lives at fake 64-bit addresses starting at :data:`DEVICE_BASE`; each allocation is
its own ``uint8`` array. Addresses are handed out going up and are not reused until the
allocations have gone round the whole range (1 TiB of them: then they wrap to the first gap big
enough), so a use after free faults instead of silently reading another buffer; a block the
library's pool keeps for reuse is poisoned instead (:meth:`DeviceMemory.poison`), so a late
reader sees the pattern. A pooled block is
larger than its request: the pool limits it to the request (:meth:`DeviceMemory.limit`), so an
access past the request faults as it would in an allocation of exactly that size. Pinned host
memory is real process memory (64-byte aligned numpy buffers) so Python code can reach it
through its address, as with ``aclrtMallocHost``.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "ARGS_BASE",
    "ARGS_LIMIT",
    "DEVICE_BASE",
    "DEVICE_LIMIT",
    "DEFAULT_MEMORY_BYTES",
    "DeviceFault",
    "DeviceMemory",
    "POISON_BYTE",
    "PinnedMemory",
    "U8Array",
    "is_device_address",
]

#: first device address handed out (looks like an HBM address of a real NPU)
DEVICE_BASE = 0x12C0_0000_0000
#: end of the simulated device address space (1 TiB of addresses)
DEVICE_LIMIT = DEVICE_BASE + (1 << 40)
#: launch args regions: one slot of 2**32 bytes per launch with placeholders, reused cyclically
ARGS_BASE = 1 << 47
_ARGS_SLOT_BITS = 32
_ARGS_SLOT_MASK = (1 << _ARGS_SLOT_BITS) - 1
_ARGS_SLOTS = 1 << 20
ARGS_LIMIT = ARGS_BASE + (_ARGS_SLOTS << _ARGS_SLOT_BITS)
#: where in its slot a region starts (see DeviceMemory.reserve_region)
_ARGS_SKEW = 8
_ALIGN = 64
#: gap left between device allocations, so that an overrun never lands in a neighbour
_GUARD = 4096
#: device memory the sim offers by default (``aclrtGetMemInfo``'s total; malloc fails beyond it)
DEFAULT_MEMORY_BYTES = 32 << 30
#: byte written over pinned memory when it is freed, and over device memory the library's pool
#: takes back (a late read sees this, never a crash or the next owner's data)
POISON_BYTE = 0xCD

U8Array = npt.NDArray[np.uint8]


def is_device_address(addr: int) -> bool:
    """Whether ``addr`` lies in the simulated device's address ranges."""
    return DEVICE_BASE <= addr < DEVICE_LIMIT or ARGS_BASE <= addr < ARGS_LIMIT


def _past_the_end(what: str, addr: int, nbytes: int, base: int, size: int) -> DeviceFault:
    return DeviceFault(
        507015,
        f"MMU fault: {what} of {nbytes} bytes at device address {addr:#x} runs past the end "
        f"of the allocation at {base:#x} ({size} bytes)",
    )


class DeviceFault(Exception):
    """A fault on the simulated device (an MMU fault, a kernel exception, the ``fault`` kernel).

    Internal to the simulator: the device thread turns it into the sticky device fault that
    runtime calls then raise as :class:`aio_ascend._errors.DeviceFaultError`.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _span(size: int) -> int:
    """The addresses an allocation of ``size`` bytes takes: aligned, and a guard gap."""
    return ((size + _ALIGN - 1) & -_ALIGN) + _GUARD


class DeviceMemory:
    """The device address space: ``malloc``/``free`` and address resolution for kernels/copies.

    Thread-safe: user threads allocate and free while the device thread resolves addresses.

    Launch args regions (where the runtime copies a launch's args when it has placeholders)
    live in their own range, :data:`ARGS_BASE` and up, one 4 GiB-aligned slot per launch: an
    address is reserved during the launch call (no lock, no memory) and backed only while the
    kernel runs, so a stale pointer into an args region faults like any other.
    """

    def __init__(self, capacity: int = DEFAULT_MEMORY_BYTES) -> None:
        self._lock = threading.Lock()
        #: bytes the device offers, and bytes of it allocated now
        self.capacity = capacity
        self.used = 0
        self._next = DEVICE_BASE
        self._starts: list[int] = []  # sorted allocation bases
        self._arrays: dict[int, U8Array] = {}  # base -> backing array (or its limited view)
        self._blocks: dict[int, U8Array] = {}  # base -> the whole array of a limited one
        self._region_seq = itertools.count()
        self._regions: dict[int, U8Array] = {}  # slot base -> args bytes while the kernel runs

    def malloc(self, size: int) -> int:
        """Allocate ``size`` (> 0) zeroed bytes; returns a 64-byte aligned device address."""
        with self._lock:
            if self.used + size > self.capacity:
                raise MemoryError(
                    f"out of device memory: {self.capacity - self.used} of {self.capacity} "
                    "bytes free"
                )
        data = np.zeros(size, dtype=np.uint8)
        span = _span(size)
        with self._lock:
            if self.used + size > self.capacity:
                raise MemoryError("out of device memory")
            addr = self._gap(self._next, span)
            if addr is None:  # round the range: the first gap from its start
                addr = self._gap(DEVICE_BASE, span)
                if addr is None:
                    raise MemoryError("simulated device address space exhausted")
            self.used += size
            self._next = addr + span
            self._arrays[addr] = data
            bisect.insort(self._starts, addr)
        return addr

    def _gap(self, addr: int, span: int) -> int | None:
        # The first free ``span`` bytes at ``addr`` or above (with the lock held).
        starts = self._starts
        index = bisect.bisect_right(starts, addr)
        if index > 0:  # (the allocation below may reach past addr)
            addr = max(addr, self._end(starts[index - 1]))
        while addr + span <= DEVICE_LIMIT:
            if index == len(starts) or addr + span <= starts[index]:
                return addr
            addr = max(addr, self._end(starts[index]))
            index += 1
        return None

    def _end(self, base: int) -> int:
        return base + _span(self._blocks.get(base, self._arrays[base]).shape[0])

    def free(self, addr: int) -> bool:
        """Free the allocation at base ``addr``; False if it is not a live allocation."""
        with self._lock:
            data = self._arrays.pop(addr, None)
            if data is None:
                return False
            self.used -= self._blocks.pop(addr, data).nbytes
            index = bisect.bisect_left(self._starts, addr)
            del self._starts[index]
        return True

    def poison(self, addr: int) -> bool:
        """Fill the allocation at base ``addr`` with :data:`POISON_BYTE`; False if it is not a
        live allocation."""
        data = self._arrays.get(addr)
        if data is None:
            return False
        self._blocks.get(addr, data).fill(POISON_BYTE)
        return True

    def limit(self, addr: int, nbytes: int) -> bool:
        """Limit the allocation at base ``addr`` to its first ``nbytes`` bytes (its whole size
        at most): accesses past them fault from now on; False if it is not a live allocation.
        """
        with self._lock:
            data = self._arrays.get(addr)
            if data is None:
                return False
            block = self._blocks.setdefault(addr, data)
            if not 0 <= nbytes <= block.shape[0]:
                raise ValueError(f"{nbytes} bytes: not within the {block.shape[0]}-byte block")
            self._arrays[addr] = block[:nbytes]
        return True

    def reserve_region(self) -> int:
        """The device address of a new args region (any size up to 4 GiB): 8 bytes past its
        slot's start, the least alignment the real runtime promises (its stream pool hands
        out args space in 8-byte steps, ``stars_arg_manager.cc:131``), so that placeholder
        data is never more aligned here than there."""
        slot = ARGS_BASE + ((next(self._region_seq) & (_ARGS_SLOTS - 1)) << _ARGS_SLOT_BITS)
        return slot + _ARGS_SKEW

    def map_region(self, addr: int, args: bytes) -> None:
        """Back the region at ``addr`` with a copy of ``args`` (the launch's H2D args copy)."""
        data = np.empty(len(args), dtype=np.uint8)
        data.data[:] = args
        self._regions[addr & ~_ARGS_SLOT_MASK] = data

    def unmap_region(self, addr: int) -> None:
        """Release a region after its kernel ran."""
        self._regions.pop(addr & ~_ARGS_SLOT_MASK, None)

    def user_count(self) -> int:
        """Live allocations made by the user (args regions are the runtime's own)."""
        return len(self._arrays)

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()
            self._blocks.clear()
            self.used = 0
            self._starts.clear()
            self._regions.clear()

    def resolve(self, addr: int, nbytes: int, what: str) -> tuple[U8Array, int]:
        """``(backing array, offset)`` for ``[addr, addr + nbytes)``; a fault if not inside one
        live allocation."""
        arrays = self._arrays
        data = arrays.get(addr)
        if data is not None and 0 <= nbytes <= data.shape[0]:
            return data, 0
        if ARGS_BASE <= addr < ARGS_LIMIT:
            slot = addr & ~_ARGS_SLOT_MASK
            data = self._regions.get(slot)
            base = slot + _ARGS_SKEW
            if data is not None and addr >= base:  # (the skew before it is no one's)
                offset = addr - base
                if nbytes >= 0 and offset + nbytes <= data.shape[0]:
                    return data, offset
                raise _past_the_end(what, addr, nbytes, base, data.shape[0])
        else:
            with self._lock:
                index = bisect.bisect_right(self._starts, addr) - 1
                if index >= 0:
                    base = self._starts[index]
                    data = arrays[base]
                    offset = addr - base
                    if nbytes >= 0 and offset + nbytes <= data.shape[0]:
                        return data, offset
                    if offset < data.shape[0]:
                        raise _past_the_end(what, addr, nbytes, base, data.shape[0])
        raise DeviceFault(
            507015,
            f"MMU fault: {what} of {nbytes} bytes at device address {addr:#x}: "
            f"not inside any live device allocation",
        )

    def view(self, addr: int, nbytes: int, what: str) -> U8Array:
        """A writable ``uint8`` view of ``[addr, addr + nbytes)`` (a fault if out of bounds)."""
        data, offset = self.resolve(addr, nbytes, what)
        return data[offset : offset + nbytes]


class PinnedHit(NamedTuple):
    """One pinned allocation as ``PinnedMemory.find`` found it."""

    start: int
    end: int
    array: U8Array
    view: memoryview


class PinnedMemory:
    """Pinned host memory (``aclrtMallocHost``): 64-byte aligned numpy buffers the sim owns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._arrays: dict[int, U8Array] = {}  # real process address -> aligned view
        #: the same buffers as memoryviews (cheap slicing on the launch path); read-only use
        self.views: dict[int, memoryview] = {}
        #: the allocation ``find`` hit last: pool buffers are looked up again and again, and
        #: the launch path checks args inside a pooled slab against it in O(1) (never a stale
        #: one: free() clears it)
        self.last_hit: PinnedHit | None = None

    def malloc(self, size: int) -> int:
        raw = np.empty(size + _ALIGN, dtype=np.uint8)
        base = int(raw.ctypes.data)
        skip = (-base) % _ALIGN
        data = raw[skip : skip + size]
        data.fill(0)
        addr = base + skip
        with self._lock:
            self._arrays[addr] = data
            self.views[addr] = data.data
            bisect.insort(self._starts, addr)
        return addr

    def free(self, addr: int) -> bool:
        """Free (and poison) the allocation at ``addr``; False if it is not one."""
        with self._lock:
            data = self._arrays.pop(addr, None)
            if data is None:
                return False
            self.views.pop(addr, None)
            if self.last_hit is not None and self.last_hit[0] == addr:
                self.last_hit = None
            del self._starts[bisect.bisect_left(self._starts, addr)]
        # Queued work may still hold the array: a late reader sees poison, never freed memory.
        data.fill(POISON_BYTE)
        return True

    def count(self) -> int:
        return len(self._arrays)

    def clear(self) -> None:
        with self._lock:
            self.last_hit = None
            self._arrays.clear()
            self.views.clear()
            self._starts.clear()

    def find(self, addr: int, nbytes: int) -> tuple[U8Array, int] | None:
        """``(array, offset)`` if ``addr`` lies in pinned memory, else None (pageable).

        Raises ``ValueError`` when the range starts in a pinned allocation but runs past its end.
        """
        data = self._arrays.get(addr)
        if data is not None:
            if nbytes > data.shape[0]:
                raise ValueError(
                    f"{nbytes} bytes at pinned address {addr:#x} run past the end of its "
                    f"allocation ({data.shape[0]} bytes)"
                )
            return data, 0
        last = self.last_hit
        if last is not None and last[0] <= addr < last[1]:
            base, data = last[0], last[2]
        else:
            with self._lock:
                index = bisect.bisect_right(self._starts, addr) - 1
                if index < 0:
                    return None
                base = self._starts[index]
                data = self._arrays[base]
                self.last_hit = PinnedHit(base, base + data.shape[0], data, self.views[base])
        offset = addr - base
        if offset >= data.shape[0]:
            return None
        if offset + nbytes > data.shape[0]:
            raise ValueError(
                f"{nbytes} bytes at pinned address {addr:#x} run past the end of its "
                f"allocation at {base:#x} ({data.shape[0]} bytes)"
            )
        return data, offset
