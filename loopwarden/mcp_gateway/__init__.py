"""The MCP gateway: the operator's downstream MCP servers served as one governed MCP server.

`servers_file.py` reads the operator's servers file (the `mcpServers` shape clients keep) and
resolves its secret references; `downstream.py` holds one connection per downstream server
(started lazily, restarted when it dies, one time-out per call); `pins.py` keeps the digests of
the tool descriptions an operator admitted; `gateway_ops.py` decides and seals each downstream
call with the hook path's evaluator and receipts (`host` `mcp-gateway`); `gateway_kinds.py`
declares the receipt of a re-described tool; `proxy.py` is the MCP middleware the server mounts
(`serve --gateway FILE`). docs/mcp-gateway.md is the reference.
"""
