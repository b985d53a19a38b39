"""Family 13 — the MCP gateway: what governing a downstream call costs.

The project's own downstream server (`bench/downstream_server.py`, an `echo` tool) is called
two ways in one run, interleaved: directly, and through `loopwarden serve --gateway` (the call
decided, sealed before it is forwarded and observed after: two receipts). Over HTTP, the
added latency is the difference of the medians; over stdio, the ratio of end-to-end times of a
session that starts the server and makes a batch of calls. Then 16 clients call through one
HTTP gateway at once for a fixed time: calls per second.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench import harness as h
from bench.report import Section, Table, Target

NAME = "mcp_gateway"
DOWNSTREAM = h.REPO / "bench" / "downstream_server.py"
POLICY = {
    "agents": ["bench-agent"],
    "tools": {"allow": ["mcp.own.*"]},
    "budgets": {"max_turns": 1000},
    "observe": {"mode": "enforce"},
    "claims": {"lease_seconds": 3600},
}
HTTP_GOAL = 0.001  # added p50 over HTTP
STDIO_GOAL = 1.2  # end to end over stdio


@dataclass(frozen=True)
class Config:
    rounds: int  # paired HTTP rounds
    batch: int  # calls per round and way
    stdio_calls: int
    clients: int
    seconds: float  # of the 16-client run


QUICK = Config(rounds=4, batch=25, stdio_calls=60, clients=16, seconds=4)
FULL = Config(rounds=10, batch=60, stdio_calls=200, clients=16, seconds=12)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, process: subprocess.Popen[Any], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"a server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("a server did not listen")


def _thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of process `pid` so far: its main thread (the event loop) and the others
    (a store's writer and readers); zeros where there is no `/proc`."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.exists():
        return 0.0, 0.0
    tick, main, other = os.sysconf("SC_CLK_TCK"), 0.0, 0.0
    for task in tasks.iterdir():
        with contextlib.suppress(OSError):  # a thread that has just ended
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
            if int(task.name) == pid:
                main += seconds
            else:
                other += seconds
    return main, other


@dataclass
class Cpu:
    """CPU a process spent across some batches of calls: main thread, other threads, calls."""

    pid: int
    main: float = 0.0
    other: float = 0.0
    calls: int = 0

    async def timed(self, client: Client, name: str, calls: int) -> list[float]:
        main, other = _thread_cpu(self.pid)
        samples = await _timed(client, name, calls)
        after = _thread_cpu(self.pid)
        self.main += after[0] - main
        self.other += after[1] - other
        self.calls += calls
        return samples


@contextlib.contextmanager
def _process(args: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        process = subprocess.Popen(
            args, env=h.child_env(LOOPWARDEN_SYNCHRONOUS="full"), stdin=subprocess.DEVNULL,
            stdout=sink, stderr=subprocess.STDOUT, cwd=h.REPO,
        )  # fmt: skip
    try:
        _wait_port(port, process)
        yield process
    finally:
        h.stop_process(process)


def _cli(home: Path, *args: str) -> str:
    done = h.run_child(h.python("-m", "loopwarden", *args, "--home", str(home)), timeout=120)
    return done.stdout


def _prepare(home: Path, root: Path, servers: dict[str, Any]) -> tuple[Path, str]:
    """The loop opened, the servers file written and pinned, the agent's token."""
    policy = root / "policy.json"
    policy.write_text(json.dumps(POLICY))
    _cli(home, "loop", "open", "--policy", str(policy), "--objective", "bench", "--id", "gw",
         "--todo", "work")  # fmt: skip
    path = root / "servers.json"
    path.write_text(json.dumps({"mcpServers": servers, "gateway": {"loop": "gw"}}))
    _cli(home, "gateway", "pin", str(path))
    token = json.loads(_cli(home, "token", "create", "--agent", "bench-agent", "--json"))["token"]
    return path, token


