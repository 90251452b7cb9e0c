"""Fault attribution by the runtime's own task ids, frees after a forced stream destruction,
scoped exception reports and coexisting exception callbacks, on the C double's model of the
CANN runtime (``tests/doubles/acl_double_faults.h``, each behaviour cited there)."""

from __future__ import annotations

import ctypes
import logging
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from doubles.acl_double import DoubleControl, build_double, build_legacy_double, double_control
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._runtime.acl.exceptions import ExceptionLog
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime
from aio_ascend._sched.faults import NO_TASK, fail_batches
from aio_ascend._sched.lane import Lane
from aio_ascend._sched.work import Batch

pytestmark = [pytest.mark.runtime_source, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


WRAP = 0xFFFF - 1  # the largest task id before the flip (task_submit.cc:232-233)


@pytest.fixture
def runtime() -> Iterator[AclRuntime]:
    rt = open_acl_runtime(0, library_path=build_double().library)
    try:
        yield rt
    finally:
        rt.close()
        double_control().set_internal_tasks(0)
        double_control().drop_zombies()  # a hung kernel's, so that later tests see an idle device


def _image(rt: AclRuntime, *words: int) -> int:
    data = b"".join(struct.pack("<Q", w) for w in words) or b"\0" * 8
    image = rt.malloc_host(max(len(data), 8))
    ctypes.memmove(image, data, len(data))
    return image


def _stream_number(rt: AclRuntime, stream: int) -> int:
    """The runtime's number of ``stream`` (``aclrtStreamGetId``: what fault reports name)."""
    number = ctypes.c_int32()
    rt._fn["aclrtStreamGetId"](stream, ctypes.byref(number))
    return number.value


def _launch(rt: AclRuntime, stream: int, name: str, image: int, size: int = 8) -> None:
    binary = getattr(rt, "_test_binary", None)
    if binary is None:
        binary = rt.load_binary(build_double().builtins)
        rt._test_binary = binary  # type: ignore[attr-defined]
    func = rt.get_function(binary, name)
    rt.launch_kernel_with_host_args(func, 1, stream, None, image, size, 0, 0)


# --- task ids --------------------------------------------------------------------------------


def test_task_ids_flip_past_the_wrap(runtime: AclRuntime) -> None:
    stream = runtime.create_stream()
    double_control().set_next_task_id(stream, WRAP - 1, flip=3)
    image = _image(runtime, 0)
    ids = []
    for _ in range(3):
        _launch(runtime, stream, "noop", image)
        ids.append(runtime.last_task_id())
    assert ids == [(3 << 16) | (WRAP - 1), (3 << 16) | WRAP, 4 << 16]


def test_the_last_task_id_is_the_calling_threads(runtime: AclRuntime) -> None:
    stream = runtime.create_stream()
    image = _image(runtime, 0)
    _launch(runtime, stream, "noop", image)
    mine = runtime.last_task_id()
    seen: list[int | None] = []
    thread = threading.Thread(target=lambda: seen.append(runtime.last_task_id()))
    thread.start()
    thread.join()
    assert mine == 0
    assert seen == [0]  # a thread that submitted nothing: the runtime's initial 0


def test_event_records_and_internal_tasks_take_ids(runtime: AclRuntime) -> None:
    stream = runtime.create_stream()
    image = _image(runtime, 0)
    event = runtime.create_event(0)
    _launch(runtime, stream, "noop", image)
    runtime.record_event(event, stream)
    assert runtime.last_task_id() == 1
    double_control().set_internal_tasks(3)  # the third submission is preceded by one
    _launch(runtime, stream, "noop", image)
    assert runtime.last_task_id() == 3  # id 2 went to the runtime's internal task
    runtime.destroy_event(event)


def test_the_report_names_the_flip_id_of_the_failed_task(runtime: AclRuntime) -> None:
    stream = runtime.create_stream()
    double_control().set_next_task_id(stream, WRAP, flip=0)
    noop, bad = _image(runtime, 0), _image(runtime, 507035)
    _launch(runtime, stream, "noop", noop)
    _launch(runtime, stream, "fault", bad)
    failed = runtime.last_task_id()
    with pytest.raises(aa.DeviceFaultError):
        runtime.synchronize_stream(stream, 10_000)
    assert failed == 1 << 16
    assert runtime.fault_site() == (stream, 1 << 16)


@pytest.mark.backends("acl", "acl-8.3")
async def test_only_the_exact_task_is_blamed_across_the_wrap(backend: str) -> None:
    async with open_backend(backend, batch_cap=64) as dev:
        s = dev.stream()
        double_control(backend.partition("-")[2] or "9.1").set_next_task_id(
            s._lane.handle, WRAP - 2
        )
        sleep = dev.function("sleep")
        first = await s.launch(sleep, 1, aa.HostArgs().u32(200_000))
        noops = [await s.launch(dev.function("noop"), 1) for _ in range(4)]
        bad = await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
        with pytest.raises(aa.DeviceFaultError) as info:
            await bad
        assert info.value.code == 507015 and info.value.__cause__ is None
        for task in [first, *noops]:  # ran (the double says so), but no event said it
            with pytest.raises(aa.DeviceFaultError) as other:
                await task
            assert other.value.__cause__ is info.value
        site = dev.runtime.fault_site()
        assert site is not None and site[1] == (1 << 16) | 2  # ids W-2, W-1, W, 0, 1 | 2
        with pytest.raises(aa.DeviceFaultError):
            await dev.synchronize()


async def test_without_task_ids_the_first_task_of_the_stream_is_blamed() -> None:
    # CANN 8.0 lacks aclrtGetThreadLastTaskId: the report names a stream, not a task of ours
    async with open_backend("acl-8.0") as dev:
        assert dev.runtime.last_task_id() is None
        s = dev.stream()
        first = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(100_000))
        bad = await s.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
        with pytest.raises(aa.DeviceFaultError) as info:
            await first
        assert info.value.__cause__ is None  # the first fault for the stream
        with pytest.raises(aa.DeviceFaultError) as later:
            await bad
        assert later.value.__cause__ is info.value
        with pytest.raises(aa.DeviceFaultError):
            await dev.synchronize()


