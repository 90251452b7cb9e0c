"""Copies take any host object: ndarrays, the buffer protocol, CPU ``__dlpack__`` (a torch CPU
tensor), and ``__array__`` for a source; a destination is written in place. What cannot be
(read-only, non-contiguous, on another device, only ``__array__``) is refused in the call,
before anything is queued.

Runs on the sim and the acl C double, on asyncio, uvloop and trio; torch only where it is
installed.
"""

from __future__ import annotations

import array
import ctypes
import gc
import importlib.util
import mmap
import weakref
from typing import Any, cast

import numpy as np
import pytest
from helpers import OpenDevice, assert_runtime_clean

from aio_ascend._host.hostdata import DLPACK_CPU, destination_bytes

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True

DATA = np.arange(16, dtype=np.float32)


class ArrayOnly:
    """Only ``__array__`` (what many array-likes offer): a source, never a destination."""

    def __init__(self, data: np.ndarray[Any, Any]) -> None:
        self.data = data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        return self.data.copy()  # (no promise that it is the same memory)


class DLPackOnly:
    """Only ``__dlpack__``/``__dlpack_device__``, over an ndarray's memory (as a torch CPU
    tensor is); ``device`` says where it claims to live."""

    def __init__(self, data: np.ndarray[Any, Any], device: tuple[int, int] = (1, 0)) -> None:
        self.data = data
        self.device = device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class LegacyDLPack(DLPackOnly):
    """A producer without DLPack 1.0 (a torch release before it): ``__dlpack__`` takes only
    ``stream`` and exports a legacy (unversioned) capsule, which numpy reads as read-only."""

    def __dlpack__(self, stream: Any = None) -> Any:  # type: ignore[override]
        return self.data.__dlpack__(stream=stream)


class LegacyAnyway(DLPackOnly):
    """A producer that takes ``max_version`` but exports a legacy capsule all the same."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.data.__dlpack__()


class Interface:
    """Only numpy's ``__array_interface__``: a description of host memory."""

    def __init__(self, data: np.ndarray[Any, Any]) -> None:
        self.data = data
        self.__array_interface__ = data.__array_interface__


class Pair(ctypes.Structure):
    """A format numpy reads only with a warning: copies take its bytes."""

    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


class BrokenDLPack(DLPackOnly):
    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("this exporter refuses")


def _sources() -> list[tuple[Any, np.ndarray[Any, Any]]]:
    """(a host object, the float32 values a copy from it sends)."""
    raw = DATA.tobytes()
    evens = np.arange(32, dtype=np.float32)
    return [
        (raw, DATA),
        (bytearray(raw), DATA),
        (memoryview(raw), DATA),
        (array.array("f", DATA.tolist()), DATA),
        ((ctypes.c_float * 16)(*DATA.tolist()), DATA),
        (ArrayOnly(DATA), DATA),
        (DLPackOnly(DATA.copy()), DATA),
        (Interface(DATA.copy()), DATA),
        ((Pair * 8)(*[Pair(*DATA[i : i + 2]) for i in range(0, 16, 2)]), DATA),
        (DATA.reshape(4, 4).T, DATA.reshape(4, 4).T.reshape(-1)),  # strided: gathered
        (memoryview(evens)[::2], evens[::2]),  # a strided buffer too
    ]


