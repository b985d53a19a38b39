"""The OAuth client check: Claude Code against an OAuth-protected `serve --http`, as far as a
real CLI goes without a browser.

Runs after `check_clients.py` (which installs the pinned clients): the loopback issuer of
`tests/issuer.py` and a `loopwarden serve --http --oauth-config FILE` trusting it; then
`claude mcp add --transport http` and `claude mcp list` in a scratch HOME. Claude Code gets the
401, follows its `WWW-Authenticate` to the protected resource metadata, fetches the issuer's
metadata from it, and reports "Needs authentication": the next step is the user's browser
sign-in, which a CI run cannot do. The check asserts each of those steps. Every wait is
bounded; both servers listen on loopback and are stopped at the end.
Exit 0 if it passed, 1 otherwise. Usage: python .ci/check_oauth_client.py [--clients-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from issuer import Issuer  # noqa: E402
from support import free_port, start_server, stop_server  # noqa: E402

COMMAND_SECONDS = 120


def claude(clients: Path, root: Path, *args: str) -> str:
    home = root / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{clients / 'node_modules' / '.bin'}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "TMPDIR": str(root),
        "NO_COLOR": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = subprocess.run(
        ["claude", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"oauth client check FAILED: claude {' '.join(args)} exited {done.returncode}"
        )
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients-dir", type=Path, default=Path(tempfile.gettempdir()) / "loopwarden-clients"
    )
    args = parser.parse_args()
    if not (args.clients_dir / "node_modules" / ".bin" / "claude").exists():
        print(
            "oauth client check FAILED: no Claude Code (run check_clients.py first)",
            file=sys.stderr,
        )
        return 1
    root = Path(tempfile.mkdtemp(prefix="loopwarden-oauth-client-"))
    issuer = Issuer().start()
    port = free_port()
    config = root / "oauth.toml"
    config.write_text(
        f'[oauth]\nissuer = "{issuer.url}"\nresource = "http://127.0.0.1:{port}/mcp"\n'
    )
    served = start_server(root / "srv", root / "logs", "--oauth-config", str(config), port=port)
    try:
        claude(
            args.clients_dir, root, "mcp", "add", "--transport", "http", "loopwarden", served.url
        )
        listed = claude(args.clients_dir, root, "mcp", "list")
    finally:
        stop_server(served)
        issuer.stop()
        shutil.rmtree(root, ignore_errors=True)
    line = next((x for x in listed.splitlines() if "loopwarden" in x), "(no loopwarden line)")
    found = (
        issuer.seen["/.well-known/oauth-authorization-server"]
        + issuer.seen["/.well-known/openid-configuration"]
    )
    if "Needs authentication" not in line or found == 0:
        print(
            f"oauth client check FAILED: {line.strip()}; issuer metadata fetched {found}x",
            file=sys.stderr,
        )
        return 1
    print(
        "ok  Claude Code (HTTP, OAuth): 401 → protected resource metadata → the issuer's metadata "
        f"({found} fetch(es)); it stops at '{line.split('- ')[-1].strip()}', before the browser sign-in"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