def test_a_report_without_a_task_blames_nobody() -> None:
    lane = Lane(7, 10, 100)
    request: Any = type("R", (), {"lane": lane, "position": 0})()
    batch = Batch(lane, [request], 1, 0.0, 0.0)
    fault = aa.DeviceFaultError("device faulted", code=507015)
    ((_, error, _),) = fail_batches([batch], fault, fault, (7, NO_TASK))
    assert error is not fault and error.__cause__ is fault
    ((_, error, _),) = fail_batches([batch], fault, fault, (7, 0))
    assert error is fault


# --- forced destruction ----------------------------------------------------------------------


def test_a_forced_destroy_leaves_the_running_kernel_running(runtime: AclRuntime) -> None:
    control = double_control()
    stream = runtime.create_stream()
    _launch(runtime, stream, "sleep", _image(runtime, 200_000), 8)
    time.sleep(0.05)
    runtime.destroy_stream_force(stream)
    assert control.zombies() == 1
    deadline = time.monotonic() + 10
    while control.zombies() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert control.zombies() == 0


def test_a_forced_destroy_asks_the_stream_without_waiting_on_it(runtime: AclRuntime) -> None:
    # the close forces streams on the event loop's thread: a synchronize there, even with a
    # 1 ms timeout, runs the runtime's timeout snapshot on a busy stream, which waits with no
    # timeout (hicann/runtime@681ef76 src/runtime/api/impl/api_impl.cc:1733, 6360-6381); a
    # query only looks at the stream's queue (core/src/stream/stream.cc:2119-2141)
    control = double_control()
    idle, busy = runtime.create_stream(), runtime.create_stream()
    _launch(runtime, idle, "sleep", _image(runtime, 1), 8)
    runtime.synchronize_stream(idle, 5000)
    mark = control.mark()
    runtime.destroy_stream_force(idle)
    assert not runtime.settle.unsettled  # nothing ran on it: frees go ahead at once
    _launch(runtime, busy, "sleep", _image(runtime, 200_000), 8)
    runtime.destroy_stream_force(busy)
    assert runtime.settle.unsettled  # its kernel still runs
    stream_calls = [call.name for call in control.calls(mark) if "Stream" in call.name]
    assert stream_calls == ["aclrtStreamQuery", "aclrtDestroyStreamForce"] * 2
    deadline = time.monotonic() + 10
    while control.zombies() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_wait_on_a_record_a_forced_destroy_dropped_never_passes(runtime: AclRuntime) -> None:
    # The pinned runtime over tests/realrt's driver: a stream waiting on an event whose record
    # was still queued when its stream was destroyed by force stays pending (2 s and more);
    # the double let the wait pass, so stranding could not be told from a stream running on
    control = double_control()
    busy, waiting = runtime.create_stream(), runtime.create_stream()
    _launch(runtime, busy, "sleep", _image(runtime, 100_000), 8)
    dropped, behind = runtime.create_event(1), runtime.create_event(1)
    runtime.record_event(dropped, busy)
    runtime.stream_wait_event(waiting, dropped)
    runtime.record_event(behind, waiting)
    runtime.destroy_stream_force(busy)
    deadline = time.monotonic() + 10
    while control.zombies() and time.monotonic() < deadline:
        time.sleep(0.01)  # the kernel has run out: the device is idle but for the wait
    time.sleep(0.05)
    assert runtime.query_event_status(behind) == 0  # NOT_READY, for good
    runtime.destroy_stream_force(waiting)


