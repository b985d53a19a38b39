"""`loopwarden`: the server and the operator's admin tool.

Exit codes: 0 ok · 1 refused, not found or failed · 2 usage or invalid input ·
3 verification failed (tampering found, or a damaged store refused to open).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import anyio
import typer
from rich.markup import escape

from loopwarden import __version__
from loopwarden.clients import admin, render
from loopwarden.clock import format_time
from loopwarden.errors import (
    IntegrityError,
    InvalidInput,
    LoopwardenError,
    NotFound,
    describe_validation,
    one_line,
)
from loopwarden.ledger.audit import audit as run_audit
from loopwarden.ledger.bundles import export_bundle, load_bundle, verify_bundle
from loopwarden.ledger.keys import Keyring, KeyStore, decode_public_key, public_key_b64
from loopwarden.ledger.receipts import open_envelope
from loopwarden.ledger.store import Txn
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.evaluate import explain as explain_tool
from loopwarden.policy.loader import format_for, parse_policy, policy_schema
from loopwarden.principals import Principal
from loopwarden.server.settings import resolve_home
from loopwarden.server.tokens import issue_token, revoke_token
from loopwarden.tools import approvals as approvals_op
from loopwarden.tools import loops as loops_op
from loopwarden.tools import projection as projection_op

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_VERIFY = 0, 1, 2, 3

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="loopwarden: govern long-running AI agent loops with signed, Merkle-logged receipts.",
    pretty_exceptions_enable=False,
)
loop_app = typer.Typer(no_args_is_help=True, help="Open, inspect and control loops.")
token_app = typer.Typer(no_args_is_help=True, help="Bearer tokens for streamable HTTP.")
keys_app = typer.Typer(no_args_is_help=True, help="Signing keys.")
policy_app = typer.Typer(no_args_is_help=True, help="Policy files.")
app.add_typer(loop_app, name="loop")
app.add_typer(token_app, name="token")
app.add_typer(keys_app, name="keys")
app.add_typer(policy_app, name="policy")

Home = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Data directory (default: $LOOPWARDEN_HOME, else the user data dir)."
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
As = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Operator id recorded in receipts (default: $LOOPWARDEN_OPERATOR or 'operator').",
    ),
]


def fail(
    message: str, code: int = EXIT_REFUSED, *, as_json: bool = False, error: str = "error"
) -> NoReturn:
    if as_json:
        render.emit_json({"error": error, "message": message})
    render.err.print(f"[red]error:[/red] {escape(one_line(message))}")
    raise typer.Exit(code)


def run(fn, *args: Any, as_json: bool = False) -> Any:
    """Run an async admin action, mapping loopwarden errors to exit codes."""
    try:
        return anyio.run(fn, *args)
    except IntegrityError as exc:
        fail(exc.message, EXIT_VERIFY, as_json=as_json, error=exc.code)
    except InvalidInput as exc:
        fail(exc.message, EXIT_USAGE, as_json=as_json, error=exc.code)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_REFUSED, as_json=as_json, error=exc.code)


def read_policy_file(path: Path):
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read policy file {path}: {exc.strerror}") from None
    return parse_policy(text, format_for(path.name), source=path.name)


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit()


# --- serve / demo ----------------------------------------------------------------------------


@app.command()
def serve(
    agent: Annotated[
        str | None, typer.Option(help="The principal this server speaks for (stdio, --no-auth).")
    ] = None,
    role: Annotated[str | None, typer.Option(help="agent (default) or operator.")] = None,
    http: Annotated[
        str | None, typer.Option(help="Serve streamable HTTP on HOST:PORT (path /mcp).")
    ] = None,
    home: Home = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="HTTP on loopback only: every request is --agent.")
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a non-loopback --http bind.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", help="A Host name clients use for a remote bind (repeat)."),
    ] = None,
) -> None:
    """Run the MCP server (stdio by default). Logs go to stderr; stdout is the protocol."""
    from loopwarden.server.app import build_server
    from loopwarden.server.settings import Settings, url_host
    from loopwarden.server.transports import configure_logging, serve_http, serve_stdio

    configure_logging()
    try:
        settings = Settings.create(
            home=home,
            agent=agent,
            role=role,
            http=http,
            no_auth=no_auth,
            allow_remote=allow_remote,  # type: ignore[arg-type]
            allowed_hosts=tuple(allowed_host or ()),
        )
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE)

    async def preflight() -> None:  # refuse a damaged store with a clear message before serving
        async with admin.open_kernel(settings.home):
            pass

    run(preflight)
    server = build_server(settings)
    if settings.http is None:
        anyio.run(serve_stdio, server)
    else:
        host, port = settings.http
        render.err.print(
            f"loopwarden serving streamable HTTP on http://{url_host(host)}:{port}/mcp"
        )
        anyio.run(serve_http, server, settings)


@app.command()
def demo(
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Run the end-to-end demonstration over a real MCP stdio connection, then audit it."""
    from loopwarden.clients.demo import run_demo

    ok = anyio.run(run_demo, home, json_out)
    raise typer.Exit(EXIT_OK if ok else EXIT_VERIFY)


