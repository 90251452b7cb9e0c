"""The optional compiled build (``AIO_ASCEND_COMPILE=1``, mypyc): what it compiles, and the
constraints the compiled classes put on the code. CI builds it and runs the whole suite on it
(``.ci/run``); these tests run on either build."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

import aio_ascend
from aio_ascend._sched.compiled import COMPILED_MODULES, compiled

ROOT = Path(aio_ascend.__file__).parent.parent


def _setup_module(native: bool = False) -> object:
    spec = importlib.util.spec_from_file_location("aio_ascend_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    setup_calls: list[object] = []
    import setuptools

    real = setuptools.setup
    setuptools.setup = lambda **kwargs: setup_calls.append(kwargs)  # type: ignore[assignment]
    try:
        spec.loader.exec_module(module)
    finally:
        setuptools.setup = real
    # no AIO_ASCEND_COMPILE: nothing for mypyc; the acl backend's native batch submit, optional
    # (a machine without a compiler installs without it), unless AIO_ASCEND_NATIVE=0
    (call,) = setup_calls
    extensions = call["ext_modules"]  # type: ignore[index]
    assert [ext.name for ext in extensions] == (
        ["aio_ascend._runtime.acl._native"] if native else []
    )
    assert all(ext.optional for ext in extensions)
    return module


@pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="an installed copy, not a checkout")
def test_setup_compiles_exactly_the_listed_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIO_ASCEND_COMPILE", raising=False)
    monkeypatch.setenv("AIO_ASCEND_NATIVE", "0")
    monkeypatch.setattr(sys, "argv", ["setup.py", "egg_info"])
    setup = _setup_module()
    monkeypatch.delenv("AIO_ASCEND_NATIVE")
    _setup_module(native=True)
    paths = setup.compiled_module_paths()  # type: ignore[attr-defined]
    assert paths == [name.replace(".", "/") + ".py" for name in COMPILED_MODULES]
    assert all((ROOT / path).is_file() for path in paths)


def test_compiled_reports_the_build_that_runs() -> None:
    files = [importlib.import_module(name).__file__ or "" for name in COMPILED_MODULES]
    assert compiled() == all(not name.endswith(".py") for name in files)
    # all or nothing: a half-compiled install is a broken one
    assert len({name.endswith(".py") for name in files}) == 1


def test_public_classes_stay_python_classes() -> None:
    # Users may weak-reference, subclass and introspect them, which native classes forbid:
    # they live in modules that are never compiled.
    for cls in (aio_ascend.Task, aio_ascend.Event, aio_ascend.DeviceBuffer, aio_ascend.Stream):
        assert cls.__module__ + ".py" not in {m + ".py" for m in COMPILED_MODULES}
        assert cls.__doc__ and "mypyc" not in cls.__doc__


@pytest.mark.skipif(not compiled(), reason="the pure-Python build tracks every instance")
def test_what_holds_requests_is_tracked_by_the_collector_when_compiled() -> None:
    # mypyc's acyclic classes are invisible to the cyclic garbage collector, and a cycle
    # through one is never collected. Hops and batches were acyclic: a batch a closed device
    # kept held a download the close failed, whose traceback held the user's pinned array,
    # whose finalizer kept the device (20 of 20 never collected, compiled build only). A
    # launch's spec likewise: a plan's spec and its record hold each other.
    import gc

    from aio_ascend import HostArgs
    from aio_ascend._host.pool import HostBuffer
    from aio_ascend._sched.batching import Hop
    from aio_ascend._sched.lane import Lane
    from aio_ascend._sched.work import Batch, Launch, LaunchSpec

    lane = Lane(1, 10, 100)
    host = HostBuffer(0, 4096, 4096, 64, memoryview(bytearray(64)))
    spec = LaunchSpec(1, 1, None, HostArgs().u64(0).pack(), host)
    launch = Launch(lane, spec)
    for record in (Batch(lane, [launch], 1, 0.0), Hop([launch], 0.0), spec):
        assert gc.is_tracked(record), type(record).__name__
