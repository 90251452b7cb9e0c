"""Finding and loading ``libascendcl.so``: discovery, the bound functions, ``aclInit`` once.

The library is found through ``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME``
(``<dir>/lib64/libascendcl.so``) and then the loader path; an explicit ``library_path=`` is used
alone. ``aclInit`` runs once per process (``aclFinalize`` at interpreter exit if we initialised),
and a forked child refuses to use a runtime its parent initialised.

Binding is per symbol and lazy: the functions every supported release has (``ffi.PROTOTYPES``)
must be there, each other one is looked up when first used, and one the library lacks gets a
stand-in that raises ``BackendUnavailableError`` naming the symbol and the library, so only the
calls that need it fail. The launch path is chosen once per library from the symbols present
(:mod:`.paths`); a library with none is refused, loudly, naming its release (read with
``aclsysGetCANNVersion`` where it exists), the missing symbols and the paths tried.

Every ACL call goes through one checker (the ctypes ``errcheck`` of each bound function): a
non-zero ``aclError`` becomes :func:`~aio_ascend._errors.error_for_code` with the text of
``aclGetRecentErrMsg`` (read on the failing thread, right after the failure).
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
from ..abi import ACL_ERROR_REPEAT_INITIALIZE, ACL_PKG_NAME_CANN
from . import ffi as ffi
from .paths import LaunchPath, choose_path, unusable_error

__all__ = [
    "HOME_ENV_VARS",
    "LIBRARY_NAME",
    "AclLibrary",
    "find_install",
    "fork_error",
    "library_candidates",
    "load_library",
    "probe",
    "usable_library",
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
        path = os.fspath(library_path)
        if not path:  # (dlopen of "" is the process itself)
            raise ValueError("library_path is empty: give the path of libascendcl.so")
        return [path]
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


def find_install() -> str | None:
    """Where a CANN install is *found* (one is never silently replaced by the simulator):
    ``libascendcl.so`` under ``$ASCEND_HOME_PATH/lib64`` or ``$ASCEND_TOOLKIT_HOME/lib64``, or on
    the dynamic loader's path; ``None`` when there is none. Whether it can be *used* is
    :func:`probe`'s question."""
    for candidate in library_candidates():
        if os.sep in candidate:
            if os.path.exists(candidate):
                return candidate
            continue
        if candidate != LIBRARY_NAME:
            return candidate  # ctypes.util.find_library found it (ldconfig, LD_LIBRARY_PATH)
        try:
            ctypes.CDLL(candidate)
        except OSError:
            continue
        return candidate
    return None


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


class _Functions(dict[str, Any]):
    """name -> callable, each symbol looked up (and given its prototype and the checker) when
    first used; a symbol the library lacks maps to a stand-in that raises."""

    def __init__(self, library: AclLibrary) -> None:
        super().__init__()
        self._library = library

    def __missing__(self, name: str) -> Any:
        function = self._library.bind(name)
        self[name] = function
        return function


