"""The operator dashboard in a real browser: headless Chromium (Playwright) against a real
`loopwarden serve --http` subprocess, with agents acting over MCP on the same port.

Runs when a Chromium binary is found (`LOOPWARDEN_CHROMIUM`, else `chromium` on the PATH);
otherwise the module is skipped with one line saying how to get one. Screenshots of every page
go to `test-artifacts/dashboard/` (gitignored); with `LOOPWARDEN_UPDATE_SCREENSHOT=1` the live
loop page's (a pool, an approval waiting, pause and cancel) is also written to
`docs/dashboard.png`, the README's picture.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import (
    CLI_TIMEOUT,
    ENVELOPE_PARTS,
    EVIDENCE,
    Served,
    Token,
    bounded,
    cli,
    codes,
    connect_http,
    dashboard_url,
    loopwarden,
    make_policy,
    mint_tokens,
    running,
    stored_envelope,
)

from loopwarden.clients.agent import AgentClient


def find_chromium() -> str | None:
    chosen = os.environ.get("LOOPWARDEN_CHROMIUM")
    if chosen:
        return chosen if Path(chosen).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM = find_chromium()
try:
    from playwright.async_api import BrowserContext, Page, async_playwright, expect
except ImportError:  # pragma: no cover - the test extra brings it
    CHROMIUM = None
if CHROMIUM is None:
    pytest.skip(
        "browser tests skipped: no Chromium found (apt-get install chromium, or set "
        "LOOPWARDEN_CHROMIUM)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 20_000  # a live update must arrive within this (the page polls every 2 s)
HOSTILE = '<script>window.__pwned = 1</script>"><img src=x onerror="window.__pwned = 2">'


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Served]:
    with running(root) as served:
        yield served


@pytest.fixture(scope="module")
def tokens(server: Served) -> dict[str, Token]:
    return mint_tokens(
        server.home, [("alice", "operator"), ("builder", "agent"), ("hooks", "observer")]
    )


def open_loop_by_cli(
    server: Served,
    root: Path,
    loop_id: str,
    todos: list[str],
    objective: str = "ship it",
    **sections: Any,
) -> None:
    policy = root / f"{loop_id}.json"
    policy.write_text(json.dumps(make_policy(claims={"max_active_per_agent": 2}, **sections)))
    args = ["loop", "open", "--policy", str(policy), "--objective", objective, "--id", loop_id]
    for title in todos:
        args += ["--todo", title]
    done = cli(*args, "--home", str(server.home))
    assert done.returncode == 0, done.stdout + done.stderr


@asynccontextmanager
async def browser() -> AsyncIterator[BrowserContext]:
    with tempfile.TemporaryDirectory(prefix="lw-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1280, "height": 900},
            )
            try:
                yield context
            finally:
                await context.close()


@asynccontextmanager
async def signed_in(server: Served, token: Token) -> AsyncIterator[Page]:
    """A fresh browser profile, signed in with `token` through the login form."""
    async with browser() as context:
        page = await context.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        await sign_in(page, dashboard_url(server), token.token)
        yield page
        assert not [p for p in problems if "Content Security Policy" in p], problems


async def sign_in(page: Page, url: str, token: str) -> None:
    await page.goto(url + "/")
    await page.fill("input[name=token]", token)
    await page.click("form[action='/login'] button[type=submit]")
    await page.wait_for_load_state()


async def shoot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def claim(agent: AgentClient, loop_id: str) -> Any:
    grant = await agent.claim(loop_id)
    assert grant.granted, grant.reasons
    return grant


# --- signing in ------------------------------------------------------------------------------


@bounded(90)
async def test_an_operator_token_signs_in_and_sees_the_loop_the_cli_opened(server, tokens, root):
    open_loop_by_cli(server, root, "cli-opened", ["write the parser"], "Parse the CSV export")
    async with signed_in(server, tokens["alice"]) as page:
        row = page.locator("tr[data-loop='cli-opened']")
        await row.wait_for()
        assert "Parse the CSV export" in await row.inner_text()
        assert "agent" in await row.locator("td").nth(2).inner_text()  # who must act next
        assert await page.locator(".top .who strong").inner_text() == "alice"
        cookies = await page.context.cookies()
        session = next(c for c in cookies if c["name"] == "lw_session")
        assert session["httpOnly"] and session["sameSite"] == "Strict"
        await shoot(page, "loops")


@bounded(60)
async def test_an_agent_token_is_refused_with_a_message_naming_the_operator_role(server, tokens):
    async with browser() as context:
        page = await context.new_page()
        for who in ("builder", "hooks"):
            await sign_in(page, dashboard_url(server), tokens[who].token)
            message = await page.locator("#login-message").inner_text()
            role = tokens[who].role
            assert f"This is an {role} token" in message and "operator" in message
            assert page.url.endswith("/login")
            assert not [c for c in await context.cookies() if c["name"] == "lw_session"]
        await shoot(page, "login-refused")


@bounded(60)
async def test_signing_out_ends_the_session(server, tokens):
    async with signed_in(server, tokens["alice"]) as page:
        await page.click("form[action='/logout'] button")
        await page.wait_for_load_state()
        assert "Signed out" in await page.locator("#login-message").inner_text()
        await page.goto(dashboard_url(server) + "/")
        assert "/login" in page.url


# --- live updates and decisions --------------------------------------------------------------


@bounded(120)
async def test_an_agents_update_over_mcp_appears_on_the_open_loop_page_without_reload(
    server, tokens, root
):
    open_loop_by_cli(server, root, "live", ["first", "second"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        await page.goto(dashboard_url(server) + "/loops/live")
        await page.evaluate("window.__notReloaded = true")
        grant = await claim(agent, "live")
        await page.locator(f"text={grant.turn_id}").first.wait_for(timeout=WAIT_MS)
        result = await agent.update(
            grant.turn_id, grant.fence, "completed", "parsed", "live-1",
            tools_used=[{"name": "fs.write", "count": 2}],
            usage={"model_calls": 3, "cost_usd": 0.5}, evidence=EVIDENCE,
        )  # fmt: skip
        assert result.accepted
        await page.locator("tr[data-seq='3']").wait_for(timeout=WAIT_MS)
        assert await page.evaluate("window.__notReloaded") is True
        assert "turn.reported" in await page.locator("tr[data-seq='3']").inner_text()
        assert "fs.write" in await page.locator("table.tools").inner_text()
        done = page.locator(".column[data-status='done'] .card[data-todo='t1']")
        assert await done.count() == 1
        assert "0.5" in await page.locator("figure[data-dimension='cost_usd']").inner_text()


@bounded(150)
async def test_approving_on_the_page_lets_the_agents_next_update_cite_the_approval(
    server, tokens, root
):
    open_loop_by_cli(server, root, "gated", ["deploy to staging"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        await page.goto(dashboard_url(server) + "/approvals")
        grant = await claim(agent, "gated")
        asked = await agent.request_approval(
            grant.turn_id, grant.fence, "deploy.staging", "deploy build 7 to staging"
        )
        assert asked.requested and asked.approval_id
        item = page.locator(f"article[data-approval='{asked.approval_id}']")
        await item.wait_for(timeout=WAIT_MS)  # appeared without a reload
        assert "deploy build 7 to staging" in await item.inner_text()
        await shoot(page, "approvals")
        await item.locator("select[name=expires]").select_option("15m")
        await item.locator("button[value=approve]").click()
        await page.wait_for_load_state()
        assert f"{asked.approval_id} approved" in await page.locator(".flash").inner_text()
        result = await agent.update(
            grant.turn_id, grant.fence, "completed", "deployed", "gated-1",
            tools_used=[{"name": "deploy.staging"}], evidence=EVIDENCE,
            approval_ids=[asked.approval_id],
        )  # fmt: skip
        assert result.accepted, result.reasons
        row = page.locator("table.approvals tr", has_text=asked.approval_id)
        await expect(row).to_contain_text("consumed", timeout=WAIT_MS)  # live, no reload


@bounded(120)
async def test_a_rejection_needs_a_reason_and_is_sealed_with_it(server, tokens, root):
    open_loop_by_cli(server, root, "rejected", ["deploy to prod"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        grant = await claim(agent, "rejected")
        asked = await agent.request_approval(grant.turn_id, grant.fence, "deploy.prod", "ship")
        await page.goto(dashboard_url(server) + "/loops/rejected")
        form = page.locator(f"#decide-{asked.approval_id}")
        await form.locator("button[value=reject]").click()
        await page.wait_for_load_state()
        assert "needs a reason" in await page.locator(".flash").inner_text()
        form = page.locator(f"#decide-{asked.approval_id}")
        await form.locator("input[name=reason]").fill("not on a Friday")
        await form.locator("button[value=reject]").click()
        await page.wait_for_load_state()
        assert f"{asked.approval_id} rejected" in await page.locator(".flash").inner_text()
        state = await agent.projection("rejected")
        assert not [a for a in state.approvals if a.approval_id == asked.approval_id]


# --- budget pools ----------------------------------------------------------------------------


@bounded(180)
async def test_an_operator_sees_a_pool_run_out_live_and_pauses_it_from_the_pools_page(
    server, tokens, root
):
    made = cli("pool", "create", "team-web", "--max-cost-usd", "1", "--window", "1d",
               "--max-concurrent-turns", "2", "--home", str(server.home))  # fmt: skip
    assert made.returncode == 0, made.stderr
    open_loop_by_cli(server, root, "pooled", ["a", "b", "c"], pools=["team-web"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        await page.locator(".top nav a", has_text="Pools").click()
        await page.wait_for_load_state()
        panel = page.locator("section.pool[data-pool='team-web']")
        cost = panel.locator(".meter", has_text="cost_usd")
        assert "0 / 1" in await cost.inner_text()
        assert "pooled" in await panel.locator("td.pool-loops").inner_text()
        assert "resets" in await panel.locator(".pool-window").inner_text()
        await page.evaluate("window.__notReloaded = true")
        grant = await claim(agent, "pooled")
        await expect(panel.locator(".meter", has_text="open turns")).to_contain_text(
            "1 / 2", timeout=WAIT_MS
        )
        spent = await agent.update(
            grant.turn_id, grant.fence, "completed", "spent it", "pool-1",
            usage={"cost_usd": 1.0}, evidence=EVIDENCE,
        )  # fmt: skip
        assert spent.accepted, spent.reasons
        await expect(panel.locator(".pool-spent-note")).to_contain_text(
            "Spent: cost_usd", timeout=WAIT_MS
        )  # live, without a reload
        assert await page.evaluate("window.__notReloaded") is True
        assert "m-exhausted" in (await cost.get_attribute("class") or "")
        assert await cost.locator("progress").get_attribute("value") == "1000"
        assert "1 / 1" in await cost.inner_text()
        refused = await agent.claim("pooled")
        assert not refused.granted and codes(refused) == {"pool_exhausted"}
        await shoot(page, "pools-spent")

        await panel.locator("input[name=reason]").fill("over budget for today")
        await panel.locator("button[value=pause]").click()
        await page.wait_for_load_state()
        assert "Pool team-web is paused" in await page.locator(".flash").inner_text()
        panel = page.locator("section.pool[data-pool='team-web']")
        assert await panel.locator("h2 .badge").inner_text() == "paused"
        assert "pool_paused" in await panel.locator(".pool-paused").inner_text()
        assert await panel.locator("button[value=resume]").count() == 1
        refused = await agent.claim("pooled")
        assert not refused.granted and "pool_paused" in codes(refused), refused.reasons
        await shoot(page, "pools-paused")

        await panel.locator("td.pool-loops a", has_text="pooled").click()
        await page.wait_for_load_state()
        drawn = page.locator("#loop-pools .loop-pool[data-pool='team-web']")
        text = await drawn.inner_text()
        assert "paused" in text and "spent: cost_usd" in text, text
        await shoot(page, "loop-pools")


# --- hostile text, CSRF ----------------------------------------------------------------------


@bounded(120)
async def test_markup_in_a_todo_title_and_summaries_renders_as_text(server, tokens, root):
    open_loop_by_cli(server, root, "hostile", [HOSTILE], objective=HOSTILE)
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        grant = await claim(agent, "hostile")
        await agent.request_approval(grant.turn_id, grant.fence, "deploy.x", HOSTILE)
        reported = await agent.update(
            grant.turn_id, grant.fence, "progress", HOSTILE, "hostile-1", evidence=EVIDENCE
        )
        for path in ("/", "/loops/hostile", "/approvals", f"/receipts/{reported.receipt_id}"):
            await page.goto(dashboard_url(server) + path)
            assert HOSTILE in await page.locator("main").inner_text(), path
            assert await page.locator("main img, main script").count() == 0, path
            assert await page.evaluate("window.__pwned") is None, path
        card = page.locator(".card[data-todo='t1'] .card-title")
        await page.goto(dashboard_url(server) + "/loops/hostile")
        assert await card.inner_text() == HOSTILE


@bounded(90)
async def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(server, tokens, root):
    open_loop_by_cli(server, root, "csrf", ["deploy"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        grant = await claim(agent, "csrf")
        asked = await agent.request_approval(grant.turn_id, grant.fence, "deploy.x", "go")
        target = f"{dashboard_url(server)}/approvals/{asked.approval_id}/decide"
        for form in ({"decision": "approve"}, {"decision": "approve", "csrf": "forged"}):
            refused = await page.request.post(target, form=form, max_redirects=0)
            assert refused.status == 403 and "CSRF" in await refused.text()
        state = await agent.projection("csrf")
        assert [a.status for a in state.approvals if a.approval_id == asked.approval_id] == [
            "pending"
        ]
        # The same session with the page's token is obeyed: the refusals were the CSRF check.
        csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
        paused = await page.request.post(
            f"{dashboard_url(server)}/loops/csrf/control",
            form={"action": "pause", "csrf": csrf or ""},
            max_redirects=0,
        )
        assert paused.status == 303
        assert (await agent.projection("csrf")).status == "paused"


# --- journal, receipt, audit, screenshots ----------------------------------------------------


@bounded(180)
async def test_every_page_renders_a_real_loop_and_the_audit_runs_clean(server, tokens, root):
    """A loop with accepted and refused turns, an approval and a stop; every page shown and
    photographed; the journal filter, the receipt's proofs and the audit checked."""
    open_loop_by_cli(
        server, root, "release", ["build 1.4", "deploy 1.4 to staging", "smoke-test staging"]
    )
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        await play_release(agent)
        url = dashboard_url(server)
        await page.goto(f"{url}/loops/release")
        await page.locator("tr.violation").first.wait_for()
        await shoot(page, "loop")
        await page.goto(f"{url}/loops/release/journal?effect=deny")
        effects = await page.locator("table.journal tbody tr td:nth-child(4)").all_inner_texts()
        assert effects and set(effects) == {"deny"}
        await shoot(page, "journal")
        await page.locator("table.journal a").first.click()
        await page.wait_for_load_state()
        assert "Signature valid" in await page.locator("#signature").inner_text()
        assert "is included in the tree" in await page.locator("#inclusion").inner_text()
        await shoot(page, "receipt")
        await page.goto(f"{url}/audit")
        await page.click("form[action='/audit'] button")
        verdict = page.locator("#audit-verdict")
        await verdict.wait_for(timeout=60_000)
        assert (await verdict.inner_text()).startswith("clean")
        audited = cli("verify", "--json", "--home", str(server.home))
        assert audited.returncode == 0, audited.stderr
        assert await page.locator("#audit-root").inner_text() == json.loads(audited.stdout)["root"]
        await shoot(page, "audit")


