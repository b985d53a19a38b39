"""A loopwarden tool error as MCP carries it, written by every server side (`server/tools.py`,
the MCP gateway) and read by loopwarden's own clients: `code: message` as text for the model,
and the code and message under `_meta["loopwarden/error"]` for a client to match on."""

from __future__ import annotations

from mcp.types import CallToolResult, TextContent

ERROR_META = "loopwarden/error"  # the `_meta` key of a tool error's code and message


def error_result(code: str, message: str) -> CallToolResult:
    """A tool error the model can read (`code: message`) and a client can match on (`_meta`),
    with no structured content for a strict client to hold against the output schema."""
    return CallToolResult(
        meta={ERROR_META: {"code": code, "message": message}},
        content=[TextContent(type="text", text=f"{code}: {message}")],
        is_error=True,
    )


def error_of(result: CallToolResult) -> tuple[str, str] | None:
    """The code and message of a loopwarden tool error, None if `result` carries none."""
    error = (result.meta or {}).get(ERROR_META)
    if isinstance(error, dict) and "code" in error:
        return str(error["code"]), str(error.get("message", ""))
    return None
