"""`loopwarden token create | list | revoke`: bearer tokens for streamable HTTP."""

from __future__ import annotations

from typing import Annotated

import typer

from loopwarden.clients import admin, render
from loopwarden.clients.cli.common import Home, Json, run
from loopwarden.ledger.reader import TokenRow
from loopwarden.principals import principal
from loopwarden.server.tokens import IssuedToken, issue_token, revoke_token

app = typer.Typer(no_args_is_help=True, help="Bearer tokens for streamable HTTP.")


@app.command("create")
def token_create(
    agent: Annotated[str, typer.Option("--agent", help="The principal the token authenticates.")],
    role: Annotated[str, typer.Option("--role", help="agent or operator.")] = "agent",
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Mint a bearer token, printed once (only its hash is stored).

    The token alone goes to stdout, so `TOKEN=$(loopwarden token create --agent NAME)` works.
    """

    async def action() -> IssuedToken:
        who = principal(agent, role)
        async with admin.open_store(home) as store:
            return await store.write(lambda tx: issue_token(tx, who))

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
    else:  # the token alone on stdout: TOKEN=$(loopwarden token create --agent NAME)
        render.err.print(
            f"token for {issued.agent} ({issued.role}), id {issued.token_id} — shown once:"
        )
        print(issued.token)


@app.command("list")
def token_list(home: Home = None, json_out: Json = False) -> None:
    """List tokens (ids and principals; never the tokens)."""

    async def action() -> list[TokenRow]:
        async with admin.open_store(home, create=False) as store:
            return await store.read(lambda r: r.tokens())

    items = [
        {
            "token_id": t.token_id,
            "agent": t.agent,
            "role": t.role,
            "created_at": t.created_at,
            "revoked_at": t.revoked_at,
        }
        for t in run(action, as_json=json_out)
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


@app.command("revoke")
def token_revoke(token_id: str, home: Home = None, json_out: Json = False) -> None:
    """Revoke a token by id; it stops working on the next request."""

    async def action() -> None:
        async with admin.open_store(home, create=False) as store:
            await store.write(lambda tx: revoke_token(tx, token_id))

    run(action, as_json=json_out)
    if json_out:
        render.emit_json({"token_id": token_id, "revoked": True})
    else:
        render.console.print(f"revoked {token_id}")
