"""A FastAPI inference server: one device for the whole server, a small model per request.

The device is opened in the app's **lifespan**, held on ``app.state`` for as long as the server
lives, and handed to each request by a **dependency** (``get_inference``). Request bodies are
validated by a pydantic schema (1..32 rows of 64 finite floats) before any device work. Each
``POST /infer`` runs a two-layer model -- ``matmul`` (tiling data through a placeholder),
``vector_add`` (bias), ``matmul``, ``vector_add`` -- on one of a few streams: the upload and
the four launches are queued at once (streams run in call order) and one ``s.download(...)``
waits for the result, without blocking the event loop, so many requests are served at once.
Each request allocates its scratch buffers at its own batch size and frees them at the end:
the device's caching allocator serves them from blocks earlier requests freed (no runtime
call), and a buffer freed while its work is still queued is reused only once that work is done.

Runs on the embedded simulator (``sim``); needs the ``server`` extra
(``pip install 'aio_ascend[server]'``: fastapi, uvicorn, httpx)::

    python examples/fastapi_server.py --load 500 --concurrency 32   # load test, p50/p99
    python examples/fastapi_server.py --serve --port 8000           # serve on 127.0.0.1
    uvicorn fastapi_server:app --port 8000 --timeout-graceful-shutdown 2   # (from examples/)

Shutdown (Ctrl-C, SIGTERM) takes at most ``--close-timeout`` seconds (5), even while a kernel
hangs: uvicorn gives running requests half of it (its graceful shutdown, then it cancels
them), and the lifespan gives the device's leftover work a quarter before it destroys the
streams by force (``Stream.aclose(cancel=True, timeout=...)``); the process exits in the
rest.

``--load`` starts uvicorn in-process on 127.0.0.1 (a free port), sends N requests over HTTP
with httpx, C at a time, and checks every response against the same model computed with
numpy. Only loopback addresses are used. ``examples/ray_serve.py`` serves the same app with
one replica per NPU on Ray Serve.

API::

    POST /infer    {"inputs": [[64 floats], ...]}   (1..32 rows)
                -> {"outputs": [[16 floats], ...], "batch": B, "stream": k}
    GET  /healthz  -> {"ok": true, "backend": "sim", "stats": {...}, "memory": {...}}
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import anyio
import numpy as np
import numpy.typing as npt
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import aio_ascend as aa

F32 = npt.NDArray[np.float32]

D_IN, HIDDEN, D_OUT = 64, 256, 16
MAX_BATCH = 32
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: seconds a server's shutdown may take, hung kernels included (``--close-timeout``)
CLOSE_TIMEOUT = 5.0
#: its shares: uvicorn's graceful shutdown (requests finishing, then cancelled), then the
#: device's leftover work; the rest is for uvicorn's own steps and the process's exit
GRACEFUL_SHARE, DEVICE_SHARE = 0.5, 0.25


def shutdown_budget(close_timeout: float) -> tuple[float, float]:
    """Of ``close_timeout``: (uvicorn's graceful shutdown, the device's close), in seconds."""
    return close_timeout * GRACEFUL_SHARE, close_timeout * DEVICE_SHARE


# --- the model ----------------------------------------------------------------------------------


class Model:
    """Weights of ``y = (x @ w1 + b1) @ w2 + b2`` (float32), deterministic from ``seed``."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1: F32 = (rng.standard_normal((D_IN, HIDDEN), np.float32) / 8).astype(np.float32)
        self.b1: F32 = rng.standard_normal(HIDDEN, np.float32)
        self.w2: F32 = (rng.standard_normal((HIDDEN, D_OUT), np.float32) / 16).astype(np.float32)
        self.b2: F32 = rng.standard_normal(D_OUT, np.float32)

    def reference(self, x: F32) -> F32:
        """The same computation in numpy (what every response is checked against)."""
        h = x @ self.w1 + self.b1
        return np.asarray(h @ self.w2 + self.b2, dtype=np.float32)


