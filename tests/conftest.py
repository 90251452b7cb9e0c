"""Harness discipline shared by every test.

- Warnings are errors (pyproject), every test has a timeout (pytest-timeout).
- After each test no thread of the library is alive (``aio_ascend-*``): the thread check of
  the project's own pytest plugin, ``aio_ascend.testing``, turned on for every test by
  ``aio_ascend_thread_check = true`` in pyproject.
- Async tests that must run on every loop use ``pytest.mark.anyio`` and the ``anyio_backend``
  fixture below (asyncio, asyncio+uvloop, trio: the plugin's ``loop_params()``, the loops
  its ``aio_ascend_loops`` marker offers users); asyncio-specific tests use pytest-asyncio.
- The backend x loop matrix, built here and nowhere else: a test that takes ``device_backend``
  (directly, or through ``open_dev``) runs once per backend of its module's ``BACKENDS`` (names
  of ``backends.RUNTIME_FACTORIES``; ``helpers.DEVICE_BACKENDS`` by default: sim, acl over its C
  double as CANN 9.1) and, if it is async, per loop; one marked ``personas`` also runs on the
  acl backend over the double's other usable personas (``helpers.PERSONA_BACKENDS``: CANN 8.5,
  8.3 with its args-handle launch path, 8.0 with its device-args launch path). A module that
  sets ``REALRT_TOO = True`` also runs on ``realrt`` (the real CANN runtime over our fake
  driver, marked ``realrt``: deselected by default), with the divergences of
  ``backends.REALRT_DIVERGENCES`` as strict xfails. A test marked ``backends(*names)`` runs on
  exactly those.
- Cases a backend cannot run are deselected at collection, never skipped at run time: a
  ``sim_only`` test on a backend without the sim's test controls (``backends.SIM_CONTROLS``), a
  ``needs(capability)`` test on a backend that lacks it (``backends.LACKING``), a realrt case
  that would crash the process (``backends.REALRT_CRASHES``). What only the
  machine decides (a real GPU) still skips when the backend is opened.
- An asyncio exception-handler call or a "Task was destroyed but it is pending" log fails the
  test.

Helpers live in tests/helpers.py and tests/backends.py; nothing is imported from here.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from backends import (
    REAL_DEVICE,
    RUNTIME_FACTORIES,
    backend_params,
    deselection_reason,
    gpu_skip_reason,
    mark_realrt_divergence,
)
from helpers import DEVICE_BACKENDS, PERSONA_BACKENDS, open_backend

from aio_ascend.testing import loop_params

pytest_plugins = ["pytester"]  # tests/plugin: the plugin tested in pytest runs of its own


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(capability): deselected on the backends that lack it (backends.LACKING)",
    )
    config.addinivalue_line(
        "markers",
        "backends(*names): the test runs on exactly these backends (instead of its module's)",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    """One line on the real-runtime fixture when its tests are selected (``-m realrt``)."""
    if "realrt" not in (config.getoption("-m") or "") or "not realrt" in config.getoption("-m"):
        return None
    from realrt.fixture import NOT_BUILT, find_library_dir

    found = find_library_dir()
    return f"realrt: {found}" if found is not None else f"realrt: {NOT_BUILT}; its tests skip"


@pytest.fixture(params=loop_params())
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    backend: tuple[str, dict[str, object]] = request.param
    return backend


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The backends of a test that takes ``device_backend`` (directly or through ``open_dev``):
    its own ``backends`` marker's, exactly; else its module's ``BACKENDS``, with the personas
    for a ``personas`` test and realrt for ``REALRT_TOO``."""
    if "device_backend" not in metafunc.fixturenames:
        return
    chosen = metafunc.definition.get_closest_marker("backends")
    if chosen is not None:
        backends = list(chosen.args)
    else:
        backends = list(getattr(metafunc.module, "BACKENDS", DEVICE_BACKENDS))
        if metafunc.definition.get_closest_marker("personas") is not None:
            backends += [name for name in PERSONA_BACKENDS if name not in backends]
        if getattr(metafunc.module, "REALRT_TOO", False) and "realrt" not in backends:
            backends.append("realrt")
    unknown = set(backends) - set(RUNTIME_FACTORIES)
    assert not unknown, f"{metafunc.definition.nodeid}: unknown backends {sorted(unknown)}"
    metafunc.parametrize("device_backend", backend_params(backends), indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the backend cases a backend cannot run (``backends.deselection_reason``)."""
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("device_backend") if callspec is not None else None
        if backend is not None and deselection_reason(item, backend) is not None:
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture
def device_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this test run (a name of ``backends.RUNTIME_FACTORIES``)."""
    backend: str = request.param
    if backend in REAL_DEVICE and (reason := gpu_skip_reason()):
        pytest.skip(reason)
    mark_realrt_divergence(request, backend)
    return backend


@pytest.fixture
def open_dev(device_backend: str, anyio_backend: object) -> Callable[..., Any]:
    """``open_dev(device_id=0, **kwargs)``: ``open_device`` on this test's backend and loop."""
    return functools.partial(open_backend, device_backend)


class _LoopErrorCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def _end_leaked_work() -> Iterator[None]:
    # A forced close on acl under a hung kernel leaks on purpose (the device never settled),
    # and the double keeps that kernel running, process-wide: end it after the test, as a
    # device reset would, or the next test would find its stream and context still there.
    settle = sys.modules.get("aio_ascend._runtime.acl.settle")
    before = len(settle.LEAKED) if settle is not None else 0
    yield
    settle = sys.modules.get("aio_ascend._runtime.acl.settle")
    if settle is not None and len(settle.LEAKED) > before:
        from doubles.acl_double import end_leaked_work

        end_leaked_work({path for path, _, _ in settle.LEAKED[before:]})


def _streams_freed_under_callers() -> list[str]:
    from aio_ascend._runtime.sim.executor import FREED_UNDER_CALLERS

    freed = list(FREED_UNDER_CALLERS)
    double = sys.modules.get("doubles.acl_double")
    if double is not None:
        freed += ["acl double"] * double.freed_under_callers()
    return freed


@pytest.fixture(autouse=True)
def _no_stream_freed_under_a_caller() -> Iterator[None]:
    # The real runtime frees a stream destroyed by force under a thread inside a blocking call
    # on it, and that thread crashes the process; the doubles fail the call and count it.
    before = len(_streams_freed_under_callers())
    yield
    freed = _streams_freed_under_callers()[before:]
    assert not freed, f"a stream was destroyed under a thread inside a call on it: {freed}"


def _device_memory_misuse() -> tuple[int, int]:
    fixture = sys.modules.get("realrt.fixture")
    hals = fixture.loaded_fakehals() if fixture is not None else []
    counts = [hal.memory_misuse() for hal in hals]
    return (sum(c[0] for c in counts), sum(c[1] for c in counts))


@pytest.fixture(autouse=True)
def _no_device_memory_used_after_free() -> Iterator[None]:
    # Over the real runtime, the fake driver counts frees of memory a kernel or a copy is still
    # writing and device writes to freed memory: on a device either corrupts memory silently.
    before = _device_memory_misuse()
    yield
    after = _device_memory_misuse()
    assert after == before, (
        "the fake driver saw device memory misused during this test: "
        f"{after[0] - before[0]} free(s) while the device wrote it, "
        f"{after[1] - before[1]} device write(s) to freed memory"
    )


@pytest.fixture(autouse=True)
def _no_asyncio_errors() -> Iterator[None]:
    # asyncio reports exception-handler calls, never-retrieved exceptions and destroyed
    # pending tasks through the "asyncio" logger at ERROR level.
    catcher = _LoopErrorCatcher()
    logger = logging.getLogger("asyncio")
    logger.addHandler(catcher)
    try:
        yield
    finally:
        logger.removeHandler(catcher)
    messages = [record.getMessage() for record in catcher.records]
    assert not messages, f"asyncio reported errors: {messages}"
