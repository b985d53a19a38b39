"""Ed25519 signing keys on disk: generation, key ids, rotation, and the trusted keyring.

Layout under `<home>/keys/` (directory 0700):
- `<key_id>.key` — the 32-byte seed, base64, mode 0600; only the active key keeps one;
- `<key_id>.pub` — the public key, base64; kept forever so old receipts stay verifiable;
- `active` — the id of the key new receipts are signed with;
- `integrity.key` — the secret the rows no signature covers are MAC'd with (0600);
- `history` — the key history: the genesis statement of the first key and one rotation
  statement per later key, each a signed note (`rotations.py` reads and checks them), one JSON
  string per line, appended and never rewritten. A rotation states until when the key it
  retires may still sign (the rotation's time plus the fleet's grace): servers stop signing with
  it then, and the audit reports a receipt it signed later (`rotations.Window`).

The audit trusts the keys the history vouches for (`rotations.directory_trust`): a key written
into this directory by anything but `keys rotate` is reported, not trusted; a receipt signed by
a key that is not trusted is `unknown_key`, whatever the database claims.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nacl.exceptions
import nacl.signing

from loopwarden.clock import format_time
from loopwarden.errors import KeyFileError
from loopwarden.kernel.log.integrity import SECRET_BYTES

KEY_DIR_MODE = 0o700
PRIVATE_MODE = 0o600


SIG_PREFIX = "\u2014 "  # em dash + space: a signature line of a signed note (C2SP)
HISTORY_ORIGIN = "loopwarden key history"  # the origin line of every key statement
GENESIS = "loopwarden key genesis"
ROTATION = "loopwarden key rotation"


def note_key_hash(name: str, public_key: bytes) -> bytes:
    """The 4-byte key hash a signed note's signature starts with (C2SP signed-note, Ed25519)."""
    return hashlib.sha256(name.encode() + b"\n" + b"\x01" + public_key).digest()[:4]


def key_id_for(public_key: bytes) -> str:
    """A key's id: `ed25519-` + the first 16 hex digits of SHA-256 over the raw public key."""
    return "ed25519-" + hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class Signer:
    """A private key able to sign receipts and checkpoints."""

    key_id: str
    signing_key: nacl.signing.SigningKey

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    def sign(self, message: bytes) -> bytes:
        return self.signing_key.sign(message).signature

    def verifies(self, message: bytes, signature: bytes) -> bool:
        """True if `signature` is this key's valid signature over `message`."""
        try:
            self.signing_key.verify_key.verify(message, signature)
        except nacl.exceptions.BadSignatureError:
            return False
        return True

    @staticmethod
    def generate() -> Signer:
        key = nacl.signing.SigningKey.generate()
        return Signer(key_id_for(bytes(key.verify_key)), key)

    @staticmethod
    def from_seed(seed: bytes) -> Signer:
        key = nacl.signing.SigningKey(seed)
        return Signer(key_id_for(bytes(key.verify_key)), key)


class Keyring:
    """Trusted public keys by id. Verification never raises: a bad signature is just False."""

    def __init__(self, keys: dict[str, bytes] | None = None) -> None:
        self._keys: dict[str, nacl.signing.VerifyKey] = {}
        for public in (keys or {}).values():
            self.add(public)

    def add(self, public_key: bytes) -> str:
        if len(public_key) != 32:
            raise KeyFileError("an Ed25519 public key is 32 bytes")
        key_id = key_id_for(public_key)
        self._keys[key_id] = nacl.signing.VerifyKey(public_key)
        return key_id

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def public_keys(self) -> dict[str, bytes]:
        return {key_id: bytes(key) for key_id, key in sorted(self._keys.items())}

    def verify(self, key_id: str, message: bytes, signature: bytes) -> bool:
        key = self._keys.get(key_id)
        if key is None:
            return False
        try:
            key.verify(message, signature)
        except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
            return False
        return True


def signed_note(body: str, signers: list[Signer]) -> str:
    """`body` (ending in a newline) as a signed note, one signature line per signer."""
    lines = []
    for signer in signers:
        blob = note_key_hash(signer.key_id, signer.public_key) + signer.sign(body.encode())
        lines.append(f"{SIG_PREFIX}{signer.key_id} {base64.b64encode(blob).decode('ascii')}\n")
    return body + "\n" + "".join(lines)


UNTIL = "signs until"  # a rotation's last line: `<retired key id> signs until <time>`
DEFAULT_GRACE_SECONDS = 60
"""How long a retired key may still sign after `keys rotate` unless `--grace` says otherwise:
servers sharing the home switch to the new key within a second (`rotations.follow`); a fleet
whose replicas get the new key by a copy states the time that copy takes."""


