"""The client check: the client set-ups of the README and docs/clients.md, run as written,
against real client CLIs.

The README's quickstart and docs/clients.md (`DOCUMENTS`, in that order) mark every client
set-up with `<!-- client-check: NAME -->` just above its ```sh block (`NAME background` for a
command a user runs in a terminal of its own); this script runs those blocks verbatim and **in
the order of the README and then of docs/clients.md, in one bash session, one project folder
and one scratch HOME**, as one reader following the quickstart and then the clients page top
to bottom would (so a block that only works in a fresh folder, or a step the pages leave out,
fails here). It
installs the clients from npm into a scratch directory (with Node 22 from
`node-<os>-<arch>@22`: the MCP Inspector's CLI needs Node >= 22), with this checkout's
`loopwarden` on the PATH, and then checks what each block showed:

- stdio: Claude Code and Gemini CLI `mcp list` show loopwarden Connected; Codex CLI accepts
  `mcp add` (its `mcp list` only lists, it does not connect, so the check reads back the
  server Codex would launch); the MCP Inspector's `tools/list --strict` passes and its
  `quota` call finds the loop the README opened (the agents share the CLI's home);
- HTTP: docs/clients.md's `serve --http` on loopback, a bearer token, Claude Code Connected (in
  the folder where the stdio set-up was made), and the Inspector's `--strict` and
  `projection` calls through the bearer header;
- hooks: each host still starts, with loopwarden's hooks in its settings;
- tool errors: the Inspector (which validates every result against the tool's output schema)
  shows loopwarden's own error text for a missing loop and an operator-only tool.

Then every runner in `EXTRA_SCENARIOS` runs with the same clients (the seam for scenarios of
other modules under .ci/): first the Inspector's CLI listing and calling a downstream tool
through loopwarden's MCP gateway (`inspector_gateway`). Every wait is bounded; servers listen on loopback only and are
stopped at the end. Exit 0 if every check passed, 1 otherwise: one line says what failed (an
unreachable registry too).
Usage: python .ci/check_clients.py [--clients-dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The pages whose marked blocks run, read in this order as one text: the README's quickstart
# first (its first block opens the loop every later block uses), then every other client set-up.
DOCUMENTS = ("README.md", "docs/clients.md")
PACKAGES = {  # pinned: a client upgrade is a deliberate change to this list
    "@anthropic-ai/claude-code": "2.1.332",
    "@google/gemini-cli": "0.61.0",
    "@openai/codex": "0.171.0",
    "@modelcontextprotocol/inspector": "2.12.0",
}
NODE_MAJOR = "22"
# The README's Inspector command: pinned, or npx resolves whatever it likes (0.15.0 on Node 20).
INSPECTOR = (
    "npx",
    f"@modelcontextprotocol/inspector@{PACKAGES['@modelcontextprotocol/inspector']}",
    "--cli",
)
QUIET = ("--loglevel=error", "--prefer-offline")
INSTALL_SECONDS = 900
REGISTRY_SECONDS = 60
SCENARIO_SECONDS = 900  # every marked block, every client
STARTUP_SECONDS = 30
LOCK_SECONDS = 900
MARKER = re.compile(
    r"<!-- client-check: ([a-z0-9-]+)( background)? -->\n```sh\n(.*?)\n```", re.DOTALL
)
BIND = re.compile(r"--http (127\.0\.0\.1|localhost):(\d+)")
WAIT_PORT = """
wait_port() {  # HOST PORT SECONDS: until something listens there, at most SECONDS
  local deadline=$((SECONDS + $3))
  until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
    if (( SECONDS >= deadline )); then echo "nothing listens on $1:$2 after $3 s" >&2; return 1; fi
    sleep 0.2
  done
}
"""


class CheckFailed(Exception):
    """One line saying what failed."""


@dataclass(frozen=True)
class Block:
    name: str
    text: str
    background: bool = False


def readme_blocks(text: str) -> dict[str, Block]:
    """The marked client set-up blocks of `text` by name, in its order (each name once)."""
    blocks: dict[str, Block] = {}
    for match in MARKER.finditer(text):
        name = match.group(1)
        if name in blocks:
            raise CheckFailed(
                f"client-check block {name!r} appears twice in {', '.join(DOCUMENTS)}"
            )
        blocks[name] = Block(name, match.group(3), background=bool(match.group(2)))
    return blocks


def documents_text(root: Path = REPO) -> str:
    """The `DOCUMENTS` under `root`, one after the other, as one reader reads them."""
    return "\n".join((root / name).read_text() for name in DOCUMENTS)


def document_blocks(root: Path = REPO) -> dict[str, Block]:
    """Every marked client set-up block of the `DOCUMENTS`, in their order."""
    return readme_blocks(documents_text(root))


@dataclass(frozen=True)
class Run:
    """A finished scenario: where its logs are, and how to run one more client command."""

    home: Path
    project: Path
    logs: Path
    env: dict[str, str]

    def log(self, step: str) -> str:
        return (self.logs / f"{step}.log").read_text(errors="replace")

    def command(self, *args: str) -> str:
        done = subprocess.run(
            args, cwd=self.project, env=self.env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise CheckFailed(f"`{shlex.join(args)}` exited {done.returncode}: {last(done.stderr)}")
        return done.stdout


def last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def npm_error(stderr: str) -> str:
    """npm's reason in one line: its fetch error if any, else its first error line."""
    lines = [line.removeprefix("npm error").strip() for line in stderr.splitlines()]
    fetch = [line for line in lines if line.startswith("FetchError")]
    return (fetch or [line for line in lines if line] or ["(no output)"])[0]


