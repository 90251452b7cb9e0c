"""Test helpers (imported by test modules; never from conftest)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import aio_ascend as aa


def open_sim(**kwargs: Any) -> Any:
    """``open_device(0, backend="sim", ...)``."""
    return aa.open_device(0, backend="sim", **kwargs)


#: ``open_dev(device_id=0, **open_device_kwargs)``: the ``open_dev`` fixture (tests/conftest.py)
OpenDevice = Callable[..., Any]

#: the device backends every scheduler test runs on: the sim, and acl over its C test double
DEVICE_BACKENDS = ("sim", "acl")
#: the acl backend over the double's other usable personas (``@pytest.mark.personas`` tests):
#: CANN 8.5 (host args) and 8.3 (the args-handle path); ``acl`` itself is CANN 9.1
PERSONA_BACKENDS = ("acl-8.5", "acl-8.3")


def open_backend(backend: str, device_id: int = 0, **kwargs: Any) -> Any:
    """``open_device(0, ...)`` on ``"sim"``, on the ``"acl"`` backend over the C test double,
    or on ``"cuda-fake"`` (the cuda backend over the CPU fake of the driver)."""
    if backend == "cuda-fake":
        from backends import fake_driver
        from doubles.cuda_fake import fake_compile

        options = {
            "driver": fake_driver(),
            "compiler": fake_compile,
            **kwargs.pop("runtime_options", {}),
        }
        return aa.open_device(device_id, backend="cuda", runtime_options=options, **kwargs)
    if backend == "acl" or backend.startswith("acl-"):
        import os

        from doubles.acl_double import DEFAULT_PERSONA, build_double

        from aio_ascend._runtime.acl.runtime import ENV_BUILTINS

        built = build_double(backend.partition("-")[2] or DEFAULT_PERSONA)
        os.environ.setdefault(ENV_BUILTINS, str(built.builtins))
        options = {"library_path": str(built.library), **kwargs.pop("runtime_options", {})}
        return aa.open_device(device_id, backend="acl", runtime_options=options, **kwargs)
    return aa.open_device(device_id, backend=backend, **kwargs)


def live_resources(dev: aa.Device) -> dict[str, int]:
    """What the runtime below ``dev`` still holds, with the sim's key names."""
    if dev.backend == "acl":
        from doubles.acl_double import control_for

        counts = control_for(dev.runtime).live_counts()
        return {
            "device_allocations": counts["device_allocs"],
            "host_allocations": counts["host_allocs"],
            "streams": counts["streams"],
            "events": counts["events"],
            "binaries": counts["binaries"],
        }
    if dev.backend == "cuda":
        driver = dev.runtime._d
        if not hasattr(driver, "device"):  # a real GPU: only the fake driver counts objects
            import pytest

            pytest.skip("live resources are only counted on the fake CUDA driver")
        return {
            "device_allocations": len(driver.device),
            "host_allocations": len(driver.host),
            "streams": len(driver.streams),
            "events": len(driver.events),
            "binaries": len(driver.modules),
        }
    live: dict[str, int] = dev.runtime.live_resources()  # type: ignore[attr-defined]
    return live


def assert_runtime_clean(dev: aa.Device) -> None:
    """After ``aclose()``: the runtime reports nothing left allocated."""
    live = live_resources(dev)
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
