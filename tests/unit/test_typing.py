"""Typing that serves users: a misspelt ``config=`` key is a type error, ``aa.sim`` is visible to
type checkers. Checked by running mypy on a user's snippet (skipped without the lint extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

SNIPPET = '''
import aio_ascend as aa

async def main(s: aa.Stream, fn: aa.Function) -> None:
    await s.run(fn, 1, config={"timeout_s": 3, "schedule_mode": "batch"})
    await s.run(fn, 1, config={"timout_s": 3})  # line 6: misspelt
    lib: aa.sim.KernelLibrary = aa.sim.KernelLibrary()
    reveal_type(lib)
    reveal_type(await s.download(aa.DeviceBuffer.__new__(aa.DeviceBuffer)))
'''


def test_config_keys_and_the_sim_module_are_typed(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api", reason="mypy (the 'lint' extra) is not installed")
    path = tmp_path / "user_code.py"
    path.write_text(SNIPPET)
    stdout, _, _ = api.run(
        ["--strict", "--no-incremental", f"--cache-dir={tmp_path / 'cache'}", str(path)]
    )
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, stdout
    assert "user_code.py:6:" in errors[0]
    assert "LaunchConfigDict" in errors[0]
    assert "aio_ascend._runtime.sim.kernels.KernelLibrary" in stdout
    assert "ndarray" in stdout
