"""`loopwarden verify`, `export` and `verify-bundle`: the offline audit and proof bundles."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from loopwarden.audit.bundles import export_bundle, load_bundle, verify_bundle, witnessed_size
from loopwarden.audit.database import audit_trusting
from loopwarden.audit.findings import Report
from loopwarden.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY,
    Options,
    fail,
    run,
    shared_options,
)
from loopwarden.clients import admin, render
from loopwarden.clients.keyfiles import read_key_argument, read_key_file
from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import Keyring
from loopwarden.kernel.log.rotations import Trust
from loopwarden.kernel.runner.visibility import missing_loop
from loopwarden.kernel.store.reader import Reader

WitnessPolicyFile = Annotated[
    Path | None,
    typer.Option(
        "--witness-policy",
        metavar="FILE",
        help="A tlog-policy file: which witnesses must have cosigned the latest checkpoint.",
    ),
]


def _witness_policy(path: Path | None, json_out: bool, *, urls: bool = False) -> Any:
    """The pinned witness policy (None without one; with `urls`, each witness must have one);
    a bad file exits 2."""
    if path is None:
        return None
    from loopwarden.witnesses.witness_policy import load_policy

    try:
        return load_policy(path, urls=urls)
    except LoopwardenError as exc:
        fail(exc.message, EXIT_USAGE, as_json=json_out)


TrustedKeys = Annotated[
    Path | None,
    typer.Option(
        "--trusted-keys",
        help="Trust the keys in this file (what `keys export` writes), not the key directory.",
    ),
]


def home_trust(home: Path | None, json_out: bool, anchor: str | None = None) -> Trust:
    """What `home`'s key directory vouches for, for a store anchoring `anchor`; a broken key
    file is a clean failure."""
    try:
        return admin.trust_of(home, anchor)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)


def load_trusted(path: Path) -> Keyring:
    try:
        return read_key_file(path)
    except LoopwardenError as exc:
        fail(f"--trusted-keys: {exc.message}", EXIT_USAGE)


def _trust(
    trusted_keys: Path | None, home: Path | None, json_out: bool, anchor: str | None
) -> Trust:
    if trusted_keys is None:
        return home_trust(home, json_out, anchor)
    keyring = load_trusted(trusted_keys)
    return Trust(
        keyring,
        f"{render.counted(len(keyring.ids()), 'key')} of {trusted_keys.name} (--trusted-keys)",
    )


def _audit(
    reader: Reader,
    trust: Trust,
    loop: str | None,
    interactive: bool,
    integrity: Integrity | None,
) -> Report:
    if not interactive:
        return audit_trusting(reader, trust, loop_id=loop, integrity=integrity)
    from rich.progress import Progress

    with Progress(console=render.err, transient=True) as progress:
        task = progress.add_task("auditing", total=reader.journal_count())
        return audit_trusting(
            reader,
            trust,
            loop_id=loop,
            integrity=integrity,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )


@shared_options("home", "store", "json")
def verify(
    loop: Annotated[
        str | None,
        typer.Option("--loop", help="Audit one loop in depth (the log is always checked whole)."),
    ] = None,
    *,
    options: Options,
    trusted_keys: TrustedKeys = None,
    witness_policy: WitnessPolicyFile = None,
) -> None:
    """Audit the whole store; exit 3 on any finding.

    Every signature, the receipt schema, each loop's seq/prev chain, the Merkle root against
    every checkpoint and their consistency, every decision judged against the loop's policy,
    every projection rebuilt from its receipts, and the row proofs and MACs the server relies on.

    With --witness-policy, which witnesses cosigned the latest checkpoint and whether the quorum
    holds; without, the report says nothing outside loopwarden vouches for the log. A conflict
    a witness answered with fails the audit either way.
    """
    from loopwarden.witnesses.witness_audit import check_store

    home, json_out = options.home, options.json_out
    policy = _witness_policy(witness_policy, json_out)
    if trusted_keys is not None:
        load_trusted(trusted_keys)  # a bad file is a usage error before the store is opened
    try:
        with admin.open_reader(home, store=options.store) as reader:
            trust = _trust(trusted_keys, home, json_out, reader.key_anchor())
            if loop is not None and reader.loop_row(loop) is None:
                raise NotFound(missing_loop(reader, admin.operator(), loop))
            interactive = not json_out and sys.stderr.isatty()
            report = _audit(reader, trust, loop, interactive, admin.integrity_of(home))
            check_store(reader, policy, report)
    except LoopwardenError as exc:
        fail(exc.message, as_json=json_out, error=exc.code)
    if json_out:
        render.emit_json(report.as_dict())
    else:
        render.audit(report)
    raise typer.Exit(EXIT_OK if report.clean else EXIT_VERIFY)


@shared_options("home", "store", "json")
def export(
    loop_id: str,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the bundle (JSON).")
    ],
    *,
    options: Options,
    witness: Annotated[
        Path | None,
        typer.Option(
            "--witness",
            metavar="FILE",
            help="Submit the fresh checkpoint to this tlog-policy's witnesses (URLs) first.",
        ),
    ] = None,
) -> None:
    """Export an offline proof bundle of one loop.

    The loop's envelopes, the public keys, a signed checkpoint with its witnesses'
    cosignatures, and an inclusion proof per receipt (also as a C2SP tlog-proof); anyone can
    check it with `loopwarden verify-bundle`.

    With --witness FILE the fresh checkpoint is
    submitted to the witnesses first and carries what they cosign; without, the bundle takes
    the largest checkpoint covering the loop that witnesses have cosigned (a server with
    --witness submits every one), else the fresh one.
    """
    json_out = options.json_out
    if not output.parent.is_dir():
        fail(f"cannot write {output}: no such directory", EXIT_USAGE, as_json=json_out)
    policy = _witness_policy(witness, json_out, urls=True)
    bundle = run(_bundle, options, loop_id, policy, as_json=json_out)
    try:
        output.write_text(json.dumps(bundle, indent=2) + "\n")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}", EXIT_USAGE, as_json=json_out)
    summary = {
        "loop_id": loop_id,
        "output": str(output),
        "receipts": len(bundle["receipts"]),
        "checkpoint_size": bundle["checkpoint"]["size"],
        "key_ids": sorted(bundle["public_keys"]),
    }
    if json_out:
        render.emit_json(summary)
    else:
        render.console.print(
            f"wrote {output}: {render.counted(summary['receipts'], 'receipt')} of loop {loop_id}, checkpoint size "
            f"{summary['checkpoint_size']}, keys {', '.join(summary['key_ids'])}"
        )


async def _bundle(options: Options, loop_id: str, policy: Any) -> dict[str, Any]:
    """The loop's bundle, under a fresh checkpoint (submitted to `policy`'s witnesses first if
    given; else the largest witnessed checkpoint covering the loop, if any)."""
    async with admin.open_store(options.home, store=options.store, create=False) as opened:
        if await opened.read(lambda r: r.loop_row(loop_id)) is None:
            raise NotFound(await opened.read(lambda r: missing_loop(r, admin.operator(), loop_id)))
        await opened.checkpoint()
        if policy is not None:
            from loopwarden.witnesses.submitter import Pacing, push_once

            await push_once(opened, policy, Pacing(checkpoint_after=None))
        now = opened.clock()
        return await opened.read(
            lambda reader: export_bundle(
                reader,
                loop_id,
                opened.keyring,
                now,
                opened.signer,
                size=None if policy is not None else witnessed_size(reader, loop_id),
            )
        )


@shared_options("json", "home")
def verify_bundle_cmd(
    bundle_file: Annotated[Path, typer.Argument(metavar="BUNDLE")],
    key: Annotated[
        str | None,
        typer.Option(
            "--key", help="A trusted public key, or a file holding it (`keys export` output)."
        ),
    ] = None,
    trusted_keys: Annotated[
        Path | None,
        typer.Option("--trusted-keys", help="A file of trusted public keys (`keys export`)."),
    ] = None,
    witness_policy: WitnessPolicyFile = None,
    *,
    options: Options,
) -> None:
    """Verify a proof bundle offline; exit 3 on any finding.

    Needs no database and no server (--home is accepted and ignored). With --key or
    --trusted-keys, a bundle signed by any other key fails; both take what `loopwarden keys
    export` writes (a key line, its --json document, or a file of either).

    With --witness-policy, the bundle's checkpoint must carry the policy's quorum of witness
    cosignatures (and, if the policy lists logs, be signed by one of them).
    """
    from loopwarden.witnesses.witness_audit import check_bundle

    json_out = options.json_out
    policy = _witness_policy(witness_policy, json_out)
    if key is not None and trusted_keys is not None:
        fail("give --key or --trusted-keys, not both", EXIT_USAGE, as_json=json_out)
    trusted = None
    if key is not None:
        try:
            trusted = read_key_argument(key)
        except LoopwardenError as exc:
            fail(f"--key: {exc.message}", EXIT_USAGE, as_json=json_out)
    elif trusted_keys:
        trusted = load_trusted(trusted_keys)
    try:
        text = bundle_file.read_text()
    except OSError as exc:
        fail(f"cannot read {bundle_file}: {exc.strerror}", EXIT_USAGE, as_json=json_out)
    bundle = load_bundle(text)
    report = verify_bundle(bundle, trusted)
    if isinstance(bundle, dict) and isinstance(bundle.get("checkpoint"), dict):
        note, origin = bundle["checkpoint"].get("note"), bundle.get("origin")
        if isinstance(note, str):
            check_bundle(note, policy, str(origin), report)
    if json_out:
        render.emit_json(report.as_dict())
    else:
        render.bundle(report)
    raise typer.Exit(EXIT_OK if report.clean else EXIT_VERIFY)
