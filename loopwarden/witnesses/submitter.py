"""The witness client: every checkpoint submitted to the configured witnesses (C2SP
tlog-witness), their cosignatures stored beside it.

A task of `serve --witness POLICY` (`running`). Each round it reads the latest checkpoint and
each witness's state, and submits the checkpoint to every witness that has not cosigned it,
with the consistency proof from the size that witness last said it holds (0 at first: the
witness then answers 409 with its size, and the next request carries the proof from there).
A cosignature is checked against the witness's key before it is stored. When the tree has grown
past the latest checkpoint for `Pacing.checkpoint_after` seconds, it signs a new one, so that
witnesses see a log that writes less than `checkpoint_every` receipts too.

Nothing here blocks a write or a hook's answer: the client reads through the store's read side
and writes one small transaction per answer, never during a request; a witness that is down
is retried with capped exponential backoff, and the gap shows (`witness status`, `verify`,
`/metrics`).

A conflict is an alarm: the witness holds a view of this log that this log does not extend —
it refused the checkpoint as inconsistent (422), or says it holds a tree larger than any this
log has signed (409). Either is what a fork, a rewritten history or a rollback looks like to a
witness. It is logged at error level, counted in `/metrics`, recorded in the store (the
dashboard's audit page shows it, `verify` fails on it) and kept until an operator clears it.
"""

from __future__ import annotations

import binascii
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

import anyio
import httpx2

from loopwarden import __version__
from loopwarden.clock import Clock
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import cosigned_note, split_note
from loopwarden.kernel.sql.records import CheckpointRow, WitnessRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, Txn
from loopwarden.observe import NOBODY, Observer
from loopwarden.witnesses import add_checkpoint
from loopwarden.witnesses.cosignatures import check, matches
from loopwarden.witnesses.witness_policy import Witness, WitnessPolicy

log = logging.getLogger("loopwarden.server")


@dataclass(frozen=True)
class Pacing:
    """Seconds between looks when every witness is up to date, the backoff's first and longest
    wait, a request's timeout, and how long the tree may grow past the latest checkpoint before
    the client signs a new one (None: never; the store signs every `checkpoint_every`)."""

    poll: float = 1.0
    first_retry: float = 1.0
    longest_retry: float = 300.0
    timeout: float = 10.0
    checkpoint_after: float | None = 60.0


@dataclass(frozen=True)
class Look:
    """What one read saw: the latest checkpoint, each witness's state (by vkey) and the
    witnesses whose cosignature of it is stored (by vkey)."""

    checkpoint: CheckpointRow | None
    size: int
    rows: dict[str, WitnessRow]
    cosigned: set[str]


@dataclass(frozen=True)
class Outcome:
    """One submission's end: `cosigned`, `failed` (with why), `conflict` (with why), or `again`
    (the witness told its size: submit again at once, from there)."""

    kind: str
    detail: str = ""


def failure(exc: BaseException) -> str:
    """A failed request, described without the URL."""
    if isinstance(exc, httpx2.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx2.ConnectError):
        return "connection failed"
    return f"transport error ({type(exc).__name__})"


