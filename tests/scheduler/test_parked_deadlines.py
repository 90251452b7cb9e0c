"""A stream parked in the submitter (behind a big copy's staging, or at a wait for a record
parked on another stream) is still bound by ``task_timeout``: its requests end by their
deadlines even when the report that would resume it never comes, the streams go on, and what
the host side may still touch is kept until it is done."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import OpenDevice, assert_runtime_clean, refuse_big_staging

import aio_ascend as aa
from aio_ascend._errors import MemoryAllocationError
from aio_ascend._sched.hooks import HOOKS
from aio_ascend._sched.submitter import Submitter

#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True
#: bigger than what is staged at hand (1 MiB): the host side goes to the staging thread
BIG = 4 << 20
TIMEOUT_S = 0.3


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set at the end of the test whatever happened: a hung staging call lets go then."""
    event = threading.Event()
    yield event
    event.set()


def _hang_staging(dev: aa.Device, released: threading.Event) -> Callable[[int], Any]:
    """A big copy's staging takes its pinned buffer, then hangs until ``released``."""
    submitter = dev._scheduler._submitter
    acquire: Callable[[int], Any] = submitter._stage

    def hung(nbytes: int) -> Any:
        host = acquire(nbytes)
        if nbytes >= BIG:
            released.wait(60)
        return host

    submitter._stage = hung
    return acquire


async def _times_out(task: Any, match: str | None = None) -> None:
    """``task`` fails with TaskTimeoutError (by its deadline: allowed 10 s)."""
    with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError, match=match):
        await task


