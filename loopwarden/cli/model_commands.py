"""`loopwarden model key set|list | token | prices`: the model gateway's keys, tokens and prices
(docs/model-gateway.md)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from loopwarden.auth.tokens import IssuedToken, issue_token
from loopwarden.cli.common import Options, run, shared_options
from loopwarden.cli.token_commands import _lifetime
from loopwarden.clients import admin, render
from loopwarden.clock import format_time
from loopwarden.errors import InvalidInput, NotFound
from loopwarden.kernel.store.homes import resolve_home
from loopwarden.kernel.store.store import Txn
from loopwarden.model_gateway.prices import PriceTable
from loopwarden.principals import principal

app = typer.Typer(no_args_is_help=True, help="The model gateway: provider keys, tokens, prices.")
keys = typer.Typer(no_args_is_help=True, help="The providers' keys the gateway holds.")
app.add_typer(keys, name="key")


def _provider(name: str) -> str:
    from loopwarden.model_gateway.provider_registry import registry

    known = registry()
    if name not in known:
        raise InvalidInput(f"unknown provider {name!r} (known: {', '.join(sorted(known))})")
    return name


@keys.command("set")
@shared_options("home", "json")
def key_set(
    provider: Annotated[str, typer.Argument(help="anthropic, openai or gemini.")],
    *,
    options: Options,
) -> None:
    """Store a provider's key, read from stdin.

    Never an argument: those show in `ps`. The key is kept in the home (`model-keys/PROVIDER`, 0600); it never leaves loopwarden but
    in the calls the gateway sends that provider.
    """
    from loopwarden.model_gateway.credentials import write_key

    async def action() -> str:
        _provider(provider)
        text = sys.stdin.readline()
        return str(write_key(resolve_home(options.home), provider, text))

    where = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json({"provider": provider, "stored": True})
    else:
        render.err.print(f"the {provider} key is stored ({where}, mode 0600)", markup=False)


@keys.command("list")
@shared_options("home", "json")
def key_list(*, options: Options) -> None:
    """The providers the gateway holds a key for (never the keys)."""
    from loopwarden.model_gateway.credentials import stored_providers

    async def action() -> list[str]:
        return stored_providers(resolve_home(options.home))

    names = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json({"providers": names})
    else:
        render.table("model keys", ["provider"], [[n] for n in names])


@app.command("token")
@shared_options("home", "store", "json")
def model_token(
    agent: Annotated[str, typer.Option("--agent", help="The agent whose model calls it carries.")],
    loop: Annotated[str, typer.Option("--loop", help="The one loop its calls are charged to.")],
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="Lifetime, e.g. 12h, 30d (default: never expires)."),
    ] = None,
    *,
    options: Options,
) -> None:
    """A gateway token for one agent in one loop, printed once.

    The host puts it where the provider key goes (ANTHROPIC_API_KEY, OPENAI_API_KEY,
    GEMINI_API_KEY); it is taken by the model gateway only, and revoked like any token
    (`loopwarden token revoke ID`).
    """

    async def action() -> IssuedToken:
        who = principal(agent, "observer")
        lifetime = _lifetime(expires)
        async with admin.open_store(options.home, store=options.store) as opened:

            def mint(tx: Txn) -> IssuedToken:
                if tx.rows.loop_row(loop) is None:
                    raise NotFound(f"no loop with id {loop!r}")
                return issue_token(tx, who, lifetime, loop_id=loop)

            return await opened.write(mint)

    issued = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json(
            {
                "token": issued.token,
                "token_id": issued.token_id,
                "agent": issued.agent,
                "loop_id": issued.loop_id,
                "expires_at": issued.expires_at,
            }
        )
    else:
        until = f", expires {format_time(issued.expires_at)}" if issued.expires_at else ""
        render.err.print(
            f"gateway token for {issued.agent} in loop {issued.loop_id}, id {issued.token_id}"
            f"{until} — shown once:",
            markup=False,
        )
        print(issued.token)


@app.command("prices")
@shared_options("home", "json")
def model_prices(
    prices: Annotated[
        str | None,
        typer.Option(
            "--model-prices", metavar="FILE", help="An operator's table over the shipped one."
        ),
    ] = None,
    *,
    options: Options,
) -> None:
    """The prices the gateway charges by, dated, with their source.

    US dollars per million tokens: input, output, cache write, cache read, and each model's
    most output in one call. `--model-prices FILE` shows an operator's table over them.
    """
    from pathlib import Path

    from loopwarden.model_gateway.gateway_config import gateway_settings

    async def action() -> PriceTable:
        home = resolve_home(options.home)
        return gateway_settings(home, None, Path(prices) if prices else None, None).prices

    table = run(action, as_json=options.json_out)
    rows = table.rows()
    if options.json_out:
        render.emit_json(
            {
                "as_of": table.as_of,
                "source": table.source,
                "overridden": table.overridden,
                "models": {k: e.model_dump(exclude_none=True) for k, e in rows},
                "default": table.default.model_dump(exclude_none=True) if table.default else None,
            }
        )
        return
    render.err.print(
        f"prices as of {table.as_of}{' (with the operator' + chr(39) + 's table)' if table.overridden else ''}; "
        f"source: {table.source}",
        markup=False,
    )
    render.table(
        "model prices (USD per million tokens)",
        ["model", "input", "output", "cache write", "cache read", "max output"],
        [
            [
                key,
                f"{e.input:g}",
                f"{e.output:g}",
                f"{e.cache_write if e.cache_write is not None else e.input:g}",
                f"{e.cache_read if e.cache_read is not None else e.input:g}",
                f"{e.max_output:,}",
            ]
            for key, e in rows
        ],
    )
