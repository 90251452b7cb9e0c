#!/usr/bin/env python3
"""One prepared check of the ``cuda`` backend on a machine with an NVIDIA GPU and no network.

Steps, each bounded by its own timeout and reported as it finishes (a ``timeout`` or SIGTERM
around the whole script still leaves the report of the steps done so far):

1. environment: Python, ``nvidia-smi -L``, cuda-bindings, what ``probe()`` says;
2. wheels: the test packages the machine lacks, installed from a folder of wheels brought
   along (``--wheels``, default ``.whl`` or ``benchmarks/wheels``) with ``pip install
   --no-index --no-deps --target``; nothing is fetched;
3. seam: the v0.2 runtime calls once, directly: ``info()``, a stream at the greatest
   priority, ``memset_async`` then a device-to-device copy read back, an out-of-range priority
   refused; a graph (two launches, one with placeholder data, and a memset captured on one
   stream, replayed twice on another, read back, destroyed);
4. tests: ``tests/runtime/test_cuda_backend.py`` and the cuda parameters of
   the contract suite (``tests/runtime/test_contract_*.py``) with pytest:
   the runtime contract suite and the scheduler smoke tests on the GPU (``cuda`` parameter,
   marked ``gpu``) and on the CPU fake;
5. benchmark: noop launches through a plain cuda-bindings loop (the floor), the runtime's own
   synchronous loop, a naive ``await to_thread(launch + sync)`` and the scheduler (unbatched,
   poll, block), side by side in one process, plus single launch-to-completion latency.

Writes ``gpu_check.md`` (the table), ``gpu_check.json``, ``gpu-tests.xml`` (JUnit) and
``gpu-tests.log`` to ``--out`` (default ``$OUT`` if set, else ``out/gpu_check``).

    python3 benchmarks/gpu_check.py [--wheels DIR] [--out DIR] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(tempfile.gettempdir()) / "aio_ascend_gpu_site"
#: modules the tests need beyond what a CUDA/PyTorch image usually has
TEST_MODULES = ("pytest", "pytest_asyncio", "pytest_timeout", "anyio", "numpy")

_current_child: subprocess.Popen[str] | None = None


class Stop(Exception):
    """SIGTERM/SIGINT: stop, keep what was measured."""


def _on_signal(signum: int, frame: object) -> None:
    raise Stop(f"signal {signum}")


def _run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, log: Path | None = None
) -> tuple[int | None, str]:
    """Run a child with a timeout; returns (exit code or None on timeout, output)."""
    global _current_child
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 - closed below
    try:
        child = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        _current_child = child
        try:
            text, _ = child.communicate(timeout=timeout)
            code: int | None = child.returncode
        except subprocess.TimeoutExpired:
            _kill(child)
            text, _ = child.communicate()
            code = None
        finally:
            _current_child = None
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    if log:
        text = log.read_text(errors="replace")
    return code, text or ""


def _kill(child: subprocess.Popen[str]) -> None:
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Report:
    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2, default=str))
        (self.out / "gpu_check.md").write_text(format_report(self.data))


# --- steps ------------------------------------------------------------------------------------


def step_environment(env: dict[str, str]) -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    if shutil.which("nvidia-smi"):
        code, text = _run(["nvidia-smi", "-L"], 30)
        info["nvidia_smi"] = text.strip()
    probe = (
        "import json\n"
        "from aio_ascend._runtime.cuda import runtime as _cuda\n"
        "ok, why = _cuda.probe()\n"
        "print(json.dumps({'ok': ok, 'why': why}))\n"
    )
    code, text = _run([sys.executable, "-c", probe], 60, env=env)
    try:
        info["probe"] = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info["probe"] = {"ok": False, "why": text.strip()[-2000:] or f"exit {code}"}
    return info


def _missing(modules: tuple[str, ...], env: dict[str, str]) -> list[str]:
    code = (
        "import importlib.util, json\n"
        f"print(json.dumps([m for m in {list(modules)!r} if importlib.util.find_spec(m) is None]))"
    )
    _, text = _run([sys.executable, "-c", code], 60, env=env)
    try:
        missing: list[str] = json.loads(text.strip().splitlines()[-1])
        return missing
    except (ValueError, IndexError):
        return list(modules)


def step_wheels(wheels: Path | None, env: dict[str, str]) -> dict[str, Any]:
    info: dict[str, Any] = {"missing_before": _missing(TEST_MODULES, env)}
    if wheels is None or not list(wheels.glob("*.whl")):
        info["installed"] = []
        info["note"] = "no wheel folder (see benchmarks/README.md)"
    else:
        files = sorted(str(p) for p in wheels.glob("*.whl"))
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(SITE),
            *files,
        ]
        code, text = _run(cmd, 180, env=env)
        info["installed"] = [Path(f).name for f in files]
        info["pip_exit"] = code
        if code:
            info["pip_output"] = text[-3000:]
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SITE)])
    info["missing_after"] = _missing(TEST_MODULES, env)
    return info


def _fallback_ini() -> Path:
    """A pytest config without the plugins' options (for a machine lacking the plugins)."""
    path = Path(tempfile.gettempdir()) / "aio_ascend_gpu_pytest.ini"
    path.write_text(
        "[pytest]\n"
        "addopts = -p no:cacheprovider\n"
        "filterwarnings =\n    error\n    ignore::pytest.PytestConfigWarning\n"
        "markers =\n"
        "    sim_only: relies on the sim backend's strictness\n"
        "    stress: large reliability runs\n"
        "    gpu: needs an NVIDIA GPU and cuda-bindings\n"
    )
    return path


