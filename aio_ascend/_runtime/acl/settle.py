"""After a stream was destroyed by force: nothing is freed until the device has settled.

``aclrtDestroyStreamForce`` neither waits for the task running on the stream nor stops it, and
``aclrtFree``/``aclrtFreeHost`` free at once (hicann/runtime@681ef76:
``docs/zh/api_ref/06_stream_management.md:8``, ``11-01_device_memory_malloc_and_free.md``): a
kernel or a DMA still running would write memory that was handed to someone else. So once a
stream with unfinished work was forced, device memory, pinned memory, staging rings and binaries
are freed only after ``aclrtSynchronizeDeviceWithTimeout`` said the device is idle. When it
times out (a hung kernel), or the release lacks it, they are leaked instead, with one ERROR log:
returning on time wins over freeing, as for a thread stuck in a runtime call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from ..._errors import AscendError, DeviceFaultError

__all__ = ["LEAKED", "SETTLE_TIMEOUT_MS", "Settle"]

log = logging.getLogger("aio_ascend")

#: how long a free after a forced stream destruction waits for the device to finish
SETTLE_TIMEOUT_MS: Final = 500
#: everything any runtime of the process leaked this way: (library path, kind, address), kind
#: "device", "host" or "binary" (a diagnostic: each runtime keeps its own list too)
LEAKED: list[tuple[str, str, int]] = []


_FREE: Final = {"binary": "aclrtBinaryUnLoad", "device": "aclrtFree", "host": "aclrtFreeHost"}


class Settle:
    """Whether memory may be freed on one runtime's device (the caller's lock, if any)."""

    def __init__(self, device_id: int, library: Any) -> None:
        self._device_id = device_id
        self._path: str = library.path
        functions, has = library.functions, library.has
        self._functions = functions
        self._has = has
        #: a stream with unfinished work was destroyed by force since the device last settled
        self.unsettled = False
        #: the device did not settle in time: everything freed from now on is leaked
        self.leaking = False
        #: what was leaked: (kind, address)
        self.leaked: list[tuple[str, int]] = []

    def force(self, stream: int, destroy: Callable[[int], None]) -> None:
        """Destroy ``stream`` by force (``destroy``), noting whether work was left on it.

        A stream that drains within 1 ms had nothing running: forcing it frees nothing in use.
        """
        fn = self._functions  # the library's own table: it works while the runtime closes
        try:
            fn["aclrtSynchronizeStreamWithTimeout"](stream, 1)
        except AscendError:
            self.unsettled = True  # still running, faulted or aborted: settle before frees
        destroy(stream)

    def may_free(self) -> bool:
        """True when nothing the device still runs can use memory freed now."""
        if not self.unsettled:
            return True
        if self.leaking:
            return False
        name = "aclrtSynchronizeDeviceWithTimeout"
        reason: str
        if self._has(name):
            try:
                self._functions[name](SETTLE_TIMEOUT_MS)
            except DeviceFaultError:
                # stop-on-failure halted the context: none of its tasks runs any more
                self.unsettled = False
                return True
            except AscendError as exc:
                reason = f"{name} failed: {exc}"
            else:
                self.unsettled = False
                return True
        else:
            reason = f"this CANN release lacks {name}"
        self.leaking = True
        log.error(
            "device %d: work of a stream destroyed by force may still be running (%s); "
            "leaking its device memory, pinned memory, staging and binaries instead of "
            "freeing them under it",
            self._device_id,
            reason,
        )
        return False

    def release(self, attempt: Callable[..., Any], **kinds: Iterable[int]) -> bool:
        """At close: free every address of each kind (``binary=``, ``device=``, ``host=``)
        through ``attempt(function name, address)`` once the device settled (True), else leak
        them all (False)."""
        if not self.may_free():
            self.leak_all(**kinds)
            return False
        for kind, addresses in kinds.items():
            for address in list(addresses):
                attempt(_FREE[kind], address)
        return True

    def leak_all(self, **kinds: Any) -> None:
        """Keep every address of each kind (``device=``, ``host=``, ``binary=``)."""
        for kind, addresses in kinds.items():
            for address in addresses:
                self.leak(kind, address)

    def leak(self, kind: str, address: int) -> None:
        """Keep ``address`` (never freed: the device may still use it)."""
        self.leaked.append((kind, address))
        LEAKED.append((self._path, kind, address))
