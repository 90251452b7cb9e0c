"""The plots of ``--plot PATH`` (``aio-ascend demo`` and ``bench``).

On top, optional bar panels side by side (the bench: throughput and host CPU per launch, each
step's value written at its bar, and its ratio to a reference step). Below, one panel per
latency measurement (a whole launch + await, device completion -> coroutine resumed, a demo
request); in each, every series is a CDF on a log latency axis whose share axis stretches the
tail (p50, p90, p99, p99.9 equally spaced), so the slowest samples stay readable instead of
being pressed into the top edge; p50 and p99 are marked and, with the maximum, written in the
legend. The file format follows the extension of ``PATH`` (:data:`PLOT_FORMATS`). matplotlib is
optional (the ``plot`` extra); it is imported only when a plot is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import percentile

__all__ = [
    "PLOT_FORMATS",
    "Bars",
    "PlotUnavailableError",
    "cdf_positions",
    "log_ticks",
    "plot_format",
    "plot_latencies",
    "tail_ticks",
]

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


@dataclass(frozen=True)
class Bars:
    """A bar panel: one value per series (drawn in the given order, top down).

    ``unit`` is written after each value; ``better`` (``"higher"`` or ``"lower"``) goes into the
    title; ``reference`` names the series each bar's ratio is given against (``None``: no
    ratios). The axis is logarithmic when the values span more than 20x.
    """

    values: Mapping[str, float]
    unit: str
    better: str = "higher"
    reference: str | None = None
    decimals: int = 0
    #: a line under the title (the bench: its target and whether this run met it)
    target: str = ""
    #: the series drawn in color (the bench: the scheduler's rows); the others are grey
    #: baselines. Empty: every bar in color.
    highlight: frozenset[str] = frozenset()


def cdf_positions(count: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The share of samples at or below each of ``count`` sorted samples, as plotted.

    Hazen's plotting positions ``(i - 0.5) / n``: the median sample sits at 0.5 and the largest
    at ``1 - 0.5 / n``, short of 1, which a tail-stretching axis (``-log10(1 - share)``) could
    not draw.
    """
    return (np.arange(1, count + 1, dtype=np.float64) - 0.5) / count


def _tail_forward(share: Any) -> Any:
    return -np.log10(1.0 - np.clip(share, 0.0, 1.0 - 1e-12))


def _tail_inverse(height: Any) -> Any:
    return 1.0 - np.power(10.0, -np.asarray(height, dtype=np.float64))


#: the shares marked on the tail axis and their labels
_TAIL_TICKS: tuple[tuple[float, str], ...] = (
    (0.0, "0"),
    (0.5, "p50"),
    (0.9, "p90"),
    (0.99, "p99"),
    (0.999, "p99.9"),
    (0.9999, "p99.99"),
)


def tail_ticks(top: float) -> list[tuple[float, str]]:
    """The marked shares up to ``top`` (the largest share plotted)."""
    return [(share, label) for share, label in _TAIL_TICKS if share <= top + 1e-12]


