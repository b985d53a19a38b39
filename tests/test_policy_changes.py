"""An operator replaces a loop's policy (`set_policy`, `loopwarden loop set-policy`): sealed as
`loop.policy_changed` with both digests, the loop decided and judged by the new policy from that
receipt on, budgets already used carried over; a refused change seals nothing."""

from __future__ import annotations

import pytest
from conftest import BUILDER, OPERATOR
from support import make_policy

from loopwarden.audit.database import audit
from loopwarden.errors import Conflict, Forbidden, PolicyError
from loopwarden.loops.lifecycle import cancel_loop, open_loop, set_policy
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.loader import policy_from_data
from loopwarden.turns.claim import claim
from loopwarden.turns.quota import quota
from loopwarden.turns.update import update

pytestmark = pytest.mark.anyio

NARROW = make_policy(
    budgets={"max_turns": 2}, tools={"allow": ["fs.read"]}, stop={"on_violation": "refuse_turn"}
)
WIDE = make_policy(budgets={"max_turns": 3}, tools={"allow": ["fs.read", "shell.run"]})


def _digest(policy: dict) -> str:
    return policy_digest(policy_from_data(policy, "test"))


async def _opened(store) -> None:
    request = {"objective": "o", "policy": NARROW, "loop_id": "P", "todos": [
        {"title": "a"}, {"title": "b"}, {"title": "c"}]}  # fmt: skip
    await open_loop(store, OPERATOR, request)


async def _turn(store, key: str, tools: list[str]) -> object:
    granted = await claim(store, BUILDER, {"loop_id": "P"})
    assert granted.granted, granted.reasons
    return await update(store, BUILDER, {
        "turn_id": granted.turn_id, "fence": granted.fence, "outcome": "progress",
        "summary": "s", "idempotency_key": key,
        "tools_used": [{"name": name, "count": 1} for name in tools]})  # fmt: skip


async def _kinds(store) -> list[str]:
    return [r.kind for r in await store.read(lambda r: r.loop_journal("P"))]


async def test_a_new_policy_governs_from_its_receipt_on_and_budgets_carry_over(store):
    await _opened(store)
    assert (await _turn(store, "k1", ["fs.read"])).accepted
    changed = await set_policy(
        store, OPERATOR, {"loop_id": "P", "policy": WIDE, "reason": "let it run tests"}
    )
    assert changed.changed and changed.previous_digest == _digest(NARROW)
    assert changed.policy_digest == _digest(WIDE)
    body = (await store.read(lambda r: r.loop_journal("P")))[-1]
    assert body.kind == "loop.policy_changed" and body.receipt_id == changed.receipt_id

    left = await quota(store, BUILDER, {"loop_id": "P"})
    assert left.allowed and left.policy_digest == _digest(WIDE)
    assert (left.budgets["turns"].used, left.budgets["turns"].limit) == (1, 3)  # carried over
    assert (await _turn(store, "k2", ["shell.run"])).accepted  # denied by the old policy

    state = await store.read(lambda r: r.loop_row("P"))
    assert state.policy_digest == _digest(WIDE) and state.totals.turns == 2
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]


async def test_the_old_policy_still_judges_what_came_before_the_change(store):
    """A report the new policy would refuse, sealed while the old one allowed it, stays legal;
    and a report the old policy refused stays refused after a change that would allow it."""
    await _opened(store)
    refused = await _turn(store, "k1", ["shell.run"])
    assert not refused.accepted and "tool_not_allowed" in {r.code for r in refused.reasons}
    await set_policy(store, OPERATOR, {"loop_id": "P", "policy": WIDE})
    assert (await _turn(store, "k2", ["shell.run"])).accepted
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], [f.as_dict() for f in report.findings]
    assert "loop.policy_changed" in await _kinds(store)


async def test_the_same_policy_again_seals_nothing(store):
    await _opened(store)
    before = await _kinds(store)
    again = await set_policy(store, OPERATOR, {"loop_id": "P", "policy": NARROW})
    assert not again.changed and again.receipt_id is None
    assert await _kinds(store) == before