def _plugin_installed(env: dict[str, str]) -> bool:
    """Whether pytest will load ``aio_ascend.testing`` through an installed entry point."""
    code = (
        "import importlib.metadata as m;"
        "print(any(e.value == 'aio_ascend.testing' for e in m.entry_points(group='pytest11')))"
    )
    _, text = _run([sys.executable, "-c", code], 60, env=env)
    return text.strip().endswith("True")


def step_tests(
    out: Path, env: dict[str, str], timeout: float, missing: list[str]
) -> dict[str, Any]:
    if "pytest" in missing or "numpy" in missing or "anyio" in missing:
        return {"skipped": f"cannot run the tests: missing {missing}"}
    xml = out / "gpu-tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/runtime/test_cuda_backend.py",
        *sorted(glob.glob("tests/runtime/test_contract_*.py")),
        "tests/scheduler/test_everyday_api.py",
        "-k",
        "cuda and not trio",
        "-q",
        "-rfEs",
        f"--junitxml={xml}",
        "-p",
        "no:cacheprovider",
    ]
    if "pytest_asyncio" in missing or "pytest_timeout" in missing:
        cmd += ["-c", str(_fallback_ini()), "--rootdir", str(ROOT)]
    else:
        cmd += ["--timeout=180"]
        if not _plugin_installed(env):
            # The checkout is used uninstalled, so pytest never sees the project's entry point,
            # and ``--strict-config`` refuses the ini options its plugin declares.
            cmd += ["-p", "aio_ascend.testing"]
    started = time.monotonic()
    code, text = _run(cmd, timeout, env=env, log=out / "gpu-tests.log")
    info: dict[str, Any] = {"exit": code, "seconds": round(time.monotonic() - started, 1)}
    if code is None:
        info["timed_out"] = True
    info.update(_junit_summary(xml))
    tail = [line for line in text.splitlines() if line.strip()][-40:]
    info["tail"] = "\n".join(tail)
    return info


