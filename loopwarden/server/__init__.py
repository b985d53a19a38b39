"""The MCP server and the HTTP app: the operations as MCP tools, resources and a prompt over stdio
or streamable HTTP, and the routes features declare (hooks, metrics), mounted beside the
dashboard."""
