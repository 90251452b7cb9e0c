"""The ``aio-ascend`` command line, run in-process through ``main([...])``."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import check_trace

import aio_ascend._tools
from aio_ascend._tools import bench, demo, progress
from aio_ascend._tools.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STAGES = ("h2d", "compute", "d2h")


# --- info ---------------------------------------------------------------------------------------


def test_info_names_sim_and_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIO_ASCEND_BACKEND", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "sim   available" in out
    assert "auto picks: " in out
    assert "why: " in out
    for name in ("acl", "cuda", "python", "aio_ascend", "numpy", "anyio"):
        assert name in out


def test_info_reports_the_override(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
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


@pytest.mark.parametrize(
    "raised",
    [
        KeyboardInterrupt(),
        # what trio raises from a nursery: Ctrl-C with the cancellations it caused
        BaseExceptionGroup("Exceptions from Trio nursery", [KeyboardInterrupt(), ValueError()]),
    ],
)
def test_ctrl_c_is_one_line_and_status_130_on_every_loop(
    raised: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group holding the KeyboardInterrupt (trio) is the same interruption: it printed a
    traceback and exited 1 before."""
    from aio_ascend._tools import cli

    def interrupted(args: object) -> int:
        raise raised

    monkeypatch.setattr(cli, "cmd_demo", interrupted)
    assert main(["demo", "--loop", "trio"]) == 130
    assert capsys.readouterr().err.strip() == "aio-ascend: interrupted"


def test_a_group_without_ctrl_c_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from aio_ascend._tools import cli

    def failed(args: object) -> int:
        raise BaseExceptionGroup("boom", [ValueError("a bug")])

    monkeypatch.setattr(cli, "cmd_demo", failed)
    with pytest.raises(BaseExceptionGroup):
        main(["demo"])


def test_python_dash_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aio_ascend", "info"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "auto picks:" in proc.stdout


# --- demo ---------------------------------------------------------------------------------------


def test_demo_verifies_and_writes_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--requests",
            "40",
            "--streams",
            "2",
            "--concurrency",
            "8",
            "--size",
            "1024",
            "--trace",
            str(path),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "40/40 results match numpy" in captured.out
    assert "p50" in captured.out and "p99" in captured.out
    assert "requests/s" in captured.out
    assert "40/40" in captured.err  # the progress bar

    assert "wake" in captured.out and "on device" in captured.out  # the phases, from the trace

    summary = check_trace(json.loads(path.read_text()))
    # one track per stream, named after it, in the device's process; every request is a slice
    # on the "requests" track of the "requests" process
    streams = {f"{stage} #{k}" for stage in STAGES for k in (0, 1)}
    assert set(summary["tracks"]) == {"device 0 (sim)", "requests"}
    assert set(summary["tracks"]["device 0 (sim)"]) == streams
    assert summary["tracks"]["requests"] == {"requests": 40}
    # every request: 3 tasks on h2d (2 copies, 1 event), 4 on compute, 3 on d2h
    per_stage = Counter()
    for name, count in summary["tracks"]["device 0 (sim)"].items():
        per_stage[name.split()[0]] += count
    assert per_stage == {"h2d": 3 * 40, "compute": 4 * 40, "d2h": 3 * 40}
    assert {"axpy", "scale", "copy_to_device"} <= summary["slices"]
    # one flow per request: the request slice, then its ten tasks in the order they start on
    # their streams (forward in time): its first copy up, ..., its copy down's event last
    assert len(summary["flows"]) == 40
    for names in summary["flows"].values():
        assert names[0] == "requests"
        stages = [name.split()[0] for name in names[1:]]
        assert Counter(stages) == {"h2d": 3, "compute": 4, "d2h": 3}
        assert stages[0] == "h2d" and stages[-1] == "d2h"