@bounded(180)
async def test_the_readmes_picture_is_a_live_loop_with_its_pool_an_approval_and_its_controls(
    server, tokens, root
):
    """The quickstart's loop at work, as `docs/dashboard.png` shows it: a turn done, a report
    refused for want of evidence (its turn still open), a deploy waiting on an approval, the
    pool the loop draws from, and pause and cancel on offer."""
    made = cli("pool", "create", "team-csv", "--max-cost-usd", "20", "--window", "1d",
               "--max-concurrent-turns", "4", "--home", str(server.home))  # fmt: skip
    assert made.returncode == 0, made.stderr
    todos = ["implement export_csv", "write the tests", "deploy to staging"]
    open_loop_by_cli(server, root, "csv-export", todos, "Add CSV export", pools=["team-csv"])
    usage = {"model_calls": 3, "input_tokens": 5400, "output_tokens": 1260, "cost_usd": 0.42}
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        first = await claim(agent, "csv-export")
        done = await agent.update(
            first.turn_id, first.fence, "completed", "wrote export_csv()", "csv-1",
            tools_used=[{"name": "fs.write", "count": 2}, {"name": "tests.run"}],
            usage=usage, evidence=EVIDENCE,
        )  # fmt: skip
        assert done.accepted, done.reasons
        second = await claim(agent, "csv-export")
        refused = await agent.update(
            second.turn_id, second.fence, "completed", "tests written", "csv-2", usage=usage
        )
        assert not refused.accepted and refused.status == "active"
        third = await claim(agent, "csv-export")
        asked = await agent.request_approval(
            third.turn_id, third.fence, "deploy.staging", "deploy build 7 to staging"
        )
        assert asked.requested and asked.approval_id
        await page.goto(f"{dashboard_url(server)}/loops/csv-export")
        await page.locator(f"article[data-approval='{asked.approval_id}']").wait_for()
        assert await page.locator("#loop-pools .loop-pool[data-pool='team-csv']").count() == 1
        assert await page.locator("button[value=cancel]").count() == 1
        assert await page.locator("button[value=pause]").count() == 1
        await shoot(page, "loop-live")
        if os.environ.get("LOOPWARDEN_UPDATE_SCREENSHOT") == "1":
            # The page's top, down to the todo board: readable at the README's width, small.
            board = page.locator("section.panel", has=page.locator("div.board"))
            top = await board.bounding_box()
            assert top is not None
            clip = {"x": 0, "y": 0, "width": 1280, "height": top["y"] + top["height"] + 16}
            png = str(REPO / "docs" / "dashboard.png")
            await page.screenshot(path=png, clip=clip, full_page=True)


