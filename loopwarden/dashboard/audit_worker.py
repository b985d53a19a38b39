"""`python -m loopwarden.dashboard.audit_worker KEYS_HOME`: the full audit, in its own process,
of the store `LOOPWARDEN_STORE` names (the environment, so that a password never shows in `ps`).

The dashboard runs the audit here rather than in the server process, so the audit's CPU work
(signature checks, the fold) never holds the server's interpreter while agents are governed,
and its own worker processes are started from a single-threaded process. It reads a read-only
snapshot of the database, trusts the keys in the home's key directory (as `loopwarden verify`
does), and writes JSON lines on stdout: `{"progress": [done, total]}` as it goes, then
`{"report": ...}` (the fields of `loopwarden verify --json`) or `{"error": message}`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from loopwarden.audit.database import audit_trusting
from loopwarden.errors import LoopwardenError
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.rotations import directory_trust
from loopwarden.kernel.sql.location import STORE_ENV, parse_location
from loopwarden.kernel.store.store import snapshot
from loopwarden.witnesses.witness_audit import check_store


def _say(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.environ.get(STORE_ENV):
        _say({"error": f"usage: {STORE_ENV}=STORE audit_worker KEYS_HOME"})
        return 2
    home = Path(argv[0])
    try:
        with snapshot(parse_location(os.environ[STORE_ENV])) as reader:
            trust = directory_trust(KeyStore(home), reader.key_anchor())
            _say({"progress": [0, reader.journal_count()]})
            report = audit_trusting(
                reader, trust, progress=lambda done, total: _say({"progress": [done, total]})
            )
            check_store(reader, None, report)  # a witness's conflict fails it here too
    except LoopwardenError as exc:
        _say({"error": exc.message})
        return 1
    _say({"report": report.as_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
