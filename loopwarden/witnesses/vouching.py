"""What a witness policy makes of a checkpoint's cosignatures: which of its witnesses vouch for
it, which lines claim to be a witness's and fail, and whether the quorum holds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loopwarden.witnesses.cosignatures import check, matches
from loopwarden.witnesses.witness_policy import WitnessPolicy


@dataclass(frozen=True)
class Vouch:
    """A policy's view of one checkpoint: `cosigned` the witnesses (policy names) whose
    cosignature verifies, with its timestamp; `forged` those with a line that claims to be
    theirs (name and key hash) and does not verify over this checkpoint; `missing` the
    witnesses the quorum counts that did not cosign; `quorum` whether it holds."""

    cosigned: dict[str, int]
    forged: list[str]
    missing: list[str]
    quorum: bool


def vouch(policy: WitnessPolicy, text: str, lines: Iterable[tuple[str, bytes]]) -> Vouch:
    """Read a checkpoint's signature lines (`(key name, decoded blob)`, any order, the log's
    own among them) against `policy`; `text` is the checkpoint's note text. Lines of keys the
    policy does not list are ignored, as signed-note requires."""
    cosigned: dict[str, int] = {}
    forged: list[str] = []
    for name, blob in lines:
        for witness in policy.witnesses.values():
            if not matches(witness.vkey, name, blob):
                continue
            result = check(witness.vkey, text, blob)
            if result.verified:
                cosigned[witness.name] = result.timestamp
            elif witness.name not in forged:
                forged.append(witness.name)
    missing = [name for name in policy.counted() if name not in cosigned]
    return Vouch(cosigned, forged, missing, policy.satisfied(cosigned))
