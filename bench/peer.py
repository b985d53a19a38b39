"""Family 15 — a peer, side by side: Microsoft's Agent Governance Toolkit (its Python core,
`agent-governance-toolkit-core`, the bench-only `peer` extra) against loopwarden on the same
policy (deny `git push*` and recursive forced deletes), in the same run, paired rounds.

- the decision, in process: the peer's `PolicyEvaluator.evaluate` (regex rules over the command
  line) against loopwarden's `evaluate_tool_call` (the command grammar), on one allowed and two
  denied shell lines;
- decide and record: the peer's decision, then an HMAC-signed, hash-chained JSON line appended
  to a file (`GovernanceEventSigner`, flushed, no fsync: what it ships) against loopwarden's
  hook event decided and sealed in process (an Ed25519-signed receipt, Merkle-logged, rows
  proved, committed at synchronous=normal and full);
- verify, per entry: the peer's HMAC and chain over its lines against `audit()` (every
  signature, the chains, the Merkle tree, the judge and the fold), next to raw PyNaCl
  verification of the same envelopes (one process, and all cores).

Where the peer does not install, the family says so and reports loopwarden's figures next to
raw baselines: a compiled regex search, an HMAC line appended to a file, raw PyNaCl.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import audit as audit_family
from bench import harness as h
from bench import hooks as hooks_family
from bench.report import Section, Table, Target
from loopwarden.audit.database import audit
from loopwarden.hosts.hook import HookEvent, hook
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.store.store import Synchronous
from loopwarden.policy.digest import policy_digest
from loopwarden.policy.evaluate import ToolCallFacts, evaluate_tool_call
from loopwarden.policy.model import LoopPolicy
from loopwarden.principals import Principal
from loopwarden.statuses import LoopStatus

NAME = "peer"
PEER = "agent-governance-toolkit-core"
POLICY = {
    "agents": [h.AGENT.id],
    "tools": {"allow": ["shell.run"], "commands": {"deny": ["git push*", "rm -r -f"]}},
    "budgets": {"max_turns": 1_000},
}
# The peer's rules for the same policy: regular expressions over the command line.
PEER_RULES = {
    "no-push": r"^\s*git\s+push\b",
    "no-recursive-forced-delete": r"\brm\s+(-[a-zA-Z]*r[a-zA-Z]*f|-[a-zA-Z]*f[a-zA-Z]*r)\b",
}
LINES = {
    "allowed": "pytest -q tests/test_store.py",
    "denied (git push)": "git push origin main",
    "denied (rm -rf)": "rm -rf build",
}
DECISION_TARGET = 1.0  # loopwarden's decision ≤ this × the peer's (issue 46)
SEAL_TARGET = 0.0003  # seconds, decide and seal p50 at synchronous=normal (issue 46)


@dataclass(frozen=True)
class Config:
    rounds: int
    batch: int  # decisions per side per round
    records: int  # decide-and-record calls per side
    entries: int  # receipts / lines verified


QUICK = Config(rounds=8, batch=200, records=300, entries=1_000)
FULL = Config(rounds=20, batch=500, records=1_500, entries=4_000)


def peer_version() -> str | None:
    try:
        return metadata.version(PEER)
    except metadata.PackageNotFoundError:
        return None


# --- the decision -----------------------------------------------------------------------------


def loopwarden_decider() -> Callable[[str], bool]:
    policy = LoopPolicy.model_validate(POLICY)
    digest = policy_digest(policy)

    def decide(line: str) -> bool:
        facts = ToolCallFacts(
            agent=h.AGENT.id,
            loop_id=h.LOOP_ID,
            loop_status=LoopStatus.ACTIVE,
            turn_id="turn-bench",
            tool="shell.run",
            host_tool="Bash",
            command=line,
            approved=frozenset(),
            tool_calls=0,
        )
        return evaluate_tool_call(policy, facts, digest=digest).allowed

    return decide


def peer_decider() -> Callable[[str], bool]:
    with warnings.catch_warnings():  # its import warns about a package it replaces
        warnings.simplefilter("ignore", DeprecationWarning)
        from agent_os.policies.evaluator import PolicyEvaluator
        from agent_os.policies.schema import (
            PolicyCondition,
            PolicyDefaults,
            PolicyDocument,
            PolicyRule,
        )

    rules = [
        PolicyRule(
            name=name,
            condition=PolicyCondition(field="command", operator="matches", value=pattern),
            action="deny",
        )
        for name, pattern in PEER_RULES.items()
    ]
    # what is not denied is allowed, as in loopwarden's policy (the peer's default is deny)
    document = PolicyDocument(name="bench", rules=rules, defaults=PolicyDefaults(action="allow"))
    evaluator = PolicyEvaluator([document])

    def decide(line: str) -> bool:
        return evaluator.evaluate({"tool_name": "Bash", "command": line}).allowed

    return decide


def regex_decider() -> Callable[[str], bool]:
    """The raw baseline: the same expressions, compiled once, searched."""
    compiled = [re.compile(p) for p in PEER_RULES.values()]
    return lambda line: not any(c.search(line) for c in compiled)


def paired(
    deciders: dict[str, Callable[[str], bool]], line: str, cfg: Config, deadline: h.Deadline
) -> dict[str, float]:
    """Median seconds per decision of each decider on `line`: rounds of `batch` calls each,
    interleaved, the order alternating."""
    samples: dict[str, list[float]] = {name: [] for name in deciders}
    names = list(deciders)
    for n in range(cfg.rounds):
        if n >= 2 and deadline.expired:
            break
        for name in names if n % 2 == 0 else reversed(names):
            decide = deciders[name]
            t0 = time.perf_counter()
            for _ in range(cfg.batch):
                decide(line)
            samples[name].append((time.perf_counter() - t0) / cfg.batch)
    return {name: statistics.median(s) for name, s in samples.items()}


# --- decide and record ------------------------------------------------------------------------


class PeerRecorder:
    """The peer's decision, then its evidence: a CloudEvent-shaped record signed with
    `GovernanceEventSigner` (HMAC-SHA256), chained to the previous line's hash, appended to a
    JSONL file and flushed (`fsync`: also synced)."""

    def __init__(self, path: Path, decide: Callable[[str], bool] | None, fsync: bool) -> None:
        self.key = secrets.token_bytes(32)
        self.sign = _peer_signer(self.key)
        self.decide = decide or regex_decider()
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.fsync = fsync
        self.prev = "0" * 64
        self.n = 0

    def __call__(self, line: str) -> bool:
        allowed = self.decide(line)
        self.n += 1
        event = {
            "specversion": "1.0", "type": "governance.decision", "source": "bench",
            "id": f"evt-{self.n}", "time": time.time(), "prev": self.prev,
            "data": {"tool": "Bash", "allowed": allowed,
                     "command_sha256": hashlib.sha256(line.encode()).hexdigest()},
        }  # fmt: skip
        text = json.dumps(self.sign(event), separators=(",", ":"))
        self.prev = hashlib.sha256(text.encode()).hexdigest()
        self.file.write(text + "\n")
        self.file.flush()
        if self.fsync:
            os.fsync(self.file.fileno())
        return allowed

    def close(self) -> None:
        self.file.close()


def _peer_signer(key: bytes) -> Callable[[dict[str, Any]], dict[str, Any]]:
    try:
        from agent_os.event_sink import GovernanceEventSigner
    except ImportError:
        return lambda event: {**event, "sig": _hmac(key, event)}
    return GovernanceEventSigner(key).sign


def _hmac(key: bytes, event: dict[str, Any]) -> str:
    canonical = json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    return base64.b64encode(hmac.digest(key, canonical.encode(), "sha256")).decode()


def peer_verify(path: Path, key: bytes) -> int:
    """Every line's HMAC and its link to the line before; the lines checked."""
    try:
        from agent_os.event_sink import GovernanceEventSigner

        verify: Callable[[dict[str, Any]], bool] = GovernanceEventSigner(key).verify
    except ImportError:

        def verify(event: dict[str, Any]) -> bool:
            sig = event.pop("sig")
            return hmac.compare_digest(sig, _hmac(key, event))

    prev, n = "0" * 64, 0
    with open(path, encoding="utf-8") as lines:
        for text in lines:
            event = json.loads(text)
            if event["prev"] != prev or not verify(event):
                raise RuntimeError(f"the peer's line {n + 1} does not verify")
            prev = hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
            n += 1
    return n


