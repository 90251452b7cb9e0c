"""hicann/runtime's ``example/1_basic_features/stream/2_multi_stream``, with aio_ascend.

The original orders a long kernel (``LongOP``: a long computation, then ``x[i] += 1``) on one
stream before a short one (``ShortOP``: ``x[i] *= 2``) on another, so that the answer is
``(0 + 1) * 2 = 2``, three ways: stream synchronization (the host waits for stream 1, then
launches on stream 2), event synchronization (stream 2 waits on the device for an event
recorded on stream 1: the host never waits between them), and Notify. Then it shows a bounded
wait that gives up on a long task. The same, step by step (``docs/guide/from-acl-samples.md``)::

    python examples/acl_multi_stream.py                 # the sim: LongOP takes 2 s
    python examples/acl_multi_stream.py --long-ms 300 --wait-ms 30

Notify (``aclrtCreateNotify``/``RecordNotify``/``WaitAndResetNotify``) has no aio_ascend
counterpart: an event does the same ordering (record on one stream, wait on another).

On the sim the two kernels are equivalent Python kernels (:data:`KERNELS`; the sim runs a
kernel's body at its start and charges its time afterwards, so ``LongOP``'s increment is visible
early to a *host* read, never to work ordered after it); on an Ascend machine ``--kernels``
loads a binary with ``LongOPf`` and ``ShortOPf``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import anyio
import numpy as np

import aio_ascend as aa
from aio_ascend.sim import KernelContext, KernelLibrary

BLOCK_DIM = 1  # kBlockDim of the sample

KERNELS = KernelLibrary("acl-samples-streams")
LONG_SECONDS = [2.0]  # how long LongOPf keeps its stream busy on the sim (--long-ms)


@KERNELS.kernel("LongOPf")
def long_op(ctx: KernelContext) -> None:
    """``LongOPf(__gm__ uint32_t* x)``: a long computation, then ``x[block] += 1``."""
    x = ctx.array(ctx.ptr(0), ctx.blocks, np.uint32)
    x += 1
    ctx.busy(LONG_SECONDS[0])


@KERNELS.kernel("ShortOPf")
def short_op(ctx: KernelContext) -> None:
    """``ShortOPf(__gm__ uint32_t* x)``: ``x[block] *= 2``."""
    x = ctx.array(ctx.ptr(0), ctx.blocks, np.uint32)
    x *= 2


async def stream_synchronization(dev: aa.Device, module: aa.Module) -> int:
    """StreamSynchronization(): the host waits for stream 1 before launching on stream 2."""
    long_op, short_op = module.function("LongOPf"), module.function("ShortOPf")
    # aclrtCreateStream x2 + aclrtSetStreamFailureMode(ACL_STOP_ON_FAILURE): every aio_ascend
    # stream stops on failure
    async with dev.stream() as stream1, dev.stream() as stream2:
        num = dev.malloc(4)  # aclrtMalloc
        await stream1.upload(num, np.zeros(1, np.uint32))  # aclrtMemcpy host to device
        print("Use stream synchronize. Begin a long task, num += 1.")
        await stream1.launch(long_op, BLOCK_DIM, aa.HostArgs().ptr(num))  # LongOP(..., stream1)
        await stream1.synchronize()  # aclrtSynchronizeStream(stream1)
        print("Begin a short task, num *= 2.")
        await stream2.launch(short_op, BLOCK_DIM, aa.HostArgs().ptr(num))  # ShortOP(..., stream2)
        await stream2.synchronize()  # aclrtSynchronizeStream(stream2)
        (answer,) = await stream2.download(num, np.uint32)  # aclrtMemcpy device to host
        print(f"The answer is {answer}.")
        num.free()  # aclrtFree (deferred while queued work still uses it)
    return int(answer)


async def event_synchronization(dev: aa.Device, module: aa.Module, wait_s: float) -> int:
    """EventSynchronization(): stream 2 waits on the device for an event of stream 1; then a
    bounded wait gives up on a long task (the task itself keeps running)."""
    long_op, short_op = module.function("LongOPf"), module.function("ShortOPf")
    stream1, stream2 = dev.stream(), dev.stream()
    num = dev.malloc(4)
    await stream1.upload(num, np.zeros(1, np.uint32))
    print("Use event synchronize. Begin a long task, num += 1.")
    await stream1.launch(long_op, BLOCK_DIM, aa.HostArgs().ptr(num))
    event = await stream1.record_event()  # aclrtCreateEvent + aclrtRecordEvent(event, stream1)
    await stream2.wait_event(event)  # aclrtStreamWaitEvent(stream2, event): no host wait
    print("Begin a short task, num *= 2.")
    await stream2.launch(short_op, BLOCK_DIM, aa.HostArgs().ptr(num))
    done = await stream2.record_event()  # aclrtRecordEvent(event, stream2)
    await done  # aclrtSynchronizeEvent
    (answer,) = await stream2.download(num, np.uint32)
    print(f"The answer is {answer}.")

    print(f"Simulate timeout, wait {wait_s * 1e3:.0f} ms, the wait will give up.")
    await stream1.launch(long_op, BLOCK_DIM, aa.HostArgs().ptr(num))
    late = await stream1.record_event()
    # aclrtSynchronizeEventWithTimeout(event, kWaitTimeMs): the await is bounded, the device
    # work is not cancelled (it cannot be recalled)
    with anyio.move_on_after(wait_s) as scope:
        await late
    print(
        "The wait timed out; the long task is still running."
        if scope.cancelled_caught
        else "The long task finished within the wait."
    )
    await late  # it was never cancelled: it finishes in its own time
    num.free()
    return int(answer)


async def run(
    backend: str, kernels: str | None, long_s: float, wait_s: float, library: str | None = None
) -> bool:
    LONG_SECONDS[0] = long_s
    options = {"runtime_options": {"library_path": library}} if library else {}
    answers = []
    # aclInit + aclrtSetDevice + aclrtCreateContext (the device's own context, bound only
    # around each short call on this thread)
    async with aa.open_device(0, backend=backend, **options) as dev:
        module = dev.load_module(kernels if kernels else KERNELS)
        answers.append(await stream_synchronization(dev, module))
    async with aa.open_device(0, backend=backend, **options) as dev:
        module = dev.load_module(kernels if kernels else KERNELS)
        answers.append(await event_synchronization(dev, module, wait_s))
    # leaving the block: aclrtDestroyEvent/Stream, aclrtFree, aclrtDestroyContext,
    # aclrtResetDevice (``dev.aclose(cancel=True, timeout=...)`` would destroy the streams by
    # force, as aclrtDestroyStreamForce, failing what is left with TaskTimeoutError)
    print("Resource cleanup completed.")
    ok = answers == [2, 2]
    print("[SUCCESS] both orders give 2" if ok else f"[ERROR] answers {answers}")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", default="sim", help="sim (default), acl or auto")
    parser.add_argument("--kernels", help="a kernel binary with LongOPf and ShortOPf (.o)")
    parser.add_argument("--long-ms", type=float, default=2000.0, help="LongOP on the sim (ms)")
    parser.add_argument("--wait-ms", type=float, default=1000.0, help="the bounded wait (ms)")
    parser.add_argument(
        "--library", help="the ACL library to load (--backend acl), e.g. a CANN runtime's .so"
    )
    args = parser.parse_args(argv)
    for flag, value in (("--long-ms", args.long_ms), ("--wait-ms", args.wait_ms)):
        if not (value > 0 and math.isfinite(value)):
            parser.error(f"{flag} must be a number of milliseconds > 0, got {value}")
    ok = anyio.run(
        run, args.backend, args.kernels, args.long_ms / 1e3, args.wait_ms / 1e3, args.library
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
