"""The governance operations: each declared once (`operation.py`) and run by one runner."""