class _Scratch:
    """One request's device buffers, for its ``batch`` rows (the device's pool serves them)."""

    def __init__(self, dev: aa.Device, batch: int) -> None:
        self.x = dev.malloc(4 * batch * D_IN)
        self.h = dev.malloc(4 * batch * HIDDEN)
        self.o = dev.malloc(4 * batch * D_OUT)

    def free(self) -> None:
        for buf in (self.x, self.h, self.o):
            buf.free()  # back to the pool once the work queued on it has completed


class DeviceModel:
    """The model's weights on one device, a few streams, and scratch buffers."""

    def __init__(self, dev: aa.Device, model: Model, streams: int = 4) -> None:
        self.dev = dev
        self.model = model
        self.matmul = dev.function("matmul")
        self.vector_add = dev.function("vector_add")
        self.streams = [dev.stream() for _ in range(streams)]
        self._next_stream = itertools.cycle(range(streams))
        # biases tiled to MAX_BATCH rows, so one vector_add adds them to a whole batch
        self._host = {
            "w1": model.w1,
            "b1": np.tile(model.b1, MAX_BATCH),
            "w2": model.w2,
            "b2": np.tile(model.b2, MAX_BATCH),
        }
        self.weights = {name: dev.malloc(arr.nbytes) for name, arr in self._host.items()}

    async def upload(self) -> None:
        """Copy the weights to the device and wait until they are there."""
        for name, arr in self._host.items():
            await self.streams[0].upload(self.weights[name], arr)

    async def infer(self, x: F32) -> tuple[F32, int]:
        """``model(x)`` for 1..MAX_BATCH rows on the device: ``(outputs, stream index)``."""
        batch = x.shape[0]
        if x.ndim != 2 or x.shape[1] != D_IN or not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"x must be 1..{MAX_BATCH} rows of {D_IN}, got {x.shape}")
        index = next(self._next_stream)
        s = self.streams[index]
        scratch = _Scratch(self.dev, batch)
        w = self.weights
        try:
            # Queued, not awaited: the stream runs them in this order after the upload.
            await s.copy_to_device(scratch.x, x)
            await s.launch(
                self.matmul,
                8,
                aa.HostArgs()
                .ptr(scratch.x)
                .ptr(w["w1"])
                .ptr(scratch.h)
                .placeholder(struct.pack("<III", batch, HIDDEN, D_IN)),
            )
            await s.launch(
                self.vector_add,
                8,
                aa.HostArgs().ptr(scratch.h).ptr(w["b1"]).ptr(scratch.h).u32(batch * HIDDEN),
            )
            await s.launch(
                self.matmul,
                8,
                aa.HostArgs()
                .ptr(scratch.h)
                .ptr(w["w2"])
                .ptr(scratch.o)
                .placeholder(struct.pack("<III", batch, D_OUT, HIDDEN)),
            )
            await s.launch(
                self.vector_add,
                8,
                aa.HostArgs().ptr(scratch.o).ptr(w["b2"]).ptr(scratch.o).u32(batch * D_OUT),
            )
            # The one wait: the result, once the device has finished everything above.
            out: F32 = await s.download(scratch.o, np.float32, (batch, D_OUT))
        finally:
            # Done, cancelled or failed: work may still be queued on the buffers (a cancelled
            # request); their blocks go back to the pool only once it has completed.
            scratch.free()
        return out, index

    def health(self) -> dict[str, Any]:
        dev = self.dev
        return {
            "ok": True,
            "backend": dev.backend,
            "stats": dict(dev.stats()),
            "memory": dict(dev.memory_stats()),
        }

    async def close(
        self,
        *,
        cancel: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the device work, not the call
    ) -> None:
        """Close the streams together (their work awaited; with ``timeout``, those still busy
        after it are destroyed by force), then free the weights."""
        async with anyio.create_task_group() as tg:
            for s in self.streams:
                tg.start_soon(functools.partial(s.aclose, cancel=cancel, timeout=timeout))
        for buf in self.weights.values():
            buf.free()


