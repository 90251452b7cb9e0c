"""The serving examples: the FastAPI server (in-process, over HTTP on 127.0.0.1) and Ray Serve
(a local Ray instance in a child process, two replicas with one simulated NPU each).

Marked ``serving`` (``python -m pytest -m serving`` runs exactly these). They skip without the
extras: ``server`` (fastapi, uvicorn, httpx) and ``ray`` (``ray[serve]``); CI installs both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest

pytestmark = pytest.mark.serving

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _fastapi_server() -> ModuleType:
    for name in ("fastapi", "uvicorn", "httpx"):
        pytest.importorskip(name, reason="the 'server' extra is not installed")
    module_name = "_aio_ascend_example_fastapi_server"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / "fastapi_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pydantic look their module up
    spec.loader.exec_module(module)
    return module


# --- FastAPI ------------------------------------------------------------------------------------


def test_fastapi_server_load_over_http_on_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    """``--load``: uvicorn in this process on 127.0.0.1, httpx clients, every answer checked
    against numpy; the device is closed by the lifespan (conftest checks no thread is left)."""
    server = _fastapi_server()
    code = server.main(["--load", "60", "--concurrency", "8", "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "60/60 responses match numpy" in out
    assert "at http://127.0.0.1:" in out
    assert re.search(r"p50 \d+\.\d\d ms  p99 \d+\.\d\d ms", out), out
    assert "launches=240 " in out, out  # the model's four kernels, once per request


def test_fastapi_routes_schema_dependency_and_lifespan() -> None:
    server = _fastapi_server()
    import httpx

    async def scenario() -> dict[str, Any]:
        app = server.create_app(streams=2)
        r: dict[str, Any] = {}
        transport = httpx.ASGITransport(app=app)  # no lifespan: run below by hand
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            row = [0.5] * server.D_IN
            # before the lifespan ran, the dependency has no device to hand out
            r["no_lifespan"] = (await client.post("/infer", json={"inputs": [row]})).status_code
            async with app.router.lifespan_context(app):
                model = app.state.device_model.model
                x = np.linspace(-2, 2, 3 * server.D_IN, dtype=np.float32).reshape(3, -1)
                resp = await client.post("/infer", json={"inputs": x.tolist()})
                r["ok"] = (resp.status_code, resp.json(), model.reference(x))
                bad = {
                    "not_json": {"content": b"not json"},
                    "no_inputs": {"json": {"rows": [row]}},
                    "short_row": {"json": {"inputs": [[1.0, 2.0]]}},
                    "no_rows": {"json": {"inputs": []}},
                    "too_many_rows": {"json": {"inputs": [row] * (server.MAX_BATCH + 1)}},
                    "not_a_number": {"json": {"inputs": [["a"] * server.D_IN]}},
                    "nan": {"content": json.dumps({"inputs": [[float("nan")] * 64]}).encode()},
                }
                headers = {"content-type": "application/json"}
                for name, kwargs in bad.items():
                    resp = await client.post("/infer", headers=headers, **kwargs)
                    r[name] = (resp.status_code, resp.text)
                r["get_infer"] = (await client.get("/infer")).status_code
                r["missing"] = (await client.get("/nope")).status_code
                resp = await client.get("/healthz")
                r["health"] = (resp.status_code, resp.json())
            r["after"] = app.state.device_model
        return r

    r = anyio.run(scenario)
    assert r["no_lifespan"] == 503
    status, payload, expected = r["ok"]
    assert status == 200
    assert payload["batch"] == 3 and payload["stream"] in (0, 1)
    np.testing.assert_allclose(np.asarray(payload["outputs"], np.float32), expected, rtol=1e-5)
    for name in ("not_json", "no_inputs", "short_row", "no_rows", "too_many_rows"):
        assert r[name][0] == 422, (name, r[name])
    assert r["not_a_number"][0] == 422 and r["nan"][0] == 422
    assert "inputs" in r["short_row"][1]  # the schema's error names the field
    assert r["get_infer"] == 405
    assert r["missing"] == 404
    health_status, health = r["health"]
    assert health_status == 200 and health["ok"] and health["backend"] == "sim"
    assert health["stats"]["launches"] == 4  # invalid bodies never reached the device
    assert r["after"] is None  # the lifespan closed the device


def test_fastapi_server_refuses_non_loopback_hosts() -> None:
    server = _fastapi_server()
    with pytest.raises(SystemExit):
        server.main(["--serve", "--host", "0.0.0.0"])


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
@pytest.mark.parametrize("mode", [["--load", "5"], ["--serve"]])
def test_fastapi_server_refuses_a_close_timeout_that_is_not_a_duration(
    mode: list[str], value: str
) -> None:
    """``--load`` took any ``--close-timeout`` (it ignored it); both modes check it first."""
    server = _fastapi_server()
    with pytest.raises(SystemExit) as exited:
        server.main([*mode, "--close-timeout", value])
    assert exited.value.code == 2


def test_fastapi_load_test_passes_its_close_timeout_to_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _fastapi_server()
    seen: list[float] = []

    def create_app(**kwargs: Any) -> Any:
        seen.append(kwargs["close_timeout"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(server, "create_app", create_app)
    with pytest.raises(RuntimeError, match="stop here"):
        server.main(["--load", "1", "-q", "--close-timeout", "1.5"])
    assert seen == [1.5]


#: the example under uvicorn in a child process, with a hang injected by a marker request
_HANGING_SERVER = """
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("fastapi_server", sys.argv[1])
server = importlib.util.module_from_spec(spec)
sys.modules["fastapi_server"] = server
spec.loader.exec_module(server)

