"""Every wait bounded, and one stream never blocks another (regressions of a new user's tries).

Each test runs on the sim and the acl C double, on asyncio, uvloop and trio (``open_dev``).
Time bounds here are liveness bounds: at least 10x the expected time.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from helpers import OpenDevice, assert_runtime_clean, live_resources

import aio_ascend as aa
from aio_ascend import testing

pytestmark = pytest.mark.anyio
#: the open_dev tests also run on realrt (tests/conftest.py)
REALRT_TOO = True


async def _round_trips(dev: Any, stream: aa.Stream, count: int) -> list[float]:
    noop = dev.function("noop")
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        with anyio.fail_after(2):  # expected well under 5 ms
            await (await stream.launch(noop, 1))
        times.append(time.perf_counter() - t0)
    return sorted(times)


async def test_a_saturated_hung_stream_never_stalls_another(open_dev: OpenDevice) -> None:
    # before: 1,024 one-per-tick requests behind a hung kernel made ~2,047 runtime queue
    # entries; the submitter blocked inside a launch on the full stream and every other
    # stream stopped (a noop on another stream was still pending after 8 s).
    async with open_dev(task_timeout=60) as dev:
        a, b = dev.stream(), dev.stream()
        capacity = dev.runtime.stream_capacity
        await a.launch(dev.function("hang"), 1)
        admitted = 0

        async def fill() -> None:
            nonlocal admitted
            noop = dev.function("noop")
            for _ in range(1500):
                await a.launch(noop, 1)
                admitted += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(fill)
            with anyio.fail_after(20):  # until the filler waits in admission
                last = -1
                while admitted != last:
                    last = admitted
                    await anyio.sleep(0.2)
            # each request takes an entry, each batch one more: the stream stops below capacity
            assert admitted < 1500
            assert a._lane.admission.entries <= capacity
            assert a.in_flight == admitted + 1
            times = await _round_trips(dev, b, 50)
            tg.cancel_scope.cancel()
        print(
            f"[figures] saturated neighbour: admitted={admitted} round trip p50="
            f"{times[25] * 1e3:.3f} ms max={times[-1] * 1e3:.3f} ms"
        )
        with anyio.fail_after(10):
            await dev.aclose(cancel=True, timeout=0.2)
    assert_runtime_clean(dev)


async def test_a_hop_that_waits_past_its_deadline_is_never_submitted(
    open_dev: OpenDevice, device_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The runtime believes a stream holds more than it does (a mismatch the library cannot
    # see): the submitter blocks in a launch; the requests queued behind it fail with
    # TaskTimeoutError by the watchdog and never reach the runtime afterwards. The close then
    # finds the submitter stuck: it returns on time and never destroys the stream the
    # submitter waits on (the real runtime would free it under that thread: a crash).
    if device_backend == "realrt":
        pytest.skip("needs a runtime queue depth of 4: a control of the C double and the sim")
    dev = await open_dev(task_timeout=0.5)
    runtime = dev.runtime
    released = threading.Event()
    destroyed_while_stuck: list[int] = []
    real_destroy = runtime.destroy_stream_force

    def destroy(stream: int) -> None:
        if not released.is_set():
            destroyed_while_stuck.append(stream)
        real_destroy(stream)

    def set_depth(depth: int) -> None:
        if device_backend == "acl":
            from doubles.acl_double import double_control

            double_control().set_max_depth(depth)
        else:
            runtime.max_queue_depth = depth

    runtime.destroy_stream_force = destroy
    set_depth(4)
    runtime.stream_capacity = 1000
    try:
        a, b = dev.stream(), dev.stream()
        noop = dev.function("noop")
        await a.launch(dev.function("hang"), 1)
        for _ in range(8):  # the 4th entry fills the runtime's queue: the submitter blocks
            await a.launch(noop, 1)
        await anyio.sleep(0.05)
        late = await b.launch(noop, 1)
        t0 = time.perf_counter()
        with anyio.fail_after(5), pytest.raises(aa.TaskTimeoutError, match="not submitted"):
            await late
        assert time.perf_counter() - t0 < 5
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(10):
            await dev.aclose(timeout=0.1)
        assert any("still inside a runtime call" in r.getMessage() for r in caplog.records), (
            caplog.records
        )
        assert a.handle not in destroyed_while_stuck
        assert b.handle in destroyed_while_stuck  # not in the submitter's hop: gone by force
        assert dev.stats()["timeouts"] >= 1
        assert not getattr(runtime, "freed_under_callers", [])
    finally:
        released.set()
        set_depth(2013 if device_backend == "acl" else 1 << 20)  # the launch goes on
        _unstick(released, runtime)


async def test_a_cancelled_device_block_with_a_hung_kernel_exits_within_close_timeout(
    open_dev: OpenDevice,
) -> None:
    # before: the shielded aclose() in __aexit__ waited for task_timeout (600 s by default).
    with anyio.CancelScope() as scope:
        async with open_dev(close_timeout=0.3) as dev:
            s = dev.stream()
            hung = await s.launch(dev.function("hang"), 1)
            with anyio.fail_after(10):  # on the device (not dropped unsubmitted by the close)
                while dev.stats()["launches"] < 1:  # noqa: ASYNC110 - a thread's counter
                    await anyio.sleep(0.005)
            t0 = time.perf_counter()
            scope.cancel()
            await anyio.sleep(10)
    elapsed = time.perf_counter() - t0
    print(f"[figures] cancelled device block with a hung kernel left after {elapsed:.3f} s")
    assert scope.cancelled_caught
    assert elapsed < 5  # close_timeout 0.3 + forcing: expected ~0.4 s
    assert isinstance(hung.exception(), aa.TaskTimeoutError)
    assert_runtime_clean(dev)


async def test_admission_waiters_behind_work_the_watchdog_failed_are_turned_away(
    open_dev: OpenDevice,
) -> None:
    # The guide promises admission waiters behind a hung stream wait until the watchdog fails
    # that work. They waited for good: failed work keeps its slot until the device finishes
    # it, which a hung kernel never does. Now, once every slot is held by failed work, the
    # waiters (and whoever would wait then) are turned away; slots a late finish gives back
    # are used again.
    async with open_dev(task_timeout=0.3, close_timeout=0.5) as dev:
        noop = dev.function("noop")
        s = dev.stream(max_in_flight=2)
        hung = await s.launch(dev.function("hang"), 1)
        behind = await s.launch(noop, 1)  # (behind it: fails too)
        t0 = time.perf_counter()
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError, match="every slot of"):
            await s.launch(noop, 1)  # waits for a slot, until both have timed out
        assert time.perf_counter() - t0 > 0.2  # (not before the watchdog: ~0.3 s)
        for task in (hung, behind):
            assert isinstance(task.exception(), aa.TaskTimeoutError)
        with anyio.fail_after(1), pytest.raises(aa.TaskTimeoutError, match="every slot of"):
            await s.launch(noop, 1)  # it would wait: refused at once
        assert s.in_flight == 2  # (both still held: the device has not finished them)
        await dev.stream().run(noop, 1)  # another stream flows
        await s.aclose(timeout=0.1)

        # A slow kernel rather than a hung one: once it finishes, its slot is used again.
        slow = dev.stream(max_in_flight=1)
        sleeping = await slow.launch(dev.function("sleep"), 1, aa.HostArgs().u32(600_000))
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError, match="every slot of"):
            await slow.launch(noop, 1)
        assert isinstance(sleeping.exception(), aa.TaskTimeoutError)
        with anyio.fail_after(10):
            while slow.in_flight:  # noqa: ASYNC110 - until the device has finished it
                await anyio.sleep(0.01)
            await slow.run(noop, 1)

        # A closed stream whose work the watchdog failed goes once that work has finished
        # (it stayed, runtime stream and all, until the device's close).
        streams = dev.stats()["streams"]
        late = dev.stream()
        await late.launch(dev.function("sleep"), 1, aa.HostArgs().u32(600_000))
        await late.aclose()  # returns at the watchdog: the kernel still runs
        assert dev.stats()["streams"] == streams + 1
        with anyio.fail_after(10):
            while dev.stats()["streams"] > streams:  # noqa: ASYNC110 - until it is retired
                await anyio.sleep(0.01)


async def test_the_timeouts_counter_counts_each_task_given_up_on(open_dev: OpenDevice) -> None:
    # It counted the watchdog's expired batches (three hung tasks in one batch: 1) and none
    # of the tasks a forced close gave up on.
    async with open_dev(task_timeout=0.3, close_timeout=0.5) as dev:
        hang = dev.function("hang")
        s = dev.stream()
        hung = [await s.launch(hang, 1) for _ in range(3)]  # one batch
        await anyio.sleep(0.01)
        hung.append(await s.launch(hang, 1))  # another batch
        with anyio.fail_after(10):
            for task in hung:
                with pytest.raises(aa.TaskTimeoutError, match="task_timeout"):
                    await task
        assert dev.stats()["timeouts"] == 4
        await s.aclose(timeout=0.05)
        assert dev.stats()["timeouts"] == 4  # (failed already: not counted again)

        t = dev.stream()
        hold = [await t.launch(hang, 1), await t.launch(dev.function("noop"), 1)]
        await t.aclose(timeout=0.05)  # before the watchdog: the close gives up on both
        for task in hold:
            assert isinstance(task.exception(), aa.TaskTimeoutError)
            assert task.exception().by_close  # type: ignore[union-attr]
        assert dev.stats()["timeouts"] == 6


async def test_a_stream_close_with_a_timeout_forces_work_the_watchdog_already_failed(
    open_dev: OpenDevice,
) -> None:
    # Past its timeout a stream close destroys the stream by force; when the watchdog had
    # failed its hung work already, the close returned and left the stream (runtime stream,
    # slot and all) to the device's close.
    async with open_dev(task_timeout=0.2, close_timeout=0.5) as dev:
        streams = dev.stats()["streams"]
        s = dev.stream()
        hung = await s.launch(dev.function("hang"), 1)
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
            await hung
        assert dev.stats()["in_flight"] == 1  # (the device still runs it)
        t0 = time.perf_counter()
        with anyio.fail_after(10):
            await s.aclose(timeout=0.1)
        assert time.perf_counter() - t0 < 5  # expected ~0.1 s
        assert s.in_flight == 0  # its slot is back when the close returns, not a moment later
        assert dev.stats()["streams"] == streams
        assert dev.stats()["in_flight"] == 0
        await dev.stream().run(dev.function("noop"), 1)  # the device carries on

        # A slow kernel the watchdog failed: the close waits for it, within its timeout.
        slow = dev.stream()
        late = await slow.launch(dev.function("sleep"), 1, aa.HostArgs().u32(400_000))
        with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
            await late
        with anyio.fail_after(10):
            await slow.aclose(timeout=5.0)  # the kernel ends ~0.2 s after the watchdog
        assert dev.stats()["streams"] == streams
        assert dev.stats()["in_flight"] == 0
        assert dev.stats()["timeouts"] == 2


async def test_a_timed_stream_close_never_waits_for_failed_work_a_fault_has_ended(
    open_dev: OpenDevice,
) -> None:
    # A device fault gave the slot of work the watchdog had failed back as a plain finish,
    # and the stream's count of such work stayed up: a timed close waited out its timeout.
    # An infinite timeout is no timeout: it returns as `None` does, not waiting for good.
    async with open_dev(task_timeout=0.2, close_timeout=0.5) as dev:
        s, t = dev.stream(), dev.stream()
        for stream in (s, t):
            hung = await stream.launch(dev.function("hang"), 1)
            with anyio.fail_after(10), pytest.raises(aa.TaskTimeoutError):
                await hung
        with anyio.fail_after(10):
            await t.aclose(timeout=math.inf)  # returns at once, as with None
        faulted = await testing.inject_fault(dev.stream())
        with anyio.fail_after(10), pytest.raises(aa.DeviceFaultError):
            await faulted
        t0 = time.perf_counter()
        with anyio.fail_after(20):
            await s.aclose(timeout=10.0)
        assert time.perf_counter() - t0 < 5  # expected at once


async def test_memory_stats_count_the_blocks_a_forced_close_leaked(
    open_dev: OpenDevice, device_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A forced close over a kernel that never ends: the sim frees everything (nothing of its
    # streams outlives the close); on acl the kernel may still run, so the backend leaks the
    # memory rather than free it under the kernel, and memory_stats() says how much, where
    # runtime_frees (the calls to the backend's free) alone would read "all given back".
    async with open_dev() as dev:
        s = dev.stream()
        buffers = [dev.malloc(4096) for _ in range(3)]
        await s.launch(dev.function("hang"), 1)
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(20):
            await dev.aclose(timeout=0.1)
    stats = dev.memory_stats()
    assert stats["runtime_frees"] == stats["runtime_allocations"] == len(buffers), stats
    leaked = any("leaking" in r.getMessage() for r in caplog.records)
    assert stats["runtime_leaks"] == (len(buffers) if leaked else 0), (stats, caplog.records)
    # the C double's hang outlives its stream's forced destroy, as a real kernel may; the
    # real runtime over our fake driver aborts it (the device settles: all freed)
    assert leaked is (device_backend == "acl")


async def test_an_exception_in_the_device_block_drops_unsubmitted_work(
    open_dev: OpenDevice,
) -> None:
    tasks: list[aa.Task] = []

    async def body() -> None:
        async with open_dev(close_timeout=0.3) as dev:
            s = dev.stream()
            await s.launch(dev.function("hang"), 1)
            tasks.append(await s.launch(dev.function("noop"), 1))  # pending: dropped
            opened.append(dev)
            raise KeyError("boom")

    opened: list[Any] = []
    with anyio.fail_after(10), pytest.raises(KeyError):
        await body()
    (noop_task,), (dev,) = tasks, opened
    assert isinstance(noop_task.exception(), aa.ClosedError | aa.TaskTimeoutError)
    assert_runtime_clean(dev)


def test_close_timeout_is_validated() -> None:
    for bad, kind in (
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),
        ("5", TypeError),
        (True, TypeError),
    ):
        with pytest.raises(kind, match="close_timeout"):
            aa.open_device(0, backend="sim", close_timeout=bad)  # type: ignore[arg-type]


async def test_block_mode_one_long_kernel_does_not_slow_another_stream(
    open_dev: OpenDevice,
) -> None:
    # before: a 3 s kernel on one stream took another stream's noop round trip from p50
    # 0.25 ms to 10.3 ms in block mode (a 5 ms sync slice on the oldest event).
    async with open_dev(completion="block") as dev:
        slow, fast = dev.stream(), dev.stream()
        long_task = await slow.launch(dev.function("sleep"), 1, aa.HostArgs().u32(1_500_000))
        await anyio.sleep(0.05)
        t0 = time.perf_counter()
        times = await _round_trips(dev, fast, 100)
        assert not long_task.done()
        await long_task
        elapsed = time.perf_counter() - t0
        sync_timeouts = dev.stats()["sync_timeouts"]
    p50 = times[len(times) // 2]
    print(
        f"[figures] block mode neighbour round trip p50={p50 * 1e3:.3f} ms "
        f"p99={times[98] * 1e3:.3f} ms; sync timeouts {sync_timeouts} in {elapsed:.2f} s"
    )
    assert p50 < 0.005  # poll mode: ~0.3 ms; the old block mode: 10 ms
    assert sync_timeouts <= 5 + elapsed  # the ramp (50 ms doubling), then ~1 a second


def _unstick(release: threading.Event, runtime: Any) -> None:
    """Let the stuck runtime call return, and wait for the abandoned library threads and for
    the close's closer thread, which closes the runtime once they have exited (so does this,
    idempotent, in case the close never got that far)."""
    release.set()
    for thread in threading.enumerate():
        if thread.name.startswith(
            ("aio_ascend-submit", "aio_ascend-poll", "aio_ascend-probe", "aio_ascend-close")
        ):
            thread.join(10)
    runtime.close()


class _StuckFirstProbe:
    """Installed on ``runtime``: the first stall probe (``synchronize_stream``) never returns
    until :attr:`release` is set; the streams destroyed by force meanwhile are noted."""

    def __init__(self, runtime: Any) -> None:
        self.release, self.entered = threading.Event(), threading.Event()
        self.probed: list[int] = []
        self.destroyed_while_probing: list[int] = []
        self.destroyed: list[int] = []
        #: by stream: the thread (ident) that destroyed it
        self.destroyed_by: dict[int, int] = {}
        real_sync = runtime.synchronize_stream

        def stuck_probe(stream: int, timeout_ms: int) -> None:
            if not self.probed:
                self.probed.append(stream)
                self.entered.set()
                self.release.wait(30)
            real_sync(stream, timeout_ms)

        def noting(real_destroy: Any) -> Any:
            def destroy(stream: int) -> None:
                if self.entered.is_set() and not self.release.is_set():
                    self.destroyed_while_probing.append(stream)
                real_destroy(stream)
                self.destroyed.append(stream)
                self.destroyed_by[stream] = threading.get_ident()

            return destroy

        runtime.synchronize_stream = stuck_probe
        runtime.destroy_stream_force = noting(runtime.destroy_stream_force)
        runtime.destroy_stream = noting(runtime.destroy_stream)


@contextlib.asynccontextmanager
async def _stuck_in_a_probe(
    open_dev: OpenDevice, *, kernel_us: int | None = None
) -> AsyncIterator[tuple[aa.Device, _StuckFirstProbe, aa.Stream, aa.Task]]:
    """A device whose first stall probe (of a stream with a hung kernel, or with a kernel of
    ``kernel_us``) does not return until ``stuck.release`` is set: ``(device, stuck, that
    stream, its task)``; afterwards the probe is released, the abandoned threads joined and
    the leaked runtime closed."""
    dev = await open_dev(task_timeout=30)
    stuck = _StuckFirstProbe(dev.runtime)
    try:
        hung = dev.stream()
        if kernel_us is None:
            task = await hung.launch(dev.function("hang"), 1)
        else:
            task = await hung.launch(dev.function("sleep"), 1, aa.HostArgs().u32(kernel_us))
        with anyio.fail_after(10):  # the first probe comes 50 ms after the batch
            while not stuck.entered.is_set():  # noqa: ASYNC110 - a thread's event
                await anyio.sleep(0.005)
        yield dev, stuck, hung, task
    finally:
        _unstick(stuck.release, dev.runtime)


async def test_aclose_returns_on_time_when_a_thread_is_stuck_in_a_runtime_call(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    # A runtime call that never returns (the submitter inside a launch): aclose() still
    # returns within its bound, logs an ERROR, and frees nothing the call may still touch.
    release = threading.Event()
    dev = await open_dev()
    runtime = dev.runtime
    real_launch = runtime.launch_kernel_with_host_args

    def stuck_launch(*args: Any) -> None:
        release.wait(30)
        real_launch(*args)

    runtime.launch_kernel_with_host_args = stuck_launch
    real_batch = getattr(runtime, "launch_batch", None)
    if real_batch is not None:  # the acl backend's native batch submit: stuck the same way

        def stuck_batch(launches: list[Any]) -> Any:
            release.wait(30)
            return real_batch(launches)

        runtime.launch_batch = stuck_batch
    try:
        s = dev.stream()
        task = await s.launch(dev.function("noop"), 1)
        await anyio.sleep(0.05)
        t0 = time.perf_counter()
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(20):
            await dev.aclose(timeout=0.1)
        elapsed = time.perf_counter() - t0
        assert elapsed < 10  # timeout 0.1 + the 2 s join bound
        assert isinstance(task.exception(), aa.TaskTimeoutError)
        assert any("still inside a runtime call" in r.getMessage() for r in caplog.records), (
            caplog.records
        )
        live = live_resources(dev)
        assert live["host_allocations"] > 0  # leaked, not freed under the stuck call
    finally:
        _unstick(release, runtime)


@pytest.mark.backends("sim")
async def test_a_forced_close_never_waits_on_the_loop_for_a_long_sim_kernel(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    """A sim kernel is a Python call that may take seconds (a big matmul, a kernel of yours).
    A close forced past its timeout waits for it off the loop up to 0.5 s, then lets it run
    out: the loop keeps ticking and the close returns on time (before: the runtime's close
    joined the device thread on the loop, which froze for the whole kernel), and the device
    thread ends once the kernel returns."""
    release = threading.Event()
    lib = aa.sim.KernelLibrary()

    @lib.kernel("long")
    def long(ctx: aa.sim.KernelContext) -> None:
        release.wait(20)

    dev = await open_dev()
    try:
        task = await dev.stream().launch(dev.load_module(lib).function("long"), 1)
        await anyio.sleep(0.05)  # the device thread is inside the kernel
        lag = 0.0
        closed = False

        async def ticker() -> None:
            nonlocal lag
            while not closed:
                t0 = time.perf_counter()
                await anyio.sleep(0.01)
                lag = max(lag, time.perf_counter() - t0 - 0.01)

        with caplog.at_level(logging.WARNING, logger="aio_ascend"), anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                t0 = time.perf_counter()
                await dev.aclose(timeout=0.1)
                elapsed = time.perf_counter() - t0
                closed = True
        assert elapsed < 5  # 0.1 s, the 0.5 s wait off the loop, then it goes on
        assert lag < 2.5  # (the kernel runs until released: 20 s)
        assert isinstance(task.exception(), aa.TaskTimeoutError)
        assert any("still running a kernel" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
    name = f"aio_ascend-sim-{dev.device_id}"
    for thread in [t for t in threading.enumerate() if t.name == name]:
        await anyio.to_thread.run_sync(thread.join, 10)
        assert not thread.is_alive()


async def test_a_forced_close_never_destroys_the_stream_a_stuck_stall_probe_synchronizes(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    # The real runtime frees a stream destroyed by force under a thread synchronizing on it,
    # and that thread then crashes the process (SIGSEGV, seen on tests/realrt when the stall
    # probe's 1 ms synchronize did not return). A close that finds the prober stuck in a
    # probe leaks that stream with the rest of what a stuck thread may touch.
    async with _stuck_in_a_probe(open_dev) as (dev, stuck, _, _):
        await dev.stream().launch(dev.function("hang"), 1)
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(20):
            await dev.aclose(timeout=0.1)
        assert any("still inside a runtime call" in r.getMessage() for r in caplog.records), (
            caplog.records
        )
        assert stuck.probed[0] not in stuck.destroyed_while_probing  # spared: the call is on it
        assert len(stuck.destroyed_while_probing) == 1  # the other stream went by force


async def test_a_stall_probe_that_never_returns_stops_no_other_stream(
    open_dev: OpenDevice, caplog: pytest.LogCaptureFixture
) -> None:
    # The real runtime's 1 ms stream synchronize can wait far longer (its timeout snapshot
    # waits for a control task with no timeout; over our driver, after a busy stream had been
    # destroyed by force, for good). Run by the poller, it froze every stream's completions.
    # The probes now run on their own thread: the other streams flow, the probed stream's
    # forced close fails its work on time (its destroy waits for the probe), and the device
    # closes on time, leaking what the stuck probe may touch.
    async with _stuck_in_a_probe(open_dev) as (dev, stuck, hung, task):
        other = dev.stream()
        times = await _round_trips(dev, other, 20)  # each bounded at 2 s: ~0.3 ms expected
        with anyio.fail_after(5):
            await hung.aclose(cancel=True, timeout=0.1)
            with pytest.raises(aa.TaskTimeoutError):
                await task
        await (await other.launch(dev.function("noop"), 1))
        with caplog.at_level(logging.ERROR, logger="aio_ascend"), anyio.fail_after(20):
            await dev.aclose(timeout=0.1)
        assert any("probe" in r.getMessage() for r in caplog.records), caplog.records
        assert stuck.probed[0] not in stuck.destroyed_while_probing
        print(f"[figures] round trip beside a stuck probe: max {times[-1] * 1e3:.3f} ms")


async def test_a_stream_closed_while_its_stall_probe_is_out_is_destroyed_after_the_probe(
    open_dev: OpenDevice,
) -> None:
    # A probe is asked for on the poller and runs later on the prober. Meanwhile the kernel
    # finished and the stream was closed; its destroy did not wait: the probe then read "not a
    # live stream", taken for a device fault (a CI run, 1 in ~3,000 tests), and a destroy
    # during the probe frees the stream under it on the real runtime. Now the prober
    # destroys the stream after its probe.
    # (500 ms: 10x the 50 ms after which the stream is first probed, so the kernel is still
    # running when the probe comes, however loaded the machine)
    async with _stuck_in_a_probe(open_dev, kernel_us=500_000) as (dev, stuck, s, task):
        with anyio.fail_after(10):  # the kernel ends while the probe is held
            await task
            await s.aclose()
        assert stuck.probed == [s.handle]
        assert s.handle not in stuck.destroyed  # not under (nor before) the probe
        stuck.release.set()
        with anyio.fail_after(10):  # ... but right after it
            while s.handle not in stuck.destroyed:  # noqa: ASYNC110 - a thread's list
                await anyio.sleep(0.005)
        assert stuck.destroyed_while_probing == []
        await (await dev.stream().launch(dev.function("noop"), 1))  # the device is fine
        assert dev.fault is None
        await dev.aclose()
        assert_runtime_clean(dev)


async def test_a_probe_that_returns_during_a_forced_close_leaves_its_stream_to_the_close(
    open_dev: OpenDevice,
) -> None:
    # On acl a destroy by force first looks at the stream, which can take seconds on the real
    # runtime: done by the stopping prober after its probe, it counted against the close's
    # 2 s join of that thread, and the close abandoned it and leaked the device (a realrt CI
    # rehearsal under load). The close destroys that stream itself, after the join.
    async with _stuck_in_a_probe(open_dev) as (dev, stuck, hung, task):

        async def release_soon() -> None:
            await anyio.sleep(0.3)  # the close has stopped the threads and waits on the prober
            stuck.release.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_soon)
            with anyio.fail_after(20):
                await dev.aclose(timeout=0.1)
        assert isinstance(task.exception(), aa.TaskTimeoutError)
        assert stuck.destroyed_while_probing == []
        assert stuck.destroyed_by[hung.handle] == threading.get_ident()  # by the close
        assert_runtime_clean(dev)


def test_aclose_from_another_asyncio_loop_after_the_first_finished() -> None:
    # before: RuntimeError "attached to a different loop", the device stuck in "closing" with
    # its threads alive.
    import asyncio

    async def open_and_launch() -> tuple[Any, Any]:
        dev = await aa.open_device(0, backend="sim")
        s = dev.stream()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(300_000))
        return dev, task

    dev, task = asyncio.run(open_and_launch())

    async def close() -> None:
        with anyio.fail_after(10):
            await dev.aclose()

    asyncio.run(close())
    assert task.done() and task.exception() is None  # it finished; the result was kept
    assert_runtime_clean(dev)


def test_aclose_from_another_trio_run_after_the_first_finished() -> None:
    import trio

    async def open_and_launch() -> tuple[Any, Any]:
        dev = await aa.open_device(0, backend="sim")
        s = dev.stream()
        task = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(300_000))
        return dev, task

    dev, task = trio.run(open_and_launch)

    async def close() -> None:
        with trio.fail_after(10):
            await dev.aclose()

    trio.run(close)
    assert task.done()
    assert_runtime_clean(dev)


def test_aclose_from_another_loop_while_the_first_runs_is_refused_and_changes_nothing() -> None:
    import asyncio

    opened: dict[str, Any] = {}
    ready, done = threading.Event(), threading.Event()

    async def owner() -> None:
        dev = await aa.open_device(0, backend="sim")
        opened["dev"] = dev
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, done.wait)
        await dev.aclose()

    thread = threading.Thread(target=asyncio.run, args=(owner(),))
    thread.start()
    assert ready.wait(10)
    dev = opened["dev"]

    async def intruder() -> None:
        with pytest.raises(RuntimeError, match="still running"):
            await dev.aclose()

    try:
        asyncio.run(intruder())
        assert "open" in repr(dev)
    finally:
        done.set()
        thread.join(10)
    assert "closed" in repr(dev)
