"""The ledger: signed receipts, the Merkle-logged journal, keys, the projection fold and the store (the only writer)."""
