"""Policy model, loader, patterns, digest, budgets and the pure evaluator: table tests per rule."""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from loopwarden.errors import PolicyError
from loopwarden.policy.budgets import (
    BUDGET_DIMENSIONS,
    MICRO,
    Totals,
    budget_lines,
    exhausted,
    to_micros,
)
from loopwarden.policy.decision import Reason
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.evaluate import (
    ClaimFacts,
    ReportFacts,
    StopFacts,
    TodoAddFacts,
    evaluate_claim,
    evaluate_report,
    evaluate_stop,
    evaluate_todo_add,
    evaluate_tools,
    explain,
)
from loopwarden.policy.loader import format_for, parse_policy, policy_from_data
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.patterns import TOOL_NAME_RE, check_pattern, is_tool_name, matches

DIGEST = "sha256:" + "ab" * 32
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PROPERTY = settings(max_examples=150, deadline=None)

# --- the DESIGN.md example policy in its three formats ----------------------------------------

DESIGN_TOML = """
agents = ["builder", "reviewer"]        # or ["*"] for any authenticated agent

[tools]                                  # glob patterns over dotted tool names
allow = ["fs.read", "fs.write", "tests.run", "git.diff"]
deny = ["git.push"]                      # deny > approval > allow > default deny
approval = ["deploy.*"]                  # usable only with an approved, unconsumed approval

[budgets]                                # a missing key means no limit on that dimension
max_turns = 20
max_model_calls = 100
max_input_tokens = 500000
max_output_tokens = 100000
max_tool_calls = 200
max_cost_usd = 5.0
max_wall_seconds = 3600

[rate]
turns_per_window = 60
window_seconds = 3600

[claims]
lease_seconds = 900
max_active = 4
max_active_per_agent = 1
max_attempts = 3

[stop]
on_violation = "stop_loop"               # or "refuse_turn"
repeated_failure_limit = 3
require_evidence_for_completion = true
# deadline = "2026-12-31T00:00:00Z"

[todos]
agents_may_add = true
max_todos = 100
"""

DESIGN_YAML = """
agents: [builder, reviewer]
tools:
  allow: [fs.read, fs.write, tests.run, git.diff]
  deny: [git.push]
  approval: ["deploy.*"]
budgets:
  max_turns: 20
  max_model_calls: 100
  max_input_tokens: 500000
  max_output_tokens: 100000
  max_tool_calls: 200
  max_cost_usd: 5.0
  max_wall_seconds: 3600
rate:
  turns_per_window: 60
  window_seconds: 3600
claims:
  lease_seconds: 900
  max_active: 4
  max_active_per_agent: 1
  max_attempts: 3
stop:
  on_violation: stop_loop
  repeated_failure_limit: 3
  require_evidence_for_completion: true
todos:
  agents_may_add: true
  max_todos: 100
"""

DESIGN_JSON = json.dumps(tomllib.loads(DESIGN_TOML), indent=2)


def _policy(data: dict[str, Any]) -> LoopPolicy:
    return policy_from_data(copy.deepcopy(data))


def test_design_example_parses_to_the_same_digest_in_toml_yaml_and_json():
    toml_policy = parse_policy(DESIGN_TOML, "toml")
    yaml_policy = parse_policy(DESIGN_YAML, "yaml")
    json_policy = parse_policy(DESIGN_JSON, "json")
    assert toml_policy == yaml_policy == json_policy
    assert policy_digest(toml_policy) == policy_digest(yaml_policy) == policy_digest(json_policy)
    assert toml_policy.tools.allow == ("fs.read", "fs.write", "git.diff", "tests.run")
    assert toml_policy.budgets.max_cost_usd == 5.0
    assert toml_policy.rate.turns_per_window == 60
    assert toml_policy.stop.deadline is None


def test_design_example_with_deadline_parses_to_the_same_digest_in_all_formats():
    toml_text = DESIGN_TOML.replace(
        '# deadline = "2026-12-31T00:00:00Z"', "deadline = 2026-12-31T00:00:00Z"
    )
    yaml_text = DESIGN_YAML.replace(
        "  on_violation:", "  deadline: 2026-12-31T00:00:00Z\n  on_violation:"
    )
    data = json.loads(DESIGN_JSON)
    data["stop"]["deadline"] = "2026-12-31T00:00:00Z"
    policies = [
        parse_policy(toml_text, "toml"),
        parse_policy(yaml_text, "yaml"),
        parse_policy(json.dumps(data), "json"),
    ]
    assert {policy_digest(p) for p in policies} == {policy_digest(policies[0])}
    assert policies[0].stop.deadline == datetime(2026, 12, 31, tzinfo=UTC)
    assert policy_digest(policies[0]) != policy_digest(parse_policy(DESIGN_TOML, "toml"))


@pytest.mark.parametrize(
    ("filename", "fmt"),
    [
        ("policy.toml", "toml"),
        ("policy.yaml", "yaml"),
        ("policy.yml", "yaml"),
        ("policy.json", "json"),
        ("POLICY.TOML", "toml"),
        ("dir.d/p.Yml", "yaml"),
    ],
)
def test_format_for_maps_extension_to_format(filename, fmt):
    assert format_for(filename) == fmt


@pytest.mark.parametrize("filename", ["policy.txt", "policy", "policy.toml.bak", "toml", "p.jsonl"])
def test_format_for_refuses_other_extensions_naming_the_file(filename):
    with pytest.raises(PolicyError, match="unknown policy file extension") as info:
        format_for(filename)
    assert filename in str(info.value)


def test_parse_policy_refuses_an_unknown_format():
    with pytest.raises(PolicyError, match="unknown policy format 'xml'"):
        parse_policy("<policy/>", "xml")


# --- invalid policies: one PolicyError naming the field and the reason -------------------------

BUDGET = "[budgets]\nmax_turns = 5\n"

