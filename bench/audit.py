"""Family 3 — audit speed: `audit()` receipts per second next to the raw PyNaCl verify rate
over the same envelopes in the same run, where the rest of an audit's time goes, offline
bundle export and verification for a loop of N receipts, and a journal of several loops (their
replays spread over the audit's workers) against raw PyNaCl on every core."""

from __future__ import annotations

import base64
import inspect
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nacl.signing

from bench import harness as h
from bench.report import Section, Table, Target
from loopwarden.audit.bundles import export_bundle, load_bundle, verify_bundle
from loopwarden.audit.database import audit
from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.clock import system_clock
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.keys import Keyring, KeyStore
from loopwarden.kernel.log.seals import open_envelope, pae
from loopwarden.kernel.store.reader import JournalRow
from loopwarden.kernel.store.store import Txn
from loopwarden.kinds import KINDS

T = TypeVar("T")
NAME = "audit"
TARGET = 0.80  # of the raw PyNaCl verify rate
OUTSIDE_TARGET = (1 - 0.57) / 2  # issue 15: verify was 57% of the raw rate; halve the rest


@dataclass(frozen=True)
class Config:
    receipts: int
    repeats: int  # for audit() and the raw verify rate
    detail_repeats: int  # for the breakdown and the bundles


QUICK = Config(receipts=1_000, repeats=2, detail_repeats=1)
FULL = Config(receipts=10_000, repeats=3, detail_repeats=1)
BUILD_SHARE = 0.5  # of the family's budget, for building the journal


