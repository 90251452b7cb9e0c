"""Latency histograms as PNG (``--plot PATH`` of ``aio-ascend demo`` and ``bench``).

matplotlib is optional (the ``plot`` extra); it is imported only when a plot is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .trace import percentile

__all__ = ["PlotUnavailableError", "plot_latencies"]


class PlotUnavailableError(ImportError):
    """matplotlib is not installed (``pip install 'aio_ascend[plot]'``)."""


def plot_latencies(
    path: str | os.PathLike[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
) -> None:
    """Write a histogram PNG of each non-empty series of latencies (in µs), p50/p99 marked.

    The axis switches to milliseconds when the median is over 2 ms, and to a log scale when
    the samples span more than a factor of 20.

    :raises PlotUnavailableError: matplotlib is missing
    :raises ValueError: every series is empty
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'aio_ascend[plot]'"
        ) from exc
    import numpy as np

    data = {name: [v for v in values if v > 0] for name, values in series.items()}
    data = {name: values for name, values in data.items() if values}
    if not data:
        raise ValueError("no latency samples to plot")
    everything = [v for values in data.values() for v in values]
    if percentile(everything, 50) > 2000:
        unit, div = "ms", 1000.0
    else:
        unit, div = "µs", 1.0
    data = {name: [v / div for v in values] for name, values in data.items()}
    low = min(min(v) for v in data.values())
    high = max(max(v) for v in data.values())
    log = high / low > 20
    spacing = np.geomspace if log else np.linspace
    bins: list[float] = spacing(low, high * 1.0001, 70).tolist()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    try:
        for index, (name, values) in enumerate(data.items()):
            color = colors[index % len(colors)]
            p50, p99 = percentile(values, 50), percentile(values, 99)
            ax.hist(
                values,
                bins=bins,
                alpha=0.55,
                color=color,
                label=f"{name}: n={len(values)}, p50 {p50:,.3g} {unit}, p99 {p99:,.3g} {unit}",
            )
            ax.axvline(p50, color=color, linestyle="--", linewidth=1.2)
            ax.axvline(p99, color=color, linestyle=":", linewidth=1.6)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.4g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"latency ({unit})")
        ax.set_ylabel("samples per bin")
        ax.set_title(title, fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)
        ax.margins(y=0.15)
        handles, labels = ax.get_legend_handles_labels()
        handles += [
            Line2D([], [], color="grey", linestyle="--"),
            Line2D([], [], color="grey", linestyle=":"),
        ]
        labels += ["p50", "p99"]
        ax.legend(
            handles,
            labels,
            fontsize="small",
            loc="upper center",
            bbox_to_anchor=(0.5, -0.13),
            ncol=1,
            frameon=False,
        )
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
