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
    <previous key id> signs until <time>   (rotation only: the rotation's time plus the grace)
    (blank line)
    — <key id> <base64(key hash[4] || signature[64])>      one line per signing key

An audit trusts the chain that starts at the genesis key and follows valid rotations
(`KeyChain`); a key in the key directory that no statement introduced is reported, never
trusted. A statement whose signatures do not hold is refused: a chain cannot be extended
without the previous key's private half.

Each key the chain holds has a signing window (`Window`): a rotated-in key from its rotation's
time, and a retired key until the time its rotation states. Servers stop signing with a key at
the end of its window (`follow`), and the audit reports a receipt signed outside it. A rotation
written before the statement carried that last line (this release's development builds) gives
the retired key no grace: its window ends at the rotation's time.

The store anchors its history: the first server or command to open a store with a key history
records the genesis statement in the store (`meta.key_genesis`), so an audit of a home whose
history is gone, or was replaced by another chain, fails (`directory_trust`).
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from loopwarden.clock import parse_time
from loopwarden.errors import KeyFileError
from loopwarden.kernel.log.keys import (
    GENESIS,
    HISTORY_ORIGIN,
    ROTATION,
    SIG_PREFIX,
    UNTIL,
    Keyring,
    KeyStore,
    Signer,
    genesis,
    key_id_for,
    note_key_hash,
    rotation,
)

__all__ = [
    "KeyChain",
    "KeyProblem",
    "Tenure",
    "Trust",
    "Window",
    "directory_trust",
    "follow",
    "genesis",
    "parse_statement",
    "rotation",
]

log = logging.getLogger("loopwarden.keys")

SLACK = timedelta(minutes=5)
"""How far receipt times may disagree with the key history's and with each other without a
finding: clocks of hosts in a fleet, and a receipt sealed before and given its Merkle leaf after
another (the integrator's delay). A window's ends are judged with this much give."""

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
    until: str | None = None  # a rotation's: the last time the previous key may sign


def parse_statement(note: str) -> KeyStatement | None:
    """A statement's parts, or None if `note` is not one. Never raises; checks no signature."""
    body, sep, tail = note.partition("\n\n")
    lines = body.split("\n")
    try:
        kind: Kind = "genesis" if lines[0] == GENESIS else "rotation"
        if lines[0] not in (GENESIS, ROTATION) or not sep:
            return None
        # A rotation of a development build before retirement was stated has no last line.
        if len(lines) not in ((4,) if kind == "genesis" else (5, 6)):
            return None
        previous = lines[2] if kind == "rotation" else None
        until = None
        if len(lines) == 6:
            retired, _, until = lines[5].partition(f" {UNTIL} ")
            if retired != previous:
                return None
            parse_time(until)
            lines = lines[:5]
        elif previous is not None:
            until = lines[4]  # no grace stated: the retired key stops at the handover
        key_id, public_text = lines[-2].split(" ")
        public_key = base64.b64decode(public_text, validate=True)
        if len(public_key) != 32 or key_id_for(public_key) != key_id:
            return None
        parse_time(lines[-1])
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
    return KeyStatement(
        kind, lines[1], previous, key_id, public_key, lines[-1], note, signatures, until
    )


def _signed_by(statement: KeyStatement, key_id: str, public_key: bytes) -> bool:
    blob = statement.signatures.get(key_id)
    if blob is None or blob[:4] != note_key_hash(key_id, public_key):
        return False
    body = statement.note.partition("\n\n")[0] + "\n"
    return Keyring({key_id: public_key}).verify(key_id, body.encode(), blob[4:])


@dataclass(frozen=True)
class Window:
    """When a key may sign: from its rotation's time (`since`; None for a genesis key, whose
    statement a home older than its history wrote after the key first signed) until the time
    the rotation retiring it states (`until`; None while it is active)."""

    since: datetime | None = None
    until: datetime | None = None

    def problem(self, at: datetime, latest: datetime | None) -> str | None:
        """Why a receipt dated `at` and signed by this key is outside the window, or None.
        `latest` is the latest time of a receipt before it in the log: a receipt dated back
        into the window but placed after receipts dated past its end is outside it too."""
        if self.until is not None and at > self.until:
            return f"dated {at:%Y-%m-%dT%H:%M:%SZ}, after its key stopped signing ({self.until:%Y-%m-%dT%H:%M:%SZ})"
        if self.until is not None and latest is not None and latest > self.until + SLACK:
            return (
                f"placed after receipts dated {latest:%Y-%m-%dT%H:%M:%SZ}, past the time its key "
                f"stopped signing ({self.until:%Y-%m-%dT%H:%M:%SZ}): dated back"
            )
        if self.since is not None and at < self.since - SLACK:
            return f"dated {at:%Y-%m-%dT%H:%M:%SZ}, before its key was made ({self.since:%Y-%m-%dT%H:%M:%SZ})"
        return None


@dataclass
class KeyChain:
    """The keys a store's history vouches for, in the order they were introduced, and when
    each may sign."""

    origin: str
    keys: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    windows: dict[str, Window] = field(default_factory=dict)

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
        self.windows[statement.key_id] = Window()
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
        if statement.key_id in self.keys:
            self.problems.append(f"key {statement.key_id} is handed over to a second time")
            return False
        assert statement.until is not None  # every parsed rotation has one
        retired = self.windows.get(previous, Window())
        if retired.until is not None:
            self.problems.append(f"key {previous} hands over twice: it was already retired")
            return False
        self.windows[previous] = Window(retired.since, parse_time(statement.until))
        self.keys[statement.key_id] = statement.public_key
        self.windows[statement.key_id] = Window(since=parse_time(statement.at))
        return True


def _keys(count: int) -> str:
    return f"{count} key" if count == 1 else f"{count} keys"


class KeyProblemCode(StrEnum):
    """What can be wrong with the keys an audit is given (the audit's finding codes of the
    same values: `audit/findings.py`)."""

    UNVOUCHED = "key_unvouched"  # a key in the directory its history does not vouch for
    HISTORY_MISSING = "key_history_missing"  # keys that cannot be told apart without a history
    HISTORY_MISMATCH = "key_history_mismatch"  # the history is not the one the store anchored


@dataclass(frozen=True)
class KeyProblem:
    code: KeyProblemCode
    message: str


@dataclass(frozen=True)
class Trust:
    """The keys an audit of a home trusts, what they rest on (one line), what is wrong, and
    when each key may sign (none known: no window is judged)."""

    keyring: Keyring
    basis: str
    problems: tuple[KeyProblem, ...] = ()
    windows: dict[str, Window] = field(default_factory=dict)


def anchored_key(anchor: str | None) -> str | None:
    """The genesis key a store's anchor names, if it is a genesis statement its key signed."""
    statement = None if anchor is None else parse_statement(anchor)
    if statement is None or statement.kind != "genesis":
        return None
    if not _signed_by(statement, statement.key_id, statement.public_key):
        return None
    return statement.key_id


def directory_trust(keys: KeyStore, anchor: str | None = None) -> Trust:
    """What a home's key directory vouches for, given the store's anchored genesis statement
    (`anchor`, None for a store that has none): the chain its key history holds, every other
    key in the directory reported and not trusted, and each key's signing window.

    Without a history, fail closed: only a directory of one key and a store that anchors no
    history is trusted (a home made before histories were kept and never rotated, whose next
    server start writes its genesis); otherwise the keys cannot be told from a planted one and
    the audit fails (`key_history_missing`: restore `keys/history`, or pin the keys with
    `--trusted-keys`). A history that does not start at the anchored key fails too."""
    directory = keys.keyring()
    statements = keys.statements()
    anchored = anchored_key(anchor)
    if not statements:
        return _without_history(directory, anchor, anchored)
    chain = KeyChain(HISTORY_ORIGIN)
    for note in statements:
        chain.add(note)
    problems = [KeyProblem(KeyProblemCode.UNVOUCHED, p) for p in chain.problems]
    problems += [
        KeyProblem(
            KeyProblemCode.UNVOUCHED,
            f"key {key_id} is in the key directory but not in its key history: not trusted",
        )
        for key_id in directory.ids()
        if key_id not in chain.keys
    ]
    if anchor is not None and anchored != chain.first:
        problems.append(
            KeyProblem(
                KeyProblemCode.HISTORY_MISMATCH,
                f"the key history starts at genesis key {chain.first}, but the store anchors "
                f"genesis key {anchored or '(unreadable)'}: this is another store's history, or "
                "a history written in place of the store's",
            )
        )
    return Trust(
        chain.keyring(),
        f"the key history: {_keys(len(chain.keys))} from genesis key {chain.first}",
        tuple(problems),
        dict(chain.windows),
    )


def _without_history(directory: Keyring, anchor: str | None, anchored: str | None) -> Trust:
    """`directory_trust` for a key directory with no history: its one key trusted if the store
    anchors none, else nothing proven (`key_history_missing`)."""
    count = _keys(len(directory.ids()))
    if anchor is None and len(directory.ids()) <= 1:
        return Trust(
            directory,
            f"the only key in the key directory ({count}): it has no key history yet "
            "(made before one was kept; a server started on it writes one)",
        )
    if anchor is not None:
        why = (
            f"the store anchors a key history from genesis key {anchored or '(unreadable)'}, "
            "but the key directory has none (keys/history)"
        )
    else:
        why = f"the key directory holds {count} and no key history (keys/history)"
    problem = KeyProblem(
        KeyProblemCode.HISTORY_MISSING,
        f"{why}: which keys are the store's cannot be told from a key written into the "
        "directory. Restore keys/history from a backup, or pin the keys with --trusted-keys",
    )
    return Trust(directory, f"no key history: {count} of the key directory, unproven", (problem,))


@dataclass(frozen=True)
class Tenure:
    """What a running server signs with, and the last time its key history lets it sign."""

    signer: Signer
    until: datetime | None


def history_chain(keys: KeyStore) -> KeyChain:
    """The chain of `keys`' history (empty without one). `KeyFileError` if it is damaged."""
    chain = KeyChain(HISTORY_ORIGIN)
    for note in keys.statements():
        chain.add(note)
    return chain


def follow(keys: KeyStore, current: Signer) -> Tenure:
    """What a server now signing with `current` should sign with: the home's active key once a
    valid rotation hands over to it and its private key can be loaded (servers sharing a home
    switch within a poll), else `current` until the time the history retires it. A key the
    history does not vouch for is never taken up (logged): a planted `active` pointer is not
    followed. A damaged history keeps what the server had (logged)."""
    try:
        chain = history_chain(keys)
    except KeyFileError as exc:
        log.error("cannot read the key history: %s", exc.message)
        return Tenure(current, None)
    until = chain.windows.get(current.key_id, Window()).until
    active = keys.active_id()
    if active is None or active == current.key_id:
        return Tenure(current, until)
    if active not in chain.keys:
        log.error("the active key %s is not in the key history: not signing with it", active)
        return Tenure(current, until)
    try:
        signer = keys.load_signer()
    except KeyFileError as exc:
        log.error("cannot load the new active key %s: %s", active, exc.message)
        return Tenure(current, until)
    if signer.key_id != active:
        return Tenure(current, until)
    return Tenure(signer, chain.windows[active].until)
