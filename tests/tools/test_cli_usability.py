"""What a new user of ``aio-ascend`` runs into: output paths checked before the work, plot
formats by extension, progress without a terminal, help texts, ``bench --backend``, ``info``,
``--version`` and the bench table's layout (issue 18). Run in-process through ``main([...])``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

import aio_ascend
import aio_ascend._runtime as runtime_registry
from aio_ascend import tracing
from aio_ascend._tools import bench, cli, demo, progress, stats
from aio_ascend._tools.cli import main

# --- --version ------------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"aio-ascend {aio_ascend.__version__}"


# --- output paths are checked before any work -----------------------------------------------------


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The demo and the bench record that they ran instead of running."""
    ran: list[str] = []

    def fake_demo(cfg: Any) -> Any:
        ran.append("demo")
        raise AssertionError("the demo ran")

    def fake_bench(cfg: Any, only: Any = None) -> Any:
        ran.append("bench")
        raise AssertionError("the bench ran")

    monkeypatch.setattr(demo, "run_demo", fake_demo)
    monkeypatch.setattr(bench, "run_bench", fake_bench)
    return ran


def _bad_paths(tmp_path: Path) -> dict[str, str]:
    return {
        "missing folder": str(tmp_path / "nonexistent" / "out"),
        "a directory": str(tmp_path),
        "empty": "",
    }


