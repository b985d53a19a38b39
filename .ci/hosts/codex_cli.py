"""Codex CLI against a fake OpenAI Responses API (`POST /v1/responses`, streamed).

Codex takes a custom `model_provider` with `wire_api = "responses"` whose key comes from the
variable its `env_key` names. It runs a project's hooks (`.codex/hooks.json`) only in a trusted
project: the world writes the trust Codex's "trust this folder?" answer writes
(`[projects."…"] trust_level = "trusted"`). New hooks also need the user's review in `/hooks`,
which a non-interactive run cannot give: sessions pass `--dangerously-bypass-hook-trust`, the
flag Codex documents for automation that vets its hooks itself. Sessions run
`codex exec --dangerously-bypass-approvals-and-sandbox` (no prompts; the hooks still decide).

A tool call streams as `response.output_item.done` with a `function_call` item (MCP tools and
subagent tools are in namespaces: the item names its `namespace`), then `response.completed`.
Results come back as `function_call_output` items of the next request's `input`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from .fake import FAKE_KEY, NOT_FOUND, Dialect, Reply, sse_reply
from .host import Options
from .script import (
    Call,
    Conversation,
    Exchange,
    Named,
    Say,
    Script,
    ScriptError,
    declared,
    declared_own,
)
from .world import SERVE, World

KEY_VARIABLE = "LOOPWARDEN_CI_FAKE_OPENAI_KEY"
MODEL = "gpt-5.1-codex"
_ids = itertools.count(1)
CONFIG = f"""model = "{MODEL}"
model_provider = "loopback"
# Codex sends its first request before its MCP servers are up unless told to wait for them.
mcp_optional_startup_grace_ms = 20000
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.loopback]
name = "scripted fake on loopback"
base_url = "{{api}}"
wire_api = "responses"
env_key = "{KEY_VARIABLE}"

[projects.{{project}}]
trust_level = "trusted"
"""


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(_text(item.get("text", "")) for item in output if isinstance(item, dict))
    if isinstance(output, dict):
        return _text(output.get("content") or output.get("text") or json.dumps(output))
    return ""


def conversation(body: dict[str, Any]) -> Conversation:
    opening: list[str] = []
    calls: dict[str, tuple[str, Any]] = {}
    exchanges: list[Exchange] = []
    answered = False
    for item in body.get("input", []):
        kind = item.get("type")
        if kind == "message" and item.get("role") == "user" and not answered:
            opening.append(_text(item.get("content")))
        elif kind == "message" and item.get("role") == "assistant":
            answered = True
        elif kind == "function_call":
            answered = True
            name = "/".join(p for p in (item.get("namespace"), item.get("name")) if p)
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except ValueError:
                arguments = {}
            calls[item.get("call_id", "")] = (name, arguments)
        elif kind == "function_call_output":
            name, arguments = calls.get(item.get("call_id", ""), ("?", {}))
            exchanges.append(Exchange(name, arguments, _text(item.get("output"))))
    return Conversation(
        "\n".join(opening), tuple(exchanges), frozenset(_declared(body.get("tools", [])))
    )


def _declared(tools: list[Any], namespace: str = "") -> list[str]:
    names = []
    for tool in tools:
        if not isinstance(tool, dict) or "name" not in tool:
            continue
        if tool.get("type") == "namespace":
            names += _declared(tool.get("tools", []), tool["name"])
        else:
            names.append(f"{namespace}/{tool['name']}" if namespace else tool["name"])
    return names


def tool_call(call: Call, conversation: Conversation) -> Named:
    """A host-neutral call as Codex names it: `namespace/name` for a namespaced tool."""
    params = call.params
    if call.kind == "shell":
        return Named(declared(conversation, "exec_command"), {"cmd": params["command"]})
    if call.kind == "loopwarden":
        return Named(declared_own(conversation, params["tool"]), dict(params["arguments"]))
    if call.kind == "subagent":
        spawn = declared(conversation, *_namespaced(conversation, "spawn_agent"))
        return Named(spawn, {"message": params["prompt"]})
    if call.kind == "subagent_wait":
        wait = declared(conversation, *_namespaced(conversation, "wait_agent"))
        return Named(wait, {"targets": [params["agent"]], "timeout_ms": 60000})
    raise ScriptError(f"Codex has no {call.kind} call")


def _namespaced(conversation: Conversation, name: str) -> list[str]:
    return sorted(n for n in conversation.tools if n == name or n.endswith("/" + name))


def _item(action: Named | Say) -> tuple[dict[str, Any], str]:
    number = next(_ids)
    if isinstance(action, Named):
        name = action.tool
        namespace, _, bare = name.rpartition("/")
        item: dict[str, Any] = {
            "type": "function_call", "id": f"fc_{number}", "call_id": f"call_{number}",
            "name": bare, "arguments": json.dumps(action.arguments), "status": "completed",
            **({"namespace": namespace} if namespace else {}),
        }  # fmt: skip
        return item, f"function_call {name} {item['arguments'][:200]}"
    message: dict[str, Any] = {
        "type": "message", "id": f"msg_{number}", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": action.text, "annotations": []}],
    }  # fmt: skip
    return message, f"message {action.text!r}"


def _stream(item: dict[str, Any], summary: str, output: int = 5) -> Reply:
    response = f"resp_{next(_ids)}"
    usage = {
        "input_tokens": 10, "input_tokens_details": None, "output_tokens": output,
        "output_tokens_details": None, "total_tokens": 10 + output,
    }  # fmt: skip
    return sse_reply(
        [
            ("response.created", {"type": "response.created", "response": {"id": response}}),
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": 0, "item": item},
            ),
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            ),
            (
                "response.completed",
                {"type": "response.completed", "response": {"id": response, "usage": usage}},
            ),
        ],
        summary,
    )


class CodexCli:
    name = "codex"
    label = "Codex CLI"
    features = frozenset({"subagent", "subagent_wait"})

    def configure(self, world: World, api_url: str, options: Options) -> None:
        config = world.home / ".codex" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            CONFIG.format(api=f"{api_url}/v1", project=json.dumps(str(world.project)))
        )
        # the README's Codex CLI block for the server
        mcp_add = ["codex", "mcp", "add", "loopwarden", "--env", world.home_variable, "--", *SERVE]
        world.add_loopwarden(self.name, mcp_add)

    def session(
        self, world: World, api_url: str, prompt: str, options: Options
    ) -> tuple[list[str], dict[str, str]]:
        argv = [
            "codex", "exec", "--dangerously-bypass-approvals-and-sandbox",
            "--dangerously-bypass-hook-trust", prompt,
        ]  # fmt: skip
        return argv, {KEY_VARIABLE: options.key or FAKE_KEY}

    def dialect(self, script: Script) -> Dialect:
        def answer(path: str, body: dict[str, Any]) -> Reply:
            if not path.startswith("/v1/responses"):
                return NOT_FOUND
            item, summary = _item(script.next(conversation(body), tool_call))
            return _stream(item, summary, script.output_tokens(body.get("max_output_tokens")))

        return answer
