"""Witness policies in the C2SP tlog-policy format: which logs, which witnesses, what quorum.

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]
    group <name> all|any|<k> <name>...
    quorum <name>|none

An auditor pins one (`verify --witness-policy`, `verify-bundle --witness-policy`); an operator
gives one with the witnesses' URLs to `serve --witness`, which submits every checkpoint to
them. Parsing is strict, as the spec has it: names are defined before they are used (so no
group can contain itself), a name is a group's member at most once, `none` is never a member,
no public key is listed twice, and there is exactly one quorum line. A `ValueError` names the
line at fault.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from loopwarden.errors import InvalidInput
from loopwarden.witnesses.vkeys import COSIGNATURE_V1, ED25519, VerifierKey, parse_vkey

NONE = "none"
MAX_ENTRIES = 256  # logs, witnesses and groups each (the spec asks for at least 32)


@dataclass(frozen=True)
class Witness:
    name: str  # the policy's name for it (its key's name may differ)
    vkey: VerifierKey
    url: str | None


@dataclass(frozen=True)
class Group:
    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class WitnessPolicy:
    """A parsed policy. `quorum` names a witness, a group, or `none`."""

    logs: tuple[tuple[VerifierKey, str | None], ...]
    witnesses: dict[str, Witness]
    groups: dict[str, Group]
    quorum: str
    text: str = field(default="", compare=False)

    def satisfied(self, cosigned: Iterable[str]) -> bool:
        """Whether witnesses (by policy name) that cosigned a checkpoint meet the quorum."""
        return self._holds(self.quorum, frozenset(cosigned))

    def _holds(self, name: str, cosigned: frozenset[str]) -> bool:
        if name == NONE:
            return True
        group = self.groups.get(name)
        if group is None:
            return name in cosigned
        return sum(self._holds(m, cosigned) for m in group.members) >= group.threshold

    def counted(self) -> list[str]:
        """The witnesses the quorum can count, in policy order."""
        wanted: set[str] = set()
        stack = [self.quorum]
        while stack:
            name = stack.pop()
            if name in self.groups:
                stack.extend(self.groups[name].members)
            elif name in self.witnesses:
                wanted.add(name)
        return [name for name in self.witnesses if name in wanted]

    def describe(self) -> str:
        """The quorum in words (`X-and-Y: all of (X: 2 of X1, X2, X3), (Y: any of Y1, Y2)`)."""
        return self._words(self.quorum)

    def _words(self, name: str) -> str:
        if name == NONE:
            return "no cosignature (quorum none)"
        group = self.groups.get(name)
        if group is None:
            return name
        n = len(group.members)
        amount = (
            "all" if group.threshold == n else "any" if group.threshold == 1 else group.threshold
        )
        inner = ", ".join(f"({self._words(m)})" if m in self.groups else m for m in group.members)
        return f"{name}: {amount} of {inner}"

    def logs_for(self, origin: str) -> list[VerifierKey]:
        """The listed log keys for `origin` (a log's vkey name is its origin)."""
        return [vkey for vkey, _ in self.logs if vkey.name == origin]


def _check_bytes(data: bytes) -> str:
    bad = [b for b in data if (b < 0x20 and b not in (0x09, 0x0A)) or b == 0x7F]
    if bad:
        raise ValueError(f"the policy holds a control character (0x{bad[0]:02x})")
    # Octets with the high bit set are opaque: kept as they are (surrogates), never interpreted.
    return data.decode("utf-8", errors="surrogateescape")


def parse_policy(data: bytes | str) -> WitnessPolicy:
    """Parse a tlog-policy document (bytes as read from its file, or text)."""
    text = _check_bytes(data if isinstance(data, bytes) else data.encode())
    logs: list[tuple[VerifierKey, str | None]] = []
    witnesses: dict[str, Witness] = {}
    groups: dict[str, Group] = {}
    quorum: str | None = None
    for number, raw in enumerate(text.split("\n"), start=1):
        words = raw.replace("\t", " ").split(" ")
        words = [w for w in words if w]
        if not words or words[0].startswith("#"):
            continue
        try:
            keyword, args = words[0], words[1:]
            if keyword == "log":
                if len(args) not in (1, 2):
                    raise ValueError("log <vkey> [<url>]")
                vkey = parse_vkey(args[0], kind=ED25519)
                if any(v.public_key == vkey.public_key for v, _ in logs):
                    raise ValueError("this log's key is listed already")
                logs.append((vkey, args[1] if len(args) == 2 else None))
            elif keyword == "witness":
                if len(args) not in (2, 3):
                    raise ValueError("witness <name> <vkey> [<url>]")
                name = _new_name(args[0], witnesses, groups)
                vkey = parse_vkey(args[1], kind=COSIGNATURE_V1)
                if any(w.vkey.public_key == vkey.public_key for w in witnesses.values()):
                    raise ValueError("this witness's key is listed already")
                witnesses[name] = Witness(name, vkey, args[2] if len(args) == 3 else None)
            elif keyword == "group":
                if len(args) < 3:
                    raise ValueError("group <name> all|any|<k> <name>...")
                name = _new_name(args[0], witnesses, groups)
                members = tuple(args[2:])
                for member in members:
                    if member == NONE:
                        raise ValueError("none cannot be a group member")
                    if member not in witnesses and member not in groups:
                        raise ValueError(f"{member!r} is not defined on a line before")
                if len(set(members)) != len(members):
                    raise ValueError("a name is a group's member at most once")
                groups[name] = Group(name, _threshold(args[1], len(members)), members)
            elif keyword == "quorum":
                if len(args) != 1:
                    raise ValueError("quorum <name>")
                if quorum is not None:
                    raise ValueError("a policy has exactly one quorum line")
                if args[0] != NONE and args[0] not in witnesses and args[0] not in groups:
                    raise ValueError(f"{args[0]!r} is not defined on a line before")
                quorum = args[0]
            else:
                raise ValueError(f"unknown keyword {keyword!r}")
            if max(len(logs), len(witnesses), len(groups)) > MAX_ENTRIES:
                raise ValueError(f"more than {MAX_ENTRIES} logs, witnesses or groups")
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    if quorum is None:
        raise ValueError("the policy has no quorum line")
    return WitnessPolicy(tuple(logs), witnesses, groups, quorum, text)


def _new_name(name: str, witnesses: dict[str, Witness], groups: dict[str, Group]) -> str:
    if name == NONE:
        raise ValueError("none is a predefined name")
    if name in witnesses or name in groups:
        raise ValueError(f"{name!r} is defined already")
    return name


def _threshold(word: str, n: int) -> int:
    if word == "all":
        return n
    if word == "any":
        return 1
    if not word.isdigit() or str(int(word)) != word:
        raise ValueError("a group's threshold is all, any or a decimal number")
    k = int(word)
    if not 1 <= k <= n:
        raise ValueError(f"a threshold of {k} among {n} members (1 <= k <= n)")
    return k


def load_policy(path: Path, *, urls: bool = False) -> WitnessPolicy:
    """The policy in file `path`; `InvalidInput` naming the file and the line at fault. With
    `urls`, every witness needs its URL and the quorum must count some (`serve --witness`)."""
    try:
        policy = parse_policy(path.read_bytes())
    except OSError as exc:
        raise InvalidInput(f"cannot read the witness policy {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidInput(f"the witness policy {path}: {exc}") from None
    if urls:
        bare = [w.name for w in policy.witnesses.values() if not w.url]
        if bare or not policy.witnesses:
            raise InvalidInput(
                f"the witness policy {path}: "
                + (f"witness {bare[0]} has no URL" if bare else "it lists no witness")
                + " (witness <name> <vkey> <url>: the submission prefix)"
            )
    return policy
