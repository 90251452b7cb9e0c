"""``CopyWorker``: the host side of big copies, off the threads every stream shares.

A host copy goes through pinned memory, with host work at both ends: before an upload is
submitted its source is copied into a pinned buffer (allocated first), and after a download
completes the pinned buffer is copied into the user's array. For a big copy that takes tens to
hundreds of milliseconds. Done by the submitter or the poller, which serve every stream, it
would hold up every other stream's submissions or completions; so those threads hand it to a
worker of their own and carry on. The worker runs the jobs in FIFO order and each job reports
back to its owner's inbox, where the owner continues the stream's work in order.

A worker's thread starts with its first job (most devices never copy big blocks), and its
owner stops it on its own way out (:meth:`CopyWorker.finish`): the job in progress completes,
jobs still queued are dropped (their requests are still the owner's, handed back at close as
never done).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["CopyWorker"]


class CopyWorker:
    """A thread named ``name`` that runs its owner's jobs one at a time, in order.

    Only the owner thread calls :meth:`put` and :meth:`finish`.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._stopping = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def put(self, job: Callable[[], None]) -> None:
        """Queue ``job`` (the owner thread); the thread starts with the first one."""
        if self.thread.ident is None:
            self.thread.start()
        self._jobs.put(job)

    def finish(self) -> None:
        """Stop and wait for the thread (the owner thread, on its way out): the job in
        progress completes, the jobs still queued are not run."""
        self._stopping = True
        self._jobs.put(None)
        if self.thread.ident is not None:
            self.thread.join()

    def _main(self) -> None:
        get = self._jobs.get
        while True:
            job = get()
            if job is None or self._stopping:
                return
            job()
            del job  # nothing of a finished job is kept while the thread waits