def test_the_stream_query_answers_as_the_runtime_does(runtime: AclRuntime) -> None:
    lib = ctypes.CDLL(str(build_double().library))
    query = lib.aclrtStreamQuery
    query.argtypes, query.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
    stream = runtime.create_stream()  # continue-on-failure, the runtime's default
    status = ctypes.c_int32(-1)
    assert query(stream, None) == 100000  # a NULL status, refused before anything else
    assert (query(stream, ctypes.byref(status)), status.value) == (0, 0)  # COMPLETE
    _launch(runtime, stream, "fault", _image(runtime, 507035))
    deadline = time.monotonic() + 10
    while runtime.fault_site() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # (reported as the task failed)
    assert runtime.fault_site() == (stream, 0)
    # its failed task unread, the queue stays stopped at it: never COMPLETE
    assert (query(stream, ctypes.byref(status)), status.value) == (0, 1)  # NOT_READY
    with pytest.raises(aa.DeviceFaultError):
        runtime.synchronize_stream(stream, 10_000)
    assert (query(stream, ctypes.byref(status)), status.value) == (0, 0)


def test_a_free_while_a_forced_kernel_runs_is_deferred_until_it_ends(
    runtime: AclRuntime,
) -> None:
    control = double_control()
    before = control.use_after_free()
    stream = runtime.create_stream()
    buffer, other = runtime.malloc(64), runtime.malloc(64)
    _launch(runtime, stream, "sleep", _image(runtime, 200_000, buffer), 16)
    time.sleep(0.05)
    runtime.destroy_stream_force(stream)
    allocated = control.live_counts()["device_allocs"]
    start = time.monotonic()
    runtime.free(buffer)
    assert time.monotonic() - start < 0.15  # never waits for the kernel (200 ms)
    assert runtime.settle.deferred == [("device", buffer)]
    assert control.live_counts()["device_allocs"] == allocated  # not freed under the kernel
    deadline = time.monotonic() + 10
    while control.zombies() and time.monotonic() < deadline:
        time.sleep(0.01)
    runtime.free(other)  # the device is idle now: the deferred free is done too
    assert runtime.settle.deferred == []
    assert control.live_counts()["device_allocs"] == allocated - 2
    assert control.use_after_free() == before
    assert runtime.settle.leaked == []


def test_frees_while_a_forced_kernel_runs_ask_the_device_at_most_once_per_interval(
    runtime: AclRuntime,
) -> None:
    # a free may run on the event loop's thread, and each ask of a busy device costs its
    # whole 1 ms timeout: a server freeing hundreds of buffers a second must not pay it each time
    from aio_ascend._runtime.acl.settle import ASK_INTERVAL_S

    control = double_control()
    stream = runtime.create_stream()
    buffers = [runtime.malloc(64) for _ in range(40)]
    _launch(runtime, stream, "hang", _image(runtime, 0), 16)
    time.sleep(0.05)
    runtime.destroy_stream_force(stream)
    mark = control.mark()
    start = time.monotonic()
    for buffer in buffers[:-1]:
        runtime.free(buffer)
    quick = time.monotonic() - start < ASK_INTERVAL_S
    asks = control.calls(mark, "aclrtSynchronizeDeviceWithTimeout")
    if quick:  # (a loaded machine may take longer over 39 frees: then more asks are due)
        assert len(asks) == 1
    assert 1 <= len(asks) <= 1 + (time.monotonic() - start) / ASK_INTERVAL_S
    time.sleep(ASK_INTERVAL_S * 1.5)
    runtime.free(buffers[-1])  # the interval is over: this one asks again
    assert len(control.calls(mark, "aclrtSynchronizeDeviceWithTimeout")) == len(asks) + 1
    assert runtime.settle.deferred == [("device", b) for b in buffers]