def hook_event(n: int, line: str) -> HookEvent:
    return HookEvent(
        loop_id=hooks_family.LOOP,
        host="claude-code",
        phase="pre",
        session_id="bench-session",
        tool_use_id=f"toolu_{n:08d}",
        host_tool="Bash",
        command=line,
        input_digest="sha256:" + hashlib.sha256(f"{n}:{line}".encode()).hexdigest(),
    )


async def loopwarden_records(
    synchronous: Synchronous, calls: int, deadline: h.Deadline
) -> list[float]:
    """Latencies of PreToolUse events decided and sealed in process (`hook`)."""
    observer = Principal(id=h.AGENT.id, role="observer")
    with h.temp_home(f"peer-{synchronous}") as home:
        await hooks_family.prepare(home)
        async with h.open_store(home, synchronous=synchronous) as store:
            for n in range(20):  # warm-up
                await hook(store, observer, hook_event(n, LINES["allowed"]))
            samples = []
            for n in range(calls):
                if deadline.expired and len(samples) >= 20:
                    break
                t0 = time.perf_counter()
                answer = await hook(store, observer, hook_event(100 + n, LINES["allowed"]))
                samples.append(time.perf_counter() - t0)
                if answer.receipt_id is None or answer.block:
                    raise RuntimeError("the bench hook event was not admitted and sealed")
    return samples


