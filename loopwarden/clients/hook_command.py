"""`loopwarden hook HOST --loop ID --agent NAME`: one host hook event on stdin, the host's
answer on stdout and in the exit code (docs/hooks.md).

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

from loopwarden import hosts
from loopwarden.hosts.host import Reply
from loopwarden.kinds import KINDS

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
        "--server-name",
        action="append",
        default=None,
        help="loopwarden's MCP server name in the host's config (default loopwarden; repeat)",
    )
    return p


def _answer(host: str, raw: bytes, args: argparse.Namespace) -> Reply:
    from loopwarden.clients import admin
    from loopwarden.hosts.handle import failure, handle_now
    from loopwarden.kernel.log.keys import KeyStore
    from loopwarden.kernel.store.homes import synchronous_mode
    from loopwarden.kernel.store.store import Store

    try:
        home, location = admin.existing_store(args.home, args.store)
        keys = KeyStore(home)
        # On the calling thread, with no event loop: on SQLite one connection to the file; on
        # PostgreSQL the backend's write connection, used synchronously.
        store = Store.open_now(
            location,
            keys.load_signer(),
            keyring=keys.keyring(),
            key_dir=home,
            synchronous=synchronous_mode(),
            check=False,  # every row a write reads is proved anyway (kernel/store/guard.py)
            create=False,
            kinds=KINDS,
        )
    except Exception as exc:  # no store, no decision: fail closed, naming why
        message = getattr(exc, "message", None) or f"cannot open the store ({type(exc).__name__})"
        return failure(host, raw, message)
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