INVALID_POLICIES = {
    "unknown_top_level_key": (BUDGET + "[colour]\nshade = 1\n", ["colour", "unknown key"]),
    "unknown_budget_key": (BUDGET + "max_turn = 3\n", ["budgets.max_turn", "unknown key"]),
    "unknown_tools_key": (
        BUDGET + "[tools]\nallowed = ['fs.read']\n",
        ["tools.allowed", "unknown key"],
    ),
    "unknown_claims_key": (BUDGET + "[claims]\nlease = 3\n", ["claims.lease", "unknown key"]),
    "glob_with_brackets": (BUDGET + "[tools]\nallow = ['fs.[x]']\n", ["tools.allow", "'fs.[x]'"]),
    "glob_empty": (BUDGET + "[tools]\nallow = ['']\n", ["tools.allow", "empty tool pattern"]),
    "glob_empty_segment": (BUDGET + "[tools]\ndeny = ['a..b']\n", ["tools.deny", "'a..b'"]),
    "glob_trailing_dot": (
        BUDGET + "[tools]\napproval = ['deploy.']\n",
        ["tools.approval", "'deploy.'"],
    ),
    "glob_with_space": (BUDGET + "[tools]\nallow = ['fs read']\n", ["tools.allow", "'fs read'"]),
    "glob_too_long": (
        BUDGET + f"[tools]\nallow = ['{'x' * 129}']\n",
        ["tools.allow", "longer than 128"],
    ),
    "allow_and_deny": (
        BUDGET + "[tools]\nallow = ['git.push']\ndeny = ['git.push']\n",
        ["'git.push'", "tools.allow", "tools.deny"],
    ),
    "allow_and_approval": (
        BUDGET + "[tools]\nallow = ['deploy.*']\napproval = ['deploy.*']\n",
        ["'deploy.*'", "tools.allow", "tools.approval"],
    ),
    "deny_and_approval": (
        BUDGET + "[tools]\ndeny = ['x.y']\napproval = ['x.y']\n",
        ["'x.y'", "tools.deny", "tools.approval"],
    ),
    "per_agent_above_total": (
        BUDGET + "[claims]\nmax_active = 2\nmax_active_per_agent = 3\n",
        ["claims.max_active_per_agent (3)", "claims.max_active (2)"],
    ),
    "rate_without_window": (BUDGET + "[rate]\nturns_per_window = 3\n", ["rate", "both"]),
    "rate_without_turns": (BUDGET + "[rate]\nwindow_seconds = 60\n", ["rate", "both"]),
    "no_budget_section": ("agents = ['builder']\n", ["budgets", "at least one limit"]),
    "empty_budget_section": ("[budgets]\n", ["budgets", "at least one limit"]),
    "unknown_on_violation": (BUDGET + "[stop]\non_violation = 'explode'\n", ["stop.on_violation"]),
    "deadline_without_zone": (
        BUDGET + "[stop]\ndeadline = 2026-12-31T00:00:00\n",
        ["deadline", "time zone"],
    ),
    "negative_cost": (
        BUDGET + "max_cost_usd = -1.0\n",
        ["budgets.max_cost_usd", "greater than or equal"],
    ),
    "zero_turns": (
        "[budgets]\nmax_turns = 0\n",
        ["budgets.max_turns", "greater than or equal to 1"],
    ),
    "bad_agent_id": ("agents = ['bad agent']\n" + BUDGET, ["agents", "'bad agent'"]),
    "agents_not_a_list": ("agents = 'builder'\n" + BUDGET, ["agents", "tuple"]),
    "zero_max_todos": (BUDGET + "[todos]\nmax_todos = 0\n", ["todos.max_todos"]),
}


def _as_format(toml_text: str, fmt: str) -> str:
    data = tomllib.loads(toml_text)
    if fmt == "toml":
        return toml_text
    if fmt == "yaml":
        return yaml.safe_dump(data)
    return json.dumps(data, default=str)


@pytest.mark.parametrize("fmt", ["toml", "yaml", "json"])
@pytest.mark.parametrize("case", list(INVALID_POLICIES))
def test_invalid_policy_is_one_policy_error_naming_field_and_reason(case, fmt):
    text, fragments = INVALID_POLICIES[case]
    with pytest.raises(PolicyError) as info:
        parse_policy(_as_format(text, fmt), fmt, source=f"loop.{fmt}")
    message = str(info.value)
    assert message.startswith(f"loop.{fmt}: invalid policy: ")
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert info.value.code == "policy_invalid"
    assert info.value.__cause__ is None  # no pydantic traceback chained behind it


def test_base_of_the_invalid_table_is_itself_valid():
    # Guards the table above: each case fails because of its own addition, not the base.
    assert parse_policy(BUDGET, "toml").budgets.max_turns == 5
    assert parse_policy("agents = ['builder']\n" + BUDGET, "toml").agents == ("builder",)


@pytest.mark.parametrize(
    ("text", "fmt", "kind"),
    [
        ("[budgets\nmax_turns = 1\n", "toml", "malformed TOML"),
        ("max_turns = = 1\n", "toml", "malformed TOML"),
        ("budgets: [1,\n", "yaml", "malformed YAML"),
        ("budgets:\n  max_turns: 1\n bad: indent\n", "yaml", "malformed YAML"),
        ('{"budgets": {"max_turns": 1}', "json", "malformed JSON"),
        ("{'budgets': 1}", "json", "malformed JSON"),
    ],
)
def test_malformed_text_is_one_policy_error_naming_the_format(text, fmt, kind):
    with pytest.raises(PolicyError, match=kind) as info:
        parse_policy(text, fmt, source="loop.policy")
    assert str(info.value).startswith("loop.policy: ")
    assert "line" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ("- a\n- b\n", "yaml"),
        ("", "yaml"),
        ("[1, 2]", "json"),
        ('"policy"', "json"),
        ("null", "json"),
    ],
)
def test_policy_that_is_not_a_mapping_is_refused(text, fmt):
    with pytest.raises(PolicyError, match="table/mapping"):
        parse_policy(text, fmt)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_json_non_finite_budget_is_refused(value):
    with pytest.raises(PolicyError, match=r"budgets\.max_cost_usd"):
        parse_policy(f'{{"budgets": {{"max_cost_usd": {value}}}}}', "json")