def test_a_hung_kernel_after_a_forced_destroy_leaks_at_close_and_logs_once(
    runtime: AclRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    control = double_control()
    before = control.use_after_free()
    stream = runtime.create_stream()
    buffer, other = runtime.malloc(64), runtime.malloc(64)
    _launch(runtime, stream, "hang", _image(runtime, 0, buffer), 16)
    time.sleep(0.05)
    runtime.destroy_stream_force(stream)
    with caplog.at_level(logging.ERROR, logger="aio_ascend"):
        runtime.free(buffer)
        start = time.monotonic()
        runtime.close()
        assert time.monotonic() - start < 5  # 0.5 s for the device, then it gives up
    assert control.use_after_free() == before
    leaked = runtime.settle.leaked
    assert ("device", buffer) in leaked and ("device", other) in leaked
    assert len([r for r in caplog.records if "destroyed by force" in r.getMessage()]) == 1


def test_without_a_device_synchronize_a_forced_destroy_leaks() -> None:
    rt = open_acl_runtime(0, library_path=build_legacy_double().library)
    try:
        stream = rt.create_stream()
        buffer = rt.malloc(64)
        _launch(rt, stream, "sleep", _image(rt, 100_000, buffer), 16)
        time.sleep(0.02)
        rt.destroy_stream_force(stream)
        rt.free(buffer)
        assert rt.settle.deferred == [("device", buffer)]
    finally:
        rt.close()
        DoubleControl(build_legacy_double().library).drop_zombies()
    assert ("device", buffer) in rt.settle.leaked


async def test_a_forced_close_frees_nothing_a_running_kernel_uses() -> None:
    # 8.5: no parameter info, so the sleep kernel may be given the buffer it uses
    control = double_control("8.5")
    before = control.use_after_free()
    async with open_backend("acl-8.5") as dev:
        s = dev.stream()
        buf = dev.malloc(64)
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(300_000).ptr(buf))
        buf.free()  # deferred: the launch still holds it
        await dev.aclose(timeout=0.05)
        with pytest.raises(aa.AscendError):
            await task
    assert control.use_after_free() == before


async def test_waiting_for_a_hung_device_at_close_never_blocks_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A plain close waits up to 0.5 s for the device a forced stream left busy before it
    # leaks (settle.py): in a worker thread, so the loop keeps ticking meanwhile (before: one
    # 0.5 s stall).
    gaps: list[float] = []

    async def tick(stop: anyio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            await anyio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    before = {t.name for t in threading.enumerate()}
    with caplog.at_level(logging.ERROR, logger="aio_ascend"):
        dev = await open_backend("acl")
        s = dev.stream()
        await s.launch(dev.function("hang"), 1)
        await anyio.sleep(0.02)
        await s.aclose(timeout=0.05)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick, stop)
            await anyio.sleep(0.02)
            start = time.monotonic()
            await dev.aclose()
            elapsed = time.monotonic() - start
            stop.set()
    assert elapsed >= 0.4, "the close did not wait for the hung device at all"
    assert max(gaps) < 0.25, f"the loop stalled {max(gaps):.3f} s during the close"
    assert any("destroyed by force" in r.getMessage() for r in caplog.records)
    # ... on a thread that ended with it (an idle worker of anyio's outlived the close)
    assert not [t for t in threading.enumerate() if t.name not in before]


# --- scoped reports, callbacks -----------------------------------------------------------------


