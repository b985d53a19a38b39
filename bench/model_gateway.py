"""Family 14 — the model gateway: what loopwarden in the model path costs a model call.

A real `loopwarden serve --http` (SQLite, synchronous=full) in front of the tests' scripted
upstream (`tests/model_upstream.py`, a threaded server on loopback that answers the Anthropic
Messages API with fixed usage at once). One client (httpx2, keep-alive) calls the same upstream
directly and through the gateway, in paired rounds that alternate which goes first, so both arms
share the machine's state; the added latency is the difference of the medians. Measured: a
non-streamed call (request → whole answer), a streamed call's first byte, 64 streams at once
through one server (each 10 events 20 ms apart: every one must finish, none may stall), the
server's CPU per call (its /proc utime + stime over a batch of calls) and the database bytes per
call (the file after a WAL checkpoint, over a batch of sealed calls).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2

from bench import harness as h
from bench.report import Section, Table, Target

sys.path.insert(0, str(h.REPO / "tests"))
from model_upstream import ScriptedUpstream

NAME = "model_gateway"
LOOP = "gw"
POLICY = {
    "agents": [h.AGENT.id],
    "budgets": {"max_turns": 1000, "max_cost_usd": 1e6},
    "model": {"allow": ["claude-*"]},
}
BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "x" * 2000}],
}
ADDED_GOAL = 0.001  # seconds the gateway may add, p50, to a call and to a stream's first byte
CONCURRENT = 64
STALL = 0.5  # seconds of silence in a stream (its events 20 ms apart) that count as a stall
PAUSE = 0.02  # seconds between two calls of the spaced arms (a real model call takes far longer)
ARMS = ("direct", "gateway", "direct ttfb", "gateway ttfb", "direct b2b", "gateway b2b")


@dataclass(frozen=True)
class Config:
    rounds: int
    batch: int  # calls per arm per round
    streams: int  # concurrent streams
    cpu_calls: int
    bytes_calls: int


QUICK = Config(rounds=4, batch=20, streams=CONCURRENT, cpu_calls=100, bytes_calls=100)
FULL = Config(rounds=10, batch=40, streams=CONCURRENT, cpu_calls=400, bytes_calls=200)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cli(home: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        h.python("-m", "loopwarden", *args, "--home", str(home)),
        input=stdin, capture_output=True, text=True, timeout=120,
        env=h.child_env(), cwd=h.REPO,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"loopwarden {' '.join(args[:3])}: {done.stderr[-1000:]}")
    return done.stdout


def _prepare(home: Path, upstream: ScriptedUpstream) -> str:
    home.mkdir(parents=True, exist_ok=True)
    policy = home.parent / "policy.json"
    policy.write_text(json.dumps(POLICY))
    _cli(home, "loop", "open", "--policy", str(policy), "--objective", "bench", "--id", LOOP)
    _cli(home, "model", "key", "set", "anthropic", stdin=upstream.key + "\n")
    token = json.loads(
        _cli(home, "model", "token", "--agent", h.AGENT.id, "--loop", LOOP, "--json")
    )
    return str(token["token"])


def _serve(
    home: Path, upstream: ScriptedUpstream, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            h.python(
                "-m", "loopwarden", "serve", "--http", f"127.0.0.1:{port}", "--home", str(home),
                f"--model-upstream=anthropic={upstream.url}",
                "--max-connections-per-address", str(2 * CONCURRENT),
            ),
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            env=h.child_env(LOOPWARDEN_SYNCHRONOUS="full"), cwd=h.REPO,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not listen within 30 s") from None
            time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _call(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    answer = await client.post(url, json=BODY, headers=headers)
    await answer.aread()
    assert answer.status_code == 200, answer.text[:300]
    return time.perf_counter() - t0


async def _first_byte(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", url, json={**BODY, "stream": True}, headers=headers) as answer:
        assert answer.status_code == 200
        first = None
        async for _ in answer.aiter_raw():
            if first is None:
                first = time.perf_counter() - t0
        assert first is not None
        return first


async def _stream_gaps(
    client: httpx2.AsyncClient, url: str, headers: dict[str, str]
) -> tuple[float, float, float]:
    """(seconds to the first byte, to the whole answer, the longest silence between two chunks
    after the first)."""
    t0 = time.perf_counter()
    first: float | None = None
    last, gap = t0, 0.0
    async with client.stream("POST", url, json={**BODY, "stream": True}, headers=headers) as answer:
        assert answer.status_code == 200, answer.status_code
        async for _ in answer.aiter_raw():
            now = time.perf_counter()
            if first is None:
                first = now - t0
            else:
                gap = max(gap, now - last)
            last = now
    return first or 0.0, time.perf_counter() - t0, gap


def _db_bytes(home: Path) -> int:
    db = home / "loopwarden.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db.stat().st_size


async def _settled(home: Path, calls: int, timeout: float = 60) -> None:
    """Wait until `calls` model calls are sealed (a call is sealed after its answer went)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(home / "loopwarden.db") as conn:
            (n,) = conn.execute(
                "SELECT COUNT(*) FROM journal WHERE kind = 'model.called'"
            ).fetchone()
        if n >= calls:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{calls} calls were not sealed within {timeout} s")


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    section = Section(
        family=NAME,
        number=14,
        title="Model gateway",
        how=(
            "`loopwarden serve --http` (SQLite, synchronous=full) in front of the tests' scripted "
            "upstream (`tests/model_upstream.py`: a threaded server on loopback answering the "
            "Anthropic Messages API at once, fixed usage); one httpx2 client with keep-alive "
            f"calls the upstream directly and through the gateway in {cfg.rounds} paired rounds "
            f"of {cfg.batch} calls per arm, alternating which arm goes first (a 2 KB prompt, "
            "`max_tokens` 256), each call 20 ms after the last (a host's calls are a model's "
            "latency apart, so the last call's receipt is sealed before the next comes), then "
            f"{cfg.batch // 2} back to back; added latency = gateway p50 − direct p50. Streams: "
            f"time to the first byte, same pairing. Concurrency: {cfg.streams} streams at once through one "
            "server, each 10 events 20 ms apart. CPU: the server's utime + stime (/proc) over "
            f"{cfg.cpu_calls} sequential non-streamed calls. Bytes: the database file after a WAL "
            f"checkpoint, before and after {cfg.bytes_calls} sealed calls."
        ),
    )
    with h.temp_home(NAME) as home, ScriptedUpstream() as upstream:
        token = _prepare(home, upstream)
        process, base = _serve(home, upstream, home.parent / "serve.log")
        gateway = f"{base}/model/anthropic/v1/messages"
        direct = f"{upstream.url}/v1/messages"
        through = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        plain = {"x-api-key": upstream.key, "anthropic-version": "2023-06-01"}
        sealed = 0
        try:
            limits = httpx2.Limits(
                max_connections=2 * CONCURRENT, max_keepalive_connections=2 * CONCURRENT
            )
            async with httpx2.AsyncClient(timeout=60, limits=limits) as client:
                for _ in range(5):  # warm both paths
                    await _call(client, direct, plain)
                    await _call(client, gateway, through)
                    sealed += 1
                arms: dict[str, list[float]] = {name: [] for name in ARMS}
                for n in range(cfg.rounds):
                    if n >= 2 and deadline.expired:  # two rounds at least: both orders
                        break
                    order = (("direct", direct, plain), ("gateway", gateway, through))
                    for arm, url, headers in order if n % 2 == 0 else order[::-1]:
                        for _ in range(cfg.batch):  # spaced as a host's calls are
                            arms[arm].append(await _call(client, url, headers))
                            await asyncio.sleep(PAUSE)
                            arms[arm + " ttfb"].append(await _first_byte(client, url, headers))
                            await asyncio.sleep(PAUSE)
                        for _ in range(cfg.batch // 2):  # back to back
                            arms[arm + " b2b"].append(await _call(client, url, headers))
                        sealed += 2 * cfg.batch + cfg.batch // 2 if arm == "gateway" else 0
                    h.progress(NAME, f"round {n + 1}/{cfg.rounds}")
                await _settled(home, sealed)
                # 64 streams at once
                upstream.pieces, upstream.delay = 10, 0.02
                t0 = time.perf_counter()
                results = await asyncio.gather(
                    *(_stream_gaps(client, gateway, through) for _ in range(cfg.streams)),
                    return_exceptions=True,
                )
                wall = time.perf_counter() - t0
                ok = [r for r in results if isinstance(r, tuple)]
                failed = len(results) - len(ok)
                sealed += len(ok)
                upstream.pieces, upstream.delay = 3, 0.0
                await _settled(home, sealed)
                # CPU per call
                cpu0 = _cpu_seconds(process.pid)
                for _ in range(cfg.cpu_calls):
                    await _call(client, gateway, through)
                sealed += cfg.cpu_calls
                await _settled(home, sealed)
                cpu = (_cpu_seconds(process.pid) - cpu0) / cfg.cpu_calls
                # bytes per call
                before = _db_bytes(home)
                for _ in range(cfg.bytes_calls):
                    await _call(client, gateway, through)
                sealed += cfg.bytes_calls
                await _settled(home, sealed)
                per_call = (_db_bytes(home) - before) / cfg.bytes_calls
        finally:
            h.stop_process(process)

    lat = {arm: h.Latency.of(samples) for arm, samples in arms.items()}
    added = lat["gateway"].p50 - lat["direct"].p50
    added_first = lat["gateway ttfb"].p50 - lat["direct ttfb"].p50

    def row(what: str, arm: str) -> list[str]:
        a, b = lat["direct" + arm], lat["gateway" + arm]
        return [
            what, str(b.count), f"{h.ms(a.p50)} / {h.ms(a.p99)}", f"{h.ms(b.p50)} / {h.ms(b.p99)}",
            h.ms(b.p50 - a.p50), h.ratio(b.p50 / a.p50),
        ]  # fmt: skip

    section.tables.append(
        Table(
            [
                "call",
                "n",
                "direct p50 / p99 ms",
                "through the gateway p50 / p99 ms",
                "added p50 ms",
                "ratio",
            ],
            [
                row(f"non-streamed, {h.ms(PAUSE)} ms apart (request → whole answer)", ""),
                row(f"streamed, {h.ms(PAUSE)} ms apart, to the first byte", " ttfb"),
                row(
                    "non-streamed, back to back (the last call's receipt sealed meanwhile)", " b2b"
                ),
            ],
        )
    )
    longest = max((gap for _, _, gap in ok), default=0.0)
    slowest = max((t for _, t, _ in ok), default=0.0)
    first_p50 = h.median([f for f, _, _ in ok]) if ok else 0.0
    section.tables.append(
        Table(
            ["load", "value"],
            [
                [f"{cfg.streams} streams at once: finished / failed", f"{len(ok)} / {failed}"],
                ["their wall time (each 10 events 20 ms apart)", f"{h.ms(wall)} ms"],
                ["their first byte, p50", f"{h.ms(first_p50)} ms"],
                [
                    "slowest stream / longest silence in one after its first byte",
                    f"{h.ms(slowest)} / {h.ms(longest)} ms",
                ],
                ["server CPU per call (utime + stime)", f"{h.ms(cpu)} ms"],
                ["database bytes per sealed call", f"{per_call:,.0f}"],
            ],
        )
    )
    section.targets += [
        Target(
            "added latency ≤ 1 ms p50 (non-streamed)", f"{h.ms(added)} ms", added <= ADDED_GOAL,
            "" if added <= ADDED_GOAL else "in the call's path: the request read and parsed, one snapshot read (the admission and the token's version), the upstream request through httpx2, the answer through uvicorn; see the next note",
        ),
        Target(
            "added time to first streamed byte ≤ 1 ms p50", f"{h.ms(added_first)} ms",
            added_first <= ADDED_GOAL, "",
        ),
        Target(
            f"{cfg.streams} concurrent streams through one server without stalls",
            f"{len(ok)} of {cfg.streams} finished, longest silence {h.ms(longest)} ms",
            failed == 0 and longest < STALL, f"a stall: a silence of {h.ms(STALL)} ms or more in a stream after its first byte (its events are 20 ms apart)",
        ),
        Target("server CPU per call", f"{h.ms(cpu)} ms", None, ""),
        Target(
            "a sealed call within a hooked tool call's 1,341 bytes",
            f"{per_call:,.0f} bytes", per_call <= 1341, "",
        ),
    ]  # fmt: skip
    section.notes.append(
        "a call's receipt is sealed after its answer has gone to the client, so only the "
        "admission (one snapshot read of the loop, its pools and the tokens version; a refusal "
        "alone takes the writer) sits in the call's path; back to back, the next call also "
        "shares the machine with the last one's sealing (the server's CPU per call)"
    )
    return section
