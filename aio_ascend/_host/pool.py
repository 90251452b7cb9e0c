"""``HostBufferPool``: reusable pinned host buffers by size class.

Buffers come from the runtime's ``malloc_host`` (pinned memory on real hardware) and go back to
the pool only when the scheduler has *observed* the completion of the task that used them, so a
buffer the device may still read is never handed out again. Steady state allocates nothing.

Debug mode (``debug=True``) surrounds every buffer with guard bytes and poisons it on release;
on reuse it checks that the guards are intact (no overrun) and the poison is untouched (nobody
wrote to a released buffer). Violations are counted in ``stats()`` and reported.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

from .._errors import InternalError
from .._runtime.hostmem import host_view

__all__ = ["DEFAULT_RETAINED_BYTES", "HostBuffer", "HostBufferPool"]

_MIN_CLASS = 64
_SLAB_BYTES = 64 * 1024  # small size classes are allocated this many bytes at a time
_SLAB_MAX_CLASS = 4096
_GUARD = 64
#: free pinned bytes a pool keeps for reuse by default (``open_device(pinned_pool_bytes=)``)
DEFAULT_RETAINED_BYTES = 256 << 20
GUARD_BYTE = 0xA5
POISON_BYTE = 0xDB


class HostBuffer:
    """One pinned buffer lent by a :class:`HostBufferPool`.

    :ivar addr: host address of the usable region (64-byte aligned)
    :ivar capacity: usable bytes (the size class)
    :ivar view: a writable ``memoryview`` of the usable region
    :ivar shared: pinned by :meth:`HostBufferPool.pin`: read by many requests, given back by
        its owner (``unpin``), never by a request that used it
    """

    __slots__ = ("addr", "alloc", "base", "capacity", "in_use", "shared", "view")

    def __init__(self, alloc: int, base: int, addr: int, capacity: int, view: memoryview) -> None:
        # the malloc_host address to free with this buffer (0: it lives in a shared slab)
        self.alloc = alloc
        # where its leading guard bytes start (== addr without debug guards)
        self.base = base
        self.addr = addr
        self.capacity = capacity
        self.view = view
        self.in_use = False
        self.shared = False

    def __repr__(self) -> str:
        state = "in use" if self.in_use else "free"
        return f"<HostBuffer {self.addr:#x} capacity={self.capacity} {state}>"


def size_class(nbytes: int) -> int:
    """The capacity a request for ``nbytes`` is served from (a power of two, at least 64)."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    return 1 << (nbytes - 1).bit_length()


