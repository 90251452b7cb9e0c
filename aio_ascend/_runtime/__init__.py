"""Backend discovery: one name per backend, imported lazily.

``open_runtime(name, device_id)`` returns a :class:`Runtime` bound to one device. ``"auto"``
picks ``acl`` when a CANN install is *found* (``libascendcl.so`` under ``$ASCEND_HOME_PATH/lib64``
or ``$ASCEND_TOOLKIT_HOME/lib64``, or on the loader path) and ``sim`` when none is. A found install
that cannot be used (no launch path aio_ascend implements, missing symbols, no device) raises
``BackendUnavailableError`` saying what was found and why: a CANN install is never silently
simulated. The environment variable ``AIO_ASCEND_BACKEND`` overrides ``"auto"`` (``sim`` then
simulates beside an install).
"""

from __future__ import annotations

import importlib
import inspect
import os
import types
import typing
from typing import Any

from .._errors import BackendUnavailableError
from .abi import check_device_id
from .base import Runtime

__all__ = [
    "device_count",
    "BACKENDS",
    "Runtime",
    "available_backends",
    "check_device_id",
    "check_option_names",
    "check_runtime_options",
    "choose_backend",
    "open_runtime",
]

#: backend name -> "module:factory" (the factory takes ``device_id`` and keyword options)
BACKENDS: dict[str, str] = {
    "sim": "aio_ascend._runtime.sim.runtime:open_sim_runtime",
    "acl": "aio_ascend._runtime.acl.runtime:open_acl_runtime",
    "cuda": "aio_ascend._runtime.cuda.runtime:open_cuda_runtime",
}

#: each backend's check of its options' values, which its factory runs too: ``open_device``
#: runs it in its call, before anything opens
OPTION_CHECKS: dict[str, str] = {
    "sim": "aio_ascend._runtime.sim.executor:check_sim_options",
    "acl": "aio_ascend._runtime.acl.runtime:check_acl_options",
    "cuda": "aio_ascend._runtime.cuda.runtime:check_cuda_options",
}

ENV_BACKEND = "AIO_ASCEND_BACKEND"


def _factory(name: str, table: dict[str, str] = BACKENDS) -> Any:
    try:
        target = table[name]
    except KeyError:
        raise ValueError(
            f"backend={name!r}: expected 'auto' or one of {sorted(BACKENDS)}"
        ) from None
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} cannot be imported: {exc}") from exc
    return getattr(module, attr)


def probe_backend(name: str) -> tuple[bool, str]:
    """Whether backend ``name`` can be used here, and why (or why not)."""
    if name == "sim":
        return True, "embedded simulator (always available)"
    try:
        module_name = BACKENDS[name].partition(":")[0]
        module = importlib.import_module(module_name)
    except KeyError:
        return False, f"unknown backend {name!r}"
    except ImportError as exc:
        return False, f"cannot import: {exc}"
    probe = getattr(module, "probe", None)
    if probe is None:
        return False, "backend module has no probe()"
    result: tuple[bool, str] = probe()
    return result


#: ``device_count("sim")``: one simulated device (every device_id opens an independent one)
SIM_DEVICE_COUNT = 1


def device_count(backend: str = "auto", **options: Any) -> int:
    """How many devices backend ``backend`` (``"auto"`` resolved as ``open_runtime`` does)
    sees, asked of its runtime (``aclrtGetDeviceCount``, ``cuDeviceGetCount``); ``options``
    are the backend's open options (checked by the caller): those that say where the
    runtime is are used (acl: ``library_path``, cuda: ``driver``), the others ignored."""
    name, _ = choose_backend(backend)
    if name == "sim":
        return SIM_DEVICE_COUNT
    counter = importlib.import_module(BACKENDS[name].partition(":")[0]).device_count
    wanted = inspect.signature(counter).parameters
    count: int = counter(**{key: value for key, value in options.items() if key in wanted})
    return count


def available_backends() -> list[str]:
    """Names of the backends that can be opened on this machine (``sim`` always)."""
    return [name for name in BACKENDS if probe_backend(name)[0]]


