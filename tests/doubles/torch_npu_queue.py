"""A double of torch_npu's task queue, as far as ordering with it goes.

What it copies from torch_npu (Ascend/pytorch, ``torch_npu/csrc/core/npu/NPUQueue.cpp`` and
``NPUStream.cpp``): with ``TASK_QUEUE_ENABLE`` on, an op called from Python is put in a queue
and a torch_npu thread launches it onto the runtime stream later; reading a stream's
``npu_stream`` (``NPUStream::stream()``) first waits until that queue is empty
(``Repository::MakeSureQueueEmpty``) and then returns the handle. A ``SyncLaunchStream``
launches at once (``sync=True`` here).

Ops are callables ``op(runtime, stream_handle)`` making the runtime calls torch would (a memset,
a copy), on the queue's thread, which binds the device context first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

Op = Callable[[Any, int], None]

__all__ = ["FakeTorchEvent", "FakeTorchStream"]


class FakeTorchStream:
    """A torch_npu stream over runtime stream ``handle`` of ``runtime`` with its task queue.

    :param lag_s: how long after its enqueue the queue thread launches an op unless a drain
        (``npu_stream``) asks for it first: torch_npu's thread runs behind the Python thread,
        and a long lag makes the reordering it allows happen every time, not by chance
    :param sync: a ``SyncLaunchStream``: no queue, ops are launched by the caller at once
    """

    def __init__(self, runtime: Any, handle: int, *, lag_s: float = 0.02, sync: bool = False):
        self._runtime = runtime
        self.handle = handle  # what a plain external_stream(handle) would be given
        self._lag_s = lag_s
        self._sync = sync
        self._ops: deque[Op] = deque()
        self._queued_at: deque[float] = deque()
        self._busy = 0  # ops taken by the thread and not launched yet
        self._draining = 0  # npu_stream readers waiting for the queue to empty
        self._cond = threading.Condition()
        self._stopping = False
        self.drains = 0  # how many times npu_stream was read
        self.launched: list[str] = []
        self._thread = threading.Thread(target=self._main, name="fake-torch-npu-queue")
        if not sync:
            self._thread.start()

    def enqueue(self, op: Op, name: str = "op") -> None:
        """Queue ``op`` as a torch op call would (it is launched later, by the queue thread)."""
        if self._sync:
            op(self._runtime, self.handle)
            self.launched.append(name)
            return
        with self._cond:
            self._ops.append(
                lambda runtime, stream: (op(runtime, stream), self.launched.append(name))
            )
            self._queued_at.append(time.monotonic())
            self._cond.notify_all()

    @property
    def npu_stream(self) -> int:
        """The runtime handle, once every op queued so far has been launched (the drain)."""
        self.drains += 1
        with self._cond:
            self._draining += 1
            self._cond.notify_all()
            try:
                while self._ops or self._busy:
                    self._cond.wait()
            finally:
                self._draining -= 1
        return self.handle

    def _main(self) -> None:
        self._runtime.set_current_context(self._runtime.context)
        try:
            self._run()
        finally:
            # the thread lets go of the context before it ends, as torch's must: on the real
            # runtime a thread that ends with a context current keeps it alive for good
            self._runtime.release_thread()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._ops and not self._stopping:
                    cond.wait()
                if self._stopping and not self._ops:
                    return
                # torch's thread runs behind: an op waits for its lag, unless a drain or the
                # close asks for it now
                deadline = self._queued_at[0] + self._lag_s
                while not (self._draining or self._stopping):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    cond.wait(left)
                op = self._ops.popleft()
                self._queued_at.popleft()
                self._busy += 1
            try:
                op(self._runtime, self.handle)
            finally:
                with cond:
                    self._busy -= 1
                    cond.notify_all()

    def close(self) -> None:
        """Launch what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if not self._sync:
            self._thread.join()


class FakeTorchEvent:
    """A ``torch.npu.Event``: ``record(stream)`` goes through the stream's queue (torch_npu's
    ``LaunchRecordEventTask``), ``npu_event`` is the runtime handle."""

    def __init__(self, runtime: Any, flags: int) -> None:
        self.npu_event = runtime.create_event(flags)
        self._runtime = runtime

    def record(self, stream: FakeTorchStream) -> None:
        event = self.npu_event
        stream.enqueue(lambda runtime, handle: runtime.record_event(event, handle), "record")

    def destroy(self) -> None:
        self._runtime.destroy_event(self.npu_event)
