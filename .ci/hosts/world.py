"""A fresh world for one scenario: a scratch HOME, a loopwarden home with the loop opened, a
project that is a git clone of a bare repository on disk (its `origin`), and bounded commands
run in it with a clean environment.

The project's `main` is one commit ahead of the remote, so a push that ran would move the
remote's `main`: `remote_head()` before and after says whether one did.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOP = "ci-hooks"
AGENT = "builder"
COMMAND_SECONDS = 120
SERVE = ("loopwarden", "serve", "--agent", AGENT)  # the server every README client set-up adds


class Failed(Exception):
    """One line saying what failed."""


def policy_text(*, allow: tuple[str, ...] = ("shell.run",), cost: float | None = None) -> str:
    """The scenarios' policy: host evidence enforced, shell allowed, `git push` denied; with a
    `cost` budget, model calls through the gateway allowed and capped at that many dollars."""
    allowed = ", ".join(json.dumps(name) for name in allow)
    model = "" if cost is None else f'max_cost_usd = {cost}\n\n[model]\nallow = ["*"]\n'
    return f"""agents = ["{AGENT}"]

[tools]
allow = [{allowed}]

[tools.commands]
deny = ["git push*"]

[budgets]
max_turns = 10
{model}
[observe]
mode = "enforce"

[stop]
on_violation = "refuse_turn"
"""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@dataclass(frozen=True)
class World:
    root: Path
    clients: Path  # where npm installed the hosts (node_modules/.bin)
    logs: Path  # this scenario's artifacts

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def loopwarden_home(self) -> Path:
        return self.home / ".loopwarden"

    @property
    def home_variable(self) -> str:
        """`LOOPWARDEN_HOME=…`, as the README's client set-ups pass it to the server."""
        return f"LOOPWARDEN_HOME={self.loopwarden_home}"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def remote(self) -> Path:
        return self.root / "remote.git"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Only what the hosts need: the scratch HOME, the hosts and Node 22 first on the PATH,
        this checkout's `loopwarden` next, the one loopwarden home; no proxy, no real key."""
        venv_bin = Path(sys.executable).parent
        path = os.pathsep.join(
            [str(self.clients / "node_modules" / ".bin"), str(venv_bin), "/usr/bin", "/bin"]
        )
        base = {
            "PATH": path,
            "HOME": str(self.home),
            "TMPDIR": str(self.home / "tmp"),
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "LOOPWARDEN_HOME": str(self.loopwarden_home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        return {**base, **(extra or {})}

    def run(self, *argv: str) -> str:
        """Run one command in the project (bounded); its stdout. Fails on a non-zero exit."""
        done = bounded(list(argv), self.project, self.env(), COMMAND_SECONDS)
        if done.returncode != 0:
            raise Failed(f"`{shlex.join(argv)}` exited {done.returncode}: {last_line(done.stderr)}")
        return done.stdout

    def build(self, policy: str) -> None:
        """The scratch HOME, the remote and its clone one commit ahead, and the loop opened."""
        for path in (self.home / "tmp", self.project, self.logs):
            path.mkdir(parents=True, exist_ok=True)
        git = ("git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid")
        self.run("git", "init", "--quiet", "--bare", "--initial-branch=main", str(self.remote))
        self.run("git", "init", "--quiet", "--initial-branch=main")
        self.run("git", "remote", "add", "origin", str(self.remote))
        (self.project / "README.md").write_text("a project the scripted model works on\n")
        self.run("git", "add", "README.md")
        self.run(*git, "commit", "--quiet", "-m", "first")
        self.run("git", "push", "--quiet", "origin", "main")
        (self.project / "NOTES.md").write_text("not pushed yet\n")
        self.run("git", "add", "NOTES.md")
        self.run(*git, "commit", "--quiet", "-m", "second, not on the remote")
        (self.root / "policy.toml").write_text(policy)
        self.run(
            "loopwarden", "loop", "open", "--policy", str(self.root / "policy.toml"),
            "--objective", "a scripted model drives a real host", "--todo", "scripted work",
            "--id", LOOP,
        )  # fmt: skip

    def add_loopwarden(self, host: str, mcp_add: list[str]) -> None:
        """loopwarden in a host, as the README shows: the host's own `mcp add` command for the
        server, then `loopwarden hook install HOST` in the project."""
        self.run(*mcp_add)
        self.run("loopwarden", "hook", "install", host, "--loop", LOOP, "--agent", AGENT)

    def remote_head(self) -> str:
        return self.run("git", "--git-dir", str(self.remote), "rev-parse", "main").strip()

    def receipts(self) -> list[dict[str, Any]]:
        """The loop's receipt bodies, in order (decoded from `loopwarden export`'s bundle)."""
        bundle = self.root / "bundle.json"
        self.run("loopwarden", "export", LOOP, "-o", str(bundle))
        bodies = []
        for row in json.loads(bundle.read_text())["receipts"]:
            envelope = json.loads(row["envelope"])
            bodies.append(json.loads(base64.b64decode(envelope["payload"])))
        return sorted(bodies, key=lambda body: int(body["seq"]))

    def verify(self) -> tuple[int, str]:
        """`loopwarden verify`: its exit code and its findings in one line."""
        done = bounded(
            ["loopwarden", "verify", "--json"], self.project, self.env(), COMMAND_SECONDS
        )
        if done.returncode == 0:
            return 0, "clean"
        try:
            findings = json.loads(done.stdout).get("findings", [])
            text = "; ".join(
                " ".join(str(f.get(k, "")) for k in ("code", "kind", "message") if f.get(k))
                for f in findings[:3]
            )
        except (ValueError, AttributeError):
            text = last_line(done.stdout + done.stderr)
        return done.returncode, text or last_line(done.stdout + done.stderr)


def bounded(
    argv: list[str], cwd: Path, env: dict[str, str], seconds: float, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in a session of its own, at most `seconds`: on time-out the whole group (the
    host and every server and hook it started) is killed and the exit code is -9."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, text=True, start_new_session=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = process.communicate(stdin, timeout=seconds)
        code = process.returncode
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        try:
            out, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process outside the group holds the pipes
            process.kill()
            out, err = "", ""
        code = -9
        err += f"\n(killed after {seconds:.0f} s)"
    finally:
        kill_group(process.pid)  # what the host left running (an MCP server, a hook)
    return subprocess.CompletedProcess(argv, code, out, err)


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