# --- loops -----------------------------------------------------------------------------------


@loop_app.command("open")
def loop_open(
    policy: Annotated[Path, typer.Option("--policy", help="Policy file (.toml, .yaml, .json).")],
    objective: Annotated[str, typer.Option("--objective", help="What the loop is for.")],
    todo: Annotated[
        list[str] | None, typer.Option("--todo", help="A todo title (repeat, in claim order).")
    ] = None,
    todos_file: Annotated[
        Path | None,
        typer.Option("--todos", help="JSON/YAML list of {id, title, depends_on} todos."),
    ] = None,
    loop_id: Annotated[
        str | None, typer.Option("--id", help="Loop id (default: generated).")
    ] = None,
    home: Home = None,
    json_out: Json = False,
    who: As = None,
) -> None:
    """Open a governed loop (prints its id)."""

    async def action():
        parsed = read_policy_file(policy)
        items: list[dict[str, Any]] = [{"title": t} for t in (todo or [])]
        if todos_file is not None:
            items += _read_todos(todos_file)
        request = _model(
            loops_op.OpenLoopRequest,
            objective=objective,
            policy=policy_document(parsed),
            todos=items,
            loop_id=loop_id,
        )
        async with admin.open_kernel(home) as kernel:
            return await loops_op.open_loop(kernel, admin.operator(who), request)

    result = run(action, as_json=json_out)
    if json_out:
        render.emit_json({"loop_id": result.loop_id, **result.model_dump(mode="json")})
    else:
        render.console.print(
            f"opened loop [bold]{result.loop_id}[/bold] with {result.todos} todos "
            f"(policy {result.policy_digest[:19]}…, receipt {result.receipt_id})"
        )


def _read_todos(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read todos file {path}: {exc}") from None
    if not isinstance(data, list):
        raise InvalidInput(f"{path}: expected a list of todos")
    return [item if isinstance(item, dict) else {"title": str(item)} for item in data]


def _model(model, **values):
    from pydantic import ValidationError

    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc).removeprefix("invalid_input: ")) from None


@loop_app.command("list")
def loop_list(home: Home = None, json_out: Json = False) -> None:
    """List every loop."""

    async def action():
        async with admin.open_kernel(home) as kernel:
            return await kernel.store.read(lambda r: r.loops())

    loops = run(action, as_json=json_out)
    if json_out:
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
                        "todos": dict(
                            zip(("open", "claimed", "done", "blocked"), lp.todo_counts, strict=True)
                        ),
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
                    render.status(lp.status) + (f" ({lp.stop_reason})" if lp.stop_reason else "")
                ),
                f"{lp.count('done')}/{lp.todo_total}",
                lp.totals.turns,
                lp.head_seq,
                lp.objective,
            ]
            for lp in loops
        ],
    )


@loop_app.command("show")
def loop_show(loop_id: str, home: Home = None, json_out: Json = False, who: As = None) -> None:
    """Show a loop's projection: status, budgets, todos, leases, attention, recent receipts."""

    async def action():
        request = _model(projection_op.ProjectionRequest, loop_id=loop_id)
        async with admin.open_kernel(home) as kernel:
            return await projection_op.projection(kernel, admin.operator(who), request)

    result = run(action, as_json=json_out)
    if json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        render.projection(result)


def _control(action_name: str, loop_id: str, reason: str, home, json_out: bool, who) -> None:
    async def action():
        request = _model(loops_op.LoopControlRequest, loop_id=loop_id, reason=reason)
        async with admin.open_kernel(home) as kernel:
            return await loops_op.control_loop(kernel, admin.operator(who), action_name, request)

    result = run(action, as_json=json_out)
    if json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        render.console.print(
            f"loop {result.loop_id} is now {render.status(result.status)} (receipt {result.receipt_id})"
        )


