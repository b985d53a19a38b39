"""Loop policies: the declarative rules of one loop and the pure evaluator that decides by them (no I/O).

The package imports nothing itself (`loopwarden hook` loads only the modules a decision needs);
import from the modules: `model`, `loader`, `evaluate`, `digest`, `decision`.
"""
