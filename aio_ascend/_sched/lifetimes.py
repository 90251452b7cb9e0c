"""Lifetimes: nothing the device may still touch is freed or reused before it is done.

What it is for. A request queued on a stream may read or write device memory, a pinned host
buffer and the user's arrays until the device has run it, which is long after the call that
queued it returned. This module keeps all of those alive exactly that long: a deterministic
``record_stream``.

- Device allocations count the queued requests that use them: ``retained`` (taken when a request
  is enqueued) and ``unused`` (given back when it is released); ``uses`` is the difference.
  ``free()`` on an allocation still in use only marks it ``free_requested``: the release of its
  last user retires it. Only then does its block go back to the device's :class:`DevicePool`
  (cached for the next ``malloc``, or freed for ``malloc(pool=False)``), or its ``disposer``
  runs (a graph or a plan record, tracked like an allocation).
- A request's pinned host buffer goes back to the host pool, and its user objects are let go
  (``Request.let_go``), in :meth:`Lifetimes.release`: once its completion has been observed, or
  when it never reached the device (refused, expired, dropped). A shared args image is not given
  back by its launches: its owner (a plan, or the pool's close) does that.
- An allocation collected without ``free()`` cannot be in use (every queued request holds its
  allocations strongly); its block is given back by :meth:`Lifetimes.reap` on the loop, with a
  ``ResourceWarning``.
- Wrapped memory (``external``) is never freed here; retiring it only drops its ``owner``. Views
  are not tracked at all: they hold their root, and requests retain the root.

Who touches what.

- The loop thread: :meth:`retain` (``Scheduler.enqueue``), :meth:`free` (``DeviceBuffer.free``,
  which refuses other threads while the device is open), :meth:`reap` (at each flush, and on
  the loop's next turn after a collection), :meth:`close`. ``retained`` is written by the loop
  thread only, without the lock.
- Library threads (the poller for what completed, the submitter for what it refused or let
  expire; the loop too, for what a close drops): :meth:`release`, one call per round, taking the
  lock once. A block whose last user this was is given back on that thread (the device pool has
  its own lock; a graph's disposer binds the device context itself).
- The garbage collector, on any thread: the weak-reference callback of a collected allocation
  only appends it to ``dropped`` under the lock; the runtime call waits for the loop's
  :meth:`reap`, which binds the device context (a collection may run on another device's
  thread). The lock is reentrant because that callback can run on a thread that holds it: a
  wrapped buffer's retirement lets go of its ``owner`` under the lock, and the owner may be the
  last reference to one of the device's own buffers (``dev.wrap(buf.ptr, n, owner=buf)``); a
  collection set off by any allocation made under the lock does the same.

Why ``retained`` needs no lock: the loop never retains an allocation whose ``free()`` was called
(``Scheduler.enqueue`` refuses a request whose buffer was freed while it waited for admission),
and a releasing thread retires only what ``free()`` was called on, comparing ``unused`` with a
``retained`` that can no longer change.

What can go wrong: ``free()`` off the loop thread raises ``RuntimeError`` (after the close it
does nothing, from anywhere); a request whose buffer is freed before it is enqueued fails with
``ValueError``; work whose completion can never be observed (a broken context, a stream
destroyed by force) is never released here until the device's close, which releases its orphans
after the streams are gone and then gives every block, live or cached, back to the runtime
(:meth:`Lifetimes.close`).

The decisions (:meth:`Lifetimes.request_free`, :meth:`Lifetimes.unuse`) return what to give
back; :meth:`Lifetimes.release` carries them out.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from .._host.pool import HostBuffer, HostBufferPool
from .devpool import DevicePool
from .dropped import warn_resource

log = logging.getLogger("aio_ascend")

__all__ = ["Allocation", "FreedError", "Holder", "Lifetimes"]

#: what a tracked allocation gives back: ``(ptr, nbytes, block, pooled)``
_Site = tuple[int, int, int, bool]


class FreedError(ValueError):
    """Work was queued on an allocation whose ``free()`` had been called (:attr:`allocation`)."""

    def __init__(self, allocation: Allocation) -> None:
        super().__init__(f"{allocation!r} was freed")
        self.allocation = allocation


class Allocation:
    """Device memory tracked by :class:`Lifetimes`.

    :ivar ptr: the device address
    :ivar nbytes: its size in bytes
    :ivar retained: how many queued requests took it (written by the loop thread only)
    :ivar unused: how many of those are done with it (written under the registry's lock)
    :ivar free_requested: ``free()`` was called (the memory may still be in use)
    :ivar released: the memory has been given back to the runtime
    :ivar registry: the :class:`Lifetimes` of the device it belongs to
    :ivar owner: for memory someone else owns (``external``): what keeps it alive, referenced
        until the allocation is retired
    :ivar external: the memory is never freed here; retiring it only drops ``owner``
    :ivar block: the bytes of device memory held for it (its size class when ``pooled``; 0
        for wrapped memory and views, which hold none of their own)
    :ivar pooled: its block goes back to the device's pool (else to the runtime) when retired
    """

    __slots__ = (
        "__weakref__",
        "block",
        "disposer",
        "external",
        "free_requested",
        "nbytes",
        "owner",
        "pooled",
        "ptr",
        "registry",
        "released",
        "retained",
        "unused",
    )

    def __init__(
        self,
        registry: Lifetimes,
        ptr: int,
        nbytes: int,
        *,
        external: bool = False,
        owner: object = None,
        block: int = 0,
        pooled: bool = False,
    ) -> None:
        self.registry = registry
        self.ptr = ptr
        self.nbytes = nbytes
        self.block = block
        self.pooled = pooled
        self.retained = 0
        self.unused = 0
        self.free_requested = False
        self.released = False
        self.external = external
        self.owner = owner
        #: what retiring it does instead of freeing device memory (a graph: destroy it)
        self.disposer: Callable[[], None] | None = None

    @property
    def uses(self) -> int:
        """Queued requests that reference it."""
        return self.retained - self.unused

    def _refusal(self, kind: str) -> Exception:
        """The error of a request (``kind``) that was to use it, but found it freed once
        admitted (its ``free()`` was called while the request waited)."""
        return ValueError(f"{kind}: {self!r} was freed while the request waited for admission")


class Holder(Protocol):
    """What a request holds until the device is done with it (see ``work.Request``)."""

    host: HostBuffer | None
    buffers: tuple[Allocation, ...]
    holds_user: bool

    def let_go(self) -> None:
        """Drop the user objects it refers to (called when ``holds_user``)."""


class Lifetimes:
    """The device allocations alive on one device, and the release of finished requests.

    Thread-safe: the loop thread retains and frees, the library threads release.

    :param memory: the device's pool: where the blocks of retired allocations go back to
    :param pool: where requests' host buffers go back to
    :param check_thread: raises unless called on the device's loop thread (``free()`` belongs
        to it while the device is open)
    :param device_id: the device's number, for the warning about a buffer dropped unfreed
    :param on_dropped: asks the loop for a :meth:`reap` (any thread, once per collected batch)
    """

    def __init__(
        self,
        memory: DevicePool,
        pool: HostBufferPool,
        check_thread: Callable[[], None] | None = None,
        device_id: int = 0,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        #: the device's caching allocator (``Device.malloc`` takes its blocks from it)
        self.memory = memory
        #: (replaced when a close from a later event loop adopts the device)
        self.check_thread = check_thread
        self._device_id = device_id
        self._on_dropped = on_dropped
        self._pool = pool
        self._lock = threading.RLock()  # (reentrant: see the module's essay)
        # ptr -> a weak reference to the live allocation (a dropped one is collected)
        self._live: dict[int, weakref.ref[Allocation]] = {}
        self._sizes: dict[weakref.ref[Allocation], _Site] = {}
        #: allocations collected without free(), not given back yet (see reap)
        self.dropped: deque[_Site] = deque()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether the device has closed (everything was released then)."""
        return self._closed

    @property
    def live_count(self) -> int:
        """Allocations not yet given back to the runtime."""
        return len(self._live)

    def track(self, allocation: Allocation) -> None:
        """Start tracking a fresh allocation."""
        ref = weakref.ref(allocation, self._collected)
        with self._lock:
            self._live[allocation.ptr] = ref
            self._sizes[ref] = (
                allocation.ptr,
                allocation.nbytes,
                allocation.block,
                allocation.pooled,
            )

    def _collected(self, ref: weakref.ref[Allocation]) -> None:
        # Garbage collection, any thread: dropped without free() (queued work holds its
        # allocations, so none is in use). Freed by reap() on the loop thread, which binds
        # the device context: a collection may run on another device's thread.
        with self._lock:
            if self._closed:  # the close frees every site it holds (this may run inside it)
                return
            site = self._sizes.pop(ref, None)
            if site is None or self._live.get(site[0]) is not ref:
                return
            del self._live[site[0]]
            self.dropped.append(site)
            first = len(self.dropped) == 1
        if first and self._on_dropped is not None:  # (the reap takes every one queued by then)
            self._on_dropped()

    def reap(self) -> None:
        """Give back the allocations collected without ``free()`` since the last call, each
        with a ``ResourceWarning`` (loop thread)."""
        while self.dropped:
            ptr, nbytes, block, pooled = self.dropped.popleft()
            self.memory.give_back(ptr, block, nbytes, pooled=pooled)
            warn_resource(
                f"a DeviceBuffer ({nbytes} bytes at {ptr:#x}) of device {self._device_id} was "
                "garbage-collected without free(); its memory has been given back now"
            )

    def retain(self, allocations: tuple[Allocation, ...]) -> None:
        """A queued request uses ``allocations`` until it is released (loop thread).

        An allocation whose ``free()`` was called is never retained: :class:`FreedError`
        names it, and none of ``allocations`` is retained then.

        No lock: the loop thread is the one writer of ``retained``, and since a freed
        allocation is never retained, a releasing thread that reads ``retained`` while it
        changes never retires it early (it retires only what ``free()`` was called on).
        """
        for allocation in allocations:
            if allocation.free_requested:
                for taken in allocations:  # give back the ones before it
                    if taken is allocation:
                        break
                    taken.retained -= 1
                raise FreedError(allocation)
            allocation.retained += 1

    def request_free(self, allocation: Allocation) -> bool:
        """``free()`` was called: True if the memory should be freed now (nobody uses it)."""
        with self._lock:
            if allocation.free_requested:
                return False
            allocation.free_requested = True
            if allocation.retained != allocation.unused:
                return False  # the last user frees it
            return self._retire(allocation)

    def free(self, allocation: Allocation) -> None:
        """Free ``allocation`` now, or once the queued work that uses it has completed.

        :raises RuntimeError: called off the loop thread while the device is open (after the
            close it does nothing, from anywhere: everything has been released)
        """
        if self.check_thread is not None and not self._closed:
            self.check_thread()
        if self.request_free(allocation):
            self._dispose(allocation)

    def _dispose(self, allocation: Allocation) -> None:
        if allocation.disposer is not None:
            allocation.disposer()
        else:
            self.memory.give_back(
                allocation.ptr, allocation.block, allocation.nbytes, pooled=allocation.pooled
            )

    def unuse(self, allocations: Iterable[Allocation]) -> list[Allocation]:
        """Requests using ``allocations`` are done: the allocations now due to be freed."""
        with self._lock:
            return self._unuse(allocations, [])

    def _unuse(
        self, allocations: Iterable[Allocation], due: list[Allocation], uses: int = 1
    ) -> list[Allocation]:
        # (lock held) ``uses`` requests that each used ``allocations`` are done
        for allocation in allocations:
            allocation.unused += uses
            if (
                allocation.free_requested
                and allocation.unused == allocation.retained
                and self._retire(allocation)
            ):
                due.append(allocation)
        return due

    def release(self, requests: Iterable[Holder]) -> None:
        """Give back what finished requests held (any library thread, once the device is done).

        One lock for all of them: the poller releases a round's requests in one call. A run
        of requests holding the same tuple (a launch plan's launches share one) is given back
        as one count."""
        release_host = self._pool.release
        due: list[Allocation] = []
        holding: list[tuple[tuple[Allocation, ...], int]] = []
        run: tuple[Allocation, ...] = ()
        uses = 0
        for request in requests:
            host = request.host
            if host is not None:
                request.host = None
                if not host.shared:  # a shared args image goes back with its owner
                    release_host(host)
            buffers = request.buffers
            if buffers:
                request.buffers = ()
                if buffers is run:
                    uses += 1
                else:
                    if uses:
                        holding.append((run, uses))
                    run, uses = buffers, 1
            if request.holds_user:
                request.let_go()
        if uses:
            holding.append((run, uses))
            with self._lock:
                for buffers, count in holding:
                    self._unuse(buffers, due, count)
        for allocation in due:
            try:
                self._dispose(allocation)
            except Exception as exc:  # a free the runtime refused: that block leaks, and the
                # thread (the poller, mostly) goes on; a user's own free() raises it instead
                log.error("device %d: freeing %r failed: %r", self._device_id, allocation, exc)

    def close(self) -> None:
        """On close: every allocation still alive is marked released, and the pool frees its
        block with every cached one (the runtime gets back all the memory it gave)."""
        with self._lock:
            self._closed = True
            live, self._live = self._live, {}
            sites = list(self._sizes.values()) + list(self.dropped)
            self._sizes.clear()
            self.dropped.clear()
        for ref in live.values():
            allocation = ref()
            if allocation is not None:
                allocation.free_requested = allocation.released = True
        self.memory.close([(ptr, block) for ptr, _, block, _ in sites])

    def leave_to_runtime(self) -> None:
        """The device's close gave up on a thread stuck in a runtime call: from now on nothing
        is freed here (``free()`` does nothing, as after a close); what is alive goes with the
        runtime's own close, once the stuck call has returned (``shutdown.close_after``)."""
        with self._lock:
            self._closed = True

    def _retire(self, allocation: Allocation) -> bool:
        # (lock held) The allocation is done: True if it still had to be freed.
        if allocation.released:
            return False
        if allocation.external:  # someone else's memory: only let go of its owner
            allocation.released = True
            allocation.owner = None
            return False
        if self._closed:
            return False
        allocation.released = True
        ref = self._live.pop(allocation.ptr, None)
        if ref is not None:
            self._sizes.pop(ref, None)
        return True