Reason = Annotated[str, typer.Option("--reason", help="Why (recorded in the receipt).")]


@loop_app.command("pause")
def loop_pause(
    loop_id: str, reason: Reason = "", home: Home = None, json_out: Json = False, who: As = None
) -> None:
    """Pause a loop: no new claims; open turns may still report."""
    _control("pause", loop_id, reason, home, json_out, who)


@loop_app.command("resume")
def loop_resume(
    loop_id: str, reason: Reason = "", home: Home = None, json_out: Json = False, who: As = None
) -> None:
    """Resume a paused loop."""
    _control("resume", loop_id, reason, home, json_out, who)


@loop_app.command("cancel")
def loop_cancel(
    loop_id: str, reason: Reason = "", home: Home = None, json_out: Json = False, who: As = None
) -> None:
    """Cancel a loop: every open turn is closed; nothing more can happen in it."""
    _control("cancel", loop_id, reason, home, json_out, who)


# --- receipts --------------------------------------------------------------------------------


def _keyring(home: Path | None, json_out: bool) -> Keyring:
    """The trusted keys of `home`'s key directory; a broken key file is a clean failure."""
    try:
        return admin.keyring_of(home)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)


def _receipt_rows(rows, keyring) -> list[dict[str, Any]]:
    """The journal rows as the projection summarizes them, plus turn id and signature check."""
    out = []
    for row in rows:
        opened = open_envelope(row.envelope, keyring)
        summary = projection_op.receipt_summary(row, opened).model_dump(mode="json")
        out.append({**summary, "turn_id": opened.body.get("turn_id"), "verified": opened.verified})
    return out


@app.command()
def receipts(
    loop_id: str,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only this kind, e.g. turn.refused.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new receipts.")
    ] = False,
    home: Home = None,
    json_out: Json = False,
) -> None:
    """The loop's journal as a table (signature checked per row)."""
    keyring = _keyring(home, json_out)
    after = 0
    first = True
    while True:
        try:
            with admin.open_reader(home) as reader:
                if first and reader.loop_row(loop_id) is None:
                    raise NotFound(f"no loop with id {loop_id!r}")
                rows = reader.loop_journal(loop_id, after_seq=after, kind=kind)
        except LoopwardenError as exc:
            fail(exc.message, as_json=json_out, error=exc.code)
        items = _receipt_rows(rows, keyring)
        if rows:
            after = rows[-1].seq
        if json_out:
            for item in items:
                print(json.dumps(item)) if follow else None
            if not follow:
                render.emit_json({"loop_id": loop_id, "receipts": items})
        elif items or first:
            render.table(
                f"receipts of {loop_id}" if first else "",
                ["seq", "kind", "principal", "effect", "reasons", "receipt", "sig"],
                [
                    [
                        i["seq"],
                        i["kind"],
                        i["principal"],
                        i["effect"],
                        ", ".join(i["reasons"]),
                        i["receipt_id"],
                        "ok" if i["verified"] else render.Styled("[red]BAD[/red]"),
                    ]
                    for i in items
                ],
            )
        first = False
        if not follow:
            return
        time.sleep(1.0)


@app.command()
def receipt(receipt_id: str, home: Home = None, json_out: Json = False) -> None:
    """One receipt: the envelope, its decoded body, and whether it verifies."""
    keyring = _keyring(home, json_out)
    try:
        with admin.open_reader(home) as reader:
            row = reader.receipt_by_id(receipt_id)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    if row is None:
        fail(f"no receipt {receipt_id!r}", as_json=json_out, error="not_found")
    opened = open_envelope(row.envelope, keyring)
    out = {
        "receipt_id": row.receipt_id,
        "leaf_index": row.leaf_index,
        "digest": row.digest,
        "verified": opened.verified,
        "problems": list(opened.problems),
        "key_id": opened.key_id,
        "body": opened.body,
        "envelope": opened.envelope,
    }
    if json_out:
        render.emit_json(out)
    else:
        state = (
            "[green]signature ok[/green]"
            if opened.verified
            else f"[red]{', '.join(opened.problems)}[/red]"
        )
        render.console.print(
            f"[bold]{row.receipt_id}[/bold] leaf {row.leaf_index} {state} (key {opened.key_id})"
        )
        render.console.print(f"[dim]{row.digest}[/dim]")
        render.console.print_json(json.dumps(opened.body))


# --- audit and bundles -----------------------------------------------------------------------


