"""Packed ``HostArgs`` in pinned memory: the one definition of the layout a launch reads.

The launch call takes one host buffer: the argument image at offset 0, then the
``aclrtPlaceHolderInfo`` table at ``PackedArgs.table_offset``. The runtime writes placeholder
device addresses into that buffer during the call, so a launch with placeholders needs a
writable copy of its own (:func:`snapshot_args`); one without reads a buffer that nobody
writes, which any number of launches may share (:func:`shared_image`).

Nothing else is written into it during a launch. The hidden arguments of an AI Core or MIX
kernel (``FunctionInfo.prefix``/``suffix``: the inter-core sync and float-overflow addresses,
constant for the context) are laid into the image by the packer, not by the runtime: on the
host-args path ``rtsLaunchKernelWithHostArgs`` passes the buffer through and adds none
(hicann/runtime ``src/runtime/api/api_c_kernel.cc`` ~46-80, ``docs/cann-support.md`` §2), and
the launch writes into it only the placeholders' addresses (``stars_arg_manager.cc:175-184``:
its other write, a tiling slot, only for older launch calls that set ``hasTiling``: the same
in ``task_res.cc:33`` and ``uma_arg_loader.cc:152``); the
args-handle path copies the image into a handle of the runtime's own (``aclrtKernelArgsAppend``,
whose ``Finalize`` writes the runtime's buffer, not ours); the device-args path patches its ring's
mirror, never the caller's buffer.
"""

from __future__ import annotations

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


def shareable(packed: PackedArgs) -> bool:
    """Whether launches of ``packed`` may all read one buffer: the runtime writes nothing into
    it during a launch (no placeholders to patch; hidden arguments are the packer's, above)."""
    return not packed.placeholder_count


def shared_image(pool: HostBufferPool, packed: PackedArgs) -> HostBuffer:
    """``packed`` pinned once for launches that share it (see :func:`shareable`); the caller
    gives it back with ``pool.unpin`` (or the pool's close frees it)."""
    assert not packed.placeholder_count, "a launch with placeholders needs its own copy"
    return pool.pin(packed.image)
