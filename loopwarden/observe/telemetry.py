"""Telemetry on: spans through the OpenTelemetry SDK, samples into a Prometheus registry.

Configured the standard way: the SDK reads the `OTEL_*` variables itself (endpoint, headers,
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` for the batch queue). Spans leave
through a `BatchSpanProcessor`: a bounded queue drained by its own thread, so export never
blocks or fails a decision (a full queue drops spans). The registry is this server's own,
never the process-global one, and its labels are bounded sets: operation names, effects and
reason codes (enums), never a loop, agent or turn id. Span names are a bounded set too
(`BoundedNames`): the MCP SDK names a request's span after the tool or prompt a client asked
for, which is anything a client sends; a name the server does not serve becomes `(unknown)`.
With `OTEL_METRICS_EXPORTER=otlp` the same metrics are also pushed over OTLP (`pushed.py`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from loopwarden.observe.observer import Attribute, Observer, Watch

if TYPE_CHECKING:
    from loopwarden.observe.pushed import PushedMetrics

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
INTEGRATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""The commit-to-leaf delay's buckets: 0.25 s among them, the bound `docs/reliability.md` states."""


NAMED_BY_CLIENT = {"tools/call": "gen_ai.tool.name", "prompts/get": "gen_ai.prompt.name"}
"""The MCP SDK's request spans named `<method> <what the client asked for>`, and the attribute
that repeats the name."""
UNKNOWN = "(unknown)"


class BoundedNames(SpanProcessor):
    """Span names from a bounded set: a request span the MCP SDK named after a tool or prompt
    the server does not serve is renamed `<method> (unknown)`, and so is its name attribute, as
    it starts (the decision is `known(method, name)`, given by the server that knows its tools
    and prompts). Otherwise a client could make one span name per request."""

    def __init__(self) -> None:
        self.known: Callable[[str, str], bool] = lambda method, name: False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        method, sep, name = span.name.partition(" ")
        attribute = NAMED_BY_CLIENT.get(method)
        if attribute is None or not sep or self.known(method, name):
            return
        span.update_name(f"{method} {UNKNOWN}")
        span.set_attribute(attribute, UNKNOWN)


