"""`loopwarden keys show | rotate | export`: the signing keys."""

from __future__ import annotations

import typer

from loopwarden.clients import render
from loopwarden.clients.cli.common import Home, Json, fail
from loopwarden.errors import LoopwardenError
from loopwarden.ledger.keys import KeyStore, public_key_b64
from loopwarden.server.settings import resolve_home

app = typer.Typer(no_args_is_help=True, help="Signing keys.")


@app.command("show")
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


@app.command("rotate")
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


@app.command("export")
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
