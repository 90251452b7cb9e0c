"""An async inference server: a plain ASGI app, one shared device, a tiny model per request.

The device is opened once, in the ASGI lifespan, and shared by every request. Each ``POST
/infer`` runs a small two-layer model on it -- ``matmul`` (tiling data through a placeholder),
``vector_add`` (bias), ``matmul``, ``vector_add`` -- on one of a few streams, awaiting the
result without blocking the event loop, so many requests are served concurrently.

Runs on the embedded simulator (``sim``)::

    python examples/inference_server.py --load 500 --concurrency 32   # load test, p50/p99
    python examples/inference_server.py --serve --port 8000           # needs uvicorn
    uvicorn inference_server:app --port 8000                          # (from examples/)

``--load`` starts the server in-process on 127.0.0.1 with a free port when uvicorn and httpx
are installed (``pip install 'aio_ascend[server]'``), drives the ASGI app through httpx's
``ASGITransport`` when only httpx is, and otherwise calls the ASGI app directly. Every response
is checked against the same model computed with numpy. Only loopback addresses are used.

API::

    POST /infer    {"inputs": [[64 floats], ...]}   (1..32 rows)
                -> {"outputs": [[16 floats], ...], "batch": B, "stream": k}
    GET  /healthz  -> {"ok": true, "backend": "sim", "stats": {...}}
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt

import aio_ascend as aa

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
F32 = npt.NDArray[np.float32]

D_IN, HIDDEN, D_OUT = 64, 256, 16
MAX_BATCH = 32
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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
    """Per-request device buffers, reused from a free list."""

    def __init__(self, dev: aa.Device) -> None:
        self.x = dev.malloc(4 * MAX_BATCH * D_IN)
        self.h = dev.malloc(4 * MAX_BATCH * HIDDEN)
        self.o = dev.malloc(4 * MAX_BATCH * D_OUT)

    def free(self) -> None:
        for buf in (self.x, self.h, self.o):
            buf.free()  # deferred by the library while queued work still uses it


class DeviceModel:
    """The model's weights on one device, a few streams, and scratch buffers."""

    def __init__(self, dev: aa.Device, model: Model, streams: int) -> None:
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
        self._free: list[_Scratch] = []
        self._all: list[_Scratch] = []

    async def upload(self) -> None:
        s = self.streams[0]
        last = None
        for name, arr in self._host.items():
            last = await s.copy_to_device(self.weights[name], arr)
        assert last is not None
        await last

    async def infer(self, x: F32) -> tuple[F32, int]:
        batch = x.shape[0]
        index = next(self._next_stream)
        s = self.streams[index]
        scratch = self._free.pop() if self._free else self._new_scratch()
        w = self.weights
        out = np.empty((batch, D_OUT), np.float32)
        finished = False
        try:
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
            await (await s.copy_to_host(out, scratch.o))
            finished = True
        finally:
            if finished:
                self._free.append(scratch)
            else:  # cancelled or failed: work may still be queued; let the library free later
                self._all.remove(scratch)
                scratch.free()
        return out, index

    def _new_scratch(self) -> _Scratch:
        scratch = _Scratch(self.dev)
        self._all.append(scratch)
        return scratch

    async def close(self) -> None:
        for s in self.streams:
            await s.aclose()
        for scratch in self._all:
            scratch.free()
        for buf in self.weights.values():
            buf.free()