async def play_release(agent: AgentClient) -> None:
    """An accepted turn, a report refused for missing evidence then corrected, and a denied
    tool that stops the loop (a violation)."""
    usage = {"model_calls": 4, "input_tokens": 7200, "output_tokens": 1680, "cost_usd": 0.84}
    first = await claim(agent, "release")
    await agent.update(
        first.turn_id, first.fence, "completed", "built 1.4", "rel-1",
        tools_used=[{"name": "fs.write", "count": 3}, {"name": "tests.run"}],
        usage=usage, evidence=EVIDENCE,
    )  # fmt: skip
    second = await claim(agent, "release")
    refused = await agent.update(
        second.turn_id, second.fence, "completed", "no evidence", "rel-2", usage=usage
    )
    assert not refused.accepted
    await agent.update(
        second.turn_id, second.fence, "completed", "deployed", "rel-3",
        tools_used=[{"name": "fs.read"}], usage=usage, evidence=EVIDENCE,
    )  # fmt: skip
    third = await claim(agent, "release")
    stopped = await agent.update(
        third.turn_id, third.fence, "completed", "pushed", "rel-4",
        tools_used=[{"name": "git.push"}], usage=usage, evidence=EVIDENCE,
    )  # fmt: skip
    assert not stopped.accepted and stopped.status == "stopped"


