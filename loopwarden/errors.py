"""The one error hierarchy: every anticipated failure is a `LoopwardenError` with a stable code.

Errors are mapped at the edges: `sqlite3` errors become `StoreError` inside the store, and the
server turns these into MCP tool errors. A policy refusal is never an exception: it is a
`Decision` in a normal result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pydantic import ValidationError

QUOTE_LIMIT = 80


def clip(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as text for an error message, cut to `limit` characters: an error must never
    echo a huge input back (a 1 MiB field name stays a short message)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    """Collapse a multi-line library message into one line."""
    return " ".join(text.split())


_PREFIXED_ID = re.compile(r"^\^([a-z]+)-\[0-9a-f\]\{(\d+)\}\$$")


def _pattern_help(error: Mapping[str, Any]) -> str | None:
    """A person's words for a value that does not have the form an id must have (never the
    regular expression itself)."""
    pattern = str((error.get("ctx") or {}).get("pattern", ""))
    prefixed = _PREFIXED_ID.match(pattern)
    if prefixed:
        prefix, digits = prefixed.groups()
        return f"not an id of this kind: one is '{prefix}-' followed by {digits} hex digits"
    if pattern.startswith("^[A-Za-z0-9][A-Za-z0-9_.-]"):
        return "use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    if pattern.startswith("^sha256:"):
        return "a digest is 'sha256:' followed by 64 hex digits"
    return None


def describe_validation(exc: ValidationError) -> str:
    """`field: reason` per problem on one line, without pydantic's URLs or input echoes."""
    parts = []
    for error in exc.errors(include_url=False)[:10]:
        where = clip(".".join(str(p) for p in error["loc"]) or "arguments")
        said = _pattern_help(error) if error["type"] == "string_pattern_mismatch" else None
        parts.append(f"{where}: {said or clip(error['msg'].removeprefix('Value error, '), 200)}")
    return one_line("; ".join(parts))


class LoopwardenError(Exception):
    """Base class. `code` is a stable, machine-readable identifier; the message is for humans.

    A subclass names its code where it is declared, `class NotFound(LoopwardenError,
    code="not_found")`; one that names none keeps its base's."""

    code: ClassVar[str] = "error"

    def __init_subclass__(cls, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class InvalidInput(LoopwardenError, code="invalid_input"):
    """The caller sent something malformed; nothing was changed."""


class PolicyError(InvalidInput, code="policy_invalid"):
    """A policy file or value is invalid. The message names the field and the reason."""


class NotFound(LoopwardenError, code="not_found"):
    """A loop, todo, turn, approval or receipt id does not exist."""


class Forbidden(LoopwardenError, code="forbidden"):
    """The principal may not call this operation at all (for example an agent on an operator tool)."""


class Conflict(LoopwardenError, code="conflict"):
    """The request contradicts durable state (for example an id that already exists)."""


class StoreError(LoopwardenError, code="store_error"):
    """The database failed or could not be opened; no partial state was committed."""


class IntegrityError(StoreError, code="integrity_error"):
    """The stored journal, Merkle log or projection disagree; the store refuses to serve."""


class StoreUnavailable(StoreError, code="store_unavailable"):
    """The store cannot take the request now (starting, stopping, closed, or its connection
    lost before the write committed): nothing was written; retry."""


class StoreMissing(StoreError, code="store_missing"):
    """There is no store where the server was told to find one (a mistyped home): said to the
    caller as it is (it names only the server's own configuration), never made empty."""


class StoreBusy(StoreError, code="store_busy"):
    """The database's write lock could not be had in time: nothing was written; retry."""


class CommitUnknown(StoreError, code="commit_unknown"):
    """The connection was lost while committing and the outcome could not be read back: retry
    with the same idempotency key (a repeat returns the original result if it committed)."""


class SecretMismatch(StoreError, code="integrity_secret_mismatch"):
    """This process's integrity secret is not the one the database was opened with."""


class AddressInUse(LoopwardenError, code="address_in_use"):
    """Another server listens on the address `serve` was given."""


class BindFailed(LoopwardenError, code="bind_failed"):
    """`serve` could not listen on its address for another reason (the message says which)."""


class KeyFileError(LoopwardenError, code="key_error"):
    """A signing key is missing, unreadable or has unsafe permissions."""


class SealError(LoopwardenError, code="seal_error"):
    """A receipt could not be canonicalized, signed or its own signature did not verify."""
