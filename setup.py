"""The package's C parts, both optional.

- The acl backend's native batch submit (``aio_ascend/_runtime/acl/_native.c``): built when a C
  compiler and the Python headers are present; a failed build is not an error (the backend
  then launches through ctypes), and ``AIO_ASCEND_NATIVE=0`` skips it.
- The compiled hot path: ``AIO_ASCEND_COMPILE=1 pip install .`` compiles the modules listed in
  ``aio_ascend/_sched/compiled.py`` with mypyc (a C compiler and the Python headers are
  needed); without the variable they stay pure Python.

Everything else is in pyproject.toml.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from setuptools import Extension, setup


def compiled_module_paths() -> list[str]:
    """The source files of ``COMPILED_MODULES`` (read without importing the package)."""
    source = Path(__file__).with_name("aio_ascend") / "_sched" / "compiled.py"
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        target = getattr(node, "target", None)
        if (
            isinstance(node, ast.AnnAssign)
            and node.value
            and getattr(target, "id", "") == ("COMPILED_MODULES")
        ):
            names = ast.literal_eval(node.value)
            return [name.replace(".", "/") + ".py" for name in names]
    raise RuntimeError(f"no COMPILED_MODULES in {source}")


def native_extensions() -> list[Extension]:
    """The acl backend's batch submit, unless ``AIO_ASCEND_NATIVE=0`` (optional: a machine
    without a compiler installs the package without it)."""
    if os.environ.get("AIO_ASCEND_NATIVE", "1").strip() == "0":
        return []
    source = "aio_ascend/_runtime/acl/_native.c"
    return [Extension("aio_ascend._runtime.acl._native", [source], optional=True)]


ext_modules = []
if os.environ.get("AIO_ASCEND_COMPILE", "0") not in ("", "0"):
    try:
        from mypyc.build import mypycify
    except ImportError:
        # Asking for the build requirements (egg_info) comes before mypy is installed; a build
        # without mypyc must not quietly produce the pure-Python package it was not asked for.
        if any(command.endswith(("wheel", "build_ext", "install")) for command in sys.argv):
            raise SystemExit(
                "AIO_ASCEND_COMPILE=1 needs mypy (mypyc) to build: pip install mypy"
            ) from None
    else:
        # one shared library inside the package: aio_ascend/_sched__mypyc.*.so
        ext_modules = mypycify(
            compiled_module_paths(), opt_level="3", group_name="aio_ascend._sched"
        )

setup(ext_modules=[*ext_modules, *native_extensions()])