async def build(home: Path, receipts: int, deadline: h.Deadline) -> None:
    """One loop of about `receipts` receipts (loop.opened + claim/update pairs), then a fresh
    checkpoint so a bundle can cover all of it. synchronous=normal: setup speed only."""
    async with h.open_store(home, synchronous="normal") as store:
        await h.open_bench_loop(store, todos=10)
        for _ in range((receipts - 1) // 2):
            if deadline.expired:
                break
            await h.governed_turn(store, h.AGENT, h.LOOP_ID)
        await store.write(Txn.checkpoint)


LOOPS = 8  # the several-loops case: loops whose replays the audit spreads over its workers


async def build_loops(home: Path, receipts: int, deadline: h.Deadline) -> None:
    """`LOOPS` loops of about `receipts` receipts in all, their turns interleaved in the
    journal (round robin), then a checkpoint."""
    async with h.open_store(home, synchronous="normal") as store:
        loops = [await h.open_bench_loop(store, todos=10, loop_id=f"L{i}") for i in range(LOOPS)]
        for n in range((receipts - LOOPS) // 2):
            if deadline.expired:
                break
            await h.governed_turn(store, h.AGENT, loops[n % LOOPS])
        await store.write(Txn.checkpoint)


async def several_loops(section: Section, cfg: Config, budget: float) -> None:
    """`audit()` of a journal of several loops (replayed in parallel, a share of the loops in
    each worker) against raw PyNaCl on every core, same envelopes, same run."""
    with h.temp_home(f"{NAME}-loops") as home:
        h.progress(NAME, f"building ~{cfg.receipts:,} receipts over {LOOPS} loops")
        await build_loops(home, cfg.receipts, h.Deadline(budget))
        keyring = KeyStore(home).keyring()
        with h.snapshot(home) as reader:
            rows = list(reader.iter_journal())
            cpu = ProcessCpu()
            audit_s, report = median_time(cfg.repeats, lambda: cpu.run(audit, reader, keyring))
            if not report.clean:
                raise RuntimeError(f"the bench journal does not audit clean: {report.findings}")
            inputs = raw_inputs(rows, keyring)
            one_s, _ = median_time(cfg.repeats, lambda: raw_verify(inputs))
            cores_s = raw_all_cores(inputs)
    n, cores = len(rows), os.cpu_count() or 1
    section.tables.append(
        Table(
            ["verify", "receipts", "receipts/s", "µs per receipt", "of raw PyNaCl on every core"],
            [
                ["`audit()`", str(n), h.rate(n / audit_s), h.us(audit_s / n), f"{cores_s / audit_s:.0%}"],
                ["raw PyNaCl verify, one process", str(n), h.rate(n / one_s), h.us(one_s / n), f"{cores_s / one_s:.0%}"],
                [f"raw PyNaCl verify, {cores} processes", str(n), h.rate(n / cores_s), h.us(cores_s / n), "100%"],
            ],
            title=f"{LOOPS} loops, their turns interleaved: replayed in parallel ({cores} cores)",
        )
    )  # fmt: skip
    section.notes.append(
        f"{LOOPS} loops: `audit()` took {h.us(cpu.main / n)} µs of CPU per receipt in its own "
        f"process and {h.us(cpu.workers / n)} µs in its workers (each replays a share of the "
        "loops: signatures, judge and fold)."
    )
    share = cores_s / audit_s
    section.targets.append(
        Target(
            f"verify ≥ {TARGET:.0%} of raw PyNaCl on all cores ({LOOPS} loops, replayed in "
            "parallel)",
            f"{share:.0%} ({h.rate(n / audit_s)} vs {h.rate(n / cores_s)} receipts/s)",
            share >= TARGET,
            ""
            if share >= TARGET
            else f"the replay's own work (judge, fold, schema) takes "
            f"{h.us((cpu.main + cpu.workers) / n - one_s / n)} µs of CPU per receipt beyond "
            "the signature, shared by every core",
        )
    )


def median_time(repeats: int, fn: Callable[[], T]) -> tuple[float, T]:
    """Median wall time of `repeats` (≥ 1) runs of `fn`, and the last run's result."""
    times = []
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - t0)
    return h.median(times), result


class ProcessCpu:
    """CPU seconds of the calls it runs, in this process and in the worker processes they
    started and joined (the fastest run's figures are kept)."""

    def __init__(self) -> None:
        self.main = self.workers = float("inf")

    def run(self, fn: Callable[..., T], *args: object) -> T:
        before, c0 = os.times(), time.process_time()
        result = fn(*args)
        after, main = os.times(), time.process_time() - c0
        workers = (after.children_user + after.children_system) - (
            before.children_user + before.children_system
        )
        if main < self.main:
            self.main, self.workers = main, workers
        return result


def raw_inputs(rows: list[JournalRow], keyring: Keyring) -> list[tuple]:
    """(verify key, PAE message, signature) per envelope, decoded outside the timed loop."""
    keys = {kid: nacl.signing.VerifyKey(pub) for kid, pub in keyring.public_keys().items()}
    out = []
    for row in rows:
        env = json.loads(row.envelope)
        sig = env["signatures"][0]
        message = pae(env["payloadType"], base64.b64decode(env["payload"]))
        out.append((keys[sig["keyid"]], message, base64.b64decode(sig["sig"])))
    return out


def _verify_chunk(inputs: list[tuple[bytes, bytes, bytes]]) -> int:
    import nacl.signing

    for key, message, signature in inputs:
        nacl.signing.VerifyKey(key).verify(message, signature)
    return len(inputs)


def raw_all_cores(inputs: list[tuple[Any, bytes, bytes]]) -> float:
    """Seconds for raw PyNaCl verification of `inputs` spread over every core (pool started
    beforehand, keys as bytes)."""
    plain = [(bytes(k), m, s) for k, m, s in inputs]
    cores = os.cpu_count() or 1
    chunks = [plain[i::cores] for i in range(cores)]
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_verify_chunk, [c[:1] for c in chunks]))  # started and warm
        t0 = time.perf_counter()
        done = sum(pool.map(_verify_chunk, chunks))
        seconds = time.perf_counter() - t0
    assert done == len(plain)
    return seconds


def raw_verify(inputs: list[tuple]) -> int:
    for key, message, signature in inputs:
        key.verify(message, signature)
    return len(inputs)