@pytest.mark.parametrize("loop", ["uvloop", "trio"])
def test_demo_other_loops(loop: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip(loop)
    assert main(["demo", "--requests", "20", "--size", "256", "--loop", loop, "-q"]) == 0
    assert "20/20 results match numpy" in capsys.readouterr().out


def test_demo_wrong_result_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = demo.make_inputs

    def wrong_expectations(cfg: demo.DemoConfig) -> Any:
        return [(x, y, expected + 1) for x, y, expected in real(cfg)]

    monkeypatch.setattr(demo, "make_inputs", wrong_expectations)
    assert main(["demo", "--requests", "10", "--size", "64", "-q"]) == 1
    out = capsys.readouterr().out
    assert "0/10 results match numpy" in out
    assert "ERROR" in out


def test_demo_inputs_are_bounded_by_the_requests_and_a_memory_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``demo --size 100000000 --requests 2`` was killed for memory: it made its 16 input
    triples whatever the size (19 GB). No more than the requests, nor than the budget."""
    assert len(demo.make_inputs(demo.DemoConfig(requests=3, n=64))) == 3
    assert len(demo.make_inputs(demo.DemoConfig(requests=100, n=64))) == 16
    monkeypatch.setattr(demo, "INPUTS_BUDGET_BYTES", 5 * 3 * 4 * 64)
    assert len(demo.make_inputs(demo.DemoConfig(requests=100, n=64))) == 5
    monkeypatch.setattr(demo, "INPUTS_BUDGET_BYTES", 1)
    assert len(demo.make_inputs(demo.DemoConfig(requests=100, n=64))) == 1


# --- bench --------------------------------------------------------------------------------------


def test_bench_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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


def test_bench_shapes_report_their_rows_ratios_and_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.json"
    steps = "raw,plan,handler,roundtrip,fanout,producer_lag,graph"
    code = main(
        ["bench", "--scale", "0.01", "--repeats", "2", "--only", steps, "-q", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert set(steps.split(",")) <= set(data)
    assert data["raw"]["cpu_us_spread"]["n"] == 2
    spread = data["handler"]["cpu_us_spread"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert data["graph"]["replay_loop_cpu_us_per_kernel"] > 0
    assert {"cpu", "python", "aio_ascend", "date"} <= set(data["machine"])
    ratios = data["ratios"]
    for name in (
        "host CPU per launch, request-handler shape / (a)",
        "plan launch / (a)",
        "launch+await round trip / to_thread(noop), p50",
        "256 handlers / one handler, launches/s",
        "loop lag p99 (ms), one producer, 10k launches",
        "graph replay / one by one, loop CPU per kernel",
    ):
        assert isinstance(ratios[name]["value"], float | int), name
        assert name in out
    assert "request-handler shape" in out


def test_bench_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench-trace.json"
    assert (
        main(["bench", "--scale", "0.02", "--only", "wake_poll", "-q", "--trace", str(path)]) == 0
    )
    summary = check_trace(json.loads(path.read_text()))
    assert summary["tracks"] == {"device 0 (sim)": {"probe (poll)": bench.TRACED_ROUNDS}}
    assert "stamp" in summary["slices"]


# --- plots --------------------------------------------------------------------------------------


def test_demo_and_bench_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    demo_png = tmp_path / "demo.png"
    assert main(["demo", "--requests", "30", "--size", "256", "-q", "--plot", str(demo_png)]) == 0
    assert demo_png.read_bytes().startswith(PNG_MAGIC)
    bench_png = tmp_path / "bench.png"
    assert (
        main(["bench", "--scale", "0.02", "--only", "wake_poll", "-q", "--plot", str(bench_png)])
        == 0
    )
    assert bench_png.read_bytes().startswith(PNG_MAGIC)
    # steps without latency samples: said so, exit 1, nothing written
    none_png = tmp_path / "none.png"
    assert (
        main(["bench", "--scale", "0.02", "--only", "packing", "-q", "--plot", str(none_png)]) == 1
    )
    assert "no plot written" in capsys.readouterr().err
    assert not none_png.exists()


def test_plot_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    png = tmp_path / "x.png"
    assert main(["demo", "--requests", "5", "--plot", str(png)]) == 2
    assert main(["bench", "--only", "packing", "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "aio_ascend[plot]" in err
    assert not png.exists()


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


def test_bench_reports_another_streams_launches_under_big_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.json"
    code = main(["bench", "--scale", "0.02", "--only", "copy_isolation", "-q", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    x = json.loads(path.read_text())["copy_isolation"]
    assert x["block_mib"] >= 4 and x["launches"] > 0
    for name in ("idle", "busy"):
        for what in ("submit", "wake", "latency"):
            assert x[f"{name}_{what}_p95_ms"] >= 0
    ratios = json.loads(path.read_text())["ratios"]
    for name in (
        "copies: another stream's submit / wake delay p95 (ms)",
        "copies: another stream's launch latency p95 / idle",
    ):
        assert isinstance(ratios[name]["value"], float | int), name
        assert name in out
    assert "uploads and downloads" in out
