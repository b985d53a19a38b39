"""What an audit or a bundle check found: one finding type and one report type for both."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal


class FindingCode(StrEnum):
    """Every code a finding can carry (docs/admin.md documents them)."""

    SIGNATURE_INVALID = "signature_invalid"
    UNKNOWN_KEY = "unknown_key"
    KEY_UNVOUCHED = "key_unvouched"  # a key in the key directory its history does not vouch for
    KEY_HISTORY_MISSING = "key_history_missing"  # keys no history tells from a planted one
    KEY_HISTORY_MISMATCH = "key_history_mismatch"  # not the history the store anchored
    KEY_OUT_OF_WINDOW = "key_out_of_window"  # signed by a key outside its signing window
    ENVELOPE_MALFORMED = "envelope_malformed"
    PAYLOAD_TYPE_MISMATCH = "payload_type_mismatch"
    PAYLOAD_MALFORMED = "payload_malformed"
    NOT_CANONICAL = "not_canonical"
    SCHEMA_INVALID = "schema_invalid"
    DIGEST_MISMATCH = "digest_mismatch"
    INDEX_MISMATCH = "index_mismatch"
    LEAF_GAP = "leaf_gap"
    SEQ_GAP = "seq_gap"
    PREV_MISMATCH = "prev_mismatch"
    ROOT_MISMATCH = "root_mismatch"
    CHECKPOINT_MALFORMED = "checkpoint_malformed"
    CHECKPOINT_SIGNATURE_INVALID = "checkpoint_signature_invalid"
    CHECKPOINT_UNKNOWN_KEY = "checkpoint_unknown_key"
    CHECKPOINT_INCONSISTENT = "checkpoint_inconsistent"
    CHECKPOINT_BEYOND_JOURNAL = "checkpoint_beyond_journal"
    FRONTIER_MISMATCH = "frontier_mismatch"
    PROJECTION_MISMATCH = "projection_mismatch"
    DECISION_ILLEGAL = "decision_illegal"
    STATE_MISMATCH = "state_mismatch"
    MAC_INVALID = "mac_invalid"
    NODE_MISMATCH = "node_mismatch"
    BUNDLE_MALFORMED = "bundle_malformed"
    BUNDLE_INCOMPLETE = "bundle_incomplete"
    INCLUSION_INVALID = "inclusion_invalid"
    MANIFEST_UNKNOWN_KEY = "manifest_unknown_key"
    MANIFEST_SIGNATURE_INVALID = "manifest_signature_invalid"
    # Witnesses (loopwarden/witnesses/): a policy's quorum not met by the latest checkpoint, a
    # line claiming to be a policy witness's cosignature that does not verify, a witness that
    # holds a view of the log the log does not extend, a checkpoint no log of the policy signed.
    WITNESS_QUORUM_MISSING = "witness_quorum_missing"
    COSIGNATURE_INVALID = "cosignature_invalid"
    WITNESS_CONFLICT = "witness_conflict"
    LOG_NOT_IN_POLICY = "log_not_in_policy"


ENVELOPE_PROBLEMS = {
    "signature_invalid": "the signature does not verify",
    "unknown_key": "signed by a key that is not trusted",
    "envelope_malformed": "the envelope is not a DSSE envelope",
    "payload_type_mismatch": "the payloadType is not a loopwarden receipt",
    "payload_malformed": "the payload is not a JSON object",
    "not_canonical": "the payload is not RFC 8785 canonical JSON",
}


@dataclass(frozen=True)
class Finding:
    """One defect, and where: a loop and receipt in a database, a position in a bundle."""

    code: FindingCode
    message: str
    loop_id: str | None = None
    seq: int | None = None
    receipt_id: str | None = None
    leaf_index: int | None = None
    position: int | None = None
    kind: str | None = None  # the receipt's kind, for a judged decision
    rule: str | None = None  # the rule it broke

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def where(self) -> str:
        return " ".join(
            f"{k}={v}" for k, v in self.as_dict().items() if k not in ("code", "message")
        )


@dataclass
class Report:
    """A verdict on a database (`subject="database"`) or a proof bundle (`"bundle"`)."""

    subject: Literal["database", "bundle"]
    findings: list[Finding] = field(default_factory=list)
    receipts: int = 0
    pending: int = 0  # of them, sealed in their chains and not yet in the Merkle tree
    loops: int = 0
    checkpoints: int = 0
    tree_size: int = 0
    root: str = ""
    loop_id: str = ""
    key_ids: list[str] = field(default_factory=list)
    keys_pinned: bool = False
    status: str | None = None
    stop_reason: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    trusted: str = ""  # what the signatures were checked against (a database's audit)
    # Who outside loopwarden vouches for the log (`loopwarden/witnesses/witness_audit.py`):
    # None when no witness check ran.
    witnesses: dict[str, Any] | None = None

    @property
    def clean(self) -> bool:
        return not self.findings

    def add(self, code: FindingCode | str, message: str, **where: Any) -> None:
        """Record a finding; `code` a `FindingCode` (or its value: an unknown one raises)."""
        self.findings.append(Finding(FindingCode(code), message, **where))

    def as_dict(self) -> dict[str, object]:
        """The JSON `verify` and `verify-bundle` print (their documented fields)."""
        verdict = "clean" if self.clean else "tampered"
        findings = [f.as_dict() for f in self.findings]
        witnessed = {} if self.witnesses is None else {"witnesses": self.witnesses}
        if self.subject == "database":
            return {
                "verdict": verdict,
                "receipts": self.receipts,
                "pending": self.pending,
                "loops": self.loops,
                "checkpoints": self.checkpoints,
                "tree_size": self.tree_size,
                "root": self.root,
                "trusted": self.trusted,
                "seconds": round(self.seconds, 3),
                "findings": findings,
                "notes": self.notes,
                **witnessed,
            }
        return {
            "verdict": verdict,
            "loop_id": self.loop_id,
            "receipts": self.receipts,
            "checkpoint_size": self.tree_size,
            "key_ids": self.key_ids,
            "keys_pinned": self.keys_pinned,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "findings": findings,
            "notes": self.notes,
            **witnessed,
        }
