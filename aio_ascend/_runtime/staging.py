"""Per-stream device staging for launch args: a fenced ring reused only after completion, the
never-reused staging of a stream capture (:class:`CaptureStaging`), and the placeholder patches
that point an args image's slots at its device copy.

Shared by the backends that put args in device memory themselves: ``cuda`` (placeholder data
for ``cuLaunchKernel``) and ``acl`` on CANN 8.0's device-args path (``aclrtLaunchKernel``).
Generic over :class:`RingOps` (device memory and fence events) and an allocation function, so
both are unit-tested without a device, cuda-bindings or libascendcl.
"""

from __future__ import annotations

import ctypes
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from .._errors import InternalError

__all__ = [
    "CAPTURE_CHUNK_BYTES",
    "DEFAULT_STAGING_BYTES",
    "FENCE_EVERY",
    "MAX_STAGING_ALIGN",
    "MIN_STAGING_ALIGN",
    "CaptureStaging",
    "RingOps",
    "StagingRing",
    "apply_patches",
    "placeholder_patches",
    "staging_alignment",
]

#: initial size of each stream's placeholder staging ring (it grows for larger args)
DEFAULT_STAGING_BYTES = 256 * 1024
#: the largest placeholder alignment ``HostArgs`` allows (and the ring's base alignment)
MAX_STAGING_ALIGN = 4096
#: smallest alignment of a staged args image on the device
MIN_STAGING_ALIGN = 64
#: staged launches between two fence events of a ring
FENCE_EVERY = 64
#: device memory a capture's staging takes at a time (a larger args image gets its own block)
CAPTURE_CHUNK_BYTES = 64 * 1024


def staging_alignment(entries: Sequence[tuple[int, int]]) -> int:
    """Alignment of the device copy of an args image so that each data block keeps its own.

    Data at ``dataOffset`` d is aligned (in the host image) to the lowest set bit of d; a device
    region aligned to the largest of those keeps every block's alignment at ``region + d``.
    At least :data:`MIN_STAGING_ALIGN`, at most :data:`MAX_STAGING_ALIGN`.
    """
    align = MIN_STAGING_ALIGN
    for _, data_offset in entries:
        if data_offset:
            align = max(align, data_offset & -data_offset)
    return min(align, MAX_STAGING_ALIGN)


_U64 = struct.Struct("<Q")


def placeholder_patches(entries: Sequence[tuple[int, int]], region: int) -> list[tuple[int, bytes]]:
    """``(addrOffset, uint64 little-endian bytes)`` to write into an args image.

    The args image ``[0, argsSize)`` is copied to device address ``region``, so the data of
    each placeholder lies at ``region + dataOffset``.
    """
    return [(addr_offset, _U64.pack(region + data_offset)) for addr_offset, data_offset in entries]


def apply_patches(args_addr: int, patches: Sequence[tuple[int, bytes]]) -> None:
    """Write each patch at ``args_addr + offset`` (host memory the caller owns)."""
    for offset, data in patches:
        ctypes.memmove(args_addr + offset, data, len(data))


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class RingOps(Protocol):
    """What a :class:`StagingRing` needs from its runtime (device memory and fence events)."""

    def alloc(self, nbytes: int) -> int:
        """Device memory of ``nbytes``; returns its address."""
        ...

    def free(self, address: int) -> None:
        """Free memory from :meth:`alloc`."""
        ...

    def record(self) -> object:
        """Record a fence on the ring's stream, capturing the work submitted so far."""
        ...

    def done(self, fence: object) -> bool:
        """Whether the fence's captured work has completed (never blocks)."""
        ...

    def wait(self, fence: object) -> None:
        """Block until the fence's captured work has completed."""
        ...

    def release(self, fence: object) -> None:
        """The fence is no longer needed (completed or discarded)."""
        ...


