"""The operations core: one declaration per operation, and every surface derived from it.

- every MCP tool's input schema is exactly its request model's, and its output schema its
  result model's (what agents read is what the server enforces);
- the limits that used to drift between copies are in the advertised schema;
- the typed agent client takes exactly each request model's fields;
- errors carry their code end to end (text, structured content, `ToolCallError.code`);
- the runner's order: role, then visibility, then idempotency;
- a database written by release 0.1.0 verifies clean and keeps working.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, STRANGER
from mcp import Client
from support import cli, cli_env

from loopwarden.audit.database import audit
from loopwarden.catalog import OPERATIONS, TOOLS
from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.clock import ManualClock
from loopwarden.errors import Forbidden, InvalidInput, NotFound
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.policy.evaluate import evaluate_claim
from loopwarden.policy.model import LoopPolicy
from loopwarden.server.app import build_server
from loopwarden.server.schemas import slim
from loopwarden.server.settings import Settings
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.quota import QuotaRequest, quota

RELEASE_0_1_0 = Path(__file__).parent / "fixtures" / "release-0.1.0"

pytestmark = [pytest.mark.anyio, pytest.mark.backends]


def _server(home: Path, who: str = "builder", role: str = "agent", store: str | None = None) -> Any:
    settings = Settings.create(home=home, agent=who, role=role, store=store)
    return build_server(settings, clock=ManualClock())


async def test_every_tool_schema_is_its_operations_request_and_result_model(home):
    async with Client(_server(home)) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == {op.name for op in TOOLS}
    for op in TOOLS:
        tool = listed[op.name]
        assert tool.input_schema == op.request.model_json_schema(), op.name
        assert tool.output_schema == slim(op.result.model_json_schema()), op.name
        assert tool.description == op.description
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint == op.hints.read_only, op.name


def _prop(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """A property of a schema, following `$ref`s and the non-null branch of an optional."""
    node = schema
    for name in path:
        node = node["properties"][name] if name != "[]" else node["items"]
        while "$ref" in node or "anyOf" in node:
            if "$ref" in node:
                node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
            else:
                node = next(b for b in node["anyOf"] if b.get("type") != "null")
    return node


async def test_the_limits_that_once_drifted_are_advertised_to_agents(home):
    async with Client(_server(home, "alice", "operator")) as client:
        schemas = {t.name: t.input_schema for t in (await client.list_tools()).tools}
    assert _prop(schemas["decide_approval"], "expires_in_seconds")["maximum"] == 30 * 86400
    approval_ids = _prop(schemas["update"], "approval_ids")
    assert (
        approval_ids["maxItems"] == 64 and _prop(schemas["update"], "approval_ids", "[]")["pattern"]
    )
    assert _prop(schemas["update"], "failure_signature")["maxLength"] == 200
    assert _prop(schemas["todo_add"], "depends_on")["maxItems"] == 32
    assert _prop(schemas["todo_add"], "depends_on", "[]")["pattern"]
    assert _prop(schemas["receipt"], "seq")["maximum"] == 2**53


def test_the_typed_client_takes_exactly_each_request_models_fields():
    for op in TOOLS:
        method = getattr(AgentClient, op.name)
        params = inspect.signature(method).parameters
        taken = {name for name in params if name != "self"}
        assert taken == set(op.request.model_fields), op.name
        for name, field in op.request.model_fields.items():
            required = params[name].default is inspect.Parameter.empty
            assert required == field.is_required(), f"{op.name}.{name}"


def test_operation_names_are_unique_and_every_write_that_takes_a_key_can_refuse():
    names = [op.name for op in OPERATIONS]
    assert len(names) == len(set(names))
    for op in OPERATIONS:
        if op.idempotency != "none":
            assert op.access == "write" and op.refuse is not None, op.name


async def test_errors_carry_their_code_to_the_typed_client(home, store):
    await open_loop(
        store, OPERATOR, OpenLoopRequest(objective="o", policy=BASIC_POLICY, loop_id="L1")
    )
    async with AgentClient.connect(_server(home, store=store.location.url)) as agent:
        with pytest.raises(ToolCallError) as missing:
            await agent.quota("L9")
        assert (missing.value.code, missing.value.message) == ("not_found", "no loop with id 'L9'")
        with pytest.raises(ToolCallError) as bad:
            await agent.raw("quota", dict, loop_id="bad id!")
        assert bad.value.code == "invalid_input" and bad.value.message.startswith("loop_id: ")
        with pytest.raises(ToolCallError) as operator_only:
            await agent.open_loop("mine", BASIC_POLICY)
        assert operator_only.value.code == "forbidden"


async def test_the_runner_checks_the_role_before_visibility_and_input_before_both(store):
    with pytest.raises(InvalidInput):  # parsed first: nothing else is looked at
        await open_loop(store, BUILDER, {"objective": "", "policy": {}})
    with pytest.raises(Forbidden):  # then the role, whatever the loop
        await open_loop(store, BUILDER, OpenLoopRequest(objective="o", policy=BASIC_POLICY))
    await open_loop(
        store, OPERATOR, OpenLoopRequest(objective="o", policy=BASIC_POLICY, loop_id="L1")
    )
    for loop_id in ("L1", "L9"):  # then visibility: the same answer for hidden and missing
        with pytest.raises(NotFound, match=f"no loop with id '{loop_id}'"):
            await quota(store, STRANGER, QuotaRequest(loop_id=loop_id))
        with pytest.raises(NotFound, match=f"no loop with id '{loop_id}'"):
            await claim(store, STRANGER, ClaimRequest(loop_id=loop_id, idempotency_key="k"))


def test_an_evaluation_error_signs_no_exception_text():
    class Exploding(Exception):
        def __str__(self) -> str:
            return "/secret/path and a token lw_abc"

    class Facts:
        @property
        def status(self) -> Any:
            raise Exploding()

    policy = LoopPolicy.model_validate(BASIC_POLICY)
    decision = evaluate_claim(policy, Facts(), digest="sha256:" + "0" * 64)  # type: ignore[arg-type]
    assert not decision.allowed and decision.codes == ("evaluation_error",)
    assert decision.reasons[0].message == "policy evaluation failed (Exploding)"


# --- a database written by release 0.1.0 -----------------------------------------------------


def _release_copy(tmp_path: Path) -> Path:
    home = tmp_path / "release"
    shutil.copytree(RELEASE_0_1_0, home)
    for key in (home / "keys").glob("*.key"):
        key.chmod(0o600)  # git keeps no permissions; the key directory demands them
    return home


def test_a_release_0_1_0_database_verifies_clean(tmp_path):
    home = _release_copy(tmp_path)
    with snapshot(home / DB_NAME) as reader:
        report = audit(reader, KeyStore(home).keyring())
    assert report.clean, [f.as_dict() for f in report.findings]
    assert (report.receipts, report.loops, report.checkpoints) == (32, 3, 4)
    kinds = {row.kind for row in _rows(home)}
    assert len(kinds) == 16, "the fixture holds every kind release 0.1.0 wrote"


def _rows(home: Path) -> list[Any]:
    with snapshot(home / DB_NAME) as reader:
        return list(reader.iter_journal())


async def test_a_release_0_1_0_database_keeps_working_and_still_verifies(tmp_path):
    home = _release_copy(tmp_path)
    keys = KeyStore(home)
    store = await Store.open(
        home / DB_NAME, keys.load_signer(), keyring=keys.keyring(), kinds=KINDS
    )
    try:
        opened = await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="after", policy=BASIC_POLICY, todos=[{"title": "a"}]),
        )
        grant = await claim(store, BUILDER, ClaimRequest(loop_id=opened.loop_id))
        assert grant.granted
        with pytest.raises(NotFound):  # 0.1.0's loops answer outsiders like everything else
            await quota(store, STRANGER, QuotaRequest(loop_id="ship"))
    finally:
        await store.close()
    done = cli("verify", "--home", str(home), "--json", env=cli_env())
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_receipt_summary_follows_the_envelope_it_is_given_not_a_remembered_one(store):
    # Typed bodies are memoized per store (a projection shows the same recent receipts every
    # call); the memo is keyed by the envelope's hash, so a row whose envelope changed is
    # summarized anew, even under its old digest.
    from dataclasses import replace

    from loopwarden.journal.listing import receipt_summary

    await open_loop(store, OPERATOR, {"objective": "o", "policy": BASIC_POLICY, "loop_id": "m"})
    with pytest.raises(NotFound):  # an outsider: answered like no loop, and sealed as refused
        await claim(store, STRANGER, {"loop_id": "m"})
    rows = await store.read(lambda r: r.loop_journal("m"))
    opened = next(r for r in rows if r.kind == "loop.opened")
    refused = next(r for r in rows if r.kind.endswith(".refused"))
    first = receipt_summary(store, opened)
    assert receipt_summary(store, opened) == first and first.effect == "allow"
    swapped = receipt_summary(store, replace(opened, envelope=refused.envelope))
    assert (swapped.seq, swapped.kind) == (opened.seq, "loop.opened")  # the row's own columns
    assert swapped.effect == "deny" and swapped.reasons  # the body of the envelope it holds
    assert (swapped.principal, swapped.reasons) != (first.principal, first.reasons)
