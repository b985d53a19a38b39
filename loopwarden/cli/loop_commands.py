"""`loopwarden loop open | list | show | policy | set-policy | pause | resume | cancel |
cancel-todo`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from loopwarden.cli.common import (
    Options,
    Reason,
    control_command,
    fail,
    read_policy_file,
    shared_options,
)
from loopwarden.clients import render
from loopwarden.errors import InvalidInput, LoopwardenError
from loopwarden.kernel.runner.operation import Operation
from loopwarden.loops.lifecycle import (
    cancel_loop,
    open_loop,
    pause_loop,
    resume_loop,
    set_policy,
)
from loopwarden.policy.digest import policy_document
from loopwarden.projection.loop_list import list_loops
from loopwarden.projection.projection import loop_policy, policy_json, projection
from loopwarden.todos.todo_ops import todo_cancel

app = typer.Typer(no_args_is_help=True, help="Open, inspect and control loops.")


def _read_todos(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read todos file {path}: {exc}") from None
    if not isinstance(data, list):
        raise InvalidInput(f"{path}: expected a list of todos")
    return [item if isinstance(item, dict) else {"title": str(item)} for item in data]


@app.command("open")
@shared_options("home", "store", "json", "as")
def loop_open(
    policy: Annotated[Path, typer.Option("--policy", help="Policy file (.toml, .yaml, .json).")],
    objective: Annotated[str, typer.Option("--objective", help="What the loop is for.")],
    todo: Annotated[
        list[str] | None,
        typer.Option("--todo", metavar="TITLE", help="A todo title (repeat, in claim order)."),
    ] = None,
    todos_file: Annotated[
        Path | None,
        typer.Option("--todos", help="JSON/YAML list of {id, title, depends_on} todos."),
    ] = None,
    loop_id: Annotated[
        str | None, typer.Option("--id", help="Loop id (default: generated).")
    ] = None,
    *,
    options: Options,
) -> None:
    """Open a governed loop (prints its id)."""
    try:
        parsed = read_policy_file(policy)
        items: list[dict[str, Any]] = [{"title": t} for t in (todo or [])]
        if todos_file is not None:
            items += _read_todos(todos_file)
    except LoopwardenError as exc:
        fail(exc.message, 2, as_json=options.json_out, error=exc.code)
    request = {
        "objective": objective,
        "policy": policy_document(parsed),
        "todos": items,
        "loop_id": loop_id,
    }
    result = options.operate(open_loop, request)
    if options.json_out:
        render.emit_json({"loop_id": result.loop_id, **result.model_dump(mode="json")})
    else:
        render.console.print(
            f"opened loop [bold]{result.loop_id}[/bold] with {render.counted(result.todos, 'todo')} "
            f"(policy {result.policy_digest[:19]}…, receipt {result.receipt_id})"
        )
        if not result.todos:
            render.err.print(
                "[yellow]note:[/yellow] this loop has no todos: nothing can be claimed until one "
                "is added (the todo_add tool; agents too if the policy's todos.agents_may_add)"
            )


@app.command("list")
@shared_options("home", "store", "json")
def loop_list(*, options: Options) -> None:
    """List every loop."""
    loops = options.operate(list_loops, {}).loops
    if options.json_out:
        render.emit_json(
            {
                "loops": [
                    {
                        "loop_id": lp.loop_id,
                        "status": lp.status,
                        "stop_reason": lp.stop_reason,
                        "objective": lp.objective,
                        "opened_at": lp.opened_at,
                        "receipts": lp.head_seq,
                        "todos": lp.todos,
                    }
                    for lp in loops
                ]
            }
        )
        return
    render.table(
        "loops",
        ["id", "status", "todos done", "turns", "receipts", "objective"],
        [
            [
                lp.loop_id,
                render.Styled(
                    render.status(lp.status)
                    + (f" ({render.safe(lp.stop_reason)})" if lp.stop_reason else "")
                ),
                f"{lp.todos['done']}/{sum(lp.todos.values())}",
                lp.turns,
                lp.head_seq,
                lp.objective,
            ]
            for lp in loops
        ],
    )


@app.command("show")
@shared_options("home", "store", "json", "as")
def loop_show(loop_id: str, *, options: Options) -> None:
    """Show a loop: status, budgets, todos, who acts next.

    The projection: status, budgets, todos, leases, approvals, attention, the next action and
    the recent receipts.
    """
    result = options.operate(projection, {"loop_id": loop_id})
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        render.projection(result)


@app.command("policy")
@shared_options("home", "store", "json", "as")
def loop_policy_cmd(loop_id: str, *, options: Options) -> None:
    """Print a loop's policy (JSON: a file set-policy takes back).

    With --json, also its digest: {"loop_id", "policy_digest", "document"}.
    """
    result = options.operate(loop_policy, {"loop_id": loop_id})
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        print(policy_json(result))


@app.command("set-policy")
@shared_options("home", "store", "json", "as")
def loop_set_policy(
    loop_id: str,
    policy: Annotated[Path, typer.Option("--policy", help="Policy file (.toml, .yaml, .json).")],
    reason: Reason = "",
    *,
    options: Options,
) -> None:
    """Replace a loop's policy (sealed, with both digests).

    Budgets already used carry over; every later call is decided, and every later receipt
    judged, by the new policy. Check the file first: `loopwarden policy check FILE`.
    """
    try:
        parsed = read_policy_file(policy)
    except LoopwardenError as exc:
        fail(exc.message, 2, as_json=options.json_out, error=exc.code)
    request = {"loop_id": loop_id, "policy": policy_document(parsed), "reason": reason}
    result = options.operate(set_policy, request)
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
    elif not result.changed:
        render.console.print(f"loop {result.loop_id} already has this policy; nothing was sealed")
    else:
        render.console.print(
            f"loop {result.loop_id} now has policy {result.policy_digest[:19]}… (was "
            f"{result.previous_digest[:19]}…; receipt {result.receipt_id})"
        )


def _control(op: Operation[Any, Any], doc: str) -> Any:
    """The command that runs a loop control (`pause_loop` …) on one loop, with `--reason`."""
    return control_command(op, "loop", "loop_id", typer.Argument(metavar="loop_id"), doc)


app.command("pause")(
    _control(pause_loop, "Pause a loop: no new claims; open turns may still report.")
)
app.command("resume")(_control(resume_loop, "Resume a paused loop."))
app.command("cancel")(
    _control(
        cancel_loop,
        "Cancel a loop for good.\n\nEvery open turn is closed; nothing more can happen in it.",
    )
)


@app.command("cancel-todo")
@shared_options("home", "store", "json", "as")
def loop_cancel_todo(loop_id: str, todo_id: str, reason: Reason = "", *, options: Options) -> None:
    """Cancel an open or blocked todo: it is never claimed again.

    Refused while another unfinished todo depends on it (cancel that one first). Cancelling
    the last owed todo completes the loop.
    """
    request = {"loop_id": loop_id, "todo_id": todo_id, "reason": reason}
    result = options.operate(todo_cancel, request)
    if options.json_out:
        render.emit_json(result.model_dump(mode="json"))
        return
    render.console.print(
        f"todo {result.todo_id} of loop {result.loop_id} is cancelled (receipt "
        f"{result.receipt_id}); the loop is {render.status(result.status)}"
    )
