"""Policy versioning: `sha256:` + hex of the RFC 8785 bytes of the normalized policy."""

from __future__ import annotations

from typing import Any

from loopwarden.canonical import digest_of
from loopwarden.policy.model import LoopPolicy


def policy_document(policy: LoopPolicy) -> dict[str, Any]:
    """The normalized policy as JSON-native data: every default written out, lists sorted, and
    unset optional values (no limit, no deadline) left out rather than written as null."""
    return policy.model_dump(mode="json", exclude_none=True)


def policy_digest(policy: LoopPolicy) -> str:
    """Stable under key order and list order; changed by any field that changes a decision."""
    return digest_of(policy_document(policy))
