"""The event-loop seam: the few loop operations the scheduler needs, for asyncio and trio.

anyio gives the portable layer users see (``fail_after``, cancel scopes); the hot path
(waking a waiter, hopping into the loop from a library thread) goes straight to the loop,
since that is where the per-task cost is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["LoopAdapter", "current_loop_adapter"]


class LoopAdapter:
    """Operations on the loop that opened a device. Subclasses per async library."""

    name: str

    def is_current(self) -> bool:
        """Whether the caller runs in this loop (on its thread)."""
        raise NotImplementedError

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on a later loop iteration (caller is on the loop thread)."""
        raise NotImplementedError

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> bool:
        """Hand ``fn(*args)`` to the loop from any thread; False if the loop is gone."""
        raise NotImplementedError

    def new_waiter(self) -> Any:
        """A one-shot waiter for one waiting coroutine."""
        raise NotImplementedError

    async def wait(self, waiter: Any) -> None:
        """Suspend until :meth:`wake` is called on ``waiter`` (cancellable)."""
        raise NotImplementedError

    def wake(self, waiter: Any) -> None:
        """Release ``waiter`` (loop thread only); a cancelled waiter is ignored."""
        raise NotImplementedError

    async def checkpoint(self) -> None:
        """Let the loop run other callbacks (and honour cancellation) once."""
        raise NotImplementedError


class _AsyncioAdapter(LoopAdapter):
    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def is_current(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        self.loop.call_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> bool:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed
            return False
        return True

    def new_waiter(self) -> asyncio.Future[None]:
        return self.loop.create_future()

    async def wait(self, waiter: asyncio.Future[None]) -> None:
        await waiter

    def wake(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)


class _TrioAdapter(LoopAdapter):
    name = "trio"

    def __init__(self) -> None:
        import trio

        self._trio = trio
        self.token = trio.lowlevel.current_trio_token()

    def is_current(self) -> bool:
        try:
            return bool(self._trio.lowlevel.current_trio_token() is self.token)
        except RuntimeError:
            return False

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        self.token.run_sync_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> bool:
        try:
            self.token.run_sync_soon(fn, *args)
        except self._trio.RunFinishedError:
            return False
        return True

    def new_waiter(self) -> Any:
        return self._trio.Event()

    async def wait(self, waiter: Any) -> None:
        await waiter.wait()

    def wake(self, waiter: Any) -> None:
        waiter.set()

    async def checkpoint(self) -> None:
        await self._trio.lowlevel.checkpoint()


def current_loop_adapter() -> LoopAdapter:
    """The adapter for the running loop (asyncio, uvloop or trio)."""
    try:
        return _AsyncioAdapter(asyncio.get_running_loop())
    except RuntimeError:
        pass
    try:
        return _TrioAdapter()
    except (ImportError, RuntimeError):
        pass
    raise RuntimeError("aio_ascend must be used from a running asyncio or trio event loop")
