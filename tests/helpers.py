"""Test helpers (imported by test modules; never from conftest)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np

import aio_ascend as aa
from aio_ascend._host.hostargs import HostArgs
from aio_ascend._runtime.abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
    ACL_MEMCPY_DEVICE_TO_DEVICE,
)

#: a generous bound (ms) for the runtime-level waits that must succeed
SYNC_MS = 10_000

#: the short names the runtime contract suites use
F32 = np.float32
COMPLETE = ACL_EVENT_RECORDED_STATUS_COMPLETE
NOT_READY = ACL_EVENT_RECORDED_STATUS_NOT_READY
D2D = ACL_MEMCPY_DEVICE_TO_DEVICE


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
    if backend == "realrt":  # the real CANN runtime over our fake driver (tests/realrt)
        import pytest
        from realrt.fixture import fakehal, realrt_library, use_kernel_binary

        if device_id != 0:
            pytest.skip("our fake driver plays one device (tests/realrt/fakehal)")
        library = realrt_library()
        fakehal().reset()
        use_kernel_binary()
        options = {"library_path": str(library), **kwargs.pop("runtime_options", {})}
        return aa.open_device(device_id, backend="acl", runtime_options=options, **kwargs)
    if backend == "acl" or backend.startswith("acl-"):
        from doubles.acl_double import DEFAULT_PERSONA, build_double, use_double_builtins

        built = build_double(backend.partition("-")[2] or DEFAULT_PERSONA)
        use_double_builtins(built)
        options = {"library_path": str(built.library), **kwargs.pop("runtime_options", {})}
        return aa.open_device(device_id, backend="acl", runtime_options=options, **kwargs)
    return aa.open_device(device_id, backend=backend, **kwargs)


def on_real_runtime(dev: aa.Device) -> bool:
    """Whether ``dev`` is the acl backend over the real CANN runtime (``realrt``), not over the
    C double. By the double's handle, not the library's name: the acl backend keeps one
    library per file, named by the path it was first loaded through (the realrt bench loads
    ``libacl_rt.so`` through a ``lib64/libascendcl.so`` link of its own)."""
    if dev.backend != "acl":
        return False
    from doubles.acl_double import control_for

    try:
        control_for(dev.runtime)
    except LookupError:
        return True
    return False


async def close_while_waiting(
    wait: Callable[[], Awaitable[object]], close: Callable[[], None], waiters: int = 3
) -> list[BaseException | None]:
    """Start ``waiters`` calls of ``wait`` that wait for admission behind a hung kernel (no
    other slot: they must all still wait 50 ms later), then ``close()``: each call's outcome
    (its ``ClosedError``, or None if it returned), within 3 s (the hung kernel's own task
    timeout must be far longer)."""
    outcomes: list[BaseException | None] = []

    async def one() -> None:
        try:
            await wait()
        except aa.ClosedError as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)

    with anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            for _ in range(waiters):
                tg.start_soon(one)
            await anyio.sleep(0.05)
            assert outcomes == []  # all wait for the hung kernel's slot
            close()
    return outcomes


async def wait_for_live_streams(dev: aa.Device, count: int) -> None:
    """Wait until the runtime below ``dev`` holds ``count`` streams. A stream closed while the
    library's stall probe was out on it is destroyed by the prober right after that probe
    (``aio_ascend/_sched/stalls.py``), a moment after its close returned (a probe takes ~1 ms:
    the bound is for a loaded machine)."""
    with anyio.fail_after(5):
        while live_resources(dev)["streams"] != count:  # noqa: ASYNC110 - a runtime counter
            await anyio.sleep(0.005)


def live_resources(dev: aa.Device) -> dict[str, int]:
    """What the runtime below ``dev`` still holds, with the sim's key names."""
    if on_real_runtime(dev):
        import pytest

        pytest.skip(
            "the real runtime's objects are not counted: it allocates pools of its own through "
            "our fake driver (tests/realrt)"
        )
    if dev.backend == "acl":
        from doubles.acl_double import control_for

        from aio_ascend._runtime.acl.settle import LEAKED

        control = control_for(dev.runtime)
        counts = control.live_counts()
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
            # threads that still have the device's context current: after the close, that
            # destroyed context is never deleted on the real runtime (acl/contexts.py)
            "threads_holding_its_context": control.context_thread_refs(dev.runtime.context)
            if dev.closed
            else 0,
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
    driver's own counts; on the real runtime, ``realrt``, the plugin's check only)."""
    from aio_ascend.testing import assert_no_leaks

    assert_no_leaks(dev)
    if on_real_runtime(dev):
        return  # the real runtime (tests/realrt): its own objects are not counted (live_resources)
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

    Every event belongs to a named process. A device's tasks are complete slices (``X``) or
    instants (``i``) on named thread tracks, one per stream, where slices never overlap. The
    request blocks are async slices (``b``/``e`` of one ``id``, properly nested, in time
    order). Counters (``C``) hold non-negative ``queued`` and ``in flight`` series that end at
    0. Flows (``bind_id``) run from a ``flow_out`` through ``flow_in``+``flow_out`` steps to a
    ``flow_in``, in time order. Returns ``tracks`` (process name -> track name -> tasks or
    requests on it), ``slices`` (names of the tasks' slices), ``counters`` (process name ->
    counter name -> its series' last values), ``flows`` (bind_id -> the track names of its
    slices, in order) and ``outer`` (every slice that can carry a flow).
    """
    events = trace["traceEvents"]
    assert isinstance(events, list)
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    # Perfetto keys threads by tid alone: a tid names one thread of one process
    assert len({tid for _, tid in threads}) == len(threads)
    assert not set(processes) & {tid for _, tid in threads}
    for (pid, _), name in threads.items():
        assert [n for (p, _), n in threads.items() if p == pid].count(name) == 1, name
    stacks: dict[str, list[str]] = {}
    last_ts: dict[str, float] = {}
    busy_until: dict[tuple[int, int], float] = {}
    tracks: dict[str, dict[str, int]] = {}
    slices: set[str] = set()
    counters: dict[str, dict[str, dict[str, int]]] = {}
    counter_ts: dict[tuple[int, str], float] = {}
    outer: list[dict[str, Any]] = []
    for e in sorted((e for e in events if e["ph"] != "M"), key=lambda e: e["ts"]):
        assert e["ph"] in ("b", "e", "X", "i", "C"), e
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        assert e["pid"] in processes, f"event of an unnamed process: {e}"
        process = processes[e["pid"]]
        if e["ph"] in ("X", "i"):
            track = (e["pid"], e["tid"])
            assert track in threads, f"a task on an unnamed track: {e}"
            by_name = tracks.setdefault(process, {})
            by_name[threads[track]] = by_name.get(threads[track], 0) + 1
            slices.add(e["name"])
            if e["ph"] == "X":
                assert e["dur"] >= 0, e
                assert e["ts"] >= busy_until.get(track, 0.0) - 1e-6, f"overlapping tasks: {e}"
                busy_until[track] = e["ts"] + e["dur"]
                outer.append(e)
            continue
        if e["ph"] == "C":
            key = (e["pid"], e["name"])
            assert e["ts"] > counter_ts.get(key, -1.0), f"two samples at one time: {e}"
            counter_ts[key] = e["ts"]
            assert set(e["args"]) == {"queued", "in flight"}, e
            assert all(isinstance(v, int) and v >= 0 for v in e["args"].values()), e
            counters.setdefault(process, {})[e["name"]] = dict(e["args"])
            continue
        ident = e["id"]
        assert e["ts"] >= last_ts.get(ident, 0.0), f"time runs backwards on {ident}: {e}"
        last_ts[ident] = e["ts"]
        stack = stacks.setdefault(ident, [])
        if e["ph"] == "b":
            if not stack:
                by_name = tracks.setdefault(process, {})
                by_name[e["name"]] = by_name.get(e["name"], 0) + 1
                outer.append(e)
            stack.append(e["name"])
        else:
            assert stack and stack[-1] == e["name"], f"misnested end on {ident}: {e}"
            stack.pop()
    assert not any(stacks.values()), "slices left open"
    for process, series in counters.items():
        for name, last in series.items():
            assert last == {"queued": 0, "in flight": 0}, (process, name, last)
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
        flows[flow] = [
            threads[(e["pid"], e["tid"])] if e["ph"] == "X" else e["name"] for e in members
        ]
    return {
        "tracks": tracks,
        "slices": slices,
        "counters": counters,
        "flows": flows,
        "outer": outer,
    }


