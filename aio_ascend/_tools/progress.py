"""The one progress display of ``aio-ascend demo`` and ``aio-ascend bench`` (on stderr).

On a terminal it is a bar redrawn in place (carriage returns); anywhere else (a pipe, a file, a
CI log) it writes plain lines, never a carriage return: one per :meth:`Progress.begin` and one
per tenth of the total.
"""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress", "is_terminal"]

#: characters of the bar itself
WIDTH = 24
#: at most one redraw per this many seconds while the label stays the same (terminal only)
MIN_INTERVAL_S = 0.1
#: without a terminal, a plain line each time this fraction of the total more is done
PLAIN_EVERY = 0.1


def is_terminal(out: TextIO | None) -> bool:
    """Whether ``out`` is an interactive terminal (where redrawing in place works)."""
    if out is None:
        return False
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Progress:
    """Progress of ``total`` units of work, shown on ``out`` (``None``: count silently).

    :meth:`begin` names the unit that starts now (the bench's steps); :meth:`step` counts units
    done, so ``done/total`` only reaches ``total`` once the last one has finished.

    On a terminal (``live``; by default when ``out.isatty()``) one line is redrawn in place:
    ``[title] [####....] done/total [label] [rate unit/s] elapsed``, at once when the label
    changes, otherwise at most every :data:`MIN_INTERVAL_S`, and the last step always, ending
    the line. Elsewhere each :meth:`begin` writes ``title k/total: label``, counting goes out
    as a plain line at every tenth of ``total``, and the last step writes ``title total/total
    done``.

    :param live: redraw in place (``True``) or write plain lines (``False``); ``None``: decide
        by ``out.isatty()``
    """

    def __init__(
        self,
        out: TextIO | None,
        total: int,
        *,
        title: str = "",
        unit: str = "",
        live: bool | None = None,
    ) -> None:
        self.out = out
        self.total = total
        self.title = title
        self.unit = unit
        self.live = is_terminal(out) if live is None else live
        self.done = 0
        self.label = ""
        self.started = time.perf_counter()
        self._drawn_at = 0.0
        self._drawn_label: str | None = None
        self._drawn_width = 0
        self._labelled = False
        self._plain_next = self._plain_step()

    def begin(self, label: str) -> None:
        """Unit ``done + 1`` of ``total`` starts now: show ``label`` at once."""
        self.label = label
        self._labelled = True
        if self.out is None:
            return
        if self.live:
            self._draw(time.perf_counter())
        else:
            self._line(f"{self.done + 1}/{self.total}: {label}")

    def step(self, count: int = 1, label: str | None = None) -> None:
        """Count ``count`` more units done (``label``: what runs now, if it changed)."""
        self.done += count
        if label is not None:
            self.label = label
        if self.out is None:
            return
        now = time.perf_counter()
        finished = self.done >= self.total
        if not self.live:
            if finished:
                self._line(f"{self.done}/{self.total} done", now, rate=True)
            elif not self._labelled and self.done >= self._plain_next:
                self._line(f"{self.done}/{self.total}", now, rate=True)
            return
        if (
            not finished
            and self.label == self._drawn_label
            and now - self._drawn_at < MIN_INTERVAL_S
        ):
            return
        self._draw(now)

    def _plain_step(self) -> int:
        return max(1, int(self.total * PLAIN_EVERY))

    def _rate(self, elapsed: float) -> str:
        return f"{self.done / elapsed if elapsed > 0 else 0.0:,.0f} {self.unit}/s"

    def _line(self, text: str, now: float | None = None, *, rate: bool = False) -> None:
        """A plain line (no terminal): ``title text  ([rate, ]at elapsed)``."""
        assert self.out is not None
        elapsed = (time.perf_counter() if now is None else now) - self.started
        stamp = f"at {elapsed:.1f} s"
        if rate and self.unit:
            stamp = f"{self._rate(elapsed)}, {stamp}"
        title = f"{self.title} " if self.title else ""
        self.out.write(f"{title}{text}  ({stamp})\n")
        self.out.flush()
        step = self._plain_step()
        self._plain_next = (self.done // step + 1) * step

    def _draw(self, now: float) -> None:
        """Redraw the bar in place (terminal)."""
        assert self.out is not None
        finished = self.done >= self.total
        self._drawn_at = now
        self._drawn_label = self.label
        filled = min(WIDTH, WIDTH * self.done // self.total) if self.total > 0 else WIDTH
        parts = [self.title] if self.title else []
        parts.append(f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total}")
        if finished:
            parts.append("done")
        elif self.label:
            parts.append(self.label)
        elapsed = now - self.started
        if self.unit:
            parts.append(f"{self._rate(elapsed):>14}")
        parts.append(f"{elapsed:6.1f}s")
        text = " ".join(parts)
        # pad over what a longer earlier line left on screen
        padded = text.ljust(self._drawn_width)
        self._drawn_width = max(self._drawn_width, len(text))
        self.out.write("\r" + padded)
        if finished:
            self.out.write("\n")
        self.out.flush()