def test_a_stale_report_never_matches_a_recycled_stream_id() -> None:
    control = double_control()
    rt = open_acl_runtime(0, library_path=build_double().library)
    stream = rt.create_stream()
    number = _stream_number(rt, stream)
    _launch(rt, stream, "fault", _image(rt, 507035))
    with pytest.raises(aa.DeviceFaultError):
        rt.synchronize_stream(stream, 10_000)
    assert rt.fault_site() is not None
    rt.close()
    again = open_acl_runtime(0, library_path=build_double().library)
    try:
        control.set_next_stream_id(number)
        recycled = again.create_stream()
        assert again.fault_site() is None  # the report was the closed runtime's
        _launch(again, recycled, "noop", _image(again, 0))
        again.synchronize_stream(recycled, 10_000)
        assert again.fault_site() is None
    finally:
        again.close()


def _fault_on_a_recycled_id(number: int) -> tuple[AclRuntime, int, int]:
    """Device 0 opened again, a new stream of it given the id ``number`` (recycled), and a
    fault there: ``(runtime, stream, the failed task's id)``."""
    runtime = open_acl_runtime(0, library_path=build_double().library)
    double_control().set_next_stream_id(number)
    stream = runtime.create_stream()
    _launch(runtime, stream, "fault", _image(runtime, 507035))
    failed = runtime.last_task_id()
    with pytest.raises(aa.DeviceFaultError):
        runtime.synchronize_stream(stream, 10_000)
    assert failed is not None
    return runtime, stream, failed