# --- the ASGI app -------------------------------------------------------------------------------


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class InferenceApp:
    """A plain ASGI 3 application (no framework): lifespan + ``/infer`` + ``/healthz``."""

    def __init__(self, *, seed: int = 0, streams: int = 4, backend: str = "sim") -> None:
        self.model = Model(seed)
        self.n_streams = streams
        self.backend = backend
        self.device_model: DeviceModel | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            raise RuntimeError(f"unsupported ASGI scope type {scope['type']!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        started = False
        try:
            # The device lives exactly as long as the server: opened at startup, closed (all
            # work awaited, threads joined) at shutdown.
            async with aa.open_device(0, backend=self.backend) as dev:
                dm = DeviceModel(dev, self.model, self.n_streams)
                try:
                    await dm.upload()
                    self.device_model = dm
                    await send({"type": "lifespan.startup.complete"})
                    started = True
                    message = await receive()
                    assert message["type"] == "lifespan.shutdown"
                finally:
                    self.device_model = None
                    await dm.close()
        except Exception as exc:
            kind = "shutdown" if started else "startup"
            await send({"type": f"lifespan.{kind}.failed", "message": repr(exc)})
            return
        await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            status, payload = 200, await self._route(scope["method"], scope["path"], body)
        except HTTPError as exc:
            status, payload = exc.status, {"error": str(exc)}
        data = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    async def _route(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        dm = self.device_model
        if path == "/healthz":
            if dm is None:
                raise HTTPError(503, "the device is not open (did the server run the lifespan?)")
            return {"ok": True, "backend": dm.dev.backend, "stats": dict(dm.dev.stats())}
        if path != "/infer":
            raise HTTPError(404, f"no route {path}")
        if method != "POST":
            raise HTTPError(405, "use POST /infer")
        if dm is None:
            raise HTTPError(503, "the device is not open (did the server run the lifespan?)")
        try:
            x = np.asarray(json.loads(body)["inputs"], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise HTTPError(
                400, f'expected JSON {{"inputs": [[{D_IN} floats], ...]}}: {exc}'
            ) from None
        if x.ndim != 2 or x.shape[1] != D_IN or not 1 <= x.shape[0] <= MAX_BATCH:
            raise HTTPError(
                400,
                f"inputs must be 1..{MAX_BATCH} rows of {D_IN} floats, got shape {list(x.shape)}",
            )
        out, stream = await dm.infer(np.ascontiguousarray(x))
        return {"outputs": out.tolist(), "batch": int(x.shape[0]), "stream": stream}


app = InferenceApp()  # `uvicorn inference_server:app`


# --- in-process drivers (load mode) -------------------------------------------------------------

Post = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]
Get = Callable[[str], Awaitable[tuple[int, bytes]]]


@contextlib.asynccontextmanager
async def run_lifespan(asgi: InferenceApp) -> AsyncIterator[None]:
    """Run the app's ASGI lifespan around the block (what a server does)."""
    to_app, app_inbox = anyio.create_memory_object_stream[Message](4)
    app_outbox, from_app = anyio.create_memory_object_stream[Message](4)
    with to_app, app_inbox, app_outbox, from_app:
        async with anyio.create_task_group() as tg:
            scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
            tg.start_soon(asgi, scope, app_inbox.receive, app_outbox.send)
            await to_app.send({"type": "lifespan.startup"})
            reply = await from_app.receive()
            if reply["type"] != "lifespan.startup.complete":
                raise RuntimeError(f"startup failed: {reply.get('message')}")
            try:
                yield
            finally:
                await to_app.send({"type": "lifespan.shutdown"})
                reply = await from_app.receive()
                if reply["type"] != "lifespan.shutdown.complete":
                    raise RuntimeError(f"shutdown failed: {reply.get('message')}")


async def asgi_call(
    asgi: InferenceApp, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    """One HTTP request straight into the ASGI app (no sockets, no dependencies)."""
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    delivered = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await asgi(scope, receive, send)
    return status, b"".join(chunks)


@contextlib.asynccontextmanager
async def client_for(asgi: InferenceApp, mode: str) -> AsyncIterator[tuple[Post, Get, str]]:
    """``(post, get, where)`` for ``mode``: ``uvicorn``, ``httpx`` or ``direct``."""
    if mode == "direct":
        async with run_lifespan(asgi):

            async def post(path: str, body: bytes) -> tuple[int, bytes]:
                return await asgi_call(asgi, "POST", path, body)

            async def get(path: str) -> tuple[int, bytes]:
                return await asgi_call(asgi, "GET", path)

            yield post, get, "the ASGI app, called directly"
        return

    import httpx

    if mode == "httpx":
        async with (
            run_lifespan(asgi),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1"
            ) as client,
        ):
            yield (*_httpx_calls(client), "httpx.ASGITransport (in-process, no socket)")
        return

    import uvicorn

    # Loopback only, on a free port chosen by the OS.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            deadline = time.monotonic() + 10
            while not server.started:
                if time.monotonic() > deadline or server.should_exit:
                    raise RuntimeError("uvicorn did not start")
                await anyio.sleep(0.01)
            url = f"http://127.0.0.1:{port}"
            try:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    yield (*_httpx_calls(client), f"uvicorn at {url}")
            finally:
                server.should_exit = True
    finally:
        sock.close()


def _httpx_calls(client: Any) -> tuple[Post, Get]:
    async def post(path: str, body: bytes) -> tuple[int, bytes]:
        response = await client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
        return int(response.status_code), bytes(response.content)

    async def get(path: str) -> tuple[int, bytes]:
        response = await client.get(path)
        return int(response.status_code), bytes(response.content)

    return post, get


def available_modes() -> list[str]:
    modes = []
    try:
        import httpx  # noqa: F401
    except ImportError:
        pass
    else:
        try:
            import uvicorn  # noqa: F401
        except ImportError:
            pass
        else:
            modes.append("uvicorn")
        modes.append("httpx")
    modes.append("direct")
    return modes


# --- load mode ----------------------------------------------------------------------------------


@dataclass
class LoadReport:
    mode: str
    where: str = ""
    requests: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.errors and len(self.latencies_us) == self.requests


async def run_load(
    requests: int, concurrency: int, *, mode: str = "auto", seed: int = 0, max_batch: int = 8
) -> LoadReport:
    """Serve the app in-process and fire ``requests`` POST /infer, ``concurrency`` at a time."""
    if mode == "auto":
        mode = available_modes()[0]
    asgi = InferenceApp(seed=seed)
    model = asgi.model  # the client checks answers with the same weights
    report = LoadReport(mode, requests=requests)
    rng = np.random.default_rng(seed + 1)
    batches = [
        rng.standard_normal((int(rng.integers(1, max_batch + 1)), D_IN), np.float32)
        for _ in range(requests)
    ]
    async with client_for(asgi, mode) as (post, get, where):
        report.where = where
        next_index = 0

        async def client() -> None:
            nonlocal next_index
            while next_index < requests:
                i = next_index
                next_index += 1
                x = batches[i]
                body = json.dumps({"inputs": x.tolist()}).encode()
                t0 = time.perf_counter()
                try:
                    status, data = await post("/infer", body)
                except Exception as exc:
                    report.errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                    continue
                report.latencies_us.append((time.perf_counter() - t0) * 1e6)
                if status != 200:
                    report.errors.append(f"request {i}: HTTP {status}: {data[:200]!r}")
                    continue
                got = np.asarray(json.loads(data)["outputs"], dtype=np.float32)
                if got.shape != (x.shape[0], D_OUT) or not np.allclose(
                    got, model.reference(x), rtol=1e-4, atol=1e-4
                ):
                    report.wrong += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, requests)):
                tg.start_soon(client)
        report.wall_s = time.perf_counter() - started
        status, data = await get("/healthz")
        if status == 200:
            report.stats = json.loads(data)["stats"]
    return report


