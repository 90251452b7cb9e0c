"""Awaiting work on torch_npu's memory and stream, in order with torch's own work.

Where torch_npu is installed (an Ascend machine with CANN)::

    python examples/torch_npu_interop.py

An inference server that already holds its tensors in torch_npu can hand them to aio_ascend:
``dev.wrap(tensor.data_ptr(), nbytes, owner=tensor)`` is a ``DeviceBuffer`` over the tensor's
memory (never freed by aio_ascend; the tensor stays referenced while queued work uses it), and
``dev.external_stream(torch.npu.current_stream())`` (the stream *object*, not its
``npu_stream`` handle) queues work on torch_npu's own stream in order with torch's ops, both
ways. torch_npu launches ops from its own task-queue thread (``TASK_QUEUE_ENABLE``, on by
default), so a handle read once would let torch's later ops and ours overtake each other;
with the object, each operation first reads ``npu_stream`` again (which drains torch_npu's
queue: torch's earlier ops reach the stream first), and the call returns once the operation
has been handed to the runtime (a torch op issued next lands after it).

What it costs: one extra event record per operation and a loop -> submitter -> loop round trip
per call, so calls on such a stream are not batched across a loop tick: about 1 ms per call
against 12-35 us with a plain handle on the sim on a loaded 2-core machine
(``python benchmarks/torch_ordering_cost.py``); the drain itself costs what torch_npu's own
synchronising calls cost. For many small operations without torch ops in between, use a
stream of aio_ascend's own and ``wait_stream``/``external_event`` at the hand-over points.

:func:`exchange` is the library-agnostic part: it writes into the memory, clears a slice of it
on the device and reads it back, each step awaited. ``tests/tools/test_examples.py`` runs it on
the sim over memory from the sim's own allocator (the same code path as with a tensor), and
``tests/scheduler/test_torch_ordering.py`` checks the ordering against a double of torch_npu's
task queue.

Note: torch_npu and aio_ascend then share the loop thread. aio_ascend binds its device context
around its short calls on that thread; use the same device id in both.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np

import aio_ascend as aa


async def exchange(
    dev: aa.Device, ptr: int, count: int, *, owner: object, torch_stream: object = None
) -> np.ndarray:
    """On ``count`` float32 at device address ``ptr`` (owned by ``owner``): write 0..count-1,
    zero the second half on the device, read everything back. Returns what was read.

    ``torch_stream``: a torch_npu stream object (or a stream handle) to queue the work on,
    in order with torch's own ops there; ``None``: a stream of aio_ascend's own."""
    memory = dev.wrap(ptr, 4 * count, owner=owner)
    stream = dev.stream() if torch_stream is None else dev.external_stream(torch_stream)
    try:
        await stream.upload(memory, np.arange(count, dtype=np.float32))
        half = 4 * (count // 2)
        await (await stream.memset(memory[half:], 0))
        return await stream.download(memory, np.float32)
    finally:
        await stream.aclose()  # an external stream is only let go of, never destroyed
        memory.free()  # drops the wrapper (and its reference to `owner`); memory stays


def expected(count: int) -> np.ndarray:
    """What :func:`exchange` reads back."""
    values = np.arange(count, dtype=np.float32)
    values[count // 2 :] = 0
    return values


async def with_torch_npu(count: int) -> bool:
    import torch
    import torch_npu  # noqa: F401 - registers the "npu" device

    tensor = torch.zeros(count, dtype=torch.float32, device="npu:0")
    async with aa.open_device(0, backend="acl") as dev:
        current = torch.npu.current_stream()
        tensor.add_(1.0)  # a torch op still in torch_npu's task queue: overwritten after it
        got = await exchange(dev, tensor.data_ptr(), count, owner=tensor, torch_stream=current)
        tensor.mul_(2.0)  # queued after our work: doubles what we wrote
    seen_by_torch = tensor.cpu().numpy()
    return bool(np.array_equal(got, expected(count)) and np.array_equal(seen_by_torch, 2 * got))


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