def statement_body(
    origin: str, previous: str | None, new: Signer, at: str, until: str | None = None
) -> str:
    """The body of a key statement: a genesis (no previous key) or a rotation, which states
    until when the previous key may still sign."""
    lines = [GENESIS if previous is None else ROTATION, origin]
    if previous is not None:
        lines.append(previous)
    lines += [f"{new.key_id} {base64.b64encode(new.public_key).decode('ascii')}", at]
    if previous is not None:
        lines.append(f"{previous} {UNTIL} {until or at}")
    return "\n".join(lines) + "\n"


def genesis(origin: str, signer: Signer, at: str) -> str:
    """The statement naming `signer` as a store's first key (signed by it)."""
    return signed_note(statement_body(origin, None, signer, at), [signer])


def rotation(origin: str, old: Signer, new: Signer, at: str, until: str | None = None) -> str:
    """The statement by which `old` hands over to `new` (signed by both): `old` signs nothing
    dated after `until` (default `at`: no grace)."""
    return signed_note(statement_body(origin, old.key_id, new, at, until), [old, new])


def _now() -> datetime:
    return datetime.now(UTC)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_b64(path: Path, size: int) -> bytes:
    try:
        data = base64.b64decode(path.read_text().strip(), validate=True)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read key file {path.name}: {exc}") from None
    if len(data) != size:
        raise KeyFileError(f"key file {path.name} does not hold a {size}-byte key")
    return data


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create `path` exclusively with `mode` from the first byte (no window with looser bits)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class Rotated:
    """What `KeyStore.rotate` did: the key it retired (None on a home without one), the new
    active signer, and the last instant the retired key may sign (None without a retired key)."""

    retired: str | None
    signer: Signer
    until: datetime | None


