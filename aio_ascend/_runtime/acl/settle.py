"""After a stream was destroyed by force: nothing is freed until the device has settled.

``aclrtDestroyStreamForce`` neither waits for the task running on the stream nor stops it, and
``aclrtFree``/``aclrtFreeHost`` free at once (hicann/runtime@681ef76:
``docs/zh/api_ref/06_stream_management.md:8``, ``11-01_device_memory_malloc_and_free.md``): a
kernel or a DMA still running would write memory that was handed to someone else. So once a
stream with unfinished work was forced, device memory, pinned memory, staging rings and binaries
are freed only when ``aclrtSynchronizeDeviceWithTimeout`` says the device is idle:

- during the device's life a free asks with a 1 ms timeout and, while the device is busy,
  defers the free (done by the first later free that finds it idle, or at close), so that a
  free never waits for other streams' work; and it asks at most once per
  :data:`ASK_INTERVAL_S` (frees in between are deferred unasked): a free may run on the event
  loop's thread, and on a device kept busy by other streams every ask costs its full 1 ms;
- at close it waits up to :data:`SETTLE_TIMEOUT_MS` (a close forced by its own timeout, whose
  deadline has passed already, only ``SETTLE_AFTER_FORCE_S``: its caller was promised a return
  within that timeout); when that runs out (a hung kernel), or the release lacks the call,
  everything is leaked instead, with one ERROR log: returning on time wins over freeing, as for
  a thread stuck in a runtime call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from ctypes import byref, c_int32
from typing import Any, Final

from ..._errors import AclCode, AscendError, DeviceFaultError

__all__ = ["ASK_INTERVAL_S", "LEAKED", "SETTLE_TIMEOUT_MS", "Settle"]

log = logging.getLogger("aio_ascend")

#: how long a free after a forced stream destruction waits for the device to finish
SETTLE_TIMEOUT_MS: Final = 500
#: while unsettled, frees ask the device whether it is idle at most this often
ASK_INTERVAL_S: Final = 0.05
#: everything any runtime of the process leaked this way: (library path, kind, address), kind
#: "device", "host" or "binary" (a diagnostic: each runtime keeps its own list too)
LEAKED: list[tuple[str, str, int]] = []


#: aclrtStreamStatus: ACL_STREAM_STATUS_COMPLETE (NOT_READY is 1)
_COMPLETE: Final = 0

_FREE: Final = {"binary": "aclrtBinaryUnLoad", "device": "aclrtFree", "host": "aclrtFreeHost"}


def _halted(exc: AscendError) -> bool:
    """Whether the device's synchronize failed at once because a failed task halted the context.

    Once a stream in stop-on-failure mode (every stream of ours) failed, the runtime answers
    every synchronize of the context, the device's and each stream's, with that failure without
    waiting (``context/context.cc:2889-2921`` ``CheckStatus``; the failure is the context's from
    ``stream/stream.cc:4335-4351``), so waiting tells nothing more: the failed stream stops at
    its failed task, and a stream destroyed by force had its queue freed with it (over
    ``tests/realrt``'s driver; on a device, to confirm: ``docs/cann-support.md``). That is taken
    as settled, as a device fault always was: a :class:`DeviceFaultError`, or 507001
    (``ACL_ERROR_RT_TS_ERROR``, a task the device reported failed: what a failed copy gives).
    Otherwise every close after a failed copy leaked the device: its context, queues and the
    runtime's threads for it, for the life of the process. A timeout, or any other error, is no
    answer."""
    return isinstance(exc, DeviceFaultError) or getattr(exc, "code", None) == AclCode.RT_TS_ERROR


class Settle:
    """Whether memory may be freed on one runtime's device (the caller's lock, if any)."""

    def __init__(self, device_id: int, library: Any) -> None:
        self._device_id = device_id
        self._path: str = library.path
        self._functions: dict[str, Any] = library.functions
        self._has = library.has
        #: a stream with unfinished work was destroyed by force since the device last settled
        self.unsettled = False
        #: frees put off while the device was busy: (kind, address)
        self.deferred: list[tuple[str, int]] = []
        self._lock = threading.Lock()  # frees come from the loop and the library's threads
        #: what was leaked: (kind, address)
        self.leaked: list[tuple[str, int]] = []
        #: the outcome of :meth:`wait` (None: not waited): the close does not wait twice
        self._verdict: bool | str | None = None
        #: (monotonic) before this, a free defers without asking the device
        self._next_ask = 0.0

    def force(self, stream: int, destroy: Callable[[int], None]) -> bool:
        """Destroy ``stream`` by force (``destroy``), noting whether work was left on it:
        True if none was (the runtime found the stream complete).

        A stream the runtime counts as complete has nothing running: forcing it frees nothing
        in use. ``aclrtStreamQuery`` asks without waiting (whether the stream's queue is empty:
        hicann/runtime@681ef76 ``src/runtime/core/src/stream/stream.cc:2119-2141``). A
        synchronize, even with a 1 ms timeout, is no look: on a busy stream its timeout runs
        the runtime's timeout snapshot (``api/impl/api_impl.cc:1733``), which waits with no
        timeout for a control task (``api_impl.cc:6360-6381``), and the close calls this on
        the event loop's thread.
        """
        fn = self._functions  # the library's own table: it works while the runtime closes
        status = c_int32()
        try:
            fn["aclrtStreamQuery"](stream, byref(status))
            complete = status.value == _COMPLETE
        except AscendError:  # faulted or aborted: settle before frees
            complete = False
        if not complete:
            self.unsettled = True
        destroy(stream)
        return complete

    def free(self, kind: str, address: int) -> bool:
        """During the device's life: True when ``address`` may be freed now; else it is
        deferred. A device found idle also frees what was deferred before."""
        if not self.unsettled:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_ask:
                self.deferred.append((kind, address))
                return False
            if self._settled(1) is not True:
                self._next_ask = now + ASK_INTERVAL_S
                self.deferred.append((kind, address))
                return False
            deferred, self.deferred = self.deferred, []
        for earlier_kind, earlier in deferred:
            with contextlib.suppress(AscendError):
                self._functions[_FREE[earlier_kind]](earlier)
        return True

    def _settled(self, timeout_ms: int) -> bool | str:
        """Wait up to ``timeout_ms`` for the device: True, or why it did not settle."""
        name = "aclrtSynchronizeDeviceWithTimeout"
        if not self._has(name):
            return f"this CANN release lacks {name}"
        try:
            self._functions[name](timeout_ms)
        except AscendError as exc:
            if not _halted(exc):
                return f"{name} failed: {exc}"
        self.unsettled = False
        return True

    def wait(self, limit_s: float | None = None) -> None:
        """Wait up to :data:`SETTLE_TIMEOUT_MS` (or ``limit_s``, if shorter: a close whose
        deadline has passed) for the device (the calling thread bound to its context), so
        that :meth:`release` at close does not: called off the event loop."""
        if self.unsettled and self._verdict is None:
            limit_ms = SETTLE_TIMEOUT_MS if limit_s is None else int(limit_s * 1000)
            self._verdict = self._settled(max(1, min(SETTLE_TIMEOUT_MS, limit_ms)))

    def release(self, attempt: Callable[..., Any], **kinds: Iterable[int]) -> bool:
        """At close: free every address of each kind (``binary=``, ``device=``, ``host=``) and
        what was deferred, through ``attempt(function name, address)``, once the device settled
        (True); else leak them all, logging once (False)."""
        pending = [(kind, address) for kind, addresses in kinds.items() for address in addresses]
        with self._lock:
            pending += self.deferred
            self.deferred = []
        if not self.unsettled:
            settled: bool | str = True
        elif self._verdict is not None:  # waited for already (off the loop), in vain
            settled = self._verdict
        else:
            settled = self._settled(SETTLE_TIMEOUT_MS)
        if settled is not True:
            log.error(
                "device %d: work of a stream destroyed by force may still be running (%s); "
                "leaking its device memory, pinned memory, staging and binaries instead of "
                "freeing them under it",
                self._device_id,
                settled,
            )
            for kind, address in pending:
                self.leaked.append((kind, address))
                LEAKED.append((self._path, kind, address))
            return False
        for kind, address in pending:
            attempt(_FREE[kind], address)
        return True
