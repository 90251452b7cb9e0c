"""A plain await-based script: load kernels, launch, await, read back.

Runs on the embedded simulator (``sim``), so no Ascend hardware is needed::

    python examples/script.py            # n = 1,000,000
    python examples/script.py --n 4096

It loads one kernel of its own (``relu``, from an :class:`aio_ascend.sim.KernelLibrary`,
decoding its args exactly as an Ascend C kernel would) and one built-in (``vector_add``),
computes ``out = relu(x + y)`` on the device and checks it against numpy.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import anyio
import numpy as np

import aio_ascend as aa
from aio_ascend.sim import KernelContext, KernelLibrary

# --- a kernel of our own ----------------------------------------------------------------------
# Args layout (what HostArgs().ptr(x).ptr(y).u32(n) packs): ptr x @0, ptr y @8, u32 n @16.
kernels = KernelLibrary("example")


@kernels.kernel("relu")
def relu(ctx: KernelContext) -> None:
    """y = max(x, 0), float32 (x may equal y)."""
    x_addr, y_addr = ctx.ptr(0), ctx.ptr(8)
    n = ctx.u32(16)
    x = ctx.array(x_addr, n, np.float32)
    y = ctx.array(y_addr, n, np.float32)
    np.maximum(x, np.float32(0), out=y)


async def run(n: int) -> bool:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    out = np.empty(n, np.float32)

    async with aa.open_device(0, backend="sim") as dev:
        relu_fn = dev.load_module(kernels).function("relu")  # user kernel
        add_fn = dev.function("vector_add")  # built-in kernel
        dx, dy, dz = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)

        async with dev.stream() as s:
            t0 = time.perf_counter()
            await s.copy_to_device(dx, x)
            await s.copy_to_device(dy, y)
            # z = x + y, then z = relu(z): one stream, so they run in this order
            await s.launch(add_fn, 8, aa.HostArgs().ptr(dx).ptr(dy).ptr(dz).u32(n))
            await s.launch(relu_fn, 8, aa.HostArgs().ptr(dz).ptr(dz).u32(n))
            readback = await s.copy_to_host(out, dz)
            await readback  # `out` is filled once this returns
            elapsed = time.perf_counter() - t0

        for buf in (dx, dy, dz):
            buf.free()
        stats = dev.stats()

    expected = np.maximum(x + y, np.float32(0))
    ok = bool(np.array_equal(out, expected))
    print(f"backend=sim  n={n:,}  out[:4]={np.array2string(out[:4], precision=4)}")
    print(
        f"relu(x + y) on the device: {elapsed * 1e3:.2f} ms for 2 copies in, 2 launches, "
        f"1 copy out ({stats['launches']} launches, {stats['copies']} copies submitted)"
    )
    print("matches numpy" if ok else "MISMATCH with numpy")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=1_000_000, help="elements (default 1e6)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    return 0 if anyio.run(run, args.n) else 1


if __name__ == "__main__":
    sys.exit(main())