# --- model defaults ----------------------------------------------------------------------------


def test_defaults_are_the_safe_values():
    policy = parse_policy(BUDGET, "toml")
    assert policy.agents == ()
    assert not policy.admits_agent("builder")
    assert (policy.tools.allow, policy.tools.deny, policy.tools.approval) == ((), (), ())
    assert not policy.rate.limited
    assert policy.todos.agents_may_add is False
    assert policy.stop.require_evidence_for_completion is True
    assert policy.budgets.limit("cost_usd") is None


def test_star_agent_admits_any_agent_and_named_agents_admit_only_themselves():
    star = _policy({"agents": ["*"], "budgets": {"max_turns": 1}})
    named = _policy({"agents": ["builder"], "budgets": {"max_turns": 1}})
    assert star.admits_agent("anyone")
    assert named.admits_agent("builder")
    assert not named.admits_agent("Builder")
    assert not named.admits_agent("*")


def test_lists_are_sorted_and_deduplicated():
    policy = _policy(
        {
            "agents": ["reviewer", "builder", "builder"],
            "tools": {"allow": ["tests.run", "fs.read", "fs.read"]},
            "budgets": {"max_turns": 1},
        }
    )
    assert policy.agents == ("builder", "reviewer")
    assert policy.tools.allow == ("fs.read", "tests.run")


# --- patterns --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("fs.read", "fs.read", True),
        ("fs.read", "fs.reads", False),
        ("fs.read", "xfs.read", False),
        ("fs.*", "fs.read", True),
        ("fs.*", "fs.read.deep", True),  # `*` crosses dots
        ("fs.*", "fs", False),
        ("*", "any.tool.at.all", True),
        ("*.read", "fs.read", True),
        ("*.read", "fs.read.more", False),
        ("a*b", "ab", True),
        ("a*b", "a.x.b", True),
        ("fs.rea?", "fs.read", True),
        ("fs.rea?", "fs.rea", False),  # `?` is exactly one character
        ("fs.rea?", "fs.readx", False),
        ("fs.??", "fs.ab", True),
        ("fs.??", "fs.abc", False),
        ("fs.read", "FS.read", False),  # case-sensitive
        ("FS.*", "fs.read", False),
        ("deploy.*", "Deploy.prod", False),
        ("git.push", "git.push.force", False),
    ],
)
def test_glob_matching(pattern, name, expected):
    assert matches(pattern, name) is expected


@pytest.mark.parametrize("pattern", ["fs.read", "*", "deploy.*", "a?b", "x-y_z.*.w", "A1.b2"])
def test_valid_patterns_pass_check_pattern(pattern):
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    "pattern", ["", "fs.[x]", "a..b", ".fs", "fs.", "fs read", "fs/read", "fs.r{e,a}d", "x" * 129]
)
def test_invalid_patterns_raise_value_error(pattern):
    with pytest.raises(ValueError):
        check_pattern(pattern)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fs.read", True),
        ("a", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("fs.*", False),
        ("fs..read", False),
        ("", False),
        ("fs read", False),
    ],
)
def test_is_tool_name(name, expected):
    assert is_tool_name(name) is expected


# --- explain: deny > approval > allow > default deny -----------------------------------------

EXPLAIN_POLICY = {
    "agents": ["builder"],
    "tools": {
        "allow": ["fs.*", "git.*", "deploy.staging"],
        "deny": ["git.push", "fs.secret*"],
        "approval": ["deploy.*"],
    },
    "budgets": {"max_turns": 10},
}


@pytest.mark.parametrize(
    ("tool", "rule", "pattern", "effect"),
    [
        ("fs.read", "allow", "fs.*", "allow"),
        ("git.diff", "allow", "git.*", "allow"),
        ("git.push", "deny", "git.push", "deny"),  # deny beats allow git.*
        ("fs.secrets", "deny", "fs.secret*", "deny"),  # deny beats allow fs.*
        ("deploy.prod", "approval", "deploy.*", "approval"),
        ("deploy.staging", "approval", "deploy.*", "approval"),  # approval beats allow
        ("net.fetch", "default", None, "deny"),
        ("FS.read", "default", None, "deny"),
    ],
)
def test_explain_reports_rule_and_deciding_pattern(tool, rule, pattern, effect):
    verdict = explain(_policy(EXPLAIN_POLICY), tool)
    assert (verdict.rule, verdict.pattern, verdict.effect) == (rule, pattern, effect)
    if pattern is not None:
        assert repr(pattern) in verdict.explain()
    else:
        assert "default deny" in verdict.explain()


def test_deny_beats_approval_for_the_same_tool():
    policy = _policy(
        {"tools": {"deny": ["deploy.prod"], "approval": ["deploy.*"]}, "budgets": {"max_turns": 1}}
    )
    assert explain(policy, "deploy.prod").rule == "deny"
    assert explain(policy, "deploy.dev").rule == "approval"


@pytest.mark.parametrize(
    ("tools", "approved", "codes"),
    [
        (["fs.read", "git.diff"], set(), ()),
        (["git.push"], set(), ("tool_denied",)),
        (["net.fetch"], set(), ("tool_not_allowed",)),
        (["deploy.prod"], set(), ("approval_required",)),
        (["deploy.prod"], {"deploy.prod"}, ()),
        (["deploy.prod"], {"deploy.dev"}, ("approval_required",)),
        (["git.push"], {"git.push"}, ("tool_denied",)),  # an approval never lifts a deny
        (["fs.read", "git.push", "net.fetch"], set(), ("tool_denied", "tool_not_allowed")),
    ],
)
def test_evaluate_tools(tools, approved, codes):
    decision = evaluate_tools(_policy(EXPLAIN_POLICY), tools, frozenset(approved), digest=DIGEST)
    assert decision.codes == codes
    assert decision.allowed is (codes == ())
    assert decision.policy_digest == DIGEST


# --- claims ----------------------------------------------------------------------------------

