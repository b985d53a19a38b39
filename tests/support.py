"""Helpers shared by the test suites (plain functions and constants, no fixtures).

- policies: `make_policy` (BASIC_POLICY with sections overridden);
- real `loopwarden` processes: CLI runs, `serve --http` on a free loopback port, every wait
  bounded and every process stoppable (`stop_server` / `kill_server` in the caller's finalizer);
- MCP clients over streamable HTTP (bearer token, or a bare `initialize` POST), stdio and
  in-process (manual clock);
- what happened, rebuilt from the signed journal: every envelope verified, then grants, fences,
  completions, budget sums, `seq` chains and the Merkle frontier checked against it.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from conftest import BASIC_POLICY
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from loopwarden.clients.agent import AgentClient
from loopwarden.clock import Clock
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.state.events import ReceiptBody
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.reader import JournalRow, Reader
from loopwarden.kernel.store.store import connect
from loopwarden.kinds import KINDS
from loopwarden.policy.budgets import Totals, to_micros
from loopwarden.principals import Principal
from loopwarden.server.app import build_server
from loopwarden.server.settings import Settings

STARTUP_TIMEOUT = 120.0  # a hang guard: a server that exits fails at once (load 8 is slow)
CLI_TIMEOUT = 60.0  # seconds for any one CLI subprocess
EVIDENCE = [{"kind": "test", "summary": "green"}]
# The ten governance tools a server lists, in a fixed order (fuzzing samples from it).
TOOL_NAMES = (
    "quota",
    "claim",
    "update",
    "receipt",
    "projection",
    "heartbeat",
    "todo_add",
    "request_approval",
    "open_loop",
    "decide_approval",
)
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
# What must never reach a client: tracebacks and server-side file paths.
LEAKS = re.compile(r"Traceback|File \"|site-packages|\.py\"|\.py\b|/work/|/tmp/|/home/|/root/")


def scale(default: int, env: str = "LOOPWARDEN_TEST_SCALE") -> int:
    """`default`, multiplied by the float in `env` if set (never below 1)."""
    factor = float(os.environ.get(env, "1") or 1)
    return max(1, round(default * factor))


def bounded(seconds: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Fail an async test that runs longer than `seconds` instead of letting it hang."""

    def wrap(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        async def run(*args: Any, **kwargs: Any) -> Any:
            with anyio.fail_after(seconds):
                return await test(*args, **kwargs)

        return run

    return wrap


def make_policy(**sections: Any) -> dict[str, Any]:
    """A deep copy of BASIC_POLICY with some sections' keys overridden: a dict value updates that
    section (creating it if missing), any other value (e.g. the `agents` list) replaces it."""
    policy = copy.deepcopy(BASIC_POLICY)
    for name, value in sections.items():
        if isinstance(value, dict):
            policy.setdefault(name, {}).update(value)
        else:
            policy[name] = value
    return policy


def codes(result: Any) -> set[str]:
    """The reason codes of a decision-bearing result (claim, update, quota, ...)."""
    return {r.code for r in result.reasons}


# --- processes -------------------------------------------------------------------------------


def cli_env(synchronous: str | None = "normal", **extra: str) -> dict[str, str]:
    """The environment minus anything that could choose a principal or a home for us."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    if synchronous is not None:
        env["LOOPWARDEN_SYNCHRONOUS"] = synchronous
    env.update(extra)
    return env


def loopwarden(*args: str) -> list[str]:
    return [sys.executable, "-m", "loopwarden", *args]


def cli(*args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        loopwarden(*args),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        stdin=subprocess.DEVNULL,
        env=env or cli_env(),
        **popen,
    )


def cli_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`loopwarden ARGS` in this process, answered as `cli` answers (exit code, stdout, stderr):
    for a test's set-up and read-backs, where the command's own process is not what is tested
    (a Python start with the CLI's imports is about a second of CPU on this machine)."""
    result = run_cli_app(*args)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def cli_json(*args: str) -> dict[str, Any]:
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def cli_open_loop(
    home: Path, loop_id: str, policy: dict[str, Any], todos: tuple[str, ...] = (), *store: str
) -> None:
    """`loopwarden loop open` (in this process): `policy` written beside the home, one `--todo`
    per title, `store` (e.g. `--store URL`) passed on."""
    path = home.parent / f"policy-{loop_id}.json"
    path.write_text(json.dumps(policy))
    todo_args = [arg for title in todos for arg in ("--todo", title)]
    done = cli_here(
        *("loop", "open", "--policy", str(path), "--objective", "o", "--id", loop_id),
        *todo_args,
        *("--home", str(home), *store),
    )
    assert done.returncode == 0, done.stderr


def one_line(text: str) -> str:
    """rich wraps stderr at the terminal width; compare messages with the wrapping undone."""
    return " ".join(text.split())


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    home: Path
    log: Path

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def spawn_server(
    home: Path,
    logs: Path,
    *args: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> tuple[Served, int]:
    """Start `loopwarden serve --http HOST:PORT --home HOME ARGS` without waiting for it.

    `command` replaces `loopwarden serve` (e.g. a wrapper that changes the log level); an IPv6
    `host` is bracketed in the bind address and URL; `port` (default: a free one) is for a
    caller that must name the URL first. The caller must `stop_server` or `kill_server` it in
    a finalizer. Returns (served, port).
    """
    port = port or free_port(host)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"serve-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*(command or loopwarden("serve")), "--http", bind, "--home", str(home), *args],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env or cli_env(),
        )
    return Served(process, f"http://{bind}/mcp", home, log), port


def wait_listening(served: Served, port: int, host: str = "127.0.0.1") -> Served:
    """Block until the spawned server accepts connections (bounded by STARTUP_TIMEOUT)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if served.process.poll() is not None:
            raise AssertionError(
                f"serve exited with {served.process.returncode}:\n{served.stderr()}"
            )
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return served
        except OSError:
            if time.monotonic() > deadline:
                kill_server(served)
                raise AssertionError(f"serve did not listen within {STARTUP_TIMEOUT}s") from None
            time.sleep(0.02)


def start_server(
    home: Path,
    logs: Path,
    *args: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> Served:
    """`spawn_server`, then wait (bounded) until it accepts connections."""
    served, port = spawn_server(home, logs, *args, env=env, command=command, host=host, port=port)
    return wait_listening(served, port, host)


def start_oauth_server(root: Path, issuer_url: str) -> tuple[Served, str]:
    """`start_server` on a fresh home under `root` that trusts the OAuth issuer at
    `issuer_url`; the server and its resource URL (the tokens' audience)."""
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    served = start_server(
        root / "home", root / "logs", "--oauth-issuer", issuer_url, "--resource", resource,
        port=port,
    )  # fmt: skip
    return served, resource


def stop_server(served: Served) -> None:
    """SIGTERM (graceful), then SIGKILL if it does not exit within 10 s."""
    if served.process.poll() is not None:
        return
    served.process.terminate()
    try:
        served.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        kill_server(served)


@contextmanager
def running(root: Path, *args: str) -> Iterator[Served]:
    """`start_server` on ROOT/home (logs in ROOT/logs), stopped however the block ends."""
    served = start_server(root / "home", root / "logs", *args)
    try:
        yield served
    finally:
        stop_server(served)


def dashboard_url(served: Served) -> str:
    """The dashboard of a `serve --http` server: the same origin as its `/mcp`."""
    return served.url.removesuffix("/mcp")


def kill_server(served: Served) -> None:
    """SIGKILL: no cleanup, no flush, no shutdown handler — a crash."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGKILL)
    served.process.wait(timeout=10)


@dataclass(frozen=True)
class Token:
    token: str
    token_id: str
    agent: str
    role: str


def mint_tokens(
    home: Path, specs: list[tuple[str, str]], store: str | None = None, expires: str | None = None
) -> dict[str, Token]:
    """`loopwarden token create --agent NAME --role ROLE --json` for each (name, role), run
    in-process through the CLI app (the same command, without an interpreter start each), in
    the store `store` names (default: the home's), each living `expires` (default: for ever)."""
    from typer.testing import CliRunner

    from loopwarden.cli.root import app

    runner = CliRunner()
    minted = {}
    for agent, role in specs:
        result = off_loop(
            runner.invoke,
            app,
            [
                *("token", "create", "--agent", agent, "--role", role, "--json"),
                *("--home", str(home)),
                *(("--store", store) if store else ()),
                *(("--expires", expires) if expires else ()),
            ],
        )
        assert result.exit_code == 0, result.output
        issued = json.loads(result.stdout)
        minted[agent] = Token(issued["token"], issued["token_id"], issued["agent"], issued["role"])
    return minted


def run_cli_app(*args: str) -> Any:
    """`loopwarden ARGS` in-process (typer's runner); returns the click `Result`."""
    from typer.testing import CliRunner

    from loopwarden.cli.root import app

    return off_loop(CliRunner().invoke, app, list(args))


def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a thread of its own: the CLI runs its own event loop (`anyio.run`), which
    refuses to start on a thread where one is running (a test's, or an async module fixture's
    that the anyio plugin keeps going; with `sniffio` installed anyio sees it there too)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


# --- MCP clients -----------------------------------------------------------------------------


@asynccontextmanager
async def connect_http(
    url: str, token: str | None = None, *, read_timeout: float = 60
) -> AsyncIterator[AgentClient]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=read_timeout)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield AgentClient(client)


def initialize_request(client_name: str, request_id: int = 1) -> dict[str, Any]:
    """A JSON-RPC MCP `initialize` request (protocol 2025-11-25) from a client so named."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": client_name, "version": "0"},
        },
    }


async def raw_initialize(url: str, client_name: str, **headers: str) -> httpx2.Response:
    """A bare POST of an MCP initialize request to `url` (no SDK client in the way), with
    `headers` added to the MCP ones; every httpx timeout 10 s."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10)) as http:
        return await http.post(
            url, json=initialize_request(client_name), headers={**MCP_HEADERS, **headers}
        )


def stdio_params(agent: str, home: Path, synchronous: str = "normal") -> StdioServerParameters:
    """`loopwarden serve --agent AGENT --home HOME` over stdio, as a desktop client launches it."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "loopwarden", "serve", "--agent", agent, "--home", str(home)],
        env={"LOOPWARDEN_SYNCHRONOUS": synchronous},
    )


@asynccontextmanager
async def serving(home: Path, clock: Clock, principal: Principal) -> AsyncIterator[AgentClient]:
    """A fresh in-process server for `principal` on `home` (manual clock), and its client."""
    server = build_server(
        Settings(home=home, principal=principal, auth=False, synchronous="normal"), clock=clock
    )
    async with Client(server) as client:
        yield AgentClient(client)


def text_of(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def strings_in(value: Any) -> Iterator[str]:
    """Every string (keys included) inside a JSON-like value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)


def assert_no_leak(text: str, *, echoes: Any = None, paths: tuple[Path | str, ...] = ()) -> None:
    """No traceback or server path in `text`. Echoes of the caller's own input (`echoes`, any
    JSON-like value) are removed first: repeating what was sent is not a leak."""
    scrubbed = text
    for s in sorted(set(strings_in(echoes)), key=len, reverse=True):
        for form in (s, repr(s)[1:-1], json.dumps(s)[1:-1]):
            if form:
                scrubbed = scrubbed.replace(form, "")
    assert not LEAKS.search(scrubbed), f"internals leaked to the client: {text[:2000]!r}"
    for path in (*paths, Path.home()):
        assert str(path) not in scrubbed, f"a server path leaked: {text[:2000]!r}"


# --- the journal, rebuilt --------------------------------------------------------------------


@contextmanager
def open_db(home: Path, *, readonly: bool = True) -> Iterator[Reader]:
    """One snapshot of `home`'s database. Writable mode lets SQLite recover a crashed WAL
    exactly as the next server would; nothing else is written."""
    conn = connect(home / DB_NAME, readonly=readonly)
    try:
        conn.execute("BEGIN")
        yield Reader(conn)
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


@dataclass(frozen=True)
class Entry:
    row: JournalRow
    body: ReceiptBody


def loop_entries(reader: Reader, home: Path, loop_id: str) -> list[Entry]:
    """The loop's receipts in `seq` order, each signature verified under the home's keys."""
    keyring = KeyStore(home).keyring()
    entries = []
    for row in reader.loop_journal(loop_id):
        opened = open_envelope(row.envelope, keyring)
        assert opened.verified, (row.receipt_id, opened.problems)
        entries.append(Entry(row, KINDS.parse_body(opened.body)))
    return entries


@dataclass
class Replay:
    """What the receipts say happened to one loop."""

    claims: Counter[str] = field(default_factory=Counter)  # todo → grants
    completed: Counter[str] = field(default_factory=Counter)  # todo → accepted completions
    reports: Counter[str] = field(default_factory=Counter)  # turn → turn.reported receipts
    max_open: int = 0  # most turns open at once
    expired: int = 0
    charged: Totals = field(default_factory=Totals)
    kinds: Counter[str] = field(default_factory=Counter)


class CallCharges:
    """The tool calls each turn is charged, replayed apart from the server's rules: a turn's
    listed counts and the calls its host saw (per tool, admitted or ran, whichever hook saw
    more) each bound its calls from below; a report on an open turn claims what the turn was
    charged before plus its usage, on a closed one (after an expiry or a loop's close) its
    usage is the whole turn's; an expiry or a close charges the observed calls beyond what was
    charged; nothing is charged twice."""

    def __init__(self) -> None:
        self.before: Counter[str] = Counter()  # turn → tool calls charged so far
        self.closed: set[str] = set()
        self.seen: dict[tuple[str, str], list[int]] = {}  # (turn, tool) → [admitted, ran]

    def hook(self, kind: str, turn_id: str | None, data: dict[str, Any]) -> int:
        """A hook's receipt: counted on its turn; a call observed outside any turn charges 1."""
        if turn_id is None:
            return 1 if kind == "tool.observed" and data.get("charged") else 0
        if kind in ("tool.admitted", "tool.observed"):
            seen = self.seen.setdefault((turn_id, data["tool"]), [0, 0])
            seen[kind == "tool.observed"] += 1
        return 0

    def observed(self, turn_id: str) -> int:
        return sum(max(seen) for (turn, _), seen in self.seen.items() if turn == turn_id)

    def report(self, data: dict[str, Any]) -> int:
        """What a charged report adds, checking what its receipt records against it."""
        turn, before = data["turn_id"], self.before[data["turn_id"]]
        if data.get("tool_calls_before") is not None:
            assert data["tool_calls_before"] == before, f"{turn}: charged before misstated"
        usage = data.get("usage", {}).get("tool_calls", 0)
        listed = sum(t.get("count", 1) for t in data.get("tools_used", []))
        claimed = usage + (0 if turn in self.closed else before)
        due = max(claimed, listed, self.observed(turn), before) - before
        recorded = data.get("tool_calls_charged", due)
        assert recorded == due, f"{turn}: charged {recorded} tool calls, expected {due}"
        self.before[turn] += due
        return due

    def close(self, turn_id: str, charged: int | None = None) -> int:
        """The turn closes by an expiry or a loop's close, charging `charged` calls (None in
        receipts before charges were recorded: nothing)."""
        due = max(0, self.observed(turn_id) - self.before[turn_id]) if charged is not None else 0
        assert (charged or 0) == due, f"{turn_id}: closing charged {charged}, expected {due}"
        self.closed.add(turn_id)
        self.before[turn_id] += due
        return due


def _charge(report: dict[str, Any], calls: CallCharges) -> Totals:
    """What a report charges, computed apart from the server."""
    usage = report.get("usage", {})
    return Totals(
        model_calls=usage.get("model_calls", 0),
        input_tokens=usage.get("input_tokens", 0),
        output_tokens=usage.get("output_tokens", 0),
        tool_calls=calls.report(report),
        cost_micros=to_micros(usage.get("cost_usd", 0.0)),
        wall_micros=to_micros(usage.get("wall_seconds", 0.0)),
    )


def replay_grants(entries: list[Entry], *, chain: bool = True) -> Replay:
    """Replay the loop's grants and closures, asserting the lease invariants on the way:

    - (with `chain`) `seq` runs 1..n without a gap and each `prev` is the previous digest;
    - a todo is never granted while an earlier turn on it is still open (one live lease);
    - each todo's fences strictly increase with every grant;
    - a turn is closed at most once, and only a granted, open turn is closed;
    - budget charges are summed from `turn.reported` and charged `turn.refused` usage.
    """
    out = Replay()
    calls = CallCharges()
    open_turn: dict[str, str] = {}  # todo → open turn
    turn_todo: dict[str, str] = {}
    fence: dict[str, int] = defaultdict(int)
    prev = None
    for seq, entry in enumerate(entries, start=1):
        body, data = entry.body, entry.body.data.model_dump(mode="json")
        if chain:
            assert body.seq == entry.row.seq == seq, f"seq gap at {seq}: {body.seq}"
            assert body.prev == prev, f"prev chain broken at seq {seq}"
        prev = entry.row.digest
        out.kinds[body.kind] += 1

        def close(turn_id: str, todo_id: str) -> None:
            assert turn_todo.get(turn_id) == todo_id, f"closing unknown turn {turn_id}"
            assert open_turn.get(todo_id) == turn_id, f"turn {turn_id} closed twice or not open"
            del open_turn[todo_id]

        if body.kind == "turn.claimed":
            todo = data["todo_id"]
            assert todo not in open_turn, (
                f"seq {seq}: todo {todo} granted to {data['turn_id']} while "
                f"{open_turn[todo]} still holds a live lease"
            )
            assert data["fence"] > fence[todo], f"seq {seq}: fence of {todo} did not increase"
            fence[todo] = data["fence"]
            open_turn[todo] = data["turn_id"]
            turn_todo[data["turn_id"]] = todo
            out.claims[todo] += 1
            out.max_open = max(out.max_open, len(open_turn))
        elif body.kind == "turn.reported":
            close(data["turn_id"], data["todo_id"])
            out.reports[data["turn_id"]] += 1
            out.charged = out.charged.plus(_charge(data, calls))
            if data["outcome"] == "completed":
                out.completed[data["todo_id"]] += 1
        elif body.kind == "turn.refused":
            if data["charged"]:
                out.charged = out.charged.plus(_charge(data, calls))
            if data["closes_turn"]:
                close(data["turn_id"], data["todo_id"])
        elif body.kind == "lease.expired":
            close(data["turn_id"], data["todo_id"])
            due = calls.close(data["turn_id"], data.get("tool_calls_charged"))
            out.charged = out.charged.plus(Totals(tool_calls=due))
            out.expired += 1
        elif body.kind in ("loop.stopped", "loop.completed", "loop.cancelled"):
            for closed in data.get("closed_turns", ()):
                close(closed["turn_id"], closed["todo_id"])
                due = calls.close(closed["turn_id"], closed.get("tool_calls_charged"))
                out.charged = out.charged.plus(Totals(tool_calls=due))
    return out


def assert_totals_match(stored: Totals, replayed: Replay) -> None:
    """Every stored budget counter equals the sum over the receipts; turns = grants."""
    expected = replayed.charged.as_dict() | {"turns": replayed.kinds["turn.claimed"]}
    assert stored.as_dict() == expected, (stored.as_dict(), expected)


def merkle_problems(reader: Reader) -> list[str]:
    """Disagreements between the journal, the stored Merkle frontier and the stored nodes."""
    problems = []
    size, frontier = reader.log_state()
    leaves, expected_index = [], 0
    for row in reader.iter_journal():
        if row.leaf_index != expected_index:
            problems.append(f"leaf {expected_index} missing (next is {row.leaf_index})")
            expected_index = row.leaf_index
        leaves.append(merkle.leaf_hash(row.envelope))
        expected_index += 1
    if size != len(leaves):
        problems.append(f"log size {size} != {len(leaves)} journal rows")
    try:
        if merkle.frontier_at(size, reader.node) != frontier:
            problems.append("stored frontier != frontier rebuilt from the stored nodes")
    except LookupError as exc:
        problems.append(str(exc))
    if leaves and merkle.root_from_frontier(frontier) != merkle.root_from_leaves(leaves):
        problems.append("root of the stored frontier != root over the journal's envelopes")
    return problems


def db_bytes(home: Path) -> bytes:
    """Every byte SQLite keeps for the home's database (main file, WAL, shared memory)."""
    data = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = home / f"{DB_NAME}{suffix}"
        if path.exists():
            data += path.read_bytes()
    return data


def raw_sql(home: Path, *statements: str) -> None:
    """Damage a store by hand, as an operator with sqlite3 might."""
    conn = sqlite3.connect(home / DB_NAME)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def raw_sql_url(backend: str, store_url: str, *statements: Any) -> None:
    """Run `statements` on a store's database (SQLite or PostgreSQL) outside loopwarden, each
    one committed on its own (a callable is given the connection: an upgrade step written in
    Python, taken back)."""
    if backend == "sqlite":
        conn = sqlite3.connect(store_url, isolation_level=None)
    else:
        from loopwarden.kernel.sql.postgres import connect

        conn = connect(store_url)  # type: ignore[assignment]
    try:
        for statement in statements:
            run_statement(conn, statement)
    finally:
        conn.close()


def run_statement(conn: Any, statement: Any) -> None:
    """A SQL statement, or a function of the connection (an upgrade step written in Python,
    or one taken back), on a DB-API connection."""
    if callable(statement):
        statement(conn)
    else:
        conn.execute(statement)


async def control_loop(store: Any, who: Principal, action: str, request: Any) -> Any:
    """Pause, resume or cancel by action name (the operations are `pause_loop` and so on)."""
    from loopwarden.loops.lifecycle import CONTROLS

    return await CONTROLS[action](store, who, request)


def _envelope_columns() -> str:
    from loopwarden.kernel.sql.schema import JOURNAL

    return ", ".join(c.name for c in JOURNAL.columns if c.holds == "envelope")


ENVELOPE_PARTS = _envelope_columns()
"""The journal columns a receipt's envelope is stored in, from its table description (`kernel/sql/envelopes.py`): select
them in this order and pass the values to `stored_envelope`."""


def stored_envelope(*parts: Any) -> bytes:
    """The envelope a journal row's parts store, as loopwarden reads it back."""
    from loopwarden.kernel.sql.envelopes import unpacked

    return unpacked(*parts)
