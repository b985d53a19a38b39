"""Which data home a command uses: `loopwarden home`, the root `--home`/`--json`, the help line.

Every command resolves one home the same way (`--home DIR`, else `LOOPWARDEN_HOME`, else the
platform's user data dir). The root options are handed down to whichever subcommand runs as
its defaults, so `loopwarden --home X loop open …` and `loopwarden loop open … --home X` are
the same command (the subcommand's own option wins if both are given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from loopwarden.cli.common import Options, shared_options
from loopwarden.clients import render
from loopwarden.clients.admin import SOURCES
from loopwarden.kernel.store.homes import DB_NAME, home_source


def pass_down(ctx: typer.Context, **values: Any) -> None:
    """Make the root's given options (`home`, `json_out`) the defaults of every subcommand."""
    given = {name: value for name, value in values.items() if value not in (None, False)}
    if given:
        ctx.default_map = _defaults(ctx.command, {k: str(v) for k, v in given.items()})


def _defaults(command: Any, values: dict[str, Any]) -> dict[str, Any]:
    """click's `default_map` for `command`: a group maps each subcommand's name to its own map
    (a group's map holds no option values, so an option and a command may share a name)."""
    commands = getattr(command, "commands", None)
    if commands is None:
        return dict(values)
    return {name: _defaults(sub, values) for name, sub in commands.items()}


def origin(path: Path, source: str) -> str:
    """Where a home came from and whether it holds a database, e.g. `given by --home; no database yet`."""
    state = "holds a database" if (path / DB_NAME).is_file() else "no database yet"
    return f"{SOURCES[source]}; {state}"


class RootGroup(TyperGroup):
    """The root command: its help ends with the home a command would use, and the exit codes."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        path, source = home_source()
        with formatter.indentation():
            formatter.write_paragraph()  # the path unwrapped: it must not break at a hyphen
            indent = " " * formatter.current_indent
            formatter.write(f"{indent}Data home: {path} ({origin(path, source)}).\n")
            formatter.write_paragraph()
            formatter.write_text(
                "Exit codes: 0 ok, 1 refused / not found / failed, 2 usage or invalid input, "
                "3 verification failed."
            )


@shared_options("home", "json")
def home(*, options: Options) -> None:
    """Print the data home commands use.

    The directory that holds the database and the keys, and where that choice came from
    (--home, $LOOPWARDEN_HOME or the platform default). The path alone goes to stdout.
    """
    path, source = home_source(options.home)
    database = path / DB_NAME
    if options.json_out:
        render.emit_json(
            {
                "home": str(path),
                "source": source,
                "database": str(database),
                "exists": database.is_file(),
            }
        )
        return
    print(path)  # alone on stdout, for scripts: cd "$(loopwarden home)"
    render.err.print(f"[dim]{origin(path, source)}[/dim]")
