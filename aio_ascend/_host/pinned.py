"""``PinnedArrays``: numpy arrays in a device's page-locked host memory (``aclrtMallocHost``).

A copy from or to such an array needs no staging: the runtime reads or writes it when the copy
executes. So its memory must stay valid until then, and until every view of the array is gone:

- each array's memory belongs to a :class:`PinnedHostMemory` object, the array's ``base``
  (every view and every exported buffer keeps it alive); a queued copy holds the array until
  the device is done with the copy;
- once the owner is collected its address waits in a queue, and the device's loop frees it
  (a collection may run on any thread, inside any call: freeing there could re-enter the
  runtime), or at the device's close;
- an array that outlives its device keeps its memory, and the runtime that owns it, open:
  closing the runtime frees every pinned allocation it made (the sim's buffers, ``acl``'s
  ``aclrtFreeHost`` at close, a CUDA context's), which would leave the array pointing at freed
  memory. The device's close therefore hands the runtime's own close to :meth:`close`, which
  runs it once the last array has been collected. Past the close the finalizer frees on the
  thread that collected the array (the device's loop may be gone): each runtime call binds
  the device's context and gives the thread its own back, the runtime's close binds its own,
  and the close runs after the last free has returned, never inside one (a collection can
  start inside a free).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .._runtime.base import Runtime

__all__ = ["PinnedArrays", "PinnedHostMemory", "pinned_owner"]

log = logging.getLogger("aio_ascend")


class PinnedHostMemory:
    """The owner of one pinned array's memory: the array's ``base`` (numpy reads the memory
    through ``__array_interface__``), freed once it is collected.

    :ivar registry: the :class:`PinnedArrays` of the device it was allocated on
    :ivar addr: its host address
    :ivar nbytes: the array's size in bytes
    """

    __slots__ = ("__array_interface__", "__weakref__", "addr", "nbytes", "registry")

    def __init__(
        self, registry: PinnedArrays, addr: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> None:
        self.registry = registry
        self.addr = addr
        self.nbytes = math.prod(shape) * dtype.itemsize
        # plain bytes: the caller views them as its dtype (an interface's typestr and descr
        # cannot carry every dtype: padded or out-of-order fields, subarrays)
        self.__array_interface__ = {
            "version": 3,
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (addr, False),  # (address, read-only)
            "strides": None,
        }


def pinned_owner(array: np.ndarray[Any, Any]) -> PinnedHostMemory | None:
    """The pinned memory ``array`` lies in (through its views and exported buffers), or None."""
    base: object = array.base
    while True:
        if isinstance(base, np.ndarray):
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return base if isinstance(base, PinnedHostMemory) else None


def _unused(fn: Callable[[], None]) -> None:
    """``PinnedArrays``'s hook to the loop once the device has closed (never called then)."""


class PinnedArrays:
    """The pinned host arrays of one device.

    :param runtime: the device's runtime, each call binding the device's context (and giving
        the calling thread its own back)
    :param post: ``post(fn)`` has the device's loop call ``fn()`` soon (any thread)
    """

    def __init__(self, runtime: Runtime, post: Callable[[Callable[[], None]], object]) -> None:
        self._malloc_host = runtime.malloc_host
        self._free_host = runtime.free_host
        self._post = post
        # Reentrant: a collection inside a free (any allocation may run the collector) frees
        # its address in the same pass instead of deadlocking.
        self._lock = threading.RLock()
        self._live: dict[int, int] = {}  # address -> bytes allocated, until freed
        self._garbage: deque[int] = deque()  # addresses whose arrays were collected
        self._closed = False
        self._then: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the device has closed (copies with these arrays are refused)."""
        return self._closed

    def stats(self) -> dict[str, int]:
        """``pinned_arrays`` (allocations not yet freed) and ``pinned_bytes`` (their bytes)."""
        with self._lock:
            return {"pinned_arrays": len(self._live), "pinned_bytes": sum(self._live.values())}

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A new C-ordered array in pinned memory (contents unspecified) (the loop thread)."""
        self.reap()
        size = max(1, math.prod(shape) * dtype.itemsize)  # the runtime takes no 0-byte block
        addr = self._malloc_host(size)
        try:
            owner = PinnedHostMemory(self, addr, shape, dtype)
            # (np.ndarray, as np.empty: a subarray dtype adds its dimensions to the shape)
            array: np.ndarray[Any, Any] = np.ndarray(shape, dtype, buffer=np.asarray(owner))
        except BaseException:
            self._free_host(addr)
            raise
        with self._lock:
            self._live[addr] = size
        weakref.finalize(owner, self._collected, addr).atexit = False
        return array

    def _collected(self, addr: int) -> None:
        # A finalizer (any thread, maybe inside a runtime call): the array and its views are
        # gone, and no queued copy holds it. Freed by the loop, or here once closed.
        self._garbage.append(addr)
        if self._closed:
            self.reap()
        else:
            self._post(self.reap)

    def reap(self) -> None:
        """Free the memory of the collected arrays; once closed and none is left, close the
        runtime (see :meth:`close`)."""
        then = None
        with self._lock:
            while self._garbage:
                addr = self._garbage.popleft()
                try:
                    self._free_host(addr)
                except Exception:  # nothing to raise it to (a loop callback, a finalizer)
                    log.exception("could not free pinned host memory at %#x", addr)
                finally:
                    # Only now: a collection inside the free (same thread, the lock reentered)
                    # frees its array in the same pass, but must not find none alive and
                    # close the runtime under this free.
                    self._live.pop(addr, None)
            if self._closed and not self._live:
                then, self._then = self._then, None
        if then is not None:  # outside the lock: the sim's close joins its device thread
            then()

    def close(self, then: Callable[[], None]) -> int:
        """The device has released everything else: free what is collected and call ``then``
        (the runtime's close) now, or once the last array still alive is collected. Returns
        how many were still alive."""
        with self._lock:
            self._closed = True
            self._then = then
            # Not needed any more, and it holds the device's loop side: an array's finalizer
            # (a root) must not keep that alive through this, nor whatever it holds (a failed
            # copy's traceback can hold the array itself: then it would never be collected).
            self._post = _unused
            alive = len(self._live) - len(self._garbage)
        self.reap()
        if alive > 0:
            log.info(
                "%d pinned array(s) outlive their device: their memory, and the runtime "
                "holding it, stay until they are garbage-collected",
                alive,
            )
        return max(alive, 0)
