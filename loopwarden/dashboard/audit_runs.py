"""The dashboard's audit: one full audit at a time, in a child process, with its progress.

`Auditor.start` launches `audit_worker` (see there for why a process) and returns at once; the
audit page polls `Auditor.current` for progress and, when it is done, the findings. Starting
while an audit runs returns the running one: a second click never starts a second audit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from loopwarden.clock import Clock
from loopwarden.kernel.sql.location import STORE_ENV, Location

log = logging.getLogger("loopwarden.dashboard")
MAX_LINE = 64 * 1024 * 1024  # a report with many findings is one long JSON line


@dataclass
class AuditRun:
    started_at: datetime
    started_by: str
    done: int = 0
    total: int = 0
    finished_at: datetime | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    findings_shown: list[dict[str, Any]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.finished_at is None

    @property
    def percent(self) -> int:
        if not self.running:
            return 100
        return int(100 * self.done / self.total) if self.total else 0


class Auditor:
    def __init__(self, db: Location, keys_home: Path, clock: Clock) -> None:
        self._argv = [sys.executable, "-m", "loopwarden.dashboard.audit_worker", str(keys_home)]
        self._env = {**os.environ, STORE_ENV: db.url}  # a URL's password stays off `ps`
        self._clock = clock
        self.current: AuditRun | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, who: str) -> AuditRun:
        """Start an audit unless one is running; returns the run either way."""
        if self.current is not None and self.current.running:
            return self.current
        run = AuditRun(started_at=self._clock(), started_by=who)
        self.current = run
        self._task = asyncio.get_running_loop().create_task(self._run(run))
        return run

    async def _run(self, run: AuditRun) -> None:
        try:
            process = await asyncio.create_subprocess_exec(
                *self._argv,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_LINE,
            )
            assert process.stdout is not None
            try:
                async for raw in process.stdout:
                    self._take(run, json.loads(raw))
                await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            if run.report is None and run.error is None:
                run.error = f"the audit process exited with {process.returncode}"
        except (OSError, ValueError) as exc:
            log.error("the dashboard's audit failed: %s", exc)
            run.error = "the audit could not run; see the server log"
        finally:
            run.finished_at = self._clock()

    @staticmethod
    def _take(run: AuditRun, message: dict[str, Any]) -> None:
        if "progress" in message:
            run.done, run.total = message["progress"]
        elif "report" in message:
            run.report = message["report"]
        elif "error" in message:
            run.error = str(message["error"])