@pytest.mark.parametrize("destroy", ["destroy_stream", "destroy_stream_force"])
def test_a_late_close_keeps_the_reports_of_the_device_opened_again(destroy: str) -> None:
    # a close can run late (a collected device, or once a stuck runtime call returned), after
    # the same device was opened again and one of its new streams got a recycled stream id
    # (the old stream idle when destroyed: by force too, nothing of it ran on)
    first = open_acl_runtime(0, library_path=build_double().library)
    second: AclRuntime | None = None
    try:
        old = first.create_stream()
        number = _stream_number(first, old)
        getattr(first, destroy)(old)
        second, stream, failed = _fault_on_a_recycled_id(number)
        assert second.fault_site() == (stream, failed)
        first.close()
        assert second.fault_site() == (stream, failed)  # not the closed runtime's report
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_close_waiting_for_its_device_keeps_the_reports_of_an_id_it_freed() -> None:
    # the close destroys its streams, then waits for the device (a kernel runs on): a stream
    # it found idle freed its id at once, and the device opened again may take it meanwhile
    control = double_control()
    first = open_acl_runtime(0, library_path=build_double().library)
    second: AclRuntime | None = None
    closer = threading.Thread(target=first.close)
    try:
        busy, idle = first.create_stream(), first.create_stream()
        number = _stream_number(first, idle)
        hang = first.get_function(first.load_binary(build_double().builtins), "hang")
        config = aa.LaunchConfig(timeout_us=400_000)
        first.launch_kernel_with_host_args(hang, 1, busy, config, _image(first, 0), 8, 0, 0)
        mark = control.mark()
        closer.start()
        deadline = time.monotonic() + 10
        while len(control.calls(mark, "aclrtDestroyStreamForce")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        second, stream, failed = _fault_on_a_recycled_id(number)
        closer.join(10)
        assert second.fault_site() == (stream, failed)
    finally:
        if closer.ident is not None:  # (started)
            closer.join(10)
        first.close()
        if second is not None:
            second.close()
        control.drop_zombies()


def test_a_late_fault_of_a_stream_destroyed_by_force_goes_with_its_runtime() -> None:
    # the kernel left running on a stream destroyed by force faults after the destroy; its
    # report is that runtime's until it closes, not a new stream's with the recycled id
    control = double_control()
    first = open_acl_runtime(0, library_path=build_double().library)
    second: AclRuntime | None = None
    try:
        old = first.create_stream()
        number = _stream_number(first, old)
        hang = first.get_function(first.load_binary(build_double().builtins), "hang")
        image = _image(first, 0)
        config = aa.LaunchConfig(timeout_us=300_000)  # it fails once its timeout ends
        first.launch_kernel_with_host_args(hang, 1, old, config, image, 8, 0, 0)
        time.sleep(0.05)
        first.destroy_stream_force(old)
        second = open_acl_runtime(0, library_path=build_double().library)
        control.set_next_stream_id(number)
        recycled = second.create_stream()
        log = first._sites.log
        assert log is not None
        first.close()  # the kernel still runs: its fault comes while the close settles
        assert any(report[2] == number for report in log.reports)  # reported, then dropped
        assert second.fault_site() is None
        _launch(second, recycled, "noop", _image(second, 0))
        second.synchronize_stream(recycled, 10_000)
    finally:
        first.close()
        if second is not None:
            second.close()
        control.drop_zombies()


def _fake_log(device: int) -> tuple[ExceptionLog, Callable[[int], None]]:
    """A log, and ``report(stream id)``: the runtime's callback reporting a failed task of
    that stream of ``device``."""
    reported = [0]

    def getter(value: int) -> Any:
        return lambda info: value

    functions = {
        "aclrtGetTaskIdFromExceptionInfo": getter(1),
        "aclrtGetStreamIdFromExceptionInfo": lambda info: reported[0],
        "aclrtGetDeviceIdFromExceptionInfo": getter(device),
        "aclrtGetErrorCodeFromExceptionInfo": getter(507035),
        "aclrtExceptionInfoCallbackRegister": lambda callback: None,
        "aclrtExceptionInfoCallbackUnregister": lambda callback: None,
    }
    log = ExceptionLog(functions, register=True)

    def report(stream_id: int) -> None:
        reported[0] = stream_id
        log.callback(None)

    return log, report


def test_reports_stay_readable_while_closes_drop_others() -> None:
    log, report = _fake_log(1)  # device 1's reports, while device 0's runtimes close
    stop = threading.Event()

    def closing_runtimes() -> None:  # (a drop on another thread than the readers)
        while not stop.is_set():
            log.drop(0, {9: (1, log.mark())})

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    misses = 0
    dropper = threading.Thread(target=closing_runtimes)
    try:
        dropper.start()
        for _ in range(300):
            report(9)
            for _ in range(5):
                if log.site(1, {9: (99, 1)}) is None:
                    misses += 1
    finally:
        stop.set()
        dropper.join()
        sys.setswitchinterval(switch)
    assert misses == 0
    assert [report[0] for report in log.reports] == list(range(1, 301))
    assert log.dropped == []  # (no report of device 0 lay in its spans)


def test_a_drop_run_inside_another_drop_neither_hangs_nor_loses_spans() -> None:
    # a close inside a drop: the garbage collector, run by an allocation there, may run a
    # finalizer that closes another runtime of the library (a pinned array's device)
    log, report = _fake_log(0)
    report(7)  # serial 1
    report(8)  # serial 2
    report(7)  # serial 3, after both closes' spans
    inner: list[int] = []

    class Reentrant(int):
        def __eq__(self, other: object) -> bool:
            if not inner:
                inner.append(1)
                log.drop(0, {8: (1, 3)})
            return int(self) == other

        __hash__ = int.__hash__

    thread = threading.Thread(target=log.drop, args=(0, {Reentrant(7): (1, 3)}), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert sorted(span[1] for span in log.dropped) == [7, 8]
    assert log.site(0, {7: (70, 1)}) == (70, 1)  # its report of serial 3 only


def test_a_report_from_before_a_stream_was_created_is_not_about_it(runtime: AclRuntime) -> None:
    stream = runtime.create_stream()
    number = _stream_number(runtime, stream)
    _launch(runtime, stream, "fault", _image(runtime, 507035))
    with pytest.raises(aa.DeviceFaultError):
        runtime.synchronize_stream(stream, 10_000)
    assert runtime.fault_site() == (stream, 0)
    runtime.destroy_stream_force(stream)
    double_control().set_next_stream_id(number)
    runtime.create_stream()  # the same id, a new stream
    assert runtime.fault_site() is None


def test_the_callback_is_one_of_many_where_the_runtime_allows_it(runtime: AclRuntime) -> None:
    log = runtime._sites.log
    assert log is not None and log.mode == "register"
    seen: list[int] = []
    lib = ctypes.CDLL(str(build_double().library))
    other = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda info: seen.append(1))
    lib.aclrtExceptionInfoCallbackRegister.argtypes = [ctypes.c_void_p]
    lib.aclrtExceptionInfoCallbackUnregister.argtypes = [ctypes.c_void_p]
    assert lib.aclrtExceptionInfoCallbackRegister(other) == 0
    try:
        stream = runtime.create_stream()
        _launch(runtime, stream, "fault", _image(runtime, 507035))
        with pytest.raises(aa.DeviceFaultError):
            runtime.synchronize_stream(stream, 10_000)
        assert seen == [1]  # the other library's callback ran too
        assert runtime.fault_site() is not None  # and ours
    finally:
        assert lib.aclrtExceptionInfoCallbackUnregister(other) == 0


def test_the_process_wide_slot_can_be_left_alone() -> None:
    control = double_control("8.5")
    mark = control.mark()
    rt = open_acl_runtime(0, library_path=build_double("8.5").library, exception_callback=False)
    try:
        assert not control.calls(mark, "aclrtSetExceptionInfoCallback")
    finally:
        rt.close()
    with pytest.raises(TypeError):
        open_acl_runtime(0, library_path=build_double("8.5").library, exception_callback=1)


# --- the entry budget --------------------------------------------------------------------------


def test_the_default_entry_budget_is_below_every_known_queue() -> None:
    from aio_ascend._runtime.abi import ACL_STREAM_CAPACITY

    assert ACL_STREAM_CAPACITY < 1792 < 2013


async def test_a_full_queue_refusal_fails_its_batch_in_order_and_no_other_stream() -> None:
    # Batches of two (+ their event): the sleep's batch and the next fill a queue of six; the
    # third batch's first launch is refused for the full queue. The budget (64) is above the
    # queue on purpose: the runtime's refusal, not admission, is under test.
    control = double_control()
    control.set_max_depth(6)
    control.set_full_refusal(507899)
    try:
        options = {"stream_capacity": 64}
        async with open_backend("acl", batch_cap=2, runtime_options=options) as dev:
            a, b = dev.stream(), dev.stream()
            tasks = [await a.launch(dev.function("sleep"), 1, aa.HostArgs().u32(50_000))]
            tasks += [await a.launch(dev.function("noop"), 1) for _ in range(7)]
            others = [await b.launch(dev.function("noop"), 1) for _ in range(3)]
            results: list[BaseException | None] = []
            for task in tasks:
                try:
                    await task
                    results.append(None)
                except aa.AscendError as exc:
                    results.append(exc)
            assert results[:4] == [None] * 4  # two batches fitted
            for refused, rest in (results[4:6], results[6:8]):  # the next two batches
                # each: its refused launch, then the rest of its batch caused by it, in order
                assert isinstance(refused, aa.RuntimeAPIError) and refused.code == 507899
                assert rest is not None and rest.__cause__ is refused
            for task in others:  # another stream is never affected
                await task
    finally:
        control.set_full_refusal(0)
        control.set_max_depth(2013)


async def test_a_close_forced_by_its_timeout_gives_the_device_moments_not_half_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``aclose(timeout=0.1)`` with a hung kernel: past its deadline already, the close asks
    the device to settle for ``SETTLE_AFTER_FORCE_S`` (10 ms), then leaks; it waited the full
    500 ms on top of the caller's timeout (1.01 s for ``timeout=0.5``). A plain close of a
    device whose forced stream left a hung kernel still waits the 500 ms: no deadline."""
    from aio_ascend._runtime.acl.settle import SETTLE_TIMEOUT_MS
    from aio_ascend._sched.shutdown import SETTLE_AFTER_FORCE_S

    control = double_control()
    for close_forced, waited_ms in ((True, int(SETTLE_AFTER_FORCE_S * 1000)), (False, None)):
        dev = await open_backend("acl").__aenter__()
        s = dev.stream()
        await s.launch(dev.function("hang"), 1)
        await anyio.sleep(0.05)
        if not close_forced:
            await s.aclose(timeout=0.05)  # the device's own close has nothing left to force
        mark = control.mark()
        with caplog.at_level(logging.ERROR, logger="aio_ascend"):
            await dev.aclose(timeout=0.1)
        calls = control.calls(mark, "aclrtSynchronizeDeviceWithTimeout")
        waits = [call.signed(0) for call in calls if call.signed(0) > 1]  # (1 ms: frees' probes)
        assert waits == [waited_ms or SETTLE_TIMEOUT_MS], calls
        control.drop_zombies()