def peer_records(
    path: Path, decide: Callable[[str], bool] | None, fsync: bool, calls: int
) -> tuple[list[float], bytes]:
    recorder = PeerRecorder(path, decide, fsync)
    samples = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            recorder(LINES["allowed"])
            samples.append(time.perf_counter() - t0)
    finally:
        recorder.close()
    return samples, recorder.key


# --- verify -----------------------------------------------------------------------------------


# --- the family -------------------------------------------------------------------------------


def _verify_row(label: str, entries: int, seconds: float, peer_rate: float) -> list[str]:
    """One verifier's row: `entries` checked in `seconds`, its rate against the peer's."""
    rate = entries / seconds
    return [label, str(entries), h.rate(rate), h.us(seconds / entries), h.ratio(rate / peer_rate)]


def _full_target(section: Section, p50: dict[str, float], fsync: float) -> None:
    """synchronous=full judged against the target plus one fsync measured in the same run."""
    # One fsync on this disk, same run: the fsync'd line's p50 over the flushed line's.
    fsync = max(fsync, 0.0)
    section.targets.append(
        Target(
            f"decide and seal at synchronous=full ≤ {SEAL_TARGET * 1e3:.1f} ms + one fsync (p50)",
            f"{h.ms(p50['full'])} ms against {h.ms(SEAL_TARGET + fsync)} ms (one fsync here: "
            f"{h.ms(fsync)} ms, the peer's fsync'd line over its flushed one); full − normal "
            f"= {h.ms(p50['full'] - p50['normal'])} ms",
            p50["full"] <= SEAL_TARGET + fsync,
            "what full adds to normal is within one fsync"
            if p50["full"] - p50["normal"] <= fsync
            else "",
        )
    )


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    version = peer_version()
    peer_label = f"{PEER} {version}" if version else "raw baseline (the peer is not installed)"
    section = Section(
        family=NAME,
        number=15,
        title="A peer, side by side (Agent Governance Toolkit)",
        how=(
            "same run, same policy (deny `git push*` and recursive forced deletes). Decision: "
            f"{cfg.rounds} paired rounds of {cfg.batch} calls per side, interleaved, order "
            "alternating; median per call. Decide and record: sequential calls in process, "
            "p50. Verify: one journal of hook receipts audited with `audit()` against the "
            "peer's JSONL lines, HMAC and chain checked per line; raw PyNaCl over the same "
            "envelopes in one process and on every core."
        ),
    )
    if version is None:
        section.notes.append(
            f"`{PEER}` is not installed (`pip install -e '.[peer]'`): the peer's rows are raw "
            "baselines — a compiled regex search for the decision, an HMAC-signed JSON line "
            "appended to a file for the record — and the targets are judged against them."
        )
    else:
        section.notes.append(f"peer: `{PEER}` {version} from the package index.")
    deadline = h.Deadline(budget * 0.35)
    deciders = {"loopwarden": loopwarden_decider(), "regex": regex_decider()}
    if version is not None:
        deciders["peer"] = peer_decider()
    expected = {"allowed": True, "denied (git push)": False, "denied (rm -rf)": False}
    for label, line in LINES.items():
        for name, decide in deciders.items():
            if decide(line) != expected[label]:
                raise RuntimeError(f"{name} decided {line!r} wrongly")
    h.progress(NAME, "decisions, paired rounds")
    figures = {label: paired(deciders, line, cfg, deadline) for label, line in LINES.items()}
    reference = "peer" if version is not None else "regex"
    rows = []
    for label, fig in figures.items():
        rows.append(
            [
                label,
                h.us(fig["loopwarden"]),
                h.us(fig["peer"]) if "peer" in fig else "—",
                h.us(fig["regex"]),
                h.ratio(fig["loopwarden"] / fig[reference]),
            ]
        )
    section.tables.append(
        Table(
            [
                "shell line",
                "loopwarden µs",
                "peer µs (PolicyEvaluator)",
                "compiled regex µs",
                f"loopwarden ÷ {reference}",
            ],
            rows,
            title="The decision, in process",
        )
    )
    worst = max(fig["loopwarden"] / fig[reference] for fig in figures.values())
    section.targets.append(
        Target(
            f"the decision ≤ {DECISION_TARGET:.1f}× the {reference}'s, allowed and denied",
            f"{worst:.2f}× at worst ({', '.join(h.ratio(f['loopwarden'] / f[reference]) for f in figures.values())})",
            worst <= DECISION_TARGET,
            "these lines are plainly literal, so they take the reader's fast path (no "
            "grammar); what is left is the program readers (git's carriers), the rule "
            "matching, the reasons' wording and the evaluator around them"
            if worst > DECISION_TARGET
            else "",
        )
    )

    h.progress(NAME, "decide and record")
    record_deadline = h.Deadline(budget * 0.35)
    seal = {
        mode: await loopwarden_records(mode, cfg.records, record_deadline)
        for mode in ("normal", "full")
    }
    with h.temp_home("peer-file") as home:
        home.mkdir(parents=True)
        peer_decide = deciders.get("peer")
        flushed, _ = peer_records(home / "audit.jsonl", peer_decide, False, cfg.records)
        synced, _ = peer_records(home / "synced.jsonl", peer_decide, True, cfg.records // 3)
        peer_file = home / "verify.jsonl"
        _, verify_key = peer_records(peer_file, peer_decide, False, cfg.entries)
        t0 = time.perf_counter()
        checked = peer_verify(peer_file, verify_key)
        peer_verify_s = time.perf_counter() - t0
    p50 = {mode: h.percentile(s, 50) for mode, s in seal.items()}
    peer_p50, synced_p50 = h.percentile(flushed, 50), h.percentile(synced, 50)
    section.tables.append(
        Table(
            ["decide and record", "calls", "p50 ms", "p99 ms", "÷ peer (flushed)"],
            [
                [
                    "loopwarden hook event, sealed, synchronous=normal",
                    str(len(seal["normal"])),
                    h.ms(p50["normal"]),
                    h.ms(h.percentile(seal["normal"], 99)),
                    h.ratio(p50["normal"] / peer_p50),
                ],
                [
                    "loopwarden hook event, sealed, synchronous=full",
                    str(len(seal["full"])),
                    h.ms(p50["full"]),
                    h.ms(h.percentile(seal["full"], 99)),
                    h.ratio(p50["full"] / peer_p50),
                ],
                [
                    f"{peer_label}: HMAC line, flushed, no fsync",
                    str(len(flushed)),
                    h.ms(peer_p50),
                    h.ms(h.percentile(flushed, 99)),
                    "1.00×",
                ],
                [
                    f"{peer_label}: HMAC line, fsync'd",
                    str(len(synced)),
                    h.ms(synced_p50),
                    h.ms(h.percentile(synced, 99)),
                    h.ratio(synced_p50 / peer_p50),
                ],
            ],
            title="Decide and record the evidence, in process",
        )
    )
    section.targets.append(
        Target(
            f"decide and seal ≤ {SEAL_TARGET * 1e3:.1f} ms p50 (synchronous=normal)",
            f"{h.ms(p50['normal'])} ms ({h.ratio(p50['normal'] / peer_p50)} the peer's "
            f"flushed line); full {h.ms(p50['full'])} ms",
            p50["normal"] <= SEAL_TARGET,
        )
    )
    _full_target(section, p50, synced_p50 - peer_p50)

    h.progress(NAME, "verify")
    with h.temp_home("peer-audit") as home:
        await audit_family.build(home, cfg.entries, h.Deadline(budget * 0.2))
        keyring = KeyStore(home).keyring()
        with h.snapshot(home) as reader:
            rows_ = list(reader.iter_journal())
            audit_s, report = audit_family.median_time(2, lambda: audit(reader, keyring))
            if not report.clean:
                raise RuntimeError(f"the bench journal does not audit clean: {report.findings}")
            inputs = audit_family.raw_inputs(rows_, keyring)
            raw_s, _ = audit_family.median_time(2, lambda: audit_family.raw_verify(inputs))
            cores_s = audit_family.raw_all_cores(inputs)
    n = len(rows_)
    peer_rate = checked / peer_verify_s
    peer_row = [f"{peer_label}: HMAC and chain per line", str(checked), h.rate(peer_rate),
                h.us(1 / peer_rate), "1.00×"]  # fmt: skip
    section.tables.append(
        Table(
            ["verify", "entries", "per second", "µs per entry", "÷ peer"],
            [
                _verify_row("loopwarden `audit()` (signatures, chains, Merkle, judge, fold)",
                            n, audit_s, peer_rate),
                peer_row,
                _verify_row("raw PyNaCl verify, one process", n, raw_s, peer_rate),
                _verify_row(f"raw PyNaCl verify, {os.cpu_count()} processes", n, cores_s, peer_rate),
            ],
            title="Verify, per entry",
        )
    )  # fmt: skip
    section.notes.append(
        f"the peer's evidence is an HMAC under a shared key in a file (forgeable by whoever "
        f"holds the key, not Merkle-logged, no checkpoint); loopwarden's is an Ed25519-signed "
        f"receipt in a Merkle log with rows proved on every write. audit() is "
        f"{raw_s / audit_s:.0%} of raw PyNaCl in one process and {cores_s / audit_s:.0%} of raw "
        "PyNaCl on every core."
    )
    return section
