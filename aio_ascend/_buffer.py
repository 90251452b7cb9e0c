"""``DeviceBuffer``: device memory from ``Device.malloc``, and the check of buffers in calls."""

from __future__ import annotations

from collections.abc import Iterable

from ._sched.lifetimes import Allocation, Lifetimes

__all__ = ["DeviceBuffer", "allocations_of"]


class DeviceBuffer(Allocation):
    """Device memory from :meth:`Device.malloc`.

    :ivar ptr: the device address (int)
    :ivar nbytes: the size in bytes

    :meth:`free` is deferred while queued work still uses the buffer (as a ``HostArgs.ptr``
    or a copy source/destination): the memory is released when that work has completed.
    """

    __slots__ = ()

    def free(self) -> None:
        """Release the memory now, or as soon as the work that uses it has completed."""
        self.registry.free(self)

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` has been called (the memory may still be in use by the device)."""
        return self.free_requested

    def __repr__(self) -> str:
        state = "freed" if self.free_requested else f"uses={self.uses}"
        return f"<DeviceBuffer {self.ptr:#x} nbytes={self.nbytes} {state}>"


def allocations_of(
    objs: Iterable[object], registry: Lifetimes, field: str, *, others_allowed: bool = False
) -> tuple[DeviceBuffer, ...]:
    """The DeviceBuffers among ``objs``, checked to be live buffers of the device ``registry``.

    :param others_allowed: skip objects that are no DeviceBuffer (``HostArgs.ptr`` also takes
        plain ints and other pointer-like objects) instead of refusing them
    """
    out = []
    for obj in objs:
        if not isinstance(obj, DeviceBuffer):
            if not others_allowed:
                raise TypeError(f"{field} must be a DeviceBuffer, got {type(obj).__name__}")
            continue
        if obj.registry is not registry:
            raise ValueError(f"{field}: {obj!r} belongs to a different device")
        if obj.free_requested:
            raise ValueError(f"{field}: {obj!r} has been freed")
        out.append(obj)
    return tuple(out)
