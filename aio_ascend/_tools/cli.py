"""The ``aio-ascend`` command line (also ``python -m aio_ascend``).

::

    aio-ascend info                      # backends, what "auto" picks and why, versions
    aio-ascend demo [--requests N] [--streams S] [--loop asyncio|uvloop|trio]
                    [--trace PATH] [--plot PATH]
    aio-ascend bench [--scale F] [--only a,b,c] [--json PATH] [--trace PATH] [--plot PATH]

Exit status: 0 on success, 1 when a result was wrong (demo) or a target was missed
(``bench --strict``), 2 for bad usage or a missing optional dependency.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

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


def _indent(text: str, width: int) -> str:
    """Continuation lines of a multi-line message, indented to line up under the first."""
    return ("\n" + " " * width).join(line.strip() for line in text.strip().splitlines())


# --- info -------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    from .. import __version__
    from .._runtime import BACKENDS, ENV_BACKEND, available_backends, choose_backend, probe_backend

    print(f"{PROG} {__version__}")
    print("backends:")
    for name in BACKENDS:
        ok, why = probe_backend(name)
        print(f"  {name:<5} {'available' if ok else 'unavailable':<12} {_indent(why, 21)}")
    print(f"available: {', '.join(available_backends())}")
    try:
        chosen, reason = choose_backend("auto")
    except ValueError as exc:
        chosen, reason = "nothing", str(exc)
    print(f"auto picks: {chosen}")
    print(f"  why: {_indent(reason, 7)}")
    override = os.environ.get(ENV_BACKEND)
    print(
        f"  {ENV_BACKEND}={override}"
        if override
        else f"  set {ENV_BACKEND}=sim|acl|cuda to override 'auto'"
    )
    print("versions:")
    print(
        f"  {'python':<12} {platform.python_version()} ({platform.python_implementation()}, "
        f"{sys.executable})"
    )
    print(f"  {'aio_ascend':<12} {__version__}")
    for dist, note in [
        ("numpy", ""),
        ("anyio", ""),
        ("trio", "optional: --loop trio"),
        ("uvloop", "optional: --loop uvloop"),
        ("matplotlib", "optional extra 'plot': --plot"),
        ("uvicorn", "optional extra 'server'"),
        ("httpx", "optional extra 'server'"),
        ("starlette", "optional extra 'server'"),
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
    from .demo import STAGES, DemoConfig, format_demo, run_demo
    from .plot import plot_latencies
    from .trace import write_trace

    if args.plot and not _have_matplotlib():
        return _no_matplotlib()
    if args.loop in ("trio", "uvloop") and _version(args.loop) is None:
        print(f"{PROG}: --loop {args.loop} needs the {args.loop} package", file=sys.stderr)
        return 2
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
    result = run_demo(cfg)
    print(format_demo(result))
    if args.trace:
        slices = write_trace(
            args.trace,
            result.spans,
            tracks=result.tracks,
            process_name="aio-ascend demo (sim)",
            metadata={
                "command": "demo",
                "requests": cfg.requests,
                "stages": list(STAGES),
                "phases": ["queued", "submitted/executing", "completed->resumed"],
            },
        )
        print(
            f"  trace        {args.trace}  ({slices} slices on {len(result.tracks)} stream "
            f"tracks; open in {PERFETTO})"
        )
    if args.plot:
        lat = result.latencies_us
        plot_latencies(
            args.plot,
            {"request (h2d -> compute -> d2h)": lat},
            title=(
                f"aio-ascend demo: request latency, {result.completed} requests, "
                f"{3 * cfg.streams} streams, {min(cfg.concurrency, cfg.requests)} in flight, "
                f"loop={cfg.loop}"
            ),
        )
        print(f"  plot         {args.plot}")
    return 0 if result.ok else 1


# --- bench ------------------------------------------------------------------------------------


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
    from .bench import STEPS, BenchConfig, format_table, run_bench
    from .plot import plot_latencies
    from .trace import spans_from_tuples, write_trace

    if args.backend != "sim":
        print(
            f"{PROG} bench: --backend {args.backend} is not supported yet; only 'sim' is "
            "(the side-by-side runs drive the simulator's runtime directly)",
            file=sys.stderr,
        )
        return 2
    if args.plot and not _have_matplotlib():
        return _no_matplotlib()
    if args.loop == "uvloop" and _version("uvloop") is None:
        print(f"{PROG}: --loop uvloop needs the uvloop package", file=sys.stderr)
        return 2
    known = [key for key, _, _ in STEPS]
    only: list[str] | None = None
    if args.only:
        only = [key.strip() for key in args.only.split(",") if key.strip()]
        unknown = [key for key in only if key not in known]
        if unknown or not only:
            print(
                f"{PROG} bench: unknown step(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
    cfg = BenchConfig(
        scale=args.scale,
        launchers=args.launchers,
        backend=args.backend,
        loop=args.loop,
        progress=None if args.quiet else sys.stderr,
    )
    results = run_bench(cfg, only)
    print(format_table(results))
    status = 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_clean_json(results, keep_latencies=not args.no_latencies), fh, indent=2)
            fh.write("\n")
        print(f"json: {args.json}")
    if args.trace:
        spans = spans_from_tuples(cfg.spans)
        slices = write_trace(
            args.trace,
            spans,
            process_name="aio-ascend bench (sim)",
            metadata={"command": "bench", "config": results.get("config", {})},
        )
        if spans:
            print(f"trace: {args.trace}  ({slices} slices; open in {PERFETTO})")
        else:
            print(
                f"trace: {args.trace}  (empty: none of the steps run recorded spans; "
                "the wake_poll / wake_block steps do)",
                file=sys.stderr,
            )
    if args.plot:
        # Two different measurements carry latency samples: a whole launch + await
        # (naive, unbatched, poll, block) and device completion -> coroutine resumed (wake_*).
        series = {
            (
                f"{key}: completion->resume" if key.startswith("wake") else f"{key}: launch+await"
            ): value["latencies_us"]
            for key, value in results.items()
            if isinstance(value, dict) and value.get("latencies_us")
        }
        if series:
            plot_latencies(
                args.plot,
                series,
                title=f"aio-ascend bench latencies (scale {cfg.scale}, loop={cfg.loop})",
            )
            print(f"plot: {args.plot}")
        else:
            print(
                f"{PROG} bench: --plot: none of the steps run recorded latency samples "
                "(wake_poll, wake_block and wake_churn do); no plot written",
                file=sys.stderr,
            )
            status = 1
    if args.strict:
        missed = [name for name, x in results.get("ratios", {}).items() if not x["met"]]
        if missed:
            print(f"targets not met: {', '.join(missed)}", file=sys.stderr)
            status = 1
    return status


# --- the parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Awaitable Huawei Ascend (CANN/ACL) kernel launches: diagnostics, a "
        "pipeline demo and side-by-side benchmarks on the embedded simulator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    info = sub.add_parser("info", help="backends, which one 'auto' picks and why, versions")
    info.set_defaults(func=cmd_info)

    demo = sub.add_parser(
        "demo",
        help="a multi-stream copy/compute/copy pipeline on the sim backend",
        description="Many requests in flight through three streams per lane (host->device "
        "copy, axpy+scale compute, device->host copy), chained by record_event/wait_event; "
        "every result is checked against numpy.",
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
    demo.add_argument("--loop", choices=["asyncio", "uvloop", "trio"], default="asyncio")
    demo.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    demo.add_argument(
        "--trace", metavar="PATH", help=f"write a Chrome/Perfetto trace JSON ({PERFETTO})"
    )
    demo.add_argument(
        "--plot",
        metavar="PATH",
        help="write a latency histogram PNG (needs matplotlib: the 'plot' extra)",
    )
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser(
        "bench",
        help="side-by-side benchmarks: raw runtime loop, naive to_thread, the scheduler",
    )
    bench.add_argument(
        "--scale",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="size multiplier (default 1.0, well under a minute)",
    )
    bench.add_argument(
        "--only",
        metavar="a,b,c",
        help="comma-separated steps: packing, raw, naive, unbatched, poll, "
        "block, bare_wakes, wake_poll, wake_block, wake_churn, loop_lag, "
        "idle_poll, idle_block",
    )
    bench.add_argument(
        "--launchers",
        type=_positive_int,
        default=256,
        metavar="N",
        help="concurrent launching coroutines (default 256)",
    )
    bench.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    bench.add_argument("--backend", default="sim", help="only 'sim' is supported for now")
    bench.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    bench.add_argument(
        "--no-latencies", action="store_true", help="leave the raw latency lists out of --json"
    )
    bench.add_argument(
        "--trace",
        metavar="PATH",
        help=f"write a Chrome/Perfetto trace JSON of the recorded spans ({PERFETTO})",
    )
    bench.add_argument(
        "--plot", metavar="PATH", help="write a wake-latency histogram PNG (needs matplotlib)"
    )
    bench.add_argument(
        "--strict", action="store_true", help="exit 1 when a target ratio is not met"
    )
    bench.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error (already printed)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
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
