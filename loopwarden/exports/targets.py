"""Where `serve` pushes the receipt stream, and how each push is signed.

`serve --export-webhook URL` (or `LOOPWARDEN_EXPORT_WEBHOOK`) names the receiver; the shared
secret comes from `--export-secret-file FILE` (refused if group or others may read it, as the
signing key is) or `LOOPWARDEN_EXPORT_SECRET`, and a webhook without one is refused. Each POST body (a JSON array of CloudEvents) is signed with
HMAC-SHA256 over the timestamp header, a dot and the body, as Stripe and Svix sign theirs:

    X-Loopwarden-Timestamp: 1767225600
    X-Loopwarden-Signature: sha256=<hex of HMAC-SHA256(secret, "1767225600." + body)>

A receiver recomputes the MAC over the bytes it received, compares in constant time, refuses a
timestamp far from its own clock (a replayed body), and dedupes events by `id` (the receipt
id): delivery is at least once (`verify_signature` is the check, in a dozen lines). The URL
and the secret are never logged, stored or put in an error message: only the receiver's
origin (scheme, host, port) is shown.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from loopwarden.errors import InvalidInput

WEBHOOK_ENV = "LOOPWARDEN_EXPORT_WEBHOOK"
SECRET_ENV = "LOOPWARDEN_EXPORT_SECRET"
CONTENT_TYPE = "application/cloudevents-batch+json"
SIGNATURE_HEADER = "X-Loopwarden-Signature"
TIMESTAMP_HEADER = "X-Loopwarden-Timestamp"
SINK_HEADER = "X-Loopwarden-Sink"
MIN_SECRET_BYTES = 16
DEFAULT_SINK = "webhook"
SINK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_LEASE = 120.0
LEASE_RANGE = (1.0, 3600.0)
TOLERANCE_SECONDS = 300  # how far a receiver should accept a timestamp from its own clock


@dataclass(frozen=True)
class ExportTarget:
    """A webhook sink: its name (the cursor's key), the URL and the shared secret (neither
    ever shown: `repr` leaves them out)."""

    name: str
    url: str = field(repr=False)
    secret: bytes = field(repr=False)
    lease: float = DEFAULT_LEASE  # seconds a sender's lease lives unless renewed

    @property
    def origin(self) -> str:
        """The receiver as it may be shown: scheme, host and port, nothing else."""
        parts = urlsplit(self.url)
        host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def export_target(
    url: str | None,
    secret_file: Path | None,
    name: str | None,
    environ: Mapping[str, str],
    lease: float | None = None,
) -> ExportTarget | None:
    """The sink `serve`'s flags and environment name, or None for none. `InvalidInput` (the
    URL and the secret never quoted) for a URL that is not http(s) with a host, a secret
    missing, unreadable or shorter than 16 bytes, a bad sink name, or a secret with no
    webhook, or a lease outside [1, 3600] seconds."""
    url = url or environ.get(WEBHOOK_ENV) or None
    if url is None:
        if secret_file is not None:
            raise InvalidInput("--export-secret-file only applies with --export-webhook")
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        got = f" (got one with scheme {parts.scheme!r})" if parts.scheme else ""
        raise InvalidInput(
            "--export-webhook must be an absolute http:// or https:// URL with a host" + got
        )
    chosen = name or DEFAULT_SINK
    if not SINK_NAME.fullmatch(chosen):
        raise InvalidInput(
            "--export-name is 1 to 64 letters, digits, '.', '_' or '-' (starting with a letter "
            "or digit)"
        )
    life = DEFAULT_LEASE if lease is None else lease
    low, high = LEASE_RANGE
    if not low <= life <= high:
        raise InvalidInput(f"--export-lease is {low:g} to {high:g} seconds (got {life:g})")
    return ExportTarget(chosen, url, _secret(secret_file, environ), life)


def _secret(secret_file: Path | None, environ: Mapping[str, str]) -> bytes:
    if secret_file is not None:
        try:
            mode = stat.S_IMODE(secret_file.stat().st_mode)
            if mode & 0o077:  # as a private signing key is: whoever reads it forges the feed
                raise InvalidInput(
                    f"--export-secret-file {secret_file} is readable by others (mode {mode:o}): "
                    f"anyone who can read it can sign events the SIEM will trust. Run: chmod 600 "
                    f"{secret_file}"
                )
            secret = secret_file.read_bytes().strip()
        except OSError as exc:
            raise InvalidInput(
                f"cannot read --export-secret-file {secret_file}: {exc.strerror}"
            ) from None
    else:
        secret = environ.get(SECRET_ENV, "").strip().encode()
        if not secret:
            raise InvalidInput(
                "--export-webhook needs a shared secret to sign with: --export-secret-file FILE "
                f"or {SECRET_ENV}"
            )
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidInput(f"the export secret must be at least {MIN_SECRET_BYTES} bytes long")
    return secret


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for `body` sent at `timestamp` (Unix seconds, as text)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: bytes, timestamp: str, body: bytes, header: str, now: float) -> bool:
    """What a receiver checks: the signature is the body's under `secret` and the timestamp is
    within `TOLERANCE_SECONDS` of `now` (Unix seconds)."""
    try:
        fresh = abs(now - int(timestamp)) <= TOLERANCE_SECONDS
    except ValueError:
        return False
    return fresh and hmac.compare_digest(signature(secret, timestamp, body), header)