def primitives(
    rows: list[JournalRow], inputs: list[tuple], keyring: Keyring, repeats: int
) -> dict[str, float]:
    """Seconds per receipt of the primitive steps any audit of these envelopes has to take,
    each timed alone over all of them: they show what the audit's time could be made of,
    whatever its implementation."""
    envelopes = [json.loads(r.envelope) for r in rows]
    payloads = [base64.b64decode(e["payload"]) for e in envelopes]
    bodies = [json.loads(p) for p in payloads]
    models = [KINDS.parse_body(b) for b in bodies]
    digests = [sha256_digest(r.envelope) for r in rows]

    def parse() -> None:
        for r in rows:
            envelope = json.loads(r.envelope)
            json.loads(base64.b64decode(envelope["payload"]))
            base64.b64decode(envelope["signatures"][0]["sig"])

    def schema() -> None:
        for body in bodies:
            KINDS.parse_body(body)

    def fold() -> None:
        view = None
        for body, digest in zip(models, digests, strict=True):
            view = KINDS.apply(view, body, digest)

    def merkle_log() -> None:
        frontier: list[bytes] = []
        for size, r in enumerate(rows):
            frontier, _ = merkle.append_leaf(frontier, size, merkle.leaf_hash(r.envelope))

    steps: dict[str, Callable[[], object]] = {
        "Ed25519 signature (raw PyNaCl)": lambda: raw_verify(inputs),
        "JSON parse of envelope and payload, base64": parse,
        "RFC 8785 re-serialization of the body (canonical check)": lambda: [
            canonical_bytes(b) for b in bodies
        ],
        "receipt schema (typed body, one pass)": schema,
        "fold (KINDS.apply)": fold,
        "Merkle leaf hash + frontier append": merkle_log,
        "envelope digest (SHA-256)": lambda: [sha256_digest(r.envelope) for r in rows],
        "open_envelope with the keyring (every check)": lambda: [
            open_envelope(r.envelope, keyring) for r in rows
        ],
    }
    return {name: median_time(repeats, fn)[0] / len(rows) for name, fn in steps.items()}


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    section = Section(
        family=NAME,
        number=3,
        title="Audit speed",
        how=(
            f"one loop of about {cfg.receipts:,} receipts built with the kernel operations; "
            "`audit(reader, keyring)` (what `loopwarden verify` runs, default settings) over a "
            "read-only snapshot next to PyNaCl `VerifyKey.verify` over each envelope's DSSE PAE "
            "and signature (decoded beforehand) in one process: same envelopes, same run, median "
            f"of {cfg.repeats} runs. Then primitive steps timed alone over the same envelopes, "
            "and a bundle of the loop: `export_bundle` + `json.dumps`, `load_bundle` + "
            "`verify_bundle` pinned to the home's keys."
        ),
    )
    with h.temp_home(NAME) as home:
        h.progress(NAME, f"building ~{cfg.receipts:,} receipts")
        await build(home, cfg.receipts, h.Deadline(budget * BUILD_SHARE))
        keys = KeyStore(home)
        keyring, signer = keys.keyring(), keys.load_signer()
        with h.snapshot(home) as reader:
            rows = list(reader.iter_journal())
            h.progress(NAME, f"audit of {len(rows):,} receipts")
            cpu = ProcessCpu()
            audit_s, report = median_time(cfg.repeats, lambda: cpu.run(audit, reader, keyring))
            if not report.clean:
                raise RuntimeError(f"the bench journal does not audit clean: {report.findings}")
            inline_s = None
            if "workers" in inspect.signature(audit).parameters:  # signatures in processes
                inline_s, _ = median_time(
                    cfg.repeats,
                    lambda: audit(reader, keyring, workers=0),  # type: ignore[call-arg]
                )
            inputs = raw_inputs(rows, keyring)
            raw_s, _ = median_time(cfg.repeats, lambda: raw_verify(inputs))
            parts = primitives(rows, inputs, keyring, cfg.detail_repeats)
            h.progress(NAME, "bundle export and verify")
            now = system_clock()
            export_s, text = median_time(
                cfg.detail_repeats,
                lambda: json.dumps(
                    export_bundle(reader, h.LOOP_ID, keyring, now, signer), indent=2
                ),
            )
        verify_s, bundle_report = median_time(
            cfg.detail_repeats,
            lambda: verify_bundle(load_bundle(text), keyring),
        )
        if not bundle_report.clean:
            raise RuntimeError(f"the bench bundle does not verify: {bundle_report.findings}")
    n = len(rows)
    audit_rate, raw_rate = n / audit_s, n / raw_s
    share = audit_rate / raw_rate
    measured = [("raw PyNaCl verify, one process", raw_s), ("audit()", audit_s)]
    if inline_s is not None:
        measured.append(("audit(workers=0): signatures checked inline", inline_s))
    section.tables.append(
        Table(
            ["what", "receipts", "time ms", "receipts/s", "µs per receipt", "of raw verify rate"],
            [
                [label, str(n), h.ms(t), h.rate(n / t), h.us(t / n), f"{raw_s / t:.0%}"]
                for label, t in measured
            ],
        )
    )
    per = audit_s / n
    section.tables.append(
        Table(
            ["step, timed alone over the same envelopes", "µs per receipt", "÷ audit per receipt"],
            [[name, h.us(sec), f"{sec / per:.0%}"] for name, sec in parts.items()],
            title="What an audit's time can be made of",
        )
    )
    size = len(text.encode())
    section.tables.append(
        Table(
            ["bundle of one loop", "receipts", "size", "time ms", "receipts/s"],
            [
                [
                    "export (build + JSON)",
                    str(n),
                    h.mib(size),
                    h.ms(export_s),
                    h.rate(n / export_s),
                ],
                [
                    "verify (parse + check)",
                    str(n),
                    h.mib(size),
                    h.ms(verify_s),
                    h.rate(n / verify_s),
                ],
            ],
            title="Offline bundles",
        )
    )
    section.tables.append(
        Table(
            ["audit()", "µs per receipt"],
            [
                ["wall", h.us(per)],
                [
                    "CPU in this process (parse, validate, judge, fold, Merkle nodes)",
                    h.us(cpu.main / n),
                ],
                [
                    "CPU in worker processes (envelopes: parse, hashes, signatures)",
                    h.us(cpu.workers / n),
                ],
                ["raw PyNaCl verify alone", h.us(raw_s / n)],
            ],
            title=f"Where an audit's time goes ({os.cpu_count()} cores)",
        )
    )
    outside = 1 - raw_s / audit_s  # of an audit's time, what is not the signature itself
    section.targets.append(
        Target(
            "verify: the share of its time spent outside signatures halved (issue 15: 43% → "
            f"≤ {OUTSIDE_TARGET:.1%})",
            f"{outside:.0%} ({h.us(per - raw_s / n)} of {h.us(per)} µs a receipt)",
            outside <= OUTSIDE_TARGET,
        )
    )
    why = ""
    if share < TARGET:
        others = sum(
            sec for name, sec in parts.items() if not name.startswith(("Ed25519", "open_envelope"))
        )
        why = (
            f"an audit spends {h.us(per)} µs per receipt where the signature alone takes "
            f"{h.us(raw_s / n)} µs; the other steps, timed alone above, add up to "
            f"{h.us(others)} µs per receipt"
        )
    section.targets.append(
        Target(
            f"verify ≥ {TARGET:.0%} of the raw PyNaCl verify rate",
            f"{share:.0%} ({h.rate(audit_rate)} vs {h.rate(raw_rate)} receipts/s)",
            share >= TARGET,
            why,
        )
    )
    await several_loops(section, cfg, budget * BUILD_SHARE)
    return section
