"""A loop's state machine: what every receipt shares (`events.py`), the projection's rows, the
fold that applies a receipt and the judge that asks whether its decision was legal, the facts
both build for the policy evaluator, budget pools' charges, and the registry of kinds (each
kind's data model and spec live with its feature)."""
