"""The MCP tools, generated from the operation declarations: nothing here restates an argument.

Each tool's input schema is its request model's JSON Schema (flat arguments, the model's
constraints field for field, unknown arguments refused); its output schema is the result
model's, flattened for clients to check cheaply (`schemas.py`). A call runs through the
operation runner as the server's principal.

Errors carry a code end to end: the text reads `code: message`, and the result's `_meta` holds
`{"loopwarden/error": {"code", "message"}}` for machines. An error result carries no
`structuredContent`: MCP (2025-11-25 and 2026-07-28) says structured content MUST conform to
the tool's output schema, and strict clients (the MCP Inspector) validate it on every result, so
an `{"error": ...}` object there read as a schema failure instead of the error.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

from loopwarden.catalog import TOOLS
from loopwarden.errors import IntegrityError, LoopwardenError, StoreError, StoreMissing
from loopwarden.kernel.runner.operation import Operation
from loopwarden.server.runtime import Runtime
from loopwarden.server.schemas import slim
from loopwarden.tool_errors import error_result

log = logging.getLogger("loopwarden.server")


def success_result(result: BaseModel) -> CallToolResult:
    """A result model as structured content, and the same JSON as text for older clients."""
    return CallToolResult(
        content=[TextContent(type="text", text=result.model_dump_json())],
        structured_content=result.model_dump(mode="json"),
    )


def tool_annotations(op: Operation[Any, Any]) -> ToolAnnotations:
    hints = op.hints
    return ToolAnnotations(
        read_only_hint=hints.read_only,
        idempotent_hint=hints.idempotent,
        destructive_hint=None if hints.read_only else hints.destructive,
        open_world_hint=False,
    )


class GovernedTool(Tool):
    """An MCP tool that hands its arguments to the operation runner.

    The SDK's own argument handling is bypassed on purpose: the runner parses the request with
    the operation's model, so the errors read like every other loopwarden error.
    """

    operation: Any = None  # the Operation; typed loosely because the SDK model is pydantic

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> CallToolResult:
        op: Operation[Any, Any] = self.operation
        runtime: Runtime = context.request_context.lifespan_context
        try:
            store = runtime.require_store()
            # Clients sometimes send lists and objects as JSON text; the SDK's pre-parse decodes them.
            request = self.fn_metadata.pre_parse_json(arguments)
            result = await op(store, runtime.principal(), request)
        except StoreMissing as exc:  # the server's own configuration, said as it is
            return error_result(exc.code, exc.message)
        except IntegrityError as exc:
            log.error("integrity check failed in %s, request refused: %s", op.name, exc)
            return error_result(
                exc.code,
                "the store failed an integrity check, so the request was refused and nothing was "
                "changed; an operator should run `loopwarden verify`",
            )
        except StoreError as exc:
            log.error("store failure in %s: %s", op.name, exc)
            return error_result(
                exc.code, "the store could not complete the request; nothing was changed"
            )
        except LoopwardenError as exc:
            return error_result(exc.code, exc.message)
        except Exception:  # never a traceback or internal text to the client; the log has it
            log.exception("unexpected failure in %s", op.name)
            return error_result(
                "internal_error", "the server failed unexpectedly; nothing was changed"
            )
        return success_result(result)


def _arguments_model(request: type[BaseModel]) -> type[ArgModelBase]:
    """The request model in the SDK's argument-model shape (used for its JSON pre-parse only)."""
    return type(f"{request.__name__}Arguments", (request, ArgModelBase), {})


def make_tool(
    cls: type[GovernedTool],
    name: str,
    description: str,
    request: type[BaseModel],
    result: type[BaseModel],
    annotations: ToolAnnotations,
    operation: Operation[Any, Any] | None = None,
) -> GovernedTool:
    """A tool whose schemas are exactly its request and result models'."""

    async def unused(**_: Any) -> None:  # the tool's run never calls it
        raise NotImplementedError

    return cls(
        fn=unused,
        name=name,
        title=None,
        context_kwarg=None,
        description=description,
        parameters=request.model_json_schema(),
        fn_metadata=FuncMetadata(
            arg_model=_arguments_model(request), output_schema=slim(result.model_json_schema())
        ),
        is_async=True,
        annotations=annotations,
        operation=operation,
    )


def build_tool(op: Operation[Any, Any]) -> Tool:
    return make_tool(
        GovernedTool, op.name, op.description, op.request, op.result, tool_annotations(op), op
    )


def build_tools() -> list[Tool]:
    return [build_tool(op) for op in TOOLS]
