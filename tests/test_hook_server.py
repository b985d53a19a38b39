"""The default hook and its home's local hook server (`clients/hook_local.py`,
`server/hook_socket.py`), as real processes on a real socket over a real store.

The first call starts the server and is decided; calls fired together start one server; a
later call reuses it; an idle server exits (a real one on a tiny idle time, waited for with a
bound; the loop itself on an injected clock); a server whose store is gone exits; the hook
fails closed when the server cannot start, does not listen in time, or answers anything but
an answer; and its decisions and receipts are the in-process hook's.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import OPERATOR
from support import cli_env, loopwarden
from test_hooks import imported_by

from loopwarden.clients import hook_local
from loopwarden.clients import hook_wire as wire
from loopwarden.clients.admin import open_reader, open_store
from loopwarden.hosts.hook import HookEvent, hook
from loopwarden.kernel.log.seals import parse_envelope
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.server.hook_socket import HookServer
from loopwarden.turns.claim import ClaimRequest, claim

LOOP = "fast"
AGENT = Principal(id="builder", role="agent")
POLICY = {
    "agents": ["builder"],
    "tools": {"allow": ["fs.*", "shell.run"], "commands": {"deny": ["git push*"]}},
    "budgets": {"max_turns": 10},
    "claims": {"lease_seconds": 3600},
    "observe": {"mode": "enforce"},
}
BOUND = 60.0  # seconds to wait for a process to exit: a bound on a hang, never a measurement


def bash(command: str, n: int = 1) -> bytes:
    return json.dumps(
        {
            "session_id": "s-1",
            "transcript_path": "",
            "cwd": ".",
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command},
            "tool_use_id": f"toolu_{n:04d}",
        }
    ).encode()


async def _prepare(home: Path) -> None:
    """A loop observed in enforce mode, the host attached, the builder's turn open."""
    async with open_store(home) as store:
        request = OpenLoopRequest(
            objective="fast hooks",
            policy=POLICY,
            loop_id=LOOP,
            todos=[TodoInput(id="t", title="w")],
        )
        await open_loop(store, OPERATOR, request)
        observer = Principal(id="builder", role="observer")
        start = HookEvent(loop_id=LOOP, host="claude-code", phase="session", session_id="s-1")
        await hook(store, observer, start)
        assert (await claim(store, AGENT, ClaimRequest(loop_id=LOOP))).granted


def prepared(home: Path) -> Path:
    anyio.run(_prepare, home)
    return home


def place(home: Path) -> wire.Place:
    return wire.Place(str(home.resolve()), None)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie no parent has reaped yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def ended(pid: int) -> bool:
    """Wait (bounded) for `pid` to end; whether it did."""
    deadline = time.monotonic() + BOUND
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def server_pid(home: Path) -> int | None:
    answer = hook_local.ask(place(home), "ping")
    return None if answer is None else int(answer.split()[0])


def starts(home: Path) -> int:
    """How many servers have started listening for `home` (their log lines)."""
    log = Path(place(home).log)
    return log.read_text().count(" listening on ") if log.exists() else 0


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A prepared home whose local hook server, if one was started, is stopped after."""
    path = prepared(tmp_path / "home")
    yield path
    pid = server_pid(path) if path.exists() else None
    if pid is not None:
        hook_local.ask(place(path), "stop")
        if not ended(pid):
            os.kill(pid, 9)


def run_hook(home: Path, raw: bytes, *extra: str, **env: str) -> subprocess.CompletedProcess:
    """`loopwarden hook claude-code …` as the host runs it: the default hook, unless `extra`
    says otherwise."""
    return subprocess.run(
        loopwarden("hook", "claude-code", "--loop", LOOP, "--agent", "builder",
                   "--home", str(home), *extra),
        input=raw, capture_output=True, env=cli_env(**env), timeout=BOUND,
    )  # fmt: skip


def admitted(done: subprocess.CompletedProcess) -> bool:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == b""


def denial(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny", spec
    return str(spec["permissionDecisionReason"])


def journal(home: Path) -> list[dict[str, Any]]:
    """The loop's receipt bodies, in order."""
    with open_reader(home) as reader:
        rows = reader.loop_journal(LOOP)
    bodies = []
    for row in rows:
        envelope = parse_envelope(row.envelope)
        assert envelope is not None
        bodies.append(json.loads(envelope.payload))
    return bodies