class StagingRing:
    """Per-stream device staging for placeholder data: a ring reused only after completion.

    Each staged launch takes a region with :meth:`allocate` (its copy and launch are queued on
    the stream right after) and reports it with :meth:`committed`. Regions are grouped; a group
    is closed by recording a fence on the stream every :data:`FENCE_EVERY` launches (or a quarter
    of the ring), and its bytes are reused only once its fence reads complete, so no copy can
    overwrite data that a queued kernel has yet to read. When the ring is full, the oldest
    group's fence is waited for (the stream is FIFO); a region larger than the ring makes it
    grow once everything queued has completed. Not thread-safe: the runtime serialises each
    stream's launches.
    """

    __slots__ = (
        "_base",
        "_capacity",
        "_fence_every",
        "_groups",
        "_head",
        "_open_bytes",
        "_open_count",
        "_open_start",
        "_ops",
        "_raw",
        "stats",
    )

    def __init__(
        self, ops: RingOps, capacity: int = DEFAULT_STAGING_BYTES, fence_every: int = FENCE_EVERY
    ) -> None:
        if capacity < MAX_STAGING_ALIGN:
            raise ValueError(f"staging capacity={capacity} must be at least {MAX_STAGING_ALIGN}")
        if fence_every < 1:
            raise ValueError(f"fence_every={fence_every} must be >= 1")
        self._ops = ops
        self._fence_every = fence_every
        self._capacity = 0
        self._raw = 0
        self._base = 0
        self._head = 0
        #: closed groups in allocation order: [start offset, fence]
        self._groups: deque[tuple[int, object]] = deque()
        self._open_start: int | None = None
        self._open_count = 0
        self._open_bytes = 0
        #: counters: allocations, fences recorded, waits (blocking), grows
        self.stats = {"allocations": 0, "fences": 0, "waits": 0, "grows": 0}
        self._map(capacity)

    def _map(self, capacity: int) -> None:
        raw = self._ops.alloc(capacity + MAX_STAGING_ALIGN)
        self._raw = raw
        self._base = _align_up(raw, MAX_STAGING_ALIGN)
        self._capacity = capacity
        self._head = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def base(self) -> int:
        """Device address of offset 0 (aligned to :data:`MAX_STAGING_ALIGN`)."""
        return self._base

    def _live_start(self) -> int | None:
        if self._groups:
            return self._groups[0][0]
        return self._open_start

    def _try_place(self, nbytes: int, align: int) -> int | None:
        lo = self._live_start()
        if lo is None:  # nothing live: start over at the beginning
            self._head = 0
            return 0 if nbytes <= self._capacity else None
        head = self._head
        offset = _align_up(head, align)
        if head > lo:  # live data is [lo, head): free are [head, capacity) and [0, lo)
            if offset + nbytes <= self._capacity:
                return offset
            if nbytes <= lo:
                return 0
            return None
        # wrapped (head <= lo): free is [head, lo)
        if offset + nbytes <= lo:
            return offset
        return None

    def _retire_completed(self) -> bool:
        retired = False
        groups = self._groups
        while groups and self._ops.done(groups[0][1]):
            _, fence = groups.popleft()
            self._ops.release(fence)
            retired = True
        return retired

    def _close_open(self) -> None:
        if self._open_start is None:
            return
        fence = self._ops.record()
        self.stats["fences"] += 1
        self._groups.append((self._open_start, fence))
        self._open_start = None
        self._open_count = 0
        self._open_bytes = 0

    def _wait_oldest(self) -> None:
        if not self._groups:
            self._close_open()
        if not self._groups:
            raise InternalError("staging ring is full but holds nothing")
        _, fence = self._groups[0]
        self.stats["waits"] += 1
        self._ops.wait(fence)
        self._groups.popleft()
        self._ops.release(fence)

    def _drain(self) -> None:
        self._close_open()
        while self._groups:
            self._wait_oldest()

    def _grow(self, nbytes: int, align: int) -> None:
        self._drain()
        self.stats["grows"] += 1
        capacity = max(self._capacity * 2, MAX_STAGING_ALIGN)
        while capacity < nbytes + align:
            capacity *= 2
        self._ops.free(self._raw)
        self._raw = 0
        self._map(capacity)

    def allocate(self, nbytes: int, align: int) -> int:
        """A device region of ``nbytes`` aligned to ``align`` (<= :data:`MAX_STAGING_ALIGN`).

        May block until queued work of the stream completes (ring full), or grow the ring.
        """
        if nbytes <= 0:
            raise ValueError(f"nbytes={nbytes} must be > 0")
        if align <= 0 or align & (align - 1) or align > MAX_STAGING_ALIGN:
            raise ValueError(f"align={align} must be a power of two <= {MAX_STAGING_ALIGN}")
        if nbytes > self._capacity:
            self._grow(nbytes, align)
        while True:
            offset = self._try_place(nbytes, align)
            if offset is not None:
                break
            if not self._retire_completed():
                self._wait_oldest()
        self._head = offset + nbytes
        if self._open_start is None:
            self._open_start = offset
        self.stats["allocations"] += 1
        return self._base + offset

    def committed(self, nbytes: int) -> None:
        """The copy (and launch) using the last region were submitted: maybe close the group."""
        self._open_count += 1
        self._open_bytes += nbytes
        if self._open_count >= self._fence_every or self._open_bytes * 4 >= self._capacity:
            self._close_open()

    def close(self, free: bool = True) -> int:
        """Drop every fence; free the device memory unless ``free`` is false.

        Returns the raw allocation when it was not freed (the caller frees it later, once the
        device no longer uses it), else 0.
        """
        for _, fence in self._groups:
            self._ops.release(fence)
        self._groups.clear()
        self._open_start = None
        raw, self._raw = self._raw, 0
        if raw and free:
            self._ops.free(raw)
            return 0
        return raw


class CaptureStaging:
    """The placeholder staging of one stream capture: device memory that is never reused.

    A captured launch's args image is copied (at every replay) into the region it was given at
    capture time, so the region must stay the graph's own: a ring slot would be reused by
    later launches of the stream between two replays. Regions are carved from blocks of
    :data:`CAPTURE_CHUNK_BYTES` (``alloc`` gives device memory); every block is in
    :attr:`blocks` until the graph, or the failed capture, frees them.
    """

    __slots__ = ("_alloc", "_chunk", "_cursor", "_end", "blocks")

    def __init__(self, alloc: Callable[[int], int], chunk: int = CAPTURE_CHUNK_BYTES) -> None:
        if chunk < MAX_STAGING_ALIGN:
            raise ValueError(f"chunk={chunk} must be at least {MAX_STAGING_ALIGN}")
        self._alloc = alloc
        self._chunk = chunk
        self._cursor = 0
        self._end = 0
        #: device allocations made so far (the caller frees them)
        self.blocks: list[int] = []

    def allocate(self, nbytes: int, align: int) -> int:
        """A device region of ``nbytes`` aligned to ``align`` (<= :data:`MAX_STAGING_ALIGN`)."""
        if nbytes <= 0:
            raise ValueError(f"nbytes={nbytes} must be > 0")
        if align <= 0 or align & (align - 1) or align > MAX_STAGING_ALIGN:
            raise ValueError(f"align={align} must be a power of two <= {MAX_STAGING_ALIGN}")
        region = _align_up(self._cursor, align)
        if not self.blocks or region + nbytes > self._end:
            size = max(self._chunk, nbytes + align)
            block = self._alloc(size)
            self.blocks.append(block)
            self._end = block + size
            region = _align_up(block, align)
        self._cursor = region + nbytes
        return region
