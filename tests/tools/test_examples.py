"""Every example runs on the sim backend, with small sizes (their ``main([...])`` in-process).

The serving examples (FastAPI, Ray Serve) are tested in ``test_serving.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    module_name = f"_aio_ascend_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_pipeline_holds_at_most_concurrency_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many requests are asked for, only ``--concurrency`` of them (and their input
    vectors) exist at once: it made every request's inputs up front (2M requests: 24 GiB)."""
    pipeline = _load("pipeline")
    made = finished = peak = 0
    real_rng = np.random.default_rng

    class CountingRng:
        def __init__(self, seed: int) -> None:
            self._rng = real_rng(seed)

        def standard_normal(self, n: int, dtype: Any) -> Any:
            nonlocal made, peak
            made += 1
            peak = max(peak, made // 2 - finished)  # (two vectors per request)
            return self._rng.standard_normal(n, dtype=dtype)

        def uniform(self, low: float, high: float) -> float:
            return float(self._rng.uniform(low, high))

    real_request = pipeline.one_request

    async def counted(*args: Any) -> bool:
        nonlocal finished
        try:
            return bool(await real_request(*args))
        finally:
            finished += 1

    monkeypatch.setattr(pipeline.np.random, "default_rng", CountingRng)
    monkeypatch.setattr(pipeline, "one_request", counted)
    ok, _, _ = anyio.run(pipeline.run, 120, 1, 4, 256, False)
    assert (ok, finished) == (120, 120)
    assert peak <= 4


@pytest.mark.parametrize(
    "raised",
    [
        KeyboardInterrupt(),
        BaseExceptionGroup("Exceptions from Trio nursery", [KeyboardInterrupt(), ValueError()]),
    ],
)
def test_pipeline_ctrl_c_is_one_line_and_status_130(
    raised: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = _load("pipeline")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(pipeline.anyio, "run", interrupted)
    assert pipeline.main(["--requests", "10", "--loop", "trio", "-q"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_pipeline_does_not_swallow_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _load("pipeline")

    def failed(*args: Any, **kwargs: Any) -> Any:
        raise BaseExceptionGroup("boom", [ValueError("a bug")])

    monkeypatch.setattr(pipeline.anyio, "run", failed)
    with pytest.raises(BaseExceptionGroup):
        pipeline.main(["--requests", "10", "-q"])


def test_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("script").main(["--n", "4096"]) == 0
    out = capsys.readouterr().out
    assert "matches numpy" in out
    assert "2 launches" in out


def test_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    code = _load("pipeline").main(["--requests", "50", "--streams", "2", "--size", "1024", "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "50/50 results match numpy" in out
    assert "6 streams" in out


@pytest.mark.parametrize("external", [False, True], ids=["own-stream", "external-stream"])
def test_torch_npu_interop_code_path_on_the_sim(external: bool) -> None:
    """The example's exchange() over memory and a stream the sim's runtime made, as torch_npu
    would hand them over (the torch part itself needs an Ascend machine)."""
    import gc
    import weakref

    import aio_ascend as aa

    example = _load("torch_npu_interop")

    class Tensor:  # stands for the torch_npu tensor that owns the memory
        pass

    class TorchStream:  # stands for torch.npu.current_stream() (its task queue empty)
        def __init__(self, handle: int) -> None:
            self.npu_stream = handle

    async def scenario() -> tuple[np.ndarray[Any, Any], bool]:
        async with aa.open_device(0, backend="sim") as dev:
            owner = Tensor()
            ref = weakref.ref(owner)
            ptr = dev.runtime.malloc(4 * 1000)
            handle = dev.runtime.create_stream() if external else None
            torch_stream = None if handle is None else TorchStream(handle)
            got = await example.exchange(dev, ptr, 1000, owner=owner, torch_stream=torch_stream)
            del owner
            gc.collect()
            released = ref() is None
            if handle is not None:
                dev.runtime.destroy_stream(handle)  # still there: the example never destroys it
            dev.runtime.free(ptr)  # the owner frees its memory, not aio_ascend
            return got, released

    got, released = anyio.run(scenario)
    np.testing.assert_array_equal(got, example.expected(1000))
    assert released, "the wrapper kept the owner after the work on its memory was done"


def test_torch_npu_interop_main_without_torch_npu(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - an Ascend machine
        pytest.skip("torch_npu is installed: main() would run on the NPU")
    assert _load("torch_npu_interop").main() == 0
    assert "needs an Ascend machine" in capsys.readouterr().out


# --- hicann/runtime's samples, rewritten (docs/guide/from-acl-samples.md) ----------------------


@pytest.mark.parametrize("mode", ["placeholder", "simple"])
def test_acl_launch_kernel_sample(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("acl_launch_kernel").main(["--mode", mode]) == 0
    out = capsys.readouterr().out
    assert f"runs in {mode} mode on sim" in out
    assert "error ratio: 0.0000" in out
    assert "[SUCCESS] result correct" in out


def test_acl_launch_kernel_sample_lays_out_args_as_the_ascend_kernel_takes_them() -> None:
    example = _load("acl_launch_kernel")
    packed = example.kernel_args("placeholder", 0x10, 0x20, 0x30).pack()
    # add_custom(x, y, z, tilingLength*, tilingNum*): three pointers, then the two slots
    assert packed.fields == ((0, 8), (8, 8), (16, 8), (24, 8), (32, 8))
    assert [slot for slot, _ in packed.placeholders] == [24, 32]
    data = [packed.image[d : d + 4] for _, d in packed.placeholders]
    assert data == [np.int32(8 * 2048).tobytes(), np.int32(8).tobytes()]
    assert example.kernel_args("simple", 0x10, 0x20, 0x30).pack().placeholder_count == 0


@pytest.mark.parametrize("flag", ["--long-ms", "--wait-ms"])
@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_acl_multi_stream_refuses_durations_that_are_not(flag: str, value: str) -> None:
    """``--long-ms inf`` ran until the watchdog; each is refused at the command line."""
    with pytest.raises(SystemExit) as exited:
        _load("acl_multi_stream").main([flag, value])
    assert exited.value.code == 2


def test_acl_multi_stream_sample(capsys: pytest.CaptureFixture[str]) -> None:
    # LongOP 300 ms, the bounded wait 20 ms: a 15x margin for "the wait gives up"
    assert _load("acl_multi_stream").main(["--long-ms", "300", "--wait-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert out.count("The answer is 2.") == 2
    assert "The wait timed out; the long task is still running." in out
    assert "[SUCCESS] both orders give 2" in out