def connected(step: str, client: str) -> Callable[[Run], str]:
    """The step's `mcp list` shows a loopwarden line that says Connected."""

    def check(run: Run) -> str:
        lines = [line for line in run.log(step).splitlines() if "loopwarden" in line]
        if not any("Connected" in line for line in lines):
            shown = lines[-1] if lines else last(run.log(step))
            raise CheckFailed(f"{client}: loopwarden is not Connected ({shown.strip()})")
        return f"{client}: {next(line for line in lines if 'Connected' in line).strip()}"

    return check


def contains(step: str, needle: str, what: str) -> Callable[[Run], str]:
    def check(run: Run) -> str:
        if needle not in run.log(step):
            raise CheckFailed(f"{what}: {needle!r} not in its output ({last(run.log(step))})")
        return f"{what}: ok"

    return check


def no_warnings(step: str, what: str) -> Callable[[Run], str]:
    """The Inspector's `--strict` passes with no warning (each is a schema a client may reject)."""

    def check(run: Run) -> str:
        warned = [line for line in run.log(step).splitlines() if line.startswith("Warning:")]
        if warned:
            raise CheckFailed(f"{what}: {len(warned)} warnings, the first {warned[0]!r}")
        return f"{what}: no warnings"

    return check


def codex_config(run: Run) -> str:
    """`codex mcp list` does not connect: read back the server Codex would launch."""
    shown = json.loads(run.command("codex", "mcp", "get", "loopwarden", "--json"))
    transport = shown.get("transport", {})
    launch = [transport.get("command"), *transport.get("args", [])]
    home = transport.get("env", {}).get("LOOPWARDEN_HOME")
    if launch != ["loopwarden", "serve", "--agent", "builder"] or home != run.env["EXPECT_HOME"]:
        raise CheckFailed(f"codex: mcp add stored {launch} with LOOPWARDEN_HOME={home}")
    if "loopwarden" not in run.log("codex"):
        raise CheckFailed("codex: mcp list does not list loopwarden")
    return f"codex: added ({shlex.join(launch)}); its mcp list does not connect, so the connection is not checked"


def hooks_accepted(step: str, settings: str, client: str) -> Callable[[Run], str]:
    """After `hook install`, the host still starts with its settings and lists loopwarden,
    and the settings hold loopwarden's hook for every event it installed."""

    def check(run: Run) -> str:
        written = json.loads((run.project / settings).read_text())
        commands = json.dumps(written.get("hooks", {}))
        if "hook" not in commands or "--loop csv-export --agent builder" not in commands:
            raise CheckFailed(f"{client}: {settings} has no loopwarden hook after hook install")
        text = run.log(step)
        if "loopwarden" not in text:
            raise CheckFailed(f"{client}: with the hooks installed: {last(text)}")
        if client != "Codex CLI" and "Connected" not in text:
            raise CheckFailed(f"{client}: not Connected with the hooks installed: {last(text)}")
        return f"{client}: starts with loopwarden's hooks installed ({settings})"

    return check


