"""Each host is one module behind one registry, and the hooks keep their integrity (issues 20, 22).

The registry test pins everything derived from `loopwarden/hosts` (the CLI, the hook command, the
forwarder, the entry point, the receipts' `host` field, policy validation) to its names. The rest
runs hosts' documented events (`tests/fixtures/hooks/<host>/`) through `hooks.handle` on a real
store: only loopwarden's own tools under its installed server name pass unrecorded; host-internal
tools run without a turn unless a policy denies them, and every journal stays judged legal;
subagents are named in the receipts. Then the installer and `hook doctor` on real files: a
mistyped loop or agent fails, the hosts' trust state is read as they read it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from conftest import BUILDER, OPERATOR
from support import cli_env, loopwarden
from test_hooks import (
    FIXTURES,
    HOOKED,
    LOOP,
    attached_claim,
    denied,
    fixture,
    judged_clean,
    kinds,
    opened,
    report,
    say,
)
from typer.testing import CliRunner

from loopwarden import hosts
from loopwarden.catalog import TOOLS
from loopwarden.cli.root import app
from loopwarden.clients.hook_command import parser
from loopwarden.hosts import host_kinds
from loopwarden.hosts.handle import handle
from loopwarden.hosts.hook import OWN_TOOLS
from loopwarden.hosts.host import Hook, Place
from loopwarden.hosts.tool_names import is_internal, policy_tool
from loopwarden.journal.listing import journal
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.store.store import Store
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.patterns import is_tool_name
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.update import update

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parent.parent


# --- the registry ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", hosts.NAMES)
def test_every_registered_host_is_one_module_the_rest_derives_from(name):
    host = hosts.get(name)
    assert host.name == name
    assert (REPO / "loopwarden" / "hosts" / f"{name.replace('-', '_')}.py").is_file()
    assert name in get_args(host_kinds.Host), "the receipts' host field"
    assert name in parser()._actions[1].choices, "the hook command's choices"
    commands = {c.name for g in app.registered_groups if g.name == "hook" for c in
                g.typer_instance.registered_commands}  # fmt: skip
    assert name in commands, "`loopwarden hook HOST` in the admin CLI"
    LoopPolicy.model_validate({**HOOKED, "observe": {"names": {name: {"X": "fs.read"}}}})
    assert host.pre_events and host.pre_events <= set(host.events)
    for phase in (None, "pre"):
        blocked = host.failure(phase, "why")
        assert blocked.exit_code == 2 or "deny" in blocked.stdout, "a failure blocks a tool"
    assert set(host.hooks(Hook(command="lw hook x"))) <= set(host.events)
    for tool, policy_name in host.names.items():
        assert is_tool_name(policy_name) and policy_tool(name, tool) == policy_name
    for tool in host.shell:
        assert policy_tool(name, tool) == "shell.run"
    for tool in host.internal:
        assert policy_tool(name, tool).startswith("host."), "a policy's host.* covers them"


def test_the_entry_point_and_the_forwarder_load_no_host_module_to_decide():
    script = (
        "import sys; import loopwarden.cli.entry, loopwarden.clients.hook_forward; "
        "print(sorted(m for m in sys.modules if m.startswith('loopwarden.hosts.')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_own_tools_are_exactly_the_catalogs_mcp_tools():
    assert {op.name for op in TOOLS} == OWN_TOOLS


# --- loopwarden's own tools ------------------------------------------------------------------


def mcp(tool: str) -> dict[str, Any]:
    return fixture("claude-code", "PreToolUse-mcp", tool_name=tool)


async def test_only_loopwardens_own_tools_under_its_installed_server_name_pass(store):
    await opened(store)
    for own in ("mcp__loopwarden__claim", "mcp__loopwarden__update"):
        assert denied((await say(store, mcp(own)))[1]) is None
    assert await kinds(store) == ["loop.opened", "host.attached"], "own tools: unrecorded"
    for other in ("mcp__loopwarden__exec_shell", "mcp__loopwarden__Bash",
                  "mcp__loopwarden__x__claim"):  # fmt: skip
        assert "claim a turn first" in denied((await say(store, mcp(other)))[1]), other
    # An own tool's name under another server name is refused with the way to install for it.
    elsewhere = denied((await say(store, mcp("mcp__loopwardenx__claim")))[1])
    assert "server name 'loopwardenx'" in elsewhere and "--server-name loopwardenx" in elsewhere
    assert await kinds(store) == ["loop.opened", "host.attached"] + ["tool.refused"] * 4

    async def under(servers: list[str], tool: str) -> str | None:
        raw = json.dumps(mcp(tool)).encode()
        reply = await handle(store, "claude-code", raw, loop_id=LOOP, agent="builder",
                             servers=servers)  # fmt: skip
        return denied(json.loads(reply.stdout)) if reply.stdout else None

    assert await under(["lw"], "mcp__lw__claim") is None
    assert await under(["lw"], "mcp__loopwarden__claim") is not None, "not the installed name"
    await judged_clean(store)


# --- host-internal tools ---------------------------------------------------------------------

INTERNAL = [  # (host, a pre-tool fixture of that host, an internal tool of it)
    ("claude-code", "PreToolUse-read", "ToolSearch"),
    ("claude-code", "PreToolUse-read", "TodoWrite"),
    ("claude-code", "PreToolUse-read", "EnterPlanMode"),
    ("codex", "PreToolUse-read", "update_plan"),
    ("gemini", "BeforeTool-read_file", "write_todos"),
]


@pytest.mark.parametrize(("host", "name", "tool"), INTERNAL)
async def test_host_internal_tools_run_without_a_turn_unrecorded(store, host, name, tool):
    assert is_internal(host, tool)
    await opened(store)
    reply, _ = await say(store, fixture(host, name, tool_name=tool), host=host)
    assert (reply.exit_code, reply.stdout) == (0, ""), "admitted: the host is told nothing"
    assert "tool.refused" not in await kinds(store) and "tool.admitted" not in await kinds(store)
    await judged_clean(store)


async def test_an_internal_tool_in_a_turn_is_neither_observed_nor_owed_in_the_report(store):
    await opened(store)
    granted = await attached_claim(store)
    pre = fixture("claude-code", "PreToolUse-read", tool_name="TodoWrite")
    post = fixture("claude-code", "PostToolUse-write", tool_name="TodoWrite")
    assert denied((await say(store, pre))[1]) is None
    await say(store, post)
    result = await update(store, BUILDER, report(granted, "u1", {}))
    assert result.accepted, result.reasons
    await judged_clean(store)


async def test_a_policy_can_still_deny_a_host_internal_tool(store):
    policy = {**HOOKED, "tools": {**HOOKED["tools"], "deny": ["web.*", "host.ToolSearch"]}}
    await opened(store, policy)
    event = fixture("claude-code", "PreToolUse-read", tool_name="ToolSearch")
    assert "host.ToolSearch: denied" in denied((await say(store, event))[1])
    refused = [r for r in await store.read(lambda r: r.loop_journal(LOOP))][-1]
    assert refused.kind == "tool.refused"
    await judged_clean(store)


# --- subagents -------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["claude-code", "codex"])
async def test_a_subagents_tool_call_names_it_in_the_receipt(store, host):
    await opened(store)
    await say(store, fixture(host, "SessionStart-startup"), host=host)
    assert (await claim(store, BUILDER, ClaimRequest(loop_id=LOOP))).granted
    event = fixture(host, "PreToolUse-bash-in-subagent")
    assert "rm -rf" in denied((await say(store, event, host=host))[1])
    row = (await store.read(lambda r: r.loop_journal(LOOP)))[-1]
    body = open_envelope(row.envelope, store.keyring).body
    assert body["kind"] == "tool.refused"
    assert (body["data"]["agent_id"], body["data"]["agent_type"]) == (
        event["agent_id"],
        event["agent_type"],
    )
    listed = await journal(store, OPERATOR, {"loop_id": LOOP})
    assert listed.receipts[-1].subagent == f"{event['agent_type']} {event['agent_id']}"
    assert listed.receipts[0].subagent is None
    await judged_clean(store)


# --- hook install and hook doctor -------------------------------------------------------------


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
async def installed_home(home: Path, store: Store, tmp_path: Path) -> dict[str, Path]:
    await opened(store)
    user = tmp_path / "user"
    user.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    return {"home": home, "user": user, "project": project}


def install(where: dict[str, Path], host: str, *extra: str, loop: str = LOOP,
            agent: str = "builder") -> Any:  # fmt: skip
    return invoke(
        "hook", "install", host, "--loop", loop, "--agent", agent, "--home", str(where["home"]),
        "--project", str(where["project"]), *extra, env={"HOME": str(where["user"])},
    )  # fmt: skip


async def test_install_refuses_a_mistyped_loop_or_agent_and_writes_nothing(installed_home):
    wrong_loop = install(installed_home, "claude-code", loop="L")
    assert wrong_loop.exit_code == 2, wrong_loop.output
    assert "no loop 'L'" in wrong_loop.output and "did you mean 'L1'" in wrong_loop.output
    wrong_agent = install(installed_home, "claude-code", agent="buidler")
    assert wrong_agent.exit_code == 2 and "did you mean 'builder'" in wrong_agent.output
    assert not (installed_home["project"] / ".claude").exists()
    assert install(installed_home, "claude-code").exit_code == 0


def test_install_help_says_http_is_for_every_host():
    text = " ".join(invoke("hook", "install", "--help").output.split())
    assert "Claude Code posts it itself" in text and "every other host" in text


async def test_install_says_loudly_that_codex_will_not_run_untrusted_project_hooks(
    installed_home,
):
    done = install(installed_home, "codex")
    assert done.exit_code == 0
    assert "WARNING: Codex CLI will NOT run these hooks" in done.output
    assert 'trust_level = "trusted"' in done.output
    config = installed_home["user"] / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(
        f'bypass_hook_trust = true\n[projects."{installed_home["project"]}"]\n'
        'trust_level = "trusted"\n'
    )
    assert "WARNING" not in install(installed_home, "codex").output


def place(tmp_path: Path, scope: str = "project", **env: str) -> Place:
    return Place(scope, tmp_path / "repo" / "sub", tmp_path, env)  # type: ignore[arg-type]


def files(tree: dict[Path, str]) -> Any:
    return lambda path: tree.get(path)


def codex_config(tmp_path: Path, text: str) -> dict[Path, str]:
    return {tmp_path / ".codex" / "config.toml": text}


@pytest.mark.parametrize(
    ("config", "trusted", "says"),
    [
        ("", False, "has no trust entry"),
        ('[projects."{p}"]\ntrust_level = "untrusted"', False, "'untrusted'"),
        ('[projects."{p}"]\ntrust_level = "trusted"', False, "Codex runs new or changed hooks"),
        ('bypass_hook_trust = true\n[projects."{p}"]\ntrust_level = "trusted"', True, "bypass"),
        (
            '[projects."{p}"]\ntrust_level = "trusted"\n[hooks.state."{p}/.codex/hooks.json:'
            'pre_tool_use:0:0"]\ntrusted_hash = "sha256:00"',
            None,
            "were trusted in /hooks",
        ),
        ("not = [toml", False, "is not TOML"),
    ],
)
def test_codex_trust_is_read_from_its_config(tmp_path, config, trusted, says):
    project = tmp_path / "repo" / "sub"
    trust = hosts.get("codex").trust(
        place(tmp_path), files(codex_config(tmp_path, config.format(p=project)))
    )
    assert (trust.trusted, says in trust.detail) == (trusted, True), trust


def test_codex_trusts_a_repository_by_its_root(tmp_path):
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    config = f'bypass_hook_trust = true\n[projects."{tmp_path / "repo"}"]\ntrust_level = "trusted"'
    trust = hosts.get("codex").trust(place(tmp_path), files(codex_config(tmp_path, config)))
    assert trust.trusted is True, trust


@pytest.mark.parametrize(
    ("env", "rules", "settings", "trusted"),
    [
        ({"GEMINI_CLI_TRUST_WORKSPACE": "true"}, None, None, True),
        ({"GEMINI_CLI_TRUST_WORKSPACE": "false"}, {"{root}": "TRUST_FOLDER"}, None, False),
        ({}, None, None, False),
        ({}, None, '{"security": {"folderTrust": {"enabled": false}}}', True),
        ({}, {"{root}/repo": "TRUST_FOLDER"}, None, True),
        ({}, {"{root}/repo/sub/x": "TRUST_PARENT"}, None, True),
        ({}, {"{root}/repo": "TRUST_FOLDER", "{root}/repo/sub": "DO_NOT_TRUST"}, None, False),
        ({}, {"{root}/other": "TRUST_FOLDER"}, None, False),
    ],
)
def test_gemini_trust_is_read_as_gemini_reads_it(tmp_path, env, rules, settings, trusted):
    tree = {}
    if rules is not None:
        text = json.dumps({k.format(root=tmp_path): v for k, v in rules.items()})
        tree[tmp_path / ".gemini" / "trustedFolders.json"] = "// Gemini allows comments\n" + text
    if settings is not None:
        tree[tmp_path / ".gemini" / "settings.json"] = settings
    trust = hosts.get("gemini").trust(place(tmp_path, **env), files(tree))
    assert trust.trusted is trusted, trust
    assert trusted or "GEMINI_CLI_TRUST_WORKSPACE" in trust.fix


def doctor(where: dict[str, Path], host: str, **env: str) -> Any:
    return invoke(
        "hook", "doctor", host, "--project", str(where["project"]), "--json",
        env={"HOME": str(where["user"]), **env},
    )  # fmt: skip


def failed_checks(result: Any) -> list[str]:
    report = json.loads(result.output)
    assert report["ok"] == (result.exit_code == 0), report
    return [c["name"] for c in report["checks"] if c["ok"] is False]


async def test_doctor_passes_a_working_set_up_and_names_each_broken_part(installed_home):
    assert doctor(installed_home, "claude-code").exit_code == 1, "nothing installed yet"
    assert failed_checks(doctor(installed_home, "claude-code")) == ["settings"]
    assert install(installed_home, "claude-code").exit_code == 0
    ok = doctor(installed_home, "claude-code")
    assert (ok.exit_code, failed_checks(ok)) == (0, []), ok.output
    settings = installed_home["project"] / ".claude" / "settings.json"
    text = settings.read_text()
    settings.write_text(text.replace("--loop L1", "--loop L9"))
    assert failed_checks(doctor(installed_home, "claude-code")) == ["store"]
    words = json.loads(text)["hooks"]["PreToolUse"][0]["hooks"][0]["command"].split()
    settings.write_text(text.replace(words[0], "/no/such/loopwarden"))
    assert failed_checks(doctor(installed_home, "claude-code")) == ["command"]
    assert install(installed_home, "codex").exit_code == 0
    assert failed_checks(doctor(installed_home, "codex")) == ["trust"]
    assert doctor(installed_home, "nethack").exit_code == 2


def test_a_forwarder_failure_blocks_in_each_hosts_own_form(tmp_path):
    """No token: the forwarder answers as the host's hook answers a failure."""
    for host, name in [("codex", "PreToolUse-read"), ("gemini", "BeforeTool-read_file"),
                       ("cursor", "preToolUse-Read")]:  # fmt: skip
        done = subprocess.run(
            loopwarden("hook", host, "--loop", LOOP, "--agent", "b", "--server", "http://x:1"),
            input=(FIXTURES / host / f"{name}.json").read_bytes(),
            capture_output=True,
            env=cli_env(),
            timeout=60,
        )
        if host == "cursor":
            assert done.returncode == 0 and json.loads(done.stdout)["permission"] == "deny"
        elif host == "gemini":
            assert done.returncode == 2 and json.loads(done.stdout)["decision"] == "deny"
        else:
            assert done.returncode == 2 and b"LOOPWARDEN_OBSERVER_TOKEN" in done.stderr


async def test_refusals_of_internal_tools_sealed_before_the_class_stay_legal(store):
    """Release 0.1.0 refused `ToolSearch` without a turn, as any tool: `verify` judges such a
    receipt by the rule it was sealed under, and still objects to reasons no rule gives."""
    from test_judge import _recast, objections

    from loopwarden.kinds import KINDS

    await opened(store)
    assert "claim a turn first" in denied((await say(store, fixture("claude-code",
                                                                    "PreToolUse-read")))[1])  # fmt: skip
    rows = await store.read(lambda r: r.loop_journal(LOOP))
    bodies = [KINDS.parse_body(open_envelope(r.envelope, None).body) for r in rows]
    refused = bodies[-1]
    assert refused.kind == "tool.refused"
    old = refused.data.model_copy(update={"host_tool": "ToolSearch", "tool": "host.ToolSearch"})
    assert objections([*bodies[:-1], refused.model_copy(update={"data": old})]) == []
    wrong = _recast(refused, refused.kind, old, "deny", "tool_denied")
    assert any("tool_refused" in o for o in objections([*bodies[:-1], wrong]))
