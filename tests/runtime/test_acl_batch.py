"""The acl backend's native batch submit (``aio_ascend/_runtime/acl/_native.c`` through
``batch.py``): a run of launches in one call, on the C double, reached through the same
function pointers as ctypes; and the scheduler on it and without it."""

from __future__ import annotations

import copy
import ctypes
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from doubles.acl_double import DoubleControl, build_double, double_control, native_extension
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._errors import ContextNullError
from aio_ascend._runtime.acl import batch as _batch
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

WRAP = 0xFFFF - 1  # the largest task id before the flip (the double's model of CANN's)
LAUNCH = "aclrtLaunchKernelWithHostArgs"

if TYPE_CHECKING:
    from conftest import RuntimeKit


@dataclass
class _Lane:
    handle: int


@dataclass
class _Host:
    addr: int


@dataclass
class _Launch:
    """What the batch reads of a launch request (the scheduler's ``Launch`` has the same)."""

    func: int
    lane: _Lane
    host: _Host
    nbytes: int = 8
    blocks: int = 1
    cfg: Any = None
    table_offset: int = 0
    placeholder_count: int = 0
    position: int = -1

    @property
    def spec(self) -> _Launch:  # (the scheduler's launches keep these fields in a LaunchSpec)
        return self


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = native_extension()
    monkeypatch.setattr(_batch, "_NATIVE", module)
    return module


@pytest.fixture
def ctl() -> Iterator[DoubleControl]:
    control = double_control()
    yield control
    control.clear_injections()
    control.set_internal_tasks(0)
    control.set_max_depth(2013)


@pytest.fixture
def rt(native: ModuleType) -> Iterator[AclRuntime]:
    runtime = open_acl_runtime(0, library_path=build_double().library)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def kit(rt: AclRuntime, make_kit: Callable[..., RuntimeKit]) -> RuntimeKit:
    """The kit over the double's built-ins; its stream keeps the runtime's default failure mode."""
    return make_kit(rt, library=build_double().builtins, stop_on_failure=False)


@pytest.fixture
def image(kit: RuntimeKit) -> int:
    """64 zeroed bytes of pinned memory: the args image of the launches below."""
    return kit.pinned(bytes(64))


@pytest.fixture
def launches(kit: RuntimeKit, image: int) -> Callable[..., list[_Launch]]:
    """``launches(count, **overrides)``: launch requests of ``noop`` on the kit's stream (one
    lane for all of them), over ``image``."""
    lane = _Lane(kit.stream)
    noop = kit.fn("noop")  # looked up here, on a bound thread: the tests make runs on others

    def make(count: int, **overrides: Any) -> list[_Launch]:
        fields = {"func": noop, "lane": lane, "host": _Host(image), **overrides}
        return [_Launch(**fields) for _ in range(count)]

    return make


def _submit(kit: RuntimeKit, run: list[Any]) -> tuple[int, aa.AscendError | None]:
    """The runtime's native batch submit of ``run``."""
    launch_batch = kit.rt.launch_batch
    assert launch_batch is not None
    return launch_batch(run)


def test_a_run_goes_through_the_librarys_functions_with_each_task_id(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]], image: int
) -> None:
    ctl.set_next_task_id(kit.stream, WRAP - 1, flip=3)
    run = launches(3)
    mark = ctl.mark()
    assert _submit(kit, run) == (3, None)
    # each launch is followed by the task id read, on this thread, in one call
    names = [call.name for call in ctl.calls(mark)]
    assert names == [LAUNCH, "aclrtGetThreadLastTaskId"] * 3
    assert [r.position for r in run] == [(3 << 16) | (WRAP - 1), (3 << 16) | WRAP, 4 << 16]
    launch = ctl.calls(mark, LAUNCH)[0]
    assert launch.args[:3] == (kit.fn("noop"), 1, kit.stream) and launch.args[4:6] == (image, 8)
    ctl.set_internal_tasks(1)  # the runtime's own tasks take ids too: each id is read, not counted
    later = launches(2)
    _submit(kit, later)
    assert later[1].position - later[0].position == 2


