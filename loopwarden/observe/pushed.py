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
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Observation
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
        self.meter = self.provider.get_meter("loopwarden", version)
        self._decision_instruments(latency_buckets, integration_buckets)
        self._export_instruments()
        self._model_instruments()
        self._witness_instruments()
        self._reads: dict[str, Callable[[], float]] = {}

    def _counter(self, name: str, description: str) -> Counter:
        return self.meter.create_counter(f"loopwarden_{name}", description=description)

    def _histogram(self, name: str, description: str, buckets: Sequence[float]) -> Histogram:
        return self.meter.create_histogram(
            f"loopwarden_{name}",
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=buckets,
        )

    def _decision_instruments(
        self, latency_buckets: Sequence[float], integration_buckets: Sequence[float]
    ) -> None:
        counter, histogram = self._counter, self._histogram
        self.decisions = counter("decisions", "Decisions made, by operation, effect and reason.")
        self.expiries = counter("lease_expiries", "Leases that ran out and were swept.")
        self.latency = histogram(
            "decision_seconds",
            "Time from a call's arrival at the runner to its answer, by operation.",
            latency_buckets,
        )
        self.write_latency = histogram(
            "store_write_seconds",
            "A write operation's store transaction, queued to committed.",
            latency_buckets,
        )
        self.integration = histogram(
            "integration_delay_seconds",
            "Seconds from a receipt's time to its Merkle leaf.",
            integration_buckets,
        )
        self.drops = counter("telemetry_dropped", "Spans dropped before export.")

    def _export_instruments(self) -> None:
        counter = self._counter
        self.sent = counter("export_sent", "Receipts an export sink's receiver took.")
        self.failed = counter("export_failures", "Export deliveries that failed.")
        self.takeovers = counter("export_lease_takeovers", "Export sink leases taken over.")
        self.by_reference = counter(
            "export_by_reference",
            "Receipts an export sink sent by reference: too large for a batch.",
        )
        self.lag = self.meter.create_gauge(
            "loopwarden_export_lag_receipts",
            description="Receipts sealed but not yet acknowledged by the sink's receiver.",
        )

    def _model_instruments(self) -> None:
        counter = self._counter
        self.model_calls = counter(
            "model_calls", "Model calls through the model gateway, by provider and outcome."
        )
        self.model_tokens = counter(
            "model_tokens", "Model tokens the gateway charged, by provider and sort."
        )
        self.model_cost = counter(
            "model_cost_usd", "US dollars the gateway charged for model calls, by provider."
        )

    def _witness_instruments(self) -> None:
        counter = self._counter
        self.cosigned = counter("witness_cosignatures", "Checkpoints a witness cosigned.")
        self.witness_failed = counter(
            "witness_failures",
            "Checkpoint submissions to a witness that failed; retried with backoff.",
        )
        self.conflicts = counter(
            "witness_conflicts",
            "A witness holds a view of this log that this log does not extend.",
        )
        self.witness_behind = self.meter.create_gauge(
            "loopwarden_witness_behind_leaves",
            description="Leaves between the latest checkpoint and a witness's latest cosigned.",
        )

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
