"""Chrome / Perfetto trace JSON from timed spans (``--trace PATH`` of ``aio-ascend``).

A span is one phase of one piece of work on one *track* (a stream): ``(track, phase, start_s,
end_s)`` with ``time.perf_counter()`` seconds. The output is the JSON trace event format
(``{"traceEvents": [...]}``) that https://ui.perfetto.dev and ``chrome://tracing`` open:
``"X"`` complete events with ``ts``/``dur`` in microseconds and ``"M"`` metadata events naming
every track.

Complete events on one thread must nest properly: Perfetto drops slices that partly overlap
others on the same thread. Work in flight on a stream overlaps, so each track is laid out on as
few *lanes* as needed: lane 0 keeps the track's own name (one per stream, always present), and
only when spans overlap do further lanes named ``"<track> +1"``, ``"<track> +2"``... appear
just below it. The phases of one group (one request on one stream) stay together on one lane.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LANE_STRIDE",
    "PlotUnavailableError",
    "Span",
    "build_trace",
    "plot_latencies",
    "spans_from_tuples",
    "write_trace",
]

#: tid = track index * LANE_STRIDE + lane
LANE_STRIDE = 1000
_PID = 1


@dataclass(frozen=True)
class Span:
    """One phase of one piece of work on one track.

    :ivar track: the track (stream) name
    :ivar phase: the slice name, e.g. ``"queued"``
    :ivar start: ``time.perf_counter()`` seconds
    :ivar end: ``time.perf_counter()`` seconds (clamped to ``>= start``)
    :ivar group: spans of one group (e.g. one request's phases) share a lane; ``None`` makes
        the span a group of its own
    :ivar args: extra key/values shown when the slice is selected
    """

    track: str
    phase: str
    start: float
    end: float
    group: Any = None
    args: Mapping[str, Any] = field(default_factory=dict)


def spans_from_tuples(rows: Iterable[Sequence[Any]]) -> list[Span]:
    """``(track, phase, start_s, end_s)`` tuples (``BenchConfig.spans``) as :class:`Span`."""
    return [Span(str(r[0]), str(r[1]), float(r[2]), float(r[3])) for r in rows]


def _assign_lanes(spans: list[Span]) -> dict[int, int]:
    """Lane of every span of one track: greedy interval partition over groups."""
    groups: dict[Any, list[int]] = {}
    for index, span in enumerate(spans):
        key = ("span", index) if span.group is None else ("group", span.group)
        groups.setdefault(key, []).append(index)
    intervals = []
    for members in groups.values():
        start = min(spans[i].start for i in members)
        end = max(max(spans[i].end, spans[i].start) for i in members)
        intervals.append((start, end, members))
    intervals.sort(key=lambda item: (item[0], item[1]))
    lane_end: list[float] = []
    lane_of: dict[int, int] = {}
    for start, end, members in intervals:
        lane = next((k for k, busy in enumerate(lane_end) if busy <= start), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(end)
        lane_end[lane] = end
        for i in members:
            lane_of[i] = lane
    return lane_of


def build_trace(
    spans: Iterable[Span],
    *,
    tracks: Sequence[str] = (),
    process_name: str = "aio_ascend",
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict.

    :param tracks: track names in display order; every one gets a named track even without
        spans (tracks only seen in ``spans`` follow, in order of appearance)
    """
    spans = list(spans)
    order: list[str] = list(dict.fromkeys(tracks))
    for span in spans:
        if span.track not in order:
            order.append(span.track)
    origin = min((s.start for s in spans), default=0.0)
    by_track: dict[str, list[Span]] = {name: [] for name in order}
    for span in spans:
        by_track[span.track].append(span)

    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "tid": 0,
         "args": {"name": process_name}},
    ]
    slices: list[dict[str, Any]] = []
    for track_index, name in enumerate(order):
        members = by_track[name]
        lane_of = _assign_lanes(members)
        lanes = max(lane_of.values(), default=0) + 1
        for lane in range(lanes):
            tid = (track_index + 1) * LANE_STRIDE + lane
            label = name if lane == 0 else f"{name} +{lane}"
            events.append(
                {"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid,
                 "args": {"name": label}}
            )
            events.append(
                {"ph": "M", "name": "thread_sort_index", "pid": _PID, "tid": tid,
                 "args": {"sort_index": tid}}
            )
        for i, span in enumerate(members):
            start = span.start
            end = max(span.end, start)
            event: dict[str, Any] = {
                "ph": "X",
                "name": span.phase,
                "cat": name,
                "pid": _PID,
                "tid": (track_index + 1) * LANE_STRIDE + lane_of[i],
                "ts": round((start - origin) * 1e6, 3),
                "dur": round((end - start) * 1e6, 3),
            }
            if span.args:
                event["args"] = dict(span.args)
            slices.append(event)
    slices.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    trace: dict[str, Any] = {"traceEvents": events + slices, "displayTimeUnit": "ms"}
    if metadata:
        trace["otherData"] = dict(metadata)
    return trace


def write_trace(
    path: str | os.PathLike[str],
    spans: Iterable[Span],
    *,
    tracks: Sequence[str] = (),
    process_name: str = "aio_ascend",
    metadata: Mapping[str, Any] | None = None,
) -> int:
    """Write the trace JSON to ``path``; return the number of slices written."""
    trace = build_trace(spans, tracks=tracks, process_name=process_name, metadata=metadata)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(trace, fh, separators=(",", ":"))
    return sum(1 for e in trace["traceEvents"] if e["ph"] == "X")


# --- latency histogram (``--plot PATH``) -----------------------------------------------------


class PlotUnavailableError(ImportError):
    """matplotlib is not installed (``pip install 'aio_ascend[plot]'``)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank on the sorted values); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


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
            ax.hist(values, bins=bins, alpha=0.55, color=color,
                    label=f"{name}: n={len(values)}, p50 {p50:,.3g} {unit}, "
                          f"p99 {p99:,.3g} {unit}")
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
        handles += [Line2D([], [], color="grey", linestyle="--"),
                    Line2D([], [], color="grey", linestyle=":")]
        labels += ["p50", "p99"]
        ax.legend(handles, labels, fontsize="small", loc="upper center",
                  bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