def tool_error(tool: str, args: tuple[str, ...], expected: str) -> Callable[[Run], str]:
    """The Inspector's CLI calls `tool` as the README's stdio agent and shows loopwarden's own
    error: the text `expected`, the code in `_meta`, no structured content for it to hold
    against the output schema (it used to print `data must have required property ...`)."""

    def check(run: Run) -> str:
        what = f"MCP Inspector (stdio, {tool} error)"
        home = f"LOOPWARDEN_HOME={run.env['EXPECT_HOME']}"
        argv = [*INSPECTOR, "-e", home, "loopwarden", "serve", "--agent", "builder"]
        argv += ["--method", "tools/call", "--tool-name", tool]
        for arg in args:
            argv += ["--tool-arg", arg]
        done = subprocess.run(
            argv, cwd=run.project, env=run.env, capture_output=True, text=True, timeout=120
        )
        try:
            shown = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise CheckFailed(f"{what}: no result ({last(done.stderr + done.stdout)})") from None
        text = " ".join(c.get("text", "") for c in shown.get("content", []))
        code = shown.get("_meta", {}).get("loopwarden/error", {}).get("code")
        if not (shown.get("isError") and text.startswith(expected)) or "structuredContent" in shown:
            raise CheckFailed(f"{what}: showed {last(done.stdout)}")
        return f"{what}: {text} (code {code})"

    return check


# What each README block must have shown, by block name; blocks not named here (the token, the
# background server) are checked by the blocks that use them.
CHECKS: dict[str, tuple[Callable[[Run], str], ...]] = {
    "home": (contains("home", "opened loop csv-export", "loopwarden loop open"),),
    "claude-stdio": (connected("claude-stdio", "Claude Code (stdio)"),),
    "gemini": (connected("gemini", "Gemini CLI (stdio)"),),
    "codex": (codex_config,),
    "inspector-stdio": (
        contains("inspector-stdio", '"allowed": true', "MCP Inspector (stdio, --strict, quota)"),
        no_warnings("inspector-stdio", "MCP Inspector (stdio, tools/list --strict)"),
        tool_error("quota", ("loop_id=nope",), "not_found: no loop with id 'nope'"),
        tool_error("open_loop", ("objective=x", "policy={}"), "forbidden: open_loop is an"),
    ),
    "claude-http": (connected("claude-http", "Claude Code (HTTP, bearer header)"),),
    "inspector-http": (
        contains(
            "inspector-http",
            '"loop_id": "csv-export"',
            "MCP Inspector (HTTP, bearer header, --strict, projection)",
        ),
        no_warnings("inspector-http", "MCP Inspector (HTTP, tools/list --strict)"),
    ),
    "hooks-claude": (hooks_accepted("hooks-claude", ".claude/settings.json", "Claude Code"),),
    "hooks-gemini": (hooks_accepted("hooks-gemini", ".gemini/settings.json", "Gemini CLI"),),
    "hooks-codex": (hooks_accepted("hooks-codex", ".codex/hooks.json", "Codex CLI"),),
}


@dataclass(frozen=True)
class Context:
    """What an extra scenario gets: the installed clients (their `node_modules`), a scratch
    root of its own, and the finished README run (its HOME, folder and environment)."""

    clients: Path
    root: Path
    readme: Run


Runner = Callable[[Context], list[str]]

GATEWAY_POLICY = """agents = ["builder"]

[tools]
allow = ["mcp.own.echo"]
deny = ["mcp.own.crash"]

[budgets]
max_turns = 10

[observe]
mode = "enforce"
"""