def test_a_refusal_stops_the_run_and_is_the_per_launch_methods_error(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]], image: int
) -> None:
    bogus = kit.fn("noop") + 0x10_0000  # no function of the double
    run = launches(2) + launches(1, func=bogus) + launches(2)
    mark = ctl.mark()
    submitted, refusal = _submit(kit, run)
    assert submitted == 2
    assert len(ctl.calls(mark, LAUNCH)) == 3  # nothing after the refused one
    assert [r.position for r in run[2:]] == [-1, -1, -1]
    with pytest.raises(aa.AscendError) as info:
        kit.rt.launch_kernel_with_host_args(bogus, 1, kit.stream, None, image, 8, 0, 0)
    assert type(refusal) is type(info.value)
    assert (refusal.code, refusal.func, refusal.message) == (  # type: ignore[union-attr]
        info.value.code,
        info.value.func,
        info.value.message,
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"blocks": 0},
        {"blocks": 65536},
        {"blocks": True},
        {"nbytes": 0},
        {"nbytes": 1 << 32},
        {"func": -1},
        {"func": 1 << 64},
        {"host": _Host(0)},
        {"placeholder_count": 1, "table_offset": 8},  # a table entry outside the image
        {"cfg": aa.LaunchConfig(timeout_us=5)},
    ],
    ids=repr,
)
def test_what_needs_the_precise_check_is_left_to_the_per_launch_method(
    kit: RuntimeKit,
    ctl: DoubleControl,
    overrides: dict[str, Any],
    launches: Callable[..., list[_Launch]],
    image: int,
) -> None:
    ctypes.memmove(image + 8, (ctypes.c_uint32 * 2)(64, 0), 8)  # the entry: addrOffset 64
    run = launches(1) + launches(1, **overrides) + launches(1)
    mark = ctl.mark()
    assert _submit(kit, run) == (1, None)
    assert len(ctl.calls(mark, LAUNCH)) == 1
    if "cfg" not in overrides:  # where it gets the precise error before the library
        odd = run[1]
        addr = odd.host.addr
        table = addr + odd.table_offset if odd.placeholder_count else 0
        with pytest.raises((TypeError, ValueError)):
            kit.rt.launch_kernel_with_host_args(
                odd.func, odd.blocks, kit.stream, None, addr, odd.nbytes, table, 1 if table else 0
            )
        assert len(ctl.calls(mark, LAUNCH)) == 1


def test_placeholders_are_checked_and_patched_in_a_run(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]], image: int
) -> None:
    # image: one pointer slot at 0 for the data at 8; the table after it
    ctypes.memmove(image + 16, (ctypes.c_uint32 * 2)(0, 8), 8)
    run = launches(2, nbytes=16, table_offset=16, placeholder_count=1)
    mark = ctl.mark()
    assert _submit(kit, run) == (2, None)
    last = ctl.calls(mark, LAUNCH)[-1]
    assert last.args[6:8] == (image + 16, 1)


def test_a_position_that_cannot_be_set_does_not_undo_the_submission(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]]
) -> None:
    class Fixed:
        """A launch whose ``position`` is read-only."""

        def __init__(self, launch: _Launch) -> None:
            self.__dict__.update(vars(launch))
            del self.__dict__["position"]

        @property
        def position(self) -> int:
            return -7

        @property
        def spec(self) -> Fixed:
            return self

    run = [Fixed(launch) for launch in launches(2)]
    mark = ctl.mark()
    assert _submit(kit, run) == (2, None)  # submitted is submitted: no error after the launches
    assert len(ctl.calls(mark, LAUNCH)) == 2
    assert [r.position for r in run] == [-7, -7]


