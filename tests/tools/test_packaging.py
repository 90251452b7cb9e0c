"""Packaging: one source for the version, the licence, the changelog, the classifiers."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import aio_ascend
from aio_ascend import _version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_the_version_has_one_source() -> None:
    assert "version" not in PROJECT
    assert "version" in PROJECT["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "aio_ascend._version.__version__"}
    assert aio_ascend.__version__ == _version.__version__
    assert importlib.metadata.version("aio_ascend") == aio_ascend.__version__
    literal = re.escape(aio_ascend.__version__)
    for path in (ROOT / "aio_ascend").rglob("*.py"):
        if path.name != "_version.py":
            assert not re.search(rf"['\"]{literal}['\"]", path.read_text()), path


def test_licence() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"
    assert "LICENSE" in PROJECT["license-files"]


def test_changelog_names_this_version_and_the_first() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == f"Unreleased ({aio_ascend.__version__})"
    assert "0.1.0" in headings


def test_classifiers() -> None:
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Operating System ::") for c in classifiers)
    minimum = tuple(int(x) for x in PROJECT["requires-python"].removeprefix(">=").split("."))
    versions = [
        tuple(int(x) for x in c.rsplit(" ", 1)[1].split("."))
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions and min(versions) == minimum
    assert (ROOT / "aio_ascend" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["aio_ascend"]


def test_docs_extra() -> None:
    docs = " ".join(PROJECT["optional-dependencies"]["docs"])
    for package in ("mkdocs", "mkdocs-material", "mkdocstrings[python]"):
        assert package in docs
    # mkdocstrings formats separate signatures with black or ruff, else leaves them one line
    assert re.search(r"\b(black|ruff)\b", docs)
