"""The event-loop seam: the few loop operations the scheduler needs, for asyncio and trio.

anyio gives the portable layer users see (``fail_after``, cancel scopes); the hot path
(waking a waiter, hopping into the loop from a library thread) goes straight to the loop,
since that is where the per-task cost is.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from asyncio import events as asyncio_events
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio

from .._errors import WrongLoopError

__all__ = ["FORKED", "OTHER_THREAD", "LoopAdapter", "current_loop_adapter"]

_T = TypeVar("_T")

#: what a call from another event loop or thread than the device's gets (a WrongLoopError)
OTHER_THREAD = (
    "aio_ascend device used from a different event loop (or thread) than the one that opened "
    "it: call it from that loop (from another thread, hand the call to the loop, e.g. with "
    "asyncio.run_coroutine_threadsafe or trio.from_thread.run)"
)

#: what any call gets in a process forked from the one that opened the device (WrongLoopError)
FORKED = (
    "aio_ascend device used in a process forked from the one that opened it: its threads and "
    "its runtime stayed in the parent; open a device in this process instead"
)

#: the running loop or None, without raising: ``asyncio.get_running_loop`` raises when there is
#: none (only for loops that do not record their thread: see ``_AsyncioAdapter.is_current``)
_running_loop = asyncio_events._get_running_loop  # noqa: SLF001 - stdlib's non-raising getter
_get_ident = threading.get_ident
#: asyncio's running task per loop (``asyncio.current_task(loop)`` is a Python function
#: around this lookup; admission asks it at every launch that holds prepaid slots)
_asyncio_tasks: dict[Any, Any] = asyncio.tasks._current_tasks  # type: ignore[attr-defined]  # noqa: SLF001


class LoopAdapter(ABC):
    """Operations on the loop that opened a device. Subclasses per async library.

    :meth:`is_current` is the one "is this call on our loop" rule; every launch makes it.
    """

    name: str
    #: awaits of finished tasks since the last checkpoint they made (``Task.wait``)
    ready_awaits: int = 0
    #: ``threading.get_ident()`` of the thread the loop runs on (recorded when it is adapted)
    thread: int = 0

    #: set in a forked child (see _after_fork_in_child)
    forked = False

    def foreign(self) -> WrongLoopError:
        """The error for a call from anywhere but this loop (or in a forked child)."""
        return WrongLoopError(FORKED if self.forked else OTHER_THREAD)

    def check_thread(self) -> None:
        """``RuntimeError`` unless called from this loop: the device's synchronous calls
        (allocation, modules, facts) belong to its loop as much as its awaitable ones do. On
        the loop's thread, while it runs or between its runs (``run_until_complete``), never
        while another loop runs there nor once it has finished."""
        if self.is_current():
            return
        if (
            self.forked
            or threading.get_ident() != self.thread
            or _a_loop_runs()
            or self.is_closed()
        ):
            raise self.foreign()

    @abstractmethod
    def is_current(self) -> bool:
        """Whether the caller runs in this loop (on its thread)."""

    @abstractmethod
    def current_task(self) -> object:
        """The task (asyncio) or trio task running now: who is calling."""

    @abstractmethod
    def is_closed(self) -> bool:
        """Whether the loop has finished (no callback will ever run on it again)."""

    @abstractmethod
    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on a later loop iteration (caller is on the loop thread)."""

    @abstractmethod
    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> bool:
        """Hand ``fn(*args)`` to the loop from any thread; False if the loop is gone."""

    @abstractmethod
    def new_waiter(self) -> Any:
        """A one-shot waiter for one waiting coroutine."""

    @abstractmethod
    def wait(self, waiter: Any) -> Awaitable[None]:
        """An awaitable that completes when :meth:`wake` is called on ``waiter`` (cancellable)."""

    @abstractmethod
    def wake(self, waiter: Any) -> None:
        """Release ``waiter`` (loop thread only); a cancelled waiter is ignored."""

    @abstractmethod
    async def wait_until(self, waiter: Any, deadline: float) -> None:
        """:meth:`wait` until ``waiter`` is woken or the loop's clock (``anyio.current_time()``)
        reaches ``deadline`` (``math.inf``: none). No cancellation is used for the deadline, so
        it holds inside :meth:`shielded` work too, which asyncio runs as a task that refuses
        cancellation."""

    @abstractmethod
    async def checkpoint(self) -> None:
        """Let the loop run other callbacks (and honour cancellation) once."""

    async def shielded(self, fn: Callable[..., Coroutine[Any, Any, _T]], *args: Any) -> _T:
        """``await fn(*args)`` to its end whatever cancels the caller meanwhile; a cancellation
        that arrived is raised afterwards (anyio's and trio's are held off by the shield)."""
        with anyio.CancelScope(shield=True):
            result = await fn(*args)
        return result