class HostBufferPool:
    """Thread-safe pool of pinned host buffers.

    :param malloc_host: allocate ``size`` pinned bytes, return the address (runtime call)
    :param free_host: free an address returned by ``malloc_host``
    :param debug: guard bytes + poison on release + canary checks on reuse
    :param max_cached_class: buffers of a larger size class are freed on release, not cached
    :param retained_bytes: free buffers of their own allocation are kept up to this many bytes
        in all; one released beyond it is freed (so a burst of big copies is given back)
    """

    def __init__(
        self,
        malloc_host: Callable[[int], int],
        free_host: Callable[[int], None],
        *,
        debug: bool = False,
        max_cached_class: int = 1 << 62,
        retained_bytes: int = DEFAULT_RETAINED_BYTES,
    ) -> None:
        if isinstance(retained_bytes, bool) or not isinstance(retained_bytes, int):
            raise TypeError(f"retained_bytes must be an int, got {type(retained_bytes).__name__}")
        if retained_bytes < 0:
            raise ValueError(f"retained_bytes={retained_bytes} must be >= 0")
        self._retained_bytes = retained_bytes
        self._held_bytes = 0  # pinned bytes allocated and not freed (slabs included)
        self._free_own_bytes = 0  # cached free buffers that have an allocation of their own
        self._malloc_host = malloc_host
        self._free_host = free_host
        self._debug = debug
        self._max_cached_class = max_cached_class
        self._lock = threading.Lock()  # slow paths only (allocation, close, stats)
        # Free lists per size class. list.append/list.pop are atomic under the GIL, so the hot
        # path (acquire on the loop, release on the poller) takes no lock.
        self._free: dict[int, list[HostBuffer]] = {}
        # Every live buffer is either in a free list or in use, so no counter is needed on the
        # hot path: in use = allocated - freed - cached.
        self._allocations = 0  # malloc_host calls
        self._owned = 0  # buffers created
        self._discarded = 0  # buffers freed
        self._slabs: list[int] = []
        # buffers lent by pin() and not unpinned: not "in use" by requests, freed at close
        self._pinned: set[HostBuffer] = set()
        self._violations = 0
        self._closed = False
        self._guard = bytes([GUARD_BYTE]) * _GUARD

    @property
    def debug(self) -> bool:
        """Whether guard bytes and poisoning are on."""
        return self._debug

    def _in_use(self) -> int:
        cached = sum(len(bucket) for bucket in list(self._free.values()))
        return self._owned - self._discarded - cached - len(self._pinned)

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least ``nbytes`` (its contents are unspecified)."""
        capacity = size_class(nbytes)
        if self._closed:
            raise InternalError("HostBufferPool used after close")
        bucket = self._free.get(capacity)
        try:
            buf = bucket.pop() if bucket is not None else None
        except IndexError:
            buf = None
        if buf is None:
            buf = self._allocate(capacity)
        else:
            if buf.alloc:
                with self._lock:
                    self._free_own_bytes -= capacity
            if self._debug:
                self._check(buf, poisoned=True)
        buf.in_use = True
        return buf

    def pin(self, data: bytes) -> HostBuffer:
        """A buffer holding ``data``, shared by the requests that read it (``shared``): kept
        until :meth:`unpin` or the pool's close, not counted as in use by requests."""
        buf = self.acquire(len(data))
        buf.view[: len(data)] = data
        buf.shared = True
        with self._lock:
            self._pinned.add(buf)
        return buf

    def unpin(self, buf: HostBuffer) -> None:
        """Give back a buffer of :meth:`pin` (nothing can read it any more). After the pool's
        close it was freed already: nothing to do."""
        with self._lock:
            if buf not in self._pinned:
                return
            self._pinned.discard(buf)
        buf.shared = False
        self.release(buf)

    def release(self, buf: HostBuffer) -> None:
        """Give ``buf`` back; call only once the device can no longer read it."""
        if not buf.in_use:
            raise InternalError(f"{buf!r} released twice")
        buf.in_use = False
        if self._debug:
            self._check(buf, poisoned=False)
            buf.view[:] = bytes([POISON_BYTE]) * buf.capacity
        if buf.alloc:  # an allocation of its own: cached within the retained budget
            with self._lock:
                keep = (
                    not self._closed
                    and buf.capacity <= self._max_cached_class
                    and self._free_own_bytes + buf.capacity <= self._retained_bytes
                )
                if keep:
                    self._free_own_bytes += buf.capacity
                else:
                    self._discarded += 1
                    self._held_bytes -= self._stride(buf.capacity)
            if not keep:
                self._free_host(buf.alloc)
                return
        if self._closed:
            with self._lock:
                self._discarded += 1
        else:
            bucket = self._free.get(buf.capacity)
            if bucket is None:
                with self._lock:
                    bucket = self._free.setdefault(buf.capacity, [])
            bucket.append(buf)

    def _allocate(self, capacity: int) -> HostBuffer:
        # Small classes are carved from one slab per malloc_host call (pinning memory can be
        # slow, and the loop thread pays for it); larger ones get an allocation each.
        guard = _GUARD if self._debug else 0
        stride = capacity + 2 * guard
        slab = capacity <= min(_SLAB_MAX_CLASS, self._max_cached_class)
        count = max(1, _SLAB_BYTES // stride) if slab else 1
        alloc = self._malloc_host(stride * count)
        buffers = []
        for index in range(count):
            base = alloc + index * stride
            addr = base + guard
            buf = HostBuffer(
                alloc if count == 1 else 0, base, addr, capacity, host_view(addr, capacity)
            )
            if self._debug:
                host_view(base, guard)[:] = self._guard
                host_view(addr + capacity, guard)[:] = self._guard
                buf.view[:] = bytes([POISON_BYTE]) * capacity
            buffers.append(buf)
        with self._lock:
            self._allocations += 1
            self._held_bytes += stride * count
            self._owned += count
            if count > 1:
                self._slabs.append(alloc)
            spare = buffers[1:]
            if spare:
                self._free.setdefault(capacity, []).extend(spare)
        return buffers[0]

    def _stride(self, capacity: int) -> int:
        return capacity + (2 * _GUARD if self._debug else 0)

    def _check(self, buf: HostBuffer, *, poisoned: bool) -> None:
        before = host_view(buf.base, _GUARD)
        after = host_view(buf.addr + buf.capacity, _GUARD)
        problems = []
        if before != self._guard or after != self._guard:
            problems.append("guard bytes overwritten (buffer overrun)")
        if poisoned and buf.view.tobytes().count(POISON_BYTE) != buf.capacity:
            problems.append("written after release (use after free)")
        if problems:
            with self._lock:
                self._violations += 1
            warnings.warn(
                f"HostBufferPool canary: {buf!r}: {'; '.join(problems)}",
                RuntimeWarning,
                stacklevel=3,
            )
            if self._debug:
                # Restore the canary so one violation is reported once.
                host_view(buf.base, _GUARD)[:] = self._guard
                host_view(buf.addr + buf.capacity, _GUARD)[:] = self._guard

    def stats(self) -> dict[str, int]:
        """``in_use``, ``free`` (buffers), ``high_water`` (buffers owned), ``allocations``,
        canary ``violations``, ``bytes`` (pinned bytes held) and ``free_bytes`` (of free
        buffers)."""
        with self._lock:
            return {
                "in_use": self._in_use(),
                "free": sum(len(bucket) for bucket in self._free.values()),
                "high_water": self._owned - self._discarded,
                "allocations": self._allocations,
                "violations": self._violations,
                "bytes": self._held_bytes,
                "free_bytes": sum(
                    capacity * len(bucket) for capacity, bucket in self._free.items()
                ),
            }

    def close(self) -> int:
        """Free every cached buffer; return how many buffers were still in use (and warn)."""
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            cached = [buf for bucket in self._free.values() for buf in bucket]
            cached.extend(self._pinned)  # their owners outlive the device: freed with it
            self._pinned.clear()
            self._free.clear()
            self._discarded += len(cached)
            leaked = self._owned - self._discarded
            slabs, self._slabs = self._slabs, []
        for buf in cached:
            buf.view.release()
            if buf.alloc:
                self._free_host(buf.alloc)
        with self._lock:
            self._free_own_bytes = 0
            self._held_bytes = 0
        # A slab goes with every buffer in it, leaked ones included (reported below).
        for alloc in slabs:
            self._free_host(alloc)
        if leaked:
            warnings.warn(
                f"HostBufferPool closed with {leaked} buffer(s) still in use",
                ResourceWarning,
                stacklevel=2,
            )
        return leaked