CLAIM_POLICY = {
    "agents": ["builder", "reviewer"],
    "tools": {"allow": ["fs.read"]},
    "budgets": {
        "max_turns": 10,
        "max_model_calls": 100,
        "max_input_tokens": 1000,
        "max_output_tokens": 500,
        "max_tool_calls": 50,
        "max_cost_usd": 5.0,
        "max_wall_seconds": 3600,
        "max_cache_write_tokens": 2000,
        "max_cache_read_tokens": 8000,
    },
    "rate": {"turns_per_window": 5, "window_seconds": 60},
    "claims": {"max_active": 3, "max_active_per_agent": 2},
    "stop": {"deadline": "2026-06-01T00:00:00Z"},
}
DEADLINE = datetime(2026, 6, 1, tzinfo=UTC)

CLAIM_FACTS = ClaimFacts(
    agent="builder",
    status="active",
    now=NOW,
    totals=Totals(),
    active=0,
    active_for_agent=0,
    claims_in_window=0,
)

# (name, facts that trigger the reason, facts just short of it, the reason code)
CLAIM_RULES = [
    ("paused", {"status": "paused"}, {"status": "active"}, "loop_not_active"),
    ("completed", {"status": "completed"}, {"status": "active"}, "loop_not_active"),
    (
        "deadline",
        {"now": DEADLINE},
        {"now": DEADLINE - timedelta(microseconds=1)},
        "deadline_passed",
    ),
    ("stranger", {"agent": "mallory"}, {"agent": "reviewer"}, "agent_not_allowed"),
    ("turns", {"totals": Totals(turns=10)}, {"totals": Totals(turns=9)}, "budget_exhausted:turns"),
    (
        "model_calls",
        {"totals": Totals(model_calls=100)},
        {"totals": Totals(model_calls=99)},
        "budget_exhausted:model_calls",
    ),
    (
        "input_tokens",
        {"totals": Totals(input_tokens=1000)},
        {"totals": Totals(input_tokens=999)},
        "budget_exhausted:input_tokens",
    ),
    (
        "output_tokens",
        {"totals": Totals(output_tokens=501)},
        {"totals": Totals(output_tokens=499)},
        "budget_exhausted:output_tokens",
    ),
    (
        "tool_calls",
        {"totals": Totals(tool_calls=50)},
        {"totals": Totals(tool_calls=49)},
        "budget_exhausted:tool_calls",
    ),
    (
        "cost_usd",
        {"totals": Totals(cost_micros=5 * MICRO)},
        {"totals": Totals(cost_micros=5 * MICRO - 1)},
        "budget_exhausted:cost_usd",
    ),
    (
        "wall_seconds",
        {"totals": Totals(wall_micros=3600 * MICRO)},
        {"totals": Totals(wall_micros=3600 * MICRO - 1)},
        "budget_exhausted:wall_seconds",
    ),
    (
        "cache_write_tokens",
        {"totals": Totals(cache_write_tokens=2000)},
        {"totals": Totals(cache_write_tokens=1999)},
        "budget_exhausted:cache_write_tokens",
    ),
    (
        "cache_read_tokens",
        {"totals": Totals(cache_read_tokens=8000)},
        {"totals": Totals(cache_read_tokens=7999)},
        "budget_exhausted:cache_read_tokens",
    ),
    ("rate", {"claims_in_window": 5}, {"claims_in_window": 4}, "rate_limited"),
    ("leases", {"active": 3}, {"active": 2}, "lease_limit"),
    (
        "agent_leases",
        {"active": 2, "active_for_agent": 2},
        {"active": 2, "active_for_agent": 1},
        "agent_lease_limit",
    ),
]


@pytest.mark.parametrize(
    ("name", "trigger", "short", "code"), CLAIM_RULES, ids=[r[0] for r in CLAIM_RULES]
)
def test_claim_rule_denies_exactly_when_triggered(name, trigger, short, code):
    policy = _policy(CLAIM_POLICY)
    denied = evaluate_claim(policy, replace(CLAIM_FACTS, **trigger), digest=DIGEST)
    allowed = evaluate_claim(policy, replace(CLAIM_FACTS, **short), digest=DIGEST)
    assert denied.effect == "deny"
    assert denied.codes == (code,)
    assert denied.policy_digest == DIGEST
    assert allowed.effect == "allow", allowed.codes
    assert allowed.codes == ()


def test_claim_rule_table_covers_every_budget_dimension():
    covered = {
        code.split(":")[1] for *_, code in CLAIM_RULES if code.startswith("budget_exhausted:")
    }
    assert covered == set(BUDGET_DIMENSIONS)


def test_claim_collects_every_reason_that_denies():
    facts = replace(
        CLAIM_FACTS,
        agent="mallory",
        status="paused",
        now=DEADLINE,
        totals=Totals(turns=10, cost_micros=5 * MICRO),
        active=3,
        active_for_agent=2,
        claims_in_window=5,
    )
    decision = evaluate_claim(_policy(CLAIM_POLICY), facts, digest=DIGEST)
    assert decision.codes == (
        "loop_not_active",
        "deadline_passed",
        "agent_not_allowed",
        "budget_exhausted:turns",
        "budget_exhausted:cost_usd",
        "rate_limited",
        "lease_limit",
        "agent_lease_limit",
    )


def test_claim_without_rate_or_deadline_never_rate_limits_or_expires():
    data = copy.deepcopy(CLAIM_POLICY)
    del data["rate"], data["stop"]
    facts = replace(CLAIM_FACTS, claims_in_window=10**6, now=datetime(2999, 1, 1, tzinfo=UTC))
    assert evaluate_claim(_policy(data), facts, digest=DIGEST).codes == ()


def test_claim_with_unset_budget_dimension_never_exhausts_it():
    data = copy.deepcopy(CLAIM_POLICY)
    data["budgets"] = {"max_turns": 10}
    facts = replace(CLAIM_FACTS, totals=Totals(model_calls=10**9, cost_micros=10**15))
    assert evaluate_claim(_policy(data), facts, digest=DIGEST).codes == ()


