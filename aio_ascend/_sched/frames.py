"""``forget_frames``: what a library thread does with the errors it caught before it blocks.

A caught error keeps its traceback, and the traceback keeps the frames it passed through,
finished or not, with their locals. In a thread that submits requests those locals hold the
requests: each failed task would hold itself through its own error, and a refused task nobody
awaits would wait for the garbage collector instead of being logged when it is dropped. So
before the thread blocks again it clears those frames: their lines stay (the traceback still
prints), their locals go.

Two kinds of frame are left alone. A re-raised error (the runtime's sticky fault) also carries
the frames of its earlier raises, a suspended coroutine of the loop's among them: ``clear()``
would close it. And a frame still running (this thread's own, or another thread's) refuses to
be cleared. The frames that called the one that caught the error (finished too, by the time
this runs) hang off its ``f_back`` and hold what they were given: cleared as well.
"""

from __future__ import annotations

from inspect import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR, CO_ITERABLE_COROUTINE

__all__ = ["forget_frames"]

#: code flags of frames that ``frame.clear()`` would close (a generator's or coroutine's)
_RESUMABLE = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE


def forget_frames(caught: list[BaseException]) -> None:
    """Clear the locals of the frames the tracebacks of ``caught`` hold; empty ``caught``."""
    for exc in caught:
        frames = []
        tb = exc.__traceback__
        if tb is not None:
            back = tb.tb_frame.f_back
            while back is not None:
                frames.append(back)
                back = back.f_back
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for frame in frames:
            if not frame.f_code.co_flags & _RESUMABLE:
                try:
                    frame.clear()
                except RuntimeError:  # still running (this thread's, or another's)
                    pass
    caught.clear()
