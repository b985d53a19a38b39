"""The publishing check: a wheel and an sdist built from the committed tree pass `twine check`.

`git archive HEAD` (so nothing uncommitted or ignored slips in) is unpacked into a scratch
directory and built with `python -m build --sdist --wheel` (an isolated build environment,
from the package index); `twine check --strict` must accept both (the README renders as the
PyPI description, the metadata is complete). The README's `mcp-name:` line, which the MCP
Registry's PyPI ownership check reads from that description, must name `server.json`'s server.
Every step is bounded in time. Exit 0 if all passed, 1 otherwise (one line says why).
Usage: python .ci/check_dist.py [--keep]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP_SECONDS = 300


class CheckFailed(Exception):
    pass


def run(*args: str, cwd: Path) -> str:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=STEP_SECONDS)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"`{' '.join(args[:3])}` took over {STEP_SECONDS} s") from None
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines() or ["(no output)"]
        raise CheckFailed(f"`{' '.join(args[:4])}` exited {done.returncode}: {lines[-1]}")
    return done.stdout


def check(root: Path) -> list[str]:
    tree = subprocess.run(
        ["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True
    ).stdout
    source = root / "source"
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        archive.extractall(source, filter="data")
    dist = root / "dist"
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), ".", cwd=source)
    built = sorted(p.name for p in dist.iterdir())
    if (
        len(built) != 2
        or not any(n.endswith(".whl") for n in built)
        or not any(n.endswith(".tar.gz") for n in built)
    ):
        raise CheckFailed(f"expected one wheel and one sdist, built {built}")
    run(
        sys.executable,
        "-m",
        "twine",
        "check",
        "--strict",
        *(str(dist / n) for n in built),
        cwd=root,
    )
    name = json.loads((source / "server.json").read_text())["name"]
    if f"mcp-name: {name}" not in (source / "README.md").read_text():
        raise CheckFailed(f"README.md has no `mcp-name: {name}` line (the MCP Registry's check)")
    return [f"twine check --strict: {n}" for n in built] + [
        f"README names {name} for the MCP Registry"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="Keep the scratch directory.")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="loopwarden-dist-check-"))
    try:
        for line in check(root):
            print(f"ok  {line}", flush=True)
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        print(f"dist check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"dist check: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("dist check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
