"""`loopwarden policy init | check | schema | explain`: policy files, checked without a store."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from loopwarden.clients import render
from loopwarden.clients.cli.common import EXIT_USAGE, Home, Json, fail, read_policy_file
from loopwarden.errors import LoopwardenError
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.evaluate import explain as explain_tool
from loopwarden.policy.lint import case_near_misses
from loopwarden.policy.loader import parse_policy, policy_schema
from loopwarden.policy.model import LoopPolicy

app = typer.Typer(no_args_is_help=True, help="Policy files.")


def _load(file: Path, json_out: bool) -> LoopPolicy:
    try:
        return read_policy_file(file)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out, error=exc.code)


def starter_policy() -> str:
    """The commented starter policy `policy init` writes (package data; `examples/policy.toml`
    in a clone is the same file)."""
    return resources.files("loopwarden.clients.starter").joinpath("policy.toml").read_text()


@app.command("init")
def policy_init(
    file: Annotated[
        Path | None, typer.Argument(help="Where to write it (*.toml); default: stdout.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing FILE.")] = False,
    json_out: Json = False,
    home: Home = None,
) -> None:
    """Write a commented starter policy to edit (valid as written).

    With --json, `{"file", "digest"}` (and the policy's `text` when no FILE is given). Needs
    no store (--home is accepted and ignored).
    """
    text = starter_policy()
    digest = policy_digest(parse_policy(text, "toml", source="starter"))
    if file is None:
        if json_out:
            render.emit_json({"file": None, "digest": digest, "text": text})
        else:
            sys.stdout.write(text)
        return
    if file.suffix != ".toml":
        fail(f"policy init writes TOML: name the file *.toml (got {file.name})", EXIT_USAGE)
    if file.exists() and not force:
        fail(f"{file} already exists; pass --force to overwrite it")
    try:
        file.write_text(text)
    except OSError as exc:
        fail(f"cannot write {file}: {exc.strerror}", EXIT_USAGE)
    if json_out:
        render.emit_json({"file": str(file), "digest": digest})
    else:
        render.console.print(f"wrote {file}; check it with: loopwarden policy check {file}")


@app.command("check")
def policy_check(file: Path, json_out: Json = False, home: Home = None) -> None:
    """Validate a policy file and print its digest.

    Needs no store (--home is accepted and ignored).
    """
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
def policy_schema_cmd(json_out: Json = False, home: Home = None) -> None:
    """Print the policy JSON Schema.

    Always JSON (--json is accepted, like every command). Needs no store (--home is ignored).
    """
    render.emit_json(policy_schema())


@app.command("explain")
def policy_explain(
    file: Path,
    tool: Annotated[
        list[str],
        typer.Option("--tool", metavar="NAME", help="Tool name to classify (repeatable)."),
    ],
    json_out: Json = False,
    home: Home = None,
) -> None:
    """Classify tools: allowed, denied or needing approval.

    Names the pattern that decided each tool. Needs no store (--home is ignored).
    """
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
