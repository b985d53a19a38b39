"""The bundled witness's decision on one `add-checkpoint` request (C2SP tlog-witness), apart
from HTTP: what `loopwarden witness serve` answers.

It cosigns a checkpoint only if a log key it trusts for the checkpoint's origin signed it, and
the checkpoint is consistent with the latest one it cosigned for that origin (the request's old
size must be exactly that one's size, and the consistency proof from it must verify). The
check and the update of the latest checkpoint are one transaction (`cosigner_store.py`): the
witness never rolls back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

from loopwarden.clock import Clock, system_clock
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import parse_checkpoint_text, split_note
from loopwarden.kernel.log.keys import SIG_PREFIX
from loopwarden.witnesses import add_checkpoint
from loopwarden.witnesses.cosignatures import Cosigner
from loopwarden.witnesses.cosigner_store import CosignerStore, Held, Latest
from loopwarden.witnesses.vkeys import VerifierKey

log = logging.getLogger("loopwarden.witness")


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, content type and body."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def _refuse(status: int, reason: str) -> Answer:
    return Answer(status, (reason + "\n").encode())


class Refused(Exception):
    """A checkpoint the log signed that does not extend the latest one cosigned."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer


def origin_hash(origin: str) -> str:
    """The monitoring path's name of a log: SHA-256 of its origin, lowercase hex."""
    return hashlib.sha256(origin.encode()).hexdigest()


class WitnessService:
    """One witness: its cosigner (name and key), the log keys it trusts, its store."""

    def __init__(
        self,
        cosigner: Cosigner,
        logs: list[VerifierKey],
        store: CosignerStore,
        *,
        clock: Clock = system_clock,
    ) -> None:
        self.cosigner, self.store, self.clock = cosigner, store, clock
        self.logs: dict[str, list[VerifierKey]] = {}
        for vkey in logs:
            self.logs.setdefault(vkey.name, []).append(vkey)

    def add_checkpoint(self, body: bytes) -> Answer:
        """Answer one request body (never raises on bad input)."""
        try:
            submission = add_checkpoint.decode(body)
            parts = split_note(submission.note)
            origin, size, root = parse_checkpoint_text(parts.text)
        except (ValueError, binascii.Error) as exc:
            return _refuse(400, f"malformed request: {exc}")
        keys = self.logs.get(origin)
        if keys is None:
            return _refuse(404, "unknown log")
        verified: list[str] = []
        for name, blob in parts.signatures:
            for vkey in keys:
                if name != vkey.name or blob[:4] != vkey.key_hash:
                    continue
                if not _verifies(vkey, parts.text, blob):
                    return _refuse(403, "invalid signature")
                verified.append(f"{SIG_PREFIX}{name} {base64.b64encode(blob).decode()}\n")
        if not verified:
            return _refuse(403, "no signature from a trusted log key")
        if submission.old > size:
            return _refuse(400, "the old size is larger than the checkpoint's")
        now = int(self.clock().timestamp())

        def decide(held: Held) -> Answer:
            latest = held.latest(origin)
            have = latest.size if latest is not None else 0
            if submission.old != have:
                return Answer(409, f"{have}\n".encode(), add_checkpoint.SIZE_TYPE)
            problem = _inconsistent(submission, size, root, latest)
            if problem is not None:
                raise Refused(_refuse(422, problem))
            line = self.cosigner.cosign(parts.text, now)
            note = parts.text + "\n" + "".join(verified) + line
            held.store(origin, Latest(size, root, note))
            return Answer(200, line.encode())

        try:
            answer = self.store.atomically(decide)
        except Refused as refused:
            # The refusal is logged in a transaction of its own (the one that decided rolled
            # back): a checkpoint signed by the log and inconsistent with what was cosigned is
            # the evidence of a fork.
            answer = refused.answer
            reason = answer.body.decode()
            self.store.atomically(
                lambda held: held.refused(now, origin, answer.status, reason, body.decode())
            )
            log.warning("witness: refused a checkpoint of %s (%s)", origin, reason.strip())
            return answer
        return answer

    def checkpoint(self, hashed_origin: str) -> Answer:
        """The monitoring read: the latest cosigned checkpoint of the log whose origin hashes to
        `hashed_origin`, with the log's signatures and this witness's cosignature."""
        for origin in self.logs:
            if origin_hash(origin) == hashed_origin:
                latest = self.store.latest(origin)
                if latest is not None:
                    return Answer(200, latest.note.encode())
        return _refuse(404, "no checkpoint cosigned for this log")


def _verifies(vkey: VerifierKey, text: str, blob: bytes) -> bool:
    if len(blob) != 68:
        return False
    try:
        nacl.signing.VerifyKey(vkey.public_key).verify(text.encode(), blob[4:])
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True


def _inconsistent(
    submission: add_checkpoint.Submission, size: int, root: bytes, latest: Latest | None
) -> str | None:
    """Why the checkpoint of (`size`, `root`) does not extend `latest` (None if it does)."""
    proof = list(submission.proof)
    if size == 0 and root != merkle.EMPTY_ROOT:
        return "a checkpoint of size 0 has the empty tree's root"
    if submission.old == 0:
        return "a proof from size 0 is empty" if proof else None
    assert latest is not None  # the old size is the latest's, and not 0
    if submission.old == size:
        return None if root == latest.root and not proof else "the same size with another root"
    if not merkle.verify_consistency(latest.size, size, latest.root, root, proof):
        return "the consistency proof does not verify"
    return None
