"""Kernel binaries on the sim: load a ``KernelLibrary``, look functions up, describe them.

Part of :class:`~.runtime.SimRuntime` (its base class, over the executor). The load options of
the runtime seam (``kernel_type``, ``lazy``) are checked and recorded, not acted on: the sim's
kernels are Python functions, whose arguments no runtime rewrites.
"""

from __future__ import annotations

from ..abi import ACL_ERROR_RT_SYMBOL_NOT_FOUND, KernelType, check_load_options
from ..base import PLAIN_FUNCTION, FunctionInfo
from .executor import BINARY_HANDLE, FUNCTION_HANDLE, DeviceExecutor, SimBinary, new_handle
from .kernels import BUILTIN_LIBRARY, KernelLibrary

__all__ = ["KernelLoader"]


class KernelLoader(DeviceExecutor):
    """``load_binary``, ``unload_binary``, ``get_function``, ``function_info`` of the sim."""

    #: the context that was current on the opening thread before the open bound this one
    context_before_open: int | None = None

    def load_binary(
        self,
        source: object,
        *,
        kernel_type: KernelType | None = None,
        lazy: bool | None = None,
    ) -> int:
        """Load a :class:`KernelLibrary` (snapshotted now), or the built-ins for ``None``.

        ``kernel_type`` (a :class:`~aio_ascend._runtime.abi.KernelType` or its name) and
        ``lazy`` (a bool) are checked and otherwise ignored.
        """
        func = "aclrtBinaryLoadFromData"
        check_load_options(kernel_type, lazy)
        self._check(func)
        if source is None:
            library = BUILTIN_LIBRARY
        elif isinstance(source, KernelLibrary):
            library = source
        else:
            raise self._param(
                func,
                f"the sim backend loads an aio_ascend.sim.KernelLibrary (or None for the built-in "
                f"kernels), got {type(source).__name__}",
            )
        handle = new_handle(BINARY_HANDLE)
        self._binaries[handle] = SimBinary(library.snapshot())
        return handle

    def unload_binary(self, binary: int) -> None:
        """``aclrtBinaryUnLoad``: its function handles become invalid (queued launches run)."""
        func = "aclrtBinaryUnLoad"
        self._check(func)
        b = self._binaries.pop(binary, None)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        for handle in b.functions.values():
            self._functions.pop(handle, None)

    def get_function(self, binary: int, name: str) -> int:
        """``aclrtBinaryGetFunction``: unknown name -> 107042 (symbol not found)."""
        func = "aclrtBinaryGetFunction"
        self._check(func)
        b = self._binaries.get(binary)
        if b is None:
            raise self._bad_handle(func, f"binary handle {binary!r} is not loaded")
        handle = b.functions.get(name)
        if handle is not None:
            return handle
        spec = b.kernels.get(name)
        if spec is None:
            raise self._error(
                ACL_ERROR_RT_SYMBOL_NOT_FOUND,
                func,
                f"kernel {name!r} not found in the binary (it has {sorted(b.kernels)})",
            )
        handle = new_handle(FUNCTION_HANDLE)
        b.functions[name] = handle
        self._functions[handle] = spec
        return handle

    def function_info(self, func: int) -> FunctionInfo:
        """The kernel's declared parameters (``KernelLibrary.add(params=)``; the built-ins
        declare theirs), else nothing to follow: the args go to the body as the builder packed
        them."""
        spec = self._functions.get(func)
        return PLAIN_FUNCTION if spec is None else spec.info
