"""Test helpers (imported by test modules; never from conftest)."""

from __future__ import annotations

from typing import Any

import numpy as np

import aio_ascend as aa


def open_sim(**kwargs: Any) -> Any:
    """``open_device(0, backend="sim", ...)``."""
    return aa.open_device(0, backend="sim", **kwargs)


def assert_runtime_clean(dev: aa.Device) -> None:
    """After ``aclose()``: the sim reports nothing left allocated."""
    live = dev.runtime.live_resources()  # type: ignore[attr-defined]
    assert all(count == 0 for count in live.values()), f"left behind after close: {live}"


async def upload(dev: aa.Device, stream: aa.Stream, array: np.ndarray[Any, Any]) -> aa.DeviceBuffer:
    """Allocate a device buffer holding ``array`` (awaits the copy)."""
    buf = dev.malloc(array.nbytes)
    await (await stream.copy_to_device(buf, array))
    return buf


async def download(
    stream: aa.Stream, buf: aa.DeviceBuffer, count: int, dtype: Any = np.float32
) -> np.ndarray[Any, Any]:
    """Read ``count`` items of ``dtype`` back from ``buf``."""
    out = np.empty(count, dtype=dtype)
    await (await stream.copy_to_host(out, buf))
    return out


def tiling(fmt_values: list[tuple[str, Any]]) -> bytes:
    """Pack a tiling struct, e.g. ``[("I", n), ("f", factor)]``."""
    import struct

    return b"".join(struct.pack("<" + fmt, value) for fmt, value in fmt_values)
