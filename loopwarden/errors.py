"""The one error hierarchy: every anticipated failure is a `LoopwardenError` with a stable code.

Errors are mapped at the edges: `sqlite3` errors become `StoreError` inside the store, and the
server turns these into MCP tool errors. A policy refusal is never an exception: it is a
`Decision` in a normal result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def describe_validation(exc: ValidationError) -> str:
    """`field: reason` per problem on one line, without pydantic's URLs or input echoes."""
    parts = []
    for error in exc.errors(include_url=False)[:10]:
        where = clip(".".join(str(p) for p in error["loc"]) or "arguments")
        parts.append(f"{where}: {clip(error['msg'].removeprefix('Value error, '), 200)}")
    return one_line("; ".join(parts))


class LoopwardenError(Exception):
    """Base class. `code` is a stable, machine-readable identifier; the message is for humans."""

    code = "error"

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class InvalidInput(LoopwardenError):
    """The caller sent something malformed; nothing was changed."""

    code = "invalid_input"


class PolicyError(InvalidInput):
    """A policy file or value is invalid. The message names the field and the reason."""

    code = "policy_invalid"


class NotFound(LoopwardenError):
    """A loop, todo, turn, approval or receipt id does not exist."""

    code = "not_found"


class Forbidden(LoopwardenError):
    """The principal may not call this operation at all (for example an agent on an operator tool)."""

    code = "forbidden"


class Conflict(LoopwardenError):
    """The request contradicts durable state (for example an id that already exists)."""

    code = "conflict"


class StoreError(LoopwardenError):
    """The database failed or could not be opened; no partial state was committed."""

    code = "store_error"


class IntegrityError(StoreError):
    """The stored journal, Merkle log or projection disagree; the store refuses to serve."""

    code = "integrity_error"


class StoreUnavailable(StoreError):
    """The store cannot take the request now (starting, stopping, closed, or its connection
    lost before the write committed): nothing was written; retry."""

    code = "store_unavailable"


class StoreBusy(StoreError):
    """The database's write lock could not be had in time: nothing was written; retry."""

    code = "store_busy"


class CommitUnknown(StoreError):
    """The connection was lost while committing and the outcome could not be read back: retry
    with the same idempotency key (a repeat returns the original result if it committed)."""

    code = "commit_unknown"


class SecretMismatch(StoreError):
    """This process's integrity secret is not the one the database was opened with."""

    code = "integrity_secret_mismatch"


class AddressInUse(LoopwardenError):
    """Another server listens on the address `serve` was given."""

    code = "address_in_use"


class BindFailed(LoopwardenError):
    """`serve` could not listen on its address for another reason (the message says which)."""

    code = "bind_failed"


class KeyFileError(LoopwardenError):
    """A signing key is missing, unreadable or has unsafe permissions."""

    code = "key_error"


class SealError(LoopwardenError):
    """A receipt could not be canonicalized, signed or its own signature did not verify."""

    code = "seal_error"
