"""Host objects as the bytes a copy reads or writes: ndarrays, the buffer protocol, DLPack, and
``__array__``, checked in the call (before anything is queued).

What is accepted, in this order (the first that applies):

1. a numpy array (subclasses included);
2. an object with the buffer protocol (``bytes``, ``bytearray``, ``memoryview``, ``array``,
   ``mmap``, ctypes arrays, ...): always host memory;
3. an object with ``__dlpack__`` whose ``__dlpack_device__()`` is the CPU (a torch CPU
   tensor); one on any other device is refused with a ``TypeError`` (device memory is not a
   host buffer). numpy marks arrays from a legacy (unversioned, pre-1.0) export read-only,
   as it cannot tell; legacy exports carry no read-only flag and a CPU tensor is writable,
   so a destination exported that way is read from the capsule itself (:func:`_legacy_view`);
4. an object with numpy's ``__array_interface__`` or ``__array_struct__`` (host memory by
   definition);
5. only for a copy's source: an object with ``__array__`` (``np.asarray`` may make a copy,
   which is what is sent). A destination must be written in place, which ``__array__`` does
   not promise.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._values import integer

__all__ = [
    "write_bytes",
    "DLPACK_CPU",
    "destination_bytes",
    "dims_of",
    "host_array",
    "plain_dtype",
    "source_array",
]


#: ``kDLCPU``: the DLPack device type of host memory
DLPACK_CPU = 1

U8 = np.ndarray[Any, np.dtype[np.uint8]]

#: the name of a legacy (unversioned) DLPack capsule not consumed yet
_LEGACY = b"dltensor"
#: DLPack type codes numpy has kinds for: int, uint, float, complex, bool
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    """``DLTensor``, the head of a legacy ``DLManagedTensor`` (DLPack 0.x)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _LegacyExport:
    """Numpy's view of a legacy DLPack export: its ``__array_interface__`` (writable), and the
    capsule, left unconsumed, whose destructor (the producer's) releases the tensor once the
    arrays over it are gone."""

    def __init__(self, capsule: object, interface: dict[str, object]) -> None:
        self.capsule = capsule
        self.__array_interface__ = interface


def plain_dtype(what: str, dtype: object) -> np.dtype[Any]:
    """``dtype`` as a numpy dtype of plain, fixed-size bytes (``TypeError`` naming ``what``):
    no Python objects, no zero-size items, no datetime without a unit (its values have no
    meaning: numpy cannot even print them)."""
    try:
        kind: np.dtype[Any] = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise TypeError(f"{what} dtype={dtype!r}: {exc}") from None
    if kind.hasobject or kind.itemsize == 0:
        raise TypeError(f"{what} dtype={kind}: not a fixed-size type of plain bytes")
    if kind.kind in "mM" and np.datetime_data(kind)[0] == "generic":
        raise TypeError(f"{what} dtype={kind}: a datetime/timedelta needs a unit (e.g. 'M8[ns]')")
    return kind


def dims_of(shape: object, what: str) -> tuple[int, ...]:
    """An array shape given as an int or a tuple of ints (any integer type), none negative."""
    try:
        dims = (
            (integer(what, shape),)
            if not isinstance(shape, tuple)
            else tuple(integer(what, d) for d in shape)
        )
    except TypeError:
        raise TypeError(f"{what} shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} shape={shape!r} has a negative dimension")
    return dims


def _from_buffer(obj: object, *, typed: bool) -> np.ndarray[Any, Any] | None:
    """``obj``'s memory through the buffer protocol, or None when it has none: its bytes when
    it is C-contiguous and not ``typed`` (numpy need not understand its format: a ctypes
    structure's, say), else as numpy reads its format."""
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    if view.c_contiguous and not typed:
        return np.frombuffer(view, np.uint8)
    try:
        return np.asarray(view)
    except (TypeError, ValueError, NotImplementedError):  # a format numpy does not read
        if not view.c_contiguous:
            raise ValueError(
                f"a {type(obj).__name__} of format {view.format!r} that is not C-contiguous"
            ) from None
        return np.frombuffer(view, np.uint8)


def _legacy_view(obj: object) -> np.ndarray[Any, Any] | None:
    """A writable array over ``obj``'s CPU memory when its ``__dlpack__`` export is a legacy
    one (no read-only flag in the format: a CPU tensor's memory is writable), else None (a
    versioned export: its read-only flag, which numpy honoured, stands)."""
    exporter: Any = obj
    try:
        capsule = exporter.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer without DLPack 1.0
        capsule = exporter.__dlpack__()
    if not _capsule_is_valid(capsule, _LEGACY):
        return None
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, _LEGACY))
    dtype = tensor.dtype
    kind = _KINDS.get(dtype.code)
    if tensor.device_type != DLPACK_CPU or kind is None or dtype.lanes != 1 or dtype.bits % 8:
        return None
    itemsize = dtype.bits // 8
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = None
    if tensor.strides:
        strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim))
    interface: dict[str, object] = {
        "data": ((tensor.data or 0) + tensor.byte_offset, False),
        "shape": shape,
        "strides": strides,
        "typestr": np.dtype(f"{kind}{itemsize}").str,
        "version": 3,
    }
    return np.asarray(_LegacyExport(capsule, interface))


