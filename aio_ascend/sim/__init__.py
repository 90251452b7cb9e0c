"""The ``sim`` backend's user-facing parts: kernels of your own for the embedded simulator.

Use :class:`KernelLibrary` to write kernels of your own::

    lib = aio_ascend.sim.KernelLibrary()

    @lib.kernel("my_kernel")
    def my_kernel(ctx: aio_ascend.sim.KernelContext) -> None:
        ...

Built-in kernels (``load_binary(None)`` / ``dev.function(name)``): see :data:`BUILTIN_KERNELS`.
"""

from __future__ import annotations

from .._runtime.sim.kernels import BUILTIN_KERNELS, KernelContext, KernelLibrary
from .._runtime.sim.runtime import SimRuntime, open_sim_runtime

__all__ = ("BUILTIN_KERNELS", "KernelContext", "KernelLibrary", "SimRuntime", "open_sim_runtime")
