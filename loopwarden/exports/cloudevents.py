"""Receipts as CloudEvents 1.0 (structured JSON mode): the feed a SIEM or a log pipeline reads.

One event per receipt, in the global log's order. The event's `id` is the receipt id (unique in
the store: what an at-least-once consumer dedupes on), `source` names the store by its origin
(the name its checkpoints sign), `subject` is the loop, `time` the receipt's own time. `data`
carries the receipt's place (loop, seq, log index), its digest and the signed DSSE envelope
itself, so a consumer can verify every event with the store's public keys and nothing else.
The extension attributes `loopwardenloop`, `loopwardenseq` and `loopwardenindex` repeat the
place for routers that read attributes only. Nothing is added that the journal does not hold.

A receipt too large for a batch the receiver takes is sent by reference (`reference`): the same
event without the envelope, its data naming the receipt's id, digest and envelope size
(`envelope_size`), and the extension attribute `loopwardenreference` true. The receipt itself
is one `loopwarden receipt ID` away, and its digest checks what is fetched.
"""

from __future__ import annotations

import json
from typing import Any

from loopwarden.clock import format_time
from loopwarden.kernel.sql.records import JournalRow

SPEC_VERSION = "1.0"
TYPE_PREFIX = "io.github.loopwarden.receipt."


def cloudevent(row: JournalRow, origin: str) -> dict[str, Any]:
    """The CloudEvent of one journal row."""
    return {
        "specversion": SPEC_VERSION,
        "id": row.receipt_id,
        "source": f"loopwarden:{origin}",
        "type": TYPE_PREFIX + row.kind,
        "subject": row.loop_id,
        "time": format_time(row.at),
        "datacontenttype": "application/json",
        "loopwardenloop": row.loop_id,
        "loopwardenseq": row.seq,
        "loopwardenindex": row.leaf_index,
        "data": {
            "receipt_id": row.receipt_id,
            "kind": row.kind,
            "loop_id": row.loop_id,
            "seq": row.seq,
            "log_index": row.leaf_index,
            "digest": row.digest,
            "envelope": json.loads(row.envelope),
        },
    }


def reference(row: JournalRow, origin: str) -> dict[str, Any]:
    """The CloudEvent of one journal row sent by reference: no envelope, its size instead."""
    event = cloudevent(row, origin)
    data = event["data"]
    del data["envelope"]
    data["envelope_size"] = len(row.envelope)
    event["loopwardenreference"] = True
    return event