from aio_ascend.testing import inject_hang

infer = server.DeviceModel.infer


async def hanging_infer(self, x):
    if x[0, 0] == 1234.0:  # the test's marker: a kernel that never ends, on every stream
        for s in self.streams:
            await inject_hang(s)
    return await infer(self, x)


server.DeviceModel.infer = hanging_infer
sys.exit(server.main(sys.argv[2:]))
"""


@pytest.mark.timeout(120)
def test_fastapi_server_stops_within_close_timeout_with_a_hung_kernel(tmp_path: Path) -> None:
    """``--serve`` under a real uvicorn (a child process, 127.0.0.1, a free port): requests
    hang on a kernel that never ends; after one SIGINT the server is gone within
    close_timeout + 1 s and every request has ended (before: alive 15 s later after two
    SIGINTs, a request in four hanging)."""
    _fastapi_server()  # skips without the server extra
    import httpx

    close_timeout = 2.0
    launcher = tmp_path / "hanging_server.py"
    launcher.write_text(_HANGING_SERVER)
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}  # this checkout's aio_ascend
    command = [sys.executable, str(launcher), str(EXAMPLES / "fastapi_server.py")]
    command += ["--serve", "--port", "0", "--close-timeout", str(close_timeout)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    log: list[str] = []
    started = threading.Event()

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if "Uvicorn running on" in line:
                started.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        assert started.wait(60), "".join(log)
        match = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", "".join(log))
        assert match, "".join(log)
        url = match.group(1)
        ended: dict[int, float] = {}

        async def request(i: int, client: httpx.AsyncClient) -> None:
            row = [1234.0 if i == 0 else 0.5] + [0.5] * 63
            try:
                await client.post(f"{url}/infer", json={"inputs": [row]})
            except httpx.HTTPError:
                pass  # the server went away under it: it ended, which is what counts
            ended[i] = time.monotonic()

        async def scenario() -> float:
            async with httpx.AsyncClient(timeout=60) as client:
                assert (await client.get(f"{url}/healthz")).status_code == 200
                async with anyio.create_task_group() as tg:
                    tg.start_soon(request, 0, client)
                    await anyio.sleep(0.3)  # the hang is queued on every stream
                    for i in range(1, 8):
                        tg.start_soon(request, i, client)
                    await anyio.sleep(0.5)
                    assert not ended, "requests answered despite the hang"
                    sent = time.monotonic()
                    proc.send_signal(signal.SIGINT)
            return sent

        sent = anyio.run(scenario)
        code = proc.wait(timeout=close_timeout + 10)
        exited = time.monotonic() - sent
        print(f"fastapi server: exited {exited:.2f} s after SIGINT (close_timeout {close_timeout})")
        assert exited < close_timeout + 1, "".join(log)
        assert code == 0, "".join(log)
        assert len(ended) == 8 and max(ended.values()) - sent < close_timeout + 1, ended
        assert "by force" in "".join(log), "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stderr is not None:
            proc.stderr.close()


# --- Ray Serve ----------------------------------------------------------------------------------

#: the example bounds start-up, the requests and shutdown (120 + 120 + 60 s); this bounds the rest
RAY_RUN_TIMEOUT_S = 360
RAY_REQUESTS = 300


def _figure(pattern: str, out: str) -> float:
    match = re.search(pattern, out)
    assert match, f"{pattern!r} not in the output:\n{out}"
    return float(match.group(1).replace(",", ""))


@pytest.mark.timeout(RAY_RUN_TIMEOUT_S + 30)
def test_ray_serve_two_replicas_one_npu_each(tmp_path: Path) -> None:
    """A local Ray (2 CPUs, 2 NPUs declared), two replicas, 300 HTTP requests to 127.0.0.1,
    each answer checked; each replica opened its own NPU lazily and closed it at shutdown."""
    # find_spec, not importorskip: importing ray.serve here would warn (warnings are errors in
    # this suite); the example runs in a child process, which is also how Ray is left behind.
    for name in ("ray", "fastapi", "uvicorn", "httpx"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed: pip install -e '.[ray,server]'")
    reports = tmp_path / "replicas"
    reports.mkdir()
    command = [
        sys.executable,
        str(EXAMPLES / "ray_serve.py"),
        *("--load", str(RAY_REQUESTS), "--concurrency", "16"),
        *("--replicas", "2", "--num-cpus", "2", "--backend", "sim"),
        *("--shutdown-report", str(reports), "-q"),
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: Ray's processes go with it on timeout
    )
    try:
        out, _ = proc.communicate(timeout=RAY_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the Ray Serve example did not finish in {RAY_RUN_TIMEOUT_S} s:\n{out}")
    assert proc.returncode == 0, out
    assert f"{RAY_REQUESTS}/{RAY_REQUESTS} responses match numpy" in out, out
    assert "at http://127.0.0.1:" in out

    startup_s = _figure(r"2 replicas up at \S+ in ([\d.]+) s", out)
    rate = _figure(r"throughput\s+([\d,]+) requests/s", out)
    p50 = _figure(r"p50 ([\d.]+) ms", out)
    p99 = _figure(r"p99 ([\d.]+) ms", out)
    shutdown_s = _figure(r"shutdown\s+([\d.]+) s", out)
    print(
        f"ray serve: start-up {startup_s:.1f} s, {rate:.0f} requests/s, "
        f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, shutdown {shutdown_s:.1f} s"
    )
    # liveness bounds (the example enforces them too), >= 10x what this machine takes
    assert startup_s < 120 and shutdown_s < 60, out

    # Each replica wrote its report from its async __del__, after closing its device.
    replicas = [json.loads(p.read_text()) for p in sorted(reports.glob("replica-*.json"))]
    assert len(replicas) == 2, out
    # Ray gave each replica one NPU of its own: ASCEND_RT_VISIBLE_DEVICES differs
    assert sorted(r["ascend_rt_visible_devices"] for r in replicas) == ["0", "1"], replicas
    launches = 0
    for r in replicas:
        stats = r["stats"]
        assert stats["launches"] > 0, r  # both replicas served requests
        assert stats["in_flight"] == 0 and stats["streams"] == 0, r
        assert stats["device_buffers"] == 0, r  # everything freed
        assert r["library_threads_after_close"] == [], r
        launches += stats["launches"]
    # @serve.batch stacked concurrent requests into shared device runs (4 launches each)
    assert launches % 4 == 0 and launches < 4 * RAY_REQUESTS, replicas


def test_fastapi_load_test_ctrl_c_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during ``--load`` printed asyncio's KeyboardInterrupt traceback."""
    server = _fastapi_server()

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(server.anyio, "run", interrupted)
    assert server.main(["--load", "10", "-q"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
