"""The MCP server: wires the operations to MCP tools, resources and a prompt over stdio or streamable HTTP."""
