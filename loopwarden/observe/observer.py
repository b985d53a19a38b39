"""The observer a store carries: a no-op unless `serve` builds telemetry (`telemetry.py`).

A call is watched as one `Watch`: the runner opens it with the operation's name and caller,
fills in what was decided (effect, reason codes, receipt id, seq, lease expiries) and closes
it; the observer turns that into a span and metric samples. Only identifiers, codes and counts
are ever handed over — never a tool input, command text, summary or token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

Attribute = str | int | bool | list[str]

# What turns tracing on without `--otel` (the OpenTelemetry SDK's own variables).
TRACING_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass
class Watch:
    """One call as it is observed: attributes (identifiers and codes only) and counts."""

    name: str
    attributes: dict[str, Attribute] = field(default_factory=dict)
    effect: str = "error"  # until the runner says what was decided
    reasons: tuple[str, ...] = ()
    expired_leases: int = 0
    active: bool = True  # False: nobody looks, so the runner need not describe the result

    def decided(self, effect: str, reasons: tuple[str, ...]) -> None:
        self.effect, self.reasons = effect, reasons
        self.attributes["loopwarden.decision.effect"] = effect
        self.attributes["loopwarden.decision.reasons"] = list(reasons)


class Observer:
    """Observes nothing: what every store has until a server installs telemetry."""

    tracing = False

    @contextmanager
    def watch(self, name: str, attributes: Mapping[str, Attribute]) -> Iterator[Watch]:
        """A watch over one call named `name` (`claim`, `hook.pre_tool`), closed on exit."""
        yield Watch(name, active=False)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Attribute]) -> Iterator[None]:
        """A span `loopwarden.<name>` around calls watched inside it (counted by theirs)."""
        yield

    @contextmanager
    def store_write(self, operation: str, database: str) -> Iterator[None]:
        """A write operation's store transaction, from being queued for the writer to its
        commit: a child span `loopwarden.store.write` (`db.system`) and a latency sample."""
        yield

    @contextmanager
    def continuing(self, traceparent: str | None) -> Iterator[None]:
        """Spans opened inside continue the W3C trace `traceparent` (ignored if malformed)."""
        yield

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
        """An export sink's progress: receipts a receiver acknowledged, deliveries that failed,
        leases taken over from a holder that let them expire, the receipts still to send, and
        receipts acknowledged by reference (too large for a batch)."""

    def witnessed(
        self,
        witness: str,
        *,
        cosigned: int = 0,
        failed: int = 0,
        conflicts: int = 0,
        behind: int | None = None,
    ) -> None:
        """A witness's answers (`loopwarden/witnesses/submitter.py`): checkpoints it cosigned,
        submissions that failed (retried), conflicts (it holds a view of this log that this
        log does not extend: an alarm), and the leaves the latest checkpoint it cosigned is
        behind this log's latest checkpoint."""

    def integrated(self, delays: Sequence[float]) -> None:
        """A batch of receipts given their Merkle leaves: each one's seconds from its time to
        its leaf (the integrator's view of the delay from commit to integration)."""

    def gauge(self, name: str, description: str, read: Callable[[], float]) -> None:
        """A gauge `loopwarden_<name>` whose value is `read()` at each scrape (cheap, never
        blocking: a queue's length)."""

    def bound_names(self, known: Callable[[str, str], bool]) -> None:
        """Keep span names a bounded set: a request span the MCP SDK names after what the
        client asked for (`tools/call <name>`, `prompts/get <name>`) keeps the name only if
        `known(method, name)`; any other is `(unknown)`."""

    def spent(
        self, provider: str, outcome: str, tokens: Mapping[str, int], cost_usd: float
    ) -> None:
        """A model call the gateway charged: its provider and how it ended, its tokens by sort
        (input, output, cache_write, cache_read) and its cost, as observed."""

    def metrics(self) -> tuple[bytes, str] | None:
        """The Prometheus exposition (body, content type), None if metrics are off."""
        return None

    def shutdown(self) -> None:
        """Flush what is queued for export and stop (bounded by the exporter's timeout)."""


NOBODY = Observer()


def metrics_pushed(environ: Mapping[str, str]) -> bool:
    """Metrics are pushed over OTLP when `OTEL_METRICS_EXPORTER` names `otlp` (as the
    OpenTelemetry SDK reads it: a comma-separated list), unless `OTEL_SDK_DISABLED=true`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = environ.get("OTEL_METRICS_EXPORTER", "").lower().split(",")
    return "otlp" in {name.strip() for name in names}


def tracing_wanted(flag: bool, environ: Mapping[str, str]) -> bool:
    """Tracing is on with `serve --otel`, an OTLP endpoint, or `OTEL_TRACES_EXPORTER` naming
    an exporter; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return flag or bool(exporter) or any(environ.get(name) for name in TRACING_ENV)
