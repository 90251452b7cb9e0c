"""The two rewritten hicann/runtime samples (``examples/acl_launch_kernel.py``,
``examples/acl_multi_stream.py``) on the real CANN runtime over our fake driver: ``--backend acl
--library <fixture>/libacl_rt.so`` and a kernel object of ``make_kernel_elf.py`` with the
samples' kernels (``SAMPLE_KERNELS``), whose launches the fake driver runs on the host."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from realrt.fixture import fakehal, realrt_library
from realrt.make_kernel_elf import SAMPLE_KERNELS, write_kernel_elf

pytestmark = pytest.mark.realrt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"realrt_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["placeholder", "simple"])
def test_acl_launch_kernel_sample(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    library = realrt_library()
    fakehal().reset()
    kernel = write_kernel_elf(
        tmp_path / f"add_custom_{mode}.o", SAMPLE_KERNELS[f"add_custom_{mode}"]
    )
    argv = ["--mode", mode, "--backend", "acl", "--library", str(library), "--kernel", str(kernel)]
    assert _load("acl_launch_kernel").main(argv) == 0
    out = capsys.readouterr().out
    assert "[SUCCESS]" in out and "launch path: host_args" in out


def test_acl_multi_stream_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    library = realrt_library()
    fakehal().reset()
    kernels = write_kernel_elf(tmp_path / "multi_stream.o", SAMPLE_KERNELS["multi_stream"])
    argv = ["--backend", "acl", "--library", str(library), "--kernels", str(kernels)]
    assert _load("acl_multi_stream").main([*argv, "--wait-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert "The answer is 2." in out and "The wait timed out" in out
