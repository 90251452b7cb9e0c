"""``aio_ascend.testing``, the pytest plugin: loaded through its entry point, inert until used;
its fixtures, marker, options and helpers, each in a pytest run of its own (pytester)."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
from typing import Any

import anyio
import pytest
from helpers import open_backend

import aio_ascend as aa
from aio_ascend import testing


@pytest.fixture(autouse=True)
def _quiet_inner_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # the inner runs' own settings (pytest-asyncio warns without a loop scope); their thread
    # checks wait less for a thread that will not exit (the inner runs share this module)
    monkeypatch.setattr(testing, "THREAD_GRACE_S", 0.3)
    if "pytester" in request.fixturenames:
        pytester = request.getfixturevalue("pytester")
        pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def test_registered_through_the_pytest11_entry_point(pytestconfig: pytest.Config) -> None:
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.name == "aio_ascend"] == ["aio_ascend.testing"]
    assert pytestconfig.pluginmanager.get_plugin("aio_ascend") is testing


def test_loading_it_changes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pathlib

        def test_fixtures(request):
            pathlib.Path("fixtures.txt").write_text(" ".join(request.fixturenames))

        async def test_not_run_by_us():
            pass
        """
    )
    runs = {}
    for plugin in ("aio_ascend", "no:aio_ascend"):  # loaded (as always), and left out
        result = pytester.runpytest("-p", plugin)
        runs[plugin] = (result.parseoutcomes(), (pytester.path / "fixtures.txt").read_text())
    # the same outcomes (the async test is not taken over: no autouse, no marker) and the
    # same fixtures for a test that uses none of the plugin's
    assert runs["aio_ascend"] == runs["no:aio_ascend"]
    assert "aio_ascend" not in runs["aio_ascend"][1]
    listed = pytester.runpytest("--fixtures-per-test").stdout.str()
    assert "sim_device" not in listed and "aio_ascend_threads" not in listed


MARKED = """
import pytest

@pytest.mark.aio_ascend_loops
async def test_all(anyio_backend):
    pass

@pytest.mark.aio_ascend_loops("trio", "asyncio")
async def test_some(anyio_backend):
    pass

pytestmark_note = "module-level marks work too"
"""


def test_the_marker_runs_a_test_on_each_loop(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "*test_all?asyncio? PASSED*",
            "*test_all?uvloop? PASSED*",
            "*test_all?trio? PASSED*",
            "*test_some?trio? PASSED*",
            "*test_some?asyncio? PASSED*",
        ]
    )
    # the option narrows every marked test; a test left with no loop is skipped
    result = pytester.runpytest("-v", "--aio-ascend-loops=uvloop")
    result.assert_outcomes(passed=1, skipped=1)
    result = pytester.runpytest("--aio-ascend-loops=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aio-ascend-loops='nope': choose from asyncio, uvloop, trio*"])


