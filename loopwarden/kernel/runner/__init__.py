"""The one runner: every operation is declared once (`operation.py`) and run in one order —
visibility, idempotency, the transaction (`runner.py`); the refusals it records for any feature
(`refusals.py`, `request_kinds.py`) and the result pieces operations share (`results.py`)."""
