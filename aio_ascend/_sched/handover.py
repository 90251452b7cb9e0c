"""Telling a caller the moment its request reached the runtime.

An operation on a stream shared with torch_npu (``dev.external_stream(torch_stream)``) must
not return before it has been handed to the runtime: a torch op the caller issues next goes
onto the same runtime stream from torch's own thread, and would otherwise overtake it. So the
call waits for the submitter thread to say "submitted" (or "refused": then there is nothing
to overtake).

The caller's request itself is what is waited for: no extra event is recorded behind it. A
fence of its own would need an admission slot of its own (and wait for one behind a full
stream, or behind another coroutine's host function queued in between, while the call could
not be cancelled), and it would be one more task that can time out or fail where the caller
never sees it.

The order of the two threads' steps is what makes it safe without a lock:

- the loop registers the request (:meth:`Handover.expect`) *before* queueing it, so the
  submitter cannot decide it unseen;
- the submitter marks it decided, then reads the waiter to wake; the loop installs a waiter,
  then reads the mark. Whichever runs second sees the other's write.

A request decided on a path that does not report here (a close dropped it before the
hand-over, a native batch submit or the submitter itself failed, the submitter stopped with
it unsubmitted) is resolved as a task instead: the waiting loop looks at ``task.done()`` too,
every few milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from .loop import LoopAdapter
    from .task import Task

__all__ = ["Expected", "Handover"]

#: how often a waiting caller looks at its task without a wake-up (requests decided on a
#: path that does not report to the handover resolve their task)
RECHECK_S = 0.005


class Expected:
    """One request whose caller waits for its hand-over."""

    __slots__ = ("decided", "waiter")

    def __init__(self) -> None:
        self.decided = False
        self.waiter: Any = None


class Handover:
    """The requests of one stream whose callers wait until the submitter has handed them to
    the runtime or refused them (:attr:`Lane.handover <.lane.Lane>`)."""

    __slots__ = ("_adapter", "_expected")

    def __init__(self, adapter: LoopAdapter) -> None:
        self._adapter = adapter
        self._expected: dict[Task, Expected] = {}

    def expect(self, request: Task) -> Expected:
        """Register ``request`` before it is queued (loop thread)."""
        expected = self._expected[request] = Expected()
        return expected

    def forget(self, request: Task) -> None:
        """``request`` was never queued after all (loop thread)."""
        self._expected.pop(request, None)

    def decided(self, request: Task) -> None:
        """``request`` was submitted or refused (submitter thread)."""
        expected = self._expected.pop(request, None)
        if expected is not None:
            expected.decided = True
            waiter = expected.waiter
            if waiter is not None:
                adapter = self._adapter
                adapter.call_soon_threadsafe(adapter.wake, waiter)

    async def wait(self, expected: Expected, task: Task) -> Task:
        """Until ``task``'s request has been decided (or the task is done); returns it."""
        adapter = self._adapter
        while not (expected.decided or task.done()):
            expected.waiter = waiter = adapter.new_waiter()
            if expected.decided:
                break
            await adapter.wait_until(waiter, anyio.current_time() + RECHECK_S)
        self._expected.pop(task, None)
        return task
