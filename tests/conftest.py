"""Harness discipline shared by every test.

- Warnings are errors (pyproject), every test has a timeout (pytest-timeout).
- After each test no thread of the library is alive (``aio_ascend-*``).
- Async tests that must run on every loop use ``pytest.mark.anyio`` and the ``anyio_backend``
  fixture below (asyncio, asyncio+uvloop, trio); asyncio-specific tests use pytest-asyncio.
- An asyncio exception-handler call or a "Task was destroyed but it is pending" log fails the
  test.

Helpers live in tests/helpers.py and tests/backends.py; nothing is imported from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

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
