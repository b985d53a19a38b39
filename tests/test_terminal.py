"""What the operator's terminal shows when agents (or whoever wrote the database) put control
characters in text: each CLI command runs under a pseudo-terminal, its output goes through a
VT terminal emulator (pyte), and the tests assert on the screen the operator would read.

Agent-supplied text (approval summaries, todo titles, objectives, reasons, principals) used to
reach the terminal with ESC, OSC, C1 and bidi controls intact: a summary could move the cursor
back over the approvals table and show a `deploy.prod` request as `deploy.staging`. Every human
renderer now shows those characters as escapes (`\\x1b`, `\\u202e`); `--json` stays exact.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import sqlite3
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pyte
from conftest import BASIC_POLICY, BUILDER, OPERATOR
from support import ENVELOPE_PARTS, cli_env, loopwarden, stored_envelope

from loopwarden.approvals.approval_ops import ApprovalRequest, request_approval
from loopwarden.clients.admin import open_store
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.turns.claim import ClaimRequest, claim

COLUMNS, LINES = 200, 60
RUN_FOR = 120.0  # a hang guard: seconds any one command may take under the pseudo-terminal
# Text an agent controls, each kind of control a terminal acts on:
TITLE = "fix \x1b]0;pwned\x07 the \x9b2J build \u202egnp.exe\u202c done"
OBJECTIVE = "ship \x1b[2J\x1b[H it"


def _interruptible() -> None:
    """In the child: Ctrl-C interrupts, as at a person's terminal. A pytest-xdist worker ignores
    SIGINT, and a Python started with it ignored never installs its KeyboardInterrupt handler, so
    `--follow` would run until the hang guard killed it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def terminal(args: list[str], until: Callable[[str], bool] | None = None) -> pyte.Screen:
    """Run `loopwarden ARGS` on a pseudo-terminal COLUMNS x LINES and feed what it wrote to a
    terminal emulator. With `until`, stop the command once the screen text satisfies it (for
    `--follow`); every run is bounded by RUN_FOR."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    env = cli_env(TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(LINES))
    process = subprocess.Popen(
        loopwarden(*args), stdin=follower, stdout=follower, stderr=follower, env=env,
        preexec_fn=_interruptible,
    )  # fmt: skip
    os.close(follower)
    screen = pyte.Screen(COLUMNS, LINES)
    stream = pyte.ByteStream(screen)
    deadline = time.monotonic() + RUN_FOR
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not data:
                break
            stream.feed(data)
            if until is not None and until("\n".join(screen.display)):
                break
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT if until else signal.SIGKILL)
        _drain_until_exit(process, leader, time.monotonic() + RUN_FOR)
        os.close(leader)
    return screen


def _drain_until_exit(process: subprocess.Popen[bytes], leader: int, deadline: float) -> None:
    """Wait for the command to exit, reading (and dropping) what it still writes, so it is never
    blocked on a full terminal while it shuts down; killed if it outlives `deadline`."""
    while process.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            with contextlib.suppress(OSError):  # EIO: the terminal closed with the command
                os.read(leader, 65536)
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def shown(screen: pyte.Screen) -> str:
    return "\n".join(line.rstrip() for line in screen.display)


def row_of(screen: pyte.Screen, needle: str) -> str:
    rows = [line for line in screen.display if needle in line]
    assert len(rows) == 1, f"{needle!r} is on {len(rows)} rows:\n{shown(screen)}"
    return rows[0].rstrip()


async def _world(home: Path, summary: str) -> dict[str, Any]:
    """A loop whose objective and todo title are hostile, and one pending deploy.prod
    approval whose summary is `summary`."""
    async with open_store(home) as store:
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective=OBJECTIVE,
                policy=BASIC_POLICY,
                todos=[TodoInput(id="t1", title=TITLE)],
                loop_id="L1",
            ),
        )
        grant = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
        assert grant.turn_id and grant.fence
        asked = await request_approval(
            store,
            BUILDER,
            ApprovalRequest(
                turn_id=grant.turn_id, fence=grant.fence, tool="deploy.prod", summary=summary
            ),
        )
    return {"approval": asked.approval_id, "receipt": asked.receipt_id}


def hostile_home(tmp_path: Path, summary: str) -> tuple[Path, dict[str, Any]]:
    home = tmp_path / "home"
    return home, anyio.run(_world, home, summary)


def test_a_summary_cannot_make_the_approvals_table_show_deploy_prod_as_deploy_staging(tmp_path):
    # Where the tool column starts on the operator's screen (found from a harmless run).
    probe_home, _ = hostile_home(tmp_path / "probe", "harmless")
    header = row_of(terminal(["approvals", "--home", str(probe_home)]), "requested by")
    column = header.index("tool") + 1  # CHA is 1-based
    spoof = f"\x1b[{column}Gdeploy.staging  pending  builder  (approve me)\x1b[K"
    home, made = hostile_home(tmp_path / "attack", spoof)
    screen = terminal(["approvals", "--home", str(home)])
    row = row_of(screen, made["approval"])
    assert row[column - 1 :].startswith("deploy.prod"), f"the tool column was spoofed:\n{row}"
    assert "deploy.staging" in row.split(f"\\x1b[{column}G", 1)[1], row  # shown, as text
    assert "\\x1b[K" in row
    listed = subprocess.run(
        loopwarden("approvals", "--json", "--home", str(home)),
        capture_output=True, text=True, timeout=RUN_FOR, env=cli_env(),
    )  # fmt: skip
    assert json.loads(listed.stdout)["approvals"][0]["summary"] == spoof  # JSON stays exact


def test_loop_show_shows_titles_and_objectives_with_their_controls_escaped(tmp_path):
    home, _ = hostile_home(tmp_path, "plain summary")
    screen = terminal(["loop", "show", "L1", "--home", str(home)])
    text = shown(screen)
    assert text.splitlines()[0].startswith("L1  active"), "the screen was cleared or moved"
    assert "objective: ship \\x1b[2J\\x1b[H it" in text
    assert "fix \\x1b]0;pwned\\x07 the \\x9b2J build \\u202egnp.exe\\u202c done" in text
    assert screen.title != "pwned", "an OSC sequence set the terminal's title"


def test_the_receipt_view_shows_c1_and_bidi_controls_escaped(tmp_path):
    home, made = hostile_home(tmp_path, "deploy \x9b2J\x9bH now \u202egnp.exe")
    screen = terminal(["receipt", made["receipt"], "--home", str(home)])
    text = shown(screen)
    assert text.splitlines()[0].startswith(made["receipt"]), "the screen was cleared or moved"
    assert '"summary": "deploy \\u009b2J\\u009bH now \\u202egnp.exe"' in text


def _forge_principal(home: Path, seq: int, name: str) -> None:
    """Rewrite receipt `seq` of L1 as someone who can write the database but not sign would:
    a principal of their choosing (the signature no longer holds)."""
    conn = sqlite3.connect(home / DB_NAME)
    try:
        parts = conn.execute(
            f"SELECT {ENVELOPE_PARTS} FROM journal WHERE loop_id = 'L1' AND seq = ?", (seq,)
        ).fetchone()
        envelope = json.loads(stored_envelope(*parts))
        body = json.loads(base64.b64decode(envelope["payload"]))
        body["principal"]["id"] = name
        envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
        conn.execute(
            "UPDATE journal SET envelope = ? WHERE loop_id = 'L1' AND seq = ?",
            (json.dumps(envelope).encode(), seq),
        )
        conn.commit()
    finally:
        conn.close()


def test_receipts_follow_shows_a_forged_principal_escaped_and_flagged(tmp_path):
    home, _ = hostile_home(tmp_path, "plain summary")
    _forge_principal(home, 2, "builder\x1b[1A\x1b[2K\x1b[32mall good")
    screen = terminal(
        ["receipts", "L1", "--follow", "--home", str(home)],
        until=lambda text: "approval.requested" in text,
    )
    row = row_of(screen, "turn.claimed")
    # The principal column is 12 wide: the forged name shows escaped, cut, and its row is BAD.
    assert "builder\\x1b" in row and " BAD " in f"{row} ", row
    assert "loop.opened" in row_of(screen, "loop.opened"), "the row above was erased"


def test_an_error_quoting_outside_text_shows_its_controls_escaped(tmp_path):
    name = "evil\x1b[2J\u202elmot.toml"
    screen = terminal(["policy", "check", str(tmp_path / name)])
    text = shown(screen)
    assert text.startswith("error: cannot read policy file"), text
    assert "evil\\x1b[2J\\u202elmot.toml" in text.replace("\n", "")
