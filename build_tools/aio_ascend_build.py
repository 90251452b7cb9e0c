"""The build backend: setuptools' own, plus mypy among the build requirements when
``AIO_ASCEND_COMPILE=1`` asks for the compiled hot path (see ``setup.py``).

Without the variable nothing changes: the wheel is pure Python and needs no compiler.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the PEP 517 hooks, unchanged

#: what compiling needs: mypyc (it ships with mypy), and the core dependencies, whose types
#: mypyc reads (the versions pyproject.toml asks for)
_COMPILER = ["mypy>=1.16", "numpy>=1.26", "anyio>=4.4"]


def compile_requested() -> bool:
    """Whether this build compiles the hot path (``AIO_ASCEND_COMPILE`` set, not ``0``)."""
    return os.environ.get("AIO_ASCEND_COMPILE", "0") not in ("", "0")


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = _COMPILER if compile_requested() else []
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *extra]


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = _COMPILER if compile_requested() else []
    return [*_setuptools.get_requires_for_build_editable(config_settings), *extra]