def test_zero_budget_is_exhausted_from_the_start():
    data = {"agents": ["builder"], "budgets": {"max_turns": 10, "max_cost_usd": 0}}
    decision = evaluate_claim(_policy(data), CLAIM_FACTS, digest=DIGEST)
    assert decision.codes == ("budget_exhausted:cost_usd",)


# --- reports ---------------------------------------------------------------------------------

REPORT_POLICY = {
    "agents": ["builder", "reviewer"],
    "tools": {"allow": ["fs.*"], "deny": ["git.push"], "approval": ["deploy.*"]},
    "budgets": {"max_turns": 10},
}

REPORT_FACTS = ReportFacts(
    agent="builder",
    loop_status="active",
    turn_agent="builder",
    turn_status="open",
    turn_fence=3,
    todo_fence=3,
    given_fence=3,
    lease_expires_at=NOW + timedelta(minutes=5),
    now=NOW,
    outcome="progress",
    has_evidence=False,
    tools=("fs.read",),
    approved_tools=frozenset(),
)

REPORT_RULES = [
    ("closed_turn", {"turn_status": "reported"}, {"turn_status": "open"}, "turn_closed"),
    ("old_fence", {"given_fence": 2}, {"given_fence": 3}, "stale_fence"),
    ("superseded_turn", {"todo_fence": 4}, {"todo_fence": 3}, "stale_fence"),
    (
        "lease",
        {"now": NOW + timedelta(minutes=5, microseconds=1)},
        {"now": NOW + timedelta(minutes=5)},
        "lease_expired",
    ),
    ("loop_stopped", {"loop_status": "stopped"}, {"loop_status": "paused"}, "loop_not_active"),
    ("denied_tool", {"tools": ("git.push",)}, {"tools": ("fs.write",)}, "tool_denied"),
    ("unlisted_tool", {"tools": ("net.fetch",)}, {"tools": ()}, "tool_not_allowed"),
    (
        "approval",
        {"tools": ("deploy.prod",)},
        {"tools": ("deploy.prod",), "approved_tools": frozenset({"deploy.prod"})},
        "approval_required",
    ),
    (
        "evidence",
        {"outcome": "completed"},
        {"outcome": "completed", "has_evidence": True},
        "evidence_required",
    ),
    (
        "approval_problem",
        {"approval_problems": (Reason("approval_invalid", "approval appr-1 was rejected"),)},
        {"approval_problems": ()},
        "approval_invalid",
    ),
]


@pytest.mark.parametrize(
    ("name", "trigger", "short", "code"), REPORT_RULES, ids=[r[0] for r in REPORT_RULES]
)
def test_report_rule_denies_exactly_when_triggered(name, trigger, short, code):
    policy = _policy(REPORT_POLICY)
    denied = evaluate_report(policy, replace(REPORT_FACTS, **trigger), digest=DIGEST)
    allowed = evaluate_report(policy, replace(REPORT_FACTS, **short), digest=DIGEST)
    assert denied.codes == (code,)
    assert allowed.codes == ()
    assert allowed.allowed


def test_report_by_another_agent_gets_not_turn_owner_and_nothing_else():
    facts = replace(
        REPORT_FACTS,
        agent="mallory",
        loop_status="stopped",
        turn_status="expired",
        given_fence=1,
        now=NOW + timedelta(days=1),
        tools=("git.push", "net.fetch"),
        outcome="completed",
    )
    assert evaluate_report(_policy(REPORT_POLICY), facts, digest=DIGEST).codes == (
        "not_turn_owner",
    )


def test_expired_lease_is_not_reported_for_a_turn_already_closed():
    facts = replace(REPORT_FACTS, turn_status="expired", now=NOW + timedelta(days=1))
    assert evaluate_report(_policy(REPORT_POLICY), facts, digest=DIGEST).codes == ("turn_closed",)


@pytest.mark.parametrize("outcome", ["progress", "failed", "blocked"])
def test_evidence_is_required_only_for_completed_outcomes(outcome):
    facts = replace(REPORT_FACTS, outcome=outcome, has_evidence=False)
    assert evaluate_report(_policy(REPORT_POLICY), facts, digest=DIGEST).codes == ()


def test_evidence_is_not_required_when_the_policy_does_not_require_it():
    data = {**REPORT_POLICY, "stop": {"require_evidence_for_completion": False}}
    facts = replace(REPORT_FACTS, outcome="completed", has_evidence=False)
    assert evaluate_report(_policy(data), facts, digest=DIGEST).codes == ()


def test_report_collects_liveness_tool_and_evidence_reasons_together():
    facts = replace(
        REPORT_FACTS,
        turn_status="reported",
        given_fence=2,
        tools=("git.push", "deploy.prod"),
        outcome="completed",
    )
    assert evaluate_report(_policy(REPORT_POLICY), facts, digest=DIGEST).codes == (
        "turn_closed",
        "stale_fence",
        "tool_denied",
        "approval_required",
        "evidence_required",
    )


# --- todo_add --------------------------------------------------------------------------------

TODO_POLICY = {
    "agents": ["builder"],
    "budgets": {"max_turns": 10},
    "todos": {"agents_may_add": True, "max_todos": 3},
}
TODO_FACTS = TodoAddFacts(agent="builder", is_operator=False, loop_status="active", todo_count=0)