def test_the_marker_overrides_a_parametrized_anyio_backend(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(params=["asyncio"])
        def anyio_backend(request):
            return request.param
        """
    )
    pytester.makepyfile(MARKED)
    pytester.runpytest().assert_outcomes(passed=5)


def test_sim_device_checks_each_device_at_the_end(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.aio_ascend_loops("asyncio", "trio")
        async def test_closed(sim_device):
            async with sim_device() as dev:
                await dev.stream().run(dev.function("noop"), 1)
            dev2 = await sim_device(task_timeout=5.0)
            await dev2.aclose()
            assert dev.closed and dev2.closed and dev.backend == "sim"

        @pytest.mark.aio_ascend_loops("asyncio")
        async def test_left_open(sim_device):
            dev = await sim_device()
            dev.stream()
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*sim_device: <Device sim:0 open*was not closed by the test*"])


LEAKY_THREAD = """
import threading, time

def test_leaves_a_thread():
    threading.Thread(target=time.sleep, args=(0.1,), name="aio_ascend-fake-0",
                     daemon=True).start()

def test_uses_the_fixture(aio_ascend_threads):
    threading.Thread(target=time.sleep, args=(1,), name="aio_ascend-fake-1",
                     daemon=True).start()
"""


def test_the_thread_check_is_opt_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LEAKY_THREAD)
    # off: only the test that asks for the fixture is checked
    result = pytester.runpytest("-k", "leaves")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest("-k", "uses")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*aio_ascend threads still alive*aio_ascend-fake-1*"])


@pytest.mark.parametrize("how", ["option", "ini"])
def test_the_thread_check_for_every_test(pytester: pytest.Pytester, how: str) -> None:
    pytester.makepyfile(LEAKY_THREAD.replace("0.1", "1"))
    args = ["-k", "leaves"]
    if how == "option":
        args.append("--aio-ascend-thread-check")
    else:
        pytester.makeini(
            "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
            "aio_ascend_thread_check = true\n"
        )
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1, errors=1)


# --- the helpers, in this run ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_paused_holds_the_work_until_the_block_ends(sim_device: Any) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        with testing.paused(dev):
            task = await s.launch(dev.function("noop"), 1)
            await s.launch(dev.function("noop"), 1)
            await anyio.sleep(0.02)  # the poller would have seen it many times over
            assert not task.done()
        await task


@pytest.mark.anyio
async def test_injected_hang_ends_by_the_watchdog(sim_device: Any) -> None:
    async with sim_device(task_timeout=0.2) as dev:
        s = dev.stream()
        hung = await testing.inject_hang(s)
        behind = await s.launch(dev.function("noop"), 1)
        with pytest.raises(aa.TaskTimeoutError):
            await hung
        await dev.aclose(timeout=0.5)
        assert isinstance(behind.exception(), aa.TaskTimeoutError)


@pytest.mark.anyio
async def test_refused_launches(sim_device: Any) -> None:
    async with sim_device() as dev:
        s = dev.stream()
        testing.refuse_launches(dev, 207001)
        refused = await s.launch(dev.function("noop"), 1)
        with pytest.raises(aa.RuntimeAPIError) as info:
            await refused
        assert info.value.code == 207001
        await s.run(dev.function("noop"), 1)  # only one was refused; no fault


@pytest.mark.anyio
async def test_the_sim_controls_refuse_other_backends(anyio_backend: Any) -> None:
    async with open_backend("acl") as dev:
        with pytest.raises(TypeError, match="needs the sim backend"), testing.paused(dev):
            pass
        with pytest.raises(TypeError, match="needs the sim backend"):
            testing.refuse_launches(dev)
    testing.assert_no_leaks(dev)


def test_assert_no_leaks_names_what_was_left() -> None:
    class Runtime:
        def live_resources(self) -> dict[str, int]:
            return {"streams": 0, "events": 2}

    class Closed:
        closed = True
        runtime = Runtime()

        def stats(self) -> dict[str, int]:
            return {"streams": 0, "device_buffers": 1, "in_flight": 0}

        def memory_stats(self) -> dict[str, int]:
            return {"reserved_bytes": 512, "cached_blocks": 1, "allocated_bytes": 0}

    with pytest.raises(
        AssertionError,
        match=r"'device_buffers': 1.*'memory reserved_bytes': 512, 'memory cached_blocks': 1.*"
        r"'runtime events': 2",
    ):
        testing.assert_no_leaks(Closed())  # type: ignore[arg-type]
    Closed.closed = False
    with pytest.raises(AssertionError, match="is not closed"):
        testing.assert_no_leaks(Closed())  # type: ignore[arg-type]


def test_loop_params() -> None:
    params = testing.loop_params()
    assert [p.id for p in params] == ["asyncio", "uvloop", "trio"]
    assert params[1].values == (("asyncio", {"use_uvloop": True}),)
    with pytest.raises(ValueError, match="unknown event loop"):
        testing.loop_params(["curio"])


LEAKY_DEVICE = """
import pytest
import aio_ascend as aa

KEPT = []

@pytest.mark.aio_ascend_loops("asyncio")
async def test_1_leaks_a_device(sim_device):
    async with sim_device() as dev:
        await dev.stream().run(dev.function("noop"), 1)
    KEPT.append(await aa.open_device(backend="sim"))  # never closed: its threads live on

@pytest.mark.aio_ascend_loops("asyncio")
async def test_2_innocent(sim_device):
    async with sim_device() as dev:
        await dev.stream().run(dev.function("noop"), 1)

def test_3_innocent_with_the_thread_fixture(aio_ascend_threads):
    pass
"""


@pytest.fixture
def own_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subprocess run imports the aio_ascend under test (not another installed copy)."""
    root = str(pathlib.Path(aa.__file__).parent.parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )


@pytest.mark.usefixtures("own_package")
def test_a_leak_is_blamed_on_the_test_that_leaked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LEAKY_DEVICE)
    # in a process of its own: the leaked device's threads must not outlive the inner run
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-v")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_1_leaks_a_device*ERROR*",
            "*test_2_innocent*PASSED*",
            "*test_3_innocent_with_the_thread_fixture PASSED*",
            "*sim_device: aio_ascend threads still alive*aio_ascend-poll-0*",
        ]
    )


@pytest.mark.usefixtures("own_package")
def test_the_thread_check_blames_only_the_test_that_leaked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LEAKY_DEVICE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--aio-ascend-thread-check")
    # the leaking test fails at teardown (sim_device and the thread check); no other test does
    result.assert_outcomes(passed=3, errors=1)
    assert "ERROR at teardown of test_2" not in result.stdout.str()
