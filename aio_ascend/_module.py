"""``Module`` and ``Function``: loaded kernel binaries and their entry points."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ._errors import ClosedError
from ._host.hostargs import HostArgs, PackedArgs
from ._host.pool import HostBuffer
from ._runtime.abi import check_kernel_name
from ._runtime.base import FunctionInfo
from ._unique import Unique

if TYPE_CHECKING:
    from ._sched.modules import ModuleRecord
    from ._sched.work import LaunchSpec

__all__ = ["Function", "Module"]


class Function:
    """A kernel entry point (``aclrtFuncHandle``) of a :class:`Module`.

    :ivar device: the device it was loaded on
    :ivar module: the module it belongs to
    :ivar name: the kernel name
    :ivar handle: the runtime handle
    :ivar info: what the runtime says the kernel's host args must follow (its declared
        parameters, hidden arguments, data placement); ``None`` when nothing
    """

    __slots__ = (
        "device",
        "handle",
        "info",
        "launch_specs",
        "module",
        "name",
        "no_args",
        "no_args_image",
    )

    def __init__(
        self,
        device: object,
        module: Module,
        name: str,
        handle: int,
        info: FunctionInfo | None = None,
    ) -> None:
        self.device = device
        self.module = module
        self.name = name
        self.handle = handle
        self.info = None if info is None or info.plain else info
        #: a launch without arguments, packed once (``None``: the kernel declares parameters,
        #: so such a launch is refused)
        self.no_args: PackedArgs | None = None
        try:
            self.no_args = HostArgs().pack(self.info)
        except ValueError:
            pass
        #: ``no_args`` pinned once, shared by the launches without args (made by the first;
        #: unpinned with its module, or with the device)
        self.no_args_image: HostBuffer | None = None
        #: its launches without args or config, checked and packed once per block count:
        #: ``{blocks: LaunchSpec}`` (made by the first; see ``Stream.launch``)
        self.launch_specs: dict[int, LaunchSpec] = {}

    def __copy__(self) -> Function:
        # a copy starts with no launches prepared: they hold the handle they were made for
        twin = Function.__new__(Function)
        for name in Function.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.launch_specs = {}
        return twin

    def __repr__(self) -> str:
        return f"<Function {self.name!r} of {self.module!r}>"


class Module(Unique):
    """A loaded kernel binary (``aclrtBinHandle``).

    :meth:`close` unloads it once nothing can run its kernels any more (``with module:``
    closes it too, and so does its collection: its ``handle`` is valid as long as the object
    lives, and open); what is still loaded when the device closes is unloaded then.

    :param get_function: looks a kernel up by name: its handle and what the runtime says of it
        (raises if the device is closed)
    :param check_caller: raises unless the device is open and called from its loop's thread
    :param record: its lifetime (None: the device's built-in module, which cannot be closed)
    :ivar kernel_type: the kernel type it was loaded as (``load_module(kernel_type=...)``)
    """

    __slots__ = (
        "__weakref__",
        "_check_caller",
        "_functions",
        "_get_function",
        "device",
        "handle",
        "held",
        "kernel_type",
        "source",
    )

    def __init__(
        self,
        device: object,
        handle: int,
        source: object,
        get_function: Callable[[int, str], tuple[int, FunctionInfo]],
        kernel_type: str | None = None,
        check_caller: Callable[[], object] | None = None,
        record: ModuleRecord | None = None,
    ) -> None:
        self.device = device
        self.handle = handle
        self.source = source
        self.kernel_type = kernel_type
        self._get_function = get_function
        self._check_caller = check_caller
        self._functions: dict[str, Function] = {}
        #: what each launch of its kernels holds until it is done: its record (none for the
        #: device's built-in module)
        self.held: tuple[ModuleRecord, ...] = () if record is None else (record,)

    def function(self, name: str) -> Function:
        """The kernel ``name`` in this module.

        :raises RuntimeAPIError: if the module has no such kernel
        :raises ClosedError: the module or the device is closed
        :raises RuntimeError: called from another thread than the device's event loop's
        """
        check_kernel_name(name)
        if self._check_caller is not None:
            self._check_caller()
        if self._closing():
            raise ClosedError(f"{self!r} is closed")
        fn = self._functions.get(name)
        if fn is None:
            handle, info = self._get_function(self.handle, name)
            fn = self._functions[name] = Function(self.device, self, name, handle, info)
        return fn

    def _held_by(self, fn: Function) -> tuple[ModuleRecord, ...]:
        """What a launch of its kernel ``fn`` holds until it is done (:attr:`held`).

        :raises ClosedError: the module is closed
        """
        if self._closing():
            raise ClosedError(f"{fn!r}: its module is closed")
        return self.held

    def _closing(self) -> bool:
        # close() was called (the binary may still be loaded: its work holds it)
        return bool(self.held) and self.held[0].free_requested

    def close(self) -> None:
        """Unload the binary once the work that may run its kernels is done: the launches
        queued before, and the open :class:`LaunchPlan` and :class:`Graph` objects that launch
        them (it is unloaded when the last of those is closed). From now on its kernels can be
        neither launched, planned nor captured (``ClosedError``), and :meth:`function` raises
        ``ClosedError`` even for a kernel looked up before. Idempotent; nothing once the
        device is closed.

        :raises ValueError: the device's built-in module (``Device.function``'s kernels),
            which is unloaded with the device
        :raises RuntimeError: called from another thread than the device's event loop's
        """
        if not self.held:
            raise ValueError(
                "the device's built-in module is unloaded with the device; close() is for a "
                "module of load_module()"
            )
        record = self.held[0]
        record.registry.free(record)
        for fn in self._functions.values():
            fn.launch_specs.clear()  # (their next launches go through the checks: refused)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called, or the device is closed."""
        return self._closing() or bool(getattr(self.device, "closed", False))

    def __enter__(self) -> Module:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Module {self.handle:#x}>"
