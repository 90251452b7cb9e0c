"""Harness discipline shared by every test.

- Warnings are errors (pyproject), every test has a timeout (pytest-timeout).
- After each test no thread of the library is alive (``aio_ascend-*``).
- Async tests that must run on every loop use ``pytest.mark.anyio`` and the ``anyio_backend``
  fixture below (asyncio, asyncio+uvloop, trio); asyncio-specific tests use pytest-asyncio.
- The backend x loop matrix: a test that takes ``open_dev`` runs once per device backend of
  ``helpers.DEVICE_BACKENDS`` (sim, acl over its C double as CANN 9.1) and per loop; one marked
  ``personas`` also runs on the acl backend over the double's other usable personas
  (``helpers.PERSONA_BACKENDS``: CANN 8.5, and 8.3 with its args-handle launch path);
  ``sim_only`` tests are skipped on the others with the marker's reason.
- An asyncio exception-handler call or a "Task was destroyed but it is pending" log fails the
  test.

Helpers live in tests/helpers.py and tests/backends.py; nothing is imported from here.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import DEVICE_BACKENDS, PERSONA_BACKENDS, open_backend

try:
    import uvloop  # noqa: F401

    _HAVE_UVLOOP = True
except ImportError:  # pragma: no cover - uvloop is in the test extra
    _HAVE_UVLOOP = False

_BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(not _HAVE_UVLOOP, reason="uvloop not installed"),
    ),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    backend: tuple[str, dict[str, object]] = request.param
    return backend


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The device backends of a test that takes ``device_backend`` (through ``open_dev``)."""
    if "device_backend" in metafunc.fixturenames:
        backends = list(DEVICE_BACKENDS)
        if metafunc.definition.get_closest_marker("personas") is not None:
            backends += PERSONA_BACKENDS
        metafunc.parametrize("device_backend", backends, indirect=True)


@pytest.fixture
def device_backend(request: pytest.FixtureRequest) -> str:
    """The device backend of this test run (see ``open_dev``)."""
    backend: str = request.param
    if backend != "sim":
        for marker in request.node.iter_markers("sim_only"):
            pytest.skip(f"needs the sim's test controls: {marker.args[0] if marker.args else ''}")
    return backend


@pytest.fixture
def open_dev(device_backend: str, anyio_backend: object) -> Callable[..., Any]:
    """``open_dev(device_id=0, **kwargs)``: ``open_device`` on this test's backend and loop."""
    return functools.partial(open_backend, device_backend)


def library_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]


@pytest.fixture(autouse=True)
def _no_library_threads_left() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 2.0
    while library_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    leaked = library_threads()
    assert not leaked, f"library threads still alive after the test: {leaked}"


class _LoopErrorCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


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
