"""Registers the ``model`` marker for the model-based tests (tests/model)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "model: model-based (hypothesis stateful) tests of one device against a reference model",
    )
