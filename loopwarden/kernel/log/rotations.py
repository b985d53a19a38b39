"""Key history: which keys may sign a store's receipts, as statements sealed by the keys.

A store's first key is named by a *genesis* statement, signed by that key. Every later key is
introduced by a *rotation* statement, signed by the key it replaces and by the new key (so the
holder of the old key vouches for the new one, and the new key proves it is held). The
statements are signed notes (the C2SP signed-note form the checkpoints use) with one signature
line per key:

    loopwarden key genesis | loopwarden key rotation
    <origin>                       the store the key signs for
    <previous key id>              (rotation only)
    <key id> <base64 public key>
    <time>
    (blank line)
    — <key id> <base64(key hash[4] || signature[64])>      one line per signing key

An audit trusts the chain that starts at the genesis key and follows valid rotations
(`KeyChain`); a key in the key directory that no statement introduced is reported, never
trusted. A statement whose signatures do not hold is refused: a chain cannot be extended
without the previous key's private half.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Literal

from loopwarden.kernel.log.keys import (
    GENESIS,
    HISTORY_ORIGIN,
    ROTATION,
    SIG_PREFIX,
    Keyring,
    KeyStore,
    genesis,
    key_id_for,
    note_key_hash,
    rotation,
)

__all__ = ["KeyChain", "Trust", "directory_trust", "genesis", "parse_statement", "rotation"]

Kind = Literal["genesis", "rotation"]


@dataclass(frozen=True)
class KeyStatement:
    """One statement, parsed (not yet checked against a chain)."""

    kind: Kind
    origin: str
    previous: str | None
    key_id: str
    public_key: bytes
    at: str
    note: str
    signatures: dict[str, bytes] = field(repr=False)  # key name → 68-byte blob


def parse_statement(note: str) -> KeyStatement | None:
    """A statement's parts, or None if `note` is not one. Never raises; checks no signature."""
    body, sep, tail = note.partition("\n\n")
    lines = body.split("\n")
    try:
        kind: Kind = "genesis" if lines[0] == GENESIS else "rotation"
        if lines[0] not in (GENESIS, ROTATION) or not sep:
            return None
        expected = 4 if kind == "genesis" else 5
        if len(lines) != expected:
            return None
        previous = lines[2] if kind == "rotation" else None
        key_id, public_text = lines[-2].split(" ")
        public_key = base64.b64decode(public_text, validate=True)
        if len(public_key) != 32 or key_id_for(public_key) != key_id:
            return None
        signatures: dict[str, bytes] = {}
        for line in (line for line in tail.split("\n") if line):
            if not line.startswith(SIG_PREFIX):
                return None
            name, blob_text = line[len(SIG_PREFIX) :].split(" ")
            blob = base64.b64decode(blob_text, validate=True)
            if len(blob) != 68 or name in signatures:
                return None
            signatures[name] = blob
    except (ValueError, IndexError, binascii.Error):
        return None
    return KeyStatement(kind, lines[1], previous, key_id, public_key, lines[-1], note, signatures)


def _signed_by(statement: KeyStatement, key_id: str, public_key: bytes) -> bool:
    blob = statement.signatures.get(key_id)
    if blob is None or blob[:4] != note_key_hash(key_id, public_key):
        return False
    body = statement.note.partition("\n\n")[0] + "\n"
    return Keyring({key_id: public_key}).verify(key_id, body.encode(), blob[4:])


@dataclass
class KeyChain:
    """The keys a store's history vouches for, in the order they were introduced."""

    origin: str
    keys: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def first(self) -> str | None:
        return next(iter(self.keys), None)

    def keyring(self) -> Keyring:
        return Keyring(dict(self.keys))

    def add(self, note: str) -> bool:
        """Follow one statement (genesis first, then rotations in order); a statement that does
        not hold is a problem, and the chain is not extended by it."""
        statement = parse_statement(note)
        if statement is None:
            self.problems.append("a key statement is not a well-formed signed note")
            return False
        if statement.origin != self.origin:
            self.problems.append(f"the key statement for {statement.key_id} names another store")
            return False
        if statement.kind == "genesis":
            return self._genesis(statement)
        return self._rotation(statement)

    def _genesis(self, statement: KeyStatement) -> bool:
        if self.keys:
            self.problems.append(f"a second genesis statement names {statement.key_id}")
            return False
        if not _signed_by(statement, statement.key_id, statement.public_key):
            self.problems.append(f"the genesis statement of {statement.key_id} is not its own")
            return False
        self.keys[statement.key_id] = statement.public_key
        return True

    def _rotation(self, statement: KeyStatement) -> bool:
        previous = statement.previous or ""
        if previous not in self.keys:
            self.problems.append(
                f"key {statement.key_id} is handed over by {previous}, which the chain does not hold"
            )
            return False
        old_ok = _signed_by(statement, previous, self.keys[previous])
        new_ok = _signed_by(statement, statement.key_id, statement.public_key)
        if not (old_ok and new_ok):
            self.problems.append(f"the rotation to {statement.key_id} is not signed by both keys")
            return False
        self.keys[statement.key_id] = statement.public_key
        return True


def _keys(count: int) -> str:
    return f"{count} key" if count == 1 else f"{count} keys"


@dataclass(frozen=True)
class Trust:
    """The keys an audit of a home trusts, what they rest on (one line), and what is wrong."""

    keyring: Keyring
    basis: str
    problems: tuple[str, ...] = ()


def directory_trust(keys: KeyStore) -> Trust:
    """What a home's key directory vouches for: the chain its key history holds, every other
    key in the directory reported and not trusted. A directory without a history (made before
    it was kept, with keys retired since) is trusted whole, and the basis says so."""
    directory = keys.keyring()
    statements = keys.statements()
    if not statements:
        return Trust(
            directory,
            f"every key in the key directory ({_keys(len(directory.ids()))}): it has no key history "
            "(made before one was kept); pin its keys with --trusted-keys",
        )
    chain = KeyChain(HISTORY_ORIGIN)
    for note in statements:
        chain.add(note)
    unvouched = [
        f"key {key_id} is in the key directory but not in its key history: not trusted"
        for key_id in directory.ids()
        if key_id not in chain.keys
    ]
    return Trust(
        chain.keyring(),
        f"the key history: {_keys(len(chain.keys))} from genesis key {chain.first}",
        tuple(chain.problems + unvouched),
    )
