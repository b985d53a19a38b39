"""The audit: a database or a proof bundle checked end to end, every defect a typed finding."""