def test_a_fault_keeps_its_first_text(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]]
) -> None:
    ctl.set_fault(kit.rt.context, 507015, "EZ9999: the first fault")
    submitted, refusal = _submit(kit, launches(2))
    assert submitted == 0 and isinstance(refusal, aa.DeviceFaultError)
    assert "the first fault" in str(refusal)
    ctl.inject_error(LAUNCH, 507015, "context is abnormal")
    _, again = _submit(kit, launches(1))
    assert isinstance(again, aa.DeviceFaultError) and "the first fault" in str(again)


def test_the_calling_threads_context_is_the_one_launched_on(
    kit: RuntimeKit, launches: Callable[..., list[_Launch]]
) -> None:
    results: list[tuple[int, aa.AscendError | None]] = []

    def unbound() -> None:
        results.append(_submit(kit, launches(2)))

    def bound() -> None:
        kit.rt.set_current_context()
        results.append(_submit(kit, launches(2)))

    for target in (unbound, bound):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    (none, refusal), done = results
    assert none == 0 and isinstance(refusal, ContextNullError)
    assert done == (2, None)


def test_the_gil_is_released_while_a_launch_waits(
    kit: RuntimeKit, ctl: DoubleControl, launches: Callable[..., list[_Launch]]
) -> None:
    # a queue of one behind a 300 ms kernel: the run's launch waits in the library for it
    ctl.set_max_depth(1)
    image = kit.rt.malloc_host(8)
    ctypes.memmove(image, (ctypes.c_uint32 * 2)(300_000, 0), 8)
    kit.rt.launch_kernel_with_host_args(kit.fn("sleep"), 1, kit.stream, None, image, 8, 0, 0)
    stamps: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        start = time.perf_counter()
        assert _submit(kit, launches(1)) == (1, None)
        end = time.perf_counter()
    finally:
        stop.set()
        thread.join()
    assert end - start > 0.2  # it did wait for the kernel
    inside = [t for t in stamps if start + 0.05 < t < end - 0.05]
    # ~1 ms ticks over >= 100 ms: a held GIL would allow none (>= 10x margin at 10)
    assert len(inside) >= 10


def test_a_closed_runtime_leaves_the_run_to_the_per_launch_method(
    kit: RuntimeKit, launches: Callable[..., list[_Launch]], image: int
) -> None:
    run = launches(1)
    launch_batch = kit.rt.launch_batch
    assert launch_batch is not None
    kit.rt.close()
    assert kit.rt.launch_batch is None  # (a submitter's next hop launches one by one)
    assert launch_batch(run) == (0, None)  # one fetched before the close refuses nothing itself
    with pytest.raises(aa.ClosedError):
        kit.rt.launch_kernel_with_host_args(kit.fn("noop"), 1, kit.stream, None, image, 8, 0, 0)


def test_the_fallback_is_the_per_launch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_batch, "_NATIVE", None)
    runtime = open_acl_runtime(0, library_path=build_double().library)
    try:
        assert runtime.launch_batch is None
        assert runtime.info()["native_submit"] is False
    finally:
        runtime.close()
    monkeypatch.setenv(_batch.ENV_NATIVE, "0")
    assert _batch._load() is None  # AIO_ASCEND_NATIVE=0: as if it were not built


# --- the scheduler on it ---------------------------------------------------------------------


