"""The governance operations: plain async functions over typed inputs, transport-free.

Each operation takes the `Kernel` (store, keyring), the calling `Principal` and a request model,
and returns a result model. Policy refusals are results; malformed input and unknown ids raise
`LoopwardenError`s that the server maps to MCP errors.
"""

from loopwarden.tools.kernel import Kernel

__all__ = ["Kernel"]