@app.command()
def verify(
    loop: Annotated[
        str | None,
        typer.Option("--loop", help="Audit one loop in depth (the log is always checked whole)."),
    ] = None,
    home: Home = None,
    json_out: Json = False,
    trusted_keys: Annotated[
        Path | None,
        typer.Option(
            "--trusted-keys", help="JSON {key_id: base64} to trust instead of the key directory."
        ),
    ] = None,
) -> None:
    """Full audit: signatures, schema, seq/prev chains, Merkle root vs every checkpoint,
    checkpoint consistency, and every projection rebuilt from receipts. Exit 3 on any finding."""
    from rich.progress import Progress

    keyring = _load_trusted(trusted_keys) if trusted_keys else _keyring(home, json_out)
    try:
        with admin.open_reader(home) as reader:
            if loop is not None and reader.loop_row(loop) is None:
                raise NotFound(f"no loop with id {loop!r}")
            if json_out or not sys.stderr.isatty():
                report = run_audit(reader, keyring, loop_id=loop)
            else:
                with Progress(console=render.err, transient=True) as progress:
                    task = progress.add_task("auditing", total=reader.journal_count())
                    report = run_audit(
                        reader,
                        keyring,
                        loop_id=loop,
                        progress=lambda done, total: progress.update(
                            task, completed=done, total=total
                        ),
                    )
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    if json_out:
        render.emit_json(report.as_dict())
    else:
        render.audit(report)
    raise typer.Exit(EXIT_OK if report.clean else EXIT_VERIFY)


def _load_trusted(path: Path) -> Keyring:
    try:
        data = json.loads(path.read_text())
        keys = data.get("keys", data) if isinstance(data, dict) else None
        if not isinstance(keys, dict):
            raise ValueError("expected a JSON object {key_id: base64 public key}")
        return Keyring({k: decode_public_key(v) for k, v in keys.items()})
    except (OSError, ValueError, LoopwardenError) as exc:
        fail(f"cannot read trusted keys from {path}: {exc}", EXIT_USAGE)


