"""The bench's targets: the rows they divide, measured in rounds, and the ratios with verdicts.

A shared VM's speed drifts between rows: (a) measured first and (c) a minute later see
different machines, and their ratio moves with the drift. With ``repeats`` above 1 the rows
whose ratios are targets run in rounds instead: each round measures every row of its group
once, in turn, so that drift falls on all of them alike, and a ratio of two rows is the median
of their per-round ratios. A row's own figure is still the median of its rounds.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from collections.abc import Callable
from typing import Any

from .bench_acl import acl_ratios
from .bench_shapes import spread
from .progress import Progress
from .stats import cpu_ratio

__all__ = ["INTERLEAVED", "ratios", "round_groups", "run_rounds"]

Step = tuple[str, str, Callable[[Any], dict[str, Any]]]

#: the rows measured in rounds together (each group: the rows one target ratio divides)
INTERLEAVED = (("raw", "poll", "handler", "plan"), ("acl_raw", "acl_poll", "acl_poll_ctypes"))


def round_groups(steps: list[Step], repeats: int) -> dict[str, list[Step]]:
    """Each step of ``steps`` that runs in rounds, keyed by name, to its group (in order):
    groups of :data:`INTERLEAVED` with at least two rows selected, when ``repeats`` > 1."""
    grouped: dict[str, list[Step]] = {}
    if repeats > 1:
        for keys in INTERLEAVED:
            group = [step for step in steps if step[0] in keys]
            if len(group) > 1:
                grouped.update((step[0], group) for step in group)
    return grouped


def run_rounds(cfg: Any, group: list[Step], progress: Progress) -> dict[str, dict[str, Any]]:
    """``cfg.repeats`` rounds of ``group``, each row once a round (``repeats=1``); per row,
    its rounds merged."""
    once = dataclasses.replace(cfg, repeats=1)
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in group}
    for round_ in range(cfg.repeats):
        for key, label, fn in group:
            progress.begin(f"{label} (round {round_ + 1}/{cfg.repeats})")
            gc.collect()
            runs[key].append(fn(once))
            progress.step()
    return {key: _merged(results) for key, results in runs.items()}


def _merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    # one row over its rounds: the median round's figures, the CPU's median, spread and rounds
    if not all("cpu_us_per_launch" in run for run in runs):
        return runs[0]  # a step that did not run here (its double was not built): says why
    cpu = [run["cpu_us_per_launch"] for run in runs]
    middle = sorted(runs, key=lambda run: run["cpu_us_per_launch"])[len(runs) // 2]
    return {
        **middle,
        "cpu_us_per_launch": statistics.median(cpu),
        "cpu_us_spread": spread(cpu),
        "cpu_us_rounds": cpu,
    }


def ratios(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The targets of the scheduler issue, as measured ratios with a met/not-met verdict."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float, target: str, met: bool) -> None:
        out[name] = {"value": round(value, 3), "target": target, "met": bool(met)}

    if "poll" in r and "naive" in r:
        v = r["poll"]["launches_per_s"] / r["naive"]["launches_per_s"]
        add("throughput (c)/(b)", v, ">= 15", v >= 15)
        v = r["poll"]["single_launch_p50_us"] / r["naive"]["single_launch_p50_us"]
        add("single-launch latency (c)/(b)", v, "<= 1", v <= 1)
    for key, name, limit in (
        ("poll", "host CPU per launch (c)/(a)", 2.5),
        ("plan", "plan launch / (a)", 1.6),
        ("handler", "host CPU per launch, request-handler shape / (a)", 3.5),
    ):
        if key in r and "raw" in r:
            v = cpu_ratio(r[key], r["raw"])
            add(name, v, f"<= {limit}", v <= limit)
    if "roundtrip" in r:
        x = r["roundtrip"]
        v = x["launch_await_p50_us"] / x["to_thread_noop_p50_us"]
        add("launch+await round trip / to_thread(noop), p50", v, "<= 1.25", v <= 1.25)
    if "fanout" in r:
        x = r["fanout"]
        v = x["many_launches_per_s"] / x["one_launches_per_s"]
        add("256 handlers / one handler, launches/s", v, ">= 10", v >= 10)
    if "producer_lag" in r:
        v = r["producer_lag"]["lag_p99_ms"]
        add("loop lag p99 (ms), one producer, 10k launches", v, "<= 5", v <= 5)
    if "graph" in r:
        x = r["graph"]
        v = x["replay_loop_cpu_us_per_kernel"] / x["single_loop_cpu_us_per_kernel"]
        add("graph replay / one by one, loop CPU per kernel", v, "<= 0.05", v <= 0.05)
    if "wake_poll" in r and "bare_wakes" in r:
        v = r["wake_poll"]["p50_us"] / r["bare_wakes"]["call_soon_threadsafe_p50_us"]
        add("wake p50 / bare call_soon_threadsafe", v, "<= 1.5", v <= 1.5)
    if "wake_churn" in r and "wake_poll" in r:
        v = r["wake_churn"]["p50_us"] / r["wake_poll"]["p50_us"]
        add("wake p50 under churn / idle", v, "<= 2", v <= 2)
    if "loop_lag" in r:
        v = r["loop_lag"]["lag_p99_ms"]
        add("loop lag p99 (ms), 10k outstanding", v, "<= 3", v <= 3)
    if "copy_isolation" in r:
        x = r["copy_isolation"]
        limit = x["limit_ms"]  # max(0.3 x one copy's own time, 15 ms)
        v = max(x["busy_submit_p95_ms"], x["busy_wake_p95_ms"])
        add(
            "copies: another stream's submit / wake delay p95 (ms)",
            v,
            f"<= {limit:.0f}",
            v <= limit,
        )
        v = x["busy_latency_p95_ms"] / x["idle_latency_p95_ms"]
        bound = 1 + limit / x["idle_latency_p95_ms"]
        add("copies: another stream's launch latency p95 / idle", v, f"<= {bound:.0f}", v <= bound)
    if "poll" in r:
        v = r["poll"]["host_allocations_after_warmup"]
        add("host-buffer allocations after warm-up", v, "== 0", v == 0)
    if "packing" in r:
        v = r["packing"]["pool_allocations_per_100k"]
        add("pool allocations per 100k launches", v, "== 0", v == 0)
    acl_ratios(r, add)
    return out
