"""Snapshot a packed ``HostArgs`` into a pooled host buffer: the one definition of the layout.

The runtime writes placeholder device addresses into the args buffer it is given, and reads
it during the launch call, so every launch gets its own writable copy: the argument image at
offset 0, then the ``aclrtPlaceHolderInfo`` table at the next 8-byte boundary.
"""

from __future__ import annotations

from .hostargs import PackedArgs
from .pool import HostBuffer, HostBufferPool

__all__ = ["snapshot_args"]


def snapshot_args(pool: HostBufferPool, packed: PackedArgs) -> tuple[HostBuffer, int]:
    """A pooled buffer holding ``packed``'s image and placeholder table, and the table's offset."""
    nbytes = packed.nbytes
    count = packed.placeholder_count
    table_offset = (nbytes + 7) & ~7  # the table starts at the next 8-byte boundary
    host = pool.acquire(table_offset + 8 * count)
    view = host.view
    view[:nbytes] = packed.image
    if count:
        view[table_offset : table_offset + 8 * count] = packed.table
    return host, table_offset