@pytest.mark.parametrize(
    ("who", "policy", "error"),
    [
        ("agent", WIDE, Forbidden),
        ("operator", {**WIDE, "budgets": {}}, PolicyError),
        ("operator", {**WIDE, "pools": ["nowhere"]}, PolicyError),
        ("operator", {**WIDE, "tools": {"allow": ["a b"]}}, PolicyError),
    ],
    ids=["an-agent", "no-budget", "an-unknown-pool", "a-bad-pattern"],
)
async def test_a_refused_change_names_why_and_seals_nothing(store, who, policy, error):
    await _opened(store)
    before = await _kinds(store)
    caller = BUILDER if who == "agent" else OPERATOR
    with pytest.raises(error):
        await set_policy(store, caller, {"loop_id": "P", "policy": policy})
    assert await _kinds(store) == before


async def test_a_closed_loop_keeps_its_policy(store):
    await _opened(store)
    await cancel_loop(store, OPERATOR, {"loop_id": "P"})
    with pytest.raises(Conflict, match="cancelled"):
        await set_policy(store, OPERATOR, {"loop_id": "P", "policy": WIDE})


def test_the_cli_replaces_a_loops_policy_from_a_file(tmp_path):
    import json

    from support import cli

    home = tmp_path / "home"
    narrow, wide = tmp_path / "narrow.json", tmp_path / "wide.json"
    narrow.write_text(json.dumps(policy_document(policy_from_data(NARROW, "t"))))
    wide.write_text(json.dumps(WIDE))
    opened = cli("loop", "open", "--policy", str(narrow), "--objective", "o", "--todo", "a",
                 "--id", "P", "--home", str(home))  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    done = cli("loop", "set-policy", "P", "--policy", str(wide), "--reason", "wider",
               "--home", str(home), "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["changed"] and out["policy_digest"] == _digest(WIDE)
    text = cli("loop", "set-policy", "P", "--policy", str(wide), "--home", str(home))
    assert text.returncode == 0 and "already has this policy" in text.stdout


# --- policies that cannot work, said before they bite ------------------------------------------

UNWORKABLE = [
    (
        {"tools": {"allow": ["fs.read"], "commands": {"deny": ["git push*"]}}},
        "does not allow shell.run",
    ),
    (
        {"tools": {"allow": ["fs.read", "shell.run"]}, "observe": {"mode": "enforce"}},
        "fs.write",
    ),
    (
        {"tools": {"allow": ["tests.run"]}, "observe": {"mode": "enforce"}},
        "fs.read, fs.write, shell.run",
    ),
]
WORKABLE = [
    {"tools": {"allow": ["fs.*", "shell.run"], "commands": {"deny": ["git push*"]}},
     "observe": {"mode": "enforce"}},
    {"tools": {"allow": ["fs.read"]}, "observe": {"mode": "record"}},
    {"tools": {"allow": ["fs.read"], "approval": ["shell.run"], "commands": {"deny": ["rm -rf *"]}}},
]  # fmt: skip


@pytest.mark.parametrize(("sections", "named"), UNWORKABLE)
def test_policy_check_warns_of_settings_that_cannot_work_together(sections, named):
    from loopwarden.policy.lint import policy_notes

    notes = policy_notes(policy_from_data(make_policy(**sections), "t"))
    assert any(named in note for note in notes), notes


@pytest.mark.parametrize("sections", WORKABLE)
def test_policy_check_is_quiet_about_a_policy_that_works(sections):
    from loopwarden.policy.lint import unworkable

    assert unworkable(policy_from_data(make_policy(**sections), "t")) == []


def test_hook_install_says_how_to_turn_hooks_on_and_doctor_refuses_a_closed_loop(tmp_path):
    import json

    from support import cli

    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(NARROW))
    assert cli("loop", "open", "--policy", str(policy), "--objective", "o", "--todo", "a",
               "--id", "P", "--home", str(home)).returncode == 0  # fmt: skip
    installed = cli("hook", "install", "claude-code", "--loop", "P", "--agent", "builder",
                    "--home", str(home), cwd=project)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    said = " ".join(installed.stderr.split())
    assert "loopwarden loop policy P > policy.json" in said
    assert "loopwarden loop set-policy P --policy policy.json" in said
    shown = cli("loop", "policy", "P", "--home", str(home))
    assert json.loads(shown.stdout) == json.loads(json.dumps(policy_document(
        policy_from_data(NARROW, "t"))))  # fmt: skip
    assert cli("loop", "cancel", "P", "--home", str(home)).returncode == 0
    doctor = cli("hook", "doctor", "claude-code", "--home", str(home), cwd=project)
    assert doctor.returncode != 0 and "is cancelled" in " ".join(doctor.stdout.split())
