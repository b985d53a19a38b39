"""The operator dashboard over plain HTTP (no browser): its security rules against a real
`loopwarden serve --http` and a real `loopwarden dashboard`, and the pieces its pages are built
from (the loop history, charts, sessions, the loop list's attention) on real stores.

The browser tests (`test_dashboard_browser.py`) drive the same pages in Chromium.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR
from support import (
    EVIDENCE,
    LEAKS,
    STARTUP_TIMEOUT,
    Served,
    Token,
    cli,
    cli_env,
    connect_http,
    dashboard_url,
    loopwarden,
    make_policy,
    mint_tokens,
    run_cli_app,
    running,
)

from loopwarden.approvals.approval_ops import request_approval
from loopwarden.clock import ManualClock, format_time
from loopwarden.dashboard.charts import MAX_POINTS, budget_chart
from loopwarden.dashboard.history import Histories, LoopHistory
from loopwarden.dashboard.operator_sessions import IDLE, Sessions
from loopwarden.dashboard.views import (
    FRESH,
    OPEN_TURNS,
    RECENT_RECEIPTS,
    by_attention,
    fresh_refusals,
    loop_pools,
)
from loopwarden.journal.listing import ReceiptLine
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import cancel_loop, open_loop, pause_loop
from loopwarden.policy.model import LoopPolicy
from loopwarden.pools.pool_ops import pool_define, pools
from loopwarden.projection.loop_list import list_loops
from loopwarden.projection.projection import projection
from loopwarden.turns.claim import claim
from loopwarden.turns.update import update

pytestmark = pytest.mark.anyio
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


# --- a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with running(tmp_path_factory.mktemp("dash-http")) as served:
        yield served


@pytest.fixture(scope="module")
def tokens(server: Served) -> dict[str, Token]:
    specs = [("alice", "operator"), ("bob", "operator"), ("builder", "agent")]
    return mint_tokens(server.home, specs)


def sign_in(http: httpx2.Client, token: str) -> httpx2.Response:
    """The login form as a browser submits it: its CSRF nonce from the page and the cookie."""
    form = http.get("/login")
    nonce = CSRF_FIELD.search(form.text)
    assert nonce, form.text
    return http.post("/login", data={"token": token, "csrf": nonce.group(1)})


def page_csrf(http: httpx2.Client, path: str = "/") -> str:
    found = CSRF_FIELD.search(http.get(path).text)
    assert found
    return found.group(1)


def client(served: Served) -> httpx2.Client:
    return httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30)


def test_every_page_needs_a_session_and_every_response_carries_the_strict_csp(server):
    with client(server) as http:
        for path in ("/", "/loops/x", "/pools", "/approvals", "/audit", "/receipts/rcpt-0"):
            answer = http.get(path)
            assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        for answer in (http.get("/login"), http.get("/nope"), http.get("/static/htmx.min.js")):
            csp = answer.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert "unsafe-inline" not in csp and answer.headers["x-frame-options"] == "DENY"
        assert http.post("/audit", data={"csrf": "x"}).status_code == 403  # no session


def test_an_operator_signs_in_with_an_httponly_samesite_strict_session_cookie(server, tokens):
    with client(server) as http:
        answer = sign_in(http, tokens["alice"].token)
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        cookie = next(c for c in answer.headers.get_list("set-cookie") if "lw_session=" in c)
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        home = http.get("/")
        assert home.status_code == 200 and "operator <strong>alice</strong>" in home.text


def test_agent_and_unknown_tokens_are_refused_and_open_no_session(server, tokens):
    with client(server) as http:
        agent = sign_in(http, tokens["builder"].token)
        assert agent.status_code == 403 and "This is an agent token" in agent.text
        for wrong in ("lw_" + "x" * 43, "not-a-token", "lw_" + "y" * 300):
            assert sign_in(http, wrong).status_code == 401
        assert "lw_session" not in http.cookies
        assert http.get("/").status_code == 303


def test_the_login_form_refuses_a_post_without_its_own_csrf_nonce(server, tokens):
    with client(server) as http:
        http.get("/login")
        answer = http.post("/login", data={"token": tokens["alice"].token, "csrf": "guess"})
        assert answer.status_code == 403 and "lw_session" not in http.cookies


def test_a_revoked_operator_token_ends_its_session_on_the_next_request(server, tokens):
    minted = mint_tokens(server.home, [("carol", "operator")])["carol"]
    with client(server) as http:
        assert sign_in(http, minted.token).status_code == 303
        assert http.get("/").status_code == 200
        done = cli("token", "revoke", minted.token_id, "--home", str(server.home))
        assert done.returncode == 0, done.stderr
        answer = http.get("/")
        assert answer.status_code == 303 and answer.headers["location"] == "/login?why=revoked"
        poll = http.get("/?since=0", headers={"HX-Request": "true"})
        assert poll.headers["hx-redirect"].startswith("/login")
        assert "revoked" in http.get("/login?why=revoked").text


def test_a_foreign_host_gets_421_and_a_foreign_origin_403_as_on_mcp(server, tokens):
    with client(server) as http:
        assert http.get("/login", headers={"Host": "evil.example:80"}).status_code == 421
        sign_in(http, tokens["alice"].token)
        csrf = page_csrf(http)
        forged = http.post("/audit", data={"csrf": csrf}, headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403
        json_post = http.post("/audit", content=b"{}", headers={"Content-Type": "application/json"})
        assert json_post.status_code == 415


def test_a_post_without_the_sessions_csrf_token_is_refused_and_pauses_nothing(server, tokens):
    open_by_cli(server, "csrf-http")
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        for data in ({"action": "pause"}, {"action": "pause", "csrf": "forged"}):
            refused = http.post("/loops/csrf-http/control", data=data)
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert "status-active" in http.get("/loops/csrf-http").text
        with client(server) as other:  # another operator's token is no use in this session
            sign_in(other, tokens["bob"].token)
            stolen = other.post(
                "/loops/csrf-http/control", data={"action": "pause", "csrf": page_csrf(http)}
            )
            assert stolen.status_code == 403
        paused = http.post(
            "/loops/csrf-http/control", data={"action": "pause", "csrf": page_csrf(http)}
        )
        assert paused.status_code == 303 and "status-paused" in http.get("/loops/csrf-http").text


def test_an_operator_cancels_a_todo_from_the_board_once_confirmed(server, tokens):
    open_by_cli(server, "cancel-http")
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        page = http.get("/loops/cancel-http").text
        assert 'action="/loops/cancel-http/todos/t1/cancel"' in page
        unconfirmed = {"csrf": page_csrf(http), "reason": "out of scope"}
        assert http.post("/loops/cancel-http/todos/t1/cancel", data=unconfirmed).status_code == 303
        assert "status-active" in http.get("/loops/cancel-http").text, "nothing without confirm"
        confirmed = {**unconfirmed, "csrf": page_csrf(http), "confirm": "yes"}
        done = http.post("/loops/cancel-http/todos/t1/cancel", data=confirmed)
        assert done.status_code == 303
        page = http.get("/loops/cancel-http").text
        assert "status-completed" in page, "the only owed todo is cancelled: the loop completes"
        assert "/todos/t1/cancel" not in page
    again = cli("loop", "cancel-todo", "cancel-http", "t1", "--home", str(server.home))
    assert again.returncode != 0 and "completed" in again.stderr


async def test_a_live_poll_is_204_until_the_journal_moves_then_gets_the_live_region(server, tokens):
    open_by_cli(server, "polled")
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        page = http.get("/loops/polled").text
        version = re.search(r'data-version="(\d+)"', page)
        assert version and version.group(1) == "1"
        assert http.get("/loops/polled?since=1", headers={"HX-Request": "true"}).status_code == 204
        async with connect_http(server.url, tokens["builder"].token) as agent:
            assert (await agent.claim("polled")).granted
        moved = http.get("/loops/polled?since=1", headers={"HX-Request": "true"})
        assert moved.status_code == 200 and "<html" not in moved.text
        assert 'data-version="2"' in moved.text and "turn.claimed" in moved.text


# --- budget pools ----------------------------------------------------------------------------


def pool_by_cli(served: Served, name: str, *limits: str) -> None:
    done = cli("pool", "create", name, *limits, "--home", str(served.home))
    assert done.returncode == 0, done.stderr


def open_in_pool(served: Served, loop_id: str, pool: str) -> None:
    policy = served.home.parent / f"{loop_id}.json"
    policy.write_text(json.dumps(make_policy(pools=[pool])))
    done = cli(
        "loop", "open", "--policy", str(policy), "--objective", "o", "--todo", "a", "--todo", "b",
        "--id", loop_id, "--home", str(served.home),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def pool_panel(page: str, name: str) -> str:
    found = re.search(rf'<section class="panel pool[^"]*" data-pool="{re.escape(name)}">(.*?)</section>', page, re.S)  # fmt: skip
    assert found, page
    return found.group(1)


async def test_the_pools_page_shows_a_pools_usage_open_turns_and_the_loops_drawing_from_it(
    server, tokens
):
    pool_by_cli(server, "page-pool", "--max-turns", "2", "--max-cost-usd", "1", "--max-concurrent-turns", "3")  # fmt: skip
    open_in_pool(server, "pooled-http", "page-pool")
    async with connect_http(server.url, tokens["builder"].token) as agent:
        first = await agent.claim("pooled-http")
        assert first.granted, first.reasons
        done = await agent.update(
            first.turn_id, first.fence, "completed", "s", "pp-1", usage={"cost_usd": 0.25},
            evidence=EVIDENCE,
        )  # fmt: skip
        assert done.accepted, done.reasons
        assert (await agent.claim("pooled-http")).granted  # open: 2 of 2 turns, 1 of 3 at once
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        page = http.get("/pools")
        assert page.status_code == 200 and 'href="/pools" aria-current="page"' in page.text
        panel = pool_panel(page.text, "page-pool")
        assert "status-active" in panel and "window <strong>total</strong>" in panel
        assert "turns</span>" in panel and "2 / 2" in panel and "m-exhausted" in panel
        assert "0.25 / 1" in panel and f"{OPEN_TURNS}</span>" in panel and "1 / 3" in panel
        assert "Spent: turns" in panel and "pool_exhausted" in panel
        assert '<a href="/loops/pooled-http">pooled-http</a>' in panel
        assert 'action="/pools/page-pool/control"' in panel and 'value="pause"' in panel
        loop_page = http.get("/loops/pooled-http").text
        drawn = loop_page[loop_page.index('id="loop-pools"') :]
        assert 'data-pool="page-pool"' in drawn and "spent: turns" in drawn.split("</section>")[0]


def test_pausing_a_pool_from_its_page_needs_the_sessions_csrf_token(server, tokens):
    pool_by_cli(server, "pause-pool", "--max-turns", "5")
    target = "/pools/pause-pool/control"
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        for data in ({"action": "pause"}, {"action": "pause", "csrf": "forged"}):
            refused = http.post(target, data=data)
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert "status-active" in pool_panel(http.get("/pools").text, "pause-pool")
        form = {"action": "pause", "reason": "incident", "csrf": page_csrf(http, "/pools")}
        paused = http.post(target, data=form)
        assert paused.status_code == 303 and paused.headers["location"] == "/pools"
        page = http.get("/pools").text
        assert "Pool pause-pool is paused (receipt rcpt-" in page
        assert "status-paused" in pool_panel(page, "pause-pool")
        again = http.post(target, data={**form, "csrf": page_csrf(http, "/pools")})
        assert again.status_code == 303
        page = http.get("/pools").text
        assert "Pool pause-pool was not changed: cannot pause pool" in page
        assert "status-paused" in pool_panel(page, "pause-pool")
        assert 'value="resume"' in pool_panel(page, "pause-pool")
    shown = json.loads(
        cli("pool", "show", "pause-pool", "--json", "--home", str(server.home)).stdout
    )
    assert shown["status"] == "paused"


def test_only_a_signed_in_operator_reaches_the_pools_page_or_its_controls(server, tokens):
    pool_by_cli(server, "guarded-pool", "--max-turns", "5")
    with client(server) as http:
        assert sign_in(http, tokens["builder"].token).status_code == 403  # an agent's token
        answer = http.get("/pools")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        refused = http.post("/pools/guarded-pool/control", data={"action": "pause", "csrf": "x"})
        assert refused.status_code == 403
        sign_in(http, tokens["alice"].token)
        for name, status in (("Bad%20Name", 400), ("no-such-pool", 404)):
            form = {"action": "pause", "csrf": page_csrf(http, "/pools")}
            assert http.post(f"/pools/{name}/control", data=form).status_code == status
    shown = json.loads(
        cli("pool", "show", "guarded-pool", "--json", "--home", str(server.home)).stdout
    )
    assert shown["status"] == "active"


def test_unknown_ids_are_clean_error_pages_without_internals(server, tokens):
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        for path, status in (
            ("/loops/no-such-loop", 404),
            ("/loops/bad%20id", 400),
            ("/receipts/rcpt-000000000000000000000000", 404),
            ("/receipts/nope", 400),
            ("/?status=sideways", 400),
            ("/loops/x/y/z", 404),
        ):
            answer = http.get(path)
            assert answer.status_code == status, (path, answer.text)
            assert not LEAKS.search(answer.text.replace("/loops", "").replace("/static", ""))


def open_by_cli(served: Served, loop_id: str) -> None:
    policy = served.home.parent / f"{loop_id}.json"
    policy.write_text(json.dumps(make_policy()))
    done = cli(
        "loop", "open", "--policy", str(policy), "--objective", "o", "--todo", "t",
        "--id", loop_id, "--home", str(served.home),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


# --- `loopwarden dashboard` ------------------------------------------------------------------


def test_the_dashboard_command_serves_a_local_store_on_loopback_and_prints_its_url(tmp_path):
    home = tmp_path / "home"
    minted = mint_tokens(home, [("alice", "operator"), ("builder", "agent")])
    process = subprocess.Popen(
        loopwarden("dashboard", "--port", "0", "--home", str(home)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=cli_env(),
    )  # fmt: skip
    try:
        line = read_line(process)
        found = re.fullmatch(r"loopwarden dashboard on (http://127\.0\.0\.1:\d+/)", line)
        assert found, line
        with httpx2.Client(base_url=found.group(1), timeout=30) as http:
            wait_ready(http)
            assert sign_in(http, minted["builder"].token).status_code == 403
            assert sign_in(http, minted["alice"].token).status_code == 303
            assert "Loops" in http.get("/").text
            assert http.get("/", headers={"Host": "lw.example:1"}).status_code == 421
    finally:
        process.terminate()
        process.wait(timeout=10)


def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line:
        raise AssertionError(
            f"no URL printed; stderr: {process.stderr.read() if process.stderr else ''}"
        )
    return line


def wait_ready(http: httpx2.Client) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        try:
            http.get("/login")
            return
        except httpx2.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_dashboard_command_refuses_a_port_in_use_with_exit_1_as_serve_does(tmp_path):
    import socket

    home = tmp_path / "home"
    assert run_cli_app("token", "create", "--agent", "ops", "--home", str(home)).exit_code == 0

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("dashboard", "--port", str(port), "--home", str(home))
    assert done.returncode == 1, done.stderr
    assert f"address in use: 127.0.0.1:{port}" in done.stderr


def test_the_dashboard_command_creates_no_home(tmp_path):
    done = cli("dashboard", "--port", "0", "--home", str(tmp_path / "typo"))
    assert done.returncode == 1 and "there is no loopwarden database" in done.stderr
    assert not (tmp_path / "typo").exists()


def test_the_cli_still_starts_without_the_web_stack():
    code = (
        "import sys; from loopwarden.cli.root import app; "
        "print(sorted(m for m in ('mcp', 'starlette', 'jinja2', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# --- the pieces, on a real store -------------------------------------------------------------


async def opened(store, loop_id: str = "hist", **sections) -> None:
    policy = make_policy(**sections)
    request = {"objective": "o", "policy": policy, "loop_id": loop_id,
               "todos": [{"title": "a"}, {"title": "b"}, {"title": "c"}]}  # fmt: skip
    await open_loop(store, OPERATOR, request)


async def report(store, grant, key: str, **fields):
    request = {"turn_id": grant.turn_id, "fence": grant.fence, "idempotency_key": key,
               "outcome": "completed", "summary": "s", "evidence": EVIDENCE, **fields}  # fmt: skip
    return await update(store, BUILDER, request)


async def test_budget_history_from_the_receipts_sums_to_the_stored_totals(store, clock):
    await opened(store)
    usage = {"model_calls": 2, "input_tokens": 100, "cost_usd": 0.25, "wall_seconds": 1.5}
    first = await claim(store, BUILDER, {"loop_id": "hist"})
    await report(store, first, "k1", usage=usage)
    clock.advance(30)
    second = await claim(store, BUILDER, {"loop_id": "hist"})
    refused = await report(store, second, "k2", usage=usage, evidence=[])  # charged, stays open
    assert not refused.accepted
    await report(store, second, "k3", usage=usage, tools_used=[{"name": "fs.write", "count": 4}])
    state = await projection(store, OPERATOR, {"loop_id": "hist"})
    history = await Histories().get(store, OPERATOR, "hist", state.head.seq)
    for dim, line in state.budgets.items():
        assert history.totals.used(dim) == pytest.approx(line.used), dim
    assert [value for _, _, value in history.series["cost_usd"]] == [0.0, 0.25, 0.5, 0.75]
    assert history.turns[second.turn_id].reported == {"fs.write": 4}
    assert [line.seq for line in history.lines] == list(range(1, state.head.seq + 1))


async def test_the_history_chart_ends_at_the_stored_totals_after_expiries_closes_and_hooks(
    store, clock
):
    """Every way a receipt charges a budget is the fold's: calls a host observed in a turn whose
    lease then expired, a call observed outside any turn, a turn closed by its loop's cancel.
    The history folds the same typed receipts, so each chart ends at the stored totals."""
    from test_hooks import fixture

    from loopwarden.hosts.handle import handle

    async def hook(event: dict) -> None:
        await handle(store, "claude-code", json.dumps(event).encode(), loop_id="hist",
                     agent="builder", servers=["loopwarden"])  # fmt: skip

    await opened(store, tools={"allow": ["fs.*", "shell.run"]}, observe={"mode": "record"},
                 budgets={"max_tool_calls": 50}, claims={"lease_seconds": 60})  # fmt: skip
    await hook(fixture("claude-code", "SessionStart-startup"))
    await claim(store, BUILDER, {"loop_id": "hist"})
    for _ in range(2):
        await hook(fixture("claude-code", "PreToolUse-bash"))
        await hook(fixture("claude-code", "PostToolUse-bash"))
    clock.advance(120)  # its lease runs out; the next claim sweeps it, charging what ran
    closing = await claim(store, BUILDER, {"loop_id": "hist"})
    assert closing.granted, closing.reasons
    await hook(fixture("claude-code", "PostToolUse-write"))  # in the open turn
    await cancel_loop(store, OPERATOR, {"loop_id": "hist", "reason": "done"})  # closes it
    await hook(fixture("claude-code", "PostToolUse-bash"))  # outside any turn: charged alone
    state = await projection(store, OPERATOR, {"loop_id": "hist"})
    history = await Histories().get(store, OPERATOR, "hist", state.head.seq)
    assert history.unreadable == 0
    stored = await store.read(lambda r: r.loop_row("hist"))
    assert history.totals == stored.totals
    kind_at = {line.seq: line.kind for line in history.lines}
    moved = {kind_at[seq] for _, seq, _ in history.series["tool_calls"]}
    assert {"lease.expired", "loop.cancelled"} <= moved, moved  # charged when they sealed
    for dim, line in state.budgets.items():
        points = history.series.get(dim, [])
        assert points and points[-1][2] == pytest.approx(line.used), dim


async def test_a_history_reads_only_the_receipts_after_its_cached_head(store):
    await opened(store)
    histories = Histories()
    first = await histories.get(store, OPERATOR, "hist", 1)
    grant = await claim(store, BUILDER, {"loop_id": "hist"})
    again = await histories.get(store, OPERATOR, "hist", 2)
    assert again is first and [line.kind for line in again.lines] == ["loop.opened", "turn.claimed"]
    assert again.turns[grant.turn_id].agent == "builder"


def _body(seq: int, kind: str, turn_id: str | None, data: dict, *reasons: str) -> dict:
    """A receipt body of `kind` as signed (typed, valid for its kind), in a made-up chain."""
    role = "observer" if kind.startswith(("tool.", "host.")) else "agent"
    return KINDS.make_body(
        kind, loop_id="x", seq=seq, at=ManualClock()(), turn_id=turn_id,
        principal={"id": "builder", "role": role}, policy_digest="sha256:" + "0" * 64,
        decision={"effect": "deny" if reasons else "allow",
                  "reasons": [{"code": r, "message": f"why {r}"} for r in reasons]},
        prev=None if seq == 1 else "sha256:" + f"{seq:064x}", data=data,
    ).as_json()  # fmt: skip


def _line(seq: int, kind: str, turn_id: str | None, *reasons: str) -> ReceiptLine:
    return ReceiptLine(seq=seq, receipt_id=f"rcpt-{seq:024d}", kind=kind,
                       at=format_time(ManualClock()()), principal="builder",
                       effect="deny" if reasons else "allow", reasons=list(reasons),
                       messages=[f"why {r}" for r in reasons], turn_id=turn_id,
                       digest="sha256:" + f"{seq + 1:064x}", verified=True)  # fmt: skip


def test_host_receipts_are_counted_per_tool_and_unmodelled_kinds_by_kind_for_their_turn():
    """What a host's hooks recorded is shown by tool (policy name and the host's own), how often
    let through, blocked (and why) and run; a kind this version does not know is still counted
    for its turn."""
    turn = "turn-" + "a" * 20
    history = LoopHistory("x")
    call = {"host": "claude-code", "session_id": "s1", "host_tool": "Bash", "tool": "shell.run",
            "input_digest": "sha256:" + "1" * 64}  # fmt: skip
    ran = {key: call[key] for key in ("host", "session_id", "host_tool", "tool")}
    ran["response_digest"] = "sha256:" + "2" * 64
    receipts = [
        (1, "loop.opened", None, {"objective": "o", "policy": BASIC_POLICY, "todos": []}, ()),
        (2, "turn.claimed", turn, {"turn_id": turn, "todo_id": "t1", "fence": 1,
                                   "lease_expires_at": ManualClock()(), "allowed_tools": [],
                                   "approval_tools": []}, ()),
        (3, "tool.admitted", turn, call, ()),
        (4, "tool.observed", turn, {**ran, "errored": True}, ()),
        (5, "tool.refused", turn, {**call, "enforced": True}, ("command_denied",)),
        (6, "x.future", turn, {"shape": ["?"]}, ()),
        (7, "tool.observed", turn, ran, ()),
        (8, "host.attached", None, {"host": "claude-code", "session_id": "s1"}, ()),
    ]  # fmt: skip
    bodies = []
    for seq, kind, turn_id, data, reasons in receipts:
        if kind == "x.future":  # a kind this version does not know: signed, unread
            bodies.append({"kind": kind, "seq": seq, "data": data})
        else:
            bodies.append(_body(seq, kind, turn_id, data, *reasons))
    history.extend(KINDS, [_line(s, k, t, *r) for s, k, t, _, r in receipts], bodies)
    tools = history.turns[turn]
    use = tools.host[("shell.run", "Bash")]
    assert (use.admitted, use.ran, use.errored, use.refused) == (1, 2, 1, 1)
    assert use.refusals == {"command_denied": 1}
    assert tools.other == {"x.future": 1} and tools.todo_id == "t1" and history.head == 8
    assert history.lines[4].subject == "shell.run (Bash)"
    with pytest.raises(ValueError):
        history.extend(KINDS, [_line(10, "tool.observed", turn)], [{}])  # a gap is refused


def test_every_report_of_a_turn_is_kept_with_its_verdict_in_order():
    """A turn refused for a denied tool, then reported again and refused as turn_closed, shows
    both reports (the later one used to replace the one that caused the refusal)."""
    turn = "turn-" + "b" * 20
    history = LoopHistory("x")
    report = {"turn_id": turn, "todo_id": "t1", "fence": 1, "summary": "s", "charged": False,
              "closes_turn": False}  # fmt: skip
    receipts = [
        (2, "turn.claimed", {"turn_id": turn, "todo_id": "t1", "fence": 1,
                             "lease_expires_at": ManualClock()(), "allowed_tools": [],
                             "approval_tools": []}, ()),
        (3, "turn.refused", {**report, "outcome": "completed",
                             "tools_used": [{"name": "fs.write"}, {"name": "git.push"}]},
         ("tool_denied",)),
        (4, "turn.refused", {**report, "outcome": "failed",
                             "tools_used": [{"name": "tests.run", "count": 1}]},
         ("turn_closed",)),
    ]  # fmt: skip
    history.head = 1  # its loop.opened read before
    history.extend(
        KINDS,
        [_line(s, k, turn, *r) for s, k, _, r in receipts],
        [_body(s, k, turn, d, *r) for s, k, d, r in receipts],
    )
    reports = history.turns[turn].reports
    assert [(r.seq, r.outcome, r.tools, r.reasons) for r in reports] == [
        (3, "completed", (("fs.write", 1), ("git.push", 1)), ("tool_denied",)),
        (4, "failed", (("tests.run", 1),), ("turn_closed",)),
    ]
    assert history.lines[1].subject == "fs.write×1, git.push×1"
    assert history.lines[1].explained == [("tool_denied", "why tool_denied")]


def test_a_long_budget_history_is_thinned_for_the_chart_and_keeps_its_last_point():
    start = ManualClock()
    points = [(start.advance(1), i, float(i)) for i in range(1, 10_001)]
    chart = budget_chart("turns", points, 20_000.0, start())
    assert chart is not None and chart.steps == 9_999 and chart.used == 10_000.0
    assert chart.path.count("H") == MAX_POINTS and not chart.exhausted
    assert budget_chart("turns", [], None, start()) is None


def test_a_session_ends_after_its_idle_time():
    clock = ManualClock()
    sessions = Sessions(clock)
    made = sessions.create("hash", OPERATOR)
    clock.advance(IDLE.total_seconds() - 1)
    assert sessions.get(made.session_id) is made
    clock.advance(IDLE.total_seconds() + 1)
    assert sessions.get(made.session_id) is None and len(sessions) == 0
    assert sessions.get("") is None and sessions.get("guess") is None


async def test_the_loop_list_says_who_must_act_and_counts_pending_approvals(store):
    await opened(store, "listed")
    grant = await claim(store, BUILDER, {"loop_id": "listed"})
    request = {"turn_id": grant.turn_id, "fence": grant.fence, "tool": "deploy.x", "summary": "s"}
    assert (await request_approval(store, BUILDER, request)).requested
    (line,) = (await list_loops(store, OPERATOR, {})).loops
    assert (line.attention.who, line.pending_approvals, line.open_turns) == ("human", 1, 1)
    assert line.budgets["turns"].used == 1 and line.updated_at >= line.opened_at


async def test_the_loops_page_order_puts_a_humans_loops_first_and_fresh_refusals_flagged(
    store, clock
):
    """Sorted by who must act (an operator, then an agent, then no one), fresh refusals first
    within each; a refusal older than the fresh window is not flagged."""
    for loop_id in ("quiet", "refusing", "asking", "stale"):
        await opened(store, loop_id)
    asked = await claim(store, BUILDER, {"loop_id": "asking"})
    request = {"turn_id": asked.turn_id, "fence": asked.fence, "tool": "deploy.x", "summary": "s"}
    assert (await request_approval(store, BUILDER, request)).requested
    old = await claim(store, BUILDER, {"loop_id": "stale"})
    assert not (await report(store, old, "s-1", evidence=[])).accepted
    clock.advance(FRESH.total_seconds() + 1)
    turn = await claim(store, BUILDER, {"loop_id": "refusing"})
    assert not (await report(store, turn, "r-1", evidence=[])).accepted
    listed = (await list_loops(store, OPERATOR, {})).loops
    fresh = await store.read(
        lambda r: {
            lp.loop_id: seen
            for lp in listed
            if (seen := fresh_refusals(r.recent_receipts(lp.loop_id, RECENT_RECEIPTS), clock()))
        }
    )
    assert set(fresh) == {"refusing"} and fresh["refusing"].count == 1
    ordered = [lp.loop_id for lp in by_attention(listed, fresh)]
    assert ordered[0] == "asking" and ordered[1] == "refusing", ordered


async def test_a_paused_loop_asks_the_operator_to_resume_it_before_any_approval(store):
    await opened(store, "held")
    grant = await claim(store, BUILDER, {"loop_id": "held"})
    request = {"turn_id": grant.turn_id, "fence": grant.fence, "tool": "deploy.x", "summary": "s"}
    assert (await request_approval(store, BUILDER, request)).requested
    await pause_loop(store, OPERATOR, {"loop_id": "held", "reason": "freeze"})
    state = await projection(store, OPERATOR, {"loop_id": "held"})
    assert (state.attention.who, state.attention.why) == ("human", "the loop is paused")
    assert state.next_action == "operator: resume the loop (and 1 approval awaits a decision)"
    history = await Histories().get(store, OPERATOR, "held", state.head.seq)
    assert history.control is not None
    assert (history.control.kind, history.control.reason) == ("loop.paused", "freeze")


async def test_a_loop_page_lists_the_pools_its_policy_names_and_those_its_agents_bind(store):
    await pool_define(store, OPERATOR, {"name": "named", "policy": {"budgets": {"max_turns": 4}}})
    bound = {"budgets": {"max_cost_usd": 2.0}, "agents": ["builder"]}
    await pool_define(store, OPERATOR, {"name": "bound", "policy": bound})
    other = {"max_concurrent_turns": 2, "agents": ["someone-else"]}
    await pool_define(store, OPERATOR, {"name": "other", "policy": other})
    await opened(store, "drawing", pools=["named"])
    grant = await claim(store, BUILDER, {"loop_id": "drawing"})
    await report(store, grant, "d-1", usage={"cost_usd": 2.0})
    listed = (await pools(store, OPERATOR, {})).pools
    policy = LoopPolicy.model_validate(make_policy(pools=["named"]))  # builder and reviewer
    views = loop_pools(listed, policy)
    assert [(v.pool.name, v.via) for v in views] == [("named", None), ("bound", "builder")]
    assert views[1].spent == ["cost_usd"] and views[1].fullest.state == "exhausted"
    assert views[0].spent == [] and views[0].fullest.used == 1
    await cancel_loop(store, OPERATOR, {"loop_id": "drawing"})
    after = (await pools(store, OPERATOR, {})).pools  # `named` lists no open loop now
    assert [p.loops for p in after if p.name == "named"] == [[]]
    shown = [v.pool.name for v in loop_pools(after, policy)]
    assert shown == ["named", "bound"]  # a closed loop's page still shows what it drew from
    anyone = policy.model_copy(update={"agents": ("*",)})
    assert [v.pool.name for v in loop_pools(listed, anyone)] == [
        "named",
        "bound",
        "other",
    ]


async def test_a_loop_page_shows_approved_approvals_its_live_turns_may_still_use(server, tokens):
    """An approval the operator granted stays on the loop's page until its turn uses it."""
    from loopwarden.approvals.approval_ops import ApprovalRequest
    from loopwarden.clients.agent import AgentClient
    from loopwarden.turns.claim import ClaimRequest

    open_by_cli(server, "granted")
    async with AgentClient.stdio("builder", server.home) as agent:
        turn = await agent.call(claim, ClaimRequest(loop_id="granted"))
        assert turn.granted, turn.reasons
        asked = await agent.call(
            request_approval,
            ApprovalRequest(
                turn_id=turn.turn_id,
                fence=turn.fence,
                tool="deploy.stage",
                summary="ship to staging",
            ),
        )
    approved = cli("approve", asked.approval_id, "--home", str(server.home))
    assert approved.returncode == 0, approved.stderr
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        page = http.get("/loops/granted").text
    assert "Approved, not yet used (1)" in page and asked.approval_id in page


