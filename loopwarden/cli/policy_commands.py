"""`loopwarden policy init | check | schema | explain`: policy files, checked without a store."""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer

from loopwarden.cli.common import (
    EXIT_USAGE,
    Options,
    fail,
    read_policy_file,
    shared_options,
)
from loopwarden.clients import render
from loopwarden.errors import LoopwardenError
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.evaluate import ToolVerdict, rule_set
from loopwarden.policy.evaluate import explain as explain_tool
from loopwarden.policy.lint import policy_notes
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
@shared_options("json", "home")
def policy_init(
    file: Annotated[
        Path | None, typer.Argument(help="Where to write it (*.toml); default: stdout.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing FILE.")] = False,
    *,
    options: Options,
) -> None:
    """Write a commented starter policy to edit (valid as written).

    With --json, `{"file", "digest"}` (and the policy's `text` when no FILE is given). Needs
    no store (--home is accepted and ignored).
    """
    text = starter_policy()
    digest = policy_digest(parse_policy(text, "toml", source="starter"))
    if file is None:
        if options.json_out:
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
    if options.json_out:
        render.emit_json({"file": str(file), "digest": digest})
    else:
        render.console.print(f"wrote {file}; check it with: loopwarden policy check {file}")


@app.command("check")
@shared_options("json", "home")
def policy_check(file: Path, *, options: Options) -> None:
    """Validate a policy file and print its digest.

    Needs no store (--home is accepted and ignored).
    """
    policy = _load(file, options.json_out)
    digest = policy_digest(policy)
    notes = policy_notes(policy)
    if options.json_out:
        render.emit_json(
            {"valid": True, "digest": digest, "notes": notes, "policy": policy_document(policy)}
        )
    else:
        render.console.print(f"[green]valid[/green] {render.safe(file.name)}  {digest}")
        for note in notes:
            render.console.print(f"[yellow]note:[/yellow] {render.safe(note)}")


@app.command("schema")
@shared_options("json", "home")
def policy_schema_cmd(*, options: Options) -> None:
    """Print the policy JSON Schema.

    Always JSON (--json is accepted, like every command). Needs no store (--home is ignored).
    """
    render.emit_json(policy_schema())


@app.command("explain")
@shared_options("json", "home")
def policy_explain(
    file: Path,
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", metavar="NAME", help="Tool name to classify (repeatable)."),
    ] = None,
    command: Annotated[
        list[str] | None,
        typer.Option("--command", metavar="LINE", help="Shell command line to judge (repeatable)."),
    ] = None,
    shell: Annotated[
        str, typer.Option("--shell", help="The language of --command: bash or powershell.")
    ] = "bash",
    arguments: Annotated[
        str | None,
        typer.Option(
            "--arguments", metavar="JSON", help="A call's arguments, judged for each --tool."
        ),
    ] = None,
    *,
    options: Options,
) -> None:
    """Classify tools; judge a call's arguments or a shell line.

    A tool is allowed, denied or needs approval; the pattern that decided is named. With
    --arguments, every argument rule covering each --tool is judged on them ([[tools.arguments]]).
    For a command line, prints every command it runs (nested ones indented under what runs
    them), the rule or doubt deciding each, and the reasons the model is told. Needs no store
    (--home is ignored).
    """
    json_out = options.json_out
    policy = _load(file, json_out)
    if not tool and not command:
        fail("name a --tool or a --command to explain", EXIT_USAGE, as_json=json_out)
    if shell not in ("bash", "powershell"):
        fail("--shell is bash or powershell", EXIT_USAGE, as_json=json_out)
    given = None
    if arguments is not None:
        try:
            given = json.loads(arguments)
        except ValueError:
            given = None
        if not isinstance(given, dict):
            fail("--arguments takes a JSON object", EXIT_USAGE, as_json=json_out)
    verdicts = [explain_tool(policy, name) for name in tool or []]
    judged_arguments = [_judged_arguments(policy, name, given) for name in tool or []]
    lines = [_judged_line(policy, line, shell) for line in command or []]
    if json_out:
        out: dict[str, Any] = {"tools": [_tool_json(v) for v in verdicts]}
        if arguments is not None:
            out["arguments"] = judged_arguments
        render.emit_json({**out, "commands": lines} if command else out)
        return
    for v, judged_call in zip(verdicts, judged_arguments, strict=True):
        color = {"allow": "green", "approval": "yellow", "deny": "red"}[v.effect]
        render.console.print(f"[{color}]{v.effect:8}[/{color}] {render.safe(v.explain())}")
        if arguments is not None or judged_call["rules"]:
            _print_arguments(judged_call, arguments is not None)
    for judged in lines:
        _print_line(judged)


