"""What every operation needs: the store and the trusted keyring. Built once by the wiring."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from loopwarden.ledger.keys import Keyring
from loopwarden.ledger.store import Store


@dataclass
class Kernel:
    store: Store
    keyring: Keyring

    def new_id(self, prefix: str) -> str:
        """A fresh random id: `<prefix>-` + 20 hex digits (80 bits)."""
        return f"{prefix}-{secrets.token_hex(10)}"
