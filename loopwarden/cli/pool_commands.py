"""`loopwarden pool create | set | show | list | pause | resume`: budget pools across loops."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import annotated_types
import typer
from pydantic.fields import FieldInfo

from loopwarden.cli.common import Options, control_command, gather, shared_options
from loopwarden.clients import render
from loopwarden.clock import format_time
from loopwarden.policy.budgets import Budgets
from loopwarden.pools.pool_ops import POOL_CONTROLS, PoolOut, pool_define, pools

app = typer.Typer(no_args_is_help=True, help="Budget pools: limits that span loops.")

NAMED = typer.Argument(help="The pool's name, e.g. team-a.")
Name = Annotated[str, NAMED]


def _floor(info: FieldInfo) -> Any:
    """The budget's lower bound (its `ge`), as its option's `min`."""
    return next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)


# One --max-… option per budget of a policy (`Budgets`), with its type and lower bound: a budget
# added there is a pool flag here. The command receives those given, as a `budgets` dict.
_budget_options = gather(
    "budgets",
    [
        inspect.Parameter(
            field,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[info.annotation, typer.Option(min=_floor(info))],
        )
        for field, info in Budgets.model_fields.items()
    ],
    lambda given: {key: value for key, value in given.items() if value is not None},
)


def _policy(
    window: str, concurrent: int | None, agents: list[str] | None, budgets: dict[str, Any]
) -> dict[str, Any]:
    policy: dict[str, Any] = {"budgets": budgets, "window": window, "agents": agents or []}
    if concurrent is not None:
        policy["max_concurrent_turns"] = concurrent
    return policy


def _define(name: str, policy: dict[str, Any], create_only: bool, options: Options) -> None:
    request = {"name": name, "policy": policy, "create_only": create_only}
    result = options.operate(pool_define, request)
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
        return
    what = "created" if result.created else "changed" if result.changed else "unchanged"
    render.console.print(f"pool [bold]{render.safe(name)}[/bold] {what}")
    _show(result.pool)


def _command(create_only: bool, verb: str) -> Any:
    @shared_options("home", "store", "json", "as")
    @_budget_options
    def command(
        name: Name,
        budgets: dict[str, Any],
        window: Annotated[
            str, typer.Option("--window", help="total, 1h or 1d (UTC calendar hours or days).")
        ] = "total",
        max_concurrent_turns: Annotated[int | None, typer.Option(min=1)] = None,
        agent: Annotated[
            list[str] | None,
            typer.Option("--agent", help="An agent that draws from it in every loop (repeat)."),
        ] = None,
        *,
        options: Options,
    ) -> None:
        policy = _policy(window, max_concurrent_turns, agent, budgets)
        _define(name, policy, create_only, options)

    command.__doc__ = (
        f"{verb} a budget pool.\n\nEach limit is for the pool's window: --window total (never "
        "resets), 1h or 1d (each UTC hour or day from its start). A loop draws from it with "
        '`pools = ["NAME"]` in its policy; --agent binds an agent in every loop. Sealed as '
        "pool.defined."
        + (" The limits given replace the pool's whole policy." if not create_only else "")
    )
    return command


app.command("create")(_command(True, "Create"))
app.command("set")(_command(False, "Change (or create)"))


def _show(pool: PoolOut) -> None:
    head = (
        f"[bold]{render.safe(pool.name)}[/bold]  {render.status(pool.status)}  window {pool.window}"
    )
    if pool.resets_at:
        head += f" (resets {format_time(pool.resets_at)})"
    render.console.print(head)
    for dimension, line in pool.budgets.items():
        bar = render.bar(float(line.used), float(line.limit) if line.limit is not None else None)
        render.console.print(f"  {dimension:<14} {bar} {line.used} / {line.limit}")
    if pool.max_concurrent_turns is not None:
        render.console.print(f"  open turns     {pool.active_turns} / {pool.max_concurrent_turns}")
    if pool.agents:
        render.console.print(f"  agents         {', '.join(map(render.safe, pool.agents))}")
    loops = ", ".join(map(render.safe, pool.loops)) or "-"
    render.console.print(f"  loops          {loops}")


@app.command("show")
@shared_options("home", "store", "json")
def pool_show(name: Name, *, options: Options) -> None:
    """Show one pool: its window's usage and its loops."""
    result = options.operate(pools, {"name": name})
    if options.json_out:
        render.emit_json(result.pools[0].model_dump(mode="json"))
        return
    _show(result.pools[0])


@app.command("list")
@shared_options("home", "store", "json")
def pool_list(*, options: Options) -> None:
    """List the budget pools and what their windows used."""
    result = options.operate(pools, {})
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
        return
    rows = []
    for pool in result.pools:
        used = ", ".join(f"{d} {b.used}/{b.limit}" for d, b in pool.budgets.items()) or "-"
        turns = f"{pool.active_turns}/{pool.max_concurrent_turns or '-'}"
        rows.append([pool.name, pool.status, pool.window, used, turns, len(pool.loops)])
    render.table("pools", ["name", "status", "window", "used", "open turns", "loops"], rows)


def _control(action: str) -> Any:
    sealed = "pool.paused" if action == "pause" else "pool.resumed"
    then = "are refused" if action == "pause" else "are admitted again"
    doc = (
        f"{action.title()} a pool: its loops' claims {then}.\n\nSealed as {sealed}, with --reason."
    )
    return control_command(POOL_CONTROLS[action], "pool", "name", NAMED, doc)


app.command("pause")(_control("pause"))
app.command("resume")(_control("resume"))
