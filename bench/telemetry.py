"""Family 10 — telemetry: what watching costs a governed turn.

A governed turn (claim + update, two sealed receipts, SQLite synchronous=full) in process,
through the same runner every edge uses, in paired rounds: each round runs a block of turns
under each arm, in an order that rotates between rounds, so host noise hits every arm alike.
The arms: telemetry off (`NOBODY`, what `serve` has without `--otel` on stdio), off again (an
A/A pair: the noise floor), tracing and metrics on (spans exported over OTLP/HTTP to a receiver
in another process, the Prometheus registry counting), and the same with the webhook sink
delivering every receipt to a receiver meanwhile. The ratio of each arm's median to the off
arm's is taken per round; the table gives their medians over the rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from bench import harness as h
from bench.report import Section, Table, Target
from loopwarden.exports.sink import WebhookSink, sending
from loopwarden.exports.targets import ExportTarget
from loopwarden.kernel.store.store import Store
from loopwarden.observe import NOBODY, Observer

NAME = "telemetry"
ARMS = ("off", "off again (A/A)", "tracing + metrics", "tracing + metrics + webhook sink")
RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


@dataclass(frozen=True)
class Config:
    rounds: int
    turns: int  # per arm per round


QUICK = Config(rounds=6, turns=20)
FULL = Config(rounds=12, turns=40)


@asynccontextmanager
async def receiver() -> AsyncIterator[str]:
    """An HTTP receiver answering 200 to every POST, in its own process: its URL."""
    process = subprocess.Popen(
        [sys.executable, "-c", RECEIVER],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        h.stop_process(process)


async def turn(store: Store, observer: Observer) -> float:
    store.observer = observer
    try:
        claim, update = await h.governed_turn(store, h.AGENT, h.LOOP_ID)
    finally:
        store.observer = NOBODY
    return claim + update


async def rounds(
    store: Store, cfg: Config, deadline: h.Deadline, watching: Observer, sink: WebhookSink
) -> dict[str, list[float]]:
    """Each arm's per-round ratio to the off arm. Within a round the observer arms take turns
    one governed turn at a time (their order rotating), so a burst of host noise falls on all
    of them; the sink arm runs as one block with the sink delivering, against a block off."""
    ratios: dict[str, list[float]] = {arm: [] for arm in ARMS[1:]}
    observers = {ARMS[0]: NOBODY, ARMS[1]: NOBODY, ARMS[2]: watching}
    names = list(observers)
    for r in range(cfg.rounds):
        if deadline.expired and r >= 2:
            break
        samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for i in range(cfg.turns):
            for arm in names[(r + i) % 3 :] + names[: (r + i) % 3]:
                samples[arm].append(await turn(store, observers[arm]))
        async with sending(sink):
            for _ in range(cfg.turns):
                samples[ARMS[3]].append(await turn(store, watching))
        off_block = [await turn(store, NOBODY) for _ in range(cfg.turns)]
        off = h.median(samples[ARMS[0]])
        for arm in ARMS[1:3]:
            ratios[arm].append(h.median(samples[arm]) / off)
        ratios[ARMS[3]].append(h.median(samples[ARMS[3]]) / h.median(off_block))
        ratios.setdefault("off", []).append(off)
    return ratios


async def measure(cfg: Config, deadline: h.Deadline, url: str) -> dict[str, list[float]]:
    """`rounds` on a fresh store, with telemetry exporting to `url`."""
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = url  # the SDK reads it when tracing starts
    from loopwarden.observe.telemetry import Telemetry

    watching = Telemetry(tracing=True, metrics=True, version="bench")
    try:
        with h.temp_home(NAME) as home:
            async with h.open_store(home) as store:
                await h.open_bench_loop(store, cfg.rounds * cfg.turns * (len(ARMS) + 1) + 10)
                target = ExportTarget("bench", url + "/ingest", b"bench-secret-0123456789")
                sink = WebhookSink(store, target, observer=watching)  # serve's pacing
                return await rounds(store, cfg, deadline, watching, sink)
    finally:
        watching.shutdown()
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    section = Section(
        family=NAME,
        number=10,
        title="Telemetry on and off",
        how=(
            "a governed turn (claim + update, two sealed receipts) in process through the "
            f"operations' runner, SQLite synchronous=full; {cfg.rounds} paired rounds, each "
            f"running {cfg.turns} turns under each arm; the observer arms take turns one governed "
            "turn at a time, their order rotating, and the sink arm runs as a block against a "
            "block with telemetry off. "
            "Arms: telemetry off; off again (an A/A pair, the noise floor); tracing and metrics "
            "on (spans exported over OTLP/HTTP by the SDK's batch thread to a receiver in "
            "another process, the Prometheus registry counting); the same with the webhook sink "
            "delivering every receipt to that receiver (serve's pacing: a batch per 0.5 s). "
            "Each arm's median over the off arm's, "
            "per round; the table gives the median of those ratios and their range."
        ),
    )
    h.progress(NAME, "paired rounds")
    async with receiver() as url:
        ratios = await measure(cfg, deadline, url)
    rows = [_row(arm, ratios[arm]) for arm in ARMS[1:]]
    section.tables.append(Table(["arm", "rounds", "× off (median)", "range"], rows))
    section.targets += _targets(ratios)
    section.notes.append(
        f"a turn with telemetry off: {h.ms(h.median(ratios['off']))} ms (median of rounds)"
    )
    section.notes.append(
        f"load average at the start of the family: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return section


def _row(arm: str, values: list[float]) -> list[str]:
    return [arm, str(len(values)), h.ratio(h.median(values)), _range(values)]


def _range(values: list[float]) -> str:
    return f"{min(values):.3f}–{max(values):.3f}"


def _targets(ratios: dict[str, list[float]]) -> list[Target]:
    noise = h.median(ratios[ARMS[1]])
    on = h.median(ratios[ARMS[2]])
    spread = max(abs(v - 1) for v in ratios[ARMS[1]])
    added = (on - 1) * h.median(ratios["off"])
    why = (
        f"{h.ms(added)} ms more per turn (two spans, their attributes and samples, in the "
        "caller's task); the SDK's batch thread serializes and posts them on the same two "
        "cores, shared here with other work (see the load average)"
    )
    return [
        Target(
            "tracing + metrics on ≤ 5% slower than off (paired rounds)",
            f"{h.ratio(on)} of off",
            on <= 1.05,
            why if on > 1.05 else "",
        ),
        Target(
            "off: no difference beyond noise (A/A pair)",
            f"{h.ratio(noise)} (rounds within ±{spread * 100:.1f}%)",
            abs(noise - 1) <= max(0.02, spread),
        ),
    ]