async def test_uploads_take_any_host_object(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(DATA.nbytes)
        for source, expected in _sources():
            await s.memset(buf, 0)
            await s.upload(buf, source)
            got = await s.download(buf, np.float32)
            np.testing.assert_array_equal(got, expected, err_msg=type(source).__name__)
    assert_runtime_clean(dev)


async def test_downloads_write_host_objects_in_place(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(DATA.nbytes)
        await s.upload(buf, DATA)
        expected = DATA.tobytes()
        scratch = mmap.mmap(-1, DATA.nbytes)
        targets: list[Any] = [
            bytearray(DATA.nbytes),
            memoryview(bytearray(DATA.nbytes)),
            array.array("f", [0.0] * 16),
            (ctypes.c_float * 16)(),
            scratch,
            DLPackOnly(np.zeros(16, np.float32)),
            LegacyDLPack(np.zeros(16, np.float32)),
            LegacyAnyway(np.zeros((4, 4), np.float32)),
            Interface(np.zeros(16, np.float32)),
            (Pair * 8)(),
        ]
        for target in targets:
            assert await s.download(buf, out=target) is target
            data = target.data if isinstance(target, DLPackOnly | Interface) else target
            assert bytes(memoryview(data).cast("B")) == expected, type(target).__name__
        partial = bytearray(8)  # fewer bytes than the buffer: its start
        task = await s.copy_to_host(partial, buf)
        await task
        assert bytes(partial) == expected[:8]
        legacy = LegacyDLPack(np.zeros(16, np.float32))
        await (await s.copy_to_host(legacy, buf))
        assert legacy.data.tobytes() == expected
        scratch.close()
    assert_runtime_clean(dev)


async def test_host_objects_that_cannot_be_copied_are_refused_in_the_call(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(DATA.nbytes)
        readonly = np.zeros(16, np.float32)
        readonly.flags.writeable = False
        refused: list[tuple[Any, type[Exception], str]] = [
            (b"\0" * 64, ValueError, "read-only"),
            (memoryview(bytearray(128))[::2], ValueError, "C-contiguous"),
            (DLPackOnly(readonly), ValueError, "read-only"),  # a versioned export's flag
            (LegacyDLPack(np.zeros((4, 8), np.float32)[:, :4]), ValueError, "C-contiguous"),
            (DLPackOnly(np.zeros(16, np.float32), device=(2, 0)), TypeError, "not the host"),
            (BrokenDLPack(np.zeros(16, np.float32)), TypeError, "this exporter refuses"),
            (ArrayOnly(np.zeros(16, np.float32)), TypeError, "writable buffer"),
            (bytearray(), ValueError, "empty"),
            (12345, TypeError, "copy_to_host dst"),
        ]
        for target, error, words in refused:
            with pytest.raises(error, match=words):
                await s.copy_to_host(target, buf)
            with pytest.raises(error, match=words):
                await s.download(buf, out=target)
        for source, error, words in [
            (DLPackOnly(np.zeros(16, np.float32), device=(2, 0)), TypeError, "dev.wrap"),
            (BrokenDLPack(np.zeros(16, np.float32)), TypeError, "__dlpack__"),
            (object(), TypeError, "copy_to_device src"),
            (bytearray(), ValueError, "empty"),
        ]:
            with pytest.raises(error, match=words):
                await s.copy_to_device(buf, source)
        stats = dev.stats()
        assert stats["copies"] == 0 and stats["in_flight"] == 0  # nothing was queued
    assert_runtime_clean(dev)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
async def test_torch_cpu_tensors(open_dev: OpenDevice) -> None:
    import torch

    async with open_dev() as dev:
        s = dev.stream()
        source = torch.arange(16, dtype=torch.float32)
        buf = dev.malloc(64)
        await s.upload(buf, source)
        await s.upload(buf, source.reshape(4, 4).T)  # strided: gathered as it is staged
        out = torch.zeros(4, 4, dtype=torch.float32)
        assert await s.download(buf, out=out) is out  # written in place
        assert torch.equal(out, source.reshape(4, 4).T)
        with pytest.raises(ValueError, match="C-contiguous"):
            await s.download(buf, out=torch.zeros(4, 8)[:, :4])
        with pytest.raises(TypeError, match="__dlpack__"):
            await s.download(buf, out=torch.zeros(16, requires_grad=True))
        pinned = dev.pinned_like(source)  # shape and dtype of a tensor
        assert pinned.shape == (16,) and pinned.dtype == np.float32
        await s.download(buf, out=torch.from_numpy(pinned))  # a tensor over a pinned array
        np.testing.assert_array_equal(pinned, source.reshape(4, 4).T.reshape(-1).numpy())
        assert dev.stats()["host_buffers_in_use"] == 0
        del pinned
    assert_runtime_clean(dev)


def test_a_legacy_dlpack_destination_keeps_its_export_alive_then_releases_it() -> None:
    """The writable view over a legacy export holds the capsule (so the producer's memory)
    while it lives; once it is gone the producer's deleter lets the memory go."""
    data = np.zeros((2, 3), np.float32)
    alive = weakref.ref(data)
    view = destination_bytes(LegacyDLPack(data), "dst")
    del data
    gc.collect()
    assert alive() is not None and view.nbytes == 24 and view.flags.writeable
    view[:] = 7
    assert cast(np.ndarray[Any, Any], alive()).tobytes() == bytes([7]) * 24
    del view
    gc.collect()
    assert alive() is None


def test_the_dlpack_device_type_of_host_memory() -> None:
    assert np.zeros(1).__dlpack_device__()[0] == DLPACK_CPU
