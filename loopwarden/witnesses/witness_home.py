"""A witness's directory: its name, its key (0600) and its store, and the HTTP app that serves
it (`loopwarden witness init`, `loopwarden witness serve`).

    <dir>/name          the witness's key name (a schema-less URL, e.g. witness.example.org/w1)
    <dir>/witness.key   the Ed25519 seed, base64, mode 0600
    <dir>/witness.db    the latest checkpoint cosigned per log (`cosigner_store.py`)

The app answers `POST /add-checkpoint` and `GET /<sha256(origin) hex>/checkpoint`: the
submission and the monitoring prefix are both its root.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import anyio.to_thread
import nacl.signing
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopwarden.errors import KeyFileError
from loopwarden.witnesses import add_checkpoint
from loopwarden.witnesses.cosignatures import Cosigner
from loopwarden.witnesses.cosigner import Answer, WitnessService

KEY_FILE, NAME_FILE = "witness.key", "name"


def init_witness(directory: Path, name: str) -> Cosigner:
    """Make a witness's directory with a new key under `name`; `KeyFileError` if it has one."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_path = directory / KEY_FILE
    if key_path.exists():
        raise KeyFileError(f"{directory} holds a witness key already")
    key = nacl.signing.SigningKey.generate()
    cosigner = Cosigner(name, key)  # checks the name before anything is written
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(bytes(key)).decode() + "\n")
    (directory / NAME_FILE).write_text(name + "\n")
    return cosigner


def load_cosigner(directory: Path) -> Cosigner:
    """The witness of `directory`; `KeyFileError` if it has none or its key file is readable
    by others."""
    key_path = directory / KEY_FILE
    try:
        mode = stat.S_IMODE(key_path.stat().st_mode)
        seed = base64.b64decode(key_path.read_text().strip(), validate=True)
        name = (directory / NAME_FILE).read_text().strip()
    except (OSError, ValueError) as exc:
        raise KeyFileError(
            f"no witness in {directory} ({exc}); run loopwarden witness init"
        ) from None
    if mode & 0o077:
        raise KeyFileError(f"the witness key {key_path} is readable by others; chmod 600 it")
    if len(seed) != 32:
        raise KeyFileError(f"the witness key {key_path} is not a 32-byte seed")
    try:
        return Cosigner(name, nacl.signing.SigningKey(seed))
    except ValueError as exc:
        raise KeyFileError(f"the witness name in {directory}: {exc}") from None


def _response(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type)


def witness_app(service: WitnessService) -> Starlette:
    """The witness's HTTP interface (tlog-witness)."""

    async def add(request: Request) -> Response:
        body = await request.body()
        if len(body) > add_checkpoint.MAX_BODY:
            return Response("the request is too large\n", status_code=400)
        return _response(await anyio.to_thread.run_sync(service.add_checkpoint, body))

    async def checkpoint(request: Request) -> Response:
        hashed = str(request.path_params["origin_hash"])
        return _response(await anyio.to_thread.run_sync(service.checkpoint, hashed))

    return Starlette(
        routes=[
            Route(add_checkpoint.PATH, add, methods=["POST"]),
            Route("/{origin_hash}/checkpoint", checkpoint, methods=["GET"]),
        ]
    )