@contextlib.asynccontextmanager
async def open_model(
    *,
    backend: str = "sim",
    streams: int = 4,
    seed: int = 0,
    device_id: int = 0,
    close_timeout: float = CLOSE_TIMEOUT,
) -> AsyncIterator[DeviceModel]:
    """Open the device, upload the weights; on exit close both within ``close_timeout``
    (unsubmitted work dropped; what is still running after it is destroyed by force)."""
    async with aa.open_device(device_id, backend=backend, close_timeout=close_timeout) as dev:
        dm = DeviceModel(dev, Model(seed), streams)
        try:
            await dm.upload()
            yield dm
        finally:
            deadline = time.monotonic() + close_timeout
            await dm.close(cancel=True, timeout=close_timeout)
            await dev.aclose(cancel=True, timeout=max(0.0, deadline - time.monotonic()))


# --- the FastAPI app ----------------------------------------------------------------------------

Row = Annotated[
    list[Annotated[float, Field(allow_inf_nan=False)]],
    Field(min_length=D_IN, max_length=D_IN),
]


class InferRequest(BaseModel):
    inputs: Annotated[list[Row], Field(min_length=1, max_length=MAX_BATCH)]


class InferResponse(BaseModel):
    outputs: list[list[float]]
    batch: int
    stream: int


class Health(BaseModel):
    ok: bool
    backend: str
    stats: dict[str, int]
    memory: dict[str, int]


class Inference(Protocol):
    """What the routes need: a ``DeviceModel``, or a Ray Serve replica (``ray_serve.py``)."""

    async def infer(self, x: F32) -> tuple[F32, int]: ...

    def health(self) -> dict[str, Any]: ...


async def get_inference(request: Request) -> Inference:
    """The dependency that hands the device model to a request (overridable, see Ray Serve)."""
    dm: Inference | None = getattr(request.app.state, "device_model", None)
    if dm is None:
        raise HTTPException(503, "the device is not open (did the server run the lifespan?)")
    return dm


InferenceDep = Annotated[Inference, Depends(get_inference)]


def create_app(
    *,
    backend: str = "sim",
    streams: int = 4,
    seed: int = 0,
    open_device: bool = True,
    close_timeout: float = CLOSE_TIMEOUT,
) -> FastAPI:
    """The app. With ``open_device``, its lifespan opens the device for the server's life and
    puts the model on ``app.state``; without, whoever serves it overrides ``get_inference``.
    ``close_timeout``: the server's whole shutdown (see :func:`serve`)."""
    device_close_s = shutdown_budget(close_timeout)[1]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The device lives exactly as long as the server: opened at startup, closed at
        # shutdown, once uvicorn has finished (or cancelled) the requests: what they left
        # running gets the device's share of close_timeout, then is destroyed by force.
        async with open_model(
            backend=backend, streams=streams, seed=seed, close_timeout=device_close_s
        ) as dm:
            app.state.device_model = dm
            try:
                yield
            finally:
                app.state.device_model = None

    app = FastAPI(title="aio_ascend inference", lifespan=lifespan if open_device else None)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own 422 echoes each bad value back, which fails for a NaN (not JSON) and
        # repeats a whole oversized body: say where and what, without the input.
        errors = [{k: v for k, v in e.items() if k != "input"} for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    @app.post("/infer")
    async def infer(body: InferRequest, model: InferenceDep) -> InferResponse:
        x = np.asarray(body.inputs, dtype=np.float32)
        out, stream = await model.infer(x)
        return InferResponse(outputs=out.tolist(), batch=x.shape[0], stream=stream)

    @app.get("/healthz")
    async def healthz(model: InferenceDep) -> Health:
        return Health(**model.health())

    return app


app = create_app()  # `uvicorn fastapi_server:app --timeout-graceful-shutdown 2`


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: str = "sim",
    streams: int = 4,
    close_timeout: float = CLOSE_TIMEOUT,
) -> None:
    """Serve the app with uvicorn until Ctrl-C or SIGTERM; shutting down takes at most
    ``close_timeout`` s: running requests get half of it (uvicorn's graceful shutdown, which
    then cancels them: without it uvicorn waits for a hung request forever), the device's
    close a quarter (see :func:`shutdown_budget`)."""
    import uvicorn

    graceful, _ = shutdown_budget(close_timeout)
    uvicorn.run(
        create_app(backend=backend, streams=streams, close_timeout=close_timeout),
        host=host,
        port=port,
        lifespan="on",
        timeout_graceful_shutdown=graceful,  # type: ignore[arg-type]  # a float works
    )


