"""Family 1 — the transport floor vs governance: a no-op tool call next to `quota`, `claim`,
`update` and a full governed turn, on the same server over the same transport in the same run,
for in-memory, stdio and streamable HTTP (servers with synchronous=full, the default, and for
stdio and HTTP again with synchronous=normal)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench import harness as h
from bench.noop_server import build_noop_server
from bench.report import Section, Table, Target
from loopwarden.server.settings import Settings

NAME = "transport"
OPS = ("noop", "quota", "claim", "update", "turn")
TRANSPORTS = ("in-memory", "stdio", "HTTP")
RUNS = (
    ("in-memory", "full"),
    ("stdio", "full"),
    ("HTTP", "full"),
    ("stdio", "normal"),
    ("HTTP", "normal"),
)  # (transport, the server's synchronous mode)
STARTUP_TIMEOUT = 30.0
UPDATE_TARGET = {"full": 1.6, "normal": 1.3}  # update ÷ no-op (issue 15)


@dataclass(frozen=True)
class Config:
    calls: int  # measured calls per operation and transport
    rounds: int  # the operations take turns in this many rounds, so drift hits all alike
    warmup: int


QUICK = Config(calls=60, rounds=3, warmup=5)
FULL = Config(calls=300, rounds=5, warmup=20)
SETUP_SECONDS = {"in-memory": 0.5, "stdio": 2.0, "HTTP": 4.0}  # server start, token, handshake


class ToolFailed(RuntimeError):
    pass


async def _call(client: Client, name: str, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    result = await client.call_tool(name, args)
    elapsed = time.perf_counter() - t0
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise ToolFailed(f"{name}: {text}")
    return elapsed, result.structured_content or {}


async def _claim(client: Client) -> tuple[float, dict[str, Any]]:
    elapsed, grant = await _call(client, "claim", {"loop_id": h.LOOP_ID})
    if not grant.get("granted"):
        raise ToolFailed(f"claim refused: {grant.get('reasons')}")
    return elapsed, grant


async def _update(client: Client, grant: dict[str, Any], key: str) -> float:
    args = {"turn_id": grant["turn_id"], "fence": grant["fence"], "idempotency_key": key}
    elapsed, result = await _call(client, "update", {**args, **h.REPORT})
    if not result.get("accepted"):
        raise ToolFailed(f"update refused: {result.get('reasons')}")
    return elapsed


async def drive(client: Client, cfg: Config, deadline: h.Deadline) -> dict[str, list[float]]:
    """Warm up, then run every operation `cfg.calls` times in `cfg.rounds` interleaved rounds."""
    keys = (f"bench-{n}" for n in count())
    loop = {"loop_id": h.LOOP_ID}
    for _ in range(cfg.warmup):
        await _call(client, "noop", loop)
        await _call(client, "quota", loop)
        _, grant = await _claim(client)
        await _update(client, grant, next(keys))
    samples: dict[str, list[float]] = {op: [] for op in OPS}
    per_round = max(1, cfg.calls // cfg.rounds)
    for _ in range(cfg.rounds):
        if deadline.expired:
            break
        for _ in range(per_round):
            samples["noop"].append((await _call(client, "noop", loop))[0])
        for _ in range(per_round):
            elapsed, answer = await _call(client, "quota", loop)
            if not answer.get("allowed"):
                raise ToolFailed(f"quota says no: {answer.get('reasons')}")
            samples["quota"].append(elapsed)
        grants = []
        for _ in range(per_round):  # each claim takes another todo; the turns stay open
            elapsed, grant = await _claim(client)
            samples["claim"].append(elapsed)
            grants.append(grant)
        for grant in grants:  # ... and these close them
            samples["update"].append(await _update(client, grant, next(keys)))
        for _ in range(per_round):
            took, grant = await _claim(client)
            samples["turn"].append(took + await _update(client, grant, next(keys)))
    return samples


# --- the three transports -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = h.Deadline(STARTUP_TIMEOUT)
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the HTTP server exited {process.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if deadline.expired:
                raise RuntimeError("the HTTP server did not listen in time") from None
            time.sleep(0.05)


@asynccontextmanager
async def http_server(
    home: Path, log: Path, *module: str, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """`python -m MODULE… --http 127.0.0.1:PORT --home HOME` on a free loopback port (e.g.
    `bench.noop_server`, or `loopwarden serve`), output in `log`; yields its base URL and
    stops it afterwards."""
    port = _free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            h.python("-m", *module, "--http", f"127.0.0.1:{port}", "--home", str(home)),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env or h.child_env(),
            cwd=h.REPO,
        )
    try:
        _wait_listening(process, port, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        h.stop_process(process)


@asynccontextmanager
async def connect(
    transport: str, home: Path, logs: Path, synchronous: str = "full"
) -> AsyncIterator[Client]:
    """A client of a loopwarden server with `noop`, over `transport`, as agent `builder`."""
    env = h.child_env(LOOPWARDEN_SYNCHRONOUS=synchronous)
    if transport == "in-memory":
        settings = Settings(home=home, principal=h.AGENT, auth=False, synchronous=synchronous)
        async with Client(build_noop_server(settings)) as client:
            yield client
    elif transport == "stdio":
        params = StdioServerParameters(
            command=h.python()[0],
            args=["-m", "bench.noop_server", "--agent", h.AGENT.id, "--home", str(home)],
            env=env,
            cwd=str(h.REPO),
        )
        with (logs / "stdio.log").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                yield client
    elif transport == "HTTP":
        token = h.run_child(
            h.python(
                *("-m", "loopwarden", "token", "create", "--agent", h.AGENT.id),
                *("--json", "--home", str(home)),
            ),
            timeout=STARTUP_TIMEOUT,
        )
        bearer = json.loads(token.stdout)["token"]
        async with http_server(home, logs / "http.log", "bench.noop_server", env=env) as base:
            headers = {"Authorization": f"Bearer {bearer}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
                Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
            ):
                yield client
    else:
        raise ValueError(transport)


async def measure(
    transport: str, synchronous: str, cfg: Config, seconds: float
) -> dict[str, h.Latency]:
    with h.temp_home(f"transport-{transport.lower()}") as home:
        async with h.open_store(home) as store:
            await h.open_bench_loop(store, todos=cfg.calls // cfg.rounds + 10)
        logs = home.parent
        deadline = h.Deadline(seconds)
        with anyio.fail_after(seconds + 2 * STARTUP_TIMEOUT):
            async with connect(transport, home, logs, synchronous) as client:
                samples = await drive(client, cfg, deadline)
    return {op: h.Latency.of(values) for op, values in samples.items()}


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    section = Section(
        family=NAME,
        number=1,
        title="Transport floor vs governance",
        how=(
            "one client calls one loopwarden server sequentially; the server also carries a "
            "bench-only `noop` tool (`bench/noop_server.py`: same SDK path, strict arguments, a "
            f"pydantic result, no governance). The calls take turns in {cfg.rounds} rounds of "
            f"{cfg.calls // cfg.rounds} after {cfg.warmup} warm-ups each; ratios are to the "
            "no-op on the same transport."
        ),
        notes=[
            "`claim` takes a new todo each call (turns left open), `update` closes those turns "
            "(outcome progress, two tools, usage, one evidence item), `turn` is claim + update: "
            "two calls, so its floor is 2× the no-op. `quota` only reads; `claim` and `update` "
            "each seal one receipt.",
            "server defaults: SQLite WAL with synchronous=full (every receipt on disk before "
            "the answer); the `synchronous=normal` tables are the same servers started with "
            "`LOOPWARDEN_SYNCHRONOUS=normal`. In-memory is `mcp.Client(server)` in one process; "
            "stdio and HTTP are a server subprocess (HTTP on a loopback port, bearer token "
            "from `loopwarden token create`).",
        ],
    )
    results: dict[str, dict[str, h.Latency]] = {}
    started = time.monotonic()
    for n, (transport, synchronous) in enumerate(RUNS):
        title = transport if synchronous == "full" else f"{transport}, synchronous={synchronous}"
        h.progress(NAME, title)
        left = budget - (time.monotonic() - started)
        setup = sum(SETUP_SECONDS[t] for t, _ in RUNS[n:])
        seconds = max((left - setup) / (len(RUNS) - n), 1.0)
        results[title] = await measure(transport, synchronous, cfg, seconds)
    for title, lat in results.items():
        floor = lat["noop"]
        rows = []
        for op in OPS:
            x = lat[op]
            rows.append(
                [
                    op if op != "turn" else "turn (claim + update)",
                    str(x.count),
                    h.rate(x.rate),
                    h.ms(x.p50),
                    h.ms(x.p99),
                    h.ratio(x.p50 / floor.p50),
                    h.ratio(x.mean / floor.mean),
                ]
            )
        section.tables.append(
            Table(
                ["call", "n", "calls/s", "p50 ms", "p99 ms", "× no-op (p50)", "× no-op (mean)"],
                rows,
                title=title,
            )
        )
    for transport, synchronous in RUNS[1:]:
        title = transport if synchronous == "full" else f"{transport}, synchronous={synchronous}"
        lat, goal = results[title], UPDATE_TARGET[synchronous]
        at_p50 = lat["update"].p50 / lat["noop"].p50
        on_mean = lat["update"].mean / lat["noop"].mean
        met = at_p50 <= goal and on_mean <= goal  # both, so noise cannot pass
        section.targets.append(
            Target(
                f"governed update ≤ {goal}× no-op ({transport}, synchronous={synchronous})",
                f"{at_p50:.2f}× at p50 ({h.ms(lat['update'].p50)} vs {h.ms(lat['noop'].p50)} "
                f"ms), {on_mean:.2f}× on the mean",
                met,
                "" if met else _gap(results, title),
            )
        )
    return section


def _gap(results: dict[str, dict[str, h.Latency]], transport: str) -> str:
    lat = results[transport]
    inmem = results["in-memory"]
    governance = inmem["update"].p50 - inmem["noop"].p50
    extra = lat["update"].p50 - lat["noop"].p50
    carried = extra - governance
    text = (
        f"update costs {h.ms(extra)} ms more than the no-op here; {h.ms(governance)} ms of that "
        "is there in-memory too (the governance work: checks, seal, fsync'd commit)"
    )
    if carried > 0:
        text += (
            f", the other {h.ms(carried)} ms is this transport carrying update's larger "
            "arguments and result"
        )
    return text
