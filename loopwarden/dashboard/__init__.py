"""The operator dashboard: server-rendered pages over the operations, with live updates.

An edge like the MCP server: it reads through the operations (and the store's read side) and
acts only through the operations an operator's CLI runs. `serve --http` mounts it at `/` next
to `/mcp`; `loopwarden dashboard` serves it alone for a local store.
"""