def test_a_receipt_page_says_whether_its_checkpoint_is_stored_or_signed_for_the_page(
    server, tokens
):
    """A receipt not yet under a stored checkpoint is never shown as if one had been signed."""
    open_by_cli(server, "proved")
    listed = cli("receipts", "proved", "--json", "--home", str(server.home))
    receipt_id = json.loads(listed.stdout)["receipts"][0]["receipt_id"]
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        before = http.get(f"/receipts/{receipt_id}").text
        assert "Not yet under a stored checkpoint" in before and "loopwarden checkpoint" in before
        assert "Stored checkpoint of size" not in before
        stored = cli("checkpoint", "--home", str(server.home))
        assert stored.returncode == 0, stored.stderr
        after = http.get(f"/receipts/{receipt_id}").text
        assert "Stored checkpoint of size" in after and "Not yet under" not in after


def test_an_operator_replaces_a_loops_policy_from_its_page_sealed_and_only_once_confirmed(
    server, tokens
):
    """The dashboard's set-policy: a bad policy or no confirm seals nothing and keeps the text;
    a good one is sealed as loop.policy_changed with both digests, under the operator's name."""
    open_by_cli(server, "replaced")
    home = str(server.home)

    def policy_digest() -> str:
        shown = cli("loop", "show", "replaced", "--json", "--home", home)
        return str(json.loads(shown.stdout)["policy_digest"])

    before = policy_digest()
    new_policy = make_policy(budgets={"max_turns": 7})
    with client(server) as http:
        sign_in(http, tokens["alice"].token)
        page = http.get("/loops/replaced/policy").text
        assert before in page and "Replace policy" in page
        assert 'href="/loops/replaced/policy"' in http.get("/loops/replaced").text
        csrf = page_csrf(http, "/loops/replaced/policy")
        unconfirmed = {"csrf": csrf, "format": "json", "policy": json.dumps(new_policy)}
        answer = http.post("/loops/replaced/policy", data=unconfirmed)
        assert answer.status_code == 400 and "Tick the box" in answer.text
        broken = {
            **unconfirmed,
            "format": "toml",
            "policy": "[budgets\nmax_turns = 7",
            "confirm": "yes",
        }
        answer = http.post("/loops/replaced/policy", data=broken)
        assert answer.status_code == 400 and "policy-error" in answer.text
        assert "[budgets\nmax_turns = 7" in answer.text  # the text as sent, to fix
        assert policy_digest() == before, "nothing sealed"
        forged = {**unconfirmed, "confirm": "yes", "csrf": "wrong"}
        assert http.post("/loops/replaced/policy", data=forged).status_code == 403
        good = {**unconfirmed, "confirm": "yes", "reason": "tighter budget"}
        answer = http.post("/loops/replaced/policy", data=good)
        assert answer.status_code == 303 and answer.headers["location"] == "/loops/replaced"
        assert "now has policy" in http.get("/loops/replaced").text
    after = policy_digest()
    assert after != before
    listed = cli("receipts", "replaced", "--json", "--home", home)
    changed = [
        r for r in json.loads(listed.stdout)["receipts"] if r["kind"] == "loop.policy_changed"
    ]
    assert len(changed) == 1 and changed[0]["principal"] == "alice", changed
