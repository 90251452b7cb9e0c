"""``aio-ascend bench`` on the real runtime over our driver (``realrt_raw``, ``realrt_poll``):
the rows beside the double's, measured when ``AIO_ASCEND_REALRT_LIB`` names the build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from realrt.fixture import realrt_library

from aio_ascend._tools import bench_acl
from aio_ascend._tools.cli import main

pytestmark = pytest.mark.realrt


def test_the_bench_measures_the_real_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(bench_acl.REALRT_ENV, str(realrt_library().parent))
    monkeypatch.setattr(bench_acl, "_realrt_built", [])
    path = tmp_path / "bench.json"
    args = ["--scale", "0.01", "--repeats", "1", "--only", "realrt_raw,realrt_poll"]
    code = main(["bench", *args, "-q", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["realrt_raw"]["cpu_us_per_launch"] > 0
    assert data["realrt_poll"]["launches_measured"] > 0
    assert "real runtime: host CPU per launch (c)/(a)" in out
