"""loopwarden's model gateway in a world: the host's model calls go to `loopwarden serve --http`
on loopback, which decides and charges each one and forwards it to the scenario's fake model API
(the upstream only loopwarden knows, with a key only loopwarden holds).

The price table is the world's own (`model-prices.toml`, replacing the shipped one): input free,
output at $1 per million tokens, at most 1,000 output tokens a call. The fake reports as output
the request's own limit up to those 1,000 (`Script.output_cap`), so each call costs exactly what
the gateway reserved for it, whatever the host asks: a budget of $0.0025 holds two calls of a
host that asks for 1,000 tokens or more, and the third is refused.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .fake import FAKE_KEY
from .world import AGENT, LOOP, Failed, World

OUTPUT_CAP = 1000
PRICES = """replace = true
as_of = "2026-12-01"
source = "the real-host check: output at $1 per million tokens, input free"

[default]
input = 0.0
output = 1.0
cache_write = 0.0
cache_read = 0.0
max_output = 1000
"""
PROVIDER = {"claude-code": "anthropic", "gemini": "gemini", "codex": "openai"}
STARTUP_SECONDS = 30


def _cli(world: World, *argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["loopwarden", *argv], input=stdin, capture_output=True, text=True, timeout=120,
        env=world.env(), cwd=world.project,
    )  # fmt: skip
    if done.returncode != 0:
        raise Failed(
            f"loopwarden {' '.join(argv[:3])} exited {done.returncode}: {done.stderr[-300:]}"
        )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gateway(world: World, upstream: str, host: str) -> Iterator[tuple[str, str]]:
    """The gateway serving the world's loop in front of `upstream`: (the host's model API
    URL, its gateway token). Stopped however the block ends."""
    home = world.loopwarden_home
    (home / "model-prices.toml").write_text(PRICES)
    for provider in PROVIDER.values():
        _cli(world, "model", "key", "set", provider, stdin=FAKE_KEY + "\n")
    token = json.loads(_cli(world, "model", "token", "--agent", AGENT, "--loop", LOOP, "--json"))
    port = _free_port()
    upstreams = [f"--model-upstream={p}={upstream}" for p in PROVIDER.values()]
    log = world.logs / "gateway.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["loopwarden", "serve", "--http", f"127.0.0.1:{port}", *upstreams],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            env=world.env(), cwd=world.project, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                raise Failed(f"the gateway exited {process.returncode}: {log.read_text()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise Failed("the gateway did not listen within 30 s") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/model/{PROVIDER[host]}", str(token["token"])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def model_requests(log: Path) -> list[dict[str, object]]:
    """The model calls the fake upstream answered (its request log)."""
    calls = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        path = str(entry.get("path", "")).lower()
        if (
            entry.get("method") == "POST"
            and any(p in path for p in ("/v1/messages", "/v1/responses", "generatecontent"))
            and "count_tokens" not in path
        ):
            calls.append(entry)
    return calls
