"""``DevicePool``: one device's caching allocator of device memory.

``Device.malloc`` takes a block of the request's size class from the pool, or from the runtime
when none is cached. A freed buffer's block comes back here only once the work queued on it has
completed (:class:`~aio_ascend._sched.lifetimes.Lifetimes` decides when, as it decided when to
free before: the pool never sees a block the device may still touch), so the next ``malloc``
of that class may take it at once. Cached blocks go back to the runtime on
:meth:`DevicePool.empty_cache`, when an allocation would pass the device's limit, when the
runtime runs out of memory (then the allocation is retried once), and at the close.

Size classes: at most 512 bytes: one class of 512; up to 64 MiB: four classes per power of two
(``2**k * 1.25, 1.5, 1.75, 2``: at most 25 % over the request); above: multiples of 2 MiB.
A request takes the smallest cached block of its class or of a larger one up to twice its
class (:data:`MAX_OVERSIZE`; blocks are never split). Measured on 10,000 malloc/free cycles of
log-uniform sizes from 1 B to 4 MiB with 5 buffers alive at a time (the simulation in
``python -m pytest tests/unit/test_devpool.py -k ten_thousand``): 109 runtime allocations with
exact classes only, 44 with blocks up to twice the class, 34 with four times.

Thread-safe: the loop thread allocates, any library thread may give a block back.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Callable

from .._errors import AclCode, MemoryAllocationError
from .._runtime.abi import MALLOC_APPEND_SIZE, SIZE_MAX, UINT64_MAX
from .binding import ContextBinding

__all__ = [
    "COUNTER_KEYS",
    "LARGE_BLOCK",
    "LARGE_STEP",
    "MAX_OVERSIZE",
    "MIN_BLOCK",
    "DevicePool",
    "block_size",
    "device_pool",
]

#: the smallest block (and the class of every request up to it)
MIN_BLOCK = 512
#: requests above this are rounded to :data:`LARGE_STEP` instead of a fraction of a power of 2
LARGE_BLOCK = 64 << 20
#: the rounding of requests above :data:`LARGE_BLOCK` (at most 3 % over them)
LARGE_STEP = 2 << 20

#: a cached block serves requests whose class is at least 1/MAX_OVERSIZE of its size
MAX_OVERSIZE = 2

#: the ``memory_stats()`` keys that only grow (exported as counters)
COUNTER_KEYS = frozenset(
    {
        "allocations",
        "pool_hits",
        "runtime_allocations",
        "runtime_frees",
        "runtime_leaks",
        "oom_retries",
    }
)


def block_size(nbytes: int) -> int:
    """The size class of a request of ``nbytes`` (> 0): the block the pool hands out for it."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    # (2**k, 2**(k+1)] in steps of 2**(k-2)
    step = LARGE_STEP if nbytes > LARGE_BLOCK else 1 << ((nbytes - 1).bit_length() - 3)
    # (never past what a runtime can be asked for: such a request gets its out-of-memory
    # answer, not a refusal of a size nobody asked for)
    return min(-(-nbytes // step) * step, UINT64_MAX)


class DevicePool:
    """Device memory of one device: blocks in use, cached blocks by size class, counters.

    :param malloc: the runtime's allocation (binds the device context itself)
    :param free: the runtime's free (binds the device context itself)
    :param poison: fills a block that comes back to the cache (the sim: a late reader through
        a stale address sees the pattern instead of the next owner's data); None: nothing
    :param extent: ``(address, nbytes)``: a pooled block goes to a request of ``nbytes`` (the
        sim faults on an access past them, as in an allocation of that size); None: nothing
    :param limit: the most bytes held from the runtime (in use and cached); None: no limit
    :param leaks: how many blocks the runtime leaked instead of freeing (None: it never does)
    """

    def __init__(
        self,
        malloc: Callable[[int], int],
        free: Callable[[int], None],
        *,
        poison: Callable[[int], None] | None = None,
        extent: Callable[[int, int], None] | None = None,
        limit: int | None = None,
        leaks: Callable[[], int] | None = None,
    ) -> None:
        self._malloc = malloc
        self._leaks = leaks
        self._free = free
        self._poison = poison
        self._extent = extent
        self.limit = limit
        self._lock = threading.Lock()
        self._cached: dict[int, list[int]] = {}  # size class -> idle block addresses (LIFO)
        self._sizes: list[int] = []  # the classes with cached blocks, sorted
        self._closed = False
        self._allocated = 0
        self._requested = 0
        self._reserved = 0
        self._cached_bytes = 0
        self._cached_blocks = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._allocations = 0
        self._hits = 0
        self._runtime_allocations = 0
        self._runtime_frees = 0
        self._oom_retries = 0

    def allocate(self, nbytes: int, *, pooled: bool = True) -> tuple[int, int]:
        """``(address, block bytes)`` for a request of ``nbytes``: a cached block of its class,
        else a new one (``pooled=False``: exactly ``nbytes`` from the runtime, never cached).

        :raises MemoryAllocationError: over the limit, or the runtime is out of memory even
            after the cache was emptied
        """
        size = block_size(nbytes) if pooled else nbytes
        if size > SIZE_MAX - MALLOC_APPEND_SIZE:
            # the runtime refuses it as a bad parameter (its size overflows with the padding it
            # adds): to the user it is what it is, more memory than any device has
            raise MemoryAllocationError(
                f"malloc({nbytes}): more memory than any device has",
                code=AclCode.RT_MEMORY_ALLOCATION.value,
            )
        with self._lock:
            self._allocations += 1
            hit: int | None = None
            if pooled:
                sizes = self._sizes
                index = bisect.bisect_left(sizes, size)
                if index < len(sizes) and sizes[index] <= MAX_OVERSIZE * size:
                    size = sizes[index]
                    blocks = self._cached[size]
                    hit = blocks.pop()
                    if not blocks:
                        del self._cached[size]
                        del sizes[index]
                    self._hits += 1
                    self._cached_bytes -= size
                    self._cached_blocks -= 1
                    self._take(size, nbytes)
            over = hit is None and self.limit is not None and self._reserved + size > self.limit
        if hit is not None:
            if self._extent is not None:
                self._extent(hit, nbytes)
            return hit, size
        if over:
            self.empty_cache()
            with self._lock:
                if self.limit is not None and self._reserved + size > self.limit:
                    raise MemoryAllocationError(
                        f"malloc({nbytes}): a {size}-byte block would take the device's memory "
                        f"past pool_limit_bytes={self.limit} ({self._reserved} bytes held, "
                        "none of them cached)",
                        code=AclCode.RT_MEMORY_ALLOCATION.value,
                    )
        try:
            ptr = self._malloc(size)
        except MemoryAllocationError:
            # Cached blocks are idle memory of ours: give them back and try once more.
            with self._lock:
                if not self._cached_blocks:
                    raise
                self._oom_retries += 1
            self.empty_cache()
            ptr = self._malloc(size)
        with self._lock:
            self._runtime_allocations += 1
            self._reserved += size
            self._peak_reserved = max(self._peak_reserved, self._reserved)
            self._take(size, nbytes)
        if pooled and self._extent is not None:
            self._extent(ptr, nbytes)
        return ptr, size

    def _take(self, size: int, nbytes: int) -> None:
        # (lock held) A block goes to a user buffer.
        self._allocated += size
        self._requested += nbytes
        self._peak_allocated = max(self._peak_allocated, self._allocated)

    def give_back(self, ptr: int, size: int, nbytes: int, *, pooled: bool) -> None:
        """A buffer's block is no longer used by anything (its work has completed): cache it
        (``pooled``) or free it. After :meth:`close` nothing is done (it freed everything)."""
        # The block stops counting as allocated in the same locked step that counts it cached
        # or freed: a reader on another thread (memory_stats) never sees it as neither.
        with self._lock:
            if self._closed:
                return
        if not pooled:
            self._release(ptr, size, taken=nbytes)
            return
        if self._poison is not None:
            self._poison(ptr)
        self._cache(ptr, size, taken=nbytes)

    def _untake(self, size: int, nbytes: int | None) -> None:
        # (lock held) A user buffer's block (its ``nbytes`` asked for) is no longer in use.
        if nbytes is not None:
            self._allocated -= size
            self._requested -= nbytes

    def _cache(self, ptr: int, size: int, *, taken: int | None = None) -> None:
        # An idle block joins the cache; after the close (which freed the rest) it is freed.
        with self._lock:
            closed = self._closed
            if not closed:
                self._untake(size, taken)
                blocks = self._cached.get(size)
                if blocks is None:
                    blocks = self._cached[size] = []
                    bisect.insort(self._sizes, size)
                blocks.append(ptr)
                self._cached_bytes += size
                self._cached_blocks += 1
        if closed:
            self._release(ptr, size, closing=True)

    def _release(
        self, ptr: int, size: int, *, closing: bool = False, taken: int | None = None
    ) -> None:
        # A block back to the runtime (``taken``: a user buffer's, of that many bytes asked).
        try:
            if closing:
                with contextlib.suppress(Exception):
                    self._free(ptr)
            else:
                self._free(ptr)
        except BaseException:
            with self._lock:  # (its buffer is gone all the same; the block stays reserved)
                if not self._closed:
                    self._untake(size, taken)
            raise
        with self._lock:
            if not self._closed:  # (the close counted everything out already)
                self._untake(size, taken)
            self._reserved -= size
            self._runtime_frees += 1

    def empty_cache(self) -> int:
        """Give every cached block back to the runtime; the bytes given back.

        A block whose free raises stays cached (held and counted, tried again by the next
        ``empty_cache`` or the close); the others are freed all the same, then the first
        error is raised."""
        with self._lock:
            cached, self._cached = self._cached, {}
            self._sizes = []
            self._cached_bytes = self._cached_blocks = 0
        released = 0
        kept: list[tuple[int, int]] = []
        error: Exception | None = None
        for size, blocks in cached.items():
            for ptr in blocks:
                try:
                    self._release(ptr, size, closing=self._closed)
                except Exception as exc:
                    kept.append((ptr, size))
                    error = error or exc
                else:
                    released += size
        if error is not None:
            for ptr, size in kept:
                self._cache(ptr, size)
            raise error
        return released

    def close(self, live: list[tuple[int, int]]) -> None:
        """The device closes: free the cached blocks and ``live`` ``(address, block bytes)``
        (the blocks of buffers still alive, which nothing can use any more)."""
        with self._lock:
            self._closed = True
            self._allocated = self._requested = 0
        self.empty_cache()
        for ptr, size in live:
            self._release(ptr, size, closing=True)

    def stats(self) -> dict[str, int]:
        """What ``Device.memory_stats()`` returns (see there)."""
        with self._lock:
            return {
                "allocated_bytes": self._allocated,
                "requested_bytes": self._requested,
                "reserved_bytes": self._reserved,
                "cached_bytes": self._cached_bytes,
                "cached_blocks": self._cached_blocks,
                "peak_allocated_bytes": self._peak_allocated,
                "peak_reserved_bytes": self._peak_reserved,
                "limit_bytes": 0 if self.limit is None else self.limit,
                "allocations": self._allocations,
                "pool_hits": self._hits,
                "runtime_allocations": self._runtime_allocations,
                "runtime_frees": self._runtime_frees,
                "runtime_leaks": 0 if self._leaks is None else self._leaks(),
                "oom_retries": self._oom_retries,
            }


def device_pool(binding: ContextBinding, limit: int | None) -> DevicePool:
    """The pool of the device behind ``binding``: runtime calls bind its context. A backend
    that can fill its device memory from the host (the sim's ``poison_device``) poisons the
    blocks that come back; one that can bound its kernels' accesses (the sim's
    ``limit_device``) bounds each block to its request."""
    runtime = binding.runtime
    poison: Callable[[int], None] | None = getattr(runtime, "poison_device", None)
    extent: Callable[[int, int], None] | None = getattr(runtime, "limit_device", None)
    return DevicePool(
        binding.wrap(runtime.malloc),
        binding.wrap(runtime.free),
        poison=poison,
        extent=extent,
        limit=limit,
        leaks=runtime.leaked_device_blocks,
    )
