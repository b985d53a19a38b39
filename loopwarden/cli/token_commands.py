"""`loopwarden token create | list | revoke`: bearer tokens for streamable HTTP."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from loopwarden.auth.tokens import IssuedToken, issue_token, revoke_token
from loopwarden.cli.common import Options, parse_duration, run, shared_options
from loopwarden.clients import admin, render
from loopwarden.clock import format_time
from loopwarden.errors import InvalidInput
from loopwarden.kernel.store.reader import TokenRow
from loopwarden.principals import principal

app = typer.Typer(no_args_is_help=True, help="Bearer tokens for streamable HTTP.")


@app.command("create")
@shared_options("home", "store", "json")
def token_create(
    agent: Annotated[str, typer.Option("--agent", help="The principal the token authenticates.")],
    role: Annotated[
        str,
        typer.Option(
            "--role", help="agent, operator, or observer (a host's hooks, for one agent)."
        ),
    ] = "agent",
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="Lifetime, e.g. 30m, 12h, 30d (default: never expires)."),
    ] = None,
    *,
    options: Options,
) -> None:
    """Mint a bearer token, printed once (only its hash is stored).

    The token alone goes to stdout, so `TOKEN=$(loopwarden token create --agent NAME)` works.
    """

    async def action() -> IssuedToken:
        who = principal(agent, role)
        lifetime = _lifetime(expires)
        async with admin.open_store(options.home, store=options.store) as opened:
            return await opened.write(lambda tx: issue_token(tx, who, lifetime))

    issued = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json(
            {
                "token": issued.token,
                "token_id": issued.token_id,
                "agent": issued.agent,
                "role": issued.role,
                "expires_at": issued.expires_at,
            }
        )
    else:  # the token alone on stdout: TOKEN=$(loopwarden token create --agent NAME)
        until = f", expires {format_time(issued.expires_at)}" if issued.expires_at else ""
        render.err.print(
            f"token for {issued.agent} ({issued.role}), id {issued.token_id}{until} — shown once:",
            markup=False,
        )
        print(issued.token)


def _lifetime(text: str | None) -> timedelta | None:
    if text is None:
        return None
    seconds = parse_duration(text)
    if seconds <= 0:
        raise InvalidInput(f"--expires must be a positive duration (got {text!r})")
    return timedelta(seconds=seconds)


@app.command("list")
@shared_options("home", "store", "json")
def token_list(*, options: Options) -> None:
    """List tokens (ids and principals; never the tokens)."""

    async def action() -> list[TokenRow]:
        async with admin.open_store(options.home, store=options.store, create=False) as opened:
            return await opened.read(lambda r: r.tokens())

    items = [
        {
            "token_id": t.token_id,
            "agent": t.agent,
            "role": t.role,
            "created_at": t.created_at,
            "revoked_at": t.revoked_at,
            "expires_at": t.expires_at,
            "loop_id": t.loop_id,  # a model gateway token's one loop (null for any other)
        }
        for t in run(action, as_json=options.json_out)
    ]
    if options.json_out:
        render.emit_json({"tokens": items})
    else:
        render.table(
            "tokens",
            ["id", "agent", "role", "created", "revoked", "expires", "loop"],
            [
                [
                    i["token_id"],
                    i["agent"],
                    i["role"],
                    i["created_at"],
                    i["revoked_at"] or "-",
                    i["expires_at"] or "never",
                    i["loop_id"] or "-",
                ]
                for i in items
            ],
        )


@app.command("revoke")
@shared_options("home", "store", "json")
def token_revoke(token_id: str, *, options: Options) -> None:
    """Revoke a token by id; it stops working on the next request."""

    async def action() -> None:
        async with admin.open_store(options.home, store=options.store, create=False) as opened:
            await opened.write(lambda tx: revoke_token(tx, token_id))

    run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json({"token_id": token_id, "revoked": True})
    else:
        render.console.print(f"revoked {token_id}")
