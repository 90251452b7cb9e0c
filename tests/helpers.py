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
#: CANN 8.5 (host args), 8.3 (the args-handle path) and 8.0 (the device-args path); ``acl``
#: itself is CANN 9.1
PERSONA_BACKENDS = ("acl-8.5", "acl-8.3", "acl-8.0")


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

        from aio_ascend._runtime.acl.settle import LEAKED

        counts = control_for(dev.runtime).live_counts()
        # what a close left on purpose (under a hung kernel), this test's or an earlier one's
        path = dev.runtime.library_path
        leaked = {
            kind: sum(1 for p, k, _ in LEAKED if p == path and k == kind)
            for kind in ("device", "host", "binary")
        }
        return {
            "device_allocations": counts["device_allocs"] - leaked["device"],
            "host_allocations": counts["host_allocs"] - leaked["host"],
            "streams": counts["streams"],
            "events": counts["events"],
            "binaries": counts["binaries"] - leaked["binary"],
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
    """After ``aclose()``: the device and its runtime report nothing left allocated (the
    plugin's ``aio_ascend.testing.assert_no_leaks``, plus the acl double's and the fake CUDA
    driver's own counts)."""
    from aio_ascend.testing import assert_no_leaks

    assert_no_leaks(dev)
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


def check_trace(trace: dict[str, Any]) -> dict[str, Any]:
    """Check a trace written by ``aio_ascend.tracing`` the way Perfetto reads it; summarise it.

    Every async slice (``b``/``e`` of one ``id``) nests properly, in time order; each ``id`` is
    a track named by its first slice, and Perfetto shows the tracks of one process with the
    same name as one (``tracks``: process name -> track name -> tasks on it). Flows (``bind_id``)
    run from a ``flow_out`` through ``flow_in``+``flow_out`` steps to a ``flow_in``, in time
    order. Returns ``tracks``, ``phases`` (names of the nested slices), ``flows`` (bind_id ->
    its slices' outer names, in order) and ``outer`` (every outer ``b`` event).
    """
    events = trace["traceEvents"]
    assert isinstance(events, list)
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    stacks: dict[str, list[str]] = {}
    last_ts: dict[str, float] = {}
    track_of: dict[str, tuple[str, str]] = {}
    tracks: dict[str, dict[str, int]] = {}
    phases: set[str] = set()
    outer: list[dict[str, Any]] = []
    for e in events:
        if e["ph"] == "M":
            continue
        assert e["ph"] in ("b", "e", "n"), e
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        assert e["pid"] in processes, f"event of an unnamed process: {e}"
        ident = e["id"]
        assert e["ts"] >= last_ts.get(ident, 0.0), f"time runs backwards on {ident}: {e}"
        last_ts[ident] = e["ts"]
        stack = stacks.setdefault(ident, [])
        if e["ph"] == "b":
            if ident not in track_of:
                track_of[ident] = (processes[e["pid"]], e["name"])
                by_name = tracks.setdefault(processes[e["pid"]], {})
                by_name[e["name"]] = by_name.get(e["name"], 0) + 1
                outer.append(e)
            else:
                assert stack, f"a second top-level slice on {ident}: {e}"
                phases.add(e["name"])
            stack.append(e["name"])
        elif e["ph"] == "e":
            assert stack and stack[-1] == e["name"], f"misnested end on {ident}: {e}"
            stack.pop()
        else:
            assert stack, f"an instant outside its task: {e}"
    assert not any(stacks.values()), "slices left open"
    chains: dict[int, list[dict[str, Any]]] = {}
    for e in outer:
        if "bind_id" in e:
            chains.setdefault(e["bind_id"], []).append(e)
    flows: dict[int, list[str]] = {}
    for flow, members in chains.items():
        members.sort(key=lambda e: e["ts"])
        assert len(members) >= 2, f"a flow of one slice: {members}"
        for index, e in enumerate(members):
            assert bool(e.get("flow_in")) == (index > 0), e
            assert bool(e.get("flow_out")) == (index < len(members) - 1), e
        flows[flow] = [e["name"] for e in members]
    return {"tracks": tracks, "phases": phases, "flows": flows, "outer": outer}
