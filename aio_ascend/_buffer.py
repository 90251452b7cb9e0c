"""``DeviceBuffer``: device memory (allocated, wrapped or a view), and the check of buffers in
calls."""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import ClosedError
from ._sched.lifetimes import Allocation, Lifetimes
from ._unique import Unique
from ._values import integer

__all__ = ["DeviceBuffer", "allocations_of", "byte_range"]


def _index(name: str, value: object, nbytes: int, default: int) -> int:
    if value is None:
        return default
    index = integer(f"DeviceBuffer slice {name} (an int or None)", value)
    return index + nbytes if index < 0 else index


class DeviceBuffer(Allocation, Unique):
    """Device memory: from :meth:`Device.malloc`, :meth:`Device.wrap`, or a view of either.

    :ivar ptr: the device address (int)
    :ivar nbytes: the size in bytes

    :meth:`free` is deferred while queued work still uses the buffer (as a ``HostArgs.ptr``
    or a copy source/destination): the memory is released when that work has completed.

    ``buf[start:stop]`` is a view: the same memory at an offset, usable wherever a
    ``DeviceBuffer`` is. Python's rules for negative indices apply; the step must be 1 or
    ``None``; a range outside ``0 <= start <= stop <= nbytes`` raises ``ValueError`` (it is
    never clamped). A view keeps its root allocation alive, and work queued on a view counts as
    work on the root: freeing the root waits for it. A view of a view is a view of the root.
    An empty view is refused where bytes are needed (copies, memset).
    """

    __slots__ = ("_base", "offset")

    def __init__(
        self,
        registry: Lifetimes,
        ptr: int,
        nbytes: int,
        *,
        base: DeviceBuffer | None = None,
        offset: int = 0,
        external: bool = False,
        owner: object = None,
        block: int = 0,
        pooled: bool = False,
    ) -> None:
        super().__init__(
            registry, ptr, nbytes, external=external, owner=owner, block=block, pooled=pooled
        )
        self._base = base
        #: the offset of this view in its root allocation (0 for a root)
        self.offset = offset

    @property
    def base(self) -> DeviceBuffer | None:
        """The root allocation of a view; ``None`` for a root."""
        return self._base

    @property
    def root(self) -> DeviceBuffer:
        """The allocation this buffer's memory belongs to (itself for a root)."""
        return self if self._base is None else self._base

    def __getitem__(self, key: slice) -> DeviceBuffer:
        if not isinstance(key, slice):
            raise TypeError(
                f"a DeviceBuffer is sliced by bytes (buf[start:stop]), not indexed by "
                f"{type(key).__name__}"
            )
        if key.step is not None and integer("DeviceBuffer slice step", key.step) != 1:
            raise ValueError(f"DeviceBuffer slice step must be 1 or None, got {key.step!r}")
        start = _index("start", key.start, self.nbytes, 0)
        stop = _index("stop", key.stop, self.nbytes, self.nbytes)
        if not 0 <= start <= stop <= self.nbytes:
            raise ValueError(
                f"DeviceBuffer slice [{key.start}:{key.stop}] is outside 0..{self.nbytes} "
                f"(normalised: start={start}, stop={stop})"
            )
        root = self.root
        if root.free_requested:
            if self.registry.closed:
                raise ClosedError(f"cannot slice {self!r}: the device is closed")
            raise ValueError(f"cannot slice {self!r}: its memory has been freed")
        return DeviceBuffer(
            self.registry,
            self.ptr + start,
            stop - start,
            base=root,
            offset=self.offset + start,
        )

    def free(self) -> None:
        """Release the memory now, or as soon as the work that uses it has completed.

        For wrapped memory (:meth:`Device.wrap`) nothing is freed: the wrapper lets go of its
        ``owner`` once queued work is done. A view cannot be freed: free its root.
        """
        if self._base is not None:
            raise ValueError(
                f"{self!r} is a view: free its root allocation (buf.base) instead; the root is "
                "freed once the work on all of its views has completed"
            )
        self.registry.free(self)

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` has been called on it, or on its root (the memory may still be
        in use by the device)."""
        return self.root.free_requested

    def __repr__(self) -> str:
        root = self.root
        state = "freed" if root.free_requested else f"uses={root.uses}"
        kind = ""
        if self._base is not None:
            kind = f" view+{self.offset}"
        elif self.external:
            kind = " wrapped"
        return f"<DeviceBuffer {self.ptr:#x} nbytes={self.nbytes}{kind} {state}>"


def allocations_of(
    objs: Iterable[object], registry: Lifetimes, field: str, *, others_allowed: bool = False
) -> tuple[DeviceBuffer, ...]:
    """The root allocations of the DeviceBuffers among ``objs`` (what queued work must keep in
    use), each checked to be a live buffer of the device ``registry``.

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
        root = obj.root
        if root.free_requested:
            if registry.closed:  # (freed by its device's close: used after it)
                raise ClosedError(f"{field}: {obj!r} belongs to a closed device")
            raise ValueError(f"{field}: {obj!r} has been freed")
        out.append(root)
    return tuple(out)


def byte_range(
    buffer: object, registry: Lifetimes, field: str, nbytes: object
) -> tuple[DeviceBuffer, DeviceBuffer, int]:
    """``(buffer, its root, count)`` for an operation on the first ``nbytes`` bytes of a
    buffer (all of it when ``nbytes`` is None), checked: a live, non-empty range of this
    device."""
    (root,) = allocations_of((buffer,), registry, field)
    assert isinstance(buffer, DeviceBuffer)
    if nbytes is None:
        count = buffer.nbytes
    else:
        count = integer("nbytes", nbytes)
        if count > buffer.nbytes:
            raise ValueError(f"nbytes={count} exceeds {field}'s {buffer.nbytes} bytes")
    if count <= 0:
        raise ValueError(
            f"{field}: nothing to do on {count} bytes (an empty buffer or view, or nbytes <= 0)"
        )
    return buffer, root, count
