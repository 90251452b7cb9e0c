"""Testing your own code against the simulator: a pytest plugin and its helpers.

pytest loads this module through the ``pytest11`` entry point whenever aio_ascend is
installed. Loading it changes nothing: it has no autouse fixture, and its options are off
until given. A test opts in by using what it offers:

- the ``sim_device`` fixture: ``async with sim_device() as dev`` (or ``dev = await
  sim_device()``) opens ``open_device(0, backend="sim", ...)`` on the test's event loop; after
  the test every device it opened must be closed and have left nothing behind (runtime
  streams, events, device and pinned buffers, kernel binaries, library threads), or the test
  fails saying what was left;
- the ``aio_ascend_loops`` marker: ``@pytest.mark.aio_ascend_loops`` runs an async test once
  per event loop (asyncio, uvloop and trio, through anyio's pytest plugin; a loop whose
  package is missing is skipped), ``@pytest.mark.aio_ascend_loops("asyncio", "trio")`` on
  those only; ``--aio-ascend-loops=asyncio,trio`` narrows every marked test;
- the ``aio_ascend_threads`` fixture: the test fails if a library thread (``aio_ascend-*``)
  outlives it; ``--aio-ascend-thread-check`` (or the ini option ``aio_ascend_thread_check =
  true``) applies it to every test;
- helpers for the sim: :func:`paused` (nothing starts or finishes on the device inside the
  block), :func:`inject_fault`, :func:`inject_hang`, :func:`refuse_launches`, and the leak
  checks :func:`assert_no_leaks` and :func:`assert_no_library_threads`.

For example::

    import pytest
    from aio_ascend import testing

    @pytest.mark.aio_ascend_loops
    async def test_my_handler_survives_a_fault(sim_device):
        async with sim_device() as dev:
            s = dev.stream()
            with testing.paused(dev):
                task = await testing.inject_fault(s)
            with pytest.raises(aio_ascend.DeviceFaultError):
                await task
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import threading
import time
from collections.abc import Collection, Generator, Iterable, Iterator
from types import TracebackType
from typing import Any

import pytest

from . import Device, HostArgs, Stream, Task, open_device
from ._errors import AclCode

__all__ = [
    "LOOPS",
    "SimDevices",
    "aio_ascend_threads",
    "assert_no_leaks",
    "assert_no_library_threads",
    "inject_fault",
    "inject_hang",
    "library_threads",
    "loop_params",
    "paused",
    "refuse_launches",
    "sim_device",
]

#: the event loops a marked test runs on: name -> (anyio backend, its options, the package)
LOOPS: dict[str, tuple[str, dict[str, Any], str]] = {
    "asyncio": ("asyncio", {}, "asyncio"),
    "uvloop": ("asyncio", {"use_uvloop": True}, "uvloop"),
    "trio": ("trio", {}, "trio"),
}
MARKER = "aio_ascend_loops"
#: how long the checks wait for library threads to exit
THREAD_GRACE_S = 2.0


def loop_params(names: Iterable[str] = tuple(LOOPS)) -> list[Any]:
    """``pytest.param`` values for ``anyio_backend``, one per loop; a loop whose package is
    not installed is marked skip. For ``@pytest.fixture(params=loop_params())``."""
    params = []
    for name in names:
        if name not in LOOPS:
            raise ValueError(f"unknown event loop {name!r}: choose from {', '.join(LOOPS)}")
        backend, options, package = LOOPS[name]
        missing = importlib.util.find_spec(package) is None
        params.append(
            pytest.param(
                (backend, dict(options)),
                id=name,
                marks=pytest.mark.skipif(missing, reason=f"{package} is not installed"),
            )
        )
    return params


# --- leak checks ---------------------------------------------------------------------------------


def library_threads() -> list[threading.Thread]:
    """The threads of aio_ascend alive now (named ``aio_ascend-<role>-<device>``)."""
    return [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]


def assert_no_library_threads(
    timeout: float | None = None, *, ignore: Collection[threading.Thread] = ()
) -> None:
    """Wait up to ``timeout`` seconds (default :data:`THREAD_GRACE_S`) for every library
    thread to exit; AssertionError if one is still alive (a device that was not closed, or a
    bug).

    :param ignore: threads left out of the check: those alive before the test began, which
        belong to devices someone else left open (that test is the one to blame)
    """
    ignored = frozenset(ignore)

    def alive() -> list[threading.Thread]:
        return [t for t in library_threads() if t not in ignored]

    deadline = time.monotonic() + (THREAD_GRACE_S if timeout is None else timeout)
    while alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    left = alive()
    assert not left, f"aio_ascend threads still alive: {[t.name for t in left]}"


def assert_no_leaks(dev: Device) -> None:
    """After ``await dev.aclose()``: AssertionError naming what the device left behind.

    Checks the device's own accounting (streams, device buffers, requests in flight, pooled
    pinned buffers, pinned arrays still alive: ``Device.pinned_empty``, device memory its
    caching allocator still holds) and, where the backend counts them (the sim), the runtime's
    live streams, events, device and host allocations and kernel binaries.
    """
    if not dev.closed:
        raise AssertionError(f"{dev!r} is not closed: close it before checking for leaks")
    stats = dev.stats()
    left = {
        key: stats[key]
        for key in ("streams", "device_buffers", "in_flight", "host_buffers_in_use",
                    "host_pool_bytes", "pinned_arrays")
        if stats.get(key)
    }  # fmt: skip
    memory = dev.memory_stats()
    left.update(
        {f"memory {key}": memory[key] for key in ("reserved_bytes", "cached_blocks") if memory[key]}
    )
    live = getattr(dev.runtime, "live_resources", None)
    if callable(live):
        left.update({f"runtime {key}": count for key, count in live().items() if count})
    assert not left, f"{dev!r} left behind after close: {left}"


# --- the sim's test controls ----------------------------------------------------------------------


def _sim_runtime(dev: Device, what: str) -> Any:
    runtime = dev.runtime
    if not hasattr(runtime, what):
        raise TypeError(f"{what}() needs the sim backend; {dev!r} runs on {dev.backend!r}")
    return runtime


@contextlib.contextmanager
def paused(dev: Device) -> Iterator[None]:
    """Pause the sim device for the block: no task starts or finishes on it (submitting still
    works, so work queues up), then it resumes. Use it to hold work in flight: to test
    backpressure, cancellation, close with work outstanding, or a timeout."""
    runtime = _sim_runtime(dev, "pause")
    runtime.pause()
    try:
        yield
    finally:
        runtime.resume()


async def inject_fault(stream: Stream, code: int = AclCode.RT_AICORE_EXCEPTION) -> Task:
    """Launch the built-in ``fault`` kernel on ``stream``: when the device reaches it, it
    faults with ACL ``code`` (sticky, as on hardware: the task fails with
    ``DeviceFaultError``, so does every later task of the device until it is reopened).
    Returns the kernel's task."""
    fn = stream.device.function("fault")  # type: ignore[attr-defined]
    task: Task = await stream.launch(fn, 1, HostArgs().u32(int(code)))
    return task


