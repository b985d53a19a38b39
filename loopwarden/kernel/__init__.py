"""The kernel: what every feature needs and nothing feature-specific — the transparency log
(`log/`), a loop's state machine and the kind registry (`state/`), the store and its write
transaction (`store/`), the SQL beneath it (`sql/`) and the one runner of operations
(`runner/`). The kernel imports no feature: the application hands it the registry of receipt
kinds its features declare (`loopwarden/kinds.py`)."""