class Submitter:
    """The witness client of one store, for the witnesses of `policy` that have a URL."""

    def __init__(
        self,
        store: Store,
        policy: WitnessPolicy,
        *,
        observer: Observer = NOBODY,
        clock: Clock | None = None,
        pacing: Pacing | None = None,
    ) -> None:
        self.store, self.policy, self.observer = store, policy, observer
        self.clock = clock or store.clock
        self.pacing = pacing or Pacing()
        self.witnesses = [w for w in policy.witnesses.values() if w.url]
        self._error: dict[str, str] = {}  # the last failure logged, to log changes only

    def _look(self, reader: Reader) -> Look:
        checkpoint = reader.latest_checkpoint()
        rows = {row.vkey: row for row in reader.witness_rows()}
        cosigned: set[str] = set()
        if checkpoint is not None:
            # A stored line counts only if it verifies: a row is no proof (a forged one would
            # otherwise stop the client from asking the witness for the real cosignature).
            note = cosigned_note(
                checkpoint.note, [c.line for c in reader.cosignatures(checkpoint.size)]
            )
            parts = split_note(note)
            for witness in self.witnesses:
                if any(
                    matches(witness.vkey, name, blob)
                    and check(witness.vkey, parts.text, blob).verified
                    for name, blob in parts.signatures
                ):
                    cosigned.add(str(witness.vkey))
        return Look(checkpoint, reader.log_state().size, rows, cosigned)

    def _due(self, witness: Witness, look: Look) -> bool:
        """Whether `witness` is asked this round: it has not cosigned the latest checkpoint,
        and the backoff after its last failures (kept in the store, so a restart or another
        replica keeps to it) has passed: first_retry, doubled per failure, at most
        longest_retry; after a conflict, longest_retry."""
        if str(witness.vkey) in look.cosigned:
            return False
        row = look.rows.get(str(witness.vkey))
        if row is None or not row.failures or row.failed_at is None:
            return True
        pacing = self.pacing
        wait = pacing.first_retry * 2 ** min(row.failures - 1, 32)
        wait = pacing.longest_retry if row.conflict else min(wait, pacing.longest_retry)
        return self.clock() >= row.failed_at + timedelta(seconds=wait)

    async def step(self, http: httpx2.AsyncClient) -> float:
        """One round: sign a checkpoint if one is due, then submit the latest to every witness
        that has not cosigned it and whose backoff has passed. Returns the wait before the
        next round."""
        look = await self.store.read(self._look)
        if self._checkpoint_due(look):
            await self.store.checkpoint()
            look = await self.store.read(self._look)
        checkpoint = look.checkpoint
        if checkpoint is None:
            return self.pacing.poll
        due = [w for w in self.witnesses if self._due(w, look)]
        async with anyio.create_task_group() as group:
            for witness in due:
                group.start_soon(self._witness, http, witness, checkpoint, look)
        self._gauge(look)
        return self.pacing.poll

    def _checkpoint_due(self, look: Look) -> bool:
        after = self.pacing.checkpoint_after
        if after is None or look.size == 0:
            return False
        checkpoint = look.checkpoint
        if checkpoint is None:
            return True
        return checkpoint.size < look.size and (
            self.clock() - checkpoint.signed_at >= timedelta(seconds=after)
        )

    async def _witness(
        self, http: httpx2.AsyncClient, witness: Witness, checkpoint: CheckpointRow, look: Look
    ) -> None:
        row = look.rows.get(str(witness.vkey))
        old = row.cosigned if row is not None else 0
        outcome = Outcome("again")
        for _ in range(3):  # a 409 names the witness's size: at most two more tries from it
            outcome = await self._submit(http, witness, checkpoint, old)
            if outcome.kind != "again":
                break
            old = int(outcome.detail)
        await self._settle(witness, checkpoint, outcome)

    async def _submit(
        self, http: httpx2.AsyncClient, witness: Witness, checkpoint: CheckpointRow, old: int
    ) -> Outcome:
        size = checkpoint.size
        if old > size:
            return await self._ahead(witness, old)
        if 0 < old < size:
            proof = await self.store.read(lambda r: merkle.consistency_proof(old, size, r.node))
        else:
            proof = []
        body = add_checkpoint.encode(old, proof, checkpoint.note)
        url = str(witness.url).rstrip("/") + add_checkpoint.PATH
        try:
            response = await http.post(
                url, content=body, headers={"User-Agent": f"loopwarden/{__version__}"}
            )
        except httpx2.HTTPError as exc:
            return Outcome("failed", failure(exc))
        status = response.status_code
        if status == 200:
            return await self._cosigned(witness, checkpoint, response.content)
        if status == 409:
            try:
                held = add_checkpoint.parse_size(response.content)
            except ValueError:
                return Outcome("failed", "HTTP 409 without a size")
            await self.store.write(
                lambda tx: tx.witnesses.holds(str(witness.vkey), _url(witness), held)
            )
            if held > size:
                return await self._ahead(witness, held)
            if held == old == size:  # how a tlog-witness v1.0.0 witness says "another root"
                return Outcome(
                    "conflict",
                    f"holds another tree of size {size} for this log (it answered 409 naming "
                    "the size submitted)",
                )
            if held == old:
                return Outcome("failed", f"HTTP 409 naming the size submitted ({old})")
            return Outcome("again", str(held))
        if status == 422:
            return Outcome(
                "conflict",
                f"refused checkpoint {size} as inconsistent with the tree of size {old} it holds "
                "for this log (it has cosigned another view of it)",
            )
        return Outcome("failed", f"HTTP {status}")

    async def _ahead(self, witness: Witness, held: int) -> Outcome:
        """The witness holds a tree of size `held`, larger than the checkpoint submitted: a
        conflict unless this log has since signed a checkpoint that large (another replica)."""
        latest = await self.store.read(lambda r: r.latest_checkpoint())
        if latest is not None and latest.size >= held:
            return Outcome("failed", "a newer checkpoint was signed meanwhile")
        have = latest.size if latest is not None else 0
        return Outcome(
            "conflict",
            f"holds a tree of size {held} for this log, larger than its latest checkpoint "
            f"({have}): a rollback, or a fork shown to the witness",
        )

    async def _cosigned(self, witness: Witness, checkpoint: CheckpointRow, body: bytes) -> Outcome:
        text = split_note(checkpoint.note).text
        lines: list[tuple[str, str, str]] = []
        try:
            answer = body.decode("utf-8")
            for line in answer.splitlines(keepends=True):
                parts = split_note(text + "\n" + line) if line.endswith("\n") else None
                if parts is None:
                    raise ValueError("a line without its newline")
                name, blob = parts.signatures[0]
                if matches(witness.vkey, name, blob) and check(witness.vkey, text, blob).verified:
                    lines.append((name, blob[:4].hex(), line))
        except (ValueError, binascii.Error):
            return Outcome("failed", "the answer is not signature lines")
        if not lines:
            return Outcome("failed", "no valid cosignature from the witness's key in its answer")
        vkey, url = str(witness.vkey), _url(witness)
        await self.store.write(lambda tx: tx.witnesses.cosigned(vkey, url, checkpoint.size, lines))
        return Outcome("cosigned")

    async def _settle(self, witness: Witness, checkpoint: CheckpointRow, outcome: Outcome) -> None:
        name, vkey, url = witness.name, str(witness.vkey), _url(witness)
        if outcome.kind == "cosigned":
            self.observer.witnessed(name, cosigned=1)
            if name in self._error:
                log.warning("witness %s: cosigning again after %s", name, self._error.pop(name))
            return
        if outcome.kind == "conflict":

            def record(tx: Txn) -> bool:
                tx.witnesses.failed(vkey, url, "conflict")
                return tx.witnesses.conflict(vkey, url, outcome.detail)

            new = await self.store.write(record)
            self.observer.witnessed(name, conflicts=1)
            if new:
                log.error(
                    "witness %s: CONFLICT at checkpoint %d: the witness %s. Someone may have "
                    "rewritten or rolled back this log; run loopwarden verify",
                    name,
                    checkpoint.size,
                    outcome.detail,
                )
            return
        error = outcome.detail or "no answer"
        await self.store.write(lambda tx: tx.witnesses.failed(vkey, url, error))
        self.observer.witnessed(name, failed=1)
        if self._error.get(name) != error:
            log.warning("witness %s: submission failed (%s); retrying with backoff", name, error)
            self._error[name] = error

    def _gauge(self, look: Look) -> None:
        """Each witness's lag behind the latest checkpoint, as this round began."""
        if look.checkpoint is None:
            return
        for witness in self.witnesses:
            row = look.rows.get(str(witness.vkey))
            held = look.checkpoint.size if str(witness.vkey) in look.cosigned else None
            held = held if held is not None else (row.cosigned if row is not None else 0)
            self.observer.witnessed(witness.name, behind=max(look.checkpoint.size - held, 0))

    async def run(self) -> None:
        """Submit until cancelled; a store error waits one longest retry and tries again: the
        client never stops the server."""
        timeout = httpx2.Timeout(self.pacing.timeout)
        async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as http:
            while True:
                try:
                    wait = await self.step(http)
                except Exception as exc:  # the kind only: nothing secret
                    log.warning("witness client: %s; retrying", type(exc).__name__)
                    wait = self.pacing.longest_retry
                await anyio.sleep(max(wait, 0.05))


async def push_once(store: Store, policy: WitnessPolicy, pacing: Pacing | None = None) -> None:
    """Submit the latest checkpoint to every witness of `policy` once, now (`witness push`,
    `export --witness`): one round of the client, waiting for each answer (bounded by the
    request timeout)."""
    submitter = Submitter(store, policy, pacing=pacing)
    timeout = httpx2.Timeout(submitter.pacing.timeout)
    async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as http:
        await submitter.step(http)


def _url(witness: Witness) -> str:
    return witness.url or ""


@asynccontextmanager
async def submitting(submitter: Submitter | None) -> AsyncIterator[None]:
    """Run `submitter` (if any) while the block runs; then stop it."""
    if submitter is None:
        yield
        return
    async with anyio.create_task_group() as group:
        group.start_soon(submitter.run)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
