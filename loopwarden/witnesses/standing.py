"""The witnesses' standing as the dashboard's audit page shows it: the latest checkpoint's
cosignatures, each checked against the keys of the witnesses the client has asked, and where
each witness stands (the size it holds, its last error, a conflict: an alarm)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from loopwarden.kernel.log.checkpoints import cosigned_note, split_note
from loopwarden.kernel.sql.records import WitnessRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.witnesses.cosignatures import check, matches
from loopwarden.witnesses.vkeys import COSIGNATURE_V1, parse_vkey


@dataclass(frozen=True)
class ShownCosignature:
    witness: str
    at: datetime | None  # the cosignature's timestamp
    verified: bool | None  # None: no witness the client asked has that key


@dataclass(frozen=True)
class WitnessView:
    size: int  # the latest checkpoint's
    cosignatures: list[ShownCosignature]
    witnesses: list[WitnessRow]

    @property
    def conflicts(self) -> list[WitnessRow]:
        return [row for row in self.witnesses if row.conflict]


def witness_view(reader: Reader) -> WitnessView:
    rows = reader.witness_rows()
    latest = reader.latest_checkpoint()
    if latest is None:
        return WitnessView(0, [], rows)
    keys = []
    for row in rows:
        try:
            keys.append(parse_vkey(row.vkey, kind=COSIGNATURE_V1))
        except ValueError:
            continue
    lines = [c.line for c in reader.cosignatures(latest.size)]
    shown = []
    try:
        parts = split_note(cosigned_note(latest.note, lines))
    except ValueError:
        return WitnessView(latest.size, [], rows)
    for name, blob in parts.signatures[1:]:
        key = next((k for k in keys if matches(k, name, blob)), None)
        result = None if key is None else check(key, parts.text, blob)
        at = (
            datetime.fromtimestamp(result.timestamp, UTC)
            if result is not None and result.verified
            else None
        )
        shown.append(ShownCosignature(name, at, None if result is None else result.verified))
    return WitnessView(latest.size, shown, rows)
