"""`loopwarden policy check | schema | explain`: policy files, checked without a store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loopwarden.clients import render
from loopwarden.clients.cli.common import EXIT_USAGE, Json, fail, read_policy_file
from loopwarden.errors import LoopwardenError
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.evaluate import explain as explain_tool
from loopwarden.policy.lint import case_near_misses
from loopwarden.policy.loader import policy_schema
from loopwarden.policy.model import LoopPolicy

app = typer.Typer(no_args_is_help=True, help="Policy files.")


def _load(file: Path, json_out: bool) -> LoopPolicy:
    try:
        return read_policy_file(file)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out, error=exc.code)


@app.command("check")
def policy_check(file: Path, json_out: Json = False) -> None:
    """Validate a policy file and print its digest."""
    policy = _load(file, json_out)
    digest = policy_digest(policy)
    notes = []
    if not policy.agents:
        notes.append("no agents are allowed: nobody can claim a turn")
    if not policy.tools.allow and not policy.tools.approval:
        notes.append("no tool is allowed: every reported tool use will be refused")
    notes += case_near_misses(policy)
    if json_out:
        render.emit_json(
            {"valid": True, "digest": digest, "notes": notes, "policy": policy_document(policy)}
        )
    else:
        render.console.print(f"[green]valid[/green] {render.safe(file.name)}  {digest}")
        for note in notes:
            render.console.print(f"[yellow]note:[/yellow] {render.safe(note)}")


@app.command("schema")
def policy_schema_cmd() -> None:
    """Print the policy JSON Schema."""
    render.emit_json(policy_schema())


@app.command("explain")
def policy_explain(
    file: Path,
    tool: Annotated[list[str], typer.Option("--tool", help="Tool name to classify (repeatable).")],
    json_out: Json = False,
) -> None:
    """Say whether each tool is allowed, denied or needs approval, and which pattern decided."""
    policy = _load(file, json_out)
    verdicts = [explain_tool(policy, name) for name in tool]
    if json_out:
        render.emit_json(
            {
                "tools": [
                    {
                        "tool": v.tool,
                        "effect": v.effect,
                        "rule": v.rule,
                        "pattern": v.pattern,
                        "explanation": v.explain(),
                    }
                    for v in verdicts
                ]
            }
        )
    else:
        for v in verdicts:
            color = {"allow": "green", "approval": "yellow", "deny": "red"}[v.effect]
            render.console.print(f"[{color}]{v.effect:8}[/{color}] {render.safe(v.explain())}")
