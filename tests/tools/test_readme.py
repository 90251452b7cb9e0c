"""The README's example runs as written, and its commands match what CI runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs_on_asyncio_and_trio(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README, re.S)
    assert code is not None
    script = tmp_path / "example.py"
    for run in ("anyio.run(main)", "anyio.run(main, backend='trio')"):
        script.write_text(code.group(1).replace("anyio.run(main)", run))
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    lines = first_block.group(1).strip().splitlines()
    assert len(lines) == 2
    assert "aio-ascend demo" in lines[0]
    test_command = lines[1].split("&&")[-1].strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()
