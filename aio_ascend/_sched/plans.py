"""``PlanRecord``: what a launch plan keeps alive, tracked like a device allocation.

A plan's launches read its args image and the device buffers its args point to. The record
holds them (the image pinned in the pool, a use of each buffer) and every queued launch of the
plan holds the record, as a graph's replays hold a ``GraphRecord``: closing the plan is
``free()`` on the record, deferred until its queued launches are done; then the image goes back
to the pool and the buffers' deferred frees proceed.
"""

from __future__ import annotations

from .._host.pool import HostBuffer, HostBufferPool
from .lifetimes import Allocation, Lifetimes

__all__ = ["PlanRecord"]


class PlanRecord(Allocation):
    """A launch plan's holdings.

    :ivar host: the pinned args image its launches share (None: each launch copies its own)
    :ivar buffers: the device buffers (roots) its args point to, in use until it is retired
    """

    __slots__ = ("_pool", "buffers", "host")

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
        registry.retain(buffers)
        self.disposer = self._dispose

    def _dispose(self) -> None:
        # Closed, and no queued launch reads it any more (any thread).
        host, self.host = self.host, None
        if host is not None:
            self._pool.unpin(host)
        self.registry.release((self,))  # the buffers' uses: their deferred frees proceed
