"""The store: the only writer. Its write transaction (seal, chain, fold, prove), the guarded
reads a write acts on, the integrator that gives receipts their Merkle leaves, migrations and
whole-store copies; the backends and the schema are `kernel/sql/`."""