@app.command()
def export(
    loop_id: str,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the bundle (JSON).")
    ],
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Export an offline proof bundle: the loop's envelopes, public keys, a fresh signed
    checkpoint and an inclusion proof per receipt."""

    if not output.parent.is_dir():
        fail(f"cannot write {output}: no such directory", EXIT_USAGE, as_json=json_out)

    async def action():
        async with admin.open_kernel(home) as kernel:
            if await kernel.store.read(lambda r: r.loop_row(loop_id)) is None:
                raise NotFound(f"no loop with id {loop_id!r}")
            await kernel.store.write(Txn.checkpoint)
            now = format_time(kernel.store.clock())
            signer = kernel.store.signer
            return await kernel.store.read(
                lambda reader: export_bundle(reader, loop_id, kernel.keyring, now, signer)
            )

    bundle = run(action, as_json=json_out)
    try:
        output.write_text(json.dumps(bundle, indent=2) + "\n")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}", EXIT_USAGE, as_json=json_out)
    summary = {
        "loop_id": loop_id,
        "output": str(output),
        "receipts": len(bundle["receipts"]),
        "checkpoint_size": bundle["checkpoint"]["size"],
        "key_ids": sorted(bundle["public_keys"]),
    }
    if json_out:
        render.emit_json(summary)
    else:
        render.console.print(
            f"wrote {output}: {summary['receipts']} receipts of loop {loop_id}, checkpoint size "
            f"{summary['checkpoint_size']}, keys {', '.join(summary['key_ids'])}"
        )


@app.command("verify-bundle")
def verify_bundle_cmd(
    bundle_file: Annotated[Path, typer.Argument(metavar="BUNDLE")],
    key: Annotated[
        str | None,
        typer.Option("--key", help="Trusted public key (base64), e.g. from `keys export`."),
    ] = None,
    trusted_keys: Annotated[
        Path | None, typer.Option("--trusted-keys", help="JSON {key_id: base64} of trusted keys.")
    ] = None,
    json_out: Json = False,
) -> None:
    """Verify a bundle with no database and no server. With --key/--trusted-keys, a bundle
    signed by any other key fails. Exit 3 on any finding."""
    if key is not None and trusted_keys is not None:
        fail("give --key or --trusted-keys, not both", EXIT_USAGE, as_json=json_out)
    trusted = None
    if key is not None:
        try:
            trusted = Keyring({"k": decode_public_key(key)})
        except LoopwardenError as exc:
            fail(exc.message, EXIT_USAGE, as_json=json_out)
    elif trusted_keys:
        trusted = _load_trusted(trusted_keys)
    try:
        text = bundle_file.read_text()
    except OSError as exc:
        fail(f"cannot read {bundle_file}: {exc.strerror}", EXIT_USAGE, as_json=json_out)
    report = verify_bundle(load_bundle(text), trusted)
    if json_out:
        render.emit_json(report.as_dict())
    else:
        render.bundle(report)
    raise typer.Exit(EXIT_OK if report.clean else EXIT_VERIFY)


# --- approvals -------------------------------------------------------------------------------


@app.command()
def approvals(
    pending: Annotated[
        bool, typer.Option("--pending", help="Only approvals awaiting a decision.")
    ] = False,
    loop: Annotated[str | None, typer.Option("--loop", help="Only this loop.")] = None,
    home: Home = None,
    json_out: Json = False,
) -> None:
    """List approval requests."""

    async def action():
        async with admin.open_kernel(home) as kernel:
            return await kernel.store.read(
                lambda r: r.loop_approvals(loop, "pending" if pending else None)
            )

    rows = run(action, as_json=json_out)
    if json_out:
        render.emit_json({"approvals": [dict(a.__dict__) for a in rows]})
        return
    render.table(
        "approvals",
        ["id", "loop", "tool", "status", "requested by", "expires", "summary"],
        [
            [
                a.approval_id,
                a.loop_id,
                a.tool,
                a.status,
                a.requested_by,
                a.expires_at or "-",
                a.summary,
            ]
            for a in rows
        ],
    )


def parse_duration(text: str) -> int:
    """`90`, `45s`, `30m`, `1h`, `2d` → seconds."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not match:
        raise InvalidInput(f"invalid duration {text!r}: use e.g. 45s, 30m, 1h, 2d")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def _decide(
    approval_id: str, approve_it: bool, expires: str | None, reason: str, home, json_out, who
) -> None:
    async def action():
        seconds = parse_duration(expires) if expires else 3600
        request = _model(
            approvals_op.DecideApprovalRequest,
            approval_id=approval_id,
            approve=approve_it,
            expires_in_seconds=seconds,
            reason=reason,
        )
        async with admin.open_kernel(home) as kernel:
            return await approvals_op.decide_approval(kernel, admin.operator(who), request)

    result = run(action, as_json=json_out)
    if json_out:
        render.emit_json(result.model_dump(mode="json"))
    else:
        until = f" until {result.expires_at}" if result.expires_at else ""
        render.console.print(
            f"approval {result.approval_id} {result.status}{until} (receipt {result.receipt_id})"
        )


@app.command()
def approve(
    approval_id: str,
    expires: Annotated[
        str | None, typer.Option("--expires", help="Lifetime, e.g. 30m, 1h (default 1h).")
    ] = None,
    reason: Reason = "",
    home: Home = None,
    json_out: Json = False,
    who: As = None,
) -> None:
    """Approve a pending approval request."""
    _decide(approval_id, True, expires, reason, home, json_out, who)


@app.command()
def reject(
    approval_id: str,
    reason: Annotated[str, typer.Option("--reason", help="Why (required).")],
    home: Home = None,
    json_out: Json = False,
    who: As = None,
) -> None:
    """Reject a pending approval request."""
    _decide(approval_id, False, None, reason, home, json_out, who)


# --- tokens ----------------------------------------------------------------------------------


