"""Latency plots (``--plot PATH`` of ``aio-ascend demo`` and ``bench``).

One panel per measurement (a whole launch + await, device completion -> coroutine resumed, a
demo request); in each, every series is drawn as a CDF on a log latency axis, with its p50 and
p99 marked and written in the legend. The file format follows the extension of ``PATH``
(:data:`PLOT_FORMATS`). matplotlib is optional (the ``plot`` extra); it is imported only when a
plot is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from .stats import percentile

__all__ = ["PLOT_FORMATS", "PlotUnavailableError", "log_ticks", "plot_format", "plot_latencies"]

#: extension -> what it is; each is written by matplotlib's Agg backend without extra packages
PLOT_FORMATS = {"png": "PNG image", "svg": "SVG drawing", "pdf": "PDF document"}


class PlotUnavailableError(ImportError):
    """matplotlib is not installed (``pip install 'aio_ascend[plot]'``)."""


def plot_format(path: str | os.PathLike[str]) -> str:
    """The format named by ``path``'s extension (``"png"``, ``"svg"`` or ``"pdf"``).

    :raises ValueError: no extension, or one that is not in :data:`PLOT_FORMATS`
    """
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        choices = ", ".join(f".{name}" for name in PLOT_FORMATS)
        got = f"'.{ext}'" if ext else "no extension"
        raise ValueError(f"the plot format follows the file's extension ({choices}); got {got}")
    return ext


#: mantissas per decade, coarse to fine, and the fewest ticks each must give to be used
_TICK_TIERS: tuple[tuple[tuple[float, ...], int], ...] = (
    ((1, 2, 5), 3),
    ((1, 2, 3, 4, 5, 6, 7, 8, 9), 4),
    ((1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9), 0),
)


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values for a log axis from ``low`` to ``high`` (> 0) that read as plain numbers.

    1-2-5 steps per decade when that gives at least three ticks; for narrower ranges all of
    1..9 per decade, then finer steps (1.2, 1.5, 2.5), and the two ends rounded when even
    that leaves fewer than two (a very narrow range).
    """
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"log_ticks needs 0 < low <= high, got {low}, {high}")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks: list[float] = []
    for mantissas, enough in _TICK_TIERS:
        ticks = [
            float(f"{m * 10.0**e:.6g}")
            for e in range(first, last + 1)
            for m in mantissas
            if low <= m * 10.0**e <= high
        ]
        if len(ticks) >= max(enough, 2):
            return ticks
    return sorted({float(f"{low:.4g}"), float(f"{high:.4g}")} | set(ticks))


def _number(value: float) -> str:
    """A latency as people write it: ``1,750`` or ``99.7`` or ``0.05``, never ``1.75e+03``."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def plot_latencies(
    path: str | os.PathLike[str],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str,
) -> str:
    """Write ``panels`` (panel title -> series name -> latencies in µs) as one figure.

    Each panel shows the CDF of each non-empty series on a log axis (in ms when the panel's
    median is over 2 ms), p50 (circle) and p99 (triangle) marked on their own grid lines.
    Panels without samples are left out. Returns the format written (see
    :func:`plot_format`).

    :raises ValueError: an extension that names no supported format, or no samples at all
    :raises PlotUnavailableError: matplotlib is missing
    """
    fmt = plot_format(path)
    kept = {
        panel: {name: [v for v in values if v > 0] for name, values in series.items()}
        for panel, series in panels.items()
    }
    kept = {
        panel: {name: values for name, values in series.items() if values}
        for panel, series in kept.items()
    }
    kept = {panel: series for panel, series in kept.items() if series}
    if not kept:
        raise ValueError("no latency samples to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'aio_ascend[plot]'"
        ) from exc

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rows = len(kept)
    legend_lines = max(len(series) for series in kept.values()) - 1
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(9.5, rows * (3.2 + 0.2 * (legend_lines + 1)) + 0.5),
        dpi=110,
        squeeze=False,
        layout="constrained",
    )
    try:
        for ax, (panel, series) in zip(axes[:, 0], kept.items(), strict=True):
            everything = [v for values in series.values() for v in values]
            unit, div = ("ms", 1000.0) if percentile(everything, 50) > 2000 else ("µs", 1.0)
            low, high = min(everything) / div, max(everything) / div
            for index, (name, raw) in enumerate(series.items()):
                color = colors[index % len(colors)]
                values = np.sort(np.asarray(raw, dtype=np.float64) / div)
                fraction = np.arange(1, len(values) + 1) / len(values)
                p50, p99 = percentile(values, 50), percentile(values, 99)
                ax.step(
                    values,
                    fraction,
                    where="post",
                    color=color,
                    linewidth=1.6,
                    label=f"{name}: p50 {_number(p50)} {unit}, p99 {_number(p99)} {unit} "
                    f"(n={len(values):,})",
                )
                ax.plot([p50], [0.5], "o", color=color, markersize=5)
                ax.plot([p99], [0.99], "v", color=color, markersize=6)
            ax.set_xscale("log")
            lo, hi = low / 1.15, high * 1.15
            ax.set_xlim(lo, hi)
            ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _number(v)))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_ylim(0, 1.02)
            ax.set_yticks([0, 0.25, 0.5, 0.75, 0.99])
            ax.set_yticklabels(["0", "25 %", "p50", "75 %", "p99"])
            ax.axhline(0.5, color="grey", linewidth=0.6, linestyle=":")
            ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
            ax.grid(True, axis="x", which="major", alpha=0.3)
            ax.set_xlabel(f"latency ({unit}, log scale)")
            ax.set_ylabel("share of samples ≤ x")
            ax.set_title(panel, fontsize="medium", loc="left")
            ax.legend(
                fontsize="small",
                loc="upper left",
                bbox_to_anchor=(0.0, -0.2),
                ncol=2 if len(series) > 4 else 1,
                frameon=False,
            )
        fig.suptitle(title, fontsize="medium")
        fig.savefig(path, format=fmt)
    finally:
        plt.close(fig)
    return fmt
