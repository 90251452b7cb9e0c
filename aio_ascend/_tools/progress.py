"""The one progress bar of ``aio-ascend demo`` and ``aio-ascend bench`` (drawn on stderr)."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress"]

#: characters of the bar itself
WIDTH = 24
#: a step label is padded to this width, so a shorter one overwrites a longer one
LABEL_WIDTH = 38
#: at most one redraw per this many seconds while the label stays the same
MIN_INTERVAL_S = 0.1


class Progress:
    """A one-line text progress bar, redrawn in place on ``out`` (``None``: count silently).

    ``[title] [####....] done/total [label] [rate unit/s] elapsed``. A step that changes the
    label is drawn at once (the bench names the step about to run); otherwise redraws come at
    most every :data:`MIN_INTERVAL_S`; the last step is always drawn and ends the line.
    """

    def __init__(self, out: TextIO | None, total: int, *, title: str = "", unit: str = "") -> None:
        self.out = out
        self.total = total
        self.title = title
        self.unit = unit
        self.done = 0
        self.started = time.perf_counter()
        self._drawn_at = 0.0
        self._drawn_label: str | None = None

    def step(self, count: int = 1, label: str = "") -> None:
        """Count ``count`` more done (``label``: what runs now) and redraw when due."""
        self.done += count
        if self.out is None:
            return
        now = time.perf_counter()
        finished = self.done >= self.total
        if not finished and label == self._drawn_label and now - self._drawn_at < MIN_INTERVAL_S:
            return
        self._drawn_at = now
        self._drawn_label = label
        filled = min(WIDTH, WIDTH * self.done // self.total) if self.total > 0 else WIDTH
        elapsed = now - self.started
        parts = [self.title] if self.title else []
        parts.append(f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total}")
        if label:
            parts.append(f"{label:<{LABEL_WIDTH}}")
        if self.unit:
            rate = self.done / elapsed if elapsed > 0 else 0.0
            parts.append(f"{rate:8.0f} {self.unit}/s")
        parts.append(f"{elapsed:6.1f}s")
        self.out.write("\r" + " ".join(parts))
        if finished:
            self.out.write("\n")
        self.out.flush()
