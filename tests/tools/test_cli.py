"""The ``aio-ascend`` command line, run in-process through ``main([...])``."""

from __future__ import annotations

import ast
import io
import itertools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import aio_ascend._tools
from aio_ascend._tools import demo, progress
from aio_ascend._tools.cli import main
from aio_ascend._tools.trace import LANE_STRIDE, Span, build_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PHASES = {"queued", "submitted/executing", "completed->resumed"}


def _tracks(trace: dict[str, Any]) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def _assert_valid_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Every slice is an X event on a named track, and slices on a track never overlap."""
    assert isinstance(trace["traceEvents"], list)
    names = _tracks(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_tid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in slices:
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        assert isinstance(e["dur"], int | float) and e["dur"] >= 0
        assert e["tid"] in names, f"slice on an unnamed track: {e}"
        by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, intervals in by_tid.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end - 0.01, f"overlapping slices on track {names[tid]!r}"
    return slices


# --- info ---------------------------------------------------------------------------------------


def test_info_names_sim_and_why(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIO_ASCEND_BACKEND", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "sim   available" in out
    assert "auto picks: " in out
    assert "why: " in out
    for name in ("acl", "cuda", "python", "aio_ascend", "numpy", "anyio"):
        assert name in out


def test_info_reports_the_override(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIO_ASCEND_BACKEND", "sim")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "auto picks: sim" in out
    assert "AIO_ASCEND_BACKEND=sim" in out


def test_usage_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["demo", "--requests", "0"]) == 2
    assert main(["bench", "--only", "nope"]) == 2
    assert "choose from" in capsys.readouterr().err
    assert main(["bench", "--backend", "acl"]) == 2
    assert "'acl' is not supported by the bench" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_python_dash_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aio_ascend", "info"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "auto picks:" in proc.stdout


# --- demo ---------------------------------------------------------------------------------------


def test_demo_verifies_and_writes_a_trace(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.json"
    code = main(["demo", "--requests", "40", "--streams", "2", "--concurrency", "8",
                 "--size", "1024", "--trace", str(path)])
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "40/40 results match numpy" in captured.out
    assert "p50" in captured.out and "p99" in captured.out
    assert "requests/s" in captured.out
    assert "40/40" in captured.err  # the progress bar

    trace = json.loads(path.read_text())
    slices = _assert_valid_trace(trace)
    names = _tracks(trace)
    # one track per stream (lane 0 of each), named after it; overflow lanes only below it
    streams = {name for tid, name in names.items() if tid % LANE_STRIDE == 0}
    assert streams == {f"{stage} #{k}" for stage in ("h2d", "compute", "d2h") for k in (0, 1)}
    for tid, name in names.items():
        assert name.startswith(names[tid - tid % LANE_STRIDE])
    # every request shows the three phases on each of its three streams
    assert {e["name"] for e in slices} == PHASES
    seen: dict[int, int] = defaultdict(int)
    for e in slices:
        seen[e["args"]["request"]] += 1
    assert seen == dict.fromkeys(range(40), 9)


@pytest.mark.parametrize("loop", ["uvloop", "trio"])
def test_demo_other_loops(loop: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip(loop)
    assert main(["demo", "--requests", "20", "--size", "256", "--loop", loop, "-q"]) == 0
    assert "20/20 results match numpy" in capsys.readouterr().out


def test_demo_wrong_result_exits_1(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    real = demo.make_inputs

    def wrong_expectations(cfg: demo.DemoConfig) -> Any:
        return [(x, y, expected + 1) for x, y, expected in real(cfg)]

    monkeypatch.setattr(demo, "make_inputs", wrong_expectations)
    assert main(["demo", "--requests", "10", "--size", "64", "-q"]) == 1
    out = capsys.readouterr().out
    assert "0/10 results match numpy" in out
    assert "ERROR" in out


# --- bench --------------------------------------------------------------------------------------


def test_bench_prints_the_table_and_writes_json(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.json"
    code = main(["bench", "--scale", "0.02", "--only", "packing,raw,poll", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "(a) raw synchronous runtime loop" in out
    assert "(c) scheduler, poll completion" in out
    assert "targets" in out
    data = json.loads(path.read_text())  # strict JSON: no NaN
    assert {"config", "packing", "raw", "poll", "ratios"} <= set(data)
    assert data["config"]["scale"] == 0.02
    assert data["poll"]["launches_per_s"] > 0


def test_bench_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench-trace.json"
    assert main(["bench", "--scale", "0.02", "--only", "wake_poll", "-q",
                 "--trace", str(path)]) == 0
    trace = json.loads(path.read_text())
    slices = _assert_valid_trace(trace)
    assert slices
    assert {e["name"] for e in slices} == {"completion->resume"}


# --- plots --------------------------------------------------------------------------------------


def test_demo_and_bench_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    demo_png = tmp_path / "demo.png"
    assert main(["demo", "--requests", "30", "--size", "256", "-q",
                 "--plot", str(demo_png)]) == 0
    assert demo_png.read_bytes().startswith(PNG_MAGIC)
    bench_png = tmp_path / "bench.png"
    assert main(["bench", "--scale", "0.02", "--only", "wake_poll", "-q",
                 "--plot", str(bench_png)]) == 0
    assert bench_png.read_bytes().startswith(PNG_MAGIC)
    # steps without latency samples: said so, exit 1, nothing written
    none_png = tmp_path / "none.png"
    assert main(["bench", "--scale", "0.02", "--only", "packing", "-q",
                 "--plot", str(none_png)]) == 1
    assert "no plot written" in capsys.readouterr().err
    assert not none_png.exists()


def test_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    png = tmp_path / "x.png"
    assert main(["demo", "--requests", "5", "--plot", str(png)]) == 2
    assert main(["bench", "--only", "packing", "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "aio_ascend[plot]" in err
    assert not png.exists()


# --- the trace writer ---------------------------------------------------------------------------


def test_trace_lanes_keep_groups_together_and_never_overlap() -> None:
    def span(track: str, phase: str, start: float, end: float, group: int | None) -> Span:
        return Span(track, phase, start, end, group, {"g": group})

    spans = [
        # two requests overlapping on one stream: the second spills into lane +1
        span("s", "queued", 0.0, 1.0, 1), span("s", "run", 1.0, 3.0, 1),
        span("s", "queued", 0.5, 2.0, 2), span("s", "run", 2.0, 4.0, 2),
        # a third starts after the first ended: back on lane 0
        span("s", "queued", 3.0, 3.5, 3),
        # ungrouped spans on a second track, serial: one lane
        span("t", "x", 0.0, 1.0, None), span("t", "x", 1.0, 2.0, None),
    ]
    trace = build_trace(spans, tracks=["s", "t", "idle"])
    slices = _assert_valid_trace(trace)
    names = _tracks(trace)
    assert sorted(names.values()) == ["idle", "s", "s +1", "t"]
    lanes: dict[Any, set[str]] = defaultdict(set)
    for e in slices:
        lanes[e["args"]["g"]].add(names[e["tid"]])
    assert lanes == {1: {"s"}, 2: {"s +1"}, 3: {"s"}, None: {"t"}}
    assert min(e["ts"] for e in slices) == 0.0
    assert {e["dur"] for e in slices if e["args"]["g"] == 1} == {1e6, 2e6}


# --- the progress bar ---------------------------------------------------------------------------


def test_progress_draws_new_labels_at_once_and_throttles_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    bar = progress.Progress(out, 4, title="t", unit="req", live=True)
    bar.step(label="a")  # first draw
    bar.step(label="a")  # same label, too soon: not drawn
    bar.step(label="b")  # new label: drawn
    assert out.getvalue().count("\r") == 2 and "3/4 b" in out.getvalue()
    assert not out.getvalue().endswith("\n")
    bar.step(label="b")  # the last step: always drawn, ends the line
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\n")
    assert "t [" + "#" * progress.WIDTH + "] 4/4 done" in out.getvalue()
    silent = progress.Progress(None, 2)
    silent.step(2)
    assert silent.done == 2


# --- layering: L5 uses the public API; only the bench's baselines touch L1/L2 -------------------


def test_tools_import_only_the_public_api_and_the_runtime_seam() -> None:
    allowed_private = {"aio_ascend._runtime", "aio_ascend._host"}
    package = Path(aio_ascend._tools.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = "aio_ascend._tools" if node.level == 1 else "aio_ascend"
                module = node.module or ""
                name = f"{base}.{module}".rstrip(".") if node.level else module
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if not name.startswith("aio_ascend.") or name.startswith("aio_ascend._tools"):
                continue
            top = ".".join(name.split(".")[:2])
            if top.split(".")[1].startswith("_"):
                assert top in allowed_private, f"{path.name} imports {name}"
                assert top != "aio_ascend._host" or path.name == "bench.py", (
                    f"{path.name} imports {name}"
                )
