"""The release check: a wheel built from a clean clone installs in a fresh venv and runs the demo.

A clone of this repository's committed HEAD (so nothing uncommitted or ignored can slip into
the wheel) is built with `python -m build --wheel`; the wheel must hold every file the package
ships besides its modules (the dashboard's templates and static files, the starter and demo
policies: each file under loopwarden/ that git tracks and that is not Python). Then a fresh
venv installs the wheel alone (its dependencies from the package index, as a user's pip would)
and runs `loopwarden --version` and `loopwarden demo` outside any checkout. Every step is
bounded in time; the scratch directory is removed at the end unless --keep.

Exit 0 if every step passed, 1 otherwise (one line says which step failed and why).
Usage: python .ci/check_wheel.py [--keep] [--no-install]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP_SECONDS = {"clone": 60, "build": 180, "venv": 120, "install": 600, "run": 180}


class CheckFailed(Exception):
    """One line saying which step failed."""


def step(name: str, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run one step, bounded; its stdout, or `CheckFailed` with its last line of output."""
    try:
        done = subprocess.run(
            args,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_SECONDS[name],
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{name}: still running after {STEP_SECONDS[name]} s") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise CheckFailed(f"{name}: exit {done.returncode}: {lines[-1] if lines else ''}")
    return done.stdout


def clean_clone(dest: Path) -> Path:
    """A clone of the repository's committed HEAD (no working-tree changes, nothing ignored)."""
    head = step("clone", ["git", "rev-parse", "HEAD"], REPO).strip()
    step("clone", ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], REPO)
    step("clone", ["git", "checkout", "--quiet", "--detach", head], dest)
    return dest


def build_wheel(clone: Path, python: str = sys.executable) -> Path:
    """`python -m build --wheel` in `clone`: the one wheel it wrote."""
    out = clone / "dist"
    step("build", [python, "-m", "build", "--wheel", "--outdir", str(out)], clone)
    wheels = sorted(out.glob("loopwarden-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"build: expected one wheel in dist/, found {[w.name for w in wheels]}")
    return wheels[0]


def package_data(clone: Path) -> set[str]:
    """Every file under loopwarden/ that git tracks and that is not a Python module."""
    listed = step("clone", ["git", "ls-files", "loopwarden"], clone).split()
    return {name for name in listed if not name.endswith(".py")}


def missing_from(wheel: Path, wanted: set[str]) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return wanted - set(archive.namelist())


def version_of(clone: Path) -> str:
    """`__version__` as the clone's package states it (the one place it is written)."""
    namespace: dict[str, str] = {}
    exec((clone / "loopwarden" / "__init__.py").read_text(), namespace)
    return namespace["__version__"]


def install_and_run(wheel: Path, scratch: Path, version: str) -> str:
    """A fresh venv with the wheel alone installed; runs `--version` and the demo in an empty
    directory (no checkout near it); the demo's last line."""
    venv, work = scratch / "venv", scratch / "elsewhere"
    work.mkdir()
    step("venv", [sys.executable, "-m", "venv", str(venv)], scratch)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    step("install", [*pip, str(wheel)], work)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)}
    shown = step("run", [str(venv / "bin" / "loopwarden"), "--version"], work, env).strip()
    if shown != version:
        raise CheckFailed(
            f"run: loopwarden --version printed {shown!r}, the package says {version}"
        )
    out = step("run", [str(venv / "bin" / "loopwarden"), "demo"], work, env)
    if "all scenarios behaved as governed" not in out:
        raise CheckFailed(f"run: the demo did not pass: {out.strip().splitlines()[-1:]}")
    return out.strip().splitlines()[-1]


def check(scratch: Path, install: bool = True) -> list[str]:
    """Every step in `scratch`; what each one showed."""
    clone = clean_clone(scratch / "clone")
    wheel = build_wheel(clone)
    wanted = package_data(clone)
    missing = missing_from(wheel, wanted)
    if missing:
        raise CheckFailed(f"build: the wheel lacks {sorted(missing)}")
    version = version_of(clone)
    if not wheel.name.startswith(f"loopwarden-{version}-"):
        raise CheckFailed(f"build: the wheel {wheel.name} is not version {version}")
    shown = [f"{wheel.name} holds every package file ({len(wanted)} besides the modules)"]
    if install:
        install_and_run(wheel, scratch, version)
        shown.append(f"a fresh venv installed it; loopwarden {version} ran the demo clean")
    return shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="Keep the scratch directory.")
    parser.add_argument(
        "--no-install", action="store_true", help="Build and inspect the wheel only."
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="loopwarden-wheel-check-"))
    ok = False
    try:
        for line in check(scratch, install=not args.no_install):
            print(f"ok  {line}", flush=True)
        ok = True
    except CheckFailed as exc:
        print(f"wheel check FAILED: {exc}", file=sys.stderr)
    finally:
        if args.keep or not ok:
            print(f"wheel check: scratch kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
