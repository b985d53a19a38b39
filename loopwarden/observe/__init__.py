"""Watching loopwarden from outside: OpenTelemetry spans and Prometheus metrics of decisions.

The lowest layer beside `clock`: it imports nothing else of loopwarden's, and nothing of
OpenTelemetry's or Prometheus's until a server turns it on (`watching`), so a host hook's
process start pays nothing for it.
"""

from loopwarden.observe.observer import NOBODY, Observer, Watch, tracing_wanted, watching

__all__ = ["NOBODY", "Observer", "Watch", "tracing_wanted", "watching"]
