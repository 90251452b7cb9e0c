"""``PlanRecord``: what a launch plan keeps alive, tracked like a device allocation.

A plan's launches read its args image and the device buffers its args point to. The record
holds them (the image pinned in the pool, a use of each buffer) and every queued launch of the
plan holds the record, as a graph's replays hold a ``GraphRecord``: closing the plan is
``free()`` on the record, deferred until its queued launches are done; then the image goes back
to the pool and the buffers' deferred frees proceed.
"""

from __future__ import annotations

from typing import Any

from .._host.pool import HostBuffer, HostBufferPool
from .dropped import warn_resource
from .lifetimes import Allocation, Lifetimes

__all__ = ["PlanRecord"]


class PlanRecord(Allocation):
    """A launch plan's holdings.

    :ivar host: the pinned args image its launches share (None: each launch copies its own)
    :ivar buffers: the device buffers (roots) its args point to, in use until it is retired
    :ivar spec: the plan's launch spec, whose args are let go with the rest (tasks of the plan
        may outlive it: they must not keep the user's buffers alive)
    """

    __slots__ = ("_pool", "buffers", "host", "spec")
    holds_user = False  # (its spec's args are let go by _dispose)

    def __init__(
        self,
        registry: Lifetimes,
        pool: HostBufferPool,
        host: HostBuffer | None,
        buffers: tuple[Allocation, ...],
    ) -> None:
        super().__init__(registry, 0, 0)
        self._pool = pool
        self.host = host
        self.buffers = buffers
        self.spec: Any = None
        registry.retain(buffers)
        self.disposer = self._dispose

    def let_go(self) -> None:
        """(Nothing: see ``holds_user``.)"""

    def dropped(self, device_id: int) -> None:
        """Its ``LaunchPlan`` was collected without ``close()`` (loop thread): warn, as for a
        dropped stream or graph, and release it as ``close()`` does. Nothing once it was
        closed, or the device was (everything was released then)."""
        if self.free_requested or self.registry.closed:
            return
        warn_resource(
            f"a LaunchPlan on device {device_id} was garbage-collected without close(); what "
            "it holds is released once its queued launches have finished"
        )
        self.registry.free(self)

    def _dispose(self) -> None:
        # Closed, and no queued launch reads it any more (any thread).
        host, self.host = self.host, None
        if host is not None:
            self._pool.unpin(host)
        if self.spec is not None:
            self.spec.args = None
        self.registry.release((self,))  # the buffers' uses: their deferred frees proceed
