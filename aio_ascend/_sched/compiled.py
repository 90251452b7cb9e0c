"""The optional compiled build of the hot path (mypyc), and what it needs from the code.

``AIO_ASCEND_COMPILE=1 pip install .`` compiles the modules of :data:`COMPILED_MODULES` with
mypyc (``setup.py``); a default install runs the same modules as plain Python. Both run the
same tests. A compiled class is native: no weak references to it, no Python subclass, no
attribute added or patched from outside. A class that needs any of that is marked
:func:`interpreted`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

__all__ = ["COMPILED_MODULES", "compiled", "interpreted", "mypyc_attr"]

_C = TypeVar("_C", bound=type)

if TYPE_CHECKING:  # what mypyc reads: the real decorator
    from mypy_extensions import mypyc_attr
else:

    def mypyc_attr(*attrs: str, **options: object) -> Callable[[_C], _C]:
        """``mypy_extensions.mypyc_attr`` at run time: a no-op (mypyc acts on it when it
        compiles; this module itself is never compiled), so the package does not depend on
        mypy_extensions."""
        return lambda cls: cls


#: the modules ``setup.py`` compiles when asked to (the scheduler's hot path)
COMPILED_MODULES: tuple[str, ...] = (
    "aio_ascend._host.pool",
    "aio_ascend._sched.admission",
    "aio_ascend._sched.batching",
    "aio_ascend._sched.delivery",
    "aio_ascend._sched.graphs",
    "aio_ascend._sched.lane",
    "aio_ascend._sched.poller",
    "aio_ascend._sched.scheduler",
    "aio_ascend._sched.submitter",
    "aio_ascend._sched.work",
)


def interpreted(cls: _C) -> _C:
    """Keep ``cls`` a regular Python class in the compiled build (mypyc makes a class with
    a decorator it does not know non-native). A no-op otherwise."""
    return cls


def compiled() -> bool:
    """Whether this install runs the scheduler's hot path compiled with mypyc (installed with
    ``AIO_ASCEND_COMPILE=1``) rather than as pure Python; public as ``aio_ascend.is_compiled``.
    True only when every module of :data:`COMPILED_MODULES` is compiled."""
    return all(
        not (importlib.import_module(name).__file__ or "").endswith(".py")
        for name in COMPILED_MODULES
    )