def _junit_summary(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return {}
    counts = {
        "gpu": {"passed": 0, "failed": 0, "skipped": 0},
        "cpu": {"passed": 0, "failed": 0, "skipped": 0},
    }
    failures: list[str] = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        where = "gpu" if "[cuda" in name and "[cuda-fake" not in name else "cpu"
        if case.find("failure") is not None or case.find("error") is not None:
            counts[where]["failed"] += 1
            node = case.find("failure")
            if node is None:
                node = case.find("error")
            message = (node.get("message") or "").splitlines()[0][:200] if node is not None else ""
            failures.append(f"{name}: {message}")
        elif case.find("skipped") is not None:
            counts[where]["skipped"] += 1
        else:
            counts[where]["passed"] += 1
    return {"counts": counts, "failures": failures}


def step_bench(out: Path, env: dict[str, str], timeout: float, scale: float) -> dict[str, Any]:
    path = out / "bench.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--bench-child",
        str(path),
        "--scale",
        str(scale),
    ]
    code, text = _run(cmd, timeout, env=env, log=out / "bench.log")
    results: dict[str, Any] = {}
    if path.exists():
        try:
            results = json.loads(path.read_text())
        except ValueError:
            pass
    results["exit"] = code
    if code:
        results["tail"] = text[-3000:]
    if code is None:
        results["timed_out"] = True
    return results


_SEAM = """
import json
from aio_ascend._errors import InvalidParamError
from aio_ascend._runtime import open_runtime
from aio_ascend._runtime.abi import ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST
from aio_ascend._runtime.hostmem import host_view
rt = open_runtime("cuda", 0)
try:
    out = {"info": rt.info()}
    least, greatest = rt.stream_priority_range()
    stream = rt.create_stream(greatest)
    n = 1 << 20
    a, b, host = rt.malloc(n), rt.malloc(n), rt.malloc_host(n)
    rt.memset_async(a, n, 0x5A, n, stream)
    rt.memset_async(a + 16, n - 16, 0xC3, 16, stream)
    rt.memcpy_async(b, n, a, n, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
    rt.memcpy_async(host, n, b, n, ACL_MEMCPY_DEVICE_TO_HOST, stream)
    rt.synchronize_stream(stream, 10000)
    expected = b"\\x5a" * 16 + b"\\xc3" * 16 + b"\\x5a" * (n - 32)
    out["memset_d2d_ok"] = bytes(host_view(host, n)) == expected
    try:
        rt.create_stream(greatest - 1)
        out["out_of_range_refused"] = False
    except InvalidParamError:
        out["out_of_range_refused"] = True
    # a graph: y += 2x; z = 0.5y (placeholder data); x[0] = 0; captured, then replayed twice
    import struct
    import numpy as np
    from aio_ascend._host.hostargs import HostArgs
    from aio_ascend._runtime.abi import ACL_MEMCPY_HOST_TO_DEVICE
    def pinned(data):
        addr = rt.malloc_host(len(data))
        host_view(addr, len(data))[:] = data
        return addr
    def launch(fn, args):
        image, table = args.to_bytes(), args.placeholder_table()
        table_addr = pinned(table) if table else 0
        rt.launch_kernel_with_host_args(
            fn, 4, stream, None, pinned(image), len(image), table_addr, len(args.placeholders))
    def read(ptr, m):
        rt.memcpy_async(host, 4 * m, ptr, 4 * m, ACL_MEMCPY_DEVICE_TO_HOST, other)
        rt.synchronize_stream(other, 10000)
        return np.frombuffer(bytes(host_view(host, 4 * m)), np.float32)
    binary = rt.load_binary(None)
    axpy, scale = rt.get_function(binary, "axpy"), rt.get_function(binary, "scale")
    m = 1024
    xs = np.arange(1, m + 1, dtype=np.float32)
    x, y, z = rt.malloc(4 * m), rt.malloc(4 * m), rt.malloc(4 * m)
    rt.memcpy_async(x, 4 * m, pinned(xs.tobytes()), 4 * m, ACL_MEMCPY_HOST_TO_DEVICE, stream)
    rt.memset_async(y, 4 * m, 0, 4 * m, stream)
    rt.synchronize_stream(stream, 10000)
    rt.begin_capture(stream)
    launch(axpy, HostArgs().ptr(x).ptr(y).f32(2.0).u32(m))
    launch(scale, HostArgs().ptr(y).ptr(z).placeholder(struct.pack("<If", m, 0.5)))
    rt.memset_async(x, 4 * m, 0, 4, stream)
    graph = rt.end_capture(stream)
    other = rt.create_stream()
    untouched = not read(y, m).any()
    rt.launch_graph(graph, other)
    rt.launch_graph(graph, other)
    rt.synchronize_stream(other, 10000)
    y_want, z_want = 4 * xs, 2 * xs
    y_want[0], z_want[0] = 2, 1
    out["graph_ok"] = bool(
        untouched and (read(y, m) == y_want).all() and (read(z, m) == z_want).all())
    rt.destroy_graph(graph)
    out["graph_destroyed"] = not rt._graphs
    rt.destroy_stream(other)
    rt.destroy_stream(stream)
finally:
    rt.close()
print(json.dumps(out, default=str))
"""