@contextlib.asynccontextmanager
async def _http_client(url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def _timed(client: Client, name: str, calls: int) -> list[float]:
    samples = []
    for n in range(calls):
        t0 = time.perf_counter()
        result = await client.call_tool(name, {"text": f"call {n}"})
        samples.append(time.perf_counter() - t0)
        if result.is_error:
            raise RuntimeError(f"{name} failed: {result.content}")
    return samples


async def _stdio_session(
    params: StdioServerParameters, tool: str, calls: int, claim: bool
) -> float:
    """Seconds for one session: start, (claim,) `calls` calls, close."""
    t0 = time.perf_counter()
    async with Client(params) as client:
        if claim:
            await client.call_tool("claim", {"loop_id": "gw"})
        await _timed(client, tool, calls)
    return time.perf_counter() - t0


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    section = Section(
        family=NAME,
        number=13,
        title="MCP gateway",
        how=(
            "the project's own downstream server (`echo`) over streamable HTTP, called "
            f"directly and through `loopwarden serve --http --gateway` ({cfg.rounds} paired "
            f"rounds of {cfg.batch} sequential calls, interleaved; each proxied call decided "
            "and sealed before it is forwarded and observed after: two receipts, SQLite "
            "synchronous=full). Over stdio: a session that starts the server, makes "
            f"{cfg.stdio_calls} calls and ends, directly and through `serve --gateway` (which "
            f"also claims a turn). Then {cfg.clients} HTTP clients through one gateway for "
            f"{cfg.seconds:g} s."
        ),
    )
    with h.temp_home(NAME) as scratch:
        root = scratch.parent / "files"
        root.mkdir(parents=True, exist_ok=True)
        home = root / "home"
        port, gateway_port = _free_port(), _free_port()
        downstream_url = f"http://127.0.0.1:{port}/mcp"
        direct_samples: list[float] = []
        proxied_samples: list[float] = []
        with contextlib.ExitStack() as stack:
            downstream = h.python(str(DOWNSTREAM), "--http", f"127.0.0.1:{port}")
            direct_cpu = Cpu(stack.enter_context(_process(downstream, port, root / "d.log")).pid)
            servers, token = _prepare(home, root, {"own": {"type": "http", "url": downstream_url}})
            gateway = h.python(
                "-m", "loopwarden", "serve", "--http", f"127.0.0.1:{gateway_port}",
                "--home", str(home), "--gateway", str(servers),
            )  # fmt: skip
            gateway_cpu = Cpu(
                stack.enter_context(_process(gateway, gateway_port, root / "g.log")).pid
            )
            gateway_url = f"http://127.0.0.1:{gateway_port}/mcp"
            headers = {"Authorization": f"Bearer {token}", "Loopwarden-Loop": "gw"}
            async with (
                _http_client(downstream_url, {}) as direct,
                _http_client(gateway_url, headers) as proxied,
            ):
                await proxied.call_tool("claim", {"loop_id": "gw"})
                await _timed(direct, "echo", 5)
                await _timed(proxied, "own__echo", 5)
                for n in range(cfg.rounds):
                    if deadline.expired and n > 0:
                        break
                    ways = [
                        (direct, "echo", direct_samples, direct_cpu),
                        (proxied, "own__echo", proxied_samples, gateway_cpu),
                    ]
                    for client, tool, samples, cpu in ways if n % 2 == 0 else ways[::-1]:
                        samples.extend(await cpu.timed(client, tool, cfg.batch))
                    h.progress(NAME, f"HTTP round {n + 1}/{cfg.rounds}")
                throughput = await _many(gateway_url, headers, cfg)
        direct = h.Latency.of(direct_samples)
        proxied = h.Latency.of(proxied_samples)
        added = proxied.p50 - direct.p50
        # stdio, end to end: a fresh home so the HTTP run's receipts do not weigh
        stdio_home = root / "stdio-home"
        stdio_servers, _ = _prepare(
            stdio_home, root, {"own": {"command": sys.executable, "args": [str(DOWNSTREAM)]}}
        )
        env = h.child_env(LOOPWARDEN_SYNCHRONOUS="full")
        direct_params = StdioServerParameters(
            command=sys.executable, args=[str(DOWNSTREAM)], env=env
        )
        gateway_params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "loopwarden", "serve", "--agent", "bench-agent", "--home",
                  str(stdio_home), "--gateway", str(stdio_servers)],
            env=env, cwd=h.REPO,
        )  # fmt: skip
        direct_runs, gateway_runs = [], []
        for n in range(2 if quick else 3):
            if deadline.expired and direct_runs:
                break
            direct_runs.append(await _stdio_session(direct_params, "echo", cfg.stdio_calls, False))
            gateway_runs.append(
                await _stdio_session(gateway_params, "own__echo", cfg.stdio_calls, True)
            )
            h.progress(NAME, f"stdio session {n + 1}")
    stdio_ratio = h.median(gateway_runs) / h.median(direct_runs)
    section.tables.append(
        Table(
            ["way (HTTP)", "calls", "p50 ms", "p99 ms", "calls/s (one caller)"],
            [
                ["direct", str(direct.count), h.ms(direct.p50), h.ms(direct.p99), h.rate(direct.rate)],
                ["through the gateway", str(proxied.count), h.ms(proxied.p50), h.ms(proxied.p99), h.rate(proxied.rate)],
            ],
        )
    )  # fmt: skip
    _cpu_table(section, direct_cpu, gateway_cpu)
    section.tables.append(
        Table(
            ["way (stdio, one session)", "calls", "seconds (median)"],
            [
                ["direct", str(cfg.stdio_calls), f"{h.median(direct_runs):.2f}"],
                ["through the gateway", str(cfg.stdio_calls), f"{h.median(gateway_runs):.2f}"],
            ],
        )
    )
    section.tables.append(
        Table(
            ["clients", "seconds", "calls", "calls/s through one gateway"],
            [[str(cfg.clients), f"{throughput[1]:.1f}", str(throughput[0]), h.rate(throughput[0] / throughput[1])]],
        )
    )  # fmt: skip
    section.targets.append(
        Target(
            f"added latency ≤ {h.ms(HTTP_GOAL)} ms p50 over HTTP",
            f"{h.ms(added)} ms",
            added <= HTTP_GOAL,
            "each proxied call is an MCP server request and an MCP client request in one "
            "Python process, plus a decision and two sealed receipts (the CPU table above); "
            "the event loop's share alone is several times the target",
        )
    )
    section.targets.append(
        Target(
            f"within {STDIO_GOAL}× end to end over stdio",
            h.ratio(stdio_ratio),
            stdio_ratio <= STDIO_GOAL,
            "",
        )
    )
    section.targets.append(
        Target(f"calls/s with {cfg.clients} clients", h.rate(throughput[0] / throughput[1]), None)
    )
    return section


