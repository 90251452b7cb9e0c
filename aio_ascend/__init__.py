"""aio_ascend: Huawei Ascend (CANN/ACL) kernel launches as awaitables for asyncio and trio.

>>> import aio_ascend as aa
>>> async def main():
...     async with aa.open_device(0) as dev:          # real CANN when present, else the sim
...         s = dev.stream()
...         task = await s.launch(dev.function("noop"), 1, aa.HostArgs())
...         await task
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._device import Device as Device
from ._device import DeviceBuffer as DeviceBuffer
from ._device import Function as Function
from ._device import Module as Module
from ._device import device_count as device_count
from ._device import open_device as open_device
from ._errors import AscendError as AscendError
from ._errors import BackendUnavailableError as BackendUnavailableError
from ._errors import ClosedError as ClosedError
from ._errors import DeviceFaultError as DeviceFaultError
from ._errors import InternalError as InternalError
from ._errors import MemoryAllocationError as MemoryAllocationError
from ._errors import RuntimeAPIError as RuntimeAPIError
from ._errors import TaskTimeoutError as TaskTimeoutError
from ._errors import WrongLoopError as WrongLoopError
from ._event import Event as Event
from ._graph import Graph as Graph
from ._host.hostargs import HostArgs as HostArgs
from ._interop import ExternalEvent as ExternalEvent
from ._launch_config import LaunchConfig as LaunchConfig
from ._launch_config import LaunchConfigDict as LaunchConfigDict
from ._plan import LaunchPlan as LaunchPlan
from ._runtime import available_backends as available_backends
from ._sched.compiled import compiled as is_compiled
from ._sched.task import Task as Task
from ._stream import Stream as Stream
from ._version import __version__ as __version__

if TYPE_CHECKING:  # imported lazily at run time (see __getattr__), visible to type checkers
    from . import metrics as metrics
    from . import sim as sim
    from . import tracing as tracing

__all__ = (
    "AscendError",
    "BackendUnavailableError",
    "ClosedError",
    "Device",
    "DeviceBuffer",
    "DeviceFaultError",
    "Event",
    "ExternalEvent",
    "Function",
    "Graph",
    "HostArgs",
    "InternalError",
    "LaunchConfig",
    "LaunchConfigDict",
    "LaunchPlan",
    "MemoryAllocationError",
    "Module",
    "RuntimeAPIError",
    "Stream",
    "Task",
    "TaskTimeoutError",
    "WrongLoopError",
    "available_backends",
    "device_count",
    "is_compiled",
    "open_device",
    "sim",
)


#: submodules imported on first use: programs on real hardware never load the simulator, and
#: nobody pays for tracing or metrics without using them (``aio_ascend.testing``, the pytest
#: plugin, is a tool above the package: import it by name)
_LAZY = frozenset({"sim", "tracing", "metrics"})


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'aio_ascend' has no attribute {name!r}")


for _name in __all__:
    if _name == "sim":
        continue
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and _obj.__module__.startswith("aio_ascend."):
        try:
            _obj.__module__ = "aio_ascend"
        except (AttributeError, TypeError):
            pass
del _name, _obj
