"""The webhook sink: every receipt of the store pushed to a receiver (a SIEM), nothing lost.

A task of `serve` (`running`) reads receipts in log order after the sink's cursor, persisted in
the store (`export_cursors`), and POSTs them in batches as CloudEvents (a JSON array,
`application/cloudevents-batch+json`), each body signed (`exports.py`). The cursor moves only
after a 2xx: a delivery that fails (connection error, timeout, any other status) is retried
with capped exponential backoff, and a server killed between the POST and the cursor's write
sends that batch again when it is back. Delivery is at least once; the receipt id (each event's
`id`) is the dedupe key.

A batch is bounded in receipts and in bytes (`Pacing.batch`, `Pacing.batch_bytes`: 512 KiB,
half the request body nginx takes by default). A receiver that answers 413 (too large) gets
the same receipts in smaller batches, halved each time down to one; a receipt that is refused
alone, or is larger than a batch may be, is sent by reference (`cloudevents.reference`: its id,
digest and size; counted in `loopwarden_export_by_reference_total` and logged), so no receipt,
however large an agent made it, holds back the ones after it.

Among replicas (or stdio servers) sharing a store, only the holder of the sink's lease sends:
the lease is taken when free or expired (a takeover, counted), renewed with every cursor write
and at half its life, and given up on shutdown. The sink is its own task: it reads through the
store's reader and writes one small transaction per batch (never while it posts, and never
holding a lock across a POST), so a backlog or a receiver that is down never slows a decision.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import anyio
import httpx2

from loopwarden import __version__
from loopwarden.clock import Clock
from loopwarden.exports.cloudevents import cloudevent, reference
from loopwarden.exports.targets import (
    CONTENT_TYPE,
    SIGNATURE_HEADER,
    SINK_HEADER,
    TIMESTAMP_HEADER,
    ExportTarget,
    signature,
)
from loopwarden.kernel.store.reader import ExportCursor, JournalRow, Reader
from loopwarden.kernel.store.store import Store
from loopwarden.observe import NOBODY, Observer

log = logging.getLogger("loopwarden.server")


@dataclass(frozen=True)
class Pacing:
    """How a sink paces itself: receipts per POST, seconds between looks when caught up, the
    lease's life, the backoff's first and longest wait, and the POST's timeout. A holder renews
    its lease at half its life, and the longest wait and the timeout are each at most a quarter
    of it, so a holder that keeps retrying keeps its lease."""

    batch: int = 100
    batch_bytes: int = 512 * 1024
    poll: float = 0.5
    lease: float = 120.0
    first_retry: float = 0.5
    longest_retry: float = 30.0
    timeout: float = 10.0

    @staticmethod
    def of(target: ExportTarget) -> Pacing:
        """The pacing of `target`, from its lease (120 s by default: waits of up to 30 s, POSTs
        timed out after 10 s)."""
        quarter = target.lease / 4
        return Pacing(
            lease=target.lease,
            first_retry=min(0.5, quarter),
            longest_retry=quarter,
            timeout=min(10.0, quarter),
        )


@dataclass(frozen=True)
class Look:
    """What one read saw: the cursor (None: the sink never ran), the receipts after it, the
    log's size and the store's origin (the events' `source`)."""

    cursor: ExportCursor | None
    rows: list[JournalRow]
    size: int
    origin: str

    @property
    def after(self) -> int:
        return self.cursor.exported if self.cursor is not None else -1


TOO_LARGE = 413


@dataclass(frozen=True)
class Batch:
    """One POST's receipts, its body, and those of its receipts sent by reference (each with
    the size its whole event would have had)."""

    rows: list[JournalRow]
    body: str
    referenced: tuple[tuple[JournalRow, int], ...]


def _json(event: dict[str, object]) -> str:
    return json.dumps(event, separators=(",", ":"))


def holder_id() -> str:
    """This process, as a lease names it: host, process id and a random tag."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def failure(exc: BaseException | None, status: int | None) -> str:
    """A failed delivery, described without the URL or anything the receiver said."""
    if status is not None:
        return f"HTTP {status}"
    if isinstance(exc, httpx2.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx2.ConnectError):
        return "connection failed"
    return f"transport error ({type(exc).__name__})"


class WebhookSink:
    """One sink's sender (module docstring). `clock` is the one lease times are read with (the
    store's, so the same as the transaction's); `holder` names this process."""

    def __init__(
        self,
        store: Store,
        target: ExportTarget,
        *,
        observer: Observer = NOBODY,
        clock: Clock | None = None,
        holder: str | None = None,
        pacing: Pacing | None = None,
    ) -> None:
        self.store, self.target, self.observer = store, target, observer
        self.clock = clock or store.clock
        self.holder = holder or holder_id()
        self.pacing = pacing or Pacing.of(target)
        self._lease_until: datetime | None = None
        self._retry = 0.0  # the current backoff wait (0: the last delivery succeeded)
        self._error: str | None = None  # the last failure logged (to log changes only)
        self._limit = self.pacing.batch  # receipts per batch now (halved by each 413)
        self._by_reference: set[str] = set()  # receipts the receiver refused alone (413)

    def _look(self, reader: Reader) -> Look:
        cursor = reader.export_cursor(self.target.name)
        after = cursor.exported if cursor is not None else -1
        origin = reader.meta("origin") or "loopwarden.local/unknown"
        rows = reader.journal_page(after, self.pacing.batch)
        return Look(cursor, rows, reader.log_state().size, origin)

    def _holding(self, cursor: ExportCursor | None) -> bool:
        """This process holds the lease with more than half its life left."""
        until = self._lease_until
        if cursor is None or cursor.holder != self.holder or until is None:
            return False
        return self.clock() < until - timedelta(seconds=self.pacing.lease / 2)

    def _held_elsewhere(self, cursor: ExportCursor | None) -> bool:
        """Another process's lease is live (by this clock): no write needed to know it."""
        if cursor is None or cursor.holder in (None, self.holder) or not cursor.lease_expires_at:
            return False
        return self.clock() < cursor.lease_expires_at

    async def step(self, http: httpx2.AsyncClient) -> float:
        """One round: look, take or renew the lease if needed, deliver one batch and record
        the outcome. Returns how long to wait before the next round."""
        look = await self.store.read(self._look)
        self.observer.exported(self.target.name, lag=max(look.size - 1 - look.after, 0))
        if not look.rows:
            return self.pacing.poll
        if not self._holding(look.cursor):
            if self._held_elsewhere(look.cursor):
                return self.pacing.poll
            name, pacing = self.target.name, self.pacing
            lease = await self.store.write(
                lambda tx: tx.cursors.take_export_lease(
                    name, self.holder, self.target.origin, pacing.lease
                )
            )
            if lease is None:  # another process sends: look again later
                self._lease_until = None
                return pacing.poll
            self._lease_until = lease.cursor.lease_expires_at
            if lease.took_over:
                self.observer.exported(name, takeovers=1)
                log.warning("export sink %s: took over a lease its holder let expire", name)
            if lease.cursor.exported != look.after:  # moved since the look: look again
                return 0.0
        batch = self._batch(look.rows, look.origin)
        status, error = await self._post(http, batch.body)
        if status is not None and 200 <= status < 300:
            await self._delivered(batch.rows)
            self._sent_by_reference(batch)
            self._limit = min(self._limit * 2, self.pacing.batch)
            # More waiting: send on. Else let the next batch gather for a poll interval: one
            # POST and one cursor write per interval, not per receipt.
            more = len(batch.rows) < len(look.rows) or len(look.rows) == self.pacing.batch
            return 0.0 if more else self.pacing.poll
        if status == TOO_LARGE:
            return await self._too_large(batch)
        return await self._failed(failure(error, status))

    def _batch(self, rows: list[JournalRow], origin: str) -> Batch:
        """The next batch: the first receipts after the cursor, at most `_limit` of them and
        `batch_bytes` in all (always one); a receipt larger than that alone, or one the
        receiver refused alone, by reference."""
        parts: list[str] = []
        size = 2  # the brackets
        taken: list[JournalRow] = []
        referenced: list[tuple[JournalRow, int]] = []
        for row in rows[: self._limit]:
            part = _json(cloudevent(row, origin))
            whole = len(part.encode())
            alone = whole + 2 > self.pacing.batch_bytes or row.receipt_id in self._by_reference
            if alone:
                part = _json(reference(row, origin))
            grown = size + len(part.encode()) + (1 if parts else 0)
            if parts and grown > self.pacing.batch_bytes:
                break
            parts.append(part)
            taken.append(row)
            if alone:
                referenced.append((row, whole))
            size = grown
        return Batch(taken, "[" + ",".join(parts) + "]", tuple(referenced))

    def _sent_by_reference(self, batch: Batch) -> None:
        for row, whole in batch.referenced:
            self._by_reference.discard(row.receipt_id)
            self.observer.exported(self.target.name, by_reference=1)
            log.warning(
                "export sink %s: receipt %s (%d bytes) was sent by reference (id, digest, size): "
                "too large for a batch the receiver takes; `loopwarden receipt %s` shows it",
                self.target.name,
                row.receipt_id,
                whole,
                row.receipt_id,
            )

    async def _too_large(self, batch: Batch) -> float:
        """A 413: send the same receipts in batches half the size; a receipt refused alone is
        sent by reference next; a reference refused is a failure like any other."""
        name = self.target.name
        if len(batch.rows) > 1:
            self._limit = max(1, len(batch.rows) // 2)
            log.warning(
                "export sink %s: the receiver refused a batch of %d receipts (%d bytes) as too "
                "large (HTTP 413); sending them %d at a time",
                name,
                len(batch.rows),
                len(batch.body.encode()),
                self._limit,
            )
            return 0.0
        row = batch.rows[0]
        if batch.referenced or row.receipt_id in self._by_reference:
            return await self._failed(failure(None, TOO_LARGE))
        self._by_reference.add(row.receipt_id)
        return 0.0

    async def _post(
        self, http: httpx2.AsyncClient, body: str
    ) -> tuple[int | None, BaseException | None]:
        """POST one signed batch; its status, or the transport error that stopped it."""
        timestamp = str(int(self.clock().timestamp()))
        headers = {
            "Content-Type": CONTENT_TYPE,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(self.target.secret, timestamp, body.encode()),
            SINK_HEADER: self.target.name,
            "User-Agent": f"loopwarden/{__version__}",
        }
        try:
            response = await http.post(self.target.url, content=body.encode(), headers=headers)
        except httpx2.HTTPError as exc:
            return None, exc
        return response.status_code, None

    async def _delivered(self, rows: list[JournalRow]) -> None:
        name, pacing, last = self.target.name, self.pacing, rows[-1].leaf
        kept = await self.store.write(
            lambda tx: tx.cursors.advance_export(name, self.holder, last, len(rows), pacing.lease)
        )
        self.observer.exported(name, sent=len(rows))
        if not kept:  # another process took the lease over meanwhile: it sends from here on
            self._lease_until = None
            return
        self._lease_until = self.clock() + timedelta(seconds=pacing.lease)
        if self._error is not None:
            log.warning("export sink %s: delivering again after %s", name, self._error)
        self._retry, self._error = 0.0, None

    async def _failed(self, error: str) -> float:
        name, pacing = self.target.name, self.pacing
        await self.store.write(lambda tx: tx.cursors.note_export_failure(name, self.holder, error))
        self.observer.exported(name, failed=1)
        self._retry = min(max(self._retry * 2, pacing.first_retry), pacing.longest_retry)
        if error != self._error:
            log.warning("export sink %s: delivery failed (%s); retrying with backoff", name, error)
            self._error = error
        return random.uniform(self._retry / 2, self._retry)  # jitter: replicas do not align

    async def run(self) -> None:
        """Deliver until cancelled. A store error (the store closing, a busy database) waits
        one longest retry and tries again: the sink never stops the server."""
        timeout = httpx2.Timeout(self.pacing.timeout)
        async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as http:
            while True:
                try:
                    wait = await self.step(http)
                except Exception as exc:  # the kind only: nothing secret
                    log.warning(
                        "export sink %s: %s; retrying", self.target.name, type(exc).__name__
                    )
                    wait = self.pacing.longest_retry
                if wait:
                    await anyio.sleep(wait)

    async def release(self) -> None:
        """Give the lease up (bounded, and shielded from the cancellation that stops the
        server): another replica may send at once."""
        name = self.target.name
        with anyio.move_on_after(5, shield=True):
            try:
                await self.store.write(
                    lambda tx: tx.cursors.release_export_lease(name, self.holder)
                )
            except Exception as exc:  # the lease then expires by itself
                log.info("export sink %s: lease not released (%s)", name, type(exc).__name__)


@asynccontextmanager
async def sending(sink: WebhookSink | None) -> AsyncIterator[None]:
    """Run `sink` (if any) while the block runs; then stop it and give its lease up."""
    if sink is None:
        yield
        return
    async with anyio.create_task_group() as group:
        group.start_soon(sink.run)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
            await sink.release()