async def _release_staging(dev: aa.Device, released: threading.Event) -> None:
    """Let the hung staging call return; wait until what the copy held is given back."""
    released.set()
    with anyio.fail_after(10):
        while dev.stats()["host_buffers_in_use"]:  # noqa: ASYNC110 - another thread's count
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_a_hung_staging_fails_its_stream_by_the_deadline_and_both_streams_go_on(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """The copy, the request behind it, the record behind that and another stream's wait
    for the record all fail with TaskTimeoutError (~0.3 s; before, all four waited for
    good, and so did ``aclose()``); then both streams take new work."""
    async with open_dev(task_timeout=TIMEOUT_S) as dev:
        s1, s2 = dev.stream(), dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        await (await s1.memset(buf, 9))
        _hang_staging(dev, released)
        up = await s1.copy_to_device(buf, np.zeros(BIG, np.uint8))
        behind = await s1.memset(small, 5)
        record = await s1.record_event()
        waited = await s2.wait_event(record)
        for task in (up, behind, record, waited):
            await _times_out(task)
        assert dev.stats()["timeouts"] == 4
        # the copy never reached the device (a small download: a big one is staged too)
        assert (await s1.download(buf, np.uint8, 1024) == 9).all()
        await (await s2.launch(dev.function("noop"), 1))
        # the staging thread still has the copy's pinned buffer: not given back under it
        assert dev.stats()["host_buffers_in_use"] == 1
        await _release_staging(dev, released)
        buf.free()  # nothing uses it any more: freed at once
        assert dev.stats()["device_buffers"] == 1
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_a_stream_parked_behind_a_hung_staging_takes_work_again_from_its_next_hop(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """Work queued on the stream after the deadline passed is submitted in order (its own
    deadline is later), and a second big copy, staged behind the hung one, fails by its own."""
    async with open_dev(task_timeout=TIMEOUT_S) as dev:
        s = dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        _hang_staging(dev, released)
        first = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        await _times_out(first)
        second = await s.copy_to_device(buf, np.ones(BIG, np.uint8))  # (queued behind it)
        after = await s.memset(small, 7)
        await _times_out(second)
        await _times_out(after)  # same hop as the copy it was parked behind
        await s.memset(small, 3)
        assert (await s.download(small) == 3).all()
        await _release_staging(dev, released)
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_a_wait_whose_record_never_resumes_it_fails_by_its_deadline(
    open_dev: OpenDevice, released: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the record's outcome never reach the parked wait (no report at all), the wait
    still fails by its deadline and its stream goes on; the record's late report changes
    nothing."""
    monkeypatch.setattr(Submitter, "_unblock", lambda self, event: None)
    async with open_dev(task_timeout=TIMEOUT_S) as dev:
        s1, s2 = dev.stream(), dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        _hang_staging(dev, released)
        up = await s1.copy_to_device(buf, np.zeros(BIG, np.uint8))
        waited = await s2.wait_event(await s1.record_event())
        await _times_out(waited, match="not recorded")
        await s2.memset(small, 4)
        assert (await s2.download(small) == 4).all()
        with pytest.raises(aa.TaskTimeoutError):
            await up
        assert dev._scheduler._submitter._blocked == {}
        await _release_staging(dev, released)
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_a_close_with_a_staging_hung_for_good_returns_and_names_the_thread(
    open_dev: OpenDevice, released: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    """A staging call that never returns cannot be interrupted: the close gives up on it
    after its join timeout (2 s; allowed 10x), leaks rather than free under it, and says
    which thread it left."""
    dev = await open_dev(task_timeout=TIMEOUT_S)
    try:
        s = dev.stream()
        buf = dev.malloc(BIG)
        _hang_staging(dev, released)
        up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        await _times_out(up)
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(20):
            await dev.aclose()
        assert any("aio_ascend-stage-" in r.getMessage() for r in caplog.records), caplog.records
    finally:
        # let the staging call return, and wait for the threads the close left and for its
        # closer, which closes the runtime once they have exited (so does this, idempotent)
        released.set()
        for thread in threading.enumerate():
            if thread.name.startswith(
                ("aio_ascend-submit", "aio_ascend-stage", "aio_ascend-close")
            ):
                thread.join(10)
        dev.runtime.close()


@pytest.mark.anyio
async def test_a_copy_given_up_on_is_released_and_told_once_when_the_close_meets_its_report(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """The staging call returns while the close waits for the submitter: the copy's report is
    left in the inbox, so the close releases what the copy held, and resolves it again as a
    leftover; observers were told of it when it failed, and are not told a second time."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from aio_ascend import metrics

    registry = prometheus_client.CollectorRegistry()
    collector = metrics.PrometheusMetrics(registry=registry)
    with collector:
        async with open_dev(task_timeout=TIMEOUT_S) as dev:
            s = dev.stream()
            buf = dev.malloc(BIG)
            _hang_staging(dev, released)
            up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
            await _times_out(up)
            threading.Timer(0.3, released.set).start()  # during the close's wait
            with anyio.fail_after(20):
                await dev.aclose()
        assert_runtime_clean(dev)
    text = prometheus_client.generate_latest(registry).decode()
    failures = [
        line
        for line in text.splitlines()
        if line.startswith("aio_ascend_task_failures_total{") and "copy_to_device" in line
    ]
    assert len(failures) == 1 and failures[0].endswith(" 1.0"), failures
    collector.close()


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["refused", "hung"])
async def test_the_batch_a_stream_had_open_when_it_parked_keeps_its_deadline(
    open_dev: OpenDevice, released: threading.Event, how: str
) -> None:
    """A 300 ms kernel queued just before a big copy is in the batch the stream carries while
    parked. Once the copy's staging failed (refused, or past its deadline) and nothing else was
    parked behind it, that batch was given no deadline at all: the watchdog failed the kernel
    as soon as it looked, with task_timeout=5 s."""
    timeout = 5.0 if how == "refused" else 1.0
    async with open_dev(task_timeout=timeout) as dev:
        s = dev.stream()
        buf = dev.malloc(BIG)
        if how == "refused":
            refuse_big_staging(dev, BIG)
        else:
            _hang_staging(dev, released)
        slow = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(300))
        up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        with anyio.fail_after(10), pytest.raises((MemoryAllocationError, aa.TaskTimeoutError)):
            await up
        with anyio.fail_after(10):
            await slow  # (finished 300 ms after it was queued)
        await _release_staging(dev, released)
    assert_runtime_clean(dev)


@pytest.mark.anyio
@pytest.mark.parametrize("holder", ["copy", "wait"])
async def test_a_forced_close_of_a_parked_stream_returns_by_its_own_timeout(
    open_dev: OpenDevice, released: threading.Event, holder: str
) -> None:
    """``stream.aclose(timeout=0.1)`` of a stream parked behind a hung staging (or at a wait
    for a record parked behind one) returned only at the parked request's deadline (here
    30 s; 600 s by default): the forced stream's parked requests still waited for a report
    that no longer mattered."""
    async with open_dev(task_timeout=30.0) as dev:
        s1, s2 = dev.stream(), dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        _hang_staging(dev, released)
        up = await s1.copy_to_device(buf, np.zeros(BIG, np.uint8))
        closing, parked_at = s1, up
        if holder == "wait":
            closing = s2
            parked_at = await s2.wait_event(await s1.record_event())
        behind = await closing.memset(small, 5)
        await anyio.sleep(0.1)  # (parked by now)
        # expected ~0.15 s (allowed 10x); it took 2.1 s once the parked request failed at
        # once: the close then waited 2 s for the given-up copy's slot. (Measured: a close's
        # forcing is shielded, so fail_after could not cut it short.)
        started = time.monotonic()
        await closing.aclose(timeout=0.1)
        assert time.monotonic() - started < 1.5
        for task in (parked_at, behind):
            with anyio.fail_after(1), pytest.raises(aa.TaskTimeoutError, match="aclose"):
                await task
        assert dev.stats()["host_buffers_in_use"] == 1  # (until the staging call returns)
        await _release_staging(dev, released)
        await dev.aclose(timeout=0.1)
    assert_runtime_clean(dev)


class _ToldOfCopies:
    """An observer (metrics, tracing) noting each delivery of a big upload it is told of."""

    wants_capture = False

    def __init__(self) -> None:
        self.told: list[tuple[Any, str]] = []

    def capture(self) -> object:
        return None

    def resumed(self, task: Any) -> None:
        pass

    def delivered(self, source: Any, items: Any) -> None:
        self.told += [(o, repr(e)) for r, e, o in items if r.kind == "copy_to_device"]


@pytest.mark.anyio
async def test_a_copy_given_up_while_the_device_close_forces_is_told_once(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """s2's copy passes its deadline while the submitter is stuck in a call on s1 and the
    device's close forces: its failure is held back by the forcing close and resolved there;
    the close also took it back as a leftover and resolved it again (observers told twice)."""
    dev = await open_dev(task_timeout=TIMEOUT_S)
    scheduler = dev._scheduler
    runtime = scheduler._submitter._runtime
    memset = runtime.memset_async
    unstuck = threading.Event()

    def stuck_memset(*args: Any) -> Any:
        unstuck.wait(30)
        return memset(*args)

    def let_go_once_forcing() -> None:
        while not scheduler._posting.holding and not unstuck.is_set():
            time.sleep(0.001)
        unstuck.set()
        released.set()

    runtime.memset_async = stuck_memset
    threading.Thread(target=let_go_once_forcing, daemon=True).start()
    told = _ToldOfCopies()
    try:
        s1, s2 = dev.stream(), dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        _hang_staging(dev, released)
        up = await s2.copy_to_device(buf, np.zeros(BIG, np.uint8))
        await anyio.sleep(0.05)  # (s2 parked)
        await s1.memset(small, 1)  # the submitter is stuck in this hop
        await anyio.sleep(TIMEOUT_S + 0.2)  # s2's copy passes its deadline meanwhile
        HOOKS.add(told)
        with anyio.fail_after(20):
            await dev.aclose(timeout=0.1)
        await _times_out(up)
        assert len(told.told) == 1, told.told
    finally:
        HOOKS.remove(told)
        unstuck.set()


@pytest.mark.anyio
async def test_a_forced_close_after_the_copy_timed_out_returns_by_its_own_timeout(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """The copy had already failed by its deadline (its slot kept for the late report) when
    the stream's close forced it: nothing gave the slot back on the force, and the close
    waited 2 s for it (measured: a close's forcing is shielded). The slot goes back once."""
    async with open_dev(task_timeout=TIMEOUT_S) as dev:
        s = dev.stream()
        buf = dev.malloc(BIG)
        _hang_staging(dev, released)
        await _times_out(await s.copy_to_device(buf, np.zeros(BIG, np.uint8)))
        started = time.monotonic()
        await s.aclose(timeout=0.1)
        assert time.monotonic() - started < 1.5  # (expected ~0.15 s: allowed 10x)
        assert dev.stats()["host_buffers_in_use"] == 1  # (still the staging thread's)
        await _release_staging(dev, released)
        assert dev.stats()["in_flight"] == 0
    assert_runtime_clean(dev)


@pytest.mark.anyio
@pytest.mark.parametrize("report", ["handled", "left in the inbox"])
async def test_a_device_close_after_a_forced_stream_gave_up_its_copy(
    open_dev: OpenDevice, released: threading.Event, report: str
) -> None:
    """The copy's buffer is given back once, whether its late report was handled before the
    device's close or is still in the submitter's inbox when the close takes over."""
    async with open_dev(task_timeout=30.0) as dev:
        s = dev.stream()
        buf = dev.malloc(BIG)
        _hang_staging(dev, released)
        up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        await anyio.sleep(0.1)  # (parked by now)
        await s.aclose(timeout=0.1)
        await _times_out(up, match="aclose")
        if report == "handled":
            await _release_staging(dev, released)
        else:
            threading.Timer(0.3, released.set).start()  # during the close's wait
        with anyio.fail_after(20):
            await dev.aclose()
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_a_defect_while_a_parked_stream_resumes_fails_its_requests_and_the_thread_goes_on(
    open_dev: OpenDevice, released: threading.Event
) -> None:
    """A Python exception of ours in the middle of a resume (here: reading the runtime's task
    id after submitting what was parked) fails the stream's parked requests with InternalError
    instead of killing the submitter thread (every later request of the device would have
    waited for good)."""
    async with open_dev(task_timeout=30) as dev:
        s = dev.stream()
        buf, small = dev.malloc(BIG), dev.malloc(16)
        _hang_staging(dev, released)
        submitter = dev._scheduler._submitter
        up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        behind = await s.memset(small, 5)
        with anyio.fail_after(10):
            while not submitter._parked:  # noqa: ASYNC110 - another thread's state
                await anyio.sleep(0.005)

        runtime = dev.runtime
        task_id = runtime.last_task_id

        def defect() -> int | None:
            if threading.current_thread().name.startswith("aio_ascend-submit"):
                raise RuntimeError("a defect of ours")
            return task_id()

        runtime.last_task_id = defect  # (the submitter's methods are read-only when compiled)
        released.set()
        for task in (up, behind):
            with anyio.fail_after(10), pytest.raises(aa.InternalError, match="RuntimeError") as e:
                await task
            assert str(e.value.__cause__) == "a defect of ours"
        runtime.last_task_id = task_id
        assert submitter.thread.is_alive()
        await (await s.memset(small, 3))
        assert (await s.download(small) == 3).all()
    assert_runtime_clean(dev)