@pytest.mark.parametrize(
    ("policy_todos", "changes", "codes"),
    [
        ({}, {}, ()),
        ({}, {"loop_status": "paused"}, ()),
        ({}, {"loop_status": "completed"}, ("loop_not_active",)),
        ({}, {"loop_status": "stopped"}, ("loop_not_active",)),
        ({}, {"loop_status": "cancelled"}, ("loop_not_active",)),
        ({}, {"agent": "mallory"}, ("agent_not_allowed",)),
        ({}, {"agent": "mallory", "is_operator": True}, ()),
        ({"agents_may_add": False}, {}, ("todos_not_addable",)),
        ({"agents_may_add": False}, {"agent": "alice", "is_operator": True}, ()),
        ({}, {"todo_count": 2}, ()),
        ({}, {"todo_count": 3}, ("todo_limit",)),
        ({}, {"todo_count": 2, "adding": 2}, ("todo_limit",)),
        ({}, {"todo_count": 0, "adding": 3}, ()),
        ({}, {"todo_count": 3, "is_operator": True}, ("todo_limit",)),
        (
            {"agents_may_add": False},
            {"agent": "mallory", "loop_status": "stopped", "todo_count": 3},
            ("loop_not_active", "agent_not_allowed", "todos_not_addable", "todo_limit"),
        ),
    ],
)
def test_evaluate_todo_add(policy_todos, changes, codes):
    data = copy.deepcopy(TODO_POLICY)
    data["todos"].update(policy_todos)
    decision = evaluate_todo_add(_policy(data), replace(TODO_FACTS, **changes), digest=DIGEST)
    assert decision.codes == codes


# --- stop rules ------------------------------------------------------------------------------

STOP_POLICY = {
    "agents": ["builder"],
    "budgets": {"max_turns": 5, "max_model_calls": 10, "max_cost_usd": 1.0},
    "stop": {"deadline": "2026-06-01T00:00:00Z", "repeated_failure_limit": 3},
}
QUIET = StopFacts(
    status="active",
    totals=Totals(turns=1),
    open_turns=0,
    todos_total=4,
    todos_done=1,
    failure_streak=0,
    now=NOW,
)
EVERYTHING_FIRES = replace(
    QUIET,
    totals=Totals(turns=5, model_calls=10, cost_micros=MICRO),
    todos_done=4,
    failure_streak=3,
    now=DEADLINE,
)


def _stop_code(facts: StopFacts, data: dict[str, Any] = STOP_POLICY) -> str | None:
    reason = evaluate_stop(_policy(data), facts)
    return None if reason is None else reason.code


def test_quiet_loop_does_not_stop():
    assert _stop_code(QUIET) is None


@pytest.mark.parametrize(
    ("facts", "code"),
    [
        (EVERYTHING_FIRES, "all_todos_done"),
        (replace(EVERYTHING_FIRES, todos_done=3), "budget_exhausted:model_calls"),
        (
            replace(EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=5, cost_micros=MICRO)),
            "budget_exhausted:cost_usd",
        ),
        (replace(EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=5)), "max_turns"),
        (replace(EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=5), open_turns=1), "deadline"),
        (replace(EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=4)), "deadline"),
        (
            replace(EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=4), now=NOW),
            "repeated_failure",
        ),
        (
            replace(
                EVERYTHING_FIRES, todos_done=3, totals=Totals(turns=4), now=NOW, failure_streak=2
            ),
            None,
        ),
    ],
    ids=[
        "todos-first",
        "budget-next",
        "budget-cost",
        "max-turns-when-no-open-turn",
        "max-turns-waits-for-open-turn",
        "deadline",
        "repeated-failure",
        "nothing",
    ],
)
def test_stop_rules_fire_in_precedence_order(facts, code):
    assert _stop_code(facts) == code


def test_stop_never_reports_turns_as_a_budget_dimension():
    facts = replace(QUIET, totals=Totals(turns=7), open_turns=2)
    assert _stop_code(facts) is None


def test_stop_with_no_todos_is_not_all_todos_done():
    assert _stop_code(replace(QUIET, todos_total=0, todos_done=0)) is None


@pytest.mark.parametrize("status", ["completed", "stopped", "cancelled"])
def test_closed_loop_never_stops_again(status):
    assert _stop_code(replace(EVERYTHING_FIRES, status=status)) is None


def test_paused_loop_still_stops():
    assert _stop_code(replace(EVERYTHING_FIRES, status="paused")) == "all_todos_done"


# --- fail closed -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "evaluate",
    [
        lambda p: evaluate_claim(p, None, digest=DIGEST),
        lambda p: evaluate_claim(p, replace(CLAIM_FACTS, now=datetime(2026, 1, 1)), digest=DIGEST),
        lambda p: evaluate_claim(p, replace(CLAIM_FACTS, totals=None), digest=DIGEST),
        lambda p: evaluate_report(p, replace(REPORT_FACTS, tools=None), digest=DIGEST),
        lambda p: evaluate_report(p, replace(REPORT_FACTS, lease_expires_at=None), digest=DIGEST),
        lambda p: evaluate_todo_add(p, replace(TODO_FACTS, todo_count="3"), digest=DIGEST),
        lambda p: evaluate_tools(p, None, digest=DIGEST),
    ],
    ids=[
        "claim-no-facts",
        "claim-naive-time",
        "claim-no-totals",
        "report-no-tools",
        "report-no-lease",
        "todo-count-text",
        "tools-none",
    ],
)
def test_evaluator_given_broken_facts_denies_with_evaluation_error(evaluate):
    decision = evaluate(_policy({**CLAIM_POLICY, "todos": {"agents_may_add": True}}))
    assert decision.effect == "deny"
    assert decision.codes == ("evaluation_error",)
    assert decision.policy_digest == DIGEST


def test_evaluate_stop_given_broken_facts_fails_closed_instead_of_raising():
    reason = evaluate_stop(_policy(STOP_POLICY), replace(QUIET, totals=None))
    assert reason is not None
    assert reason.code == "evaluation_error"


# --- budgets in micro-units ------------------------------------------------------------------


def test_three_charges_of_a_tenth_sum_to_exactly_three_hundred_thousand_micros():
    charge = Totals(cost_micros=to_micros(0.1))
    total = Totals().plus(charge).plus(charge).plus(charge)
    assert total.units("cost_usd") == 300_000
    assert total.used("cost_usd") == 0.3


def test_ten_charges_of_a_tenth_exhaust_a_one_dollar_budget_exactly():
    # Summing the floats gives 0.9999999999999999 and would leave the budget open.
    policy = _policy({"budgets": {"max_cost_usd": 1.0}})
    total = Totals()
    for _ in range(10):
        total = total.plus(Totals(cost_micros=to_micros(0.1)))
    assert exhausted(policy.budgets, total) == ["cost_usd"]
    assert exhausted(policy.budgets, Totals(cost_micros=total.units("cost_usd") - 1)) == []


