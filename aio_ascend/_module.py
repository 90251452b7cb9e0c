"""``Module`` and ``Function``: loaded kernel binaries and their entry points."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._device import Device

__all__ = ["Function", "Module"]


class Function:
    """A kernel entry point (``aclrtFuncHandle``) of a :class:`Module`."""

    __slots__ = ("_device", "handle", "module", "name")

    def __init__(self, device: Device, module: Module, name: str, handle: int) -> None:
        self._device = device
        self.module = module
        self.name = name
        self.handle = handle

    def __repr__(self) -> str:
        return f"<Function {self.name!r} of {self.module!r}>"


class Module:
    """A loaded kernel binary (``aclrtBinHandle``); unloaded when the device closes."""

    __slots__ = ("_device", "_functions", "handle", "source")

    def __init__(self, device: Device, handle: int, source: object) -> None:
        self._device = device
        self.handle = handle
        self.source = source
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        """The kernel ``name`` in this module.

        :raises RuntimeAPIError: if the module has no such kernel
        """
        if not isinstance(name, str) or not name:
            raise TypeError("function name must be a non-empty str")
        fn = self._functions.get(name)
        if fn is None:
            self._device._check_open()
            handle = self._device._rt().get_function(self.handle, name)
            fn = self._functions[name] = Function(self._device, self, name, handle)
        return fn

    def __repr__(self) -> str:
        return f"<Module {self.handle:#x}>"
