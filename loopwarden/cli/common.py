"""What every admin command shares: options, exit codes, error mapping, running an operation."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import anyio
import typer

from loopwarden.clients import admin, render
from loopwarden.errors import IntegrityError, InvalidInput, LoopwardenError, one_line
from loopwarden.kernel.runner.operation import Operation, Req, Res
from loopwarden.policy.loader import format_for, parse_policy
from loopwarden.policy.model import LoopPolicy

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_VERIFY = 0, 1, 2, 3
T = TypeVar("T")

Home = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Data directory (default: $LOOPWARDEN_HOME, else the user data dir)."
    ),
]
Store = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        help="The store: sqlite:///PATH or postgresql://… (default: $LOOPWARDEN_STORE, else the "
        "home's SQLite file). Keys always come from the home.",
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
Reason = Annotated[str, typer.Option("--reason", help="Why (recorded in the receipt).")]

# The options most commands take, by the name `shared_options` knows them: each one's parameter
# (the name typer, --help and the root's `pass_down` know it by), declaration and default.
SHARED: dict[str, tuple[str, Any, Any]] = {
    "home": ("home", Home, None),
    "store": ("store", Store, None),
    "json": ("json_out", Json, False),
    "as": ("who", As, None),
}


@dataclass(frozen=True)
class Options:
    """The shared options as a command receives them: the data home and store it acts on,
    whether it answers in JSON, and the operator it acts as (`--as`)."""

    home: Path | None = None
    store: str | None = None
    json_out: bool = False
    who: str | None = None

    def operate(
        self,
        op: Operation[Req, Res],
        request: dict[str, Any],
        *,
        check: bool = True,
        create: bool | None = None,
    ) -> Res:
        """Run one operation as the operator `who`, on the store `store` names, else `home`'s
        (the same runner as every edge).

        Only an operation that writes and names nothing stored (`loop open`) may create the
        store; one that reads, or acts on a loop or approval, needs an existing database and
        creates nothing (`admin.existing_home`): a mistyped home is an error, not a new empty
        store. `check=False` skips the store's startup check: `receipts` and `receipt` keep
        working on a damaged store, so that an operator can look at what is there. `create`
        overrides which operations may create the store (False for a write about something
        that must exist)."""
        if create is None:
            create = op.access == "write" and op.scope is None

        async def action() -> Res:
            async with admin.open_store(
                self.home, store=self.store, check=check, create=create
            ) as opened:
                return await op(opened, admin.operator(self.who), request)

        return run(action, as_json=self.json_out)


def gather(
    name: str, added: list[inspect.Parameter], build: Callable[[dict[str, Any]], Any]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the parameters `added` where its parameter `name` stands: typer sees, and
    --help lists, each one as a parameter of its own, and the command receives `build` of their
    values (by parameter name) as `name`. The command's annotations must resolve when it is
    decorated (a NameError otherwise)."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn, eval_str=True)
        fields = [parameter.name for parameter in added]
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name == name:
                parameters += [p.replace(kind=parameter.kind) for p in added]
            else:
                parameters.append(parameter)

        @functools.wraps(fn)
        def command(**given: Any) -> None:
            gathered = build({field: given.pop(field) for field in fields})
            fn(**given, **{name: gathered})

        # typer reads a command's parameters from its signature: this one declares them all
        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return command

    return decorate


def shared_options(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the shared options `names` (keys of SHARED), in that order, where its
    keyword-only parameter `options: Options` stands (`gather`): the command receives them as
    one `Options`."""
    added = [
        inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=t)
        for field, t, default in (SHARED[name] for name in names)
    ]
    return gather("options", added, lambda given: Options(**given))


def fail(
    message: str, code: int = EXIT_REFUSED, *, as_json: bool = False, error: str = "error"
) -> NoReturn:
    if as_json:
        render.emit_json({"error": error, "message": message})
    render.err.print(f"[red]error:[/red] {render.safe(one_line(message))}")
    raise typer.Exit(code)


def exit_code(exc: LoopwardenError) -> int:
    if isinstance(exc, IntegrityError):
        return EXIT_VERIFY
    if isinstance(exc, InvalidInput):
        return EXIT_USAGE
    return EXIT_REFUSED


def run(fn: Callable[..., Awaitable[T]], *args: Any, as_json: bool = False) -> T:
    """Run an async admin action, mapping loopwarden errors to exit codes."""
    try:
        return anyio.run(fn, *args)
    except LoopwardenError as exc:
        fail(exc.message, exit_code(exc), as_json=as_json, error=exc.code)


def control_command(
    op: Operation[Any, Any], what: str, field: str, named: Any, doc: str
) -> Callable[..., None]:
    """The command that runs an operator control (`pause_loop`, `pool_pause` …) on the `what`
    (loop, pool) its argument names, with `--reason`: `named` is the argument's typer
    declaration, `field` the request field it fills. It never creates the store."""

    @shared_options("home", "store", "json", "as")
    def command(name: str = named, reason: Reason = "", *, options: Options) -> None:
        result = options.operate(op, {field: name, "reason": reason}, create=False)
        if options.json_out:
            render.emit_json(result.model_dump(mode="json"))
            return
        render.controlled(what, name, result.status, result.receipt_id)

    command.__doc__ = doc
    return command


def read_policy_file(path: Path) -> LoopPolicy:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"cannot read policy file {path}: {exc.strerror}") from None
    return parse_policy(text, format_for(path.name), source=path.name)


def parse_duration(text: str) -> int:
    """`90`, `45s`, `30m`, `1h`, `2d` → seconds."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not match:
        raise InvalidInput(f"invalid duration {text!r}: use e.g. 45s, 30m, 1h, 2d")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
