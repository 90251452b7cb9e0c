"""``aio_ascend.metrics``: the Prometheus collector and OpenTelemetry spans (each test skips
when its extra is not installed), and a clear ImportError without them."""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import pytest

import aio_ascend as aa
from aio_ascend import metrics, testing
from aio_ascend._sched.hooks import HOOKS

pytestmark = pytest.mark.anyio


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus' text format."""
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(match.group(2))
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


async def test_prometheus_exports_stats_histograms_and_failures(sim_device: Any) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    collector = metrics.PrometheusMetrics(registry=registry, buckets=(1e-3, 1.0))
    async with sim_device() as dev:
        collector.watch(dev)
        s = dev.stream()
        buf = dev.malloc(100)
        with collector:
            for _ in range(5):
                await s.run(dev.function("noop"), 1)
            with testing.paused(dev):
                fault = await testing.inject_fault(s)
            with pytest.raises(aa.DeviceFaultError):
                await fault
        text = prometheus_client.generate_latest(registry).decode()
        device = {"device": "0", "backend": "sim"}
        assert _sample(text, "aio_ascend_launches_total", **device) == 6
        assert _sample(text, "aio_ascend_streams", **device) == 1
        assert _sample(text, "aio_ascend_faulted", **device) == 1
        # memory_stats(): gauges, and counters with _total (one buffer from the pool)
        assert _sample(text, "aio_ascend_memory_reserved_bytes", **device) == 512
        assert _sample(text, "aio_ascend_memory_allocated_bytes", **device) == 512
        assert _sample(text, "aio_ascend_memory_runtime_allocations_total", **device) == 1
        buf.free()
        labels = {**device, "kind": "launch"}
        # the fault was submitted (queued) but never completed (no device, total or wake)
        assert _sample(text, "aio_ascend_task_queued_seconds_count", **labels) == 6
        for name in ("task_device_seconds", "task_seconds", "task_wake_seconds"):
            assert _sample(text, f"aio_ascend_{name}_count", **labels) == 5
        assert _sample(text, "aio_ascend_task_seconds_bucket", **labels, le="+Inf") == 5
        error = type(fault.exception()).__name__
        assert _sample(text, "aio_ascend_task_failures_total", **labels, error=error) == 1
    # a closed device's stats are no longer exported; the histograms stay
    text = prometheus_client.generate_latest(registry).decode()
    assert "aio_ascend_launches_total" not in text
    assert "aio_ascend_task_seconds_count" in text
    assert HOOKS.observers == ()
    collector.close()
    assert "aio_ascend" not in prometheus_client.generate_latest(registry).decode()


async def test_prometheus_buckets_are_cumulative(sim_device: Any) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    collector = metrics.PrometheusMetrics(registry=registry, buckets=(1e-9, 10.0))
    async with sim_device() as dev, collector:
        s = dev.stream()
        for _ in range(3):
            await s.run(dev.function("sleep"), 1, aa.HostArgs().u32(100))
    text = prometheus_client.generate_latest(registry).decode()
    labels = {"device": "0", "backend": "sim", "kind": "launch"}
    assert _sample(text, "aio_ascend_task_device_seconds_bucket", **labels, le="1e-09") == 0
    assert _sample(text, "aio_ascend_task_device_seconds_bucket", **labels, le="10.0") == 3
    assert _sample(text, "aio_ascend_task_device_seconds_sum", **labels) >= 3 * 100e-6
    with pytest.raises(ValueError, match="increasing"):
        metrics.PrometheusMetrics(registry=None, buckets=(1.0, 0.5))


async def test_otel_spans_per_task_are_children_of_the_callers_span(sim_device: Any) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = metrics.OtelSpans(tracer_provider=provider)
    async with sim_device() as dev:
        s = dev.stream()
        with spans, provider.get_tracer("test").start_as_current_span("request") as parent:
            await s.run(dev.function("sleep"), 1, aa.HostArgs().u32(200))
            with testing.paused(dev):
                fault = await testing.inject_fault(s)
            with pytest.raises(aa.DeviceFaultError):
                await fault
    finished = {span.name: span for span in exporter.get_finished_spans()}
    assert set(finished) == {"aio_ascend launch sleep", "aio_ascend launch fault", "request"}
    sleep = finished["aio_ascend launch sleep"]
    assert sleep.parent is not None
    assert sleep.parent.span_id == parent.get_span_context().span_id
    assert sleep.attributes is not None
    assert sleep.attributes["aio_ascend.kernel"] == "sleep"
    assert sleep.attributes["aio_ascend.on_device_s"] >= 200e-6
    assert sleep.end_time is not None and sleep.start_time is not None
    assert sleep.end_time - sleep.start_time >= 200_000  # ns: it spans the kernel
    assert [event.name for event in sleep.events] == ["submitted"]
    failed = finished["aio_ascend launch fault"]
    assert failed.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in failed.events)


async def test_host_functions_are_measured_and_spanned(sim_device: Any) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    registry = prometheus_client.CollectorRegistry()
    collector = metrics.PrometheusMetrics(registry=registry)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def boom() -> None:
        raise KeyError("in the host function")

    async with sim_device() as dev:
        s = dev.stream()
        with collector, metrics.OtelSpans(tracer_provider=provider):
            await (await s.launch_host_func(lambda: time.sleep(0.002)))
            with pytest.raises(KeyError):
                await (await s.launch_host_func(boom))
    text = prometheus_client.generate_latest(registry).decode()
    labels = {"device": "0", "backend": "sim", "kind": "host_func"}
    for name in ("task_queued_seconds", "task_device_seconds", "task_seconds"):
        assert _sample(text, f"aio_ascend_{name}_count", **labels) == 2
    assert _sample(text, "aio_ascend_task_device_seconds_sum", **labels) >= 0.002
    assert _sample(text, "aio_ascend_task_failures_total", **labels, error="KeyError") == 1
    spans = [span for span in exporter.get_finished_spans() if span.name.endswith("host_func")]
    assert [span.name for span in spans] == ["aio_ascend host_func"] * 2
    assert spans[0].attributes is not None
    assert spans[0].attributes["aio_ascend.on_device_s"] >= 0.002
    collector.close()


async def test_a_host_function_past_task_timeout_is_exported_as_a_timeout(
    sim_device: Any,
) -> None:
    # It was told to observers when fn returned, with fn's own outcome: a success
    prometheus_client = pytest.importorskip("prometheus_client")
    import threading

    registry = prometheus_client.CollectorRegistry()
    collector = metrics.PrometheusMetrics(registry=registry)
    release = threading.Event()
    async with sim_device(task_timeout=0.2) as dev:
        s = dev.stream()
        with collector:
            host = await s.launch_host_func(lambda: release.wait(10))
            with pytest.raises(aa.TaskTimeoutError):
                await host
            release.set()
            await (await s.launch_host_func(lambda: None))  # runs once the first returned
    text = prometheus_client.generate_latest(registry).decode()
    labels = {"device": "0", "backend": "sim", "kind": "host_func"}
    assert _sample(text, "aio_ascend_task_failures_total", **labels, error="TaskTimeoutError") == 1
    assert _sample(text, "aio_ascend_task_seconds_count", **labels) == 2
    # the event recorded before fn is the library's: no failure of its own
    assert "record_event" not in text.split("aio_ascend_task_failures_total", 1)[-1]
    collector.close()


def test_a_missing_extra_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"aio_ascend\[metrics\]"):
        metrics.PrometheusMetrics()
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(ImportError, match=r"aio_ascend\[otel\]"):
        metrics.OtelSpans()
    assert HOOKS.observers == ()