def _value(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def _draw_bars(ax: Any, title: str, bars: Bars, colors: Mapping[str, str]) -> None:
    names = [name for name, value in bars.values.items() if value > 0]
    values = [bars.values[name] for name in names]
    ys = np.arange(len(names))[::-1]
    logarithmic = max(values) / min(values) > 20
    floor = min(values) / 3 if logarithmic else 0.0
    ax.barh(
        ys,
        [v - floor for v in values],
        left=floor,
        color=[
            colors[name] if not bars.highlight or name in bars.highlight else "#9a9a9a"
            for name in names
        ],
        height=0.62,
    )
    ref_name = bars.reference or ""
    reference = bars.values.get(ref_name)
    for y, name, value in zip(ys, names, values, strict=True):
        text = f" {_value(value, bars.decimals)} {bars.unit}"
        if reference and name != ref_name:
            text += f"  ({value / reference:.3g}x {ref_name.split(' ', 1)[0]})"
        ax.text(value, y, text, va="center", ha="left", fontsize="small")
    ax.set_yticks(ys, names, fontsize="small")
    if logarithmic:
        ax.set_xscale("log")
        ax.set_xlim(floor, max(values) * 60)  # room for the labels right of the bars
    else:
        ax.set_xlim(0, max(values) * 1.9)
    ax.set_xticks([])
    ax.minorticks_off()
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    heading = f"{title} ({bars.better} is better)"
    ax.set_title(
        heading + (f"\n{bars.target}" if bars.target else ""), fontsize="medium", loc="left"
    )


def _draw_cdfs(ax: Any, panel: str, series: Mapping[str, Sequence[float]], plt: Any) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    everything = [v for values in series.values() for v in values]
    unit, div = ("ms", 1000.0) if percentile(everything, 50) > 2000 else ("µs", 1.0)
    low, high = min(everything) / div, max(everything) / div
    ax.set_yscale("function", functions=(_tail_forward, _tail_inverse))
    top = 0.0
    for index, (name, raw) in enumerate(series.items()):
        color = colors[index % len(colors)]
        values = np.sort(np.asarray(raw, dtype=np.float64) / div)
        shares = cdf_positions(len(values))
        top = max(top, float(shares[-1]))
        p50, p99 = percentile(values, 50), percentile(values, 99)
        ax.step(
            values,
            shares,
            where="post",
            color=color,
            linewidth=1.6,
            label=f"{name}: p50 {_number(p50)}, p99 {_number(p99)}, "
            f"max {_number(float(values[-1]))} {unit} (n={len(values):,})",
        )
        ax.plot([p50], [0.5], "o", color=color, markersize=5)
        ax.plot([p99], [0.99], "v", color=color, markersize=6)
    ax.set_xscale("log")
    lo, hi = low / 1.15, high * 1.15
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _number(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = tail_ticks(top)
    ax.set_ylim(0.0, _tail_inverse(float(_tail_forward(top)) * 1.04))
    ax.set_yticks([share for share, _ in ticks], [label for _, label in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    for share, _ in ticks[1:]:
        ax.axhline(share, color="grey", linewidth=0.6, linestyle=":")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.set_xlabel(f"latency ({unit}, log scale)")
    ax.set_ylabel("share of samples ≤ x (tail stretched)")
    ax.set_title(panel, fontsize="medium", loc="left")
    ax.legend(
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(0.0, -0.2),
        ncol=2 if len(series) > 4 else 1,
        frameon=False,
    )


def plot_latencies(
    path: str | os.PathLike[str],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str,
    bars: Mapping[str, Bars] | None = None,
) -> str:
    """Write ``panels`` (panel title -> series name -> latencies in µs) as one figure, below
    the bar panels of ``bars`` (panel title -> :class:`Bars`), which sit side by side on top.

    Each latency panel shows the CDF of each non-empty series on a log axis (in ms when the
    panel's median is over 2 ms), its share axis stretched towards the tail, p50 (circle) and
    p99 (triangle) marked. Panels without samples are left out. Returns the format written
    (see :func:`plot_format`).

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
    bar_panels = {
        name: panel
        for name, panel in (bars or {}).items()
        if any(v > 0 for v in panel.values.values())
    }
    if not kept and not bar_panels:
        raise ValueError("no latency samples to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'aio_ascend[plot]'"
        ) from exc

    # one color per bar name, the same in every bar panel
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = dict.fromkeys(name for panel in bar_panels.values() for name in panel.values)
    colors = {name: cycle[i % len(cycle)] for i, name in enumerate(names)}
    columns = max(1, len(bar_panels))
    mosaic: list[Any] = [[f"bars{i}" for i in range(columns)]] if bar_panels else []
    mosaic += [[f"cdf{i}"] * columns for i in range(len(kept))]
    legend_lines = max((len(series) for series in kept.values()), default=1) - 1
    cdf_height = 3.4 + 0.2 * (legend_lines + 1)
    bar_height = 0.45 * max((len(b.values) for b in bar_panels.values()), default=0) + 0.9
    heights = ([bar_height] if bar_panels else []) + [cdf_height] * len(kept)
    fig, axes = plt.subplot_mosaic(
        mosaic,
        figsize=(6.5 * columns if bar_panels else 9.5, sum(heights) + 0.5),
        dpi=110,
        layout="constrained",
        height_ratios=heights,
    )
    try:
        for i, (panel_title, panel) in enumerate(bar_panels.items()):
            _draw_bars(axes[f"bars{i}"], panel_title, panel, colors)
        for i, (panel_title, series) in enumerate(kept.items()):
            _draw_cdfs(axes[f"cdf{i}"], panel_title, series, plt)
        fig.suptitle(title, fontsize="medium")
        fig.savefig(path, format=fmt)
    finally:
        plt.close(fig)
    return fmt
