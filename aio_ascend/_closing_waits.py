"""``ClosingWaits``: the waits for a slot of something closable (a launch plan, a graph), which
its ``close()`` turns away at once.

A plan's launch or a graph's replay may wait for admission behind a slow or hung kernel. If the
plan or graph is closed meanwhile, the waiter must not be queued later with what the close let
go, nor hang until the stream's close: ``close()`` cancels each wait's scope, and the waiter
raises ``ClosedError`` with nothing of it queued. A wait cancelled before its grant holds
nothing; one granted just as the close came gives its slot back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from ._errors import ClosedError

if TYPE_CHECKING:
    from ._sched.lifetimes import Allocation
    from ._stream_sync import StreamSync

__all__ = ["ClosingWaits"]


class ClosingWaits:
    """The admission waits of one plan or graph (loop thread only)."""

    __slots__ = ("_scopes", "_what")

    def __init__(self, what: str) -> None:
        self._what = what  # "the launch plan", "the graph": who was closed, in the error
        self._scopes: set[anyio.CancelScope] = set()

    async def admit(self, stream: StreamSync, record: Allocation) -> None:
        """Wait for a slot of ``stream`` (its own admission, host functions and an external
        stream's queue included).

        :raises ClosedError: ``record`` (the plan's or graph's) was closed while it waited
            (no slot is held)
        """
        if not await self._turned_away(stream._admit):  # noqa: SLF001
            if not record.free_requested:
                return
            stream._scheduler.unadmit(stream._lane)  # noqa: SLF001 - (granted as the close came)
        raise ClosedError(f"{self._what} was closed while its work waited for a slot")

    async def wait(self, waiting: Callable[[], Awaitable[object]], record: Allocation) -> None:
        """``await waiting()`` (no slot involved), turned away the same way.

        :raises ClosedError: ``record`` was closed before or while it waited
        """
        if await self._turned_away(waiting) or record.free_requested:
            raise ClosedError(f"{self._what} was closed while its work waited")

    async def _turned_away(self, waiting: Callable[[], Awaitable[object]]) -> bool:
        # ``await waiting()`` in a scope close() cancels: whether it did
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                await waiting()
        finally:
            self._scopes.discard(scope)
        return scope.cancelled_caught

    def turn_away(self) -> None:
        """End every wait under way (``close()``)."""
        for scope in self._scopes:
            scope.cancel()
