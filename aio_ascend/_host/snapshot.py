"""Snapshot a packed :class:`HostArgs` into a pooled pinned host buffer (one definition).

The runtime patches placeholder device addresses into the caller's buffer during the launch
call, so every launch needs its own writable buffer: the args image goes first, then the
``aclrtPlaceHolderInfo`` table at the next 8-byte boundary.
"""

from __future__ import annotations

from .hostargs import PackedArgs
from .pool import HostBuffer, HostBufferPool

__all__ = ["snapshot_args"]


def snapshot_args(pool: HostBufferPool, packed: PackedArgs) -> tuple[HostBuffer, int]:
    """Copy ``packed`` into a buffer from ``pool``; return it and the placeholder table offset.

    The buffer holds ``packed.image`` at offset 0 and ``packed.table`` (8 bytes per
    placeholder) at the returned offset, ``(nbytes + 7) & ~7``. The caller releases it to
    ``pool`` once the device can no longer read it.
    """
    nbytes = packed.nbytes
    count = packed.placeholder_count
    table_offset = (nbytes + 7) & ~7
    host = pool.acquire(table_offset + 8 * count)
    view = host.view
    view[:nbytes] = packed.image
    if count:
        view[table_offset : table_offset + 8 * count] = packed.table
    return host, table_offset
