"""Claude Code against a fake Anthropic Messages API (`POST /v1/messages?beta=true`, streamed).

Claude Code takes `ANTHROPIC_BASE_URL` and any `ANTHROPIC_API_KEY`; nonessential traffic is off.
As root it refuses `--dangerously-skip-permissions`, so a session allows its tools by name
(`--allowedTools`). It defers MCP tools behind its `ToolSearch` tool; the scenarios that are not
about that load them up front (`ENABLE_TOOL_SEARCH=false`).

A tool call streams as Anthropic's do: `message_start`, a `tool_use` content block whose input
arrives as `input_json_delta` pieces, `message_delta` with `stop_reason: tool_use`,
`message_stop`. The results come back as `tool_result` blocks of the next user message.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from .fake import FAKE_KEY, NOT_FOUND, Dialect, Reply, json_reply, sse_reply
from .host import Options
from .mcp_gateway import add_gateway
from .script import Call, Conversation, Exchange, Named, Say, Script, ScriptError, declared
from .world import SERVE, World

MODEL = "claude-opus-5-5"  # named in answers; Claude Code picks its default model itself
SUBAGENT_TYPE = "general-purpose"
_ids = itertools.count(1)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text(block.get("text", "")) for block in content if isinstance(block, dict)
        )
    return ""


def conversation(body: dict[str, Any]) -> Conversation:
    """The Messages request as a conversation: the first user message's text (the prompt,
    system reminders included), then each `tool_use` paired with its `tool_result`."""
    opening: list[str] = []
    calls: dict[str, tuple[str, Any]] = {}
    exchanges: list[Exchange] = []
    answered = False
    for message in body.get("messages", []):
        blocks = message.get("content")
        blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks or []
        if message.get("role") == "assistant":
            answered = True
            for block in blocks:
                if block.get("type") == "tool_use":
                    calls[block["id"]] = (block["name"], block.get("input", {}))
        elif message.get("role") == "user":
            for block in blocks:
                if block.get("type") == "text" and not answered:
                    opening.append(block.get("text", ""))
                if block.get("type") == "tool_result":
                    name, arguments = calls.get(block.get("tool_use_id", ""), ("?", {}))
                    text = _text(block.get("content"))
                    exchanges.append(Exchange(name, arguments, text, bool(block.get("is_error"))))
    tools = frozenset(str(tool.get("name")) for tool in body.get("tools", []))
    return Conversation("\n".join(opening), tuple(exchanges), tools)


def tool_call(call: Call, conversation: Conversation) -> Named:
    """A host-neutral call as Claude Code names it. loopwarden's tools keep their documented
    names (`mcp__loopwarden__T`) even when deferred behind ToolSearch, where the request does
    not declare them."""
    params = call.params
    if call.kind == "shell":
        bash = declared(conversation, "Bash")
        return Named(bash, {"command": params["command"], "description": "scripted command"})
    if call.kind == "loopwarden":
        return Named(f"mcp__loopwarden__{params['tool']}", dict(params["arguments"]))
    if call.kind == "downstream":  # a tool the MCP gateway serves: `mcp__loopwarden__S__T`
        return Named(f"mcp__loopwarden__{params['tool']}", dict(params["arguments"]))
    if call.kind == "tool_search":
        search = declared(conversation, "ToolSearch")
        return Named(search, {"query": "select:" + ",".join(params["names"])})
    if call.kind == "subagent":
        arguments = {
            "description": "scripted subagent",
            "prompt": params["prompt"],
            "subagent_type": SUBAGENT_TYPE,
            "run_in_background": False,  # the turn's report waits for the subagent's work
        }
        return Named(declared(conversation, "Agent", "Task"), arguments)
    raise ScriptError(f"Claude Code has no {call.kind} call")


def _events(action: Named | Say, output: int = 5) -> tuple[list[tuple[str | None, Any]], str]:
    start = {
        "type": "message_start",
        "message": {
            "id": f"msg_{next(_ids)}", "type": "message", "role": "assistant", "model": MODEL,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }  # fmt: skip
    if isinstance(action, Named):
        name, encoded = action.tool, json.dumps(action.arguments)
        half = len(encoded) // 2
        block = {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": name, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": part}
            for part in (encoded[:half], encoded[half:])
        ]
        stop, summary = "tool_use", f"tool_use {name} {encoded[:200]}"
    else:
        block, stop, summary = {"type": "text", "text": ""}, "end_turn", f"text {action.text!r}"
        deltas = [{"type": "text_delta", "text": action.text}]
    events: list[tuple[str | None, Any]] = [
        ("message_start", start),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        *[
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
            for d in deltas
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": output},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events, summary


def _message(action: Named | Say, output: int = 5) -> dict[str, Any]:
    """The same answer unstreamed (for a request without `stream`)."""
    if isinstance(action, Named):
        block = {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": action.tool}
        content: list[dict[str, Any]] = [{**block, "input": dict(action.arguments)}]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": action.text}], "end_turn"
    return {
        "id": f"msg_{next(_ids)}", "type": "message", "role": "assistant", "model": MODEL,
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": output},
    }  # fmt: skip


class ClaudeCode:
    name = "claude-code"
    label = "Claude Code"
    features = frozenset({"tool_search", "subagent", "mcp_gateway"})

    def configure(self, world: World, api_url: str, options: Options) -> None:
        # the README's Claude Code block for the server
        mcp_add = [
            "claude", "mcp", "add", "--transport", "stdio", "loopwarden",
            "--env", world.home_variable, "--",
        ]  # fmt: skip
        if options.mcp_gateway:  # docs/clients.md, "Governing an MCP client without hooks"
            add_gateway(world, mcp_add)
        else:
            world.add_loopwarden(self.name, [*mcp_add, *SERVE])

    def session(
        self, world: World, api_url: str, prompt: str, options: Options
    ) -> tuple[list[str], dict[str, str]]:
        allowed = ["Bash", "ToolSearch", "mcp__loopwarden"] + (
            ["Agent"] if options.subagents else []
        )
        argv = ["claude", "-p", prompt, "--allowedTools", ",".join(allowed)]
        env = {
            "ANTHROPIC_BASE_URL": api_url,
            "ANTHROPIC_API_KEY": options.key or FAKE_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "ENABLE_TOOL_SEARCH": "true" if options.tool_search else "false",
        }
        return argv, env

    def dialect(self, script: Script) -> Dialect:
        def answer(path: str, body: dict[str, Any]) -> Reply:
            if not path.startswith("/v1/messages"):
                return NOT_FOUND
            if path.startswith("/v1/messages/count_tokens"):
                return json_reply({"input_tokens": 10}, "count_tokens")
            action = script.next(conversation(body), tool_call)
            output = script.output_tokens(body.get("max_tokens"))
            if body.get("stream"):
                events, summary = _events(action, output)
                return sse_reply(events, summary)
            return json_reply(_message(action, output), "unstreamed message")

        return answer