@token_app.command("create")
def token_create(
    agent: Annotated[str, typer.Option("--agent", help="The principal the token authenticates.")],
    role: Annotated[str, typer.Option("--role", help="agent or operator.")] = "agent",
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Mint a bearer token (printed once; only its hash is stored)."""

    async def action():
        try:
            principal = Principal(id=agent, role=role)  # type: ignore[arg-type]
        except ValueError:
            raise InvalidInput(
                f"invalid --agent {agent!r} or --role {role!r} (agent|operator)"
            ) from None
        async with admin.open_kernel(home) as kernel:
            return await kernel.store.write(lambda tx: issue_token(tx, principal))

    issued = run(action, as_json=json_out)
    if json_out:
        render.emit_json(
            {
                "token": issued.token,
                "token_id": issued.token_id,
                "agent": issued.agent,
                "role": issued.role,
            }
        )
    else:
        render.console.print(
            f"token for {issued.agent} ({issued.role}), id {issued.token_id} — shown once:"
        )
        print(issued.token)


@token_app.command("list")
def token_list(home: Home = None, json_out: Json = False) -> None:
    """List tokens (ids and principals; never the tokens)."""

    async def action():
        async with admin.open_kernel(home) as kernel:
            return await kernel.store.read(lambda r: r.tokens())

    rows = run(action, as_json=json_out)
    items = [
        {
            "token_id": t.token_id,
            "agent": t.agent,
            "role": t.role,
            "created_at": t.created_at,
            "revoked_at": t.revoked_at,
        }
        for t in rows
    ]
    if json_out:
        render.emit_json({"tokens": items})
    else:
        render.table(
            "tokens",
            ["id", "agent", "role", "created", "revoked"],
            [
                [i["token_id"], i["agent"], i["role"], i["created_at"], i["revoked_at"] or "-"]
                for i in items
            ],
        )


@token_app.command("revoke")
def token_revoke(token_id: str, home: Home = None, json_out: Json = False) -> None:
    """Revoke a token by id; it stops working on the next request."""

    async def action():
        async with admin.open_kernel(home) as kernel:
            await kernel.store.write(lambda tx: revoke_token(tx, token_id))

    run(action, as_json=json_out)
    if json_out:
        render.emit_json({"token_id": token_id, "revoked": True})
    else:
        render.console.print(f"revoked {token_id}")


# --- keys ------------------------------------------------------------------------------------


@keys_app.command("show")
def keys_show(home: Home = None, json_out: Json = False) -> None:
    """The active signing key and every retired public key kept for verification."""
    keys = KeyStore(resolve_home(home))
    try:
        active = keys.load_signer().key_id
        ring = keys.keyring()
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    items = [
        {"key_id": k, "public_key": public_key_b64(v), "active": k == active}
        for k, v in ring.public_keys().items()
    ]
    if json_out:
        render.emit_json({"active": active, "keys": items})
    else:
        render.table(
            "keys",
            ["id", "state", "public key"],
            [[i["key_id"], "active" if i["active"] else "retired", i["public_key"]] for i in items],
        )


@keys_app.command("rotate")
def keys_rotate(home: Home = None, json_out: Json = False) -> None:
    """Make a new active key; the old private key is deleted, its public key kept.
    Restart running servers to sign with the new key."""
    old, new = KeyStore(resolve_home(home)).rotate()
    if json_out:
        render.emit_json(
            {"retired": old, "active": new.key_id, "public_key": public_key_b64(new.public_key)}
        )
    else:
        render.console.print(
            f"active key is now {new.key_id}"
            + (f"; {old} retired (public key kept)" if old else "")
        )


@keys_app.command("export")
def keys_export(home: Home = None, json_out: Json = False) -> None:
    """Print the current public key (base64) and its id, for auditors (`verify-bundle --key`)."""
    try:
        signer = KeyStore(resolve_home(home)).load_signer()
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    if json_out:
        render.emit_json({"key_id": signer.key_id, "public_key": public_key_b64(signer.public_key)})
    else:
        print(f"{public_key_b64(signer.public_key)} {signer.key_id}")


# --- policy ----------------------------------------------------------------------------------


@policy_app.command("check")
def policy_check(file: Path, json_out: Json = False) -> None:
    """Validate a policy file and print its digest."""
    try:
        policy = read_policy_file(file)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out, error=exc.code)
    digest = policy_digest(policy)
    notes = []
    if not policy.agents:
        notes.append("no agents are allowed: nobody can claim a turn")
    if not policy.tools.allow and not policy.tools.approval:
        notes.append("no tool is allowed: every reported tool use will be refused")
    if json_out:
        render.emit_json(
            {
                "valid": True,
                "digest": digest,
                "notes": notes,
                "policy": policy_document(policy),
            }
        )
    else:
        render.console.print(f"[green]valid[/green] {file.name}  {digest}")
        for note in notes:
            render.console.print(f"[yellow]note:[/yellow] {note}")


@policy_app.command("schema")
def policy_schema_cmd() -> None:
    """Print the policy JSON Schema."""
    render.emit_json(policy_schema())


@policy_app.command("explain")
def policy_explain(
    file: Path,
    tool: Annotated[list[str], typer.Option("--tool", help="Tool name to classify (repeatable).")],
    json_out: Json = False,
) -> None:
    """Say whether each tool is allowed, denied or needs approval, and which pattern decided."""
    try:
        policy = read_policy_file(file)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out, error=exc.code)
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
            render.console.print(f"[{color}]{v.effect:8}[/{color}] {v.explain()}")


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
