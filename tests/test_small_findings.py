"""The small findings of issue 44 (finding 9), each against a real process.

- `loopwarden events --after N` past any log index is a clear usage error, not a traceback.
- `/metrics` is read with an operator's token, static or OAuth: a JWT from the server's issuer,
  for its resource, naming the operator role alone (what a Prometheus `oauth2` scrape sends).
- Span names are a bounded set: a tool or prompt name the server does not serve, sent by a
  client, never becomes a span name (`tools/call (unknown)`).
- `OTEL_METRICS_EXPORTER=otlp` pushes the metrics over OTLP/HTTP to the collector.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from support import (
    LEAKS,
    cli,
    cli_env,
    cli_open_loop,
    connect_http,
    dashboard_url,
    make_policy,
    mint_tokens,
    start_oauth_server,
    start_server,
    stop_server,
)

# --- events --after ---------------------------------------------------------------------------


@pytest.mark.parametrize("after", ["99999999999999999999999", "9223372036854775808", "-2"])
def test_events_after_an_index_past_any_log_is_one_clear_usage_error(tmp_path, after):
    home = tmp_path / "home"
    cli_open_loop(home, "L1", make_policy())
    done = cli("events", "--after", after, "--home", str(home))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "a log index is -1 (from the start) to 2^53" in done.stderr
    assert not LEAKS.search(done.stderr) and done.stdout == ""
    assert cli("events", "--after", str(2**53), "--home", str(home)).returncode == 0


# --- /metrics with an operator's OAuth token ---------------------------------------------------


def test_an_operators_oauth_token_reads_metrics_and_no_other_token_does(tmp_path, issuer):
    served, resource = start_oauth_server(tmp_path, issuer.url)
    try:
        url = f"{dashboard_url(served)}/metrics"

        def scrape(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx2.get(url, headers=headers, timeout=30).status_code

        operator = issuer.mint(sub="alice", aud=resource, scope="loopwarden:operator")
        assert scrape(operator) == 200
        assert scrape(issuer.mint(sub="builder", aud=resource, scope="loopwarden:agent")) == 401
        both = "loopwarden:operator loopwarden:agent"  # a role, not roles
        assert scrape(issuer.mint(sub="alice", aud=resource, scope=both)) == 401
        elsewhere = "http://127.0.0.1:9/mcp"  # another resource's token
        assert scrape(issuer.mint(sub="alice", aud=elsewhere, scope="loopwarden:operator")) == 401
        expired = int(time.time()) - 3600
        assert (
            scrape(issuer.mint(sub="alice", aud=resource, scope="loopwarden:operator", exp=expired))
            == 401
        )
        static = mint_tokens(served.home, [("ops", "operator")])["ops"].token
        assert scrape(static) == 200
    finally:
        stop_server(served)


# --- a collector: spans and pushed metrics -----------------------------------------------------


@dataclass
class Collector:
    """An OTLP/HTTP collector on loopback: traces and metrics, decoded."""

    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    http: ThreadingHTTPServer | None = None

    def start(self) -> str:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                kinds = {
                    "/v1/traces": ExportTraceServiceRequest,
                    "/v1/metrics": ExportMetricsServiceRequest,
                }
                kind = kinds.get(self.path)
                if kind is not None:
                    decoded = kind()
                    decoded.ParseFromString(body)
                    with collector.lock:
                        if self.path == "/v1/traces":
                            collector.traces.append(decoded)
                        else:
                            collector.metrics.append(decoded)
                self.send_response(200 if kind is not None else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()

    def span_names(self) -> list[str]:
        with self.lock:
            return [
                span.name
                for request in self.traces
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]

    def points(self, name: str) -> list[dict[str, Any]]:
        """The data points of the pushed metric `name`: their attributes and value."""
        found = []
        with self.lock:
            for request in self.metrics:
                for resource in request.resource_metrics:
                    for scope in resource.scope_metrics:
                        for metric in scope.metrics:
                            if metric.name != name:
                                continue
                            kind = metric.WhichOneof("data")
                            for point in getattr(metric, kind).data_points:
                                attrs = {a.key: a.value.string_value for a in point.attributes}
                                value = getattr(point, "as_int", 0) or getattr(point, "count", 0)
                                found.append({**attrs, "value": value})
        return found


@pytest.fixture
def collector() -> Iterator[Collector]:
    made = Collector()
    yield made
    made.stop()


def _serve(tmp_path: Path, endpoint: str, **env: str) -> Any:
    home = tmp_path / "home"
    cli_open_loop(home, "L1", make_policy(agents=["builder"]), ("a", "b"))
    environment = cli_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **env)
    return start_server(home, tmp_path / "logs", env=environment)


async def _calls(url: str, token: str) -> None:
    async with connect_http(url, token) as agent:
        for _ in range(20):  # each a name of the client's choosing
            result = await agent.client.call_tool(f"no-such-tool-{secrets.token_hex(6)}", {})
            assert result.is_error
        with pytest.raises(MCPError):
            await agent.client.get_prompt(f"no-such-prompt-{secrets.token_hex(6)}")
        await agent.quota("L1")
        await agent.client.get_prompt("loop-operator")


def test_span_names_stay_a_bounded_set_whatever_names_a_client_sends(tmp_path, collector):
    served = _serve(tmp_path, collector.start())
    try:
        token = mint_tokens(served.home, [("builder", "agent")])["builder"].token
        anyio.run(_calls, served.url, token)
    finally:
        stop_server(served)  # flushes the spans
    names = collector.span_names()
    assert not [n for n in names if "no-such" in n], sorted(set(names))
    assert names.count("tools/call (unknown)") == 20
    assert "prompts/get (unknown)" in names
    assert "tools/call quota" in names and "prompts/get loop-operator" in names


def test_otel_metrics_exporter_otlp_pushes_the_metrics(tmp_path, collector):
    served = _serve(
        tmp_path,
        collector.start(),
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRIC_EXPORT_INTERVAL="300",
    )
    try:
        token = mint_tokens(served.home, [("builder", "agent")])["builder"].token
        anyio.run(_calls, served.url, token)
        deadline = time.monotonic() + 30
        while not collector.points("loopwarden_decisions") and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop_server(served)
    decisions = collector.points("loopwarden_decisions")
    assert {"operation": "quota", "effect": "ok", "reason": "", "value": 1} in decisions, decisions
    assert collector.points("loopwarden_decision_seconds")
    assert collector.points("loopwarden_writer_queue_depth") is not None
    assert not collector.traces  # traces stay off: only what was asked for is pushed
