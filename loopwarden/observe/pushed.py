"""Metrics pushed over OTLP/HTTP, for OpenTelemetry users: `OTEL_METRICS_EXPORTER=otlp`.

The same metrics `/metrics` serves to Prometheus (`telemetry.py`), under the same names and
labels (as attributes), recorded into the OpenTelemetry SDK's instruments and exported by a
`PeriodicExportingMetricReader` on its own thread (every `OTEL_METRIC_EXPORT_INTERVAL` ms, 60 s
by default; the endpoint, headers and timeout are the standard `OTEL_EXPORTER_OTLP_*`), so a
push never delays or fails a decision. Counters are monotonic sums (a Prometheus pipeline shows
them with `_total`), latencies histograms with the Prometheus buckets, gauges observed when the
reader collects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

__all__ = ["PushedMetrics"]

Attributes = Mapping[str, str]


class PushedMetrics:
    """The server's metrics as OpenTelemetry instruments, pushed over OTLP/HTTP."""

    def __init__(
        self,
        version: str,
        resource: Resource,
        *,
        latency_buckets: Sequence[float],
        integration_buckets: Sequence[float],
    ) -> None:
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        self.provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self.provider.get_meter("loopwarden", version)
        self.meter = meter
        self.decisions = meter.create_counter(
            "loopwarden_decisions", description="Decisions made, by operation, effect and reason."
        )
        self.expiries = meter.create_counter(
            "loopwarden_lease_expiries", description="Leases that ran out and were swept."
        )
        self.latency = meter.create_histogram(
            "loopwarden_decision_seconds",
            unit="s",
            description="Time from a call's arrival at the runner to its answer, by operation.",
            explicit_bucket_boundaries_advisory=latency_buckets,
        )
        self.write_latency = meter.create_histogram(
            "loopwarden_store_write_seconds",
            unit="s",
            description="A write operation's store transaction, queued to committed.",
            explicit_bucket_boundaries_advisory=latency_buckets,
        )
        self.integration = meter.create_histogram(
            "loopwarden_integration_delay_seconds",
            unit="s",
            description="Seconds from a receipt's time to its Merkle leaf.",
            explicit_bucket_boundaries_advisory=integration_buckets,
        )
        self.drops = meter.create_counter(
            "loopwarden_telemetry_dropped", description="Spans dropped before export."
        )
        self.sent = meter.create_counter(
            "loopwarden_export_sent", description="Receipts an export sink's receiver took."
        )
        self.failed = meter.create_counter(
            "loopwarden_export_failures", description="Export deliveries that failed."
        )
        self.takeovers = meter.create_counter(
            "loopwarden_export_lease_takeovers", description="Export sink leases taken over."
        )
        self.by_reference = meter.create_counter(
            "loopwarden_export_by_reference",
            description="Receipts an export sink sent by reference: too large for a batch.",
        )
        self.model_calls = meter.create_counter(
            "loopwarden_model_calls",
            description="Model calls through the model gateway, by provider and outcome.",
        )
        self.model_tokens = meter.create_counter(
            "loopwarden_model_tokens",
            description="Model tokens the gateway charged, by provider and sort.",
        )
        self.model_cost = meter.create_counter(
            "loopwarden_model_cost_usd",
            description="US dollars the gateway charged for model calls, by provider.",
        )
        self.cosigned = meter.create_counter(
            "loopwarden_witness_cosignatures", description="Checkpoints a witness cosigned."
        )
        self.witness_failed = meter.create_counter(
            "loopwarden_witness_failures",
            description="Checkpoint submissions to a witness that failed; retried with backoff.",
        )
        self.conflicts = meter.create_counter(
            "loopwarden_witness_conflicts",
            description="A witness holds a view of this log that this log does not extend.",
        )
        self.witness_behind = meter.create_gauge(
            "loopwarden_witness_behind_leaves",
            description="Leaves between the latest checkpoint and a witness's latest cosigned.",
        )
        self.lag = meter.create_gauge(
            "loopwarden_export_lag_receipts",
            description="Receipts sealed but not yet acknowledged by the sink's receiver.",
        )
        self._reads: dict[str, Callable[[], float]] = {}

    def gauge(self, name: str, description: str, read: Callable[[], float]) -> None:
        """`loopwarden_<name>`, observed at each collection through `read` (replaced when a
        store is opened again)."""
        if name not in self._reads:

            def observe(options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(self._reads[name]())]

            self.meter.create_observable_gauge(
                f"loopwarden_{name}", callbacks=[observe], description=description
            )
        self._reads[name] = read

    def shutdown(self) -> None:
        """Push what was recorded since the last export (bounded by the exporter's timeout)."""
        self.provider.shutdown()
