"""The ``aio-ascend`` command line (also ``python -m aio_ascend``).

::

    aio-ascend --version
    aio-ascend info                      # backends, what "auto" picks and why, versions
    aio-ascend demo [--requests N] [--streams S] [--loop asyncio|uvloop|trio]
                    [--trace PATH] [--plot PATH]
    aio-ascend bench [--scale F] [--only a,b,c] [--backend sim|cuda]
                     [--json PATH] [--trace PATH] [--plot PATH]

Output paths (``--trace``, ``--plot``, ``--json``) are checked before any work starts; the
plot's format follows its extension (``.png``, ``.svg``, ``.pdf``).

Exit status: 0 on success; 1 when a result was wrong (demo), a target was missed
(``bench --strict``) or ``bench --plot`` had no samples to draw; 2 for bad usage (an output
path that cannot be written included), a missing optional dependency or an output that could
not be written after the work; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__, is_compiled
from .._runtime.acl.batch import ENV_NATIVE, native_submit

__all__ = ["build_parser", "main", "subcommands"]

PROG = "aio-ascend"
PERFETTO = "https://ui.perfetto.dev"


def _version(dist: str, module: str | None = None) -> str | None:
    """The installed version of ``dist``, or None when its module cannot be imported."""
    try:
        mod = importlib.import_module(module or dist)
    except Exception:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(mod, "__version__", "unknown"))


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _no_matplotlib() -> int:
    print(
        f"{PROG}: --plot needs matplotlib, which is not installed; "
        "install it with: pip install 'aio_ascend[plot]'",
        file=sys.stderr,
    )
    return 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _output_problem(path: str, *, plot: bool = False) -> str | None:
    """Why ``path`` cannot be written as an output file, or None when it looks writable.

    Checked before the work starts, so a typo costs nothing: the path is not a directory, its
    folder exists and is writable (and so is the file, if it exists); a plot's extension
    names a format (:data:`.plot.PLOT_FORMATS`). Nothing is created.
    """
    if not path:
        return "the path is empty"
    if os.path.isdir(path):
        return f"{path} is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            return f"{path} is not writable"
    elif not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    if plot:
        from .plot import plot_format

        try:
            plot_format(path)
        except ValueError as exc:
            return str(exc)
    return None


def _check_outputs(command: str, outputs: Sequence[tuple[str, str | None]]) -> bool:
    """Print why each given output (option, path) cannot be written; True when all can."""
    ok = True
    for option, path in outputs:
        if path is None:
            continue
        problem = _output_problem(path, plot=option == "--plot")
        if problem is not None:
            print(f"{PROG} {command}: {option} {path}: {problem}", file=sys.stderr)
            ok = False
    return ok


def _write_output(command: str, option: str, path: str, write: Callable[[], object]) -> bool:
    """Run ``write``; on an OSError (a disk full, a folder removed meanwhile) say so, no
    traceback. Returns whether it worked."""
    try:
        write()
    except OSError as exc:
        print(f"{PROG} {command}: {option} {path}: cannot write: {exc}", file=sys.stderr)
        return False
    return True


def _indent(text: str, width: int) -> str:
    """Continuation lines of a multi-line message, indented to line up under the first."""
    return ("\n" + " " * width).join(line.strip() for line in text.strip().splitlines())


# --- info -------------------------------------------------------------------------------------


def _for_the_command_line(text: str) -> str:
    """A backend's message as someone at the command line can act on it.

    The acl backend suggests ``library_path=``, an ``open_device(runtime_options=...)`` option
    that the command line cannot pass; here it becomes what the command does search.
    """
    return re.sub(
        r"or pass library_path=\.?",
        "or put the folder holding libascendcl.so on LD_LIBRARY_PATH.",
        text,
    )


#: the device facts ``aio-ascend info`` shows, in order (what ``Device.info`` holds)
DEVICE_FACTS = (
    "launch_path",
    "runtime_version",
    "cann_version",
    "soc_name",
    "ai_core_count",
    "cube_core_count",
    "vector_core_count",
    "memory_total",
    "memory_free",
)


def _print_device_facts(backend: str) -> None:
    """Device 0 on ``backend``: the facts of ``Device.info`` (opened and closed at once)."""
    from .. import AscendError
    from .._runtime import open_runtime

    print(f"device 0 ({backend}):")
    try:
        runtime = open_runtime(backend, 0)
    except (AscendError, OSError, ValueError) as exc:
        print(f"  cannot open it: {_indent(_for_the_command_line(str(exc)), 18)}")
        return
    try:
        facts = {"launch_path": getattr(runtime, "launch_path", None), **runtime.info()}
    except AscendError as exc:
        print(f"  cannot read it: {exc}")
        return
    finally:
        runtime.close()
    for key in DEVICE_FACTS:
        if key in facts:
            value = facts[key]
            shown = "unknown (this release cannot tell)" if value is None else value
            if key.startswith("memory_") and isinstance(value, int):
                shown = f"{value / 2**30:.1f} GiB ({value} bytes)"
            print(f"  {key:<17} {shown}")


def cmd_info(args: argparse.Namespace) -> int:
    from .. import AscendError
    from .._runtime import BACKENDS, ENV_BACKEND, available_backends, choose_backend, probe_backend

    print(f"{PROG} {__version__}")
    print("backends:")
    reasons: dict[str, str] = {}
    for name in BACKENDS:
        ok, why = probe_backend(name)
        reasons[name] = why
        state = "available" if ok else "unavailable"
        print(f"  {name:<5} {state:<12} {_indent(_for_the_command_line(why), 21)}")
    print(f"available: {', '.join(available_backends())}")
    try:
        chosen, reason = choose_backend("auto")
    except (ValueError, AscendError) as exc:
        chosen, reason = "nothing", str(exc)
    for name, why in reasons.items():  # each backend's reason is printed once, above
        if why and why in reason:
            reason = reason.replace(why, f"see {name} above")
    print(f"auto picks: {chosen}")
    print(f"  why: {_indent(_for_the_command_line(reason), 7)}")
    override = os.environ.get(ENV_BACKEND)
    print(
        f"  {ENV_BACKEND}={override}"
        if override
        else f"  set {ENV_BACKEND}=sim|acl|cuda to override 'auto'"
    )
    if chosen in BACKENDS:
        _print_device_facts(chosen)
    print("versions:")
    print(
        f"  {'python':<12} {platform.python_version()} ({platform.python_implementation()}, "
        f"{sys.executable})"
    )
    print(f"  {'aio_ascend':<12} {__version__}")
    print(
        f"  {'hot path':<12} compiled (mypyc)"
        if is_compiled()
        else f"  {'hot path':<12} pure Python (AIO_ASCEND_COMPILE=1 at install compiles it)"
    )
    print(
        f"  {'acl submit':<12} native batch submit (one C call per run of launches)"
        if native_submit()
        else f"  {'acl submit':<12} one ctypes call per launch (the native batch submit is built "
        f"at install where a C compiler is present; {ENV_NATIVE}=0 turns it off)"
    )
    for dist, note in [
        ("numpy", ""),
        ("anyio", ""),
        ("trio", "optional: --loop trio"),
        ("uvloop", "optional: --loop uvloop"),
        ("matplotlib", "optional extra 'plot': --plot"),
        ("fastapi", "optional extra 'server'"),
        ("uvicorn", "optional extra 'server'"),
        ("httpx", "optional extra 'server'"),
        ("ray", "optional extra 'ray'"),
    ]:
        found = _version(dist)
        if found is not None:
            print(f"  {dist:<12} {found}")
        elif note:
            print(f"  {dist:<12} not installed ({note})")
        else:
            print(f"  {dist:<12} not installed")
    print(f"platform: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs")
    return 0


# --- demo -------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import PHASES, STAGES, DemoConfig, format_demo, run_demo
    from .plot import plot_latencies

    cfg = DemoConfig(
        requests=args.requests,
        streams=args.streams,
        concurrency=args.concurrency,
        n=args.size,
        loop=args.loop,
        trace=bool(args.trace),
        progress=None if args.quiet else sys.stderr,
        seed=args.seed,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"{PROG} demo: {exc}", file=sys.stderr)
        return 2
    if not _check_outputs("demo", [("--trace", args.trace), ("--plot", args.plot)]):
        return 2
    if args.plot and not _have_matplotlib():
        return _no_matplotlib()
    if args.loop in ("trio", "uvloop") and _version(args.loop) is None:
        print(f"{PROG}: --loop {args.loop} needs the {args.loop} package", file=sys.stderr)
        return 2
    result = run_demo(cfg)
    print(format_demo(result))
    status = 0 if result.ok else 1
    if args.trace and result.tracer is not None:
        tracer = result.tracer
        tasks = [0]

        def trace() -> None:
            tasks[0] = tracer.write(
                args.trace,
                metadata={
                    "command": "demo",
                    "requests": cfg.requests,
                    "stages": list(STAGES),
                    "phases": PHASES,
                },
            )

        if _write_output("demo", "--trace", args.trace, trace):
            print(
                f"  trace        {args.trace}  ({tasks[0]} tasks of {len(tracer.requests)} "
                f"requests on {len(result.tracks)} stream tracks; open in {PERFETTO})"
            )
        else:
            status = 2
    if args.plot:
        title = (
            f"aio-ascend demo: {result.completed} requests, {3 * cfg.streams} streams, "
            f"{min(cfg.concurrency, cfg.requests)} in flight, loop={cfg.loop}"
        )
        panels = {
            "request latency (h2d copies -> compute -> d2h copy)": {"request": result.latencies_us}
        }
        if not result.latencies_us:
            print(f"{PROG} demo: --plot: no request completed; no plot written", file=sys.stderr)
            status = max(status, 1)
        elif _write_output(
            "demo", "--plot", args.plot, lambda: plot_latencies(args.plot, panels, title=title)
        ):
            print(f"  plot         {args.plot}")
        else:
            status = 2
    return status


# --- bench ------------------------------------------------------------------------------------

#: the latency series of the bench plot: panel -> (step, series name)
BENCH_PANELS: dict[str, list[tuple[str, str]]] = {
    "latency of one launch + await at a time, nothing to batch "
    "(launch -> task done -> coroutine resumed)": [
        ("naive", "(b) naive await to_thread(launch + sync)"),
        ("unbatched", "(b2) scheduler, batch_cap=1"),
        ("poll", "(c) scheduler, poll completion"),
        ("block", "(c') scheduler, block completion"),
    ],
    "device completion -> awaiting coroutine resumed": [
        ("wake_poll", "poll, idle"),
        ("wake_block", "block, idle"),
        ("wake_churn", "poll, 10k tasks churning"),
    ],
}

#: the bar panels of the bench plot: step -> bar name (throughput without the handler shape,
#: which measures CPU only)
BENCH_THROUGHPUT: dict[str, str] = {
    "raw": "(a) raw runtime loop",
    "naive": "(b) naive to_thread",
    "unbatched": "(b2) batch_cap=1",
    "poll": "(c) scheduler, poll",
    "block": "(c') scheduler, block",
    "traced": "(c) + tracing",
}
BENCH_CPU: dict[str, str] = {**BENCH_THROUGHPUT, "handler": "(c) request-handler shape"}

#: bench backends: the sim, and cuda where it runs
BENCH_BACKENDS = ("sim", "cuda")


def _bench_backend(text: str) -> str:
    if text in BENCH_BACKENDS:
        return text
    if text == "acl":
        raise argparse.ArgumentTypeError(
            "'acl' is not supported by the bench yet (its steps have not been run on Ascend "
            "hardware); use 'sim', or 'cuda' on a machine with an NVIDIA GPU"
        )
    raise argparse.ArgumentTypeError(f"unknown backend {text!r}: choose 'sim' or 'cuda'")


def _clean_json(value: Any, *, keep_latencies: bool) -> Any:
    """NaN/inf -> None (strict JSON); optionally drop the raw latency lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {
            str(k): _clean_json(v, keep_latencies=keep_latencies)
            for k, v in value.items()
            if keep_latencies or k != "latencies_us"
        }
    if isinstance(value, list | tuple):
        return [_clean_json(v, keep_latencies=keep_latencies) for v in value]
    return value


