"""Finding and loading ``libascendcl.so``: discovery, the bound functions, ``aclInit`` once.

The library is found through ``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME``
(``<dir>/lib64/libascendcl.so``) and then the loader path; an explicit ``library_path=`` is used
alone. ``aclInit`` runs once per process (``aclFinalize`` at interpreter exit if we initialised),
and a forked child refuses to use a runtime its parent initialised.

Every ACL call goes through one checker (the ctypes ``errcheck`` of each bound function): a
non-zero ``aclError`` becomes :func:`~aio_ascend._errors.error_for_code` with the text of
``aclGetRecentErrMsg`` (read on the failing thread, right after the failure).

An optional function (``ffi.OPTIONAL_PROTOTYPES``) the library lacks gets a stand-in in the
function table that raises ``BackendUnavailableError`` naming the symbol and the library, so only
the calls that need it fail.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import threading
from ctypes import byref, c_uint32
from typing import Any

from ..._errors import AscendError, BackendUnavailableError, RuntimeAPIError, error_for_code
from ..abi import ACL_ERROR_REPEAT_INITIALIZE
from . import ffi as ffi

__all__ = [
    "HOME_ENV_VARS",
    "LIBRARY_NAME",
    "AclLibrary",
    "fork_error",
    "library_candidates",
    "load_library",
    "probe",
]

#: file name of the ACL runtime library
LIBRARY_NAME = "libascendcl.so"
#: environment variables naming a CANN install (``<dir>/lib64/libascendcl.so``), in order
HOME_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")


def library_candidates(library_path: str | os.PathLike[str] | None = None) -> list[str]:
    """Where :func:`open_acl_runtime` looks for ``libascendcl.so``, in order.

    An explicit ``library_path`` is the only candidate. Otherwise: ``$ASCEND_HOME_PATH`` and
    ``$ASCEND_TOOLKIT_HOME`` (``<dir>/lib64/libascendcl.so``), then the dynamic loader
    (``ctypes.util.find_library("ascendcl")`` and the bare ``libascendcl.so``).
    """
    if library_path is not None:
        return [os.fspath(library_path)]
    candidates: list[str] = []
    for var in HOME_ENV_VARS:
        home = os.environ.get(var, "").strip()
        if home:
            candidates.append(os.path.join(home, "lib64", LIBRARY_NAME))
    found = ctypes.util.find_library("ascendcl")
    if found:
        candidates.append(found)
    candidates.append(LIBRARY_NAME)
    unique: list[str] = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def _missing_function(name: str, path: str) -> Any:
    """The stand-in for an optional function ``path`` does not export: raises when called."""
    message = (
        f"{path} does not export {name} (a CANN release older than the function?); the acl "
        "backend needs it for this call. Install a newer CANN to use it."
    )

    def missing(*args: object) -> Any:
        raise BackendUnavailableError(message, func=name)

    missing.__name__ = name
    return missing


class AclLibrary:
    """One loaded ``libascendcl.so``: its bound functions and its once-per-process init.

    ``functions`` maps every name of ``ffi.PROTOTYPES`` and ``ffi.OPTIONAL_PROTOTYPES`` to a
    callable; ``missing`` names the optional functions the library lacks (their entries raise
    ``BackendUnavailableError``).
    """

    def __init__(self, path: str, cdll: ctypes.CDLL, functions: dict[str, Any]) -> None:
        self.path = path
        self.cdll = cdll
        self.functions = functions
        self.missing = frozenset(name for name in ffi.OPTIONAL_PROTOTYPES if name not in functions)
        self.init_pid: int | None = None
        self.initialised_by_us = False
        self.lock = threading.Lock()
        self._recent = functions["aclGetRecentErrMsg"]
        self._last = threading.local()
        checker = self._errcheck
        for name, function in functions.items():
            if ffi.prototype(name)[0] is ctypes.c_int:
                function.errcheck = checker
        for name in sorted(self.missing):
            functions[name] = _missing_function(name, path)

    def _fetch_message(self) -> str:
        """``aclGetRecentErrMsg`` of the calling thread (reading clears it in ACL)."""
        raw = self._recent()
        if not raw:
            return ""
        text: str = raw.decode("utf-8", "replace").strip()
        return text

    def recent_message(self) -> str:
        """The latest error text of the calling thread ('' if none).

        ACL clears its text when it is read, and the checker reads it for every failure, so the
        text is kept per thread until the next failure replaces it.
        """
        fresh = self._fetch_message()
        if fresh:
            self._last.text = fresh
            return fresh
        text: str = getattr(self._last, "text", "")
        return text

    def _errcheck(self, result: int, function: Any, arguments: tuple[Any, ...]) -> int:
        """THE checker: a non-zero ``aclError`` becomes the typed error with the runtime text."""
        if result:
            message = self._fetch_message()
            self._last.text = message
            raise error_for_code(result, function.__name__, message)
        return result

    def ensure_initialised(self) -> None:
        """``aclInit(NULL)`` once per process; refuse a child forked after it."""
        pid = os.getpid()
        with self.lock:
            if self.init_pid is not None:
                if self.init_pid != pid:
                    raise fork_error(self.init_pid)
                return
            try:
                self.functions["aclInit"](None)
            except RuntimeAPIError as exc:
                if exc.code != ACL_ERROR_REPEAT_INITIALIZE:
                    raise BackendUnavailableError(
                        f"aclInit failed: {exc}", code=exc.code, func="aclInit"
                    ) from exc
                # someone else in this process initialised ACL: theirs to finalise
            else:
                self.initialised_by_us = True
                atexit.register(self._finalize_at_exit)
            self.init_pid = pid

    def _finalize_at_exit(self) -> None:
        if self.initialised_by_us and self.init_pid == os.getpid():
            self.initialised_by_us = False
            try:
                self.functions["aclFinalize"]()
            except AscendError:
                pass

    def device_count(self) -> int:
        count = c_uint32()
        self.functions["aclrtGetDeviceCount"](byref(count))
        return count.value


_LIBRARIES: dict[str, AclLibrary] = {}
_LIBRARIES_LOCK = threading.Lock()


def fork_error(init_pid: int) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"the acl backend was initialised in process {init_pid}; this process "
        f"({os.getpid()}) is a fork of it and cannot use ACL (the runtime does not survive "
        "fork). Open the device in the child only, or use the 'spawn' start method."
    )


def load_library(library_path: str | os.PathLike[str] | None) -> AclLibrary:
    tried: list[str] = []
    for candidate in library_candidates(library_path):
        is_path = os.sep in candidate
        if is_path and not os.path.exists(candidate):
            tried.append(f"{candidate}: no such file")
            continue
        key = os.path.realpath(candidate) if is_path else candidate
        with _LIBRARIES_LOCK:
            cached = _LIBRARIES.get(key)
            if cached is not None:
                return cached
            try:
                cdll = ctypes.CDLL(candidate)
            except OSError as exc:
                tried.append(f"{candidate}: {exc}")
                continue
            try:
                functions = ffi.bind(cdll)
            except AttributeError as exc:
                tried.append(
                    f"{candidate}: loaded, but a required symbol is missing ({exc}); "
                    "aclrtLaunchKernelWithHostArgs needs CANN 8.5 or newer"
                )
                continue
            library = _LIBRARIES[key] = AclLibrary(candidate, cdll, functions)
            return library
    raise BackendUnavailableError(
        f"cannot load {LIBRARY_NAME}; tried:\n  "
        + "\n  ".join(tried)
        + "\nInstall CANN and source its set_env.sh (sets ASCEND_HOME_PATH), or pass "
        "library_path=."
    )


def probe() -> tuple[bool, str]:
    """Whether the ``acl`` backend can run here, and why (never raises)."""
    try:
        library = load_library(None)
        library.ensure_initialised()
        count = library.device_count()
    except AscendError as exc:
        return False, str(exc)
    except Exception as exc:  # a probe must not raise
        return False, f"{type(exc).__name__}: {exc}"
    if count <= 0:
        return False, f"{library.path} loaded, but no Ascend device is visible"
    return True, f"{library.path}, {count} device(s)"


def _reset_locks_after_fork() -> None:
    """In a forked child: locks held by other threads of the parent would never be released."""
    global _LIBRARIES_LOCK
    _LIBRARIES_LOCK = threading.Lock()
    for library in list(_LIBRARIES.values()):
        library.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)