class AclLibrary:
    """One loaded ``libascendcl.so``: its functions, release, launch path and once-per-process
    init.

    ``functions`` maps every name of ``ffi.PROTOTYPES`` and ``ffi.OPTIONAL_PROTOTYPES`` to a
    callable (looked up lazily); :meth:`has` says whether the library exports a symbol.
    ``launch_path`` is the path the runtime uses, ``None`` when the library has none
    (``path_error`` says why).

    :raises BackendUnavailableError: a function every supported release has is missing
    """

    def __init__(self, path: str, cdll: ctypes.CDLL) -> None:
        self.path = path
        self.cdll = cdll
        self._present: dict[str, bool] = {}
        self.init_pid: int | None = None
        self.initialised_by_us = False
        #: aclFinalize has run (at exit): a runtime closed later touches nothing
        self.finalized = False
        self.lock = threading.Lock()
        self._last = threading.local()
        lacking = [name for name in ffi.PROTOTYPES if not self.has(name)]
        if lacking:
            raise BackendUnavailableError(
                f"{path} lacks functions every CANN release since 8.0 has: {', '.join(lacking)}"
            )
        self.functions: dict[str, Any] = _Functions(self)
        self._recent = self.functions["aclGetRecentErrMsg"]
        self.cann_version = self._read_cann_version()
        self.launch_path: LaunchPath | None
        self.launch_path, missing = choose_path(self.has)
        self.path_error = (
            None if self.launch_path is not None else unusable_error(path, self.release, missing)
        )

    @property
    def missing(self) -> frozenset[str]:
        """The optional functions the library lacks."""
        return frozenset(name for name in ffi.OPTIONAL_PROTOTYPES if not self.has(name))

    @property
    def version_tuple(self) -> tuple[int, int] | None:
        """``(major, minor)`` of :attr:`cann_version` (``None``: unknown or unparsable)."""
        parts = (self.cann_version or "").split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None

    @property
    def release(self) -> str:
        """The CANN release, as messages name it."""
        if self.cann_version:
            return f"CANN {self.cann_version}"
        return "CANN release unknown: no aclsysGetCANNVersion, so older than 8.2"

    def has(self, name: str) -> bool:
        """Whether the library exports ``name`` (``dlsym``)."""
        present = self._present.get(name)
        if present is None:
            try:
                self.cdll[name]
            except AttributeError:
                present = False
            else:
                present = True
            self._present[name] = present
        return present

    def bind(self, name: str) -> Any:
        """``name`` with its prototype and the checker, or the stand-in if the library lacks it."""
        function = ffi.bind_one(self.cdll, name) if self.has(name) else None
        if function is None:
            return _missing_function(name, self.path)
        if ffi.prototype(name)[0] is ctypes.c_int and name not in ffi.VALUE_RETURNING:
            function.errcheck = self._errcheck
        return function

    def _read_cann_version(self) -> str | None:
        """``aclsysGetCANNVersion(ACL_PKG_NAME_CANN)``'s version string (8.2 on), else None."""
        if not self.has("aclsysGetCANNVersion"):
            return None
        version = ffi.AclCANNPackageVersion()
        try:
            self.functions["aclsysGetCANNVersion"](ACL_PKG_NAME_CANN, byref(version))
        except AscendError:
            return None
        text: str = version.version.decode("utf-8", "replace").strip()
        return text or None

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
            raise self.refusal(result, function.__name__)
        return result

    def refusal(self, code: int, func: str) -> AscendError:
        """The typed error of ``func`` returning ``code`` on this thread just now, with the
        runtime's text (the checker's, and the native batch submit's: ``batch.py``)."""
        message = self._fetch_message()
        self._last.text = message
        return error_for_code(code, func, message)

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
            self.finalized = True  # (a close still to come, after a stuck call: nothing to do)
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
    """The first candidate that loads as a library every supported release's functions are in
    (cached per file). A library without a launch path is returned: :func:`open_acl_runtime`
    and :func:`probe` refuse it with its ``path_error``."""
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
                library = AclLibrary(candidate, cdll)
            except BackendUnavailableError as exc:
                tried.append(f"{candidate}: loaded, but {exc.message}")
                continue
            _LIBRARIES[key] = library
            return library
    raise BackendUnavailableError(
        f"cannot load {LIBRARY_NAME}; tried:\n  "
        + "\n  ".join(tried)
        + "\nInstall CANN and source its set_env.sh (sets ASCEND_HOME_PATH), or pass "
        "library_path=."
    )


def usable_library(library_path: str | os.PathLike[str] | None) -> AclLibrary:
    """:func:`load_library`, refused when it has no launch path, then ``aclInit`` once."""
    library = load_library(library_path)
    if library.path_error is not None:
        raise library.path_error
    library.ensure_initialised()
    return library


def device_count(*, library_path: str | os.PathLike[str] | None = None) -> int:
    """``aclrtGetDeviceCount`` of the library ``open_acl_runtime`` would load (``aclInit``
    first, once per process, as opening does)."""
    return usable_library(library_path).device_count()


def probe() -> tuple[bool, str]:
    """Whether the ``acl`` backend can run here, and why (never raises)."""
    try:
        library = usable_library(None)
        count = library.device_count()
    except AscendError as exc:
        return False, str(exc)
    except Exception as exc:  # a probe must not raise
        return False, f"{type(exc).__name__}: {exc}"
    if count <= 0:
        return False, f"{library.path} loaded, but no Ascend device is visible"
    path = library.launch_path.value if library.launch_path else "none"
    return True, f"{library.path}, {library.release}, {count} device(s), launch path {path}"


def _reset_locks_after_fork() -> None:
    """In a forked child: locks held by other threads of the parent would never be released."""
    global _LIBRARIES_LOCK
    _LIBRARIES_LOCK = threading.Lock()
    for library in list(_LIBRARIES.values()):
        library.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_after_fork)