# --- pages that tell the truth: each fixed page checked and photographed ---------------------


def host_hook(server: Served, loop_id: str, event: dict[str, Any]) -> dict[str, Any]:
    """Run the real command hook (`loopwarden hook claude-code`) on one event; its answer."""
    base = {"session_id": "s-1", "transcript_path": "", "cwd": ".", **event}
    done = subprocess.run(
        loopwarden("hook", "claude-code", "--loop", loop_id, "--agent", "builder",
                   "--home", str(server.home), "--in-process"),
        input=json.dumps(base), capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else {}


def bash(command: str, phase: str = "PreToolUse", n: int = 1, **more: Any) -> dict[str, Any]:
    return {"hook_event_name": phase, "tool_name": "Bash", "tool_use_id": f"toolu_{n}",
            "tool_input": {"command": command}, **more}  # fmt: skip


@bounded(180)
async def test_a_refused_turn_shows_every_report_with_its_verdict_and_the_hosts_tools(
    server, tokens, root
):
    """Issue: a turn refused for `tool_denied` (git.push) showed only a later report, itself
    refused as closed, and the host column listed receipt kinds; the refusals list had no tool
    and no message."""
    policy = root / "pushed.json"
    policy.write_text(json.dumps(make_policy(
        tools={"allow": ["fs.write", "tests.run", "shell.run"], "deny": ["git.push"]},
        observe={"mode": "record"},
    )))  # fmt: skip
    opened = cli("loop", "open", "--policy", str(policy), "--objective", "fix the test",
                 "--todo", "fix it", "--id", "pushed", "--home", str(server.home))  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        host_hook(server, "pushed", {"hook_event_name": "SessionStart", "source": "startup"})
        grant = await claim(agent, "pushed")
        host_hook(server, "pushed", bash("pytest -q", n=1))
        host_hook(server, "pushed", bash("pytest -q", "PostToolUse", 1, tool_response={"x": 1}))
        denied = await agent.update(
            grant.turn_id, grant.fence, "completed", "fixed and pushed", "p-1",
            tools_used=[{"name": "fs.write"}, {"name": "git.push"}], evidence=EVIDENCE,
        )  # fmt: skip
        assert not denied.accepted and "tool_denied" in [r.code for r in denied.reasons]
        late = await agent.update(
            grant.turn_id, grant.fence, "failed", "tests again", "p-2",
            tools_used=[{"name": "tests.run"}],
        )  # fmt: skip
        assert not late.accepted
        await page.goto(dashboard_url(server) + "/loops/pushed")
        row = page.locator(f"table.tools tr[data-turn='{grant.turn_id}']")
        reports = await row.locator(".report").all_inner_texts()
        assert len(reports) == 2, reports
        assert "git.push" in reports[0] and "tool_denied" in reports[0], reports
        assert "tests.run" in reports[1] and "refused" in reports[1], reports
        host = await row.locator(".host-use").all_inner_texts()
        assert host and "shell.run" in host[0] and "Bash" in host[0] and "ran 1" in host[0], host
        assert "tool.admitted" not in await row.inner_text()
        refusal = page.locator(".refusal-list tr", has_text="tool_denied").first
        assert "git.push" in await refusal.locator("td.subject").inner_text()
        why = await refusal.locator("td.why").inner_text()
        assert "git.push" in why and len(why) > len("tool_denied") + 10, why  # the message
        await shoot(page, "loop-refused-turn")


@bounded(180)
async def test_a_loop_page_says_how_it_ended_who_paused_it_and_draws_only_used_budgets(
    server, tokens, root
):
    open_loop_by_cli(server, root, "finished", ["only todo"])
    open_loop_by_cli(server, root, "held", ["deploy"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        grant = await claim(agent, "finished")
        done = await agent.update(
            grant.turn_id, grant.fence, "completed", "done", "f-1",
            usage={"cost_usd": 0.25}, evidence=EVIDENCE,
        )  # fmt: skip
        assert done.status == "completed"
        url = dashboard_url(server)
        await page.goto(f"{url}/loops/finished")
        assert (await page.locator("#end-reason").inner_text()).startswith("Completed")
        assert await page.locator(".stop-reason").count() == 0  # not red "stopped"
        assert "No one needs to act" in await page.locator("#attention").inner_text()
        assert "no rate limit" in await page.locator("#loop-facts").inner_text()
        drawn = await page.locator("figure.chart").evaluate_all(
            "els => els.map(e => e.dataset.dimension)"
        )
        assert sorted(drawn) == ["cost_usd", "turns"], drawn  # the used ones only
        assert "max_" not in await page.locator("#unused-budgets").inner_text()
        await shoot(page, "loop-completed")

        held = await claim(agent, "held")
        asked = await agent.request_approval(held.turn_id, held.fence, "deploy.staging", "go")
        assert asked.requested
        await page.goto(f"{url}/loops/held")
        controls = page.locator("form.controls")
        await controls.locator("input[name=reason]").fill("waiting for the freeze to end")
        await controls.locator("button[value=pause]").click()
        await page.wait_for_load_state()
        paused = await page.locator("#paused-by").inner_text()
        assert "alice" in paused and "waiting for the freeze to end" in paused, paused
        attention = await page.locator("#attention").inner_text()
        # The pause comes first (the operator must resume); the waiting approval is named after.
        assert attention.index("paused") < attention.index("1 approval awaits a decision"), (
            attention
        )
        await shoot(page, "loop-paused")


@bounded(150)
async def test_a_consumed_approval_says_it_was_used_not_when_it_expires(server, tokens, root):
    open_loop_by_cli(server, root, "spent", ["deploy"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        grant = await claim(agent, "spent")
        asked = await agent.request_approval(grant.turn_id, grant.fence, "deploy.staging", "go")
        async with connect_http(server.url, tokens["alice"].token) as ops:
            await ops.decide_approval(asked.approval_id, approve=True, expires_in_seconds=3600)
        used = await agent.update(
            grant.turn_id, grant.fence, "completed", "deployed", "s-1",
            tools_used=[{"name": "deploy.staging"}], evidence=EVIDENCE,
            approval_ids=[asked.approval_id],
        )  # fmt: skip
        assert used.accepted, used.reasons
        await page.goto(dashboard_url(server) + "/approvals")
        row = page.locator("table.approvals tr", has_text=asked.approval_id)
        validity = await row.locator("td.validity").inner_text()
        assert "used" in validity and grant.turn_id in validity and "expires" not in validity
        await shoot(page, "approvals-consumed")


@bounded(150)
async def test_the_loops_page_puts_loops_needing_a_human_first_and_flags_fresh_refusals(
    server, tokens, root
):
    open_loop_by_cli(server, root, "zz-refused", ["a"])
    open_loop_by_cli(server, root, "zz-waiting", ["b"])
    async with (
        signed_in(server, tokens["alice"]) as page,
        connect_http(server.url, tokens["builder"].token) as agent,
    ):
        waiting = await claim(agent, "zz-waiting")
        await agent.request_approval(waiting.turn_id, waiting.fence, "deploy.x", "ok?")
        refused = await claim(agent, "zz-refused")
        answer = await agent.update(
            refused.turn_id, refused.fence, "completed", "no evidence", "z-1"
        )
        assert not answer.accepted
        await page.goto(dashboard_url(server) + "/")
        rows = page.locator("tr.loop-row")
        who = await rows.evaluate_all("rs => rs.map(r => r.className.match(/attention-(\\w+)/)[1])")
        order = {"human": 0, "agent": 1, "none": 2}
        assert who == sorted(who, key=order.__getitem__), who  # the humans' loops first
        flagged = page.locator("tr.loop-row[data-loop='zz-refused'] .fresh-refusal")
        assert "refused 1× in the last hour" in await flagged.inner_text()
        assert await page.locator("tr.loop-row[data-loop='zz-waiting'] .fresh-refusal").count() == 0
        await shoot(page, "loops-sorted")


@bounded(90)
async def test_an_error_page_keeps_the_navigation(server, tokens):
    async with signed_in(server, tokens["alice"]) as page:
        for path, words in (("/no/such/page", "there is no page at /no/such/page"),
                            ("/loops/relase", "no loop with id 'relase'")):  # fmt: skip
            response = await page.goto(dashboard_url(server) + path)
            assert response is not None and response.status == 404
            assert words in await page.locator("#error-message").inner_text()
            links = await page.locator(".top nav a").all_inner_texts()
            assert links == ["Loops", "Pools", "Approvals", "Audit"], links
            assert await page.locator(".top .who strong").inner_text() == "alice"
        await shoot(page, "error-404")
        await page.locator(".top nav a", has_text="Loops").click()
        await page.wait_for_load_state()
        assert page.url.rstrip("/") == dashboard_url(server)


@bounded(180)
async def test_a_tampered_audit_says_what_to_do_next(tmp_path):
    """A receipt's signature altered on disk under a running server: the audit page names the
    finding and the next steps."""
    with running(tmp_path) as served:
        minted = await anyio.to_thread.run_sync(mint_tokens, served.home, [("alice", "operator")])
        operator = minted["alice"]
        policy = tmp_path / "p.json"
        policy.write_text(json.dumps(make_policy()))
        opened = cli("loop", "open", "--policy", str(policy), "--objective", "x",
                     "--todo", "t", "--id", "forged", "--home", str(served.home))  # fmt: skip
        assert opened.returncode == 0, opened.stderr
        with sqlite3.connect(served.home / "loopwarden.db") as db:
            parts = db.execute(
                f"SELECT {ENVELOPE_PARTS} FROM journal WHERE loop_id = 'forged' AND seq = 1"
            ).fetchone()
            document = json.loads(stored_envelope(*parts))
            signature = document["signatures"][0]["sig"]
            document["signatures"][0]["sig"] = ("A" if signature[0] != "A" else "B") + signature[1:]
            db.execute(
                "UPDATE journal SET envelope = ? WHERE loop_id = 'forged' AND seq = 1",
                (json.dumps(document).encode(),),
            )
        async with signed_in(served, operator) as page:
            await page.goto(dashboard_url(served) + "/audit")
            await page.click("form[action='/audit'] button")
            verdict = page.locator("#audit-verdict")
            await verdict.wait_for(timeout=60_000)
            assert not (await verdict.inner_text()).startswith("clean")
            steps = await page.locator("#audit-next li").all_inner_texts()
            assert len(steps) >= 3 and any("backup" in step for step in steps), steps
            assert "signature" in await page.locator("table.findings").inner_text()
            await shoot(page, "audit-tampered")