@pytest.mark.parametrize("kind", ["missing folder", "a directory", "empty"])
@pytest.mark.parametrize(
    ("command", "option", "suffix"),
    [
        ("demo", "--trace", ".json"),
        ("demo", "--plot", ".png"),
        ("bench", "--json", ".json"),
        ("bench", "--trace", ".json"),
        ("bench", "--plot", ".png"),
    ],
)
def test_bad_output_path_fails_before_the_work(
    command: str,
    option: str,
    suffix: str,
    kind: str,
    tmp_path: Path,
    no_work: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _bad_paths(tmp_path)[kind]
    if kind == "missing folder":
        path += suffix
    assert main([command, option, path, "-q"]) == 2
    captured = capsys.readouterr()
    assert no_work == []
    assert captured.out == ""
    assert f"aio-ascend {command}: {option}" in captured.err
    assert "Traceback" not in captured.err


def test_every_bad_output_is_named_at_once(
    tmp_path: Path, no_work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert main(["demo", "--trace", str(missing / "t.json"), "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--trace" in err and "does not exist" in err
    assert "--plot" in err and "is a directory" in err
    assert no_work == []


@pytest.mark.parametrize("name", ["latency.txt", "latency", "latency.jpeg", "plot.png.gz"])
def test_plot_format_comes_from_the_extension_or_is_refused(
    name: str, tmp_path: Path, no_work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("demo", "bench"):
        assert main([command, "--plot", str(tmp_path / name), "-q"]) == 2
        err = capsys.readouterr().err
        assert ".png, .svg, .pdf" in err
    assert no_work == []
    assert not (tmp_path / name).exists()


def test_a_write_failure_after_the_work_is_a_message_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full_disk(*args: Any, **kwargs: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracing.Tracer, "write", full_disk)
    path = tmp_path / "t.json"
    code = main(["demo", "--requests", "5", "--size", "64", "-q", "--trace", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    assert "5/5 results match numpy" in captured.out  # the work itself went fine
    assert f"--trace {path}: cannot write" in captured.err
    assert "No space left" in captured.err


# --- progress without a terminal ------------------------------------------------------------------


def test_progress_without_a_terminal_writes_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress.time, "perf_counter", lambda: 100.0)
    out = io.StringIO()  # not a terminal
    bar = progress.Progress(out, 100, title="demo", unit="req")
    assert not bar.live
    for _ in range(100):
        bar.step()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split()[1] for line in lines] == [f"{k}/100" for k in range(10, 101, 10)]
    assert lines[-1].startswith("demo 100/100 done")


def test_progress_lines_for_named_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress.time, "perf_counter", lambda: 100.0)
    out = io.StringIO()
    bar = progress.Progress(out, 2, title="bench")
    bar.begin("first")
    bar.step()
    bar.begin("second")
    bar.step()
    assert out.getvalue().splitlines() == [
        "bench 1/2: first  (at 0.0 s)",
        "bench 2/2: second  (at 0.0 s)",
        "bench 2/2 done  (at 0.0 s)",
    ]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_in_place_on_a_terminal_only() -> None:
    assert progress.Progress(_Tty(), 1).live
    assert not progress.Progress(io.StringIO(), 1).live
    assert not progress.Progress(None, 1).live


@pytest.mark.parametrize("stream", [io.StringIO, _Tty])
def test_bench_counts_a_step_once_it_has_finished(
    stream: type[io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = stream()
    seen: list[str] = []

    def step(key: str) -> Any:
        def run(cfg: bench.BenchConfig) -> dict[str, Any]:
            seen.append(out.getvalue())
            return {}

        return (key, f"step {key}", run)

    monkeypatch.setattr(bench, "STEPS", [step("a"), step("b")])
    bench.run_bench(bench.BenchConfig(progress=out))
    while_last_ran = seen[-1].split("\r")[-1].splitlines()[-1]
    assert "2/2 done" not in seen[-1]
    assert "step b" in while_last_ran
    assert "done" in out.getvalue().splitlines()[-1]
    assert ("\r" in out.getvalue()) is (stream is _Tty)


def test_bench_progress_in_a_pipe_has_no_carriage_returns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--scale", "0.02", "--only", "packing"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines()[0].startswith("bench 1/1: host args packing")
    assert err.splitlines()[-1].startswith("bench 1/1 done")


# --- help -----------------------------------------------------------------------------------------


def test_every_command_and_option_is_described() -> None:
    parser = cli.build_parser()
    commands = cli.subcommands(parser)
    assert set(commands) == {"info", "demo", "bench"}
    for name, sub in commands.items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"


def test_bench_help_names_every_step_and_what_the_plot_is() -> None:
    bench_parser = cli.subcommands(cli.build_parser())["bench"]
    helps = {a.dest: a.help or "" for a in bench_parser._actions}
    for key, _, _ in bench.STEPS:
        assert key in helps["only"]
    assert "CDF" in helps["plot"] and ".svg" in helps["plot"]
    assert "histogram" not in helps["plot"]


# --- bench --backend ------------------------------------------------------------------------------


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bench.BenchConfig, Any]]:
    calls: list[tuple[bench.BenchConfig, Any]] = []

    def run(cfg: bench.BenchConfig, only: Any = None) -> dict[str, Any]:
        calls.append((cfg, only))
        poll = {
            "launches_per_s": 1000.0,
            "cpu_us_per_launch": 10.0,
            "single_launch_p50_us": 50.0,
            "single_launch_p99_us": 99.0,
        }
        return {"config": {"backend": cfg.backend}, "poll": poll, "ratios": {}}

    monkeypatch.setattr(bench, "run_bench", run)
    return calls


@pytest.mark.parametrize(
    ("backend", "message"),
    [("acl", "'acl' is not supported by the bench"), ("tpu", "unknown backend 'tpu'")],
)
def test_bench_refuses_backends_it_cannot_run(
    backend: str, message: str, fake_bench: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--backend", backend]) == 2
    assert message in capsys.readouterr().err
    assert fake_bench == []


def test_bench_cuda_where_it_does_not_run(
    monkeypatch: pytest.MonkeyPatch, fake_bench: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        runtime_registry, "probe_backend", lambda name: (False, "no NVIDIA driver found")
    )
    assert main(["bench", "--backend", "cuda"]) == 2
    assert "--backend cuda cannot run here: no NVIDIA driver found" in capsys.readouterr().err
    assert fake_bench == []


def test_bench_cuda_runs_the_backend_steps_only(
    monkeypatch: pytest.MonkeyPatch, fake_bench: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(runtime_registry, "probe_backend", lambda name: (True, "a GPU"))
    assert main(["bench", "--backend", "cuda", "--only", "poll,wake_poll"]) == 2
    assert "wake_poll measure the sim only" in capsys.readouterr().err
    assert fake_bench == []
    assert main(["bench", "--backend", "cuda", "-q"]) == 0
    ((cfg, only),) = fake_bench
    assert cfg.backend == "cuda"
    assert only == list(bench.BACKEND_STEPS)
    assert "throughput (noop kernels on the cuda backend)" in capsys.readouterr().out


def test_backend_steps_are_steps() -> None:
    assert set(bench.BACKEND_STEPS) <= {key for key, _, _ in bench.STEPS}


# --- info -----------------------------------------------------------------------------------------

ACL_WHY = (
    "cannot load libascendcl.so; tried:\n  libascendcl.so: cannot open shared object file\n"
    "Install CANN and source its set_env.sh (sets ASCEND_HOME_PATH), or pass library_path=."
)


def test_info_states_each_reason_once_and_only_what_the_cli_can_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def probe(name: str) -> tuple[bool, str]:
        return {"sim": (True, "embedded simulator"), "acl": (False, ACL_WHY)}.get(
            name, (False, "cuda-bindings is not installed")
        )

    monkeypatch.delenv("AIO_ASCEND_BACKEND", raising=False)
    monkeypatch.setattr(runtime_registry, "probe_backend", probe)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.count("cannot load libascendcl.so") == 1
    assert out.count("cuda-bindings is not installed") == 1
    assert "auto picks: sim" in out
    assert "why: no CANN install found" in out  # none here: auto simulates
    assert "library_path" not in out
    assert "LD_LIBRARY_PATH" in out
    assert "starlette" not in out


# --- the bench table ------------------------------------------------------------------------------


def test_loop_lag_rows_sit_under_the_headline_they_belong_to() -> None:
    result = {
        "config": {"backend": "sim"},
        "loop_lag": {
            "outstanding_at_peak": 10008,
            "lag_p50_ms": 0.11,
            "lag_p99_ms": 2.22,
            "lag_max_ms": 9.99,
            "hold_p99_ms": 1.11,
            "drain_p99_ms": 3.33,
            "issue_p99_ms": 7.77,
            "issue_max_ms": 8.88,
        },
    }
    lines = bench.format_table(result).splitlines()
    of_which = next(line for line in lines if "of which" in line)
    assert "1.11" in of_which and "3.33" in of_which
    assert "7.77" not in of_which
    issuing = next(line for line in lines if "7.77" in line)
    assert "issues" in issuing and "not in the target" in issuing
    # the issuing row is not indented under the outstanding headline's "of which"
    indent = len(issuing) - len(issuing.lstrip())
    assert indent < len(of_which) - len(of_which.lstrip())
    headline = next(line for line in lines if "2.22" in line)
    assert "outstanding" in headline and "7.77" not in headline


def test_percentile_is_the_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 50) == 3.0
    assert stats.percentile(values, 100) == 5.0
    assert stats.percentile([1.0, 2.0], 50) == 1.0  # rank 0.5 rounds to the even rank 0
    assert stats.percentile([], 50) != stats.percentile([], 50)  # NaN


def test_exit_statuses_are_documented() -> None:
    text = cli.build_parser().format_help()
    assert re.search(r"exit status: 0 success; 1 .*; 2 bad usage", text.replace("\n", " "))


def test_bench_measures_the_target_rows_in_rounds_and_pairs_their_ratios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine whose speed drifts between rows: (a) and (c) measured one after the other see
    # different machines. In rounds, each round runs every row once, and the ratio is the
    # median of the per-round ratios: here exactly 2, whatever the drift.
    order: list[str] = []
    speed = iter([1.0, 1.0, 5.0, 5.0, 2.0, 2.0])  # the machine's slowness, call by call

    def step(key: str, cost: float) -> Any:
        def run(cfg: bench.BenchConfig) -> dict[str, Any]:
            assert cfg.repeats == 1  # one measurement per round
            order.append(key)
            return {"cpu_us_per_launch": cost * next(speed), "host_allocations_after_warmup": 0}

        return (key, f"step {key}", run)

    monkeypatch.setattr(bench, "STEPS", [step("raw", 1.0), step("poll", 2.0)])
    r = bench.run_bench(bench.BenchConfig(progress=None, repeats=3))
    assert order == ["raw", "poll"] * 3
    assert r["raw"]["cpu_us_rounds"] == [1.0, 5.0, 2.0]
    assert r["poll"]["cpu_us_rounds"] == [2.0, 10.0, 4.0]
    assert r["ratios"]["host CPU per launch (c)/(a)"]["value"] == 2.0
    assert r["poll"]["cpu_us_per_launch"] == 4.0  # a row's own figure: its median round