def choose_backend(requested: str = "auto") -> tuple[str, str]:
    """Resolve ``"auto"`` (and the ``AIO_ASCEND_BACKEND`` override) to a backend name + reason."""
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"backend={requested!r}: expected 'auto' or one of {sorted(BACKENDS)}")
        return requested, "requested explicitly"
    override = os.environ.get(ENV_BACKEND, "").strip()
    if override and override != "auto":
        if override not in BACKENDS:
            raise ValueError(f"{ENV_BACKEND}={override!r}: expected one of {sorted(BACKENDS)}")
        return override, f"{ENV_BACKEND}={override}"
    found = _found_install()
    if found is None:
        return "sim", "no CANN install found (libascendcl.so); using the embedded simulator"
    ok, why = probe_backend("acl")
    if ok:
        return "acl", f"libascendcl.so loaded ({why})"
    raise BackendUnavailableError(
        f"a CANN install was found ({found}) but cannot be used: {why}\n"
        f"backend='auto' never simulates beside a CANN install: pass backend='sim' or set "
        f"{ENV_BACKEND}=sim to use the simulator anyway."
    )


def _found_install() -> str | None:
    """Where a CANN install is found (``None``: nowhere); the acl backend's own rule."""
    try:
        from .acl.library import find_install
    except ImportError:  # pragma: no cover - the acl backend needs only ctypes
        return None
    return find_install()


def _accepts(hint: Any, value: object) -> bool | None:
    """Whether ``value`` fits the annotation ``hint`` (``None``: too rich a hint to tell)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        answers = [_accepts(arg, value) for arg in typing.get_args(hint)]
        return True if True in answers else (None if None in answers else False)
    kind = hint if origin is None else origin  # os.PathLike[str] -> os.PathLike
    if not isinstance(kind, type):
        return None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def _hint_text(hint: Any) -> str:
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return text.replace("typing.", "").replace("NoneType", "None")


def _option_names(factory: Any) -> list[str]:
    # a backend factory's keyword options (its first parameter is the device id)
    return [
        name
        for name, param in list(inspect.signature(factory).parameters.items())[1:]
        if param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    ]


def check_runtime_options(backend: str, options: dict[str, Any]) -> None:
    """``options`` for ``backend``'s factory, checked without opening anything: every key is
    one of its keyword options, every value of the type it declares (``TypeError`` naming
    the option and listing the backend's options) and in its range (``OPTION_CHECKS``)."""
    factory = _factory(backend)
    params = _option_names(factory)
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # an annotation that cannot be evaluated here: keys only
        hints = {}
    known = ", ".join(params) or "none"
    for key, value in options.items():
        if key not in params:
            raise TypeError(
                f"runtime_options: the {backend} backend has no option {key!r} (its options: "
                f"{known})"
            )
        hint = hints.get(key)
        if hint is not None and _accepts(hint, value) is False:
            raise TypeError(
                f"runtime_options[{key!r}] of the {backend} backend must be "
                f"{_hint_text(hint)}, got {type(value).__name__}"
            )
    _factory(backend, OPTION_CHECKS)(**options)


def check_option_names(options: dict[str, Any]) -> None:
    """``options`` for a backend not chosen yet (``"auto"``): every key is an option of some
    backend (``TypeError`` listing them); the rest is checked once the backend is chosen."""
    if not options:
        return
    known: set[str] = set()
    for backend in BACKENDS:
        try:
            known.update(_option_names(_factory(backend)))
        except BackendUnavailableError:  # (cannot be imported here: cannot be chosen either)
            continue
    for key in options:
        if key not in known:
            raise TypeError(
                f"runtime_options: no backend has an option {key!r} (their options: "
                f"{', '.join(sorted(known))})"
            )


def open_runtime(backend: str, device_id: int, **options: Any) -> Runtime:
    """Open ``backend`` (a name or ``"auto"``) on ``device_id`` and return its runtime."""
    check_device_id(device_id)
    name, _ = choose_backend(backend)
    runtime: Runtime = _factory(name)(device_id, **options)
    return runtime
