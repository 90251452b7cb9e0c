"""``aio-ascend bench`` on the real runtime over our driver (``realrt_raw``, ``realrt_poll``):
the rows beside the double's, measured when ``AIO_ASCEND_REALRT_LIB`` names the build.

The bench runs in a process of its own: it loads the runtime through an install folder of its
own (``lib64/libascendcl.so``), and the acl backend keeps one loaded library per file, named by
the first path it came through, which the other realrt tests of this process look at."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from realrt.fixture import realrt_library

from aio_ascend._tools import bench_acl

pytestmark = pytest.mark.realrt

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_measures_the_real_runtime(tmp_path: Path) -> None:
    env = {**os.environ, bench_acl.REALRT_ENV: str(realrt_library().parent)}
    path = tmp_path / "bench.json"
    only = "realrt_raw,realrt_poll"
    command = [sys.executable, "-m", "aio_ascend._tools.cli", "bench", "--scale", "0.01"]
    command += ["--repeats", "1", "--only", only, "-q", "--json", str(path)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(path.read_text())
    assert data["realrt_raw"]["cpu_us_per_launch"] > 0
    assert data["realrt_poll"]["launches_measured"] > 0
    assert "real runtime: host CPU per launch (c)/(a)" in done.stdout
