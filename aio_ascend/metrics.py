"""Metrics for servers: a Prometheus collector and OpenTelemetry spans per task.

Both are optional extras, imported only when used, and off until asked for:

- :class:`PrometheusMetrics` (``pip install "aio_ascend[metrics]"``, prometheus-client): the
  ``stats()`` of every watched device as counters and gauges, plus latency histograms of every
  device's tasks (queued, on the device, wake-up, admitted -> completed) and a count of
  failed tasks by error;
- :class:`OtelSpans` (``pip install "aio_ascend[otel]"``, opentelemetry-api and -sdk): one
  span per task, from its admission to its observed completion, a child of the span that was
  current where the task was created (the request's span in an instrumented server).

For example::

    from aio_ascend.metrics import PrometheusMetrics
    metrics = PrometheusMetrics()          # registers on prometheus_client.REGISTRY
    metrics.watch(dev)                     # dev.stats() as aio_ascend_* series
    metrics.start()                        # the task latency histograms
    prometheus_client.start_http_server(9464)

Both observe tasks through the scheduler's hooks (``aio_ascend._sched.hooks``), like
:mod:`aio_ascend.tracing`: nothing is measured while they are stopped. Timestamps are those
of ``Task`` (``time.perf_counter()`` seconds).
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from ._sched.devpool import COUNTER_KEYS as MEMORY_COUNTERS
from ._sched.hooks import HOOKS, ObserverContext, Source, task_of, times
from ._sched.work import Outcome
from ._version import __version__

__all__ = ["DEFAULT_BUCKETS", "OtelSpans", "PrometheusMetrics"]

#: histogram bucket bounds, seconds (10 us .. 10 s)
DEFAULT_BUCKETS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: the ``dev.stats()`` keys exported as counters (the others are gauges)
COUNTER_STATS = frozenset(
    {
        "launches",
        "copies",
        "batches",
        "wakeups",
        "timeouts",
        "sync_timeouts",
        "host_buffer_allocations",
        "host_buffer_violations",
    }
)

#: histogram name suffix -> what it measures
PHASES = {
    "queued": "admitted -> its batch handed to the runtime",
    "device": "submitted -> observed complete on the device (queueing on the stream included)",
    "wake": "observed complete -> the coroutine waiting for it resumed",
    "total": "admitted -> observed complete",
}


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module} is not installed: pip install 'aio_ascend[{extra}]' ({exc})"
        ) from exc


class _Observing(ObserverContext):
    """Start/stop as an observer of every device's tasks (see ``aio_ascend._sched.hooks``)."""

    wants_capture = False
    observing = False

    def start(self) -> None:
        """Start observing every device's tasks (a no-op if it is)."""
        if not self.observing:
            self.observing = True
            HOOKS.add(self)

    def stop(self) -> None:
        """Stop observing. Idempotent."""
        if self.observing:
            self.observing = False
            HOOKS.remove(self)

    def capture(self) -> object:
        return None

    @abstractmethod
    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        """A round of deliveries (``aio_ascend._sched.hooks.Observer``)."""

    def resumed(self, task: Any) -> None:
        pass


def _device_of(task: Any) -> tuple[str, str]:
    stream = task.stream
    if stream is None:
        return "?", "?"
    return str(stream.device.device_id), str(stream.device.backend)


