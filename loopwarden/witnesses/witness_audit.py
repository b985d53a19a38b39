"""Who outside loopwarden vouches for a log: the witness part of `verify` and `verify-bundle`.

Given the auditor's pinned policy (`witness_policy.py`), for the latest checkpoint: which of the
policy's witnesses cosigned it, which lines claim to be a witness's cosignature and fail
(`cosignature_invalid`), whether the quorum holds (`witness_quorum_missing` if not, naming the
witnesses missing and the last checkpoint that had the quorum), and whether a log the policy
lists signed it (`log_not_in_policy`). A conflict a witness answered the witness client with is
a finding with or without a policy (`witness_conflict`). Without a policy the report says that
nothing outside loopwarden vouches for the log.
"""

from __future__ import annotations

from typing import Any

from loopwarden.audit.findings import FindingCode, Report
from loopwarden.clock import format_time
from loopwarden.kernel.log.checkpoints import NoteParts, cosigned_note, split_note
from loopwarden.kernel.sql.records import CheckpointRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.witnesses.vouching import Vouch, vouch
from loopwarden.witnesses.witness_policy import WitnessPolicy

UNVOUCHED = (
    "no witness policy given: nothing outside loopwarden vouches for this log — its checkpoints "
    "are signed by its own keys only, so whoever holds them and the database could rewrite it "
    "(pin a policy with --witness-policy)"
)


def _summary(policy: WitnessPolicy, size: int, seen: Vouch | None) -> dict[str, Any]:
    return {
        "quorum": policy.describe(),
        "checkpoint_size": size,
        "cosigned_by": sorted(seen.cosigned) if seen else [],
        "missing": seen.missing if seen else policy.counted(),
        "quorum_met": bool(seen and seen.quorum),
    }


def _log_signed(policy: WitnessPolicy, parts: NoteParts, origin: str) -> bool:
    """Whether a log key the policy lists for `origin` has a line on the checkpoint (its
    signature is checked against the trusted keys by the checkpoint checks; a policy with no
    log lines leaves the log to be known from elsewhere, as tlog-policy allows)."""
    if not policy.logs:
        return True
    keys = policy.logs_for(origin)
    return any(k.name == n and k.key_hash == b[:4] for k in keys for n, b in parts.signatures)


def _read(policy: WitnessPolicy, note: str) -> tuple[NoteParts, Vouch] | None:
    try:
        parts = split_note(note)
    except ValueError:
        return None
    return parts, vouch(policy, parts.text, parts.signatures)


def check_store(reader: Reader, policy: WitnessPolicy | None, report: Report) -> None:
    """Add the witness checks of a database to `report` (see the module's docstring)."""
    for row in reader.witness_rows():
        if row.conflict:
            since = f" (since {format_time(row.conflict_at)})" if row.conflict_at else ""
            report.add(
                FindingCode.WITNESS_CONFLICT,
                f"witness {row.vkey.split('+')[0]} {row.conflict}{since}",
            )
    if policy is None:
        report.notes.append(UNVOUCHED)
        return
    origin = reader.meta("origin") or ""
    checkpoints = reader.checkpoints()
    stored: dict[int, list[str]] = {}
    for cosignature in reader.cosignatures():
        stored.setdefault(cosignature.size, []).append(cosignature.line)
    last_met: CheckpointRow | None = None
    latest: tuple[CheckpointRow, Vouch] | None = None
    for checkpoint in checkpoints:
        read = _read(policy, cosigned_note(checkpoint.note, stored.get(checkpoint.size, [])))
        if read is None:
            continue  # a malformed note: the checkpoint checks report it
        parts, seen = read
        for name in seen.forged:
            report.add(
                FindingCode.COSIGNATURE_INVALID,
                f"the cosignature of witness {name} on checkpoint {checkpoint.size} does not "
                "verify: it was not made over this checkpoint by the witness's key",
            )
        if seen.cosigned and not _log_signed(policy, parts, origin):
            report.add(
                FindingCode.LOG_NOT_IN_POLICY,
                f"checkpoint {checkpoint.size} is not signed by a log key the policy lists "
                f"for {origin}",
            )
        if seen.quorum:
            last_met = checkpoint
        latest = (checkpoint, seen)
    if latest is None:
        if reader.log_state().size:
            report.add(
                FindingCode.WITNESS_QUORUM_MISSING,
                "the log has no checkpoint, so no witness vouches for it",
            )
        report.witnesses = _summary(policy, 0, None)
        return
    checkpoint, seen = latest
    report.witnesses = _summary(policy, checkpoint.size, seen)
    if not seen.quorum:
        report.add(
            FindingCode.WITNESS_QUORUM_MISSING, _missing(policy, checkpoint.size, seen, last_met)
        )


def _missing(policy: WitnessPolicy, size: int, seen: Vouch, last_met: CheckpointRow | None) -> str:
    have = ", ".join(sorted(seen.cosigned)) or "none"
    since = (
        f"the last checkpoint with the quorum is {last_met.size}: the leaves from "
        f"{last_met.size} on are vouched for by loopwarden's key alone"
        if last_met is not None
        else "no checkpoint has the quorum: nothing outside loopwarden vouches for any of the log"
    )
    return (
        f"the latest checkpoint ({size}) lacks the policy's quorum ({policy.describe()}): "
        f"missing {', '.join(seen.missing) or 'none'} (cosigned by {have}); {since}"
    )


def check_bundle(note: str, policy: WitnessPolicy | None, origin: str, report: Report) -> None:
    """Add the witness checks of a bundle's checkpoint `note` to `report`."""
    if policy is None:
        report.notes.append(UNVOUCHED)
        return
    read = _read(policy, note)
    if read is None:
        return  # a malformed checkpoint: the bundle checks report it
    parts, seen = read
    report.witnesses = _summary(policy, report.tree_size, seen)
    for name in seen.forged:
        report.add(
            FindingCode.COSIGNATURE_INVALID,
            f"the cosignature of witness {name} does not verify over the bundle's checkpoint",
        )
    if not _log_signed(policy, parts, origin):
        report.add(
            FindingCode.LOG_NOT_IN_POLICY,
            f"the checkpoint is not signed by a log key the policy lists for {origin}",
        )
    if not seen.quorum:
        report.add(
            FindingCode.WITNESS_QUORUM_MISSING,
            f"the bundle's checkpoint ({report.tree_size}) lacks the policy's quorum "
            f"({policy.describe()}): missing {', '.join(seen.missing) or 'none'} (cosigned by "
            f"{', '.join(sorted(seen.cosigned)) or 'none'})",
        )
