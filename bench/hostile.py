"""`python -m bench.hostile [--quick]`: what the hostile clients of issue 12 can do to a real
`loopwarden serve --http` on loopback, with the server's default limits. Prints the figures
that docs/reliability.md quotes; runs against any checkout (it uses only `serve`'s defaults).

1. session flood: one agent token sends bare `initialize`s; how many sessions it gets, the
   server's resident memory, and whether another token still initializes;
2. half-open hold: connections that send part of a request head and then nothing, with the
   server under the usual soft limit of 1,024 descriptors; whether a legitimate `initialize`
   is answered, and the server's open descriptors then and after the head timeout;
3. outsider flood: an agent not admitted to a loop calls `claim` on it for a while; how many
   receipts and bytes that adds to the loop's journal.

Every loop is bounded in count and time; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "b", "version": "0"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
USUAL_LIMIT = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, "
    "resource.getrlimit(resource.RLIMIT_NOFILE)[1])); sys.argv = ['loopwarden', *sys.argv[1:]]; "
    "runpy.run_module('loopwarden', run_name='__main__')"
)
POLICY = {
    "agents": ["builder"],
    "tools": {"allow": ["fs.read"]},
    "budgets": {"max_turns": 100},
}


def cli(home: Path, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "loopwarden", *args, "--home", str(home), "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", USUAL_LIMIT, "serve", "--http", f"127.0.0.1:{port}", "--home", str(home)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("serve did not start")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def initialize(url: str, token: str, timeout: float = 10) -> tuple[int | str, float]:
    started = time.monotonic()
    try:
        with httpx2.Client(timeout=timeout) as http:
            status: int | str = http.post(
                url, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"}
            ).status_code
    except httpx2.HTTPError as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


def session_flood(home: Path, attempts: int, seconds: float) -> None:
    flooder = cli(home, "token", "create", "--agent", "flooder")["token"]
    other = cli(home, "token", "create", "--agent", "other")["token"]
    process, url = serve(home)
    try:
        before = rss_mib(process.pid)
        counts: dict[Any, int] = {}
        started = time.monotonic()
        with httpx2.Client(timeout=10) as http:
            for _ in range(attempts):
                if time.monotonic() - started > seconds:
                    break
                head = {**HEADERS, "Authorization": f"Bearer {flooder}"}
                status = http.post(url, json=INIT, headers=head).status_code
                counts[status] = counts.get(status, 0) + 1
        elapsed = time.monotonic() - started
        status, latency = initialize(url, other)
        print(
            f"session flood: {sum(counts.values())} initializes by one token in {elapsed:.1f}s -> "
            f"{counts}; server RSS {before:.0f} -> {rss_mib(process.pid):.0f} MiB; another "
            f"token's initialize: {status} in {latency * 1000:.0f} ms"
        )
    finally:
        process.terminate()
        process.wait(timeout=10)


def half_open(home: Path, count: int) -> None:
    token = cli(home, "token", "create", "--agent", "legit")["token"]
    process, url = serve(home)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    held = []
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 512)), hard))
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(sock)
        time.sleep(1)
        status, latency = initialize(url, token)
        fds = descriptors(process.pid)
        time.sleep(12)  # past the default 10 s head timeout
        print(
            f"half-open hold: {count} connections held; a legitimate initialize: {status} in "
            f"{latency * 1000:.0f} ms; server descriptors {fds}, {descriptors(process.pid)} "
            f"after 12 s; RSS {rss_mib(process.pid):.0f} MiB"
        )
    finally:
        for sock in held:
            sock.close()
        process.terminate()
        process.wait(timeout=10)


def outsider_flood(home: Path, seconds: float, limit: int) -> None:
    home.parent.mkdir(parents=True, exist_ok=True)
    policy = home.parent / "policy.json"
    policy.write_text(json.dumps(POLICY))
    cli(
        home,
        "loop",
        "open",
        "--policy",
        str(policy),
        "--objective",
        "o",
        "--todo",
        "a",
        "--id",
        "L1",
    )
    outsider = cli(home, "token", "create", "--agent", "mallory")["token"]
    process, url = serve(home)
    try:
        with httpx2.Client(timeout=10) as http:
            head = {**HEADERS, "Authorization": f"Bearer {outsider}"}
            session = http.post(url, json=INIT, headers=head).headers["mcp-session-id"]
            head |= {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
            http.post(
                url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=head
            )
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "claim", "arguments": {"loop_id": "L1"}},
            }
            calls, started = 0, time.monotonic()
            while calls < limit and time.monotonic() - started < seconds:
                http.post(url, json=call, headers=head)
                calls += 1
            elapsed = time.monotonic() - started
    finally:
        process.terminate()
        process.wait(timeout=10)
    conn = sqlite3.connect(home / "loopwarden.db")
    rows, size = conn.execute(
        "SELECT count(*), coalesce(sum(length(envelope) + coalesce(length(payload), 0) "
        "+ coalesce(length(key_id), 0) + coalesce(length(signature), 0)), 0) FROM journal "
        "WHERE loop_id = 'L1' AND seq > 1"
    ).fetchone()
    conn.close()
    print(
        f"outsider flood: {calls} claims in {elapsed:.1f}s added {rows} receipt(s), {size} bytes "
        "of stored envelopes, to the loop's journal"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile")
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    quick = parser.parse_args().quick
    with tempfile.TemporaryDirectory() as root:
        session_flood(Path(root) / "a" / "home", 500 if quick else 3_000, 30 if quick else 90)
        half_open(Path(root) / "b" / "home", 1_100)
        outsider_flood(Path(root) / "c" / "home", 5 if quick else 10, 20_000)


if __name__ == "__main__":
    main()