def test_the_first_call_starts_the_server_and_is_decided(home):
    assert server_pid(home) is None, "nothing runs before the first hook"
    assert admitted(run_hook(home, bash("ls -la")))
    assert journal(home)[-1]["kind"] == "tool.admitted", "decided and sealed before answering"
    pid = server_pid(home)
    assert pid is not None and alive(pid) and starts(home) == 1
    where = place(home)
    assert stat.S_IMODE(os.stat(where.directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(where.socket).st_mode)
    assert stat.S_IMODE(os.stat(where.socket).st_mode) == 0o600


def test_a_second_call_reuses_the_server(home):
    assert admitted(run_hook(home, bash("ls", 1)))
    first = server_pid(home)
    assert "git push" in denial(run_hook(home, bash("git push origin main", 2)))
    assert server_pid(home) == first and starts(home) == 1
    kinds = [body["kind"] for body in journal(home)]
    assert kinds[-2:] == ["tool.admitted", "tool.refused"]


def test_calls_fired_together_start_one_server(home):
    command = loopwarden("hook", "claude-code", "--loop", LOOP, "--agent", "builder",
                         "--home", str(home))  # fmt: skip
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    hooks = [subprocess.Popen(command, env=cli_env(), **pipes) for _ in range(4)]
    answers = [p.communicate(bash(f"ls {n}", n), timeout=BOUND) for n, p in enumerate(hooks)]
    assert [(p.returncode, out, err) for p, (out, err) in zip(hooks, answers, strict=True)] == [
        (0, b"", b"")
    ] * 4
    assert starts(home) == 1, Path(place(home).log).read_text()
    kinds = [body["kind"] for body in journal(home)]
    assert kinds.count("tool.admitted") == 4


def test_an_idle_server_exits_and_removes_its_socket(home):
    assert admitted(run_hook(home, bash("ls"), LOOPWARDEN_HOOK_IDLE="0.2"))
    pid = server_pid(home)
    assert pid is not None
    assert ended(pid), "the server exits once idle"
    assert not os.path.exists(place(home).socket)
    assert "stopped: idle for 0.2 s" in Path(place(home).log).read_text()
    assert admitted(run_hook(home, bash("ls", 2))), "the next hook starts it again"
    assert starts(home) == 2


def test_a_server_exits_when_its_store_is_gone(home):
    assert admitted(run_hook(home, bash("ls")))
    pid = server_pid(home)
    assert pid is not None
    for leftover in home.glob("loopwarden.db*"):
        leftover.unlink()
    assert ended(pid)
    assert "its home's store is gone" in Path(place(home).log).read_text()


# What the default hook may import beyond what the interpreter (and `-m`'s runpy) loads anyway.
DEFAULT_HOOK = {"loopwarden", "loopwarden.cli", "loopwarden.cli.entry", "loopwarden.hostnames",
                "loopwarden.clients", "loopwarden.clients.hook_local",
                "loopwarden.clients.hook_process", "loopwarden.clients.hook_wire", "_socket",
                "__future__", "importlib"}  # fmt: skip


def test_once_its_server_runs_the_default_hook_imports_only_the_c_socket_module(home):
    assert admitted(run_hook(home, bash("ls")))  # starts the server
    args = ["-m", "loopwarden", "hook", "claude-code", "--loop", LOOP, "--agent", "builder"]
    done, names = imported_by([*args, "--home", str(home)], bash("ls", 2), cli_env())
    assert (done.returncode, done.stdout) == (0, b""), done.stderr[-2000:]
    _, startup = imported_by(["-c", "import runpy"], b"", cli_env())
    assert "loopwarden.clients.hook_wire" in names and "site" in startup, "the traces were read"
    # a home whose socket path would not fit in `sun_path` names its socket by a digest
    digest = {"hashlib", "_hashlib", "_blake2"} if place(home).runtime else set()
    assert names - startup <= DEFAULT_HOOK | digest, names - startup - DEFAULT_HOOK


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_idle_exit_follows_the_servers_clock(home):
    """In process, on an injected clock: served events keep it up, idle time ends it."""
    clock = Clock()
    server = HookServer(place(home), idle=600.0, clock=clock, poll=0.01)
    ran = threading.Thread(target=server.run)
    ran.start()
    try:
        deadline = time.monotonic() + BOUND
        while not os.path.exists(server.place.socket) and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.now = 599.0
        assert hook_local.ask(server.place, "ping") is not None, "an event resets the idle time"
        clock.now = 1100.0
        time.sleep(0.05)  # a few polls: not idle for 600 s since the ping at 599
        assert ran.is_alive()
        clock.now = 1200.0
        ran.join(BOUND)
        assert not ran.is_alive() and server.why == "idle for 600 s"
    finally:
        server.stopping = True
        ran.join(BOUND)
    assert not os.path.exists(server.place.socket)


# --- failing closed ----------------------------------------------------------------------------


def blocked(done: subprocess.CompletedProcess) -> str:
    """Claude Code's blocking failure: exit 2, the reason on stderr."""
    assert done.returncode == 2 and done.stdout == b"", (done.returncode, done.stdout)
    return " ".join(done.stderr.decode().split())


def test_the_hook_blocks_when_the_server_cannot_be_started(home):
    (home / "hooks").write_text("not a directory")  # where the server's socket must go
    reason = blocked(run_hook(home, bash("ls")))
    assert "local hook server is not available" in reason
    assert "hooks/server.log" in reason and "loopwarden hook doctor claude-code" in reason
    assert journal(home)[-1]["kind"] != "tool.admitted"


def test_the_hook_blocks_for_a_home_that_does_not_exist(tmp_path):
    reason = blocked(run_hook(tmp_path / "nowhere", bash("ls")))
    assert "there is no loopwarden home" in reason
    assert not (tmp_path / "nowhere").exists(), "the hook creates no home"


def test_a_home_without_a_store_is_refused_as_in_process_and_its_server_exits(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    fast, slow = run_hook(empty, bash("ls")), run_hook(empty, bash("ls"), "--in-process")
    assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout,
                                                           slow.stderr)  # fmt: skip
    assert "there is no loopwarden database" in blocked(fast)
    log = Path(wire.Place(str(empty.resolve()), None).log)
    deadline = time.monotonic() + BOUND
    while "stopped" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "stopped: its home's store is gone" in log.read_text()


def test_start_fails_closed_for_a_bogus_executable_or_a_server_that_never_listens(home, tmp_path):
    where = place(home)
    assert "cannot be started" in (hook_local.start(where, ["/no/such/python"]) or "")
    exits = hook_local.start(where, [sys.executable, "-c", "raise SystemExit(3)"])
    assert exits == "it exited as it started (exit code 3)"
    pidfile = tmp_path / "pid"
    mute = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    try:
        silent = hook_local.start(where, [sys.executable, "-c", mute, str(pidfile)], bound=1.0)
        assert silent == "it did not listen within 1 s"
    finally:
        deadline = time.monotonic() + BOUND
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(int(pidfile.read_text()), 9)
    assert server_pid(home) is None


def test_the_hook_blocks_on_an_answer_that_is_not_one(home):
    where = place(home)
    where.prepare()
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(where.socket)
    impostor.listen(1)

    def answer_junk() -> None:
        connection, _ = impostor.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n\r\n")

    answering = threading.Thread(target=answer_junk)
    answering.start()
    try:
        reason = blocked(run_hook(home, bash("ls")))
    finally:
        answering.join(BOUND)
        impostor.close()
        os.unlink(where.socket)
    assert "not a loopwarden hook answer" in reason and "hooks/server.log" in reason


# --- the same decisions and receipts as the in-process hook ------------------------------------


VARYING = ("at", "prev", "turn_id", "idempotency_key")


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A receipt body without what differs between two runs of the same events: times, the
    chain's digests, and the ids minted at random."""
    kept = {k: v for k, v in body.items() if k not in VARYING}
    kept["data"] = {k: v for k, v in body["data"].items() if not k.endswith(("_at", "turn_id"))}
    return kept


def test_decisions_and_receipts_are_the_in_process_hooks(home, tmp_path):
    other = prepared(tmp_path / "other")
    events = [bash("ls -la", 1), bash("git push origin main", 2), bash("pytest -q", 3)]
    fast = [run_hook(home, raw) for raw in events]
    slow = [run_hook(other, raw, "--in-process") for raw in events]
    assert [(d.returncode, d.stdout, d.stderr) for d in fast] == [
        (d.returncode, d.stdout, d.stderr) for d in slow
    ]
    assert admitted(fast[0]) and "git push" in denial(fast[1]) and admitted(fast[2])
    ours, theirs = journal(home), journal(other)
    assert [b["kind"] for b in ours][-3:] == ["tool.admitted", "tool.refused", "tool.admitted"]
    assert [comparable(b) for b in ours] == [comparable(b) for b in theirs]
    verified = subprocess.run(
        loopwarden("verify", "--home", str(home)), capture_output=True, env=cli_env(), timeout=BOUND
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
