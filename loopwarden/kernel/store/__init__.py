"""Storage: the store contract (the only writer), its SQLite and PostgreSQL backends, the schema, the guarded reads and the row proofs."""