async def inject_hang(stream: Stream) -> Task:
    """Launch the built-in ``hang`` kernel on ``stream``: it never finishes, so only the
    device's ``task_timeout`` watchdog, a timeout of yours or ``aclose(timeout=...)`` ends
    it (and what is queued behind it). Returns the kernel's task."""
    task: Task = await stream.launch(stream.device.function("hang"), 1)  # type: ignore[attr-defined]
    return task


def refuse_launches(dev: Device, code: int = AclCode.RT_PARAM_INVALID, *, after: int = 0) -> None:
    """Make the sim runtime refuse the ``after + 1``-th launch call from now on with ACL
    ``code`` (nothing is queued; the device does not fault): that task fails with the
    runtime's error, and the rest of its batch with it as cause."""
    _sim_runtime(dev, "inject_launch_error").inject_launch_error(int(code), after)


# --- the sim_device fixture ---------------------------------------------------------------------


class _Opening:
    """One ``sim_device(...)`` call: ``async with`` it or ``await`` it."""

    def __init__(self, devices: SimDevices, opener: Any) -> None:
        self._devices = devices
        self._opener = opener

    def __await__(self) -> Generator[Any, None, Device]:
        return self._open().__await__()

    async def _open(self) -> Device:
        dev: Device = await self._opener
        self._devices.opened.append(dev)
        return dev

    async def __aenter__(self) -> Device:
        dev: Device = await self._opener.__aenter__()
        self._devices.opened.append(dev)
        return dev

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._opener.__aexit__(exc_type, exc, tb)


