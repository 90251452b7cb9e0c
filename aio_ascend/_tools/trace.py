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

:func:`percentile` here is the one percentile of the bench, the demo and the plots (numpy's
nearest-rank method).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "LANE_STRIDE",
    "Span",
    "build_trace",
    "percentile",
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
        {"ph": "M", "name": "process_name", "pid": _PID, "tid": 0, "args": {"name": process_name}},
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
                {"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid, "args": {"name": label}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": _PID,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
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


# --- summary statistics -----------------------------------------------------------------------


def percentile(values: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, the nearest-rank sample; NaN when empty.

    ``numpy.percentile(..., method="nearest")``: the sample at rank ``round(q / 100 * (n - 1))``
    of the sorted values, ties to the even rank (as Python's ``round``).
    """
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="nearest"))
