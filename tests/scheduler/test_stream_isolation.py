"""One stream never costs another: big host copies on one stream hold up no other stream's
submissions or completions; streams dropped without ``aclose()`` are released, and their number
does not weigh on later work."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import pytest
from helpers import OpenDevice, assert_runtime_clean, live_resources, wait_for_live_streams

import aio_ascend as aa
from aio_ascend._errors import MemoryAllocationError
from aio_ascend.testing import inject_hang

#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True
#: bigger than what is staged at hand (1 MiB): the host side goes to a staging thread
BIG = 4 << 20
#: what the slowed host side of one big copy takes (a cold pinned allocation of hundreds of
#: MiB, or its first touch, takes that long)
STALL_S = 0.5


def _p95(values: list[float]) -> float:
    return float(np.percentile(values, 95, method="nearest"))


@pytest.fixture
def slow_big_host_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host-side copy of a big block (staging an upload, unstaging a download) takes
    STALL_S longer: whichever thread does it is held that long."""
    copyto = np.copyto

    def slow(dst: Any, src: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(dst, "nbytes", 0) >= BIG:
            time.sleep(STALL_S)
        copyto(dst, src, *args, **kwargs)

    monkeypatch.setattr(np, "copyto", slow)


def _slow_staging_buffers(dev: aa.Device, stall_s: float) -> Callable[[int], Any]:
    """Make taking the pinned staging buffer of a big copy slow; return the real one."""
    submitter = dev._scheduler._submitter
    acquire: Callable[[int], Any] = submitter._stage

    def slow(nbytes: int) -> Any:
        if nbytes >= BIG:
            time.sleep(stall_s)
        return acquire(nbytes)

    submitter._stage = slow
    return acquire


@pytest.mark.anyio
@pytest.mark.usefixtures("slow_big_host_copies")
async def test_big_copies_on_one_stream_hold_up_no_other_stream(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        copier, other = dev.stream(), dev.stream()
        buf = dev.malloc(BIG)
        src = np.arange(BIG, dtype=np.uint64).astype(np.uint8)
        out = np.zeros(BIG, np.uint8)
        await other.run(noop, 1)
        up = await copier.copy_to_device(buf, src)
        down = await copier.copy_to_host(out, buf)
        tail = await copier.launch(noop, 1)  # behind both, on their stream
        submit: list[float] = []
        wake: list[float] = []
        with anyio.fail_after(30):
            while not tail.done():
                task = await other.launch(noop, 1)
                await task
                assert task.submitted_at is not None and task.completed_at is not None
                assert task.resumed_at is not None
                submit.append(task.submitted_at - task.admitted_at)
                wake.append(task.resumed_at - task.completed_at)
                await anyio.sleep(0.005)
            await tail
        # held up behind the copies, each launch would wait STALL_S (the copies take 2 x
        # STALL_S); each takes ~1 ms instead
        assert len(submit) >= 10
        assert _p95(submit) < STALL_S / 5, sorted(submit)[-5:]
        assert _p95(wake) < STALL_S / 5, sorted(wake)[-5:]
        await up
        assert np.array_equal(out, src)
        assert up.completed_at is not None and down.completed_at is not None
        assert tail.completed_at is not None
        assert up.completed_at <= down.completed_at <= tail.completed_at


def _sleep_args(us: int) -> aa.HostArgs:
    return aa.HostArgs().u32(us)


async def _drop(keep: aa.Stream, doomed: list[aa.Stream]) -> None:
    """Drop the streams of ``doomed`` (the only references) and let the loop side look at what
    was collected (a flush, through another stream's launch)."""
    doomed.clear()
    gc.collect()
    await keep.run(keep.device.function("noop"), 1)


@pytest.mark.anyio
async def test_a_dropped_stream_is_destroyed_after_its_queued_work(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        await keep.run(noop, 1)
        base = live_resources(dev)["streams"]
        doomed = [dev.stream()]
        task = await doomed[0].launch(dev.function("sleep"), 1, _sleep_args(300_000))
        after = await doomed[0].launch(noop, 1)
        with pytest.warns(ResourceWarning, match=r"Stream .* without aclose\(\)"):
            await _drop(keep, doomed)
        # its work is still queued: the runtime stream is still there, closed to nothing else
        assert not after.done()
        assert live_resources(dev)["streams"] == base + 1
        await task
        await after  # the work queued on it completed normally
        assert after.completed_at is not None
        # destroyed in the delivery round that finished its last task (or, when a stall probe
        # of its 300 ms sleep was out then, right after that probe)
        await wait_for_live_streams(dev, base)
        assert dev.stats()["streams"] == 1
        await keep.run(noop, 1)


@pytest.mark.anyio
async def test_an_idle_stream_dropped_on_an_idle_device_is_destroyed_without_more_work(
    open_dev: OpenDevice,
) -> None:
    # its retirement once waited for the next flush or delivery round, which may never come
    async with open_dev() as dev:
        doomed = [dev.stream()]
        streams = dev.stats()["streams"]

        async def drop_and_wait() -> None:
            doomed.clear()
            gc.collect()
            with anyio.fail_after(5):  # a few loop turns are expected
                while dev.stats()["streams"] != streams - 1:  # noqa: ASYNC110 - a counter
                    await anyio.sleep(0.005)

        with pytest.warns(ResourceWarning, match=r"Stream .* without aclose\(\)"):
            await drop_and_wait()


@pytest.mark.anyio
async def test_a_stream_dropped_with_unflushed_work_runs_it_then_goes(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        base = live_resources(dev)["streams"]
        doomed = [dev.stream()]
        tasks = [await doomed[0].launch(noop, 1) for _ in range(5)]
        # dropped in the same loop tick: its requests are not even submitted yet
        with pytest.warns(ResourceWarning, match="without aclose"):
            await _drop(keep, doomed)
        for task in tasks:
            await task
        assert all(task.completed_at is not None for task in tasks)
        await keep.run(noop, 1)
        assert live_resources(dev)["streams"] == base
        assert dev.stats()["streams"] == 1


@pytest.mark.anyio
async def test_closed_and_external_streams_dropped_warn_nothing_and_destroy_nothing_twice(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        # as its owner would: in the device's context (not whatever this thread has current)
        dev.runtime.set_current_context(dev.runtime.context)
        handle = dev.runtime.create_stream()
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                closed = dev.stream()
                await closed.run(noop, 1)
                await closed.aclose()
                external = dev.external_stream(handle)
                await external.run(noop, 1)
                del closed, external
                gc.collect()
                await keep.run(noop, 1)
            assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []
            assert dev.stats()["streams"] == 1  # the external one is let go of ...
            dev.runtime.synchronize_stream(handle, 1000)  # ... and its runtime stream is untouched
            again = dev.external_stream(handle)  # wrapped anew, per request, and dropped
            await again.run(noop, 1)
            del again
            gc.collect()
            again = dev.external_stream(handle)
            await again.aclose()
        finally:
            dev.runtime.destroy_stream(handle)


@pytest.mark.anyio
async def test_the_poller_visits_only_streams_with_work_outstanding(
    open_dev: OpenDevice,
) -> None:
    # Per-launch cost independent of the number of streams ever made: each poll round looks
    # at the streams that have batches outstanding, never at idle or dropped ones.
    async with open_dev() as dev:
        noop = dev.function("noop")
        keep = dev.stream()
        idle = [dev.stream() for _ in range(50)]
        for s in idle:
            await s.run(noop, 1)
        doomed = [dev.stream() for _ in range(200)]
        for index in range(len(doomed)):
            await doomed[index].run(noop, 1)
        with pytest.warns(ResourceWarning):
            await _drop(keep, doomed)
        poller = dev._scheduler._poller
        assert poller._outstanding == {}  # every batch observed: nothing left to visit
        slow = await keep.launch(dev.function("sleep"), 1, _sleep_args(500_000))
        await idle[0].run(noop, 1)
        assert set(poller._outstanding) == {keep.handle}
        await slow
        assert dev.stats()["streams"] == 1 + len(idle)
        assert live_resources(dev)["streams"] == 1 + len(idle)


@pytest.mark.anyio
async def test_big_copies_keep_the_order_of_their_stream(open_dev: OpenDevice) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        a, b = dev.malloc(BIG), dev.malloc(BIG)
        first = np.full(BIG, 1, np.uint8)
        _slow_staging_buffers(dev, 0.2)  # the work queued behind it must wait for it
        tasks = [
            await s.copy_to_device(a, first),
            await s.copy_to_device(a[:4096], np.full(4096, 2, np.uint8)),  # after the big one
            await s.copy_device(b, a),
            await s.memset(a[4096:8192], 3),
            await s.copy_to_device(b[8192:], np.full(BIG - 8192, 4, np.uint8)),  # big again
        ]
        small = np.empty(4096, np.uint8)
        big_out = np.empty(BIG, np.uint8)
        down = await s.copy_to_host(big_out, b)
        after = await s.copy_to_host(small, a[:4096])  # a small download behind a big one
        await after
        assert down.done() and all(task.done() for task in tasks)
        for task in [*tasks, down]:
            await task
        expected = np.full(BIG, 4, np.uint8)
        expected[:4096] = 2
        expected[4096:8192] = 1
        assert np.array_equal(big_out, expected)
        assert (small == 2).all()
        assert np.array_equal(await s.download(a[4096:8192]), np.full(4096, 3, np.uint8))


@pytest.mark.anyio
async def test_a_big_copy_whose_staging_buffer_is_refused_fails_with_its_stream_rest(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        noop = dev.function("noop")
        s, other = dev.stream(), dev.stream()
        buf = dev.malloc(BIG)
        submitter = dev._scheduler._submitter
        acquire = submitter._stage
        refusal = MemoryAllocationError("no pinned memory left", code=207001)

        def refuse(nbytes: int) -> Any:
            if nbytes >= BIG:
                raise refusal
            return acquire(nbytes)

        submitter._stage = refuse
        up = await s.copy_to_device(buf, np.ones(BIG, np.uint8))
        behind = await s.launch(noop, 1)
        await other.run(noop, 1)
        with pytest.raises(MemoryAllocationError) as caught:
            await up
        assert caught.value is refusal
        with pytest.raises(aa.AscendError) as caught:
            await behind
        assert caught.value.__cause__ is refusal
        assert dev.fault is None
        submitter._stage = acquire
        await s.upload(buf, np.ones(BIG, np.uint8))  # the stream goes on
        assert (await s.download(buf) == 1).all()
        stats = dev.stats()
        assert stats["host_buffers_in_use"] == 0


@pytest.mark.anyio
async def test_a_big_copy_staged_past_its_deadline_is_never_submitted(
    open_dev: OpenDevice,
) -> None:
    async with open_dev(task_timeout=0.2) as dev:
        s = dev.stream()
        buf = dev.malloc(BIG)
        await s.memset(buf, 9)
        acquire = _slow_staging_buffers(dev, 0.5)
        up = await s.copy_to_device(buf, np.zeros(BIG, np.uint8))
        behind = await s.memset(buf[:16], 5)
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
            await up
        with pytest.raises(aa.TaskTimeoutError):
            await behind
        dev._scheduler._submitter._stage = acquire
        # neither reached the device (a small download: a big one would wait for the staging
        # thread, still in the slowed call, and could pass its own deadline behind it)
        assert (await s.download(buf, np.uint8, 1024) == 9).all()


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["staging", "unstaging"])
async def test_a_forced_close_during_a_big_copys_host_side_leaves_nothing(
    open_dev: OpenDevice, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    copyto = np.copyto
    started = threading.Event()

    def slow(dst: Any, src: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(dst, "nbytes", 0) >= BIG:
            started.set()
            time.sleep(0.3)
        copyto(dst, src, *args, **kwargs)

    dev = await open_dev()
    s = dev.stream()
    buf = dev.malloc(BIG)
    out = np.zeros(BIG, np.uint8)
    if where == "unstaging":
        await s.upload(buf, np.full(BIG, 1, np.uint8))
    monkeypatch.setattr(np, "copyto", slow)
    if where == "staging":
        task = await s.copy_to_device(buf, np.full(BIG, 1, np.uint8))
    else:
        task = await s.copy_to_host(out, buf)
    behind = await s.launch(dev.function("noop"), 1)
    with anyio.fail_after(10):
        assert await anyio.to_thread.run_sync(started.wait, 5)
        await dev.aclose(timeout=0.01)
    assert task.done() and behind.done()
    if where == "unstaging" and task.exception() is not None:
        assert not out.any(), "a failed download wrote into the user's array"
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_cancelling_the_wait_for_a_big_copy_releases_nothing_early(
    open_dev: OpenDevice,
) -> None:
    async with open_dev() as dev:
        s = dev.stream()
        buf = dev.malloc(BIG)
        src = np.full(BIG, 6, np.uint8)
        acquire = _slow_staging_buffers(dev, 0.3)
        with anyio.move_on_after(0.05) as scope:
            await s.upload(buf, src)  # cancelled while its staging buffer is being taken
        assert scope.cancelled_caught
        del src  # the request holds what it needs
        gc.collect()
        await s.synchronize()  # the upload still ran, whole
        dev._scheduler._submitter._stage = acquire
        assert (await s.download(buf) == 6).all()
        assert dev.stats()["host_buffers_in_use"] == 0


@pytest.mark.anyio
async def test_a_stream_forced_while_parked_behind_a_big_copy_is_never_touched_again(
    open_dev: OpenDevice,
) -> None:
    """The batch a stream had open when its big copy parked it is carried until the copy is
    staged. Destroyed by force meanwhile, the stream is gone when the staging report comes
    back: its carried batch must fail as the forced close's, with no event recorded on the
    destroyed stream (a dangling handle on a real runtime), and its other streams go on."""
    async with open_dev() as dev:
        noop = dev.function("noop")
        s, other = dev.stream(), dev.stream()
        buf = dev.malloc(BIG)
        acquire = _slow_staging_buffers(dev, 0.5)
        runtime = dev._scheduler._submitter._runtime
        record = runtime.record_event
        destroyed: set[int] = set()
        touched: list[int] = []

        def record_checked(event: int, stream: int) -> None:
            if stream in destroyed:
                touched.append(stream)
            record(event, stream)

        destroy = runtime.destroy_stream_force

        def destroy_noted(stream: int) -> None:
            destroyed.add(stream)
            destroy(stream)

        runtime.record_event = record_checked  # type: ignore[method-assign]
        runtime.destroy_stream_force = destroy_noted  # type: ignore[method-assign]
        carried = await s.launch(noop, 1)  # same hop as the copy: its open batch is carried
        up = await s.copy_to_device(buf, np.ones(BIG, np.uint8))
        behind = await s.launch(noop, 1)
        with anyio.fail_after(10):
            await s.aclose(timeout=0.01)  # forced while the copy is still being staged
            for task in (carried, up, behind):
                with pytest.raises(aa.TaskTimeoutError):
                    await task
            await anyio.sleep(0.6)  # the staging report has come back by now
            await other.run(noop, 1)
        assert touched == []
        assert dev._scheduler._submitter._caught == []
        dev._scheduler._submitter._stage = acquire


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["wait_stream", "wait_event"])
@pytest.mark.parametrize("big", ["upload", "download"])
async def test_a_wait_on_a_stream_parked_behind_a_big_copy_still_waits(
    open_dev: OpenDevice, how: str, big: str
) -> None:
    """s1 is parked while its big copy is staged; a small copy queued behind it, then s2
    waits for s1 and reads what the small copy wrote. The wait was submitted at once, before
    s1's record (still parked): an event never recorded reads complete, so s2's kernel read
    the buffer before the copy (the sim's poison, nearly every time)."""
    async with open_dev() as dev:
        s1, s2 = dev.stream(), dev.stream()
        add = dev.function("vector_add")
        big_buf = dev.malloc(BIG)
        n = 256
        x = np.arange(n, dtype=np.float32)
        bx, bz = dev.malloc(n * 4), dev.malloc(n * 4)
        acquire = _slow_staging_buffers(dev, 0.3)
        try:
            if big == "upload":
                bulk = await s1.copy_to_device(big_buf, np.zeros(BIG, np.uint8))
            else:
                bulk = await s1.copy_to_host(np.empty(BIG, np.uint8), big_buf)
            copied = await s1.copy_to_device(bx, x)  # parked behind the big copy
            if how == "wait_stream":
                await s2.wait_stream(s1)
            else:
                await s2.wait_event(await s1.record_event())
            await s2.launch(add, 2, aa.HostArgs().ptr(bx).ptr(bx).ptr(bz).u32(n))
            with anyio.fail_after(10):
                z = await s2.download(bz, np.float32, n)
                await bulk
                await copied
        finally:
            dev._scheduler._submitter._stage = acquire
        np.testing.assert_array_equal(z, x + x)


@pytest.mark.backends("sim", "acl", "realrt")
@pytest.mark.anyio
async def test_a_wait_on_an_event_a_forced_close_dropped_fails_at_once_and_says_why(
    open_dev: OpenDevice,
) -> None:
    """s2 waits on an event s1 was to record behind a long kernel; s1 is closed by force
    before the record ran. The event may never complete, so s2's work behind the wait fails
    now (not at task_timeout) naming the dropped record, a new wait on that event is refused,
    and the other streams go on."""
    async with open_dev(task_timeout=30.0) as dev:
        noop = dev.function("noop")
        s1, s2, other = dev.stream(), dev.stream(), dev.stream()
        long = await s1.launch(dev.function("sleep"), 1, aa.HostArgs().u32(3_000_000))  # 3 s
        ev = await s1.record_event()
        waited = await s2.wait_event(ev)
        behind = await s2.launch(noop, 1)
        await anyio.sleep(0.05)  # s2's batch has reached the poller
        with anyio.fail_after(3):  # a tenth of task_timeout: not the watchdog's doing
            await s1.aclose(timeout=0.05)
            for task in (long, ev):
                with pytest.raises(aa.TaskTimeoutError, match="aclose"):
                    await task
            for task in (waited, behind):
                with pytest.raises(aa.TaskTimeoutError, match="forced close of another stream"):
                    await task
            again = await other.wait_event(ev)
            with pytest.raises(aa.TaskTimeoutError, match="never recorded") as refused:
                await again
            assert "dropped by the forced close" in str(refused.value.__cause__)
            await other.run(noop, 1)
        await s2.aclose(timeout=0.05)  # blocked on the device: destroyed by force
        await other.aclose()


@pytest.mark.backends("sim", "acl", "realrt")
@pytest.mark.anyio
async def test_a_stream_stranded_by_another_streams_forced_close_refuses_new_work(
    open_dev: OpenDevice,
) -> None:
    """s2 waits for an event s1 (hung) was to record; s1 is closed by force. s2 can run
    nothing more: a launch on it is refused in the call, saying why (before: accepted, never
    run, and the device's plain close then waited task_timeout for it), one made while the
    force is under way fails at once either way, and s2's plain close and the device's return
    at once, leaving nothing behind."""
    dev = await open_dev(task_timeout=30.0)
    noop = dev.function("noop")
    s1, s2, other = dev.stream(), dev.stream(), dev.stream()
    await inject_hang(s1)
    ev = await s1.record_event()
    await s2.wait_event(ev)
    await anyio.sleep(0.05)  # s2's batch has reached the poller
    racing: list[BaseException | None] = []

    async def launch_during_the_force() -> None:
        while not s1._lane.forced:  # the close has sent the force on its way
            await anyio.lowlevel.checkpoint()
        try:
            task = await s2.launch(noop, 1)
        except aa.TaskTimeoutError as exc:  # stranded already: refused in the call
            racing.append(exc)
            return
        racing.append(await task.wait_finished() or task.exception())

    with anyio.fail_after(3):  # a tenth of task_timeout: not the watchdog's doing
        async with anyio.create_task_group() as tg:
            tg.start_soon(launch_during_the_force)
            await s1.aclose(timeout=0.05)
        assert isinstance(racing[0], aa.TaskTimeoutError), racing
        with pytest.raises(aa.TaskTimeoutError, match="can run nothing more") as refused:
            await s2.launch(noop, 1)
        assert "forced close of another stream" in str(refused.value.__cause__)
        with pytest.raises(aa.TaskTimeoutError, match="can run nothing more"):
            await s2.copy_to_device(dev.malloc(64), np.ones(16, np.float32))
        await other.run(noop, 1)  # the other streams go on
        await s2.aclose()
        await dev.aclose()
    assert_runtime_clean(dev)


@pytest.mark.backends("sim", "acl", "realrt")
@pytest.mark.anyio
@pytest.mark.parametrize("links", [2, 3])
async def test_streams_down_a_chain_of_waits_from_a_forced_stream_are_stranded_too(
    open_dev: OpenDevice, links: int
) -> None:
    """s0 (hung) -> s1 -> s2 (-> s3): each waits for an event the one before records after
    that wait. s0 is closed by force before its record ran, so no record down the chain can
    run either: every stream of it fails its queued work at once and refuses new work, a
    wait on any of their events made afterwards is refused at once, and their plain closes,
    and the device's, return at once (before: only s1 was stranded; s2's work, its close and
    the device's close waited for task_timeout)."""
    dev = await open_dev(task_timeout=30.0)
    noop = dev.function("noop")
    chain = [dev.stream() for _ in range(links + 1)]
    other = dev.stream()
    await inject_hang(chain[0])
    events, behind = [], []
    for before, after in itertools.pairwise(chain):
        events.append(await before.record_event())
        await after.wait_event(events[-1])
        behind.append(await after.launch(noop, 1))
    events.append(await chain[-1].record_event())
    await anyio.sleep(0.05)  # the batches have reached the poller
    with anyio.fail_after(3):  # a tenth of task_timeout: not the watchdog's doing
        await chain[0].aclose(timeout=0.05)
        for task in behind:
            with pytest.raises(aa.TaskTimeoutError, match="forced close of another stream"):
                await task
        for stream in chain[1:]:
            with pytest.raises(aa.TaskTimeoutError, match="can run nothing more"):
                await stream.launch(noop, 1)
        for event in events[1:]:  # recorded behind a wait that never ends: lost too
            late = await other.wait_event(event)
            with pytest.raises(aa.TaskTimeoutError, match="never recorded") as refused:
                await late
            assert "will not run" in str(refused.value.__cause__)
        await other.run(noop, 1)  # the waits were refused, not submitted: it goes on
        for stream in chain[1:]:
            await stream.aclose()
        await dev.aclose()
    assert_runtime_clean(dev)


@pytest.mark.anyio
async def test_a_wait_on_an_event_whose_record_a_cancelling_close_dropped_is_refused(
    open_dev: OpenDevice,
) -> None:
    """s1's upload and event record are still pending when s1 closes with ``cancel=True``:
    neither reaches the device. s2's wait on that event, queued in the same tick, is refused
    saying why (before: it passed, the event never having been recorded, and s2's copy read
    the stale buffer), s2's copy behind it never runs, a new wait on the event is refused too,
    and s2 goes on."""
    async with open_dev() as dev:
        s1, s2 = dev.stream(), dev.stream()
        x, y = dev.malloc(256), dev.malloc(256)
        await (await s2.copy_to_device(x, np.zeros(64, np.float32)))
        await (await s2.copy_to_device(y, np.zeros(64, np.float32)))
        up = await s1.copy_to_device(x, np.ones(64, np.float32))
        ev = await s1.record_event()
        waited = await s2.wait_event(ev)
        dependent = await s2.copy_device(y, x)
        await s1.aclose(cancel=True)
        with anyio.fail_after(10):
            for task in (up, ev):
                with pytest.raises(aa.ClosedError, match="cancel=True"):
                    await task
            with pytest.raises(aa.ClosedError, match="never recorded") as refused:
                await waited
            assert "dropped by Stream.aclose(cancel=True)" in str(refused.value.__cause__)
            with pytest.raises(aa.AscendError):
                await dependent
            again = await s2.wait_event(ev)
            with pytest.raises(aa.ClosedError, match="never recorded"):
                await again
            out = np.full(64, 7.0, np.float32)
            await (await s2.copy_to_host(out, y))
        assert (out == 0).all()  # y kept its own bytes: the dependent copy never ran
    assert_runtime_clean(dev)


@pytest.mark.backends("sim", "acl")
@pytest.mark.anyio
async def test_a_wait_on_an_event_whose_record_the_watchdog_expired_unsubmitted_is_refused(
    open_dev: OpenDevice, device_backend: str
) -> None:
    """The submitter is stuck in a launch on s0 (the runtime's queue is shallower than the
    library believes): s1's event record waits past task_timeout and is failed unsubmitted by
    the watchdog. Once the submitter moves again, a wait on that event is refused (before: it
    passed, the event never having been recorded)."""
    dev = await open_dev(task_timeout=0.5)

    def set_depth(depth: int) -> None:
        if device_backend == "acl":
            from doubles.acl_double import double_control

            double_control().set_max_depth(depth)
        else:
            dev.runtime.max_queue_depth = depth

    set_depth(4)
    dev.runtime.stream_capacity = 1000
    try:
        s0, s1, s2 = dev.stream(), dev.stream(), dev.stream()
        noop = dev.function("noop")
        hung = await s0.launch(dev.function("hang"), 1)
        for _ in range(8):  # the 4th entry fills the runtime's queue: the submitter blocks
            await s0.launch(noop, 1)
        await anyio.sleep(0.05)
        ev = await s1.record_event()
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError, match="not submitted"):
            await ev
        set_depth(2013 if device_backend == "acl" else 1 << 20)  # the submitter moves on
        again = await s2.wait_event(ev)
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError, match="never recorded"):
            await again
        await (await s2.launch(noop, 1))
        with pytest.raises(aa.TaskTimeoutError):  # the watchdog's too, still on the device
            await hung
    finally:
        set_depth(2013 if device_backend == "acl" else 1 << 20)
        with anyio.fail_after(20):
            await dev.aclose(timeout=0.2)


@pytest.mark.backends("sim", "acl")
@pytest.mark.anyio
async def test_a_wait_parked_as_the_watchdog_fails_its_record_is_never_parked_for_good(
    open_dev: OpenDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog (the poller's thread) fails a record whose hop the submitter reached too
    late, while the submitter, taking the next hop, finds the record still pending and parks
    the wait's stream: registered after the poller had looked, the stream was never resumed
    (the wait, and a close without a timeout, never ended). Delays force that interleaving."""
    from aio_ascend._sched.work import RecordEvent, WaitEvent

    async with open_dev(task_timeout=0.3) as dev:
        s1, s2 = dev.stream(), dev.stream()
        submitter = dev._scheduler._submitter
        runtime = submitter._runtime
        record, late = runtime.record_event, [True]

        def late_record(event: int, stream: int) -> None:
            if late:  # the first hop's batch event: a slow runtime call, the submitter is late
                late.clear()
                time.sleep(0.5)
            record(event, stream)

        pending = WaitEvent.record_pending

        def slow_pending(wait: WaitEvent) -> bool:
            still = pending(wait)
            if still:
                time.sleep(0.2)  # the poller fails the record meanwhile
            return still

        refused = RecordEvent.on_refused

        def slow_refusal(record: RecordEvent, exc: BaseException) -> None:
            if threading.current_thread().name.startswith("aio_ascend-poll"):
                time.sleep(0.25)
            refused(record, exc)

        monkeypatch.setattr(runtime, "record_event", late_record)
        monkeypatch.setattr(WaitEvent, "record_pending", slow_pending)
        monkeypatch.setattr(RecordEvent, "on_refused", slow_refusal)
        await dev.stream().launch(dev.function("noop"), 1)  # the hop the submitter is late on
        await anyio.sleep(0.01)
        event = await s1.record_event()
        await anyio.sleep(0.25)
        wait = await s2.wait_event(event)
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
            await wait  # (expected ~0.5 s: its record was never made)
        assert submitter._blocked == {}
        assert submitter._parked == {}