def _from_dlpack(obj: object, what: str, *, writable: bool) -> np.ndarray[Any, Any] | None:
    """``obj`` through DLPack when it has ``__dlpack__`` (CPU only), else None; a legacy
    export made writable when ``writable`` (see :func:`_legacy_view`)."""
    if getattr(type(obj), "__dlpack__", None) is None:
        return None
    name = type(obj).__name__
    try:
        device = obj.__dlpack_device__()  # type: ignore[attr-defined]
        kind = int(device[0])
    except Exception as exc:
        raise TypeError(f"{what}: cannot tell where this {name} lives ({exc})") from None
    if kind != DLPACK_CPU:
        raise TypeError(
            f"{what}: this {name} is on DLPack device {tuple(device)}, not the host: copies "
            "read and write host memory (for device memory: dev.wrap(ptr, nbytes, owner=...) "
            "and copy_device)"
        )
    try:
        try:
            array = np.from_dlpack(obj, copy=False)  # type: ignore[arg-type]
        except TypeError:  # numpy < 2.1 has no copy= (and never copies)
            array = np.from_dlpack(obj)  # type: ignore[arg-type]
        if writable and not array.flags.writeable:
            legacy = _legacy_view(obj)
            if legacy is not None:
                array = legacy
    except Exception as exc:  # BufferError, or the exporter's own (torch: RuntimeError)
        raise TypeError(f"{what}: this {name} cannot be read through __dlpack__: {exc}") from None
    return array


def host_array(
    obj: object, what: str, *, writable: bool, typed: bool = False
) -> np.ndarray[Any, Any]:
    """``obj`` as an ndarray; the same memory unless ``obj`` only has ``__array__`` (allowed
    only when not ``writable``). A buffer is read as bytes unless ``typed``."""
    if isinstance(obj, np.ndarray):
        return obj
    array = _from_buffer(obj, typed=typed)
    if array is None:
        array = _from_dlpack(obj, what, writable=writable)
    if array is None and (
        hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__")
    ):  # a description of host memory: numpy's array over it is the same memory
        try:
            array = np.asarray(obj)
        except Exception as exc:
            name = type(obj).__name__
            raise TypeError(f"{what}: np.asarray() refused this {name}: {exc}") from None
    if array is None:
        if not writable and getattr(type(obj), "__array__", None) is not None:
            try:
                return np.asarray(obj)
            except Exception as exc:
                name = type(obj).__name__
                raise TypeError(f"{what}: np.asarray() refused this {name}: {exc}") from None
        kinds = "an ndarray, a writable buffer" if writable else "an ndarray, a buffer"
        kinds += ", an __array_interface__ object"
        extra = "" if writable else ", an object with __array__"
        raise TypeError(
            f"{what} must be {kinds}{extra} or a CPU __dlpack__ object (a torch CPU tensor), "
            f"got {type(obj).__name__}"
        )
    return array


def source_array(src: object, what: str) -> np.ndarray[Any, Any]:
    """A copy's host source as a plain ndarray over the same memory, in any layout: its bytes
    in C order are what is sent (:func:`write_bytes` gathers them where it stages them, so a
    big strided source is never copied on the event loop)."""
    array = host_array(src, what, writable=False)
    if array.dtype.hasobject:
        raise TypeError(f"{what}: an array of {array.dtype} has no device bytes")
    return array.view(np.ndarray)


def write_bytes(target: U8, src: np.ndarray[Any, Any]) -> None:
    """Write the C-order bytes of ``src`` into the 1-D byte array ``target`` of its size
    (np.copyto: it gathers a strided source, and releases the GIL for the bulk of a big copy,
    which a memoryview slice assignment holds throughout)."""
    if src.flags.c_contiguous:
        np.copyto(target, src.reshape(-1).view(np.uint8))
    else:
        np.copyto(target.view(src.dtype).reshape(src.shape), src)


def destination_bytes(dst: object, what: str) -> U8:
    """A copy's host destination as the same memory in a 1-D byte array: writable and
    C-contiguous (it is written in place), or a ``ValueError``."""
    array = host_array(dst, what, writable=True)
    if array.dtype.hasobject:
        raise TypeError(f"{what}: an array of {array.dtype} cannot hold device data")
    if not array.flags.writeable:
        raise ValueError(f"{what} is read-only: a copy to the host needs writable memory")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (a copy to the host fills it in place)")
    if array.nbytes == 0:
        raise ValueError(f"{what} is empty")
    # (np.matrix and other subclasses included)
    return array.view(np.ndarray).reshape(-1).view(np.uint8)
