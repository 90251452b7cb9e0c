"""Awaiting work on torch_npu's memory and stream, without blocking the event loop.

Where torch_npu is installed (an Ascend machine with CANN)::

    python examples/torch_npu_interop.py

An inference server that already holds its tensors in torch_npu can hand them to aio_ascend:
``dev.wrap(tensor.data_ptr(), nbytes, owner=tensor)`` is a ``DeviceBuffer`` over the tensor's
memory (never freed by aio_ascend; the tensor stays referenced while queued work uses it), and
``dev.external_stream(torch.npu.current_stream().npu_stream)`` queues work on torch_npu's own
stream, so it is ordered after the torch operations queued there before.

:func:`exchange` is the library-agnostic part: it writes into the memory, clears a slice of it
on the device and reads it back, each step awaited. ``tests/tools/test_examples.py`` runs it on
the sim over memory from the sim's own allocator (the same code path as with a tensor).

Note: torch_npu and aio_ascend then share the loop thread. aio_ascend binds its device context
around its short calls on that thread; use the same device id in both.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np

import aio_ascend as aa


async def exchange(
    dev: aa.Device, ptr: int, count: int, *, owner: object, stream_handle: int | None = None
) -> np.ndarray:
    """On ``count`` float32 at device address ``ptr`` (owned by ``owner``): write 0..count-1,
    zero the second half on the device, read everything back. Returns what was read."""
    memory = dev.wrap(ptr, 4 * count, owner=owner)
    stream = dev.stream() if stream_handle is None else dev.external_stream(stream_handle)
    try:
        await stream.upload(memory, np.arange(count, dtype=np.float32))
        half = 4 * (count // 2)
        await (await stream.memset(memory[half:], 0))
        return await stream.download(memory, np.float32)
    finally:
        await stream.aclose()  # an external stream is only let go of, never destroyed
        memory.free()  # drops the wrapper (and its reference to `owner`); memory stays


def expected(count: int) -> np.ndarray:
    values = np.arange(count, dtype=np.float32)
    values[count // 2 :] = 0
    return values


async def with_torch_npu(count: int) -> bool:
    import torch
    import torch_npu  # noqa: F401 - registers the "npu" device

    tensor = torch.zeros(count, dtype=torch.float32, device="npu:0")
    async with aa.open_device(0, backend="acl") as dev:
        handle = torch.npu.current_stream().npu_stream
        got = await exchange(dev, tensor.data_ptr(), count, owner=tensor, stream_handle=handle)
    seen_by_torch = tensor.cpu().numpy()
    return bool(np.array_equal(got, expected(count)) and np.array_equal(seen_by_torch, got))


def main() -> int:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        print("torch_npu is not installed: this example needs an Ascend machine with CANN")
        return 0
    ok = anyio.run(with_torch_npu, 4096)
    print(
        "torch_npu tensor written, cleared and read back through aio_ascend:",
        "ok" if ok else "MISMATCH",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
