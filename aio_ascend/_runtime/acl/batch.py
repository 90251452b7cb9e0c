"""One native call per run of plain launches (``Runtime.launch_batch`` on the host-args path).

The ``_native`` extension (``_native.c``, built by ``setup.py`` when a C compiler is present)
reads a run of launch requests, then calls ``aclrtLaunchKernelWithHostArgs`` for each with the
GIL released, reading ``aclrtGetThreadLastTaskId`` after each one, and stops at the first
refusal. It calls the functions of the library ctypes loaded, by address, so nothing is linked
against ``libascendcl`` and the same per-thread runtime state (current context, last task id,
last error text) is used as through ctypes.

Why: a ctypes call costs its caller more than the launch itself. The submitter thread's CPU
per launch on the acl test double, 256-launch hops (``python benchmarks/acl_submit.py``, medians
of 3 rounds on a 2-core machine loaded by other jobs): 3.1 us with this call against 13.8 us
with a ctypes call per launch (and the task id read through ctypes after each); the call alone
costs 2.1 us there, most of it the double's own work in C.

Why an extension module that reads the request objects, rather than a plain C function called
through ctypes with a packed struct array: packing a launch's fields in Python
(``struct.pack_into``) costs 0.9 us per launch on the same machine, while the extension reads
them, launches (through a no-op function: ``ffs``) and sets ``position`` for 0.5 us.

Without the extension, or with ``AIO_ASCEND_NATIVE=0`` in the environment when the package is
imported, ``launch_batch`` is ``None`` and the scheduler launches one by one.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Final

from ..._errors import AscendError, DeviceFaultError, RuntimeAPIError
from ..abi import MAX_NUM_BLOCKS, MAX_PLACEHOLDERS, UINT32_MAX, check_placeholder_table
from .values import LAUNCH

__all__ = [
    "ENV_NATIVE",
    "NativeBatch",
    "native_batch",
    "native_disabled",
    "native_module",
    "native_submit",
]

#: ``0`` turns the native batch submit off (the pure-Python path, as without a compiler)
ENV_NATIVE: Final = "AIO_ASCEND_NATIVE"
#: the fast check's bounds, passed to the extension (the per-launch method checks the rest)
_LIMITS: Final = (MAX_NUM_BLOCKS, UINT32_MAX, MAX_PLACEHOLDERS)


def _load() -> ModuleType | None:
    if os.environ.get(ENV_NATIVE, "1").strip() == "0":
        return None
    try:
        return importlib.import_module(f"{__package__}._native")
    except ImportError:  # not built: no compiler at install, or a pure-Python wheel
        return None


_NATIVE: ModuleType | None = _load()


def native_module() -> ModuleType | None:
    """The built extension, or ``None`` (not built, or turned off by ``AIO_ASCEND_NATIVE=0``)."""
    return _NATIVE


def native_submit() -> bool:
    """Whether the acl backend submits runs of launches with one native call (reported by
    ``aio-ascend info`` and the bench; independent of ``aio_ascend.is_compiled()``)."""
    return _NATIVE is not None


@contextmanager
def native_disabled() -> Iterator[None]:
    """Runtimes opened meanwhile launch one by one (the bench's ``acl_poll_ctypes`` step
    measures that path beside the native call)."""
    global _NATIVE
    saved, _NATIVE = _NATIVE, None
    try:
        yield
    finally:
        _NATIVE = saved


class NativeBatch:
    """``launch_batch`` of one :class:`~.runtime.AclRuntime` (see ``base.LaunchBatch``)."""

    __slots__ = ("_args", "_batch", "_error", "_sticky", "_table", "_usable")

    def __init__(
        self,
        native: ModuleType,
        library: Any,
        usable: Callable[[], bool],
        sticky: Callable[[DeviceFaultError], RuntimeAPIError],
    ) -> None:
        launch = ctypes.cast(library.cdll[LAUNCH], ctypes.c_void_p).value
        name = "aclrtGetThreadLastTaskId"
        task_id = (
            ctypes.cast(library.cdll[name], ctypes.c_void_p).value if library.has(name) else None
        )
        self._batch = native.launch_batch
        #: the leading arguments of every call: the functions' addresses
        self._args = (launch, task_id or 0)
        self._error: Callable[[int, str], AscendError] = library.refusal
        self._usable = usable
        self._sticky = sticky
        #: the placeholder table's rules, the per-launch method's own (abi's) definition
        self._table = functools.partial(check_placeholder_table, LAUNCH)

    def __call__(self, launches: list[Any]) -> tuple[int, AscendError | None]:
        if not self._usable():  # closed, or a forked child: the per-launch method refuses
            return 0, None
        submitted: int
        status: int
        submitted, status = self._batch(*self._args, launches, self._table, _LIMITS)
        if status <= 0:
            return submitted, None
        error = self._error(status, LAUNCH)  # the runtime's text, read on this thread now
        if isinstance(error, DeviceFaultError):
            error = self._sticky(error)
        return submitted, error


def native_batch(
    library: Any,
    usable: Callable[[], bool],
    sticky: Callable[[DeviceFaultError], RuntimeAPIError],
) -> NativeBatch | None:
    """The batch call of a runtime on the host-args path; ``None`` without the extension."""
    if _NATIVE is None:
        return None
    return NativeBatch(_NATIVE, library, usable, sticky)
