"""Work is ordered as written across torch_npu and aio_ascend on one runtime stream, against a
double of torch_npu's task queue (``tests/doubles/torch_npu_queue.py``: a thread that launches
queued ops later, as torch_npu's does; reading ``npu_stream`` drains it).

``dev.external_stream(torch_stream)`` (the stream object) does the handshake both ways; a
plain handle (``external_stream(torch_stream.npu_stream)``, what the docs said before) does
not, and the same programs read stale data with it: the tests show both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from doubles.torch_npu_queue import FakeTorchEvent, FakeTorchStream
from helpers import open_backend

import aio_ascend as aa
from aio_ascend._runtime.abi import ACL_EVENT_SYNC, ACL_MEMCPY_DEVICE_TO_DEVICE

pytestmark = pytest.mark.anyio

BACKENDS = ("sim", "acl", "cuda-fake", "realrt")
N = 64


@asynccontextmanager
async def torch_beside(
    dev: aa.Device, *, lag_s: float = 0.05, sync: bool = False
) -> AsyncIterator[FakeTorchStream]:
    """A torch_npu stream (with its task queue) over a runtime stream torch created."""
    runtime = dev.runtime
    runtime.set_current_context(runtime.context)
    handle = runtime.create_stream()
    torch = FakeTorchStream(runtime, handle, lag_s=lag_s, sync=sync)
    try:
        yield torch
    finally:
        torch.close()
        runtime.set_current_context(runtime.context)
        runtime.synchronize_stream(handle, 5000)
        runtime.destroy_stream(handle)


def torch_fill(buf: aa.DeviceBuffer, value: int) -> Callable[[Any, int], None]:
    return lambda runtime, stream: runtime.memset_async(buf.ptr, N, value, N, stream)


def torch_copy(dst: aa.DeviceBuffer, src: aa.DeviceBuffer) -> Callable[[Any, int], None]:
    return lambda runtime, stream: runtime.memcpy_async(
        dst.ptr, N, src.ptr, N, ACL_MEMCPY_DEVICE_TO_DEVICE, stream
    )


async def _ours_after_torch(dev: aa.Device, torch: FakeTorchStream, ordered: bool) -> list[int]:
    # torch fills x, then we copy x to y on the same runtime stream: y must hold torch's fill
    x, y = dev.malloc(N), dev.malloc(N)
    setup = dev.stream()
    await setup.memset(x, 0)
    await setup.memset(y, 0)
    await setup.synchronize()
    ours = dev.external_stream(torch if ordered else torch.handle)
    torch.enqueue(torch_fill(x, 5), "fill x")  # queued; torch's thread launches it later
    await ours.copy_device(y, x)
    result: list[int] = (await ours.download(y)).tolist()
    torch.npu_stream  # noqa: B018 - drained: what torch queued has been launched
    await ours.aclose()
    await setup.aclose()
    return result


async def _torch_after_ours(dev: aa.Device, torch: FakeTorchStream, ordered: bool) -> list[int]:
    # we fill x, then torch copies x to y: torch's copy must see our fill
    x, y = dev.malloc(N), dev.malloc(N)
    setup = dev.stream()
    await setup.memset(x, 0)
    await setup.memset(y, 0)
    await setup.synchronize()
    ours = dev.external_stream(torch if ordered else torch.handle)
    await ours.memset(x, 9)
    torch.enqueue(torch_copy(y, x), "copy x to y")
    torch.npu_stream  # noqa: B018 - torch launches it (any later torch call that syncs would)
    result: list[int] = (await ours.download(y)).tolist()
    await ours.aclose()
    await setup.aclose()
    return result


async def test_our_work_follows_torchs_queued_ops(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev, torch_beside(dev, lag_s=60.0) as torch:
        assert await _ours_after_torch(dev, torch, ordered=True) == [5] * N
        assert torch.launched == ["fill x"]


async def test_torchs_later_ops_follow_our_work(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev, torch_beside(dev, lag_s=60.0) as torch:
        assert await _torch_after_ours(dev, torch, ordered=True) == [9] * N


async def test_a_plain_handle_does_neither(open_dev: Callable[..., Any]) -> None:
    # What the handshake prevents: the same programs over the handle alone read stale data
    async with open_dev() as dev, torch_beside(dev, lag_s=60.0) as torch:
        assert await _ours_after_torch(dev, torch, ordered=False) == [0] * N
        assert await _torch_after_ours(dev, torch, ordered=False) == [0] * N


async def test_a_sync_launch_stream_is_ordered_too(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev, torch_beside(dev, sync=True) as torch:
        assert await _ours_after_torch(dev, torch, ordered=True) == [5] * N
        assert await _torch_after_ours(dev, torch, ordered=True) == [9] * N


async def test_every_operation_drains_torchs_queue(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch)
        buf = dev.malloc(N)
        before = torch.drains
        await ours.memset(buf, 1)
        await ours.record_event()
        await ours.launch(dev.function("sleep"), 1, aa.HostArgs().u32(1))
        assert torch.drains - before == 3
        await ours.aclose()


async def test_an_external_stream_object_must_keep_its_handle(
    open_dev: Callable[..., Any],
) -> None:
    class Moving:
        def __init__(self, handle: int) -> None:
            self.npu_stream = handle

    async with open_dev() as dev, torch_beside(dev, sync=True) as torch:
        moving = Moving(torch.npu_stream)
        ours = dev.external_stream(moving)
        moving.npu_stream += 1
        with pytest.raises(RuntimeError, match="new external_stream"):
            await ours.memset(dev.malloc(N), 0)
        await ours.aclose()
        with pytest.raises(TypeError, match="npu_stream"):
            dev.external_stream(type("Bad", (), {"npu_stream": "x"})())


# --- external events -------------------------------------------------------------------------


async def test_a_stream_waits_for_a_torch_event(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev, torch_beside(dev) as torch:
        x, y = dev.malloc(N), dev.malloc(N)
        async with dev.stream() as setup:
            await setup.memset(x, 0)
            await setup.memset(y, 0)
        runtime = dev.runtime
        event = FakeTorchEvent(runtime, ACL_EVENT_SYNC)
        torch.enqueue(lambda rt, s: rt.memset_async(x.ptr, N, 0, 0, s), "noop")
        torch.enqueue(torch_fill(x, 4), "fill x")
        event.record(torch)  # queued in torch's queue, launched later
        ext = dev.external_event(event, after=torch)
        async with dev.stream() as ours:
            waited = await ours.wait_event(ext)
            await ours.copy_device(y, x)
            assert (await ours.download(y)).tolist() == [4] * N
            await waited
        await ext
        assert ext.query()
        event.destroy()


async def test_external_event_misuse_is_refused(open_dev: Callable[..., Any]) -> None:
    async with open_dev() as dev:
        with pytest.raises(TypeError, match="event handle"):
            dev.external_event("e")
        with pytest.raises(TypeError, match="event handle"):
            dev.external_event(True)
        with pytest.raises(ValueError, match="first recorded"):
            dev.external_event(type("Lazy", (), {"npu_event": 0})())
        with pytest.raises(TypeError, match="stream"):
            dev.external_event(1234, after=object())
        async with open_dev(0) as other:
            ext = other.external_event(1234)
            with pytest.raises(ValueError, match="different device"):
                await dev.stream().wait_event(ext)


async def test_a_host_function_on_a_torch_stream_holds_work_issued_while_its_call_runs(
    open_dev: Callable[..., Any],
) -> None:
    # The hold is in place before launch_host_func awaits anything after queueing its event:
    # an operation issued by another coroutine meanwhile still runs after fn.
    import threading

    import anyio

    async with open_dev() as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch)
        buf = dev.malloc(N)
        release = threading.Event()
        host: list[aa.Task] = []
        later: list[aa.Task] = []

        async def call_host_func() -> None:
            host.append(await ours.launch_host_func(lambda: release.wait(10)))

        async def issue_later() -> None:
            later.append(await ours.memset(buf, 3))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_host_func)
            await anyio.lowlevel.checkpoint()  # the host function's call has begun
            tg.start_soon(issue_later)
            await anyio.sleep(0.3)
            assert not later or not later[0].done(), "work overtook the host function"
            release.set()
        await later[0]
        assert host[0].done()
        await ours.aclose()


async def test_a_fault_during_the_handshake_still_returns_the_queued_operations_task(
    anyio_backend: object,
) -> None:
    """If the operation just queued faults the device while its call waits for the hand-over,
    the caller still gets the operation's Task (which carries the fault), not an error for an
    operation that was queued anyway."""
    async with open_backend("sim") as dev:
        runtime = dev.runtime
        torch = FakeTorchStream(runtime, runtime.create_stream(), lag_s=0.05)
        try:
            ours = dev.external_stream(torch, max_in_flight=1)
            task = await ours.launch(dev.function("fault"), 1, aa.HostArgs().u32(507015))
            with pytest.raises(aa.DeviceFaultError):
                await task
        finally:
            torch.close()  # (the device faulted: its stream goes with the context)


async def test_a_torch_stream_stalled_behind_failed_work_still_returns_the_operations_task(
    open_dev: Callable[..., Any],
) -> None:
    # The handshake used to record an event behind the operation, which waited for a slot.
    # When the watchdog failed the operation, the stream counted as stalled and the event
    # was turned away: its TaskTimeoutError came out of the call, and the Task was lost.
    async with open_dev(task_timeout=0.2) as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch, max_in_flight=1)
        task = await ours.launch(dev.function("sleep"), 1, aa.HostArgs().u32(500_000))
        assert isinstance(task, aa.Task)
        with pytest.raises(aa.TaskTimeoutError, match="task_timeout"):
            await task
        await ours.aclose(timeout=2)


async def test_the_handshake_never_waits_for_another_coroutines_host_function(
    open_dev: Callable[..., Any],
) -> None:
    # The handshake's event is queued in the caller's task right behind its operation. Run
    # as a task of its own a loop turn later, another coroutine's host function could come
    # between them, and the call then waited (uncancellably) until that function returned.
    import threading

    async with open_dev() as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch)
        gate = threading.Event()

        async def other() -> None:  # (it starts in the next loop turn)
            await ours.launch_host_func(gate.wait)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                with anyio.fail_after(5):  # (expected: a few ms; it took the function's time)
                    await ours.launch(dev.function("noop"), 1)
                gate.set()
        finally:
            gate.set()
        await ours.synchronize()
        await ours.aclose()


async def test_a_call_on_a_full_torch_stream_returns_once_its_operation_is_submitted(
    open_dev: Callable[..., Any],
) -> None:
    # The handshake waited for an event of its own recorded behind the operation, which
    # needed a slot of its own: on a stream at its limit the call returned only once the
    # operation had finished, and nothing could cancel that wait.
    async with open_dev() as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch, max_in_flight=1)
        with anyio.fail_after(30):  # (expected: a few ms)
            task = await ours.launch(dev.function("sleep"), 1, aa.HostArgs().u32(1_000_000))
        assert not task.done(), "the call waited for the kernel to finish"
        await task
        await ours.aclose()


async def test_a_torch_stream_call_never_waits_for_a_host_function_queued_after_it(
    open_dev: Callable[..., Any],
) -> None:
    # With every request flushed at once (batch_cap=1) the handshake's own event passed a
    # checkpoint before taking its slot; another coroutine's host function queued then came
    # between the operation and it, and the call waited (uncancellably) for that function.
    import threading

    async with open_dev(batch_cap=1) as dev, torch_beside(dev, lag_s=0.0) as torch:
        ours = dev.external_stream(torch)
        gate = threading.Event()
        timer = threading.Timer(10.0, gate.set)  # (the old code's call ended only then)
        timer.start()
        took: list[float] = []
        started: list[float] = []

        async def call() -> None:
            started.append(anyio.current_time())  # (up to its first wait in one step)
            await ours.launch(dev.function("noop"), 1)
            took.append(anyio.current_time() - started[0])

        async def host_function() -> None:
            await ours.launch_host_func(gate.wait)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                while not started:  # the call is past its admission: the function comes after
                    await anyio.lowlevel.checkpoint()
                tg.start_soon(host_function)
            assert took[0] < 5.0, f"the call waited {took[0]:.1f} s for the host function"
        finally:
            gate.set()
            timer.cancel()
        await ours.synchronize()
        await ours.aclose()


async def test_a_timed_out_torch_stream_operation_is_one_timeout_and_nothing_unretrieved(
    open_dev: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The handshake's own event, behind the operation, timed out with it: the watchdog
    # counted two timeouts for one operation, and that event's error, which the caller
    # could never retrieve, was logged as never retrieved.
    async with open_dev(task_timeout=0.3) as dev, torch_beside(dev) as torch:
        ours = dev.external_stream(torch)
        task = await ours.launch(dev.function("sleep"), 1, aa.HostArgs().u32(900_000))
        with pytest.raises(aa.TaskTimeoutError):
            await task
        assert dev.stats()["timeouts"] == 1
        await ours.aclose(timeout=5)
    unretrieved = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unretrieved == []


async def test_external_stream_and_event_check_before_they_drain_torchs_queue(
    open_dev: Callable[..., Any],
) -> None:
    async with open_dev() as dev, torch_beside(dev) as torch:
        before = torch.drains
        with pytest.raises(ValueError, match="max_in_flight"):
            dev.external_stream(torch, max_in_flight=0)
        errors: list[BaseException] = []

        def elsewhere() -> None:
            try:
                dev.external_stream(torch)
            except BaseException as exc:
                errors.append(exc)

        import threading

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert isinstance(errors[0], aa.WrongLoopError)
        assert torch.drains == before, "a refused call drained torch's queue"
        # A handle read off the stream orders nothing: after= takes the stream object
        with pytest.raises(TypeError, match="stream object"):
            dev.external_event(1234, after=torch.handle)
        with pytest.raises(ValueError, match="is not an event handle"):
            dev.external_event(1 << 70)
        ours = dev.external_stream(torch)
        with pytest.raises(ValueError, match=r"already open.*use that Stream"):
            dev.external_stream(torch)
        await ours.aclose()