def cmd_bench(args: argparse.Namespace) -> int:
    from ..tracing import Tracer
    from .bench import BACKEND_STEPS, STEPS, BenchConfig, format_table, run_bench

    known = [key for key, _, _ in STEPS]
    only: list[str] | None = None
    if args.only is not None:
        only = [key.strip() for key in args.only.split(",") if key.strip()]
        unknown = [key for key in only if key not in known]
        if unknown or not only:
            print(
                f"{PROG} bench: unknown step(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
    if args.backend != "sim":
        sim_only = [key for key in only or [] if key not in BACKEND_STEPS]
        if sim_only:
            print(
                f"{PROG} bench: step(s) {', '.join(sim_only)} measure the sim only; with "
                f"--backend {args.backend} choose from: {', '.join(BACKEND_STEPS)}",
                file=sys.stderr,
            )
            return 2
        only = only or list(BACKEND_STEPS)
    outputs = [("--json", args.json), ("--trace", args.trace), ("--plot", args.plot)]
    if not _check_outputs("bench", outputs):
        return 2
    if args.plot and not _have_matplotlib():
        return _no_matplotlib()
    if args.loop == "uvloop" and _version("uvloop") is None:
        print(f"{PROG}: --loop uvloop needs the uvloop package", file=sys.stderr)
        return 2
    if args.backend != "sim":
        from .._runtime import probe_backend

        ok, why = probe_backend(args.backend)
        if not ok:
            prefix = f"{PROG} bench: --backend {args.backend} cannot run here: "
            print(prefix + _indent(_for_the_command_line(why), len(prefix)), file=sys.stderr)
            return 2
    cfg = BenchConfig(
        scale=args.scale,
        launchers=args.launchers,
        backend=args.backend,
        loop=args.loop,
        repeats=args.repeats,
        progress=None if args.quiet else sys.stderr,
        tracer=Tracer() if args.trace else None,
    )
    results = run_bench(cfg, only)
    print(format_table(results))
    status = 0
    if args.json:
        status = max(status, _bench_json(args, results))
    if args.trace:
        status = max(status, _bench_trace(args, cfg, results))
    if args.plot:
        status = max(status, _bench_plot(args, cfg, results))
    if args.strict:
        missed = [name for name, x in results.get("ratios", {}).items() if not x["met"]]
        if missed:
            print(f"targets not met: {', '.join(missed)}", file=sys.stderr)
            status = max(status, 1)
    return status


def _bench_json(args: argparse.Namespace, results: dict[str, Any]) -> int:
    def write() -> None:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_clean_json(results, keep_latencies=not args.no_latencies), fh, indent=2)
            fh.write("\n")

    if not _write_output("bench", "--json", args.json, write):
        return 2
    print(f"json: {args.json}")
    return 0


