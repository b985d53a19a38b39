"""Telemetry on: spans through the OpenTelemetry SDK, samples into a Prometheus registry.

Configured the standard way: the SDK reads the `OTEL_*` variables itself (endpoint, headers,
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` for the batch queue). Spans leave
through a `BatchSpanProcessor`: a bounded queue drained by its own thread, so export never
blocks or fails a decision (a full queue drops spans). The registry is this server's own,
never the process-global one, and its labels are bounded sets: operation names, effects and
reason codes (enums), never a loop, agent or turn id.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from loopwarden.observe.observer import Attribute, Observer, Watch

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Telemetry(Observer):
    """Spans (if `tracing`) and metrics (if `metrics`) of every watched call."""

    def __init__(self, *, tracing: bool, metrics: bool, version: str) -> None:
        self.tracing = tracing
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if tracing:
            self._provider = _provider()
            # The process's provider too: the MCP SDK's own span of each request
            # (`tools/call claim`, continuing the trace of a `traceparent` in `_meta`) is then
            # exported, and the parent of ours. One server per process: `serve`.
            trace.set_tracer_provider(self._provider)
            self._tracer = self._provider.get_tracer("loopwarden", version)
        self.registry: CollectorRegistry | None = CollectorRegistry() if metrics else None
        if self.registry is not None:
            self.decisions = Counter(
                "loopwarden_decisions",
                "Decisions made, by operation, effect and reason code (one sample per code).",
                ["operation", "effect", "reason"],
                registry=self.registry,
            )
            self.expiries = Counter(
                "loopwarden_lease_expiries",
                "Leases that ran out and were swept.",
                registry=self.registry,
            )
            self.latency = Histogram(
                "loopwarden_decision_seconds",
                "Time from a call's arrival at the runner to its answer, by operation.",
                ["operation"],
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            )

    @contextmanager
    def watch(self, name: str, attributes: Mapping[str, Attribute]) -> Iterator[Watch]:
        watch = Watch(name, dict(attributes))
        started = time.perf_counter()
        if self._tracer is None:
            try:
                yield watch
            finally:
                self._count(watch, time.perf_counter() - started)
            return
        with self._tracer.start_as_current_span(
            f"loopwarden.{name}", record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield watch
            except Exception as exc:  # the error's kind only: its message may quote input
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", type(exc).__name__)
                raise
            finally:
                span.set_attributes(watch.attributes)
                self._count(watch, time.perf_counter() - started)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Attribute]) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        with self._tracer.start_as_current_span(
            f"loopwarden.{name}", attributes=attributes, record_exception=False
        ):
            yield

    def _count(self, watch: Watch, seconds: float) -> None:
        if self.registry is None:
            return
        for reason in watch.reasons or ("",):
            self.decisions.labels(watch.name, watch.effect, reason).inc()
        if watch.expired_leases:
            self.expiries.inc(watch.expired_leases)
        self.latency.labels(watch.name).observe(seconds)

    @contextmanager
    def continuing(self, traceparent: str | None) -> Iterator[None]:
        if self._tracer is None or not traceparent:
            yield
            return
        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        token = otel_context.attach(parent)
        try:
            yield
        finally:
            otel_context.detach(token)

    def metrics(self) -> tuple[bytes, str] | None:
        if self.registry is None:
            return None
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def _provider() -> TracerProvider:
    """A tracer provider from the `OTEL_*` environment (service name `loopwarden` unless
    `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one)."""
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": "loopwarden"})
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    return provider


def _exporter() -> SpanExporter:
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        return ConsoleSpanExporter(out=sys.stderr)  # on stdio, stdout is the protocol
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