def scale_args(x: int, y: int, n: int, factor: float) -> HostArgs:
    """The built-in ``scale`` kernel's args: ``y = factor * x`` over ``n`` floats, its tiling
    (``n``, ``factor``) through a placeholder."""
    return HostArgs().ptr(x).ptr(y).placeholder(struct.pack("<If", n, factor))


def axpy_args(x: int, y: int, a: float, n: int) -> HostArgs:
    """The built-in ``axpy`` kernel's args: ``y += a * x`` over ``n`` floats."""
    return HostArgs().ptr(x).ptr(y).f32(a).u32(n)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException], list[Any]]:
    """Run ``fn`` in a new daemon thread: (the thread, its errors, its results)."""
    errors: list[BaseException] = []
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="contract-helper", daemon=True)
    thread.start()
    return thread, errors, results


def in_forked_child(child: Callable[[], list[str]]) -> list[str]:
    """Fork; the child runs ``child()`` and sends back the lines it returns (exit status 0, or
    1 if it raised). Returns those lines once the child has exited with status 0."""
    import os
    import warnings

    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            os.write(write_end, "\n".join(child()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, "the child failed"
    return b"".join(chunks).decode().split("\n")


def refuse_big_staging(dev: aa.Device, at_least: int) -> None:
    """The pinned staging buffer of every copy of ``at_least`` bytes or more is refused
    (``MemoryAllocationError``, on the submitter's staging thread)."""
    from aio_ascend._errors import MemoryAllocationError

    submitter = dev._scheduler._submitter
    acquire = submitter._stage

    def refuse(nbytes: int) -> Any:
        if nbytes >= at_least:
            raise MemoryAllocationError("no pinned memory", code=207001)
        return acquire(nbytes)

    submitter._stage = refuse