class _AsyncioAdapter(LoopAdapter):
    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        _ADAPTERS.add(self)
        self.loop = loop
        self.thread = threading.get_ident()
        # asyncio's own loops record the thread they run on (``None`` while not running); a
        # loop that does not (uvloop) is asked through the running-loop getter, which also
        # calls getpid() on CPython 3.11
        self._records_thread = getattr(loop, "_thread_id", None) == self.thread
        #: the running task, as a C call: ``current_task()``
        self.current_task = functools.partial(_asyncio_tasks.get, loop)  # type: ignore[method-assign]
        #: a waiter, straight from the loop (no Python frame): ``new_waiter()``
        self.new_waiter = loop.create_future  # type: ignore[method-assign]

    def is_current(self) -> bool:
        # One id comparison: the loop runs on this thread, so this call runs in it (a loop
        # cannot run inside another on one thread). 0.06 us against 0.22-0.28 us for the
        # getter (timeit of both expressions inside a running loop, CPython 3.11, 2 loaded
        # cores)
        if self._records_thread:
            thread: int | None = self.loop._thread_id  # type: ignore[attr-defined]  # noqa: SLF001 - asyncio's recorded thread
            return thread == _get_ident()
        return _running_loop() is self.loop

    def current_task(self) -> object:  # (replaced per instance in __init__)
        return _asyncio_tasks.get(self.loop)

    def is_closed(self) -> bool:
        return self.loop.is_closed()

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

    def wait(self, waiter: asyncio.Future[None]) -> Awaitable[None]:
        return waiter  # awaiting the future itself: no extra coroutine frame per resume

    def wake(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            try:
                waiter.set_result(None)
            except RuntimeError:  # a waiter of a loop closed under it (another adopted it)
                pass

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

    async def wait_until(self, waiter: asyncio.Future[None], deadline: float) -> None:
        if deadline == math.inf:
            await waiter
            return
        timer = self.loop.call_at(deadline, self.wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    async def shielded(self, fn: Callable[..., Coroutine[Any, Any, _T]], *args: Any) -> _T:
        # anyio's shield holds off anyio's cancellation only: asyncio's own (task.cancel(),
        # as asyncio.wait_for, asyncio.timeout, and asyncio.run's shutdown use it) would
        # still stop ``fn`` half way (a close that never finished, and that no later close
        # could take over). So ``fn`` runs as a task of its own that refuses cancellation
        # (asyncio.run's shutdown then waits for it), awaited through asyncio.shield.
        work: asyncio.Task[_T] = _ToTheEnd(fn(*args), loop=self.loop)
        cancelled: BaseException | None = None
        with anyio.CancelScope(shield=True):
            while not work.done():
                try:
                    await asyncio.shield(work)
                except asyncio.CancelledError as exc:
                    cancelled = exc  # finish first
        result = work.result()
        if cancelled is not None:
            raise cancelled
        return result


class _ToTheEnd(asyncio.Task[_T]):
    """A task that runs to its end: ``cancel()`` is refused, whoever asks (work awaited
    through :meth:`LoopAdapter.shielded`, which bounds its own waits with
    :meth:`LoopAdapter.wait_until`, never with a cancellation)."""

    def cancel(self, msg: Any = None) -> bool:
        return False


class _TrioAdapter(LoopAdapter):
    name = "trio"

    def __init__(self) -> None:
        import trio

        _ADAPTERS.add(self)
        self._trio = trio
        self.token = trio.lowlevel.current_trio_token()
        self.thread = threading.get_ident()

    def _current_token(self) -> object:
        try:
            return self._trio.lowlevel.current_trio_token()
        except RuntimeError:
            return None

    def is_current(self) -> bool:
        # trio's token lookup reads a thread-local (no getpid): its own "which run is this"
        return self._current_token() is self.token

    def current_task(self) -> object:
        return self._trio.lowlevel.current_task()

    def is_closed(self) -> bool:
        try:
            self.token.run_sync_soon(_nothing)
        except self._trio.RunFinishedError:
            return True
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

    def wait(self, waiter: Any) -> Awaitable[None]:
        return waiter.wait()  # type: ignore[no-any-return]

    def wake(self, waiter: Any) -> None:
        waiter.set()

    async def wait_until(self, waiter: Any, deadline: float) -> None:
        with self._trio.move_on_at(deadline):  # (held inside a shield: trio's cancellation is)
            await waiter.wait()

    async def checkpoint(self) -> None:
        await self._trio.lowlevel.checkpoint()


def _nothing() -> None:
    pass


#: every adapter made in this process (a forked child refuses them all)
_ADAPTERS: weakref.WeakSet[LoopAdapter] = weakref.WeakSet()


def _never() -> bool:
    return False


def _after_fork_in_child() -> None:
    # The loop may run on in the child (a fork inside it), but the device's threads and its
    # runtime did not come along: every call is refused, launches included (is_current is
    # the one check they make), instead of queueing work nothing would ever submit.
    for adapter in list(_ADAPTERS):
        adapter.forked = True
        adapter.is_current = _never  # type: ignore[method-assign]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _a_loop_runs() -> bool:
    # Whether an event loop runs on this thread now: asyncio's (uvloop's too), or trio's
    if _running_loop() is not None:
        return True
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


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
