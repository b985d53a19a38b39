"""The MCP server: wires the kernel to MCP tools, resources and a prompt over stdio or streamable HTTP."""