class SimDevices:
    """What the ``sim_device`` fixture gives: ``sim_device(device_id=0, **open_device_kwargs)``
    opens a sim device (``runtime_options`` for the sim, e.g. ``{"time_model": True}``).

    :ivar opened: the devices opened so far
    :param check_leaks: at the end of the test, check every device was closed and left
        nothing behind
    :ivar threads_before: the library threads alive when it was made (the test began): not
        this test's, so never held against it
    """

    def __init__(self, *, check_leaks: bool = True) -> None:
        self.opened: list[Device] = []
        self.check_leaks = check_leaks
        self.threads_before = frozenset(library_threads())

    def __call__(self, device_id: int = 0, **kwargs: Any) -> _Opening:
        return _Opening(self, open_device(device_id, backend="sim", **kwargs))

    def finish(self) -> list[str]:
        """Check (and, if need be, close) every device opened; what was wrong, in words."""
        problems = []
        for dev in self.opened:
            if not dev.closed:
                problems.append(f"{dev!r} was not closed by the test")
                try:  # the test's loop has finished: close it on a loop of our own
                    asyncio.run(dev.aclose(cancel=True, timeout=1.0))
                except Exception as exc:
                    problems.append(f"closing it afterwards failed: {exc!r}")
                    continue
            if self.check_leaks:
                try:
                    assert_no_leaks(dev)
                except AssertionError as exc:
                    problems.append(str(exc))
        if self.opened and self.check_leaks:
            try:
                assert_no_library_threads(ignore=self.threads_before)
            except AssertionError as exc:
                problems.append(str(exc))
        return problems


@pytest.fixture
def sim_device() -> Iterator[SimDevices]:
    """Open sim devices on the test's loop: ``async with sim_device() as dev``; after the
    test each must be closed and have left nothing behind (see :class:`SimDevices`)."""
    devices = SimDevices()
    yield devices
    problems = devices.finish()
    if problems:
        pytest.fail("sim_device: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def aio_ascend_threads() -> Iterator[None]:
    """Fail the test if a library thread (``aio_ascend-*``) started during it outlives it
    (after a grace of ``THREAD_GRACE_S`` seconds for threads still exiting). Threads alive
    before the test are another test's leak, reported there."""
    before = frozenset(library_threads())
    yield
    try:
        assert_no_library_threads(ignore=before)
    except AssertionError as exc:
        pytest.fail(f"after the test: {exc}", pytrace=False)


class _ThreadCheck:
    """Registered as a plugin by ``--aio-ascend-thread-check``: the thread check, autouse."""

    @pytest.fixture(autouse=True)
    def _aio_ascend_thread_check(self, aio_ascend_threads: None) -> None:
        return None


# --- hooks --------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aio_ascend", "aio_ascend (the aio_ascend.testing plugin)")
    group.addoption(
        "--aio-ascend-loops",
        default=None,
        metavar="LOOPS",
        help=f"run tests marked {MARKER} on these loops only (comma-separated: {', '.join(LOOPS)})",
    )
    group.addoption(
        "--aio-ascend-thread-check",
        action="store_true",
        default=False,
        help="fail every test that leaves an aio_ascend library thread running",
    )
    parser.addini(
        "aio_ascend_thread_check",
        type="bool",
        default=False,
        help="as --aio-ascend-thread-check",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*loops): run the async test on each event loop (asyncio, uvloop, trio by "
        "default; through anyio's pytest plugin)",
    )
    if config.getoption("aio_ascend_thread_check") or config.getini("aio_ascend_thread_check"):
        config.pluginmanager.register(_ThreadCheck(), "aio_ascend-thread-check")
    chosen = config.getoption("aio_ascend_loops")
    if chosen is not None:
        names = [name.strip() for name in chosen.split(",") if name.strip()]
        unknown = [name for name in names if name not in LOOPS]
        if unknown or not names:
            raise pytest.UsageError(
                f"--aio-ascend-loops={chosen!r}: choose from {', '.join(LOOPS)}"
            )


def _marked(node: Any, obj: object) -> bool:
    if node.get_closest_marker(MARKER) is not None:
        return True
    return any(getattr(mark, "name", None) == MARKER for mark in getattr(obj, "pytestmark", ()))


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: Any, name: str, obj: object) -> None:
    # A marked coroutine function runs through anyio's plugin, which runs a test that uses
    # the anyio_backend fixture (as it does for tests marked anyio).
    if (
        collector.istestfunction(obj, name)
        and inspect.iscoroutinefunction(obj)
        and _marked(collector, obj)
    ):
        pytest.mark.usefixtures("anyio_backend")(obj)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None or "anyio_backend" not in metafunc.fixturenames:
        return
    names = list(marker.args) or list(LOOPS)
    chosen = metafunc.config.getoption("aio_ascend_loops")
    if chosen is not None:
        allowed = {name.strip() for name in chosen.split(",")}
        names = [name for name in names if name in allowed]
    # A parametrize mark (not a parametrize call) so that a parametrized anyio_backend
    # fixture of the project's own is overridden for this test, not doubled. No loop left
    # after --aio-ascend-loops: an empty parameter set, which pytest skips.
    metafunc.definition.add_marker(pytest.mark.parametrize("anyio_backend", loop_params(names)))