def inspector_gateway(ctx: Context) -> list[str]:
    """The MCP Inspector's CLI through loopwarden's MCP gateway (docs/mcp-gateway.md) over
    stdio, in front of the project's own downstream server (`bench/downstream_server.py`,
    stdio, pinned): `tools/list` shows the allowed downstream tool namespaced (`own__echo`)
    and not the denied one; after a `claim`, a `tools/call` of it runs and is sealed admitted
    and observed; `verify` is clean. A home and a loop of its own, not the README's."""
    home = ctx.root / "home"
    (home / "tmp").mkdir(parents=True)
    env = {**environment(ctx.clients, home), "LOOPWARDEN_HOME": str(home / ".loopwarden")}
    (ctx.root / "policy.toml").write_text(GATEWAY_POLICY)
    downstream = {"command": sys.executable, "args": [str(REPO / "bench" / "downstream_server.py")]}
    servers = ctx.root / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"own": downstream}, "gateway": {"loop": "gw"}}))

    def run(*argv: str) -> str:
        try:
            done = subprocess.run(
                argv, cwd=ctx.root, env=env, capture_output=True, text=True, timeout=120
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"MCP gateway: `{' '.join(argv[:4])}` ran over 120 s") from None
        if done.returncode != 0:
            raise CheckFailed(
                f"MCP gateway: `{' '.join(argv[:4])}` exited {done.returncode}: "
                f"{last(done.stderr + done.stdout)}"
            )
        return done.stdout

    def inspector(*method: str) -> dict[str, Any]:
        inspector_bin = str(ctx.clients / "node_modules" / ".bin" / "mcp-inspector")
        out = run(
            inspector_bin, "--cli", "-e", f"LOOPWARDEN_HOME={env['LOOPWARDEN_HOME']}",
            "loopwarden", "serve", "--agent", "builder", "--gateway", str(servers), *method,
        )  # fmt: skip
        try:
            answer: dict[str, Any] = json.loads(out)
        except json.JSONDecodeError:
            raise CheckFailed(f"MCP gateway: the Inspector showed {last(out)}") from None
        return answer

    run("loopwarden", "loop", "open", "--policy", str(ctx.root / "policy.toml"),
        "--objective", "the Inspector through the gateway", "--todo", "echo", "--id", "gw")  # fmt: skip
    run("loopwarden", "gateway", "pin", str(servers))
    listed = {str(t.get("name")) for t in inspector("--method", "tools/list").get("tools", [])}
    if "own__echo" not in listed or "own__crash" in listed or "claim" not in listed:
        raise CheckFailed(f"MCP gateway: the Inspector listed {sorted(listed)}")
    claimed = inspector(
        "--method", "tools/call", "--tool-name", "claim", "--tool-arg", "loop_id=gw"
    )
    if claimed.get("isError") or '"granted":true' not in json.dumps(claimed).replace(" ", ""):
        raise CheckFailed(f"MCP gateway: claim through the gateway answered {str(claimed)[:200]}")
    text = "echoed-through-the-gateway"
    called = inspector(
        "--method", "tools/call", "--tool-name", "own__echo", "--tool-arg", f"text={text}"
    )
    if called.get("isError") or text not in json.dumps(called.get("content")):
        raise CheckFailed(f"MCP gateway: own__echo answered {str(called)[:200]}")
    bundle = ctx.root / "bundle.json"
    run("loopwarden", "export", "gw", "-o", str(bundle))
    kinds = []
    for row in json.loads(bundle.read_text())["receipts"]:
        body = json.loads(base64.b64decode(json.loads(row["envelope"])["payload"]))
        if body["data"].get("tool") == "mcp.own.echo" and body["data"].get("host") == "mcp-gateway":
            kinds.append(body["kind"])
    if kinds != ["tool.admitted", "tool.observed"]:
        raise CheckFailed(f"MCP gateway: the echo was sealed as {kinds}")
    run("loopwarden", "verify")
    return [
        "MCP Inspector (stdio) through the MCP gateway: own__echo listed, own__crash (denied) "
        "not; called after a claim, sealed admitted and observed; verify clean"
    ]


# Scenarios beyond the README's, run after it in this order: each returns its `ok` lines or
# raises CheckFailed. Another module under .ci/ adds its runners here, one line each.
EXTRA_SCENARIOS: list[Runner] = [inspector_gateway]


def node_package() -> str:
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    arch = machine.get(platform.machine().lower())
    system = {"linux": "linux", "darwin": "darwin"}.get(sys.platform)
    if arch is None or system is None:
        raise CheckFailed(f"no Node package for {sys.platform}/{platform.machine()}")
    return f"node-{system}-{arch}@{NODE_MAJOR}"


def install(dest: Path) -> None:
    """The pinned clients and Node 22 into `dest` (npm; repeat runs reuse what is there)."""
    npm = shutil.which("npm")
    if npm is None:
        raise CheckFailed("npm is not installed (the client check installs the clients with it)")
    first = next(iter(PACKAGES))
    try:
        reach = subprocess.run(
            [npm, "view", first, "version", "--fetch-retries=0", "--fetch-timeout=30000"],
            capture_output=True,
            text=True,
            timeout=REGISTRY_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise CheckFailed(
            f"the npm registry is unreachable (no answer in {REGISTRY_SECONDS} s)"
        ) from None
    if reach.returncode != 0:
        raise CheckFailed(f"the npm registry is unreachable: {npm_error(reach.stderr)}")
    dest.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}@{version}" for name, version in PACKAGES.items()] + [node_package()]
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(dest), "--no-audit", "--no-fund", *QUIET, *specs],
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"npm install took over {INSTALL_SECONDS} s") from None
    if done.returncode != 0:
        raise CheckFailed(f"npm install failed: {npm_error(done.stderr)}")