def _judged_arguments(
    policy: LoopPolicy, tool: str, arguments: dict[str, Any] | None
) -> dict[str, Any]:
    """The argument rules covering `tool`, each judged on `arguments` (None: not given)."""
    from loopwarden.policy.arguments import argument_reasons, covering, judge_arguments

    rules = policy.tools.arguments
    if arguments is None:
        listed = [{"rule": r.label, "argument": r.argument} for r in covering(rules, tool)]
        return {"tool": tool, "effect": None, "rules": listed, "reasons": []}
    verdicts = judge_arguments(rules, tool, arguments)
    told = argument_reasons(rules, tool, arguments)
    return {
        "tool": tool,
        "effect": "deny" if told else "allow",
        "rules": [
            {
                "rule": v.rule.label,
                "argument": v.rule.argument,
                "outcome": v.outcome,
                "why": v.why,
            }
            for v in verdicts
        ],
        "reasons": [r.as_dict() for r in told],
    }


def _print_arguments(judged: dict[str, Any], given: bool) -> None:
    if not judged["rules"]:
        render.console.print("  no argument rule covers it")
        return
    for rule in judged["rules"]:
        if not given:
            render.console.print(
                f"  argument rule {render.safe(rule['rule'])} on {render.safe(rule['argument'])}"
            )
            continue
        mark = "red" if rule["outcome"] in ("not_allowed", "doubt") else "green"
        why = f": {rule['why']}" if rule["why"] else ""
        render.console.print(
            f"  [{mark}]{rule['outcome']:11}[/{mark}] {render.safe(rule['rule'])} "
            f"({render.safe(rule['argument'])}){render.safe(why)}"
        )


def _tool_json(v: ToolVerdict) -> dict[str, Any]:
    return {
        "tool": v.tool,
        "effect": v.effect,
        "rule": v.rule,
        "pattern": v.pattern,
        "explanation": v.explain(),
    }


def _judged_line(policy: LoopPolicy, line: str, shell: str) -> dict[str, Any]:
    """One line judged under the policy's `[tools.commands]`, as `policy explain` shows it."""
    rules = policy.tools.commands
    if rules is None:
        return {"line": line, "effect": "allow", "commands": [], "reasons": [], "note": (
            "the policy has no [tools.commands]: shell.run lines are not read"
        )}  # fmt: skip
    from loopwarden.policy.commands.verdicts import argv_text, explanation, judge, reasons

    ruleset = rule_set(rules)
    judged = judge(ruleset, line, "powershell" if shell == "powershell" else "bash")
    told = reasons(judged, ruleset)
    return {
        "line": line,
        "effect": "deny" if told else "allow",
        "commands": [
            {
                "index": v.run.index + 1,
                "parent": v.run.parent + 1 if v.run.parent is not None else None,
                "depth": _depth(judged.verdicts, v.run.index),
                "via": v.run.via,
                "argv": argv_text(v.run),
                "outcome": v.outcome,
                "rule": v.rule,
                "explanation": explanation(v, ruleset),
            }
            for v in judged.verdicts
        ],
        "line_doubts": list(judged.line_doubts),
        "reasons": [r.as_dict() for r in told],
    }


def _depth(verdicts: Any, index: int) -> int:
    depth, parent = 0, verdicts[index].run.parent
    while parent is not None:
        depth, parent = depth + 1, verdicts[parent].run.parent
    return depth


def _print_line(judged: dict[str, Any]) -> None:
    effect = judged["effect"]
    color = "green" if effect == "allow" else "red"
    render.console.print(f"[{color}]{effect:8}[/{color}] {render.safe(judged['line'])}")
    if "note" in judged:
        render.console.print(f"  {render.safe(judged['note'])}")
    for c in judged["commands"]:
        mark = "red" if c["outcome"] in ("denied", "doubt", "opaque", "not_allowed") else "green"
        indent = "  " * (c["depth"] + 1)
        via = f" (via {c['via']})" if c["via"] else ""
        render.console.print(f"{indent}{c['index']}. {render.safe(c['argv'])}{render.safe(via)}")
        render.console.print(f"{indent}   [{mark}]{render.safe(c['explanation'])}[/{mark}]")
    for doubt in judged["line_doubts"]:
        render.console.print(f"  [red]the line: {render.safe(doubt)}[/red]")
    if judged["reasons"]:
        render.console.print("  the model is told:")
        for reason in judged["reasons"]:
            render.console.print(f"    {reason['code']}: {render.safe(reason['message'])}")
