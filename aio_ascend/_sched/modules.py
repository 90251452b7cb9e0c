"""Loaded binaries, tracked like allocations: a module is unloaded only once nothing can run
its kernels any more.

Why. ``aclrtBinaryUnLoad`` frees the binary's device code and its function handles; a kernel
of it still queued on a stream, or recorded in a graph that may be replayed, would then run
code that is gone. A server that swaps kernel binaries while it serves must be able to drop
the old one without draining the device first, and without leaking it until the close.

How. A module loaded by the user has a :class:`ModuleRecord`, an :class:`~.lifetimes.Allocation`
with no memory of its own. Every launch of one of its kernels holds the record among its
``buffers``: a queued launch retains it (``Scheduler.enqueue``) and its release gives it back,
a launch plan holds it through its own record, a graph through its recorded launches. So
``Module.close()`` is ``free()`` of the record: nothing new may use it from then on (the
launch checks refuse it with ``ClosedError``), and the release of its last user retires it,
on whatever thread that is. Retiring unloads the binary (bound to the device's context: see
``ContextBinding.freeing``, a refusal is logged and the binary leaked) and unpins the shared
empty-args images of its kernels, which only its launches read.

A ``Module`` collected without ``close()`` is closed then (:meth:`ModuleRecord.dropped`).
The device's own built-in module (``Device.function``) has no record: nothing can close it,
its launches hold nothing, and like every module still loaded it is unloaded by the device's
close (``shutdown.release_everything``), after every stream is gone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import ClosedError
from .._host.pool import HostBuffer, HostBufferPool
from .._runtime import Runtime
from .binding import ContextBinding
from .lifetimes import Allocation, Lifetimes
from .shutdown import call_off_loop

__all__ = ["Binaries", "ModuleRecord"]


class ModuleRecord(Allocation):
    """A user-loaded binary's lifetime (see the module's essay).

    :ivar handle: the runtime's binary handle
    :ivar images: the pinned empty-args images its kernels' launches share (unpinned with it)
    """

    __slots__ = ("_pool", "_unload", "handle", "images")

    def __init__(
        self,
        registry: Lifetimes,
        pool: HostBufferPool,
        handle: int,
        unload: Callable[[int], None],
    ) -> None:
        super().__init__(registry, 0, 0)
        self.handle = handle
        self.images: list[HostBuffer] = []
        self._pool = pool
        self._unload = unload
        self.disposer = self._dispose

    def _refusal(self, kind: str) -> Exception:
        return ClosedError(f"{kind}: the kernel's module is closed")

    def dropped(self, device_id: int) -> None:
        """Its ``Module`` was collected (loop thread): nobody can launch its kernels any more
        (its ``Function`` objects, and the plans that launch them, hold it), so it is closed,
        quietly: before modules could be closed, leaving them to the device was the rule."""
        if not (self.free_requested or self.registry.closed):
            self.registry.free(self)

    def _dispose(self) -> None:
        # Closed, and no queued launch, open plan or graph can run its kernels (any thread).
        images, self.images = self.images, []
        for image in images:
            self._pool.unpin(image)
        self._unload(self.handle)

    def __repr__(self) -> str:
        return f"<module {self.handle:#x}>"


class Binaries:
    """The binaries loaded on one device and not unloaded yet.

    :param binding: the device's context binding: a module's unload runs on whatever thread
        releases its last user (bound to the device's context; a refusal is logged, never
        raised: see ``ContextBinding.freeing``)
    """

    def __init__(self, lifetimes: Lifetimes, pool: HostBufferPool, binding: ContextBinding) -> None:
        self._lifetimes = lifetimes
        self._pool = pool
        runtime = binding.runtime  # (its method looked up at each call: a wrapper applies too)
        self._unload = binding.freeing(
            lambda handle: runtime.unload_binary(handle), "unload_binary"
        )
        # (under the lock: the release of a module's last user may run on any library
        # thread while the loop loads another, or the close unloads what is left)
        self._loaded: dict[int, None] = {}
        #: the threads of :meth:`load_off_loop` (loads, and unloads of cancelled ones)
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False  # (the device's close has taken what is left: unloads nothing)

    def load(self, runtime: Runtime, source: object, options: dict[str, Any]) -> int:
        """Load a binary with ``runtime`` (its load options: ``options``); its handle. It is
        unloaded by its module's record (:meth:`track`), else by the device's close."""
        handle = runtime.load_binary(source, **options)
        with self._lock:
            self._loaded[handle] = None
        return handle

    async def load_off_loop(
        self, runtime: Runtime, source: object, options: dict[str, Any], name: str
    ) -> int:
        """:meth:`load` on a thread of its own named ``name``; the loop runs meanwhile.

        The thread is not interrupted: cancelled, this waits for the load, unloads the binary
        (nobody will get a handle to it) on a thread too, and raises. Both threads are listed
        in :attr:`threads` for the device's close, which waits for them (:meth:`settled`)
        before it closes the runtime, and unloads what they loaded.
        """
        self.threads[:] = [thread for thread in self.threads if thread.is_alive()]
        return await call_off_loop(
            name,
            lambda: self.load(runtime, source, options),
            discard=self._retired,
            threads=self.threads,
        )

    async def settled(self, due: Callable[[], float]) -> bool:
        """Wait until every thread of :meth:`load_off_loop` has exited (True), or ``due()``
        (``anyio.current_time()``'s clock, read again as it goes: a later close may bring it
        nearer) has passed: a load takes as long as the runtime reads the binary and copies
        it to the device). The list is read again as it goes: a cancelled load's unload thread
        starts once its load thread has ended."""
        while any(thread.is_alive() for thread in self.threads):
            if anyio.current_time() >= due():
                return False
            await anyio.sleep(0.001)  # (a thread's exit cannot be awaited: polled)
        return True

    def track(self, handle: int) -> ModuleRecord:
        """The lifetime of the user's module ``handle``: unloaded once closed and unused."""
        return ModuleRecord(self._lifetimes, self._pool, handle, self._retired)

    def _retired(self, handle: int) -> None:
        # The record's last user is done (any thread): unload it, once. The loaded handles are
        # forgotten first: the runtime may hand the same handle out again once it is unloaded.
        with self._lock:
            loaded = not self._closed and self._loaded.pop(handle, _GONE) is not _GONE
        if loaded:
            self._unload(handle)

    def leave_to_runtime(self) -> None:
        """The device's close gave up on a stuck thread: nothing is unloaded here any more (a
        module's close, a cancelled load's unload); the runtime's own close unloads it all
        once the stuck call has returned."""
        with self._lock:
            self._closed = True

    def unload_all(self, runtime: Runtime) -> None:
        """The device is closing (its streams are gone): unload every binary left."""
        with self._lock:
            self._closed = True
            left, self._loaded = list(self._loaded), {}
        for handle in left:
            with contextlib.suppress(Exception):
                runtime.unload_binary(handle)


_GONE = object()
