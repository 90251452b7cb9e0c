"""The finalizers of a device's objects that call into its scheduler, detached at its close.

A ``Stream``, ``LaunchPlan``, ``Event`` or ``Graph`` dropped without being closed is cleaned up
by a ``weakref.finalize`` that calls into the scheduler. The finalizers' registry is a root:
through such a finalizer it holds the scheduler, and through the scheduler whatever it keeps,
a failure among them, whose traceback holds the frames it was raised into, whose locals hold
the device and its objects. Such an object never becomes garbage, so its finalizer never runs
(a cycle through a root). Once the device is closed they have nothing left to do: the close
detaches them all, and the device and its objects can be collected like any others.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["OwnedFinalizers"]


class OwnedFinalizers:
    """One device's finalizers, detached together by :meth:`detach_all` (at its close)."""

    __slots__ = ("_live", "_prune_at")

    def __init__(self) -> None:
        # (finalizers do not take weak references: the ones that have run or been detached
        # are dropped whenever the set has doubled since the last look)
        self._live: set[weakref.finalize[Any, Any]] = set()
        self._prune_at = 64

    def finalize(self, obj: object, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` once ``obj`` is collected, unless the device has closed first
        (never at interpreter exit: the library's threads may be inside runtime calls)."""
        finalizer = weakref.finalize(obj, fn, *args)
        finalizer.atexit = False
        live = self._live
        live.add(finalizer)
        if len(live) >= self._prune_at:
            self._live = live = {f for f in live if f.alive}
            self._prune_at = 2 * len(live) + 64

    def detach_all(self) -> None:
        """The device has closed: no finalizer of its objects will run."""
        live, self._live = self._live, set()
        for finalizer in live:
            finalizer.detach()
