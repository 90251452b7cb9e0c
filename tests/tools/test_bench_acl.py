"""The bench's rows on the acl backend over its C test double (``aio_ascend/_tools/bench_acl.py``):
built from ``tests/doubles/`` in a checkout, (a) and (c) side by side, the native batch submit
reported; skipped with the reason where the double cannot be built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aio_ascend._runtime.acl.batch import native_submit
from aio_ascend._tools import bench_acl
from aio_ascend._tools.cli import main

KEY = "host CPU per launch (c)/(a), acl"


def test_the_acl_rows_and_their_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if bench_acl._compiler() is None:
        pytest.skip("no C compiler to build the acl test double")
    path = tmp_path / "bench.json"
    steps = ",".join(bench_acl.ACL_STEPS)
    args = ["--scale", "0.01", "--repeats", "1", "--only", steps, "-q", "--json", str(path)]
    code = main(["bench", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["config"]["native_submit"] is data["machine"]["native_submit"] is native_submit()
    assert data["acl_raw"]["cpu_us_per_launch"] > 0 and "native_submit" not in data["acl_raw"]
    assert data["acl_poll"]["native_submit"] is native_submit()
    assert data["acl_poll"]["launches_measured"] > 0
    if native_submit():  # the comparison row launches one by one
        assert data["acl_poll_ctypes"]["native_submit"] is False
    else:
        assert "skipped" in data["acl_poll_ctypes"]
    ratio = data["ratios"][KEY]
    expected = data["acl_poll"]["cpu_us_per_launch"] / data["acl_raw"]["cpu_us_per_launch"]
    assert ratio["value"] == round(expected, 3) and ratio["target"] == "<= 1.2"
    assert [name for name in data["ratios"] if name.startswith("host CPU per launch (c)/(a)")] == [
        KEY
    ]
    assert "the acl backend over its C test double" in out and KEY in out


def test_the_bench_process_leaves_no_build_folder_behind(tmp_path: Path) -> None:
    if bench_acl._compiler() is None:
        pytest.skip("no C compiler to build the acl test double")
    # its own temporary root, so that other processes' folders do not count
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    args = ["--scale", "0.002", "--repeats", "1", "--only", "acl_raw", "-q"]
    code = [sys.executable, "-m", "aio_ascend", "bench", *args]
    result = subprocess.run(code, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "(a) raw runtime loop" in result.stdout  # the double was built and ran
    assert list(tmp_path.iterdir()) == []


def test_without_the_doubles_source_the_rows_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_acl, "DOUBLE_SOURCE", tmp_path / "missing.c")
    monkeypatch.setattr(bench_acl, "_built", [])
    path = tmp_path / "bench.json"
    code = main(
        ["bench", "--scale", "0.01", "--only", "acl_raw,acl_poll", "-q", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert "not a checkout" in data["acl_raw"]["skipped"]
    assert KEY not in data["ratios"]
    assert "skipped: no acl test double source" in out


def test_the_bench_builds_the_double_the_tests_build() -> None:
    tests = Path(__file__).resolve().parents[1]
    assert tests / "doubles" / "acl_double.c" == bench_acl.DOUBLE_SOURCE


def test_info_says_how_acl_launches_are_submitted(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "acl submit" in x)
    assert ("native batch submit" in line) is native_submit()
    assert ("AIO_ASCEND_NATIVE=0" in line) is not native_submit()


def test_the_real_runtime_rows_say_why_without_its_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(bench_acl.REALRT_ENV, raising=False)
    monkeypatch.setattr(bench_acl, "_realrt_built", [])
    path = tmp_path / "bench.json"
    only = "realrt_raw,realrt_poll"
    code = main(["bench", "--scale", "0.01", "--only", only, "-q", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    for key in ("realrt_raw", "realrt_poll"):
        assert "AIO_ASCEND_REALRT_LIB is not set" in data[key]["skipped"]
    assert "real runtime: (a) raw runtime loop" in out and "skipped:" in out
