"""Streams collected without ``aclose()`` (and closed ones whose work the watchdog failed, still
on the device): retired once the work queued on them is done.

A stream's lane is held by the scheduler (``Scheduler.lanes``), so nothing would ever release
the runtime stream of a ``Stream`` the user dropped. Its finalizer hands the lane to
:class:`DroppedLanes` (any thread: it only appends); the loop thread then warns and destroys the
runtime stream as soon as the lane has nothing in flight, as a dropped ``DeviceBuffer`` is
freed once its queued work has completed.
"""

from __future__ import annotations

import logging
import warnings
from collections import deque
from collections.abc import Callable

from .lane import Lane

__all__ = ["DroppedLanes", "warn_resource"]

log = logging.getLogger("aio_ascend")


def warn_resource(message: str) -> None:
    """A ``ResourceWarning`` for something collected without being closed (loop thread).

    Logged instead when warnings are turned into errors: it is raised inside a loop callback,
    where an exception would be lost or break the loop.
    """
    try:
        warnings.warn(message, ResourceWarning, stacklevel=3)
    except Warning:
        log.warning(message)


class DroppedLanes:
    """The lanes of streams collected without ``aclose()``, until their work is done.

    :ivar collected: lanes handed over by finalizers, not looked at yet
    :ivar retiring: lanes warned about, waiting for their in-flight work
    """

    def __init__(self, device_id: int) -> None:
        self._device_id = device_id
        self.collected: deque[Lane] = deque()
        self.retiring: list[Lane] = []

    def drop(self, lane: Lane) -> None:
        """The lane's ``Stream`` was collected (a finalizer: any thread, only appends)."""
        self.collected.append(lane)

    def retire_when_done(self, lane: Lane) -> None:
        """(Loop thread) A closed stream whose work the watchdog failed, still running on the
        device: destroyed as a dropped one is, once that work has finished (or by the
        device's close), instead of lingering until the device's close."""
        if lane not in self.retiring:
            self.retiring.append(lane)

    def due(self) -> list[Lane]:
        """(Loop thread) Close the collected lanes to new work and warn about them; return the
        retiring lanes whose work is done, no longer retiring: the caller destroys them."""
        while self.collected:
            lane = self.collected.popleft()
            if lane.closed:  # closed by aclose() or by the device's close: not leaked
                continue
            lane.closed = True
            if not lane.external:  # someone else's stream: nothing of ours is held
                warn_resource(
                    f"a Stream (runtime stream {lane.handle:#x}) of device {self._device_id} "
                    "was garbage-collected without aclose(); it is destroyed once its queued "
                    "work has finished"
                )
            self.retiring.append(lane)
        done = [lane for lane in self.retiring if not lane.admission.in_flight]
        if done:
            self.retiring = [lane for lane in self.retiring if lane.admission.in_flight]
        return done

    def retire(self, lanes: list[Lane], destroy: Callable[[Lane], None]) -> None:
        """(Loop thread) Destroy the runtime streams of the lanes :meth:`due` returns and take
        them out of ``lanes``; one whose destroy fails stays there, for the device's close."""
        for lane in self.due():
            if lane not in lanes:  # (destroyed meanwhile: forced by a close, or closed idle)
                continue
            if not lane.external:
                try:
                    destroy(lane)
                except Exception:  # a loop callback must not raise
                    log.exception(
                        "device %d: destroying the runtime stream %#x of a dropped Stream "
                        "failed; the device's close destroys it",
                        self._device_id,
                        lane.handle,
                    )
                    continue
            lanes.remove(lane)