def format_report(r: LoadReport, concurrency: int) -> str:
    lat = r.latencies_us
    rate = len(lat) / r.wall_s if r.wall_s else float("nan")
    p50, p99 = np.percentile(lat, [50, 99], method="nearest") if lat else (np.nan, np.nan)
    s = r.stats
    lines = [
        f"inference server load test: {r.requests} requests, concurrency {concurrency}, "
        f"via {r.where}",
        f"  verified    {len(lat) - r.wrong - len(r.errors)}/{r.requests} responses match numpy",
        f"  throughput  {rate:,.0f} requests/s ({r.wall_s:.2f} s)",
        f"  latency     p50 {p50 / 1e3:.2f} ms  p99 {p99 / 1e3:.2f} ms",
        f"  device      launches={s.get('launches')} copies={s.get('copies')} "
        f"batches={s.get('batches')} wakeups={s.get('wakeups')} "
        f"peak_in_flight={s.get('peak_in_flight')}",
    ]
    lines += [f"  ERROR       {e}" for e in r.errors[:5]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ASGI inference server on one shared device")
    parser.add_argument("--load", type=int, metavar="N", help="run a load test of N requests")
    parser.add_argument("--concurrency", type=int, default=16, metavar="C")
    parser.add_argument(
        "--mode",
        choices=["auto", "uvicorn", "httpx", "direct"],
        default="auto",
        help="how --load reaches the app (default: best installed of uvicorn, httpx, direct)",
    )
    parser.add_argument("--serve", action="store_true", help="serve with uvicorn")
    parser.add_argument("--host", default="127.0.0.1", help="loopback only")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    if args.serve:
        if args.host not in LOOPBACK:
            parser.error(f"--host {args.host}: this example only listens on loopback")
        try:
            import uvicorn
        except ImportError:
            print("--serve needs uvicorn: pip install 'aio_ascend[server]'", file=sys.stderr)
            return 2
        uvicorn.run(app, host=args.host, port=args.port, lifespan="on")
        return 0

    if args.load is None:
        parser.print_help()
        return 2
    if args.load < 1 or args.concurrency < 1:
        parser.error("--load and --concurrency must be >= 1")
    if args.mode != "auto" and args.mode not in available_modes():
        print(
            f"--mode {args.mode} needs the 'server' extra: pip install 'aio_ascend[server]'",
            file=sys.stderr,
        )
        return 2
    report = anyio.run(lambda: run_load(args.load, args.concurrency, mode=args.mode))
    print(format_report(report, args.concurrency))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
