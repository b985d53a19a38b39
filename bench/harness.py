"""What every benchmark family shares: the bench policy and turn, kernels on temp homes,
latency statistics, bounded loops, subprocess plumbing and the machine description."""

from __future__ import annotations

import itertools
import os
import platform
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.sql.location import Location
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, Synchronous, connect
from loopwarden.kinds import KINDS
from loopwarden.loops import lifecycle as loops_op
from loopwarden.principals import Principal
from loopwarden.turns import claim as claim_op
from loopwarden.turns import update as update_op

REPO = Path(__file__).resolve().parent.parent
OPERATOR = Principal(id="bench-operator", role="operator")
AGENT = Principal(id="builder", role="agent")
LOOP_ID = "bench"

# Generous limits so that no measured call is refused: every claim below is granted and every
# update accepted (the families check the answers). Leases last a day: nothing expires mid-run.
POLICY: dict[str, Any] = {
    "agents": ["*"],
    "tools": {
        "allow": ["fs.read", "fs.write", "tests.run", "git.diff"],
        "deny": ["git.push"],
        "approval": ["deploy.*"],
    },
    "budgets": {
        "max_turns": 10_000_000,
        "max_model_calls": 10**12,
        "max_input_tokens": 10**15,
        "max_output_tokens": 10**15,
        "max_cost_usd": 10**9,
    },
    "claims": {
        "lease_seconds": 86_400,
        "max_active": 10_000,
        "max_active_per_agent": 10_000,
        "max_attempts": 3,
    },
    "stop": {"on_violation": "stop_loop", "repeated_failure_limit": 3},
    "todos": {"agents_may_add": False, "max_todos": 100_000},
}

# One governed turn's self-report: a typical small turn. `progress` hands the todo back, so a
# loop never runs out of work however many turns run, and the receipt count grows while the
# todo count stays fixed (the scale family varies the two independently).
REPORT: dict[str, Any] = {
    "outcome": "progress",
    "tools_used": [{"name": "fs.read", "count": 3}, {"name": "tests.run", "count": 1}],
    "usage": {
        "model_calls": 2,
        "input_tokens": 4_200,
        "output_tokens": 900,
        "tool_calls": 4,
        "cost_usd": 0.0123,
        "wall_seconds": 12.5,
    },
    "evidence": [{"kind": "test", "summary": "14 passed"}],
    "summary": "read the module, ran the tests, all green",
}


def todo_specs(count: int) -> list[dict[str, Any]]:
    return [{"title": f"bench todo {i}", "id": f"t{i}"} for i in range(1, count + 1)]


# --- kernels on temporary homes ---------------------------------------------------------------


@contextmanager
def temp_home(name: str) -> Iterator[Path]:
    """A fresh data home under the system temp dir, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=f"loopwarden-bench-{name}-"))
    try:
        yield root / "home"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def open_store(
    home: Path,
    *,
    synchronous: Synchronous = "full",
    checkpoint_every: int = 256,
    location: Location | None = None,
) -> AsyncIterator[Store]:
    """The home's store (or the one at `location`) and keys, as `Runtime.open` builds them."""
    keys = KeyStore(home)
    store = await Store.open(
        location or home / DB_NAME,
        keys.load_signer(),
        key_dir=home,
        synchronous=synchronous,
        checkpoint_every=checkpoint_every,
        kinds=KINDS,
    )
    try:
        yield store
    finally:
        await store.close()


@contextmanager
def snapshot(home: Path) -> Iterator[Reader]:
    """A read-only connection in one read transaction, as `loopwarden verify` opens it."""
    conn = connect(home / DB_NAME, readonly=True)
    try:
        conn.execute("BEGIN")
        yield Reader(conn)
    finally:
        conn.close()


async def open_bench_loop(store: Store, todos: int, loop_id: str = LOOP_ID) -> str:
    request = loops_op.OpenLoopRequest(
        objective="benchmark loop", policy=POLICY, todos=todo_specs(todos), loop_id=loop_id
    )
    return (await loops_op.open_loop(store, OPERATOR, request)).loop_id


def update_request(turn_id: str, fence: int, key: str) -> update_op.UpdateRequest:
    return update_op.UpdateRequest(turn_id=turn_id, fence=fence, idempotency_key=key, **REPORT)


async def claim(store: Store, who: Principal, loop_id: str) -> claim_op.ClaimResult:
    grant = await claim_op.claim(store, who, claim_op.ClaimRequest(loop_id=loop_id))
    if not grant.granted:
        raise RuntimeError(f"bench claim refused: {[r.code for r in grant.reasons]}")
    return grant


async def report(
    store: Store, who: Principal, grant: claim_op.ClaimResult, key: str
) -> update_op.UpdateResult:
    assert grant.turn_id is not None and grant.fence is not None
    result = await update_op.update(store, who, update_request(grant.turn_id, grant.fence, key))
    if not result.accepted:
        raise RuntimeError(f"bench update refused: {[r.code for r in result.reasons]}")
    return result


_keys = itertools.count()
_KEY_PREFIX = secrets.token_hex(4)


def idempotency_key() -> str:
    """A key unique across the run (and across bench processes sharing a store)."""
    return f"bench-{_KEY_PREFIX}-{next(_keys)}"


async def governed_turn(store: Store, who: Principal, loop_id: str) -> tuple[float, float]:
    """One governed turn (claim + update, two sealed receipts); returns the two latencies."""
    t0 = time.perf_counter()
    grant = await claim(store, who, loop_id)
    t1 = time.perf_counter()
    await report(store, who, grant, idempotency_key())
    return t1 - t0, time.perf_counter() - t1


# --- statistics --------------------------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(samples: list[float]) -> float:
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Latency:
    """Summary of sequential call latencies (seconds)."""

    count: int
    total: float
    p50: float
    p99: float

    @staticmethod
    def of(samples: list[float]) -> Latency:
        if not samples:
            raise ValueError("no samples")
        return Latency(len(samples), sum(samples), percentile(samples, 50), percentile(samples, 99))

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def rate(self) -> float:
        """Calls per second for one sequential caller."""
        return self.count / self.total if self.total else float("inf")


class Deadline:
    """A time budget: loops stop at their count or when the budget runs out, whichever first."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def left(self) -> float:
        return self.end - time.monotonic()

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end


def progress(family: str, message: str) -> None:
    """A progress line on stderr (the summary goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {family}: {message}", file=sys.stderr, flush=True)


# --- formatting --------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def us(seconds: float) -> str:
    value = seconds * 1e6
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def rate(per_second: float) -> str:
    return f"{per_second:,.0f}" if per_second >= 100 else f"{per_second:,.1f}"


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def power(n: int) -> str:
    """10² style for exact powers of ten, else the number."""
    sup = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
    exponent = len(str(n)) - 1
    return f"10{str(exponent).translate(sup)}" if n == 10**exponent and n >= 100 else f"{n:,}"


def mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB"


# --- subprocesses ------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment for bench subprocesses: no inherited LOOPWARDEN_* settings, the repo on
    the path (for `python -m bench.…`), warnings quiet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def run_child(
    args: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env or child_env(),
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[1:4])}… exited {done.returncode}: {done.stderr[-2000:]}"
        )
    return done


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


# --- the machine -------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, cwd=REPO, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def machine() -> dict[str, str]:
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--", "loopwarden"):
        commit += " (with uncommitted changes in loopwarden/)"
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "ram": _ram(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "commit": commit,
    }