# --- serving in-process, and the load test (the client side) ------------------------------------


@contextlib.asynccontextmanager
async def serve_in_process(asgi: Any, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run ``asgi`` under uvicorn in this event loop on a free loopback port; yield its URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(30):
                while not server.started:
                    if server.should_exit:
                        raise RuntimeError("uvicorn did not start (see its log above)")
                    await anyio.sleep(0.01)
            try:
                yield f"http://{host}:{port}"
            finally:
                server.should_exit = True  # runs the lifespan's shutdown: the device closes
    finally:
        sock.close()


@dataclass
class LoadReport:
    requests: int
    concurrency: int
    url: str = ""
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def verified(self) -> int:
        return len(self.latencies_s) - self.wrong - len(self.errors)

    @property
    def ok(self) -> bool:
        return self.verified == self.requests

    def percentiles_ms(self) -> tuple[float, float]:
        if not self.latencies_s:
            return float("nan"), float("nan")
        p50, p99 = np.percentile(self.latencies_s, [50, 99], method="nearest")
        return float(p50) * 1e3, float(p99) * 1e3


class _Progress:
    """``done/total`` on stderr: redrawn in place on a terminal, else a line per 10 %."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done = total, 0
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._next_line = max(1, total // 10)

    def step(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            end = "\n" if self.done == self.total else ""
            print(f"\r  {self.done}/{self.total} requests", end=end, file=sys.stderr, flush=True)
        elif self.done % self._next_line == 0 or self.done == self.total:
            print(f"  {self.done}/{self.total} requests", file=sys.stderr, flush=True)


async def run_load(
    url: str,
    requests: int,
    concurrency: int,
    *,
    model: Model | None = None,
    seed: int = 0,
    max_rows: int = 8,
    request_timeout: float = 60.0,
    progress: bool = True,
) -> LoadReport:
    """POST ``requests`` random batches of 1..max_rows rows to ``url``/infer, ``concurrency`` at
    a time, and check each answer against ``model`` (the server's weights) in numpy."""
    import httpx

    model = model or Model(seed)
    report = LoadReport(requests, concurrency, url)
    rng = np.random.default_rng(seed + 1)
    batches = [
        rng.standard_normal((int(rng.integers(1, max_rows + 1)), D_IN), np.float32)
        for _ in range(requests)
    ]
    counter = iter(range(requests))
    bar = _Progress(requests, progress)

    async def worker(client: httpx.AsyncClient) -> None:
        async with client:
            for i in counter:
                x = batches[i]
                t0 = time.perf_counter()
                try:
                    response = await client.post("/infer", json={"inputs": x.tolist()})
                except httpx.HTTPError as exc:
                    report.errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    bar.step()
                report.latencies_s.append(time.perf_counter() - t0)
                if response.status_code != 200:
                    report.errors.append(
                        f"request {i}: HTTP {response.status_code}: {response.text[:200]}"
                    )
                    continue
                got = np.asarray(response.json()["outputs"], dtype=np.float32)
                if got.shape != (x.shape[0], D_OUT) or not np.allclose(
                    got, model.reference(x), rtol=1e-4, atol=1e-4
                ):
                    report.wrong += 1

    # One client (one keep-alive connection) per worker: one AsyncClient shared by 32 workers
    # spends its time in its connection pool (measured: p99 0.6-1 s instead of 0.1 s). Made
    # before the clock starts: making one costs ~25 ms (an SSL context, even for http://).
    workers = min(concurrency, requests)
    clients = [httpx.AsyncClient(base_url=url, timeout=request_timeout) for _ in range(workers)]
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(worker, client)
    report.wall_s = time.perf_counter() - started
    async with httpx.AsyncClient(base_url=url, timeout=request_timeout) as client:
        response = await client.get("/healthz")
        if response.status_code == 200:
            health = response.json()
            report.stats, report.memory = health["stats"], health["memory"]
    return report


def format_report(
    r: LoadReport, title: str = "FastAPI server load test", device: str = "device"
) -> str:
    rate = len(r.latencies_s) / r.wall_s if r.wall_s else float("nan")
    p50, p99 = r.percentiles_ms()
    s = r.stats
    device = device.ljust(10)
    lines = [
        f"{title}: {r.requests} requests, concurrency {r.concurrency}, at {r.url}",
        f"  verified    {r.verified}/{r.requests} responses match numpy",
        f"  throughput  {rate:,.0f} requests/s ({r.wall_s:.2f} s)",
        f"  latency     p50 {p50:.2f} ms  p99 {p99:.2f} ms",
    ]
    if s:
        lines.append(
            f"  {device}  launches={s.get('launches')} copies={s.get('copies')} "
            f"batches={s.get('batches')} wakeups={s.get('wakeups')} "
            f"peak_in_flight={s.get('peak_in_flight')}"
        )
    if r.memory:
        m = r.memory
        lines.append(
            f"  {'memory'.ljust(10)}  malloc calls={m.get('allocations')} "
            f"served from the pool={m.get('pool_hits')} "
            f"runtime allocations={m.get('runtime_allocations')}"
        )
    lines += [f"  ERROR       {e}" for e in r.errors[:5]]
    return "\n".join(lines)


async def load_test(
    requests: int,
    concurrency: int,
    *,
    backend: str = "sim",
    streams: int = 4,
    quiet: bool = False,
    close_timeout: float = CLOSE_TIMEOUT,
) -> LoadReport:
    """Serve a fresh app on 127.0.0.1 in this process and run the load test against it."""
    app = create_app(backend=backend, streams=streams, close_timeout=close_timeout)
    async with serve_in_process(app) as url:
        return await run_load(url, requests, concurrency, progress=not quiet)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="FastAPI inference server on one shared device")
    parser.add_argument("--load", type=int, metavar="N", help="run a load test of N requests")
    parser.add_argument("--concurrency", type=int, default=16, metavar="C")
    parser.add_argument("--serve", action="store_true", help="serve with uvicorn")
    parser.add_argument("--host", default="127.0.0.1", help="loopback only")
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (logged)")
    parser.add_argument(
        "--close-timeout",
        type=float,
        default=CLOSE_TIMEOUT,
        metavar="S",
        help="most seconds a shutdown takes, hung kernels included",
    )
    parser.add_argument("--backend", default="sim", help="the model uses the sim's kernels")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    if not (args.close_timeout > 0 and math.isfinite(args.close_timeout)):
        parser.error("--close-timeout must be a number of seconds > 0")
    if args.serve:
        if args.host not in LOOPBACK:
            parser.error(f"--host {args.host}: this example only listens on loopback")
        serve(
            host=args.host,
            port=args.port,
            backend=args.backend,
            streams=args.streams,
            close_timeout=args.close_timeout,
        )
        return 0

    if args.load is None:
        parser.print_help()
        return 2
    if args.load < 1 or args.concurrency < 1 or args.streams < 1:
        parser.error("--load, --concurrency and --streams must be >= 1")
    try:
        report = anyio.run(
            lambda: load_test(
                args.load,
                args.concurrency,
                backend=args.backend,
                streams=args.streams,
                quiet=args.quiet,
                close_timeout=args.close_timeout,
            )
        )
    except KeyboardInterrupt:  # (the server and the device were shut down on the way out)
        print("interrupted", file=sys.stderr)
        return 130
    print(format_report(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
