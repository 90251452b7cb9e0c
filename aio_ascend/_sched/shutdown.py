"""What a device's close does once its threads are stopped (or a stream's forced close waits
for): waiting for threads without blocking the loop, destroying the streams left, releasing
everything. The order of the steps is :meth:`Scheduler.aclose`'s."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

import anyio

from .._host.pinned import PinnedArrays
from .._host.pool import HostBufferPool
from .._runtime import Runtime
from .events import BatchEvents, UserEvents
from .graphs import GraphBook
from .lane import Lane
from .lifetimes import Lifetimes
from .work import Request

__all__ = [
    "close_after",
    "destroy_lanes",
    "join",
    "log_forced",
    "log_stuck",
    "release_everything",
    "wait_set",
]

log = logging.getLogger("aio_ascend")


def log_forced(device_id: int, busy: str, timeout: float | None, victim: str) -> None:
    """The WARNING of a close that gave up waiting for ``busy`` work: ``victim`` goes by force."""
    log.warning(
        "device %d: %s after aclose(timeout=%s); destroying %s by force",
        device_id,
        busy,
        timeout,
        victim,
    )


def log_stuck(device_id: int, stuck: list[str], waited: float) -> None:
    """The ERROR of a close that abandons threads stuck in a runtime call."""
    log.error(
        "device %d: %s still inside a runtime call %.0f s after aclose() forced the streams; "
        "abandoning it and leaking the device's buffers, events and runtime instead of "
        "freeing them under it",
        device_id,
        " and ".join(stuck),
        waited,
    )


def close_after(
    threads: list[threading.Thread], runtime: Runtime, waited: float, pinned: PinnedArrays
) -> None:
    """Wait (blocking, up to ``waited`` s each) for ``threads``, then close ``runtime`` (once
    the last pinned array alive is collected: see ``PinnedArrays.close``)."""
    for thread in threads:
        thread.join(waited)
    with contextlib.suppress(Exception):
        pinned.close(runtime.close)


async def join(thread: threading.Thread, deadline: float) -> None:
    """Wait until ``thread`` has exited or ``deadline`` (``time.monotonic()``) has passed."""
    while thread.is_alive() and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.001)  # a thread join cannot be awaited: poll it briefly


async def wait_set(
    event: threading.Event, deadline: float, give_up: Callable[[], bool] | None = None
) -> bool:
    """Wait until a thread sets ``event``, ``deadline`` has passed or ``give_up()`` is true;
    whether it was set."""
    while not event.is_set() and time.monotonic() < deadline:
        if give_up is not None and give_up():
            break
        await anyio.sleep(0.001)  # nor can a threading.Event be: poll it briefly
    return event.is_set()


def destroy_lanes(runtime: Runtime, lanes: Iterable[Lane]) -> None:
    """Close ``lanes`` and destroy their runtime streams by force (not someone else's, nor
    one destroyed already)."""
    for lane in lanes:
        lane.closed = True
        lane.admission.reset()
        if lane.external or lane.destroyed:
            continue
        with contextlib.suppress(Exception):
            runtime.destroy_stream_force(lane.handle)
        lane.destroyed = True


def release_everything(
    runtime: Runtime,
    *,
    graphs: GraphBook,
    lifetimes: Lifetimes,
    orphans: Iterable[list[Request]],
    batch_events: BatchEvents,
    user_events: UserEvents,
    modules: list[int],
    pool: HostBufferPool,
    pinned: PinnedArrays,
) -> None:
    """Release and free what the device holds, then close the runtime: only after the
    threads have exited and the streams are gone (nothing can touch these any more).
    ``orphans``: lists of requests whose resources waited for this (emptied). The runtime
    closes once the users' pinned arrays are gone (its close would free their memory)."""
    graphs.close_all()
    for requests in orphans:
        lifetimes.release(requests)
        requests.clear()
    for handle in batch_events.created + user_events.take_all():
        with contextlib.suppress(Exception):
            runtime.destroy_event(handle)
    batch_events.created.clear()
    lifetimes.close()  # buffers still alive and cached blocks: all back to the runtime
    for module in modules:
        with contextlib.suppress(Exception):
            runtime.unload_binary(module)
    modules.clear()
    pool.close()
    pinned.close(runtime.close)