class _Histogram:
    __slots__ = ("count", "counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0
        self.count = 0


class PrometheusMetrics(_Observing):
    """A Prometheus collector for aio_ascend (needs ``prometheus-client``).

    Exports, labelled by ``device`` and ``backend``:

    - every watched device's ``stats()`` (:meth:`watch`): ``<namespace>_<key>_total`` for the
      counters (launches, copies, batches, wakeups, timeouts, ...), ``<namespace>_<key>`` for
      the gauges (in_flight, streams, host_pool_bytes, ...), read at each scrape; and its
      ``memory_stats()`` as ``<namespace>_memory_<key>`` (``_total`` for the counters:
      allocations, pool_hits, runtime_allocations, runtime_frees, runtime_leaks, oom_retries),
      e.g.
      ``aio_ascend_memory_reserved_bytes``;
    - once :meth:`start`-ed, histograms of every device's tasks, also labelled by ``kind``:
      ``<namespace>_task_queued_seconds``, ``..._task_device_seconds``,
      ``..._task_wake_seconds`` and ``..._task_seconds`` (admitted -> observed complete), and
      ``<namespace>_task_failures_total`` (also labelled by ``error``).

    :param registry: where to register (default ``prometheus_client.REGISTRY``; ``None``: do
        not register, e.g. to call :meth:`collect` yourself)
    :param namespace: the metric name prefix
    :param buckets: histogram bounds in seconds, increasing
    """

    def __init__(
        self,
        *,
        registry: Any = "default",
        namespace: str = "aio_ascend",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        self._prom = _need("prometheus_client", "metrics")
        self._core = _need("prometheus_client.core", "metrics")
        bounds = [float(b) for b in buckets]
        if not bounds or any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"buckets must be increasing and not empty, got {buckets!r}")
        self.namespace = namespace
        self._bounds = bounds
        self._lock = threading.Lock()
        self._devices: weakref.WeakSet[Any] = weakref.WeakSet()
        self._histograms: dict[tuple[str, str, str, str], _Histogram] = {}
        self._failures: dict[tuple[str, str, str, str], int] = {}
        self._registry = self._prom.REGISTRY if registry == "default" else registry
        if self._registry is not None:
            self._registry.register(self)

    def watch(self, device: Any) -> None:
        """Export ``device.stats()`` and ``device.memory_stats()`` at every scrape while it is
        open (held weakly)."""
        self._devices.add(device)

    def close(self) -> None:
        """Stop observing and unregister from the registry."""
        self.stop()
        if self._registry is not None:
            self._registry.unregister(self)
            self._registry = None

    # --- observation (loop threads) ---------------------------------------------------------

    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        device, backend = str(source.device_id), source.backend
        bounds = self._bounds
        with self._lock:
            histograms = self._histograms
            for request, error, outcome in deliveries:
                if outcome is Outcome.FINISHED_LATE:
                    continue
                task = task_of(request)
                kind = request.kind
                if error is not None and not task.quiet:  # (a library's own event: not a task)
                    key = (device, backend, kind, type(error).__name__)
                    self._failures[key] = self._failures.get(key, 0) + 1
                admitted = task.admitted_at
                submitted, completed = times(request)
                for phase, value in (
                    ("queued", None if submitted is None else submitted - admitted),
                    (
                        "device",
                        None if submitted is None or completed is None else completed - submitted,
                    ),
                    ("total", None if completed is None else completed - admitted),
                ):
                    if value is not None:
                        self._observe(histograms, (device, backend, kind, phase), bounds, value)

    def resumed(self, task: Any) -> None:
        if task.completed_at is None or task.resumed_at is None:
            return
        device, backend = _device_of(task)
        with self._lock:
            self._observe(
                self._histograms,
                (device, backend, task.kind, "wake"),
                self._bounds,
                task.resumed_at - task.completed_at,
            )

    @staticmethod
    def _observe(
        histograms: dict[tuple[str, str, str, str], _Histogram],
        key: tuple[str, str, str, str],
        bounds: list[float],
        value: float,
    ) -> None:
        histogram = histograms.get(key)
        if histogram is None:
            histogram = histograms[key] = _Histogram(len(bounds) + 1)
        histogram.counts[bisect.bisect_left(bounds, value)] += 1
        histogram.sum += value
        histogram.count += 1

    # --- the collector protocol (the scrape's thread) ---------------------------------------

    def collect(self) -> Iterator[Any]:
        """The metric families (prometheus_client's ``Collector.collect``)."""
        core = self._core
        ns = self.namespace
        labels = ["device", "backend"]
        families: dict[str, Any] = {}
        for device in list(self._devices):
            if device.closed:
                self._devices.discard(device)
                continue
            values = [str(device.device_id), str(device.backend)]
            samples = [
                (key, f"dev.stats()[{key!r}]", key in COUNTER_STATS, value)
                for key, value in device.stats().items()
            ]
            samples.extend(
                (f"memory_{key}", f"dev.memory_stats()[{key!r}]", key in MEMORY_COUNTERS, value)
                for key, value in device.memory_stats().items()
            )
            for name, help_text, counter, value in samples:
                family = families.get(name)
                if family is None:
                    kind = core.CounterMetricFamily if counter else core.GaugeMetricFamily
                    family = families[name] = kind(f"{ns}_{name}", help_text, labels=labels)
                family.add_metric(values, value)
        yield from families.values()
        with self._lock:
            histograms = {key: (list(h.counts), h.sum) for key, h in self._histograms.items()}
            failures = dict(self._failures)
        bounds = self._bounds
        for phase, help_text in PHASES.items():
            name = f"{ns}_task_seconds" if phase == "total" else f"{ns}_task_{phase}_seconds"
            family = core.HistogramMetricFamily(
                name, f"Task latency, {help_text}", labels=[*labels, "kind"]
            )
            for (device_id, backend, kind, which), (counts, total) in histograms.items():
                if which != phase:
                    continue
                cumulative, running = [], 0
                for bound, count in zip(bounds, counts, strict=False):
                    running += count
                    cumulative.append((_bound(bound), running))
                cumulative.append(("+Inf", running + counts[-1]))
                family.add_metric([device_id, backend, kind], cumulative, sum_value=total)
            yield family
        family = core.CounterMetricFamily(
            f"{ns}_task_failures", "Tasks failed, by error", labels=[*labels, "kind", "error"]
        )
        for (device_id, backend, kind, error), count in failures.items():
            family.add_metric([device_id, backend, kind, error], count)
        yield family


def _bound(value: float) -> str:
    return repr(float(value))


class OtelSpans(_Observing):
    """One OpenTelemetry span per task (needs ``opentelemetry-api``; an SDK to export them).

    A task's span runs from its admission to its observed completion (or failure), with a
    ``submitted`` event when its batch reached the runtime; it is a child of the span that
    was current where the task was created. It is named ``"aio_ascend <kind>"`` (with the
    kernel's name for launches) and carries ``aio_ascend.*`` attributes: device, backend,
    stream, kind, kernel, queued/on-device seconds. A failed task's span has an ERROR status
    and the exception recorded. The wake-up (resumption of the waiting coroutine) comes
    after the span has ended and is not in it; :class:`PrometheusMetrics` measures it.

    :param tracer_provider: the provider to get the tracer from (default: the global one)
    """

    wants_capture = True

    def __init__(self, *, tracer_provider: Any = None) -> None:
        self._trace = _need("opentelemetry.trace", "otel")
        self._context = _need("opentelemetry.context", "otel")
        self._tracer = self._trace.get_tracer(
            "aio_ascend", __version__, tracer_provider=tracer_provider
        )
        # perf_counter seconds -> epoch nanoseconds (OpenTelemetry's clock)
        self._offset = time.time_ns() - int(time.perf_counter() * 1e9)

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._offset

    def capture(self) -> object:
        return self._context.get_current()

    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        trace = self._trace
        for request, error, outcome in deliveries:
            if outcome is Outcome.FINISHED_LATE:
                continue
            task = task_of(request)
            kind = request.kind
            kernel = request.spec.kernel if kind == "launch" else None
            attributes: dict[str, Any] = {
                "aio_ascend.device": source.device_id,
                "aio_ascend.backend": source.backend,
                "aio_ascend.stream": f"{request.lane.handle:#x}",
                "aio_ascend.kind": kind,
            }
            if kernel is not None:
                attributes["aio_ascend.kernel"] = kernel
            submitted, completed = times(request)
            if submitted is not None:
                attributes["aio_ascend.queued_s"] = submitted - task.admitted_at
                if completed is not None:
                    attributes["aio_ascend.on_device_s"] = completed - submitted
            parent = (task.captured or {}).get(self)
            span = self._tracer.start_span(
                f"aio_ascend {kind}" + (f" {kernel}" if kernel else ""),
                context=parent,
                kind=trace.SpanKind.INTERNAL,
                attributes=attributes,
                start_time=self._ns(task.admitted_at),
            )
            if submitted is not None:
                span.add_event("submitted", timestamp=self._ns(submitted))
            if error is not None:
                span.record_exception(error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
            end = completed if completed is not None else time.perf_counter()
            span.end(end_time=self._ns(end))
