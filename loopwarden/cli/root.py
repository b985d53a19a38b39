"""`loopwarden`: the server and the operator's admin tool, one module per command group.

Exit codes: 0 ok · 1 refused, not found or failed · 2 usage or invalid input ·
3 verification failed (tampering found, or a damaged store refused to open).
"""

from __future__ import annotations

from typing import Annotated

import typer

from loopwarden import __version__
from loopwarden.cli import approval_commands as approvals
from loopwarden.cli import audit_commands as audits
from loopwarden.cli import dashboard_commands as dashboard
from loopwarden.cli import doctor
from loopwarden.cli import export_commands as exports
from loopwarden.cli import gateway_commands as gateways
from loopwarden.cli import home_commands as homes
from loopwarden.cli import hook_commands as hooks
from loopwarden.cli import journal_commands as journal
from loopwarden.cli import key_commands as keys
from loopwarden.cli import loop_commands as loops
from loopwarden.cli import model_commands as models
from loopwarden.cli import policy_commands as policies
from loopwarden.cli import pool_commands as pools
from loopwarden.cli import serve_commands as server
from loopwarden.cli import store_commands as stores
from loopwarden.cli import token_commands as tokens
from loopwarden.cli import witness_commands as witnesses
from loopwarden.cli.common import Options, shared_options

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="loopwarden: govern long-running AI agent loops with signed, Merkle-logged receipts.",
    pretty_exceptions_enable=False,
    cls=homes.RootGroup,
    rich_markup_mode=None,  # click's plain help: no `<bool>` on flags, docstrings re-wrapped
)
app.add_typer(loops.app, name="loop")
app.add_typer(tokens.app, name="token")
app.add_typer(keys.app, name="keys")
app.add_typer(policies.app, name="policy")
app.add_typer(stores.app, name="store")
app.add_typer(pools.app, name="pool")
app.add_typer(models.app, name="model")
app.add_typer(gateways.app, name="gateway")
app.add_typer(witnesses.app, name="witness")
hooks.app.command("doctor")(doctor.doctor)
app.add_typer(hooks.app, name="hook")
app.command()(server.serve)
app.command()(server.demo)
app.command()(dashboard.dashboard)
app.command()(journal.receipts)
app.command()(journal.receipt)
app.command()(journal.events)
app.command()(journal.checkpoint)
app.command("export-status")(exports.export_status)
app.command()(audits.verify)
app.command()(audits.export)
app.command("verify-bundle")(audits.verify_bundle_cmd)
app.command()(approvals.approvals)
app.command()(approvals.approve)
app.command()(approvals.reject)
app.command()(homes.home)


@app.callback(invoke_without_command=True)
@shared_options("home", "store", "json")
def _main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    *,
    options: Options,
) -> None:
    homes.pass_down(ctx, home=options.home, store=options.store, json_out=options.json_out)
    if version:
        print(__version__)
        raise typer.Exit()


def main() -> None:
    app()


__all__ = ["app", "main"]