def _cpu_table(section: Section, direct_cpu: Cpu, gateway_cpu: Cpu) -> None:
    """CPU per call of the downstream called directly and of the gateway, from /proc."""
    if gateway_cpu.calls and (gateway_cpu.main or gateway_cpu.other):
        section.tables.append(
            Table(
                ["server process (HTTP)", "calls", "event loop thread ms", "other threads ms", "CPU ms per call"],
                [
                    [label, str(c.calls), h.ms(c.main / c.calls), h.ms(c.other / c.calls), h.ms((c.main + c.other) / c.calls)]
                    for label, c in (("the downstream, called directly", direct_cpu),
                                     ("the gateway (server, client, decision and two receipts)", gateway_cpu))
                ],
                title="CPU per call, from /proc, over the same calls",
            )
        )  # fmt: skip


async def _many(url: str, headers: dict[str, str], cfg: Config) -> tuple[int, float]:
    """Calls completed by `cfg.clients` concurrent clients in `cfg.seconds`, and the seconds."""
    done = 0
    stop = time.monotonic() + cfg.seconds

    async def one(n: int) -> None:
        nonlocal done
        async with _http_client(url, headers) as client:
            while time.monotonic() < stop:
                result = await client.call_tool("own__echo", {"text": f"client {n}"})
                if result.is_error:
                    raise RuntimeError(f"a call failed: {result.content}")
                done += 1

    t0 = time.monotonic()
    async with anyio.create_task_group() as group:
        for n in range(cfg.clients):
            group.start_soon(one, n)
    return done, time.monotonic() - t0
