"""`loopwarden witness …`: run a witness, and see what the witnesses say of this log.

A witness (`init`, `show`, `serve`) is meant for another party to run, on another machine, with
its own key and store; the rest act on this home's log: its key in the form a witness trusts
(`log-key`), where each witness stands (`status`), a submission now (`push`), and clearing a
conflict an operator has looked into (`clear`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer

from loopwarden.cli.common import EXIT_USAGE, Options, fail, run, shared_options
from loopwarden.clients import admin, render
from loopwarden.clock import format_optional
from loopwarden.errors import InvalidInput, LoopwardenError
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.homes import resolve_home

app = typer.Typer(no_args_is_help=True, help="Witnesses: independent cosigners of checkpoints.")

WitnessDir = Annotated[Path, typer.Argument(metavar="DIR", help="The witness's directory.")]
PolicyFile = Annotated[
    Path,
    typer.Option("--policy", metavar="FILE", help="A tlog-policy file; witnesses with URLs."),
]


@app.command("init")
@shared_options("home", "json")
def witness_init(
    directory: WitnessDir,
    name: Annotated[
        str, typer.Option(help="The witness's key name: a schema-less URL (example.org/w1).")
    ],
    *,
    options: Options,
) -> None:
    """Make a witness: a new key under NAME in DIR.

    The key is Ed25519, its file mode 0600. Prints the witness's verifier key, which the
    `witness` line of an auditor's policy takes. --home is accepted and ignored.
    """
    from loopwarden.witnesses.witness_home import init_witness

    try:
        cosigner = init_witness(directory, name)
    except (LoopwardenError, ValueError) as exc:
        fail(getattr(exc, "message", str(exc)), EXIT_USAGE, as_json=options.json_out)
    _print_vkey(str(cosigner.vkey), name, options.json_out)


@app.command("show")
@shared_options("home", "json")
def witness_show(directory: WitnessDir, *, options: Options) -> None:
    """Print a witness's verifier key.

    A tlog-cosignature vkey (signature type 0x04). --home is accepted and ignored.
    """
    from loopwarden.witnesses.witness_home import load_cosigner

    try:
        cosigner = load_cosigner(directory)
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    _print_vkey(str(cosigner.vkey), cosigner.name, options.json_out)


def _print_vkey(vkey: str, name: str, json_out: bool) -> None:
    if json_out:
        render.emit_json({"name": name, "vkey": vkey})
    else:
        print(vkey)


def _listen(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d{1,5})", text.strip())
    if not match or int(match.group(2)) > 65535:
        raise InvalidInput(f"--listen expects HOST:PORT, e.g. 127.0.0.1:7380 (got {text!r})")
    return match.group(1), int(match.group(2))


@app.command("serve")
@shared_options("home", "json")
def witness_serve(
    directory: WitnessDir,
    log: Annotated[
        list[str],
        typer.Option(
            "--log",
            metavar="VKEY",
            help="A log key to trust (`loopwarden witness log-key` prints one); repeat.",
        ),
    ],
    listen: Annotated[
        str, typer.Option(metavar="HOST:PORT", help="Where to serve (port 0: any free one).")
    ] = "127.0.0.1:7380",
    *,
    options: Options,
) -> None:
    """Serve a witness (C2SP tlog-witness) from DIR.

    POST /add-checkpoint and GET /<sha256 of the origin, hex>/checkpoint. It cosigns a
    checkpoint of a log it trusts only if the checkpoint is consistent with the latest one it
    cosigned for that log, and never rolls back. Prints where it listens on stderr (with --json,
    as a JSON object on stdout). --home is accepted and ignored.
    """
    import uvicorn

    from loopwarden.server.transports import configure_logging
    from loopwarden.server.transports import listen as bind
    from loopwarden.witnesses.cosigner import WitnessService
    from loopwarden.witnesses.cosigner_store import STORE_NAME, CosignerStore
    from loopwarden.witnesses.vkeys import ED25519, parse_vkey
    from loopwarden.witnesses.witness_home import load_cosigner, witness_app

    configure_logging()
    try:
        host, port = _listen(listen)
        logs = [parse_vkey(text, kind=ED25519) for text in log]
        cosigner = load_cosigner(directory)
        sock = bind(host, port)
    except ValueError as exc:
        fail(f"--log: {exc}", EXIT_USAGE)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE if isinstance(exc, InvalidInput) else 1, error=exc.code)
    store = CosignerStore(directory / STORE_NAME)
    service = WitnessService(cosigner, logs, store)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    if options.json_out:
        render.emit_json({"witness": cosigner.name, "url": url, "vkey": str(cosigner.vkey)})
    render.err.print(
        f"witness {cosigner.name} serving on {url} "
        f"({render.counted(len(logs), 'log')}; vkey {cosigner.vkey})"
    )
    config = uvicorn.Config(witness_app(service), log_level="warning", lifespan="off")
    try:
        anyio.run(uvicorn.Server(config).serve, [sock])
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


@app.command("log-key")
@shared_options("home", "store", "json")
def witness_log_key(*, options: Options) -> None:
    """Print this log's verifier key, for witnesses and policies.

    Its origin and active signing key, as a signed-note vkey (type 0x01). A witness trusts the
    log with it (`witness serve --log VKEY`), and an auditor's policy names the log with it
    (`log VKEY`).
    """
    from loopwarden.witnesses.vkeys import ED25519, VerifierKey

    try:
        with admin.open_reader(options.home, store=options.store) as reader:
            origin = reader.meta("origin")
        signer = KeyStore(resolve_home(options.home)).load_signer()
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    if origin is None:
        fail("the store has no origin", as_json=options.json_out)
    vkey = str(VerifierKey(origin, ED25519, signer.public_key))
    if options.json_out:
        render.emit_json({"origin": origin, "key_id": signer.key_id, "vkey": vkey})
    else:
        print(vkey)


def _status(reader: Any) -> dict[str, Any]:
    latest = reader.latest_checkpoint()
    cosigned = reader.cosignatures(latest.size) if latest is not None else []
    return {
        "log_size": reader.log_state().size,
        "checkpoint_size": latest.size if latest is not None else 0,
        "cosigned_by": sorted({c.witness for c in cosigned}),
        "witnesses": [
            {
                "witness": row.vkey.split("+")[0],
                "vkey": row.vkey,
                "url": row.url,
                "cosigned": row.cosigned,
                "last_success": format_optional(row.succeeded_at),
                "last_error": row.error,
                "last_error_at": format_optional(row.failed_at) if row.error else None,
                "failures": row.failures,
                "conflict": row.conflict,
                "conflict_at": format_optional(row.conflict_at),
            }
            for row in reader.witness_rows()
        ],
    }


@app.command("status")
@shared_options("home", "store", "json")
def witness_status(*, options: Options) -> None:
    """Show where each witness stands for this log.

    The size it holds, its last success and error, and any conflict (exit 3 if one is
    recorded: a witness holds a view of this log that the log does not extend).
    """
    try:
        with admin.open_reader(options.home, store=options.store) as reader:
            status = _status(reader)
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    conflicts = [w for w in status["witnesses"] if w["conflict"]]
    if options.json_out:
        render.emit_json(status)
    else:
        render.console.print(
            f"log size {status['log_size']}; latest checkpoint {status['checkpoint_size']}, "
            f"cosigned by {', '.join(status['cosigned_by']) or 'no witness'}"
        )
        rows = [
            [
                w["witness"],
                w["cosigned"],
                w["last_success"] or "never",
                f"{w['last_error']} at {w['last_error_at']}" if w["last_error"] else "-",
                f"CONFLICT: {w['conflict']}" if w["conflict"] else "-",
            ]
            for w in status["witnesses"]
        ]
        if rows:
            render.table(
                "witnesses", ["witness", "holds", "last success", "last error", "alarm"], rows
            )
        else:
            render.console.print("no witness has been asked (serve --witness FILE asks them)")
    raise typer.Exit(3 if conflicts else 0)


@app.command("push")
@shared_options("home", "store", "json")
def witness_push(policy_file: PolicyFile, *, options: Options) -> None:
    """Submit a fresh checkpoint to the witnesses now.

    Signs a checkpoint of the whole log, submits it to the policy's witnesses (their URLs),
    and prints where each stands (exit 3 if a witness answered with a conflict).
    """
    from loopwarden.witnesses.submitter import Pacing, push_once
    from loopwarden.witnesses.witness_policy import load_policy

    try:
        policy = load_policy(policy_file, urls=True)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=options.json_out)

    async def action() -> dict[str, Any]:
        async with admin.open_store(options.home, store=options.store, create=False) as opened:
            await opened.checkpoint()
            await push_once(opened, policy, Pacing(checkpoint_after=None))
            return await opened.read(_status)

    status = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json(status)
    else:
        render.console.print(
            f"checkpoint {status['checkpoint_size']} cosigned by "
            f"{', '.join(status['cosigned_by']) or 'no witness'}"
        )
        for w in status["witnesses"]:
            if w["conflict"]:
                render.console.print(f"  [red]CONFLICT[/red] {w['witness']}: {w['conflict']}")
            elif w["last_error"]:
                render.console.print(f"  {w['witness']}: {w['last_error']}")
    raise typer.Exit(3 if any(w["conflict"] for w in status["witnesses"]) else 0)


@app.command("clear")
@shared_options("home", "store", "json")
def witness_clear(
    witness: Annotated[str, typer.Argument(metavar="VKEY", help="The witness's verifier key.")],
    *,
    options: Options,
) -> None:
    """Clear a witness's recorded conflict.

    Once an operator has found its cause: the alarm stays in the logs and the metrics, and
    `verify` stops failing on it.
    """

    async def action() -> bool:
        async with admin.open_store(options.home, store=options.store, create=False) as opened:
            cleared: bool = await opened.write(lambda tx: tx.witnesses.clear_conflict(witness))
            return cleared

    cleared = run(action, as_json=options.json_out)
    if options.json_out:
        render.emit_json({"cleared": cleared})
    elif cleared:
        render.console.print("conflict cleared")
    else:
        fail("no conflict is recorded for that witness", as_json=options.json_out)