@pytest.mark.parametrize(
    ("value", "micros"),
    # 2.01 * 1e6 is 2009999.9999999998 in floats: micros round, they never truncate.
    [(0.1, 100_000), (2.01, 2_010_000), (5.0, 5_000_000), (0.000001, 1), (1e9, 10**15), (0.0, 0)],
)
def test_to_micros(value, micros):
    assert to_micros(value) == micros


def test_budget_lines_report_limit_used_and_remaining_per_dimension():
    policy = _policy({"budgets": {"max_turns": 20, "max_cost_usd": 5.0, "max_wall_seconds": 10}})
    lines = budget_lines(
        policy.budgets, Totals(turns=3, cost_micros=300_000, wall_micros=12 * MICRO)
    )
    assert list(lines) == list(BUDGET_DIMENSIONS)
    assert (lines["turns"].limit, lines["turns"].used, lines["turns"].remaining) == (20, 3, 17)
    assert (lines["cost_usd"].used, lines["cost_usd"].remaining) == (0.3, 4.7)
    assert lines["wall_seconds"].remaining == 0  # over the limit: never negative
    assert (lines["model_calls"].limit, lines["model_calls"].remaining) == (None, None)


def test_exhausted_lists_dimensions_in_display_order():
    policy = _policy(CLAIM_POLICY)
    totals = Totals(turns=10, wall_micros=3600 * MICRO, model_calls=100)
    assert exhausted(policy.budgets, totals) == ["turns", "model_calls", "wall_seconds"]


# --- properties: deny wins, empty allow allows nothing ---------------------------------------

TOOL_NAMES = st.from_regex(TOOL_NAME_RE, fullmatch=True).filter(lambda n: len(n) <= 60)
RANDOM_PATTERNS = st.from_regex(r"^[a-z*?]{1,4}(\.[a-z*?]{1,4}){0,2}$", fullmatch=True)


@st.composite
def patterns_matching(draw, name: str) -> str:
    kind = draw(st.sampled_from(["exact", "question", "prefix", "suffix", "star"]))
    if kind == "exact":
        return name
    if kind == "question":
        positions = draw(st.sets(st.integers(0, len(name) - 1), max_size=3))
        return "".join("?" if i in positions and ch != "." else ch for i, ch in enumerate(name))
    if kind == "prefix":
        return name[: draw(st.integers(0, len(name)))] + "*"
    if kind == "suffix":
        return "*" + name[draw(st.integers(0, len(name))) :]
    return "*"


@st.composite
def deny_cases(draw):
    name = draw(TOOL_NAMES)
    deny = draw(patterns_matching(name))
    others = st.lists(patterns_matching(name) | RANDOM_PATTERNS, max_size=4)
    allow = [p for p in draw(others) if p != deny]
    approval = [p for p in draw(others) if p != deny and p not in allow]
    extra_deny = [
        p for p in draw(st.lists(RANDOM_PATTERNS, max_size=3)) if p not in allow + approval
    ]
    return name, deny, allow, approval, extra_deny


@PROPERTY
@given(deny_cases())
def test_deny_always_wins_whatever_allow_and_approval_contain(case):
    name, deny, allow, approval, extra_deny = case
    assert matches(deny, name)
    policy = _policy(
        {
            "tools": {"allow": allow, "deny": [deny, *extra_deny], "approval": approval},
            "budgets": {"max_turns": 1},
        }
    )
    verdict = explain(policy, name)
    assert verdict.rule == "deny"
    assert matches(verdict.pattern, name)
    decision = evaluate_tools(policy, [name], frozenset({name}), digest=DIGEST)
    assert decision.codes == ("tool_denied",)


@PROPERTY
@given(name=TOOL_NAMES)
def test_empty_allow_with_nothing_else_default_denies_every_tool(name):
    policy = _policy({"agents": ["*"], "budgets": {"max_turns": 1}})
    verdict = explain(policy, name)
    assert (verdict.rule, verdict.pattern) == ("default", None)
    assert evaluate_tools(policy, [name], digest=DIGEST).codes == ("tool_not_allowed",)


@PROPERTY
@given(
    name=TOOL_NAMES,
    deny=st.lists(RANDOM_PATTERNS, max_size=3, unique=True),
    approval=st.lists(RANDOM_PATTERNS, max_size=3, unique=True),
)
def test_empty_allow_never_allows_a_tool_without_approval(name, deny, approval):
    approval = [p for p in approval if p not in deny]
    policy = _policy({"tools": {"deny": deny, "approval": approval}, "budgets": {"max_turns": 1}})
    assert explain(policy, name).rule != "allow"
    assert not evaluate_tools(policy, [name], digest=DIGEST).allowed


# --- properties: the digest ------------------------------------------------------------------

FULL_POLICY: dict[str, Any] = {
    "agents": ["builder", "reviewer"],
    "tools": {"allow": ["fs.read", "fs.write"], "deny": ["git.push"], "approval": ["deploy.*"]},
    "budgets": {
        "max_turns": 20,
        "max_model_calls": 100,
        "max_input_tokens": 500000,
        "max_output_tokens": 100000,
        "max_tool_calls": 200,
        "max_cost_usd": 5.0,
        "max_wall_seconds": 3600,
    },
    "rate": {"turns_per_window": 60, "window_seconds": 3600},
    "claims": {"lease_seconds": 900, "max_active": 4, "max_active_per_agent": 1, "max_attempts": 3},
    "stop": {
        "on_violation": "stop_loop",
        "repeated_failure_limit": 3,
        "require_evidence_for_completion": True,
        "deadline": "2026-12-31T00:00:00Z",
    },
    "todos": {"agents_may_add": True, "max_todos": 100},
}

