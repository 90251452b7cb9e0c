"""Every example runs on the sim backend, with small sizes (their ``main([...])`` in-process)."""

from __future__ import annotations

import importlib.util
import json
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


@pytest.fixture(scope="module")
def server() -> ModuleType:
    return _load("inference_server")


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


def test_server_load_direct(server: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """No optional dependency: the load test calls the ASGI app directly."""
    code = server.main(["--load", "30", "--concurrency", "6", "--mode", "direct"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "30/30 responses match numpy" in out
    assert "p50" in out and "p99" in out


def test_server_load_httpx_asgi_transport(
    server: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("httpx", reason="the 'server' extra is not installed")
    assert server.main(["--load", "20", "--concurrency", "4", "--mode", "httpx"]) == 0
    assert "20/20 responses match numpy" in capsys.readouterr().out


def test_server_load_uvicorn_loopback(
    server: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn", reason="the 'server' extra is not installed")
    pytest.importorskip("httpx", reason="the 'server' extra is not installed")
    assert server.main(["--load", "20", "--concurrency", "4", "--mode", "uvicorn"]) == 0
    out = capsys.readouterr().out
    assert "20/20 responses match numpy" in out
    assert "http://127.0.0.1:" in out


def test_server_routes_and_errors(server: ModuleType) -> None:
    async def scenario() -> dict[str, Any]:
        app = server.InferenceApp(streams=2)
        call = server.asgi_call
        results: dict[str, Any] = {}
        # without the lifespan the device is not open: a clear 503, never a crash
        results["no_lifespan"] = await call(app, "POST", "/infer", b"{}")
        async with server.run_lifespan(app):
            x = np.ones((3, server.D_IN), np.float32)
            status, body = await call(
                app, "POST", "/infer", json.dumps({"inputs": x.tolist()}).encode()
            )
            results["ok"] = (status, json.loads(body), app.model.reference(x))
            results["bad_json"] = await call(app, "POST", "/infer", b"not json")
            results["bad_shape"] = await call(app, "POST", "/infer", b'{"inputs": [[1, 2]]}')
            results["get_infer"] = await call(app, "GET", "/infer")
            results["missing"] = await call(app, "GET", "/nope")
            status, body = await call(app, "GET", "/healthz")
            results["health"] = (status, json.loads(body))
        assert app.device_model is None  # closed at shutdown
        return results

    r = anyio.run(scenario)
    assert r["no_lifespan"][0] == 503
    status, payload, expected = r["ok"]
    assert status == 200
    assert payload["batch"] == 3
    np.testing.assert_allclose(np.asarray(payload["outputs"], np.float32), expected, rtol=1e-5)
    assert r["bad_json"][0] == 400
    assert r["bad_shape"][0] == 400 and b"rows of 64 floats" in r["bad_shape"][1]
    assert r["get_infer"][0] == 405
    assert r["missing"][0] == 404
    health_status, health = r["health"]
    assert health_status == 200 and health["backend"] == "sim"
    assert health["stats"]["launches"] == 4


def test_server_refuses_non_loopback_hosts(server: ModuleType) -> None:
    with pytest.raises(SystemExit):
        server.main(["--serve", "--host", "0.0.0.0"])


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

    async def scenario() -> tuple[np.ndarray[Any, Any], bool]:
        async with aa.open_device(0, backend="sim") as dev:
            owner = Tensor()
            ref = weakref.ref(owner)
            ptr = dev.runtime.malloc(4 * 1000)
            handle = dev.runtime.create_stream() if external else None
            got = await example.exchange(dev, ptr, 1000, owner=owner, stream_handle=handle)
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


def test_acl_multi_stream_sample(capsys: pytest.CaptureFixture[str]) -> None:
    # LongOP 300 ms, the bounded wait 20 ms: a 15x margin for "the wait gives up"
    assert _load("acl_multi_stream").main(["--long-ms", "300", "--wait-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert out.count("The answer is 2.") == 2
    assert "The wait timed out; the long task is still running." in out
    assert "[SUCCESS] both orders give 2" in out