@pytest.fixture(params=["native", "per-launch"])
def submit_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The scheduler on the native batch submit or without it; the runs it submitted."""
    runs: list[int] = []
    if request.param == "per-launch":
        monkeypatch.setattr(_batch, "_NATIVE", None)
        return runs
    monkeypatch.setattr(_batch, "_NATIVE", native_extension())
    real = _batch.NativeBatch.__call__

    def spy(self: Any, launches: list[Any]) -> tuple[int, aa.AscendError | None]:
        runs.append(len(launches))
        return real(self, launches)

    monkeypatch.setattr(_batch.NativeBatch, "__call__", spy)
    return runs


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_refused_launch_fails_its_streams_rest_and_no_other_stream(
    submit_path: list[int], anyio_backend: str
) -> None:
    async with open_backend("acl", batch_cap=64) as dev:
        native = dev.runtime.launch_batch is not None
        a, b = dev.stream(), dev.stream()
        noop = dev.function("noop")
        bad = copy.copy(noop)
        bad.handle = noop.handle + 0x10_0000  # no function of the double
        order = [(a, noop), (b, noop), (a, noop), (b, noop), (a, bad)]
        order += [(b, noop), (a, noop), (b, noop), (a, noop)]
        tasks = [await s.launch(f, 1) for s, f in order]  # one tick: one hop
        results: list[BaseException | None] = []
        for task in tasks:
            try:
                await task
                results.append(None)
            except aa.AscendError as exc:
                results.append(exc)
        refused = results[4]
        assert isinstance(refused, aa.RuntimeAPIError) and refused.__cause__ is None
        assert results[:4] == [None] * 4
        assert results[5] is None and results[7] is None  # the other stream goes on
        for later in (results[6], results[8]):  # its stream's rest, in order, caused by it
            assert isinstance(later, aa.AscendError) and later.__cause__ is refused
        await b.launch(noop, 1)  # a later hop: both streams take work again
        await (await a.launch(noop, 1))
    if native:
        # one run up to the launch closing b's batch (its event must follow it): it stopped
        # at the refusal, and the launches after it were looked at again
        assert submit_path[:3] == [8, 1, 1]
    else:
        assert submit_path == []


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_run_that_raises_after_launching_fails_only_its_own_tasks_once(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """If the batch call raises after its native loop ran (out of memory for its result), its
    launches may be on the device: they fail (InternalError) and are held until the close;
    the hop's earlier requests complete once, with no second delivery."""
    monkeypatch.setattr(_batch, "_NATIVE", native_extension())
    real = _batch.NativeBatch.__call__
    raised: list[int] = []

    def raises_after(self: Any, launches: list[Any]) -> tuple[int, aa.AscendError | None]:
        result = real(self, launches)
        if not raised:
            raised.append(len(launches))
            raise MemoryError("no memory for the result")
        return result

    monkeypatch.setattr(_batch.NativeBatch, "__call__", raises_after)
    async with open_backend("acl", batch_cap=4) as dev:
        s, other = dev.stream(), dev.stream()
        noop = dev.function("noop")
        buf = dev.malloc(64)
        first = await other.memset(buf, 1)  # placed and handed on before the run
        tasks = [await s.launch(noop, 1) for _ in range(4)]  # one hop: one run of 4
        await first
        outcomes = []
        for task in tasks:
            try:
                await task
                outcomes.append("ok")
            except aa.InternalError as exc:
                outcomes.append(f"failed: {exc}")
        assert len(raised) == 1 and raised[0] >= 1
        # the run's launches failed, in order; a launch after the run (another hop) ran
        failed = (
            "failed: submitting a run of launches failed: MemoryError('no memory for the result')"
        )
        assert outcomes == [failed] * raised[0] + ["ok"] * (len(tasks) - raised[0])
        lanes = [x._lane for x in (s, other)]
        await (await s.launch(noop, 1))  # a later hop: the stream takes work again
        await other.synchronize()
        assert all(lane.admission.in_flight == 0 for lane in lanes)  # each given back once
    assert dev.closed


def test_the_acl_tests_pass_without_the_native_submit() -> None:
    # AIO_ASCEND_NATIVE=0 is a pure-Python install's path (no compiler at install): the acl
    # fault tests, which launch through the scheduler, in a process of their own
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, _batch.ENV_NATIVE: "0"}
    check = "from aio_ascend._runtime.acl.batch import native_submit; assert not native_submit()"
    subprocess.run([sys.executable, "-c", check], env=env, cwd=root, check=True)
    tests = [
        "tests/runtime/test_acl_faults.py",
        "tests/runtime/test_acl_batch.py::test_a_refused_launch_fails_its_streams_rest_and_no_"
        "other_stream[per-launch-asyncio]",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *tests],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
