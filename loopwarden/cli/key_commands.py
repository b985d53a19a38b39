"""`loopwarden keys show | rotate | export`: the signing keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loopwarden.cli.common import EXIT_USAGE, Options, fail, parse_duration, shared_options
from loopwarden.clients import admin, render
from loopwarden.clients.keyfiles import key_line
from loopwarden.clock import format_time
from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.kernel.log.keys import (
    DEFAULT_GRACE_SECONDS,
    Keyring,
    KeyStore,
    Signer,
    public_key_b64,
)
from loopwarden.kernel.store.homes import home_source, private_dir, resolve_home

app = typer.Typer(no_args_is_help=True, help="Signing keys.")


@app.command("show")
@shared_options("home", "json")
def keys_show(*, options: Options) -> None:
    """List the signing keys: the active one and retired ones.

    Retired public keys are kept so that old receipts still verify.
    """
    signer, ring = _existing_keys(options.home, options.json_out)
    active = signer.key_id
    items = [
        {"key_id": k, "public_key": public_key_b64(v), "active": k == active}
        for k, v in ring.public_keys().items()
    ]
    if options.json_out:
        render.emit_json({"active": active, "keys": items})
    else:
        render.table(
            "keys",
            ["id", "state", "public key"],
            [[i["key_id"], "active" if i["active"] else "retired", i["public_key"]] for i in items],
        )


@app.command("rotate")
@shared_options("home", "json")
def keys_rotate(
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            help="How long the retired key may still sign (e.g. 60s, 30m, 1h): the time every "
            "server needs to get the new key. Servers sharing this home switch within a second.",
        ),
    ] = f"{DEFAULT_GRACE_SECONDS}s",
    *,
    options: Options,
) -> None:
    """Make a new active signing key; retire the old one.

    The key history records the handover, signed by both keys, and the time after which the
    old key signs nothing (now plus --grace).

    Servers sharing this home sign with the new key within a second; a server that cannot get
    it refuses to sign after that time, and `loopwarden verify` reports any receipt the old
    key signed later.

    The old private key is deleted and its public key kept, so old receipts still verify.
    """
    try:
        seconds = parse_duration(grace)
    except LoopwardenError as exc:
        fail(f"--grace: {exc.message}", EXIT_USAGE, as_json=options.json_out)
    try:
        rotated = KeyStore(resolve_home(options.home)).rotate(seconds)
    except LoopwardenError as exc:
        fail(exc.message, as_json=options.json_out, error=exc.code)
    old, new = rotated.retired, rotated.signer
    until = None if rotated.until is None else format_time(rotated.until)
    if options.json_out:
        render.emit_json(
            {
                "retired": old,
                "active": new.key_id,
                "public_key": public_key_b64(new.public_key),
                "retired_signs_until": until,
            }
        )
    else:
        render.console.print(
            f"active key is now {new.key_id}"
            + (f"; {old} retired (public key kept), signs nothing after {until}" if old else "")
        )


def _existing_keys(home: Path | None, json_out: bool) -> tuple[Signer, Keyring]:
    """The active signer and every public key of a home that has keys: a database is not
    needed (a replica's home may hold keys only, made by `keys rotate`). A home without keys is
    an error (exit 1), and nothing is created."""
    path, source = home_source(home)
    try:
        keys = KeyStore(path)
        if keys.active_id() is None:
            raise NotFound(
                f"there are no signing keys in {path} ({admin.SOURCES[source]}); check --home or "
                "LOOPWARDEN_HOME ('loopwarden home' shows which home is used)"
            )
        private_dir(path)
        return keys.load_signer(), keys.keyring()
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)


@app.command("export")
@shared_options("home", "json")
def keys_export(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write to this file, not stdout.")
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every public key kept, retired ones too.")
    ] = False,
    *,
    options: Options,
) -> None:
    """Print the public key, in the form verifiers read.

    One line `<base64> <key id>` (with --all, one per key); --json gives {key_id, public_key}
    (with --all, {"keys": {key_id: base64}}). Every form, as text or as a file, is accepted by
    `verify-bundle --key`, `verify-bundle --trusted-keys` and `verify --trusted-keys`.
    """
    json_out = options.json_out
    signer, ring = _existing_keys(options.home, json_out)
    keys = ring.public_keys() if every else {signer.key_id: signer.public_key}
    if json_out and every:
        text = json.dumps({"keys": {k: public_key_b64(v) for k, v in keys.items()}}, indent=2)
    elif json_out:
        text = json.dumps(
            {"key_id": signer.key_id, "public_key": public_key_b64(signer.public_key)}, indent=2
        )
    else:
        text = "\n".join(key_line(public) for public in keys.values())
    if output is None:
        print(text)
        return
    try:
        output.write_text(text + "\n")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}", EXIT_USAGE)
    render.err.print(f"wrote {output}: {', '.join(keys)}")