def step_seam(env: dict[str, str]) -> dict[str, Any]:
    """The v0.2 seam calls once on the GPU (a child process, 60 s)."""
    code, text = _run([sys.executable, "-c", _SEAM], 60, env=env)
    try:
        result: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"error": text.strip()[-2000:] or f"exit {code}"}
    result["exit"] = code
    return result


# --- the benchmark (runs in a child process) --------------------------------------------------


def bench_plain_bindings(n: int, rounds: int) -> dict[str, Any]:
    """The floor: noop launches straight through cuda-bindings, no aio_ascend in the loop."""
    from cuda.bindings import driver as d

    from aio_ascend._runtime.cuda.kernels import KERNEL_SOURCE
    from aio_ascend._runtime.cuda.nvrtc import compile_cuda_source
    from aio_ascend._tools.stats import percentile

    def ok(result: Any) -> Any:
        if int(result[0]):
            raise RuntimeError(f"CUDA error {result[0]!r}")
        return result[1] if len(result) == 2 else None

    ok(d.cuInit(0))
    device = ok(d.cuDeviceGet(0))
    attr = d.CUdevice_attribute
    major = ok(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
    minor = ok(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
    ctx = ok(d.cuDevicePrimaryCtxRetain(device))
    ok(d.cuCtxSetCurrent(ctx))
    try:
        image = compile_cuda_source(KERNEL_SOURCE, int(major) * 10 + int(minor))
        module = ok(d.cuModuleLoadData(image))
        noop = ok(d.cuModuleGetFunction(module, b"noop"))
        stream = ok(d.cuStreamCreate(1))
        event = ok(d.cuEventCreate(2))
        launch = d.cuLaunchKernel
        for _ in range(1000):  # warm-up
            launch(noop, 1, 1, 1, 1, 1, 1, 0, stream, None, 0)
        ok(d.cuStreamSynchronize(stream))
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            launch(noop, 1, 1, 1, 1, 1, 1, 0, stream, None, 0)
        ok(d.cuStreamSynchronize(stream))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        single = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            launch(noop, 1, 1, 1, 1, 1, 1, 0, stream, None, 0)
            d.cuEventRecord(event, stream)
            while int(d.cuEventQuery(event)[0]) == 600:  # spin: the latency floor
                pass
            single.append(time.perf_counter() - t0)
        ok(d.cuStreamDestroy(stream))
        ok(d.cuEventDestroy(event))
        ok(d.cuModuleUnload(module))
    finally:
        d.cuDevicePrimaryCtxRelease(device)
    return {
        "launches_per_s": n / wall,
        "cpu_us_per_launch": cpu / n * 1e6,
        "single_launch_p50_us": percentile(single, 50) * 1e6,
        "single_launch_p99_us": percentile(single, 99) * 1e6,
        "n": n,
    }


def bench_child(path: Path, scale: float) -> int:
    from aio_ascend._tools import bench as _bench

    results: dict[str, Any] = {"scale": scale}

    def save() -> None:
        path.write_text(json.dumps(results, indent=2, default=str))

    n = max(1000, int(50_000 * scale))
    rounds = max(100, int(500 * scale))
    steps: list[tuple[str, Any]] = [
        ("bindings", lambda cfg: bench_plain_bindings(n, rounds)),
        ("raw", _bench.bench_raw),
        ("naive", _bench.bench_naive),
        ("unbatched", lambda cfg: _bench.bench_scheduler(cfg, "poll", 1)),
        ("poll", lambda cfg: _bench.bench_scheduler(cfg, "poll")),
        ("block", lambda cfg: _bench.bench_scheduler(cfg, "block")),
    ]
    cfg = _bench.BenchConfig(scale=scale, backend="cuda", progress=None)
    for key, fn in steps:
        started = time.monotonic()
        try:
            results[key] = fn(cfg)
        except Exception as exc:  # keep going: one broken row must not hide the others
            results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        results[key]["seconds"] = round(time.monotonic() - started, 2)
        save()
    return 0


# --- the table --------------------------------------------------------------------------------

_ROWS = [
    ("bindings", "plain cuda-bindings loop (cuLaunchKernel, 1 sync)"),
    ("raw", "(a) CudaRuntime loop (launch_kernel_with_host_args)"),
    ("naive", "(b) naive await to_thread(launch + sync)"),
    ("unbatched", "(b2) scheduler, batch_cap=1"),
    ("poll", "(c) scheduler, poll completion"),
    ("block", "(c') scheduler, block completion"),
]


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def format_report(data: dict[str, Any]) -> str:
    lines = ["# aio_ascend cuda backend: GPU check", ""]
    env = data.get("environment", {})
    if env:
        lines.append(f"- python {env.get('python')} on {env.get('platform')}")
        if env.get("nvidia_smi"):
            lines.append(f"- {env['nvidia_smi'].splitlines()[0]}")
        probe = env.get("probe", {})
        lines.append(f"- probe: {'ok' if probe.get('ok') else 'NOT available'}: {probe.get('why')}")
    wheels = data.get("wheels", {})
    if wheels:
        lines.append(
            f"- wheels installed: {len(wheels.get('installed', []))}; "
            f"still missing: {wheels.get('missing_after') or 'nothing'}"
        )
    seam = data.get("seam", {})
    if seam:
        lines += ["", "## Seam (info, priority stream, memset + D2D copy, graph)", ""]
        if "error" in seam:
            lines.append(f"error: {str(seam['error'])[-300:]}")
        else:
            lines.append(f"- info: {seam.get('info')}")
            lines.append(
                f"- memset + D2D copy read back: {seam.get('memset_d2d_ok')}; "
                f"out-of-range priority refused: {seam.get('out_of_range_refused')}"
            )
            lines.append(
                f"- graph captured, replayed twice on another stream, read back: "
                f"{seam.get('graph_ok')}; destroyed: {seam.get('graph_destroyed')}"
            )
    tests = data.get("tests", {})
    if tests:
        lines += ["", "## Tests (tests/runtime, cuda)", ""]
        if "skipped" in tests and isinstance(tests["skipped"], str):
            lines.append(f"not run: {tests['skipped']}")
        counts = tests.get("counts", {})
        for where, label in (("gpu", "on the GPU"), ("cpu", "on the CPU (fake driver, pure)")):
            c = counts.get(where)
            if c:
                lines.append(
                    f"- {label}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
                )
        lines.append(
            f"- exit {tests.get('exit')} after {tests.get('seconds')} s"
            + (" (TIMED OUT)" if tests.get("timed_out") else "")
        )
        for failure in tests.get("failures", [])[:30]:
            lines.append(f"  - FAILED {failure}")
    bench = data.get("bench", {})
    if bench:
        lines += [
            "",
            f"## Benchmark (noop kernels, scale {bench.get('scale')})",
            "",
            "| path | launches/s | CPU us/launch | launch->done p50 us | p99 us |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for key, label in _ROWS:
            row = bench.get(key)
            if not row:
                continue
            if "error" in row:
                lines.append(f"| {label} | error: {row['error'][:80]} | | | |")
                continue
            lines.append(
                f"| {label} | {_num(row.get('launches_per_s'), ',.0f')} "
                f"| {_num(row.get('cpu_us_per_launch'), '.2f')} "
                f"| {_num(row.get('single_launch_p50_us'), '.1f')} "
                f"| {_num(row.get('single_launch_p99_us'), '.1f')} |"
            )
        floor = bench.get("bindings", {}).get("launches_per_s")
        poll = bench.get("poll", {}).get("launches_per_s")
        naive = bench.get("naive", {}).get("launches_per_s")
        if isinstance(floor, float) and isinstance(poll, float):
            lines.append("")
            lines.append(f"scheduler (poll) / plain bindings loop: {poll / floor:.2f}x throughput")
        if isinstance(naive, float) and isinstance(poll, float):
            lines.append(f"scheduler (poll) / naive to_thread: {poll / naive:.2f}x throughput")
        if bench.get("timed_out"):
            lines.append("(the benchmark TIMED OUT: rows above are the ones that finished)")
    if data.get("stopped"):
        lines += ["", f"stopped early: {data['stopped']}"]
    return "\n".join(lines) + "\n"


# --- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--wheels", type=Path, default=None)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--test-timeout", type=float, default=300)
    parser.add_argument("--bench-timeout", type=float, default=180)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--bench-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bench_child is not None:
        return bench_child(args.bench_child, args.scale)

    out = args.out or Path(os.environ.get("OUT") or ROOT / "out" / "gpu_check")
    report = Report(out)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env["PYTHONUNBUFFERED"] = "1"
    wheels = args.wheels
    if wheels is None:
        wheels = next(
            (p for p in (ROOT / ".whl", ROOT / "benchmarks" / "wheels") if p.is_dir()), None
        )
    status = 0
    try:
        print("== environment", flush=True)
        report.data["environment"] = step_environment(env)
        report.save()
        print(json.dumps(report.data["environment"], indent=2), flush=True)
        print("== wheels", flush=True)
        report.data["wheels"] = step_wheels(wheels, env)
        report.save()
        print(json.dumps(report.data["wheels"], indent=2), flush=True)
        if not report.data["environment"].get("probe", {}).get("ok"):
            print("the cuda backend is not available here: GPU tests will skip", flush=True)
            status = 2
        if status != 2:
            print("== seam", flush=True)
            report.data["seam"] = step_seam(env)
            report.save()
            print(json.dumps(report.data["seam"], indent=2, default=str), flush=True)
            seam = report.data["seam"]
            checks = ("memset_d2d_ok", "out_of_range_refused", "graph_ok", "graph_destroyed")
            if not all(seam.get(check) for check in checks):
                status = status or 1
        if not args.skip_tests:
            print("== tests", flush=True)
            report.data["tests"] = step_tests(
                out, env, args.test_timeout, report.data["wheels"]["missing_after"]
            )
            report.save()
            print(report.data["tests"].get("tail", ""), flush=True)
            if report.data["tests"].get("exit") != 0:
                status = status or 1
        if not args.skip_bench and status != 2:
            print("== benchmark", flush=True)
            report.data["bench"] = step_bench(out, env, args.bench_timeout, args.scale)
            report.save()
    except Stop as stop:
        report.data["stopped"] = str(stop)
        if _current_child is not None:
            _kill(_current_child)
        status = 124
    finally:
        report.data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        report.save()
        print(format_report(report.data), flush=True)
        print(f"(report in {out})", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
