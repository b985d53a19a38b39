"""Approvals through the client (issue 25): URL-mode elicitation to the dashboard's page.

A real `serve --http --approval-webhook URL` and real SDK clients. A client that supports URL
mode is shown the approval's page (2026-07-28: `input_required`; 2025-11-25: `elicitation/create`
during the call); the operator signs in from that link and approves on the page; the agent's
next update, citing the approval, goes through. The agent's token cannot sign in there, a
client without URL mode gets today's answer, and the webhook receives the link.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestURLParams, ElicitResult
from support import (
    EVIDENCE,
    Served,
    Token,
    bounded,
    cli_open_loop,
    dashboard_url,
    make_policy,
    mint_tokens,
    start_server,
    stop_server,
)

from loopwarden.clients.agent import AgentClient

pytestmark = pytest.mark.anyio

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
POLICY = make_policy(agents=["builder"], tools={"allow": ["fs.*"], "approval": ["deploy.*"]})


class Hook(BaseHTTPRequestHandler):
    """A chat channel's incoming webhook: it keeps what it is sent."""

    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, webhook: str
) -> Iterator[tuple[Served, dict[str, Token]]]:
    root = tmp_path_factory.mktemp("elicit")
    server = start_server(root / "home", root / "logs", "--approval-webhook", webhook)
    try:
        yield server, mint_tokens(server.home, [("builder", "agent"), ("alice", "operator")])
    finally:
        stop_server(server)


def open_loop(home: Path, loop_id: str) -> None:
    cli_open_loop(home, loop_id, POLICY, ("deploy",))


def sdk_client(url: str, token: str, **options: Any) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), **options)


def recorder(shown: list[ElicitRequestURLParams]) -> Any:
    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams)
        shown.append(params)
        return ElicitResult(action="accept")  # the user agreed to open the page

    return on_elicit


async def ask(url: str, token: str, loop_id: str, **options: Any) -> tuple[Any, Any]:
    """Claim the loop's todo and request an approval for deploy.prod; (turn, result)."""
    async with sdk_client(url, token, **options) as raw:
        agent = AgentClient(raw)
        turn = await agent.claim(loop_id)
        assert turn.granted
        result = await agent.request_approval(turn.turn_id, turn.fence, "deploy.prod", "ship v2")
        return turn, result


def approve_on_the_page(served: Served, token: str, page: str) -> httpx2.Response:
    """What the operator does with the link: open it, sign in, approve on the page."""
    with httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30) as http:
        path = page.removeprefix(dashboard_url(served))
        to_login = http.get(path)
        assert to_login.status_code == 303
        login = http.get(to_login.headers["location"])
        form = {"token": token, "csrf": CSRF.search(login.text).group(1), "next": path}
        signed = http.post("/login", data=form)
        if signed.status_code != 303:
            return signed
        assert signed.headers["location"] == path  # back to the approval's page
        shown = http.get(path)
        assert "Approve" in shown.text and "deploy.prod" in shown.text
        decision = {
            "csrf": CSRF.search(shown.text).group(1),
            "back": path,
            "decision": "approve",
            "expires": "1h",
        }
        return http.post(f"{path}/decide", data=decision)


@bounded(90)
async def test_a_url_mode_client_gets_the_page_and_the_operators_approval_there_lets_the_update_through(
    served, webhook
):
    server, tokens = served
    open_loop(server.home, "ship")
    shown: list[ElicitRequestURLParams] = []
    turn, result = await ask(
        server.url, tokens["builder"].token, "ship", elicitation_callback=recorder(shown)
    )
    page = f"{dashboard_url(server)}/approvals/{result.approval_id}"
    assert [s.url for s in shown] == [page]
    assert (result.requested, result.status) == (True, "pending")
    refused = approve_on_the_page(server, tokens["builder"].token, page)  # the agent cannot
    assert refused.status_code == 403
    approved = approve_on_the_page(server, tokens["alice"].token, page)
    assert approved.status_code == 303
    async with sdk_client(server.url, tokens["builder"].token) as raw:
        agent = AgentClient(raw)
        state = await agent.projection("ship")
        decided = next(a for a in state.approvals if a.approval_id == result.approval_id)
        assert (decided.status, decided.decided_by) == ("approved", "alice")
        report = await agent.update(
            turn.turn_id, turn.fence, "completed", "deployed", "k1",
            tools_used=[{"name": "deploy.prod", "count": 1}], evidence=EVIDENCE,
            approval_ids=[result.approval_id],
        )  # fmt: skip
    assert report.accepted, report.reasons
    assert any(post["url"] == page and post["tool"] == "deploy.prod" for post in Hook.received)
    assert all("ship v2" not in json.dumps(post) for post in Hook.received)  # no summary


@bounded(90)
async def test_a_2025_client_with_url_mode_is_asked_during_the_call(served):
    server, tokens = served
    open_loop(server.home, "ship-legacy")
    shown: list[ElicitRequestURLParams] = []
    _, result = await ask(
        server.url,
        tokens["builder"].token,
        "ship-legacy",
        mode="legacy",
        elicitation_callback=recorder(shown),
    )
    assert [s.url for s in shown] == [f"{dashboard_url(server)}/approvals/{result.approval_id}"]
    assert result.status == "pending"


@bounded(90)
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_without_url_mode_gets_todays_answer(served, mode):
    server, tokens = served
    open_loop(server.home, f"plain-{mode}")
    _, result = await ask(server.url, tokens["builder"].token, f"plain-{mode}", mode=mode)
    assert (result.requested, result.status) == (True, "pending")
    assert result.approval_id.startswith("appr-")
