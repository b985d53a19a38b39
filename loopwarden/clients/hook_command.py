"""`loopwarden hook HOST --loop ID --agent NAME --in-process`: one host hook event on stdin, the
host's answer on stdout and in the exit code (docs/hooks.md), decided in this process.

The same code decides for the home's local hook server (`server/hook_socket.py`), which the
default hook (`hook_local.py`) forwards to: `open_store` and `handle_now`, the same answers.

The host starts this process for every tool call the model makes, so it is kept lean: the
`loopwarden` entry point (`entry.py`) comes here before the admin CLI (typer, rich, the MCP
SDK) is imported, and only what a decision needs is loaded. It never creates a home or a
store: an event for a home with no database is refused, fail-closed, like any failure.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from loopwarden import hosts
from loopwarden.hosts.host import Reply
from loopwarden.kinds import KINDS

TYPE_CHECKING = False  # not `typing`'s, as the hook's other modules
if TYPE_CHECKING:
    from loopwarden.kernel.store.store import Store

DESCRIPTION = (
    "Answer one agent-host hook event (stdin) for AGENT in loop LOOP, in HOST's format. "
    "Configure it with `loopwarden hook install`; see docs/hooks.md."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loopwarden hook", description=DESCRIPTION)
    p.add_argument("host", choices=hosts.NAMES, help="the agent host sending the event")
    p.add_argument("--loop", required=True, help="the loop this host session works on")
    p.add_argument("--agent", required=True, help="the agent the host runs (its principal)")
    p.add_argument("--home", default=None, help="the data home (else LOOPWARDEN_HOME)")
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="the store: sqlite:///PATH or postgresql://… (else LOOPWARDEN_STORE, else the "
        "home's file); keys come from the home",
    )
    p.add_argument(
        "--server",
        default=None,
        help="forward the event to this loopwarden serve --http (LOOPWARDEN_OBSERVER_TOKEN)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="decide in this process, opening the store itself (no local hook server)",
    )
    p.add_argument(
        "--server-name",
        action="append",
        default=None,
        help="loopwarden's MCP server name in the host's config (default loopwarden; repeat)",
    )
    return p


def open_store(home: str | Path | None, store: str | None) -> Store:
    """The store a hook decides on, opened on the calling thread (`Store.open_now`): never
    created; raises (`NotFound`, a store error) if it cannot be opened, with the message a
    hook answers (`store_failure`)."""
    from loopwarden.clients import admin
    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.store.homes import synchronous_mode
    from loopwarden.kernel.store.store import Store

    path, location = admin.existing_store(home, store)
    keys = KeyStore(path)
    # On the calling thread, with no event loop: on SQLite one connection to the file; on
    # PostgreSQL the backend's write connection, used synchronously.
    return Store.open_now(
        location,
        keys.load_signer(),
        keyring=keys.keyring(),
        key_dir=path,
        synchronous=synchronous_mode(),
        check=False,  # every row a write reads is proved anyway (kernel/store/guard.py)
        create=False,
        kinds=KINDS,
    )


def store_failure(exc: BaseException) -> str:
    """What a hook answers when its store does not open: no store, no decision."""
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else f"cannot open the store ({type(exc).__name__})"


def _answer(host: str, raw: bytes, args: argparse.Namespace) -> Reply:
    from loopwarden.hosts.handle import failure, handle_now

    try:
        store = open_store(args.home, args.store)
    except Exception as exc:  # no store, no decision: fail closed, naming why
        return failure(host, raw, store_failure(exc))
    try:
        servers = args.server_name or ["loopwarden"]
        return handle_now(store, host, raw, loop_id=args.loop, agent=args.agent, servers=servers)
    finally:
        store.close_now()


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    raw = sys.stdin.buffer.read()
    # stderr is the reason channel (the host shows it to the model): failures are told there,
    # once, by the reply; nothing else (a log record, a warning) may write to it.
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        reply = _answer(args.host, raw, args)
    finally:
        sys.stderr = stderr
    if reply.stdout:
        sys.stdout.write(reply.stdout + "\n")
    if reply.stderr:
        sys.stderr.write(reply.stderr)
    sys.stdout.flush()
    return reply.exit_code
