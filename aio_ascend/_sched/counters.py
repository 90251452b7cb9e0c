"""Statistics counters with one writer each, so that no update is ever lost.

Each library thread (and the loop side) owns one :class:`Counters` and is the only one that
increments it; :func:`total` sums them for ``Device.stats()``. Reading an int attribute from
another thread is atomic in CPython, so a sum is at worst a moment old, never wrong.
"""

from __future__ import annotations

__all__ = ["POOL_STATS", "Counters", "total"]

#: the host buffer pool's figures in ``Device.stats()``: its key -> the pool's
POOL_STATS = {
    "host_buffers_in_use": "in_use",
    "host_buffers_free": "free",
    "host_buffers_high_water": "high_water",
    "host_buffer_allocations": "allocations",
    "host_buffer_violations": "violations",
    "host_pool_bytes": "bytes",
    "host_pool_free_bytes": "free_bytes",
}


class Counters:
    """The counters one thread writes."""

    __slots__ = ("batches", "copies", "launches", "sync_timeouts", "timeouts", "wakeups")

    def __init__(self) -> None:
        self.launches = 0
        self.copies = 0
        self.batches = 0
        self.wakeups = 0
        self.timeouts = 0
        self.sync_timeouts = 0  # timed-out event syncs of block mode's waiter


def total(*parts: Counters) -> dict[str, int]:
    """The sum of several threads' counters, by name."""
    return {name: sum(getattr(part, name) for part in parts) for name in Counters.__slots__}
