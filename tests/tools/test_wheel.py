"""Installable as a wheel: ``python -m build`` makes an sdist and a pure-Python wheel (the
compiled hot path only when ``AIO_ASCEND_COMPILE`` asks for it, see setup.py), the wheel holds
``py.typed`` and no tests, and, installed into a fresh virtual environment, it runs the README's
example there.

About 25 s on an idle 2-core machine (build 8 s, venv 6 s, install with numpy and anyio from the
configured index 6 s), so it stays in the default run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import aio_ascend

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.timeout(600)

#: what the .gitignore keeps out of the repository, and the repository itself
_NOT_SOURCE = (
    ".git",
    ".venv",
    ".ci-venv",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    "site",
    "out",
    ".*_cache",
    ".hypothesis",
    "*.so",
)


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=500, check=False
    )
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    # A copy without build leftovers: setuptools reads an old *.egg-info/SOURCES.txt into the
    # sdist, which would hide a file the sdist lacks (and the build writes none here).
    source = tmp_path_factory.mktemp("source") / "aio_ascend"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    # the default build: pure Python, whatever the calling environment asked for
    env = {k: v for k, v in os.environ.items() if k != "AIO_ASCEND_COMPILE"}
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], source, env)
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_build_makes_an_sdist_that_builds_on_its_own(dist: Path) -> None:
    sdist = _one(dist, "aio_ascend-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    # pyproject's in-tree backend (backend-path) must travel, or the wheel cannot be built
    # from the sdist (which is how `python -m build` makes it)
    for required in (
        "pyproject.toml",
        "setup.py",
        "build_tools/aio_ascend_build.py",
        "aio_ascend/_runtime/acl/_native.c",  # the optional extension builds from the sdist
    ):
        assert required in names
    assert "aio_ascend/py.typed" in names


def test_the_wheel_is_typed_holds_no_tests_and_at_most_the_native_submit(dist: Path) -> None:
    wheel = _one(dist, "aio_ascend-*.whl")
    # Pure Python, or (a compiler was present) a platform wheel whose one binary is the acl
    # backend's optional batch submit; never the mypyc build unless asked for.
    pure = wheel.name == f"aio_ascend-{aio_ascend.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    assert "aio_ascend/py.typed" in names
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"aio_ascend", f"aio_ascend-{aio_ascend.__version__}.dist-info"}
    assert not [n for n in names if re.search(r"(^|/)(tests?|conftest\.py)(/|$)", n)]
    binaries = [n for n in names if n.endswith((".so", ".pyd"))]
    if pure:
        assert not binaries
    else:
        assert wheel.name.startswith(f"aio_ascend-{aio_ascend.__version__}-cp"), wheel.name
        assert binaries and all(
            n.startswith("aio_ascend/_runtime/acl/_native.") for n in binaries
        ), binaries
    assert not [n for n in names if n.endswith(".c")]
    assert "aio-ascend = aio_ascend._tools.cli:main" in scripts
    assert "aio_ascend = aio_ascend.testing" in scripts


def test_the_wheel_runs_the_readme_example_in_a_fresh_venv(dist: Path, tmp_path: Path) -> None:
    wheel = _one(dist, "aio_ascend-*.whl")
    venv = tmp_path / "venv"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AIO_ASCEND_COMPILE", "PYTHONPATH", "VIRTUAL_ENV", "AIO_ASCEND_BACKEND")
    }
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path, env)

    code = re.search(r"```python\n(.*?)```", README, re.S)
    assert code is not None
    script = tmp_path / "example.py"
    script.write_text(
        code.group(1)
        + "\nimport aio_ascend\nprint(aio_ascend.__file__, aio_ascend.is_compiled())\n"
    )
    # run outside the checkout, so that only the installed wheel can be imported
    out = _run([str(python), str(script)], tmp_path, env).split()
    assert Path(out[0]).is_relative_to(venv), out
    assert out[1] == "False"
    version = _run([str(venv / "bin" / "aio-ascend"), "--version"], tmp_path, env)
    assert aio_ascend.__version__ in version
