"""Scale-out on Ray Serve: one replica per NPU, the FastAPI app of ``fastapi_server.py`` as ingress.

Ray knows Ascend NPUs as the ``NPU`` resource: a replica that asks for ``{"NPU": 1}`` is placed
on a node with a free NPU, and Ray sets ``ASCEND_RT_VISIBLE_DEVICES`` in its worker to that
NPU alone, so every replica opens *its* NPU as device 0. Each replica:

- serves the same FastAPI app (``@serve.ingress``), with the ``get_inference`` dependency
  overridden to hand out the replica itself instead of the lifespan's device;
- opens its device **lazily, on the replica's own event loop** (the first request), so that
  every later call comes from the loop that opened it; and closes it in the replica's async
  ``__del__``, which Serve awaits at graceful shutdown (after in-flight requests drained);
- runs requests through ``@serve.batch``: concurrent requests are stacked into one device run
  of at most 32 rows (``batch_size_fn`` counts rows, not requests), up to ``streams`` runs at
  a time;
- exports ``dev.stats()`` and ``dev.memory_stats()`` as Ray metrics
  (``ray.serve.metrics.Gauge``, named ``aio_ascend_<counter>`` and
  ``aio_ascend_memory_<counter>``, tagged with the deployment and replica), at most once a
  second.

Needs the ``ray`` extra (``pip install 'aio_ascend[ray,server]'``). On the simulator, a local
Ray instance stands in for a cluster: ``ray.init(num_cpus=2, resources={"NPU": 2})`` says the
machine has two NPUs::

    python examples/ray_serve.py --load 300 --concurrency 16     # local Ray, 2 replicas, sim
    serve run ray_serve:app_builder replicas=8                   # on a cluster (from examples/)

``--load`` starts Ray and Serve on 127.0.0.1 (a free port), sends N requests over HTTP, checks
every answer against numpy, shuts everything down, and reports start-up time, requests/s,
p50/p99 and shutdown time; each phase has a time limit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # The local demo: Ray's own traffic (GCS, raylet, workers) on loopback, not the node's
    # address. Read when Ray is imported, so set before; a cluster (`serve run`) never sees it.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import anyio
import numpy as np
from fastapi_server import (
    CLOSE_TIMEOUT,
    F32,
    MAX_BATCH,
    DeviceModel,
    Inference,
    Model,
    create_app,
    format_report,
    get_inference,
    run_load,
)
from ray import serve
from ray.serve import metrics

import aio_ascend as aa

EXAMPLES = Path(__file__).resolve().parent

# The FastAPI app without its lifespan: each replica provides the model through the dependency.
api = create_app(open_device=False)


async def replica_inference() -> Inference:
    """``get_inference`` on a replica: the replica object, its device opened on first use."""
    replica: NPUReplica = serve.get_replica_context().servable_object
    await replica.device_model()
    return replica


api.dependency_overrides[get_inference] = replica_inference


def _rows(items: list[F32]) -> int:
    return sum(len(x) for x in items)


@serve.deployment(
    ray_actor_options={"resources": {"NPU": 1}},  # one replica per NPU
    max_ongoing_requests=MAX_BATCH * 4,  # >= what @serve.batch below can hold
    graceful_shutdown_timeout_s=30,
)
@serve.ingress(api)
class NPUReplica:
    """One NPU: its device, the model's weights on it, and a few streams."""

    def __init__(
        self,
        backend: str = "sim",
        streams: int = 4,
        seed: int = 0,
        shutdown_report: str | None = None,
    ) -> None:
        self.backend, self.streams, self.seed = backend, streams, seed
        self.shutdown_report = shutdown_report
        self._dm: DeviceModel | None = None
        self._opening = anyio.Lock()
        self._gauges: dict[str, metrics.Gauge] = {}
        self._next_export = 0.0

    async def device_model(self) -> DeviceModel:
        """The device and model, opened on first use on this replica's event loop."""
        if self._dm is None:
            async with self._opening:
                if self._dm is None:
                    # Device 0 is the NPU Ray gave this replica (ASCEND_RT_VISIBLE_DEVICES).
                    dev = await aa.open_device(0, backend=self.backend)
                    try:
                        dm = DeviceModel(dev, Model(self.seed), self.streams)
                        await dm.upload()
                    except BaseException:
                        await dev.aclose(cancel=True, timeout=10)
                        raise
                    self._dm = dm
                    self._export_stats(dm, force=True)
        return self._dm

    async def infer(self, x: F32) -> tuple[F32, int]:
        return await self._infer_batch(x)

    @serve.batch(
        max_batch_size=MAX_BATCH,  # rows, as batch_size_fn counts them
        batch_size_fn=_rows,
        batch_wait_timeout_s=0.005,
        max_concurrent_batches=4,  # device runs in flight at once: one per stream (default 1)
    )
    async def _infer_batch(self, xs: list[F32]) -> list[tuple[F32, int]]:
        """Requests that arrived together, stacked into one device run of <= MAX_BATCH rows."""
        dm = await self.device_model()
        out, stream = await dm.infer(np.concatenate(xs))
        self._export_stats(dm)
        bounds = np.cumsum([len(x) for x in xs])[:-1]
        return [(part, stream) for part in np.split(out, bounds)]

    def health(self) -> dict[str, Any]:
        assert self._dm is not None  # replica_inference opened it
        return self._dm.health()

    def _export_stats(self, dm: DeviceModel, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_export:
            return
        self._next_export = now + 1.0
        samples = [(key, "stats", value) for key, value in dm.dev.stats().items()]
        samples += [
            (f"memory_{key}", "memory_stats", value) for key, value in dm.dev.memory_stats().items()
        ]
        for name, source, value in samples:
            gauge = self._gauges.get(name)
            if gauge is None:
                key = name.removeprefix("memory_") if source == "memory_stats" else name
                gauge = self._gauges[name] = metrics.Gauge(
                    f"aio_ascend_{name}", description=f"aio_ascend Device.{source}()[{key!r}]"
                )
            gauge.set(value)

    async def __del__(self) -> None:
        """Serve awaits this at graceful shutdown, on the replica's loop: close the device."""
        dm, self._dm = self._dm, None
        if dm is None:
            return  # never used: nothing was opened
        try:
            # Requests have drained; what is still running past close_timeout (a hung kernel)
            # is destroyed by force instead of holding the replica until task_timeout.
            await dm.close(cancel=True, timeout=CLOSE_TIMEOUT)
            stats = dict(dm.dev.stats())
            self._export_stats(dm, force=True)
        finally:
            await dm.dev.aclose(cancel=True, timeout=CLOSE_TIMEOUT)
        if self.shutdown_report:
            threads = [t.name for t in threading.enumerate() if t.name.startswith("aio_ascend-")]
            report = {
                "pid": os.getpid(),
                "ascend_rt_visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
                "stats": stats,
                "memory_stats": dict(dm.dev.memory_stats()),
                "library_threads_after_close": threads,
            }
            path = Path(self.shutdown_report) / f"replica-{os.getpid()}.json"
            path.write_text(json.dumps(report))


def app_builder(args: dict[str, str]) -> Any:
    """``serve run ray_serve:app_builder replicas=N backend=sim streams=4``."""
    return NPUReplica.options(num_replicas=int(args.get("replicas", 1))).bind(
        backend=args.get("backend", "sim"), streams=int(args.get("streams", 4))
    )


# --- the local demo and load test (the driver) --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _within(seconds: float, what: str, fn: Any) -> None:
    """Run ``fn()`` in a thread and wait at most ``seconds``; raise ``TimeoutError`` past it."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"example-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {seconds:.0f} s")
    if failure:
        raise failure[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the FastAPI app on Ray Serve, a replica per NPU")
    parser.add_argument("--load", type=int, default=300, metavar="N", help="requests to send")
    parser.add_argument("--concurrency", type=int, default=16, metavar="C")
    parser.add_argument("--replicas", type=int, default=2, help="NPUs (and replicas)")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--backend", default="sim", help="the model uses the sim's kernels")
    parser.add_argument("--streams", type=int, default=4, help="streams per replica")
    parser.add_argument("--shutdown-report", metavar="DIR", help="each replica writes one here")
    parser.add_argument("--startup-timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--load-timeout", type=float, default=120.0, metavar="S")
    parser.add_argument("--shutdown-timeout", type=float, default=60.0, metavar="S")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if min(args.load, args.concurrency, args.replicas, args.num_cpus, args.streams) < 1:
        parser.error("--load, --concurrency, --replicas, --num-cpus and --streams must be >= 1")

    import ray

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    deployment = NPUReplica.options(num_replicas=args.replicas).bind(
        backend=args.backend, streams=args.streams, shutdown_report=args.shutdown_report
    )

    def deploy() -> None:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment, route_prefix="/", logging_config={"log_level": "WARNING"})

    t0 = time.perf_counter()
    report = None
    failure = ""
    if args.backend == "sim":
        # No CANN here: Ray's NPU probe logs an ERROR and a traceback when `import acl` fails.
        # The NPU resource is declared below, so what the probe finds does not matter.
        logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)
    try:
        # On this thread: Ray's processes die with the thread that started them (PDEATHSIG).
        ray.init(
            address="local",  # a new local instance, never someone else's cluster
            num_cpus=args.num_cpus,
            resources={"NPU": args.replicas},  # what a node with that many NPUs reports
            include_dashboard=False,
            logging_level="warning",
            # the replicas import fastapi_server from here (uploaded, so it works on a cluster)
            runtime_env={"working_dir": str(EXAMPLES), "excludes": ["__pycache__"]},
        )
        _within(args.startup_timeout - (time.perf_counter() - t0), "start-up", deploy)
        startup_s = time.perf_counter() - t0
        print(f"ray serve: {args.replicas} replicas up at {url} in {startup_s:.1f} s", flush=True)

        async def load() -> Any:
            with anyio.fail_after(args.load_timeout):
                return await run_load(
                    url, args.load, args.concurrency, model=Model(0), progress=not args.quiet
                )

        report = anyio.run(load)
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        t1 = time.perf_counter()

        def stop() -> None:
            if ray.is_initialized():
                serve.shutdown()  # replicas drain, then their __del__ closes the devices
            ray.shutdown()

        try:
            _within(args.shutdown_timeout, "shutdown", stop)
        except Exception as exc:
            print(f"ERROR: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            os._exit(1)  # a Ray process that does not stop must not hang the caller
        shutdown_s = time.perf_counter() - t1

    if report is not None:
        title = f"ray serve, {args.replicas} replicas"
        print(format_report(report, title, device="device (one replica's, from /healthz)"))
    print(f"  shutdown    {shutdown_s:.1f} s (serve.shutdown + ray.shutdown)")
    if failure:
        print(f"ERROR: {failure}", file=sys.stderr)
        return 1
    assert report is not None
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
