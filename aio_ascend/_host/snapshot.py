"""Packed ``HostArgs`` in pinned memory: the one definition of the layout a launch reads.

The launch call takes one host buffer: the argument image at offset 0, then the
``aclrtPlaceHolderInfo`` table at ``PackedArgs.table_offset``. The runtime writes placeholder
device addresses into that buffer during the call, so a launch with placeholders needs a
writable copy of its own (:func:`snapshot_args`); one without reads a buffer that nobody
writes, which any number of launches may share (:func:`shared_image`).
"""

from __future__ import annotations

from .._runtime.base import FunctionInfo
from .hostargs import PackedArgs
from .pool import HostBuffer, HostBufferPool

__all__ = ["shareable", "shared_image", "snapshot_args"]


def snapshot_args(pool: HostBufferPool, packed: PackedArgs) -> HostBuffer:
    """A pooled buffer holding ``packed``'s image and placeholder table (its own copy)."""
    nbytes = packed.nbytes
    count = packed.placeholder_count
    offset = packed.table_offset
    host = pool.acquire(offset + 8 * count)
    view = host.view
    view[:nbytes] = packed.image
    if count:
        view[offset : offset + 8 * count] = packed.table
    return host


def shareable(packed: PackedArgs, info: FunctionInfo | None) -> bool:
    """Whether launches of ``packed`` may all read one buffer: the runtime writes nothing into
    it during a launch (no placeholders to patch, no hidden system slots of a MIX kernel)."""
    if packed.placeholder_count:
        return False
    if info is None:
        return True
    return not info.prefix and not info.suffix and info.kernel_type != "mix"


def shared_image(pool: HostBufferPool, packed: PackedArgs) -> HostBuffer:
    """``packed`` pinned once for launches that share it (see :func:`shareable`); the caller
    gives it back with ``pool.unpin`` (or the pool's close frees it)."""
    assert not packed.placeholder_count, "a launch with placeholders needs its own copy"
    return pool.pin(packed.image)