def _bench_trace(args: argparse.Namespace, cfg: Any, results: dict[str, Any]) -> int:
    tracer = cfg.tracer
    tasks = [0]

    def write() -> None:
        tasks[0] = tracer.write(
            args.trace, metadata={"command": "bench", "config": results.get("config", {})}
        )

    if not _write_output("bench", "--trace", args.trace, write):
        return 2
    if tasks[0]:
        print(f"trace: {args.trace}  ({tasks[0]} tasks; open in {PERFETTO})")
    else:
        print(
            f"trace: {args.trace}  (empty: none of the steps run records tasks; "
            "the wake_poll / wake_block steps do)",
            file=sys.stderr,
        )
    return 0


def _bench_bars(results: dict[str, Any]) -> dict[str, Any]:
    """The bench's claims as bar panels: throughput against (b), host CPU against (a)."""
    from .plot import Bars

    def measured(steps: dict[str, str], field: str) -> dict[str, float]:
        return {
            name: float(results[key][field])
            for key, name in steps.items()
            if isinstance(results.get(key), dict) and results[key].get(field)
        }

    def target(name: str) -> str:
        ratio = results.get("ratios", {}).get(name)
        if not ratio:
            return ""
        verdict = "met" if ratio["met"] else "NOT MET"
        return f"target {name} {ratio['target']}: {ratio['value']:.3g}, {verdict}"

    bars: dict[str, Any] = {}
    rates = measured(BENCH_THROUGHPUT, "launches_per_s")
    if rates:
        reference = BENCH_THROUGHPUT["naive"]
        bars["throughput, noop kernels"] = Bars(
            rates,
            "launches/s",
            "higher",
            reference if reference in rates else None,
            target=target("throughput (c)/(b)"),
            highlight=frozenset(name for name in rates if name.startswith("(c")),
        )
    cpu = measured(BENCH_CPU, "cpu_us_per_launch")
    if cpu:
        reference = BENCH_CPU["raw"]
        bars["host CPU per launch"] = Bars(
            cpu,
            "µs",
            "lower",
            reference if reference in cpu else None,
            decimals=1,
            target=target("host CPU per launch (c)/(a)"),
            highlight=frozenset(name for name in cpu if name.startswith("(c")),
        )
    return bars


