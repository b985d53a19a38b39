"""The kind registry: every receipt kind is declared once, with a fold step and a judge rule,
and a kind the judge has no rule for is a finding, never a pass.

- every `ReceiptKind` has exactly one spec, which folds (or opens a loop, or folds into a
  budget pool) and is judged;
- the sets the fold and the audit ask about are the registry's flags, nothing kept by hand;
- a journal holding a kind whose rule is missing draws `unjudged`, from the judge and from
  `verify` (a forged receipt of such a kind is never judged legal).
"""

from __future__ import annotations

import dataclasses

import pytest
from support import make_policy
from test_judge import _scripted, objections

from loopwarden.audit.database import audit
from loopwarden.kernel.state.events import ReceiptKind
from loopwarden.kinds import KINDS
from loopwarden.principals import ROLES


def test_every_receipt_kind_has_one_spec_that_folds_and_is_judged():
    assert set(KINDS) == set(ReceiptKind)
    for kind, spec in KINDS.items():
        assert spec.kind == kind
        if spec.opens is not None:
            assert spec.fold is None and spec.opens.judge is not None, kind
        elif spec.pool is not None:  # a budget pool's kind: its own fold step and judge rule
            assert spec.fold is None and spec.pool.fold and spec.pool.judge, kind
        else:
            assert spec.fold is not None and spec.judge is not None, kind
        assert spec.callers and spec.callers <= set(ROLES), kind
        assert KINDS.body_types[kind].model_fields["data"].annotation is spec.data


def test_the_kind_sets_are_the_registrys_flags():
    assert {
        ReceiptKind.CLAIM_REFUSED,
        ReceiptKind.REQUEST_REFUSED,
        ReceiptKind.TURN_REFUSED,
        ReceiptKind.TOOL_REFUSED,
        ReceiptKind.MODEL_REFUSED,
    } == KINDS.refusals
    assert {k for k in ReceiptKind if k.startswith(("host.", "tool."))} == KINDS.host_kinds
    assert KINDS.refusals | {
        ReceiptKind.TOOL_OBSERVED,
        ReceiptKind.MCP_TOOL_CHANGED,
        ReceiptKind.MODEL_CALLED,
    } == (KINDS.after_close)


def test_a_body_of_each_kind_carries_that_kinds_data_model_only():
    claimed = KINDS.body_types[ReceiptKind.TURN_CLAIMED]
    with pytest.raises(ValueError, match=r"turn\.claimed"):
        claimed.model_validate({"kind": "turn.reported"})


@pytest.fixture
def without_claim_rule(monkeypatch):
    """The registry as it would be had the claim's judge rule been forgotten."""
    spec = KINDS[ReceiptKind.TURN_CLAIMED]
    monkeypatch.setitem(
        KINDS._specs, ReceiptKind.TURN_CLAIMED, dataclasses.replace(spec, judge=None)
    )


@pytest.mark.anyio
async def test_a_kind_without_a_judge_rule_is_judged_unjudged(store, clock, without_claim_rule):
    journal = await _scripted(store, clock, make_policy(budgets={"max_turns": 2}))
    found = objections(journal)
    assert found == ["turn.claimed #2: unjudged", "turn.claimed #4: unjudged"]


@pytest.mark.anyio
async def test_verify_reports_receipts_of_a_kind_it_cannot_judge(store, clock, without_claim_rule):
    await _scripted(store, clock, make_policy(budgets={"max_turns": 2}))
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    unjudged = [f for f in report.findings if f.rule == "unjudged"]
    assert [(f.code, f.kind, f.seq) for f in unjudged] == [
        ("decision_illegal", "turn.claimed", 2),
        ("decision_illegal", "turn.claimed", 4),
    ]
    assert not report.clean


def test_every_budget_dimension_has_its_reason_code():
    from loopwarden.policy.budgets import BUDGET_DIMENSIONS
    from loopwarden.policy.decision import ReasonCode, budget_code

    assert {budget_code(d) for d in BUDGET_DIMENSIONS} == {
        c for c in ReasonCode if c.startswith("budget_exhausted:")
    }
    with pytest.raises(ValueError):
        budget_code("nonsense")
