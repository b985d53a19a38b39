"""Gemini CLI against a fake Gemini API (`models/M:streamGenerateContent?alt=sse`).

Gemini CLI takes `GOOGLE_GEMINI_BASE_URL` with `GEMINI_API_KEY` once its settings select
`gemini-api-key` auth; it loads a project's settings (MCP servers, hooks) only in a trusted
folder, so the world trusts the project as answering Gemini's "trust this folder?" does. A
session runs with `--approval-mode yolo` (no prompts; the hooks still decide).

Before each turn Gemini asks a router for the model to use: a `generateContent` request whose
`responseJsonSchema` the fake fills in (as it does every structured side request; an
`enum` that offers `user` — "who speaks next?" — is answered `user`, so the model never goes on
by itself). A tool call streams as one `functionCall` part; results come back as
`functionResponse` parts of the next user turn.
"""

from __future__ import annotations

import json
from typing import Any

from .fake import FAKE_KEY, NOT_FOUND, Dialect, Reply, json_reply, sse_reply
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


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _response_text(response: Any) -> str:
    """A `functionResponse.response` as the text the model reads: every string in it (the
    tool's output, an MCP tool's text content), then the whole of it as JSON."""
    return "\n".join([*_strings(response), json.dumps(response)])


def conversation(body: dict[str, Any]) -> Conversation:
    opening: list[str] = []
    pending: dict[str, tuple[str, Any]] = {}
    order: list[str] = []
    exchanges: list[Exchange] = []
    answered = False
    for content in body.get("contents", []):
        parts = content.get("parts") or []
        if content.get("role") == "model":
            answered = True
            for part in parts:
                if "functionCall" in part:
                    call = part["functionCall"]
                    key = call.get("id") or f"#{len(order)}"
                    pending[key] = (call.get("name", "?"), call.get("args", {}))
                    order.append(key)
            continue
        for part in parts:
            if "text" in part and not answered:
                opening.append(part["text"])
            if "functionResponse" in part:
                answer = part["functionResponse"]
                key = answer.get("id") or (
                    order[len(exchanges)] if len(exchanges) < len(order) else ""
                )
                name, arguments = pending.get(key, (answer.get("name", "?"), {}))
                response = answer.get("response")
                error = isinstance(response, dict) and "error" in response
                exchanges.append(Exchange(name, arguments, _response_text(response), error))
    tools = frozenset(
        str(declaration.get("name"))
        for tool in body.get("tools", [])
        for declaration in tool.get("functionDeclarations", [])
    )
    return Conversation("\n".join(opening), tuple(exchanges), tools)


def tool_call(call: Call, conversation: Conversation) -> Named:
    params = call.params
    if call.kind == "shell":
        shell = declared(conversation, "run_shell_command")
        return Named(shell, {"command": params["command"], "description": "scripted command"})
    if call.kind == "loopwarden":
        return Named(declared_own(conversation, params["tool"]), dict(params["arguments"]))
    raise ScriptError(f"Gemini CLI has no {call.kind} call in these scenarios")


def _candidate(parts: list[dict[str, Any]], output: int = 5) -> dict[str, Any]:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": output, "totalTokenCount": 10 + output}
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": usage,
    }


def _parts(action: Named | Say) -> tuple[list[dict[str, Any]], str]:
    if isinstance(action, Named):
        encoded = json.dumps(action.arguments)
        call = {"functionCall": {"name": action.tool, "args": dict(action.arguments)}}
        return [call], f"functionCall {action.tool} {encoded[:200]}"
    return [{"text": action.text}], f"text {action.text!r}"


def filled(schema: Any) -> Any:
    """A value `schema` (Gemini's JSON schema, types in capitals or not) accepts."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        choices = list(schema["enum"])
        return "user" if "user" in choices else choices[0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        properties = schema.get("properties", {})
        return {key: filled(value) for key, value in properties.items()}
    if kind == "array":
        return []
    return {"string": "scripted", "integer": 10, "number": 10, "boolean": False}.get(kind)


class GeminiCli:
    name = "gemini"
    label = "Gemini CLI"
    features: frozenset[str] = frozenset()

    def configure(self, world: World, api_url: str, options: Options) -> None:
        settings = world.home / ".gemini"
        settings.mkdir(parents=True, exist_ok=True)
        user = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        }
        (settings / "settings.json").write_text(json.dumps(user))
        trust = {str(world.project): "TRUST_FOLDER"}  # what answering "trust this folder?" writes
        (settings / "trustedFolders.json").write_text(json.dumps(trust))
        # the README's Gemini CLI block for the server
        mcp_add = ["gemini", "mcp", "add", "-e", world.home_variable, "loopwarden", *SERVE]
        world.add_loopwarden(self.name, mcp_add)

    def session(
        self, world: World, api_url: str, prompt: str, options: Options
    ) -> tuple[list[str], dict[str, str]]:
        argv = ["gemini", "-p", prompt, "--approval-mode", "yolo"]
        return argv, {"GOOGLE_GEMINI_BASE_URL": api_url, "GEMINI_API_KEY": options.key or FAKE_KEY}

    def dialect(self, script: Script) -> Dialect:
        def answer(path: str, body: dict[str, Any]) -> Reply:
            if ":countTokens" in path:
                return json_reply({"totalTokens": 10}, "countTokens")
            config = body.get("generationConfig") or {}
            schema = config.get("responseJsonSchema")
            if ":generateContent" in path and schema is not None:
                value = filled(schema)
                output = script.output_tokens(config.get("maxOutputTokens"))
                return json_reply(
                    _candidate([{"text": json.dumps(value)}], output),
                    f"structured {json.dumps(value)[:200]}",
                )
            if ":streamGenerateContent" not in path and ":generateContent" not in path:
                return NOT_FOUND
            parts, summary = _parts(script.next(conversation(body), tool_call))
            output = script.output_tokens(config.get("maxOutputTokens"))
            if ":streamGenerateContent" in path:
                return sse_reply([(None, _candidate(parts, output))], summary)
            return json_reply(_candidate(parts, output), summary)

        return answer