def _bench_plot(args: argparse.Namespace, cfg: Any, results: dict[str, Any]) -> int:
    from .plot import plot_latencies

    panels = {
        panel: {
            name: results[key]["latencies_us"]
            for key, name in series
            if isinstance(results.get(key), dict) and results[key].get("latencies_us")
        }
        for panel, series in BENCH_PANELS.items()
    }
    panels = {panel: series for panel, series in panels.items() if series}
    bars = _bench_bars(results)
    if not panels and not bars:
        print(
            f"{PROG} bench: --plot: none of the steps run recorded latency samples or "
            "throughput (raw, naive, unbatched, poll, block, traced, handler and the wake_* "
            "steps do); no plot written",
            file=sys.stderr,
        )
        return 1
    title = f"aio-ascend bench: backend {cfg.backend}, scale {cfg.scale}, loop {cfg.loop}"
    if not _write_output(
        "bench",
        "--plot",
        args.plot,
        lambda: plot_latencies(args.plot, panels, title=title, bars=bars),
    ):
        return 2
    print(f"plot: {args.plot}")
    return 0


# --- the parser -------------------------------------------------------------------------------

_EPILOG = """\
exit status: 0 success; 1 a result was wrong (demo), a target was missed (bench --strict) or
bench --plot had no samples; 2 bad usage (an output path that cannot be written included),
a missing optional dependency, or an output that could not be written; 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Awaitable Huawei Ascend (CANN/ACL) kernel launches: diagnostics, a "
        "pipeline demo and side-by-side benchmarks on the embedded simulator.",
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"{PROG} {__version__}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    info = sub.add_parser(
        "info",
        help="backends, which one 'auto' picks and why, versions",
        description="Which backends can run here and why not, what backend='auto' picks "
        "and why, and the versions of Python, aio_ascend and its optional dependencies.",
    )
    info.set_defaults(func=cmd_info)

    demo = sub.add_parser(
        "demo",
        help="a multi-stream copy/compute/copy pipeline on the sim backend",
        description="Many requests in flight through three streams per lane (host->device "
        "copy, axpy+scale compute, device->host copy), chained by record_event/wait_event; "
        "every result is checked against numpy. Exit status 1 when one is wrong.",
    )
    demo.add_argument(
        "--requests",
        type=_positive_int,
        default=2000,
        metavar="N",
        help="requests to run (default 2000)",
    )
    demo.add_argument(
        "--streams",
        type=_positive_int,
        default=1,
        metavar="S",
        help="streams per stage; the pipeline uses 3*S streams (default 1)",
    )
    demo.add_argument(
        "--concurrency",
        type=_positive_int,
        default=16,
        metavar="C",
        help="requests in flight at once (default 16)",
    )
    demo.add_argument(
        "--size",
        type=_positive_int,
        default=16_384,
        metavar="N",
        help="float32 elements per vector (default 16384)",
    )
    demo.add_argument(
        "--loop",
        choices=["asyncio", "uvloop", "trio"],
        default="asyncio",
        help="the event loop to run on (default asyncio; uvloop and trio need their package)",
    )
    demo.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    demo.add_argument(
        "--trace",
        metavar="PATH",
        help=f"write a Chrome/Perfetto trace JSON of every request's tasks ({PERFETTO}), "
        "recorded with aio_ascend.tracing",
    )
    demo.add_argument(
        "--plot",
        metavar="PATH",
        help="write the request latency as a CDF; the format follows the extension: .png, "
        ".svg or .pdf (needs matplotlib: the 'plot' extra)",
    )
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser(
        "bench",
        help="side-by-side benchmarks: raw runtime loop, naive to_thread, the scheduler",
        description="Measures, one after the other in one process, a raw synchronous runtime "
        "loop (a), a naive 'await to_thread(launch + sync)' per launch (b) and the scheduler "
        "(c), then completion-to-resume latency, event-loop lag with 10,000 launches "
        "outstanding, idle CPU and argument packing, and prints the ratios against the "
        "project's targets. The table goes to stdout, progress to stderr.",
    )
    bench.add_argument(
        "--scale",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="size multiplier (default 1.0, about a minute on 2 cores)",
    )
    bench.add_argument(
        "--only",
        metavar="a,b,c",
        help="comma-separated steps: packing, raw, naive, unbatched, poll, plan, handler, "
        "roundtrip, fanout, block, traced, bare_wakes, wake_poll, wake_block, wake_churn, "
        "loop_lag, producer_lag, graph, copy_isolation, idle_poll, idle_block, and on the "
        "acl backend over its C test double (built from tests/doubles/ in a checkout): "
        "acl_raw, acl_poll, acl_poll_ctypes, and with AIO_ASCEND_REALRT_LIB set on the "
        "real runtime: realrt_raw, realrt_poll (default: all; with --backend "
        "cuda: raw, naive, unbatched, poll, block, traced)",
    )
    bench.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        metavar="N",
        help="repeats of the CPU-per-launch, fan-out and graph rows, reported with their "
        "spread; the CPU rows of the targets run in interleaved rounds (default 3)",
    )
    bench.add_argument(
        "--launchers",
        type=_positive_int,
        default=256,
        metavar="N",
        help="concurrent launching coroutines (default 256)",
    )
    bench.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop to run on (default asyncio)",
    )
    bench.add_argument(
        "--backend",
        type=_bench_backend,
        default="sim",
        metavar="sim|cuda",
        help="where the launch steps run (default sim); cuda needs an NVIDIA GPU and the "
        "'cuda' extra, and runs the steps raw, naive, unbatched, poll, block and traced only",
    )
    bench.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    bench.add_argument(
        "--no-latencies", action="store_true", help="leave the raw latency lists out of --json"
    )
    bench.add_argument(
        "--trace",
        metavar="PATH",
        help=f"write a Chrome/Perfetto trace JSON ({PERFETTO}) of the extra probe tasks "
        "(bench.TRACED_ROUNDS each) the wake_poll and wake_block steps run after their "
        "measured rounds",
    )
    bench.add_argument(
        "--plot",
        metavar="PATH",
        help="write throughput and host CPU per launch side by side, over the latency CDFs "
        "(one launch + await; device completion -> coroutine resumed); the format follows the "
        "extension: .png, .svg or .pdf (needs matplotlib: the 'plot' extra)",
    )
    bench.add_argument(
        "--strict", action="store_true", help="exit 1 when a target ratio is not met"
    )
    bench.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    bench.set_defaults(func=cmd_bench)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand of ``parser`` (:func:`build_parser`), by name."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to list them
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    try:
        status: int = args.func(args)
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        # trio raises Ctrl-C from inside a nursery, in a group with the cancellations it caused
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is None:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `aio-ascend info | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