class Telemetry(Observer):
    """Spans (if `tracing`) and metrics of every watched call: into a Prometheus registry (if
    `metrics`) and pushed over OTLP (if `pushed`)."""

    def __init__(self, *, tracing: bool, metrics: bool, version: str, pushed: bool = False) -> None:
        self.tracing = tracing
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        self._names = BoundedNames()
        self.registry: CollectorRegistry | None = CollectorRegistry() if metrics else None
        self._gauges: dict[str, Gauge] = {}
        if self.registry is not None:
            self._instruments(self.registry)
        self.pushed: PushedMetrics | None = None
        if pushed:
            from loopwarden.observe.pushed import PushedMetrics

            self.pushed = PushedMetrics(
                version,
                _resource(),
                latency_buckets=LATENCY_BUCKETS,
                integration_buckets=INTEGRATION_BUCKETS,
            )
        if tracing:
            self._provider = _provider(self._dropped)
            self._provider.add_span_processor(self._names)
            # The process's provider too: the MCP SDK's own span of each request
            # (`tools/call claim`, continuing the trace of a `traceparent` in `_meta`) is then
            # exported, and the parent of ours. One server per process: `serve`.
            trace.set_tracer_provider(self._provider)
            self._tracer = self._provider.get_tracer("loopwarden", version)

    def _instruments(self, registry: CollectorRegistry) -> None:
        """The metrics. Labels are bounded sets: operations, effects, reason codes, a drop's
        reason and the configured sinks' names."""
        self.decisions = Counter(
            "loopwarden_decisions",
            "Decisions made, by operation, effect and reason code (one sample per code).",
            ["operation", "effect", "reason"],
            registry=registry,
        )
        self.expiries = Counter(
            "loopwarden_lease_expiries", "Leases that ran out and were swept.", registry=registry
        )
        self.latency = Histogram(
            "loopwarden_decision_seconds",
            "Time from a call's arrival at the runner to its answer, by operation.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.write_latency = Histogram(
            "loopwarden_store_write_seconds",
            "A write operation's store transaction, from being queued for the writer thread to "
            "its commit, by operation.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.integration = Histogram(
            "loopwarden_integration_delay_seconds",
            "Seconds from a receipt's time (its write transaction's) to its Merkle leaf, as this "
            "replica's integrator gave it (PostgreSQL; SQLite gives leaves as it commits).",
            buckets=INTEGRATION_BUCKETS,
            registry=registry,
        )
        self.drops = Counter(
            "loopwarden_telemetry_dropped",
            "Spans dropped before export: the queue was full, or the collector refused them.",
            ["reason"],
            registry=registry,
        )
        self._sink_instruments(registry)
        self._witness_instruments(registry)

    def _sink_instruments(self, registry: CollectorRegistry) -> None:
        """The export sinks' metrics, by the configured sink's name."""
        self.sent = Counter(
            "loopwarden_export_sent",
            "Receipts an export sink's receiver acknowledged (at least once: a takeover may "
            "send some again).",
            ["sink"],
            registry=registry,
        )
        self.failed = Counter(
            "loopwarden_export_failures",
            "Export deliveries that failed (connection error or a non-2xx answer); retried.",
            ["sink"],
            registry=registry,
        )
        self.takeovers = Counter(
            "loopwarden_export_lease_takeovers",
            "Export sink leases taken over from a holder that let them expire.",
            ["sink"],
            registry=registry,
        )
        self.by_reference = Counter(
            "loopwarden_export_by_reference",
            "Receipts an export sink sent by reference (id, digest and size, no envelope): too "
            "large for a batch its receiver takes.",
            ["sink"],
            registry=registry,
        )
        self.model_calls = Counter(
            "loopwarden_model_calls",
            "Model calls through the model gateway, charged as observed, by provider and outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.model_tokens = Counter(
            "loopwarden_model_tokens",
            "Model tokens the gateway charged, by provider and sort (input, output, "
            "cache_write, cache_read).",
            ["provider", "sort"],
            registry=registry,
        )
        self.model_cost = Counter(
            "loopwarden_model_cost_usd",
            "US dollars the gateway charged for model calls, by provider.",
            ["provider"],
            registry=registry,
        )
        self.lag = Gauge(
            "loopwarden_export_lag_receipts",
            "Receipts sealed but not yet acknowledged by the sink's receiver (as this server saw "
            "it last).",
            ["sink"],
            registry=registry,
        )

    def bound_names(self, known: Callable[[str, str], bool]) -> None:
        self._names.known = known

    def _witness_instruments(self, registry: CollectorRegistry) -> None:
        """The witnesses' metrics, by the witness's name in the policy."""
        self.cosigned = Counter(
            "loopwarden_witness_cosignatures",
            "Checkpoints a witness cosigned.",
            ["witness"],
            registry=registry,
        )
        self.witness_failed = Counter(
            "loopwarden_witness_failures",
            "Checkpoint submissions to a witness that failed (no answer, or a refusal that is "
            "not a conflict); retried with backoff.",
            ["witness"],
            registry=registry,
        )
        self.conflicts = Counter(
            "loopwarden_witness_conflicts",
            "Conflicts: a witness holds a view of this log that this log does not extend (a "
            "fork or a rollback). An alarm.",
            ["witness"],
            registry=registry,
        )
        self.witness_behind = Gauge(
            "loopwarden_witness_behind_leaves",
            "Leaves between the latest checkpoint and the latest one a witness cosigned.",
            ["witness"],
            registry=registry,
        )

    def witnessed(
        self,
        witness: str,
        *,
        cosigned: int = 0,
        failed: int = 0,
        conflicts: int = 0,
        behind: int | None = None,
    ) -> None:
        pushed, labels = self.pushed, {"witness": witness}
        if pushed is not None:
            for counter, count in (
                (pushed.cosigned, cosigned),
                (pushed.witness_failed, failed),
                (pushed.conflicts, conflicts),
            ):
                if count:
                    counter.add(count, labels)
            if behind is not None:
                pushed.witness_behind.set(behind, labels)
        if self.registry is None:
            return
        if cosigned:
            self.cosigned.labels(witness).inc(cosigned)
        if failed:
            self.witness_failed.labels(witness).inc(failed)
        if conflicts:
            self.conflicts.labels(witness).inc(conflicts)
        if behind is not None:
            self.witness_behind.labels(witness).set(behind)

    def _dropped(self, reason: str, count: int) -> None:
        if self.registry is not None:
            self.drops.labels(reason).inc(count)
        if self.pushed is not None:
            self.pushed.drops.add(count, {"reason": reason})

    def exported(
        self,
        sink: str,
        *,
        sent: int = 0,
        failed: int = 0,
        takeovers: int = 0,
        lag: int | None = None,
        by_reference: int = 0,
    ) -> None:
        pushed, labels = self.pushed, {"sink": sink}
        if pushed is not None:
            for counter, count in (
                (pushed.sent, sent),
                (pushed.failed, failed),
                (pushed.takeovers, takeovers),
                (pushed.by_reference, by_reference),
            ):
                if count:
                    counter.add(count, labels)
            if lag is not None:
                pushed.lag.set(lag, labels)
        if self.registry is None:
            return
        if by_reference:
            self.by_reference.labels(sink).inc(by_reference)
        if sent:
            self.sent.labels(sink).inc(sent)
        if failed:
            self.failed.labels(sink).inc(failed)
        if takeovers:
            self.takeovers.labels(sink).inc(takeovers)
        if lag is not None:
            self.lag.labels(sink).set(lag)

    def integrated(self, delays: Sequence[float]) -> None:
        for seconds in delays:
            if self.pushed is not None:
                self.pushed.integration.record(seconds)
            if self.registry is not None:
                self.integration.observe(seconds)

    def spent(
        self, provider: str, outcome: str, tokens: Mapping[str, int], cost_usd: float
    ) -> None:
        pushed = self.pushed
        if pushed is not None:
            pushed.model_calls.add(1, {"provider": provider, "outcome": outcome})
            for sort, count in tokens.items():
                if count:
                    pushed.model_tokens.add(count, {"provider": provider, "sort": sort})
            if cost_usd:
                pushed.model_cost.add(cost_usd, {"provider": provider})
        if self.registry is None:
            return
        self.model_calls.labels(provider, outcome).inc()
        for sort, count in tokens.items():
            if count:
                self.model_tokens.labels(provider, sort).inc(count)
        if cost_usd:
            self.model_cost.labels(provider).inc(cost_usd)

    def gauge(self, name: str, description: str, read: Callable[[], float]) -> None:
        if self.pushed is not None:
            self.pushed.gauge(name, description, read)
        if self.registry is None:
            return
        if name not in self._gauges:  # a store opened again reads through its new `read`
            self._gauges[name] = Gauge(f"loopwarden_{name}", description, registry=self.registry)
        self._gauges[name].set_function(read)

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

    @contextmanager
    def store_write(self, operation: str, database: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with self.span("store.write", {"db.system": database}):
                yield
        finally:
            seconds = time.perf_counter() - started
            if self.registry is not None:
                self.write_latency.labels(operation).observe(seconds)
            if self.pushed is not None:
                self.pushed.write_latency.record(seconds, {"operation": operation})

    def _count(self, watch: Watch, seconds: float) -> None:
        pushed = self.pushed
        if pushed is not None:
            for reason in watch.reasons or ("",):
                pushed.decisions.add(
                    1, {"operation": watch.name, "effect": watch.effect, "reason": reason}
                )
            if watch.expired_leases:
                pushed.expiries.add(watch.expired_leases)
            pushed.latency.record(seconds, {"operation": watch.name})
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
        if self.pushed is not None:
            self.pushed.shutdown()


def _resource() -> Resource:
    """The resource spans and pushed metrics name: from the `OTEL_*` environment, the service
    `loopwarden` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one."""
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return Resource.create({} if named else {"service.name": "loopwarden"})


def _provider(dropped: Callable[[str, int], None]) -> TracerProvider:
    """A tracer provider from the `OTEL_*` environment (`_resource`)."""
    provider = TracerProvider(resource=_resource())  # the sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(CountingProcessor(_exporter(), dropped))
    return provider


class CountingExporter(SpanExporter):
    """An exporter that counts the spans its collector did not take (`dropped`)."""

    def __init__(self, inner: SpanExporter, dropped: Callable[[str, int], None]) -> None:
        self._inner, self._dropped = inner, dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self._dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class CountingProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans it drops because its queue is full. The
    SDK counts those only into its own metrics pipeline, so the queue is looked at here: its
    bounded deque, read without a lock (if a later SDK hides it, nothing is counted)."""

    def __init__(self, exporter: SpanExporter, dropped: Callable[[str, int], None]) -> None:
        super().__init__(CountingExporter(exporter, dropped))
        self._count_dropped = dropped
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        self._queue = queue if getattr(queue, "maxlen", None) else None

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        sampled = span.context is not None and span.context.trace_flags.sampled
        if queue is not None and sampled and len(queue) >= (queue.maxlen or 0):
            self._count_dropped("queue_full", 1)
        super().on_end(span)


def _exporter() -> SpanExporter:
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        return ConsoleSpanExporter(out=sys.stderr)  # on stdio, stdout is the protocol
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
