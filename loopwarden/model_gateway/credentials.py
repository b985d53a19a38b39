"""The secrets at the gateway: the providers' real keys, and the tokens hosts present.

A provider's key lives in one file in the home, `model-keys/<provider>`, mode 0600 in a 0700
folder, written by `loopwarden model key set` (from stdin, never an argument) and read when a
call goes upstream. It is never stored in the journal, logged, traced, exported or returned;
a key file anyone but its owner may read is refused (fail closed), as is a missing one.

A host presents a *gateway token* where it would put the provider key: an `observer` token for
one agent, bound to one loop (`loopwarden model token --agent A --loop L`), with its own prefix
(`lwm_`) that every other edge refuses. It never goes upstream: the gateway strips every
credential header and sets the real key.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from loopwarden.auth.tokens import GATEWAY_TOKEN_PREFIX, token_hash, token_problem
from loopwarden.auth.verified import Coalesced
from loopwarden.errors import InvalidInput
from loopwarden.kernel.store.store import Store
from loopwarden.principals import Principal

KEYS_DIR = "model-keys"
MAX_KEY = 4096
MAX_KNOWN = 4096  # verified gateway tokens remembered; past it the memory starts afresh


class KeyMissing(Exception):
    """No usable key for a provider (missing, unreadable, or readable by others)."""


def key_path(home: Path, provider: str) -> Path:
    return home / KEYS_DIR / provider


def write_key(home: Path, provider: str, key: str) -> Path:
    """Store `key` for `provider` (0600, in a 0700 folder); `InvalidInput` for an empty or
    multi-line key."""
    key = key.strip()
    if not key or "\n" in key or len(key) > MAX_KEY or not key.isprintable():
        raise InvalidInput("a provider key is one line of printable characters")
    folder = home / KEYS_DIR
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / provider
    scratch = folder / f".{provider}.new"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(key + "\n")
    os.replace(scratch, path)
    return path


def read_key(home: Path, provider: str) -> str:
    """The key for `provider`; `KeyMissing` saying why there is none to use."""
    path = key_path(home, provider)
    try:
        info = path.stat()
        if info.st_mode & 0o077:
            raise KeyMissing(
                f"the key file for {provider} may be read by others than its owner: "
                f"chmod 600 it (loopwarden refuses to use it until then)"
            )
        if not stat.S_ISREG(info.st_mode):
            raise KeyMissing(f"the key for {provider} is not a regular file")
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise KeyMissing(
            f"the model gateway holds no key for {provider}: an operator sets one with "
            f"`loopwarden model key set {provider}` (the key on stdin)"
        ) from None
    except OSError as exc:
        raise KeyMissing(f"the key for {provider} cannot be read ({exc.strerror})") from None
    if not key:
        raise KeyMissing(f"the key file for {provider} is empty")
    return key


def stored_providers(home: Path) -> list[str]:
    folder = home / KEYS_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


@dataclass(frozen=True)
class Bearer:
    """Who a gateway token speaks for: the agent (as an observer) and its one loop."""

    principal: Principal
    loop_id: str
    token_id: str
    expires_at: datetime | None = None


class GatewayTokens:
    """Verified gateway tokens, remembered as the server's bearer tokens are (`auth/verified.py`):
    a repeat request skips the row read and the MAC check, never the revocation and expiry
    checks (the tokens version is read per request, concurrent requests sharing one read)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._known: dict[str, tuple[Bearer, datetime | None, object]] = {}
        self.versions = Coalesced(self._version)

    async def _version(self) -> object:
        return await self.store.read(lambda r: r.tokens_version(), snapshot=False)

    def remembered(self, token: str | None) -> tuple[Bearer, str] | None:
        """The bearer `token` was verified for and the tokens version then (repr), if it is
        remembered and unexpired: to be confirmed against a version read for this request."""
        if not token or not token.startswith(GATEWAY_TOKEN_PREFIX) or len(token) > 200:
            return None
        known = self._known.get(token_hash(token))
        if known is None:
            return None
        bearer, expires, version = known
        if expires is not None and self.store.clock() >= expires:
            return None
        return bearer, repr(version)

    async def verify(self, token: str | None) -> tuple[Bearer | None, str]:
        """As `verify_gateway_token`, from what was verified under the same tokens version."""
        if not token or not token.startswith(GATEWAY_TOKEN_PREFIX) or len(token) > 200:
            return await verify_gateway_token(self.store, token, self.store.clock())
        hashed = token_hash(token)
        version = await self.versions()
        now = self.store.clock()
        known = self._known.get(hashed)
        if known is not None:
            remembered, expires, seen = known
            if seen == version and (expires is None or now < expires):
                return remembered, ""
            del self._known[hashed]
        found, why = await verify_gateway_token(self.store, token, now)
        if found is not None:
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known[hashed] = (found, found.expires_at, version)
        return found, why


async def verify_gateway_token(
    store: Store, token: str | None, now: datetime
) -> tuple[Bearer | None, str]:
    """The gateway token's bearer, or (None, why not): `missing`, `unknown`, `revoked`,
    `expired`, `forged`, `unbound` (a token of another kind)."""
    if not token:
        return None, "missing"
    if not token.startswith(GATEWAY_TOKEN_PREFIX) or len(token) > 200:
        return None, "unbound"
    row = await store.read(lambda r: r.token(token_hash(token)))
    problem = token_problem(row, now, store.integrity)
    if problem is not None or row is None:
        return None, problem or "unknown"
    if row.loop_id is None or row.role != "observer":
        return None, "unbound"
    bearer = Bearer(Principal(id=row.agent, role="observer"), row.loop_id, row.token_id)
    return replace(bearer, expires_at=row.expires_at), ""
