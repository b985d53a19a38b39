"""Traces and metrics of a real `loopwarden serve --http`: its spans are received by a real
OTLP/HTTP receiver on loopback (decoded with `opentelemetry-proto`), its `/metrics` scraped and
parsed with `prometheus_client`'s parser. A governed claim and update (and a host hook event
between them) must arrive as spans named after the operation, with the loop, agent, effect,
reason codes, receipt id and seq, under the caller's trace; never with the update's summary,
the command's text or a token. The server is stopped (SIGTERM) before the spans are read, so
its batch queue is flushed: no waiting on a timer.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx2
import pytest
from conftest import OPERATOR
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families
from support import (
    EVIDENCE,
    Served,
    cli_env,
    codes,
    connect_http,
    free_port,
    mint_tokens,
    raw_initialize,
    start_server,
    stop_server,
)
from test_hooks_live import POLICY, bash, event

from loopwarden.clients.admin import open_store
from loopwarden.errors import NotFound
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.observe import tracing_wanted
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, claim

LOOP = "watched"
POLICY_LEASE = 900  # seconds: the default lease of a policy that names none
SUMMARY = "summary-text-that-must-stay-home-7f3a"
COMMAND = "pytest -q --secret-flag-that-must-stay-home-91c2"
PUSH = "git push origin main-secret-branch-5d1e"  # denied by the policy's command rules
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLAIM_PARENT = "00f067aa0ba902b7"
HOOK_PARENT = "b7ad6b7169203331"
QUOTA_PARENT = "53995c3f42cd8ad8"  # sent as the /mcp request's traceparent header, not in _meta
TRACED_QUOTA = f"00-{TRACE_ID}-{QUOTA_PARENT}-01"


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every POST body kept raw and decoded."""

    bodies: list[bytes] = field(default_factory=list)
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)

    def spans(self) -> list[Any]:
        return [
            span
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def services(self) -> set[str]:
        return {
            attr.value.string_value
            for request in self.requests
            for resource in request.resource_spans
            for attr in resource.resource.attributes
            if attr.key == "service.name"
        }


def receiving(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            decoded = ExportTraceServiceRequest()
            decoded.ParseFromString(body)
            receiver.bodies.append(body)
            receiver.requests.append(decoded)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return http


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in span.attributes:
        value = attr.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[attr.key] = [v.string_value for v in value.array_value.values]
        else:
            out[attr.key] = getattr(value, kind)
    return out


def scrape(served: Served, token: str | None) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.get(served.url.removesuffix("/mcp") + "/metrics", headers=headers, timeout=30)


def decisions(text: str) -> dict[tuple[str, str, str], float]:
    """`loopwarden_decisions_total` by (operation, effect, reason)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "loopwarden_decisions_total":
                labels = sample.labels
                found[(labels["operation"], labels["effect"], labels["reason"])] = sample.value
    return found


def histogram_count(text: str, operation: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "loopwarden_decision_seconds_count" and labels["operation"] == operation:
                return sample.value
    return 0.0


def _open(home: Any) -> None:
    async def setup() -> None:
        async with open_store(home) as store:
            request = OpenLoopRequest(
                objective="watched loop",
                policy=POLICY,
                loop_id=LOOP,
                todos=[TodoInput(id="t1", title="todo 1")],
            )
            await open_loop(store, OPERATOR, request)

    anyio.run(setup)


async def _governed_turn(
    served: Served, agent: str, observer: str, operator: str
) -> dict[str, Any]:
    """A claim continuing the client's trace (`_meta`), a hook event continuing the host's
    (`traceparent` header), and the update; their results, and a scrape while the session
    is open."""
    hooks = served.url.removesuffix("/mcp") + f"/hooks/claude-code?loop={LOOP}"
    async with httpx2.AsyncClient(timeout=30) as http, connect_http(served.url, agent) as me:
        started = await http.post(  # the host attaches: the loop's policy asks for hooks
            hooks,
            json=event("SessionStart-startup"),
            headers={"Authorization": f"Bearer {observer}"},
        )
        assert started.status_code == 200, started.text
        claimed = await me.client.call_tool(
            "claim",
            {"loop_id": LOOP},
            meta={"traceparent": f"00-{TRACE_ID}-{CLAIM_PARENT}-01"},
        )
        turn = claimed.structured_content
        assert turn is not None and turn["granted"], claimed
        hook = await http.post(
            hooks,
            json=bash(COMMAND),
            headers={
                "Authorization": f"Bearer {observer}",
                "traceparent": f"00-{TRACE_ID}-{HOOK_PARENT}-01",
            },
        )
        assert hook.status_code == 200, hook.text
        refused = await http.post(
            hooks, json=bash(PUSH), headers={"Authorization": f"Bearer {observer}"}
        )
        assert "deny" in refused.text, refused.text
        update = await me.update(
            turn["turn_id"],
            turn["fence"],
            "completed",
            SUMMARY,
            "watched-update-1",
            evidence=EVIDENCE,
            tools_used=[{"name": "shell.run", "count": 1}],
        )
        traced = {"Authorization": f"Bearer {agent}", "traceparent": TRACED_QUOTA}
        async with (
            httpx2.AsyncClient(headers=traced, timeout=30) as plain,
            Client(streamable_http_client(served.url, http_client=plain)) as client,
        ):
            asked = await client.call_tool("quota", {"loop_id": LOOP})
            assert asked.structured_content is not None, asked
        opened = await raw_initialize(  # a 2025-11-25 session (2026-07-28 requests have none)
            served.url, "watcher", Authorization=f"Bearer {agent}"
        )
        assert opened.headers.get("mcp-session-id"), opened.text
        during = await http.get(
            served.url.removesuffix("/mcp") + "/metrics",
            headers={"Authorization": f"Bearer {operator}"},
        )
    return {"claim": turn, "update": update, "during": during}


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("observability")
    home = root / "home"
    _open(home)
    tokens = {
        **mint_tokens(home, [("builder", "agent"), ("alice", "operator")]),
        "observer": mint_tokens(home, [("builder", "observer")])["builder"],
    }
    receiver = Receiver()
    collector = receiving(receiver)
    env = cli_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_address[1]}",
        OTEL_SERVICE_NAME="loopwarden-under-test",
    )
    served = start_server(home, root / "logs", env=env)
    try:
        operator = tokens["alice"].token
        before = scrape(served, operator)
        refusals = {
            "none": scrape(served, None),
            "agent": scrape(served, tokens["builder"].token),
            "bogus": scrape(served, "lw_not-a-real-token"),
        }
        results = anyio.run(
            _governed_turn, served, tokens["builder"].token, tokens["observer"].token, operator
        )
        after = scrape(served, operator)
    finally:
        stop_server(served)  # SIGTERM: the batch queue is flushed on shutdown
        collector.shutdown()
    yield {
        "receiver": receiver,
        "tokens": tokens,
        "before": before,
        "after": after,
        "refusals": refusals,
        "results": results,
        "log": served.stderr(),
    }


def spans_named(watched: dict[str, Any], name: str) -> list[Any]:
    found = [s for s in watched["receiver"].spans() if s.name == name]
    names = sorted({s.name for s in watched["receiver"].spans()})
    assert found, f"no span {name!r} among {names}\n{watched['log']}"
    return found


def test_a_claim_and_an_update_export_spans_with_ids_effects_and_reason_codes(watched):
    claim = attributes(spans_named(watched, "loopwarden.claim")[0])
    turn = watched["results"]["claim"]
    assert claim["loopwarden.operation"] == "claim"
    assert (claim["loopwarden.agent"], claim["loopwarden.role"]) == ("builder", "agent")
    assert claim["loopwarden.loop_id"] == LOOP
    assert (claim["loopwarden.granted"], claim["loopwarden.decision.effect"]) == (True, "allow")
    assert claim["loopwarden.receipt_id"] == turn["receipt_id"]
    assert claim["loopwarden.decision.reasons"] == [r["code"] for r in turn["reasons"]]

    update = attributes(spans_named(watched, "loopwarden.update")[0])
    result = watched["results"]["update"]
    assert update["loopwarden.accepted"] is result.accepted
    assert update["loopwarden.decision.effect"] == ("allow" if result.accepted else "deny")
    assert (update["loopwarden.receipt_id"], update["loopwarden.seq"]) == (
        result.receipt_id,
        result.seq,
    )
    assert update["loopwarden.decision.reasons"] == [str(r.code) for r in result.reasons]
    assert watched["receiver"].services() == {"loopwarden-under-test"}  # OTEL_SERVICE_NAME


def test_the_store_write_is_a_child_span_of_each_write_operation(watched):
    (claim,) = spans_named(watched, "loopwarden.claim")
    writes = spans_named(watched, "loopwarden.store.write")
    (write,) = [s for s in writes if s.parent_span_id == claim.span_id]
    assert write.trace_id == claim.trace_id
    assert attributes(write) == {"db.system": "sqlite"}
    assert write.start_time_unix_nano >= claim.start_time_unix_nano
    assert write.end_time_unix_nano <= claim.end_time_unix_nano
    (update,) = spans_named(watched, "loopwarden.update")
    assert [s for s in writes if s.parent_span_id == update.span_id]


def test_the_claim_continues_the_clients_trace_from_the_request_meta(watched):
    (server,) = spans_named(watched, "tools/call claim")  # the MCP SDK's span, then ours
    (claim,) = spans_named(watched, "loopwarden.claim")
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == CLAIM_PARENT
    assert claim.trace_id.hex() == TRACE_ID and claim.parent_span_id == server.span_id


def test_a_call_continues_the_traceparent_header_of_its_mcp_request(watched):
    (server,) = spans_named(watched, "tools/call quota")  # no _meta: the HTTP header's trace
    (quota,) = spans_named(watched, "loopwarden.quota")
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == QUOTA_PARENT
    assert quota.trace_id.hex() == TRACE_ID and quota.parent_span_id == server.span_id


def test_a_hook_event_exports_its_phase_and_host_under_the_hosts_traceparent(watched):
    pre_tool = spans_named(watched, "loopwarden.hook.pre_tool")
    assert len(pre_tool) == 2  # the allowed command and the refused push
    (event,) = [s for s in pre_tool if s.trace_id.hex() == TRACE_ID]
    (decision,) = [
        s for s in spans_named(watched, "loopwarden.hook") if s.trace_id == event.trace_id
    ]
    assert spans_named(watched, "loopwarden.hook.session_start")
    seen = attributes(event)
    assert (seen["loopwarden.host"], seen["loopwarden.loop_id"]) == ("claude-code", LOOP)
    assert event.trace_id.hex() == TRACE_ID and event.parent_span_id.hex() == HOOK_PARENT
    assert decision.parent_span_id == event.span_id
    assert attributes(decision)["loopwarden.role"] == "observer"


def test_a_refused_hook_event_exports_its_deny_and_reason_codes_in_span_and_metrics(watched):
    refusals = [
        attributes(s)
        for s in spans_named(watched, "loopwarden.hook")
        if attributes(s)["loopwarden.decision.effect"] == "deny"
    ]
    assert len(refusals) == 1 and refusals[0]["loopwarden.decision.reasons"], refusals
    counted = decisions(watched["after"].text)
    for code in refusals[0]["loopwarden.decision.reasons"]:
        assert counted[("hook", "deny", code)] >= 1, counted


def test_no_summary_command_or_token_reaches_the_exported_bytes(watched):
    exported = b"".join(watched["receiver"].bodies)
    assert b"loopwarden.update" in exported  # the bytes searched are the spans
    secrets = [
        SUMMARY,
        COMMAND,
        "secret-flag",
        PUSH,
        "secret-branch",
        *(t.token for t in watched["tokens"].values()),
    ]
    for secret in secrets:
        assert secret.encode() not in exported, secret


def test_metrics_counters_and_the_latency_histogram_move_with_decisions(watched):
    before, after = watched["before"], watched["after"]
    assert before.status_code == 200 and after.status_code == 200
    assert after.headers["content-type"].startswith("text/plain")
    moved = decisions(after.text)
    for key, count in decisions(before.text).items():
        assert moved.get(key, 0) >= count
    granted = [k for k in moved if k[0] == "claim" and k[1] == "allow"]
    assert granted and all(moved[k] - decisions(before.text).get(k, 0) >= 1 for k in granted)
    result = watched["results"]["update"]
    effect = "allow" if result.accepted else "deny"
    assert any(k[:2] == ("update", effect) for k in moved), moved
    assert any(k[0] == "hook" for k in moved), moved
    assert histogram_count(after.text, "update") == histogram_count(before.text, "update") + 1
    assert not any(LOOP in key for key in moved), "a loop id is no label"


def test_a_metrics_scrape_without_an_operator_token_is_refused(watched):
    for who, response in watched["refusals"].items():
        assert response.status_code == 401, who
        assert "loopwarden_decisions" not in response.text, who


# --- in process: lease expiries, when tracing is on, and nothing loaded when it is off ----------


@pytest.mark.anyio
async def test_a_swept_lease_counts_one_expiry_and_each_decision_by_reason(store, clock):
    from loopwarden.observe.telemetry import Telemetry

    telemetry = Telemetry(tracing=False, metrics=True, version="test")
    store.observer = telemetry
    policy = {**POLICY, "observe": {"mode": "off"}}
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(objective="o", policy=policy, loop_id="E", todos=[TodoInput(title="a")]),
    )
    builder, reviewer = Principal(id="builder", role="agent"), Principal(id="rev", role="agent")
    assert (await claim(store, builder, ClaimRequest(loop_id="E"))).granted
    busy = await claim(store, builder, ClaimRequest(loop_id="E"))  # nothing left to claim
    clock.advance(POLICY_LEASE + 1)
    with pytest.raises(NotFound):  # an outsider: counted as an error by its code
        await claim(store, reviewer, ClaimRequest(loop_id="E"))
    again = await claim(store, builder, ClaimRequest(loop_id="E"))  # sweeps the lease first
    assert again.granted
    exposition = telemetry.metrics()
    assert exposition is not None
    text = exposition[0].decode()
    counted = decisions(text)
    assert counted[("claim", "allow", "")] == 2
    for code in codes(busy):
        assert counted[("claim", "deny", code)] == 1
    assert counted[("claim", "error", "not_found")] == 1
    assert _value(text, "loopwarden_lease_expiries_total") == 1
    assert histogram_count(text, "claim") == 4


def _value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no sample {name}")


@pytest.mark.parametrize(
    ("flag", "environ", "wanted"),
    [
        (False, {}, False),
        (True, {}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        (False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        (False, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        (True, {"OTEL_TRACES_EXPORTER": "none"}, False),
        (True, {"OTEL_SDK_DISABLED": "true"}, False),
        (False, {"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_on_with_the_flag_or_an_otel_exporter_and_off_when_disabled(
    flag, environ, wanted
):
    assert tracing_wanted(flag, environ) is wanted


def test_with_telemetry_off_a_hook_process_loads_neither_sdk(tmp_path):
    script = (
        "import sys\n"
        "import loopwarden.clients.hook_command, loopwarden.hosts.handle\n"
        "from loopwarden.observe import NOBODY, watching\n"
        "assert watching(tracing=False, metrics=False, version='x') is NOBODY\n"
        "loaded = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'prometheus'))]\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_collector_that_is_down_changes_no_decision(tmp_path):
    """Export runs beside the decisions: with nothing listening at the OTLP endpoint, a claim
    is answered as it would be, and the server still stops cleanly when told (its last flush
    bounded by the standard `OTEL_EXPORTER_OTLP_TIMEOUT`)."""
    home = tmp_path / "home"
    _open(home)
    tokens = mint_tokens(home, [("builder", "agent")])
    env = cli_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        OTEL_EXPORTER_OTLP_TIMEOUT="2",
    )
    served = start_server(home, tmp_path / "logs", "--otel", env=env)
    try:

        async def claim_one() -> dict[str, Any]:
            async with connect_http(served.url, tokens["builder"].token) as me:
                # the loop asks for hooks: a claim is refused until a host attaches
                result = await me.client.call_tool("claim", {"loop_id": LOOP})
                assert result.structured_content is not None
                return result.structured_content

        answer = anyio.run(claim_one)
    finally:
        stop_server(served)
    assert answer["loop_id"] == LOOP and [r["code"] for r in answer["reasons"]] == [
        "host_not_attached"
    ]
    # uvicorn ends a graceful stop by re-raising SIGTERM; a hung flush would have been SIGKILLed
    assert served.process.returncode == -signal.SIGTERM, served.stderr()


def test_store_writes_are_timed_by_operation_and_open_sessions_counted(watched):
    during = {f.name: f for f in text_string_to_metric_families(watched["results"]["during"].text)}
    (sessions,) = during["loopwarden_mcp_sessions"].samples
    assert sessions.value >= 1  # the 2025-11-25 session, open while it scraped
    writes = {
        s.labels["operation"]: s.value
        for s in during["loopwarden_store_write_seconds"].samples
        if s.name == "loopwarden_store_write_seconds_count"
    }
    assert writes.get("claim", 0) >= 1 and writes.get("update", 0) >= 1
    assert writes.get("hook", 0) >= 2  # the session start and the admitted command at least


def test_the_writer_queue_depth_is_a_gauge_of_every_scrape(watched):
    families = {f.name: f for f in text_string_to_metric_families(watched["after"].text)}
    (sample,) = families["loopwarden_writer_queue_depth"].samples
    assert sample.value >= 0


def test_spans_dropped_by_a_full_queue_or_refused_by_the_collector_are_counted(monkeypatch):
    """The export thread is held inside a collector call: the queue fills and the rest drop;
    then the collector refuses what it is given. Both are counted, by reason."""
    import threading as threads

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from loopwarden.observe.telemetry import CountingProcessor

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    release, entered = threads.Event(), threads.Event()

    class Stuck(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            entered.set()
            release.wait(30)
            return SpanExportResult.FAILURE

    dropped: dict[str, int] = {}
    provider = TracerProvider()
    provider.add_span_processor(
        CountingProcessor(Stuck(), lambda why, n: dropped.__setitem__(why, dropped.get(why, 0) + n))
    )
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("first"):
        pass
    assert entered.wait(30)  # the export thread is inside the collector call
    for i in range(20):
        with tracer.start_as_current_span(f"span-{i}"):
            pass
    assert dropped["queue_full"] >= 20 - 4
    release.set()
    provider.shutdown()
    assert dropped["export_failed"] >= 1


def test_the_grafana_dashboard_queries_only_metrics_the_server_exposes():
    import json
    import re
    from pathlib import Path

    from loopwarden.observe.telemetry import Telemetry

    telemetry = Telemetry(tracing=False, metrics=True, version="test")
    telemetry.gauge("writer_queue_depth", "queued writes", lambda: 0)
    telemetry.exported("webhook", sent=1, failed=1, takeovers=1, lag=0)
    telemetry._dropped("queue_full", 1)
    exposition = telemetry.metrics()
    assert exposition is not None
    exposed = {
        sample.name
        for family in text_string_to_metric_families(exposition[0].decode())
        for sample in family.samples
    } | {"loopwarden_decisions_total", "loopwarden_decision_seconds_bucket"}
    dashboard = json.loads(
        (Path(__file__).parent.parent / "examples" / "grafana-dashboard.json").read_text()
    )
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"loopwarden_\w+", target["expr"])
    }
    assert queried and queried <= exposed, queried - exposed
