"""hicann/runtime's ``example/2_advanced_features/kernel/0_launch_kernel``, with aio_ascend.

The original loads an Ascend C ``add_custom`` kernel (z = x + y on float16, 8 x 2048 elements,
8 blocks), builds its arguments with ``aclrtKernelArgs*`` (placeholder mode: the tiling values
``totalLength`` and ``tileNum`` travel behind two placeholders, so no device copy of them is
needed), launches it with ``aclrtLaunchKernelWithConfig``, synchronizes the stream and checks
the result. The same, step by step (``docs/guide/from-acl-samples.md`` maps every call)::

    python examples/acl_launch_kernel.py                       # the sim, placeholder mode
    python examples/acl_launch_kernel.py --mode simple         # pointers only
    python examples/acl_launch_kernel.py --backend acl \\
        --kernel out/fatbin/ascendc_kernels_placeholder/ascendc_kernels_placeholder.o

On the sim the kernel is an equivalent Python kernel (:data:`KERNELS`) that decodes its args
exactly as the Ascend C one does; on an Ascend machine ``--kernel`` loads the original binary
(built by the sample's CMake), on whichever launch path the CANN release offers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio
import numpy as np

import aio_ascend as aa
from aio_ascend.sim import KernelContext, KernelLibrary

USE_CORE_NUM = 8  # blockDim of the sample: one block per core
TOTAL_LENGTH = 8 * 2048  # elements (float16)
TILE_NUM = 8

# --- the kernel, for the sim ------------------------------------------------------------------
# add_custom(GM_ADDR x, GM_ADDR y, GM_ADDR z[, __gm__ int32_t* tilingLength,
#            __gm__ int32_t* tilingNum]): pointers at 0, 8, 16; in placeholder mode two more
# pointers at 24 and 32, which the runtime points at the placeholder data it copied along.
KERNELS = KernelLibrary("acl-samples")


def _add(ctx: KernelContext, total: int, tiles: int) -> None:
    block_length = total // USE_CORE_NUM
    x = ctx.array(ctx.ptr(0), total, np.float16)
    y = ctx.array(ctx.ptr(8), total, np.float16)
    z = ctx.array(ctx.ptr(16), total, np.float16)
    if tiles == 0:  # as the Ascend C kernel's Init: nothing to do
        return
    for block in range(min(ctx.blocks, USE_CORE_NUM)):  # each block adds its slice
        part = slice(block * block_length, (block + 1) * block_length)
        np.add(x[part], y[part], out=z[part])


@KERNELS.kernel("add_custom")
def add_custom_placeholder(ctx: KernelContext) -> None:
    """Placeholder mode: totalLength and tileNum read through the pointers at 24 and 32."""
    (total,) = np.frombuffer(ctx.read(ctx.ptr(24), 4), np.int32)
    (tiles,) = np.frombuffer(ctx.read(ctx.ptr(32), 4), np.int32)
    _add(ctx, int(total), int(tiles))


SIMPLE_KERNELS = KernelLibrary("acl-samples-simple")


@SIMPLE_KERNELS.kernel("add_custom")
def add_custom_simple(ctx: KernelContext) -> None:
    """Simple mode: three pointers; the sizes are the kernel's constants."""
    _add(ctx, TOTAL_LENGTH, TILE_NUM)


def kernel_args(
    mode: str, x: aa.DeviceBuffer, y: aa.DeviceBuffer, z: aa.DeviceBuffer
) -> aa.HostArgs:
    """The arguments, as the sample's AppendCommonKernelArgs / ConfigurePlaceholderArgs."""
    args = aa.HostArgs().ptr(x).ptr(y).ptr(z)  # aclrtKernelArgsAppend x3
    if mode == "placeholder":
        # aclrtKernelArgsAppendPlaceHolder x2 + GetPlaceHolderBuffer + the two int32 writes
        args.placeholder(np.int32(TOTAL_LENGTH).tobytes(), align=8)
        args.placeholder(np.int32(TILE_NUM).tobytes(), align=8)
    return args


async def run(mode: str, backend: str, kernel: str | None, library: str | None = None) -> bool:
    rng = np.random.default_rng(0)
    # gen_data.py: uniform(1, 100), float16, shape [8, 2048]; golden = x + y in float16
    x = rng.uniform(1, 100, [8, 2048]).astype(np.float16)
    y = rng.uniform(1, 100, [8, 2048]).astype(np.float16)
    golden = (x + y).astype(np.float16)
    nbytes = x.nbytes

    # aclInit, aclrtSetDevice, aclrtCreateStream (and everything released on the way out)
    options = {"runtime_options": {"library_path": library}} if library else {}
    async with aa.open_device(0, backend=backend, **options) as dev, dev.stream() as s:
        # aclrtMalloc x3 (no aclrtMallocHost: copies stage through the library's pinned pool)
        x_dev, y_dev, z_dev = dev.malloc(nbytes), dev.malloc(nbytes), dev.malloc(nbytes)
        # ReadFile + aclrtMemcpy host to device
        await s.upload(x_dev, x)
        await s.upload(y_dev, y)
        # aclrtBinaryLoadFromFile + aclrtBinaryGetFunction
        sim_kernels = KERNELS if mode == "placeholder" else SIMPLE_KERNELS
        source: object = kernel if kernel else sim_kernels
        add_custom = dev.load_module(source).function("add_custom")
        # aclrtKernelArgsInit/Append/AppendPlaceHolder/Finalize,
        # aclrtLaunchKernelWithConfig and aclrtSynchronizeStream: one await
        await s.run(add_custom, USE_CORE_NUM, kernel_args(mode, x_dev, y_dev, z_dev))
        # aclrtMemcpy device to host
        z = (await s.download(z_dev, np.float16)).reshape(golden.shape)
        print(
            f"Kernel launch sample runs in {mode} mode on {dev.backend} "
            f"(launch path: {dev.info['launch_path']})."
        )

    # verify_result.py: relative error within 1e-3 for all but 0.1% of the elements
    error = np.abs(z.astype(np.float32) - golden.astype(np.float32)) > 1e-3 * np.abs(
        golden.astype(np.float32)
    )
    ratio = float(error.mean())
    print(f"error ratio: {ratio:.4f}, tolerance: 0.0010")
    ok = ratio <= 1e-3
    print("[SUCCESS] result correct" if ok else "[ERROR] result error")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mode", choices=["placeholder", "simple"], default="placeholder")
    parser.add_argument("--backend", default="sim", help="sim (default), acl or auto")
    parser.add_argument(
        "--kernel", help="an add_custom kernel binary (.o) to load instead of the sim's kernel"
    )
    parser.add_argument(
        "--library", help="the ACL library to load (--backend acl), e.g. a CANN runtime's .so"
    )
    args = parser.parse_args(argv)
    return 0 if anyio.run(run, args.mode, args.backend, args.kernel, args.library) else 1


if __name__ == "__main__":
    sys.exit(main())
