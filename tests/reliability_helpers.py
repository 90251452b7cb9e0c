"""Shared pieces of the reliability suite (tests/test_reliability_*.py).

- ``STRESS``: the environment asks for the big runs (``AIO_ASCEND_STRESS=1``); ``stress_only``
  marks a test that only runs then (it is also marked ``pytest.mark.stress``).
- ``report(name, **figures)``: print one line of figures (visible with ``-s``) and keep them in
  ``FIGURES``; with ``AIO_ASCEND_FIGURES=path`` every line is also appended to ``path`` as JSON,
  so one run can be turned into a table (``python tests/reliability_helpers.py path``).
- ``open_tracked`` / ``tracked_device``: open a sim device and register it; the
  ``sim_leak_check`` fixture (autouse in every reliability module) then asserts after the test
  that each registered device was closed and the sim reports zero live device allocations,
  pinned host allocations, events, streams and binaries.
- ``sim_peek``: read device memory of the sim directly (sim-only, for checking results on a
  device that has faulted and can no longer copy).
- ``library_threads``: the library's threads (``aio_ascend-*``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

import aio_ascend as aa

STRESS = bool(os.environ.get("AIO_ASCEND_STRESS"))

#: big versions of a test: run only with AIO_ASCEND_STRESS=1 (and selectable with -m stress)
stress_only = pytest.mark.skipif(not STRESS, reason="set AIO_ASCEND_STRESS=1 for the big runs")

#: per-test time limit for tests whose size grows under AIO_ASCEND_STRESS
stress_timeout = pytest.mark.timeout(900 if STRESS else 60)

#: every figure reported in this process: test name -> {figure: value}
FIGURES: dict[str, dict[str, Any]] = {}

_REGISTRY: list[tuple[aa.Device, tuple[str, ...]]] = []


def scaled(ci: int, stress: int) -> int:
    """The CI-sized value, or the stress-sized one under ``AIO_ASCEND_STRESS``."""
    return stress if STRESS else ci


def report(name: str, **figures: Any) -> dict[str, Any]:
    """Print and record the figures of one test (one line, ``[figures] name: k=v ...``)."""
    rounded = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()}
    FIGURES[name] = rounded
    print(f"\n[figures] {name}: " + ", ".join(f"{k}={v}" for k, v in rounded.items()))
    path = os.environ.get("AIO_ASCEND_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": name, **rounded}) + "\n")
    return rounded


def library_threads() -> list[threading.Thread]:
    """Threads the library (or its sim) started and that are still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]


async def open_tracked(
    *, device_id: int = 0, exempt: tuple[str, ...] = (), **kwargs: Any
) -> aa.Device:
    """``await open_device(device_id, backend="sim", **kwargs)``, registered for the leak check.

    ``exempt``: resource kinds (keys of ``live_resources()``) the check does not count for this
    device -- only where a test documents a known leak that it checks separately.
    """
    dev = await aa.open_device(device_id, backend="sim", **kwargs)
    _REGISTRY.append((dev, exempt))
    return dev


@contextlib.asynccontextmanager
async def tracked_device(
    *, device_id: int = 0, exempt: tuple[str, ...] = (), **kwargs: Any
) -> AsyncIterator[aa.Device]:
    """``async with open_device(device_id, backend="sim", **kwargs)``, registered for the leak
    check."""
    dev = await open_tracked(device_id=device_id, exempt=exempt, **kwargs)
    try:
        yield dev
    finally:
        await dev.aclose()


def live_resources(dev: aa.Device) -> dict[str, int]:
    live: dict[str, int] = dev.runtime.live_resources()  # type: ignore[attr-defined]
    return live


def assert_sim_clean(dev: aa.Device, exempt: tuple[str, ...] = ()) -> None:
    """The device is closed and the sim had nothing left when it closed (but ``exempt``)."""
    assert "closed" in repr(dev), f"device not closed: {dev!r}"
    live = {k: v for k, v in live_resources(dev).items() if k not in exempt}
    assert all(count == 0 for count in live.values()), f"left behind after close: {live}"
    stats = dev.stats()
    assert stats["host_buffers_in_use"] == 0, stats


@pytest.fixture
def sim_leak_check() -> Iterator[None]:
    """After the test: every device opened through this module is closed and clean."""
    del _REGISTRY[:]
    yield
    devices = list(_REGISTRY)
    del _REGISTRY[:]
    problems = []
    for dev, exempt in devices:
        try:
            assert_sim_clean(dev, exempt)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, f"sim resources left after the test: {problems}"


def sim_peek(
    dev: aa.Device, addr: int, count: int, dtype: Any = np.float32
) -> np.ndarray[Any, Any]:
    """A copy of ``count`` items at device address ``addr``, read from the sim's memory directly
    (sim-only; works on a faulted device, before ``aclose``)."""
    memory = dev.runtime._memory  # type: ignore[attr-defined]
    nbytes = count * np.dtype(dtype).itemsize
    return np.array(memory.view(addr, nbytes, "test peek").view(dtype))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` (0.0 if empty)."""
    if not values:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def fault_caused(exc: BaseException | None, fault: BaseException | None) -> bool:
    """Whether ``exc`` is the device's first fault or is caused by it."""
    return exc is not None and fault is not None and (exc is fault or exc.__cause__ is fault)


def render_table(path: str) -> str:
    """A plain-text table of the JSON lines written under ``AIO_ASCEND_FIGURES``."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    out = []
    for row in rows:
        name = row.pop("test")
        out.append(name)
        for key, value in row.items():
            out.append(f"    {key:<40} {value}")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover - a tool for reading a figures file
    print(render_table(sys.argv[1]))