SCALAR_CHANGES = [
    ("budgets", "max_turns", 21),
    ("budgets", "max_model_calls", 101),
    ("budgets", "max_input_tokens", 500001),
    ("budgets", "max_output_tokens", 100001),
    ("budgets", "max_tool_calls", 201),
    ("budgets", "max_cost_usd", 5.01),
    ("budgets", "max_wall_seconds", 3600.5),
    ("budgets", "max_cache_write_tokens", 1000),
    ("budgets", "max_cache_read_tokens", 1000),
    ("rate", "turns_per_window", 61),
    ("rate", "window_seconds", 3601),
    ("claims", "lease_seconds", 901),
    ("claims", "max_active", 5),
    ("claims", "max_active_per_agent", 2),
    ("claims", "max_attempts", 4),
    ("stop", "on_violation", "refuse_turn"),
    ("stop", "repeated_failure_limit", 4),
    ("stop", "require_evidence_for_completion", False),
    ("stop", "deadline", "2026-12-31T00:00:01Z"),
    ("todos", "agents_may_add", False),
    ("todos", "max_todos", 101),
    ("tools", "allow", ["fs.read", "fs.write", "tests.run"]),
    ("tools", "deny", ["git.push", "git.reset"]),
    ("tools", "approval", ["deploy.*", "db.migrate"]),
    (None, "agents", ["builder", "reviewer", "tester"]),
    ("tools", "commands", {"deny": ["git push*"]}),
    ("tools", "arguments", [{"tool": "mcp.fs.*", "argument": "path", "under": ["/srv"]}]),
    (None, "observe", {"mode": "record"}),
    (None, "pools", ["team-a"]),
    (None, "model", {"allow": ["claude-*"]}),
    (None, "gateway", {"pin": "first_sight"}),
]


def test_digest_change_table_covers_every_field_of_every_section():
    covered = {(section, field) for section, field, _ in SCALAR_CHANGES}
    expected = set()
    for name, info in LoopPolicy.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            expected |= {(name, field) for field in sub.model_fields}
        else:
            expected.add((None, name))
    assert covered == expected


@pytest.mark.parametrize(
    ("section", "field", "value"), SCALAR_CHANGES, ids=[f"{s}.{f}" for s, f, _ in SCALAR_CHANGES]
)
def test_changing_any_single_field_changes_the_digest(section, field, value):
    changed = copy.deepcopy(FULL_POLICY)
    (changed[section] if section else changed)[field] = value
    assert policy_digest(_policy(changed)) != policy_digest(_policy(FULL_POLICY))


@pytest.mark.parametrize("field", list(FULL_POLICY["budgets"]))
def test_removing_a_budget_limit_changes_the_digest(field):
    changed = copy.deepcopy(FULL_POLICY)
    del changed["budgets"][field]
    assert policy_digest(_policy(changed)) != policy_digest(_policy(FULL_POLICY))


def _shuffled(value: Any, rnd: Any) -> Any:
    """The same policy with every mapping's key order and every list's order shuffled."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {key: _shuffled(value[key], rnd) for key in keys}
    if isinstance(value, list):
        items = [_shuffled(item, rnd) for item in value]
        rnd.shuffle(items)
        return items
    return value


@st.composite
def policy_dicts(draw):
    agents = draw(st.lists(st.from_regex(r"^[a-z][a-z0-9_-]{0,10}$", fullmatch=True), max_size=4))
    pool = draw(st.lists(RANDOM_PATTERNS, max_size=9, unique=True))
    cut1, cut2 = sorted(draw(st.lists(st.integers(0, len(pool)), min_size=2, max_size=2)))
    budgets = draw(
        st.fixed_dictionaries(
            {"max_turns": st.integers(1, 1000)},
            optional={
                "max_model_calls": st.integers(0, 10**6),
                "max_cost_usd": st.floats(0, 1000, allow_nan=False),
                "max_wall_seconds": st.floats(0, 10**6, allow_nan=False),
            },
        )
    )
    max_active = draw(st.integers(1, 50))
    return {
        "agents": agents,
        "tools": {"allow": pool[:cut1], "deny": pool[cut1:cut2], "approval": pool[cut2:]},
        "budgets": budgets,
        "claims": {
            "max_active": max_active,
            "max_active_per_agent": draw(st.integers(1, max_active)),
        },
        "todos": {"agents_may_add": draw(st.booleans())},
    }


@PROPERTY
@given(data=policy_dicts(), rnd=st.randoms(use_true_random=False), dupes=st.booleans())
def test_digest_is_stable_under_key_order_and_list_order(data, rnd, dupes):
    shuffled = _shuffled(data, rnd)
    if dupes:  # repeating an entry changes no decision either
        for key in ("allow", "deny", "approval"):
            shuffled["tools"][key] = shuffled["tools"][key] * 2
        shuffled["agents"] = shuffled["agents"] * 2
    assert policy_digest(_policy(shuffled)) == policy_digest(_policy(data))


@PROPERTY
@given(data=policy_dicts(), rnd=st.randoms(use_true_random=False))
def test_digest_is_the_same_from_json_yaml_and_dict(data, rnd):
    shuffled = _shuffled(data, rnd)
    from_json = parse_policy(json.dumps(shuffled), "json")
    from_yaml = parse_policy(yaml.safe_dump(shuffled, sort_keys=False), "yaml")
    assert policy_digest(from_json) == policy_digest(from_yaml) == policy_digest(_policy(data))


@pytest.mark.parametrize("key", ["max_turns", "max_cost_usd", "max_wall_seconds"])
def test_an_explicit_null_budget_is_refused_not_read_as_unlimited(key):
    document = {"agents": ["a"], "budgets": {"max_turns": 5, key: None}}
    with pytest.raises(PolicyError, match=f"budgets.{key} is null"):
        policy_from_data(document)


def test_the_normalized_document_leaves_unset_limits_out_and_parses_back():
    policy = policy_from_data({"agents": ["a"], "budgets": {"max_turns": 5}})
    document = policy_document(policy)
    assert document["budgets"] == {"max_turns": 5}
    assert "deadline" not in document["stop"]
    assert policy_from_data(document) == policy