def environment(clients: Path, home: Path) -> dict[str, str]:
    """A clean environment: the scratch HOME, the clients and Node 22 first on the PATH, this
    checkout's `loopwarden` next; nothing that could choose a home or a principal for us."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "loopwarden").exists():
        raise CheckFailed(f"run this with the venv's python ({bin_dir} has no loopwarden)")
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM")}
    path = os.pathsep.join([str(clients / "node_modules" / ".bin"), str(bin_dir), keep["PATH"]])
    return {
        **keep,
        "PATH": path,
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "NO_COLOR": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "EXPECT_HOME": str(home / ".loopwarden"),  # what the README's `export` line makes it
    }


def bash_script(blocks: dict[str, Block], steps: tuple[str, ...], logs: Path) -> str:
    lines = ["set -euo pipefail", WAIT_PORT]
    for name in steps:
        if name not in blocks:
            raise CheckFailed(f"no client-check block {name!r} in {', '.join(DOCUMENTS)}")
        block, log = blocks[name], shlex.quote(str(logs / f"{name}.log"))
        lines.append(f"echo '== {name}' >&2")
        if block.background:
            bind = BIND.search(block.text)
            if bind is None:
                raise CheckFailed(f"block {name!r}: a background server binds loopback")
            lines += [
                f"{{\n{block.text}\n}} > {log} 2>&1 &",
                f"wait_port {bind[1]} {bind[2]} {STARTUP_SECONDS}",
            ]
        else:
            lines.append(f"{{\n{block.text}\n}} > {log} 2>&1")
    return "\n".join(lines) + "\n"


def run_readme(blocks: dict[str, Block], clients: Path, root: Path) -> Run:
    """Run every marked block in the pages' order in one bash session, one project folder
    and one scratch HOME, as one reader would; the finished run (its servers stopped)."""
    home, project, logs = root / "home", root / "project", root / "logs"
    for path in (home / "tmp", project, logs):
        path.mkdir(parents=True)
    (project / "node_modules").symlink_to(clients / "node_modules")  # npx finds the Inspector
    run = Run(home, project, logs, environment(clients, home))
    script = bash_script(blocks, tuple(blocks), logs)
    with (logs / "steps.log").open("w") as steps:
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=project,
            env=run.env,
            stdout=steps,
            stderr=steps,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=SCENARIO_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_group(process)
    step = last((logs / "steps.log").read_text()).removeprefix("== ")
    if code is None:
        raise CheckFailed(f"client set-ups: still running after {SCENARIO_SECONDS} s, at {step}")
    if code != 0:
        detail = last((logs / f"{step}.log").read_text()) if (logs / f"{step}.log").exists() else ""
        raise CheckFailed(f"block {step!r} failed (exit {code}): {detail}")
    return run


def check_readme(run: Run) -> list[str]:
    """Every block's checks, in the pages' order (after every block has run)."""
    return [check(run) for checks in CHECKS.values() for check in checks]


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop the scenario's process group (its bash and the servers it started), bounded."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    process.wait(timeout=5)


def check_ports(blocks: dict[str, Block]) -> None:
    for block in blocks.values():
        for host, port in BIND.findall(block.text):
            with socket.socket() as sock:
                try:
                    sock.bind((host, int(port)))
                except OSError:
                    raise CheckFailed(
                        f"port {port} (the README's) is in use on {host}: free it first"
                    ) from None


def locked(path: Path) -> int:
    """One client check at a time on a machine (they share the README's port), bounded."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise CheckFailed(
                    f"another client check held {path} for {LOCK_SECONDS} s"
                ) from None
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients-dir", type=Path, default=Path(tempfile.gettempdir()) / "loopwarden-clients"
    )
    parser.add_argument("--keep", action="store_true", help="Keep the scratch HOME and logs.")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="loopwarden-client-check-"))
    ok = False
    try:
        blocks = document_blocks(args.root)
        fd = locked(Path(tempfile.gettempdir()) / "loopwarden-client-check.lock")
        try:
            install(args.clients_dir)
            check_ports(blocks)
            readme = run_readme(blocks, args.clients_dir, root / "readme")
            for line in check_readme(readme):
                print(f"ok  {line}", flush=True)
            for runner in EXTRA_SCENARIOS:
                extra = root / runner.__name__
                extra.mkdir()
                for line in runner(Context(args.clients_dir, extra, readme)):
                    print(f"ok  {line}", flush=True)
            from hosts import check as real_hosts  # the hooks inside the real hosts: .ci/hosts/

            real_hosts.check(args.clients_dir, root, CheckFailed)
        finally:
            os.close(fd)
        ok = True
    except CheckFailed as exc:
        print(f"client check FAILED: {exc}", file=sys.stderr)
    finally:
        if (ok and not args.keep) or not any(root.iterdir()):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"client check: scratch HOME and logs kept in {root}", file=sys.stderr)
    if ok:
        versions = ", ".join(f"{name} {version}" for name, version in PACKAGES.items())
        print(f"client check passed ({versions}; Node {NODE_MAJOR})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