class KeyStore:
    """The key directory of one data home."""

    def __init__(self, home: Path) -> None:
        self.dir = Path(home) / "keys"

    def _ensure_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=KEY_DIR_MODE)
        os.chmod(self.dir, KEY_DIR_MODE)

    def _check_private(self, path: Path) -> None:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise KeyFileError(
                f"private key {path.name} is readable by others (mode {mode:o}); "
                f"run: chmod 600 <home>/keys/{path.name}"
            )

    def active_id(self) -> str | None:
        try:
            return (self.dir / "active").read_text().strip() or None
        except FileNotFoundError:
            return None

    def load_signer(self) -> Signer:
        """The active signer, creating the first key if the directory has none.

        Safe when several processes start at once: the `active` pointer is created exclusively,
        and a process that loses the race discards its own key and loads the winner's.
        """
        self._ensure_dir()
        key_id = self.active_id()
        if key_id is None:
            candidate = Signer.generate()
            self._write_pair(candidate)
            if self._publish_active(candidate.key_id):
                self._start_history(candidate)
                return candidate
            (self.dir / f"{candidate.key_id}.key").unlink(missing_ok=True)
            (self.dir / f"{candidate.key_id}.pub").unlink(missing_ok=True)
            key_id = self.active_id()
        private = self.dir / f"{key_id}.key"
        if not private.exists():
            raise KeyFileError(
                f"the active key {key_id} has no private key file in the key directory"
            )
        self._check_private(private)
        signer = Signer.from_seed(_read_b64(private, 32))
        if signer.key_id != key_id:
            raise KeyFileError(f"private key file {private.name} does not match its id")
        if not self.history.exists():
            self._start_history(signer)  # a home made before the history was kept
        return signer

    @property
    def history(self) -> Path:
        return self.dir / "history"

    def statements(self) -> list[str]:
        """The key history's statements in order (none if the directory has no history)."""
        try:
            text = self.history.read_text()
        except FileNotFoundError:
            return []
        try:
            notes = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise KeyFileError(f"the key history keys/history is damaged: {exc}") from None
        if not all(isinstance(note, str) for note in notes):
            raise KeyFileError("the key history keys/history is damaged: not a list of notes")
        return notes

    def _start_history(self, signer: Signer) -> None:
        """Start the history with `signer`'s genesis, if the directory holds no other key and
        no history (created exclusively: of processes starting at once, one writes it). A home
        with retired keys and no history has none: its audit trusts the directory, and says so."""
        if {path.stem for path in self.dir.glob("*.pub")} - {signer.key_id}:
            return
        staged = self.dir / f"history.{os.urandom(8).hex()}.tmp"
        note = genesis(HISTORY_ORIGIN, signer, format_time(_now()))
        _write_new(staged, json.dumps(note), 0o644)
        try:
            os.link(staged, self.history)
        except FileExistsError:
            pass
        finally:
            staged.unlink(missing_ok=True)

    def _append_statement(self, note: str) -> None:
        fd = os.open(self.history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(note) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _publish_active(self, key_id: str) -> bool:
        """Point `active` at `key_id` unless another process already did; the pointer appears
        complete or not at all (written aside, then hard-linked into place)."""
        staged = self.dir / f"active.{key_id}.tmp"
        staged.unlink(missing_ok=True)
        _write_new(staged, key_id, 0o644)
        try:
            os.link(staged, self.dir / "active")
            return True
        except FileExistsError:
            return False
        finally:
            staged.unlink(missing_ok=True)

    def _write_pair(self, signer: Signer) -> None:
        seed = bytes(signer.signing_key)
        _write_new(self.dir / f"{signer.key_id}.key", _b64(seed), PRIVATE_MODE)
        _write_new(self.dir / f"{signer.key_id}.pub", _b64(signer.public_key), 0o644)

    def _previous(self) -> Signer | None:
        """The active signer before a rotation, or None if its private key is gone (then the
        handover cannot be signed: the new key is outside the history, and audits say so)."""
        try:
            return self.load_signer()
        except KeyFileError:
            return None

    def rotate(self, grace_seconds: int = DEFAULT_GRACE_SECONDS) -> Rotated:
        """Make a new active key; the old private key is deleted, its public key kept.

        The key history records the handover, signed by the old key and the new one, before the
        old private key goes (a home with no key yet gets the new key's genesis instead); it
        states that the old key signs nothing dated more than `grace_seconds` from now (`Rotated`
        says what was retired, the new signer, and that time). Servers
        sharing this home sign with the new key within a second (`rotations.follow`); one that
        cannot reach it refuses to sign past that time. The retired public key stays, so its
        receipts still verify.
        """
        if grace_seconds < 0:
            raise KeyFileError("a rotation's grace is zero seconds or more")
        self._ensure_dir()
        old = self.active_id()
        previous = self._previous() if old is not None else None
        new = Signer.generate()
        self._write_pair(new)
        now = _now()
        until = now + timedelta(seconds=grace_seconds) if previous is not None else None
        if previous is None:
            self._start_history(new)
        elif self.history.exists():
            stated = format_time(until) if until is not None else None
            self._append_statement(
                rotation(HISTORY_ORIGIN, previous, new, format_time(now), stated)
            )
        tmp = self.dir / "active.tmp"
        tmp.unlink(missing_ok=True)
        _write_new(tmp, new.key_id, 0o644)
        os.replace(tmp, self.dir / "active")
        if old is not None:
            (self.dir / f"{old}.key").unlink(missing_ok=True)
        return Rotated(old, new, until)

    def load_secret(self, *, create: bool = True) -> bytes:
        """The home's integrity secret (`integrity.key`, 0600), created on first use unless
        `create` is false (then a missing secret is a `KeyFileError`).

        Safe when several processes start at once: the file is created exclusively, and a
        process that loses the race reads the winner's."""
        path = self.dir / "integrity.key"
        if not create and not path.exists():
            raise KeyFileError(
                "the integrity secret keys/integrity.key is missing: the store's MACs cannot be "
                "checked, so it will not be served. Restore the key directory from a backup."
            )
        self._ensure_dir()
        if not path.exists():
            # Written aside, then linked into place: the file appears complete or not at all.
            staged = self.dir / f"integrity.{os.urandom(8).hex()}.tmp"
            _write_new(staged, _b64(os.urandom(SECRET_BYTES)), PRIVATE_MODE)
            try:
                os.link(staged, path)
            except FileExistsError:
                pass
            finally:
                staged.unlink(missing_ok=True)
        self._check_private(path)
        return _read_b64(path, SECRET_BYTES)

    def keyring(self) -> Keyring:
        """Every public key in the directory: the active one and all retired ones."""
        ring = Keyring()
        if self.dir.is_dir():
            for path in sorted(self.dir.glob("*.pub")):
                key_id = ring.add(_read_b64(path, 32))
                if f"{key_id}.pub" != path.name:
                    raise KeyFileError(f"public key file {path.name} does not match its id")
        return ring


def public_key_b64(public_key: bytes) -> str:
    return _b64(public_key)


def decode_public_key(text: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise KeyFileError("a public key is 32 bytes in base64") from None
    if len(data) != 32:
        raise KeyFileError("a public key is 32 bytes in base64")
    return data
