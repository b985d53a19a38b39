"""The scripted model: what it does next, read off the conversation a host sent.

A host sends the whole conversation with every model request. Each host's dialect reads it into
a host-neutral `Conversation` (the opening user text, the tool calls made so far with the
results the host gave back, the tools it declared) and the scenario's `Script` says the next
`Action`: a tool call (`Call`, host-neutral; the dialect names it as its host does) or a final
text (`Say`). The script is picked by a marker in the opening text (`script:NAME`), so a
subagent or a second session follows a script of its own; the step is the number of tool
results already in the conversation, so a request the host repeats (after a Stop hook blocked,
say) gets the same answer. A request with no marker (a host's side request: a title, a router)
is answered with a plain text.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MARKER = re.compile(r"script:([a-z][a-z0-9-]*)")


class ScriptError(Exception):
    """The conversation is not what the script expected (a claim not granted, say)."""


@dataclass(frozen=True)
class Exchange:
    """One tool call the model made and the result the host gave back for it."""

    tool: str  # the host's name of the tool
    arguments: Mapping[str, Any]
    result: str  # the result's text, as the model saw it
    error: bool = False


@dataclass(frozen=True)
class Conversation:
    opening: str  # the user's text before the model's first turn
    exchanges: tuple[Exchange, ...]
    tools: frozenset[str]  # the tool names the host declared (deferred ones too)

    def script_name(self) -> str | None:
        found = MARKER.search(self.opening)
        return found[1] if found else None


@dataclass(frozen=True)
class Call:
    """A tool call by what it does; each host's dialect names it as that host does.

    `kind`: `shell` (`command`), `loopwarden` (`tool`, `arguments`: one of loopwarden's MCP
    tools), `downstream` (`tool` as the MCP gateway serves it, `S__T`; `arguments`), `tool_search` (`names`: host tools to load), `subagent` (`prompt`), `subagent_wait`
    (`agent`: the id a spawn answered)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Named:
    """A call as the host names it: the tool's name and its arguments."""

    tool: str
    arguments: Mapping[str, Any]


Action = Call | Say
Step = Callable[[Conversation, "Memory"], Action]
Resolver = Callable[[Call, Conversation], Named]  # a dialect's naming; ScriptError if it cannot


class Memory:
    """What one scenario's model saw and noted, shared by every conversation it serves (a
    second session remembers the first one's turn), safe across the server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.notes: dict[str, Any] = {}
        self.latest: dict[str, Conversation] = {}  # by script name: the fullest history seen
        self.errors: list[str] = []
        # The operator's side, for a step that acts between the model's calls (approves an
        # approval, say): runs one command in the world, answers its stdout (set by the harness).
        self.operator: Callable[..., str] | None = None

    def saw(self, name: str, conversation: Conversation) -> None:
        with self._lock:
            known = self.latest.get(name)
            if known is None or len(conversation.exchanges) >= len(known.exchanges):
                self.latest[name] = conversation

    def failed(self, message: str) -> None:
        with self._lock:
            if message not in self.errors:
                self.errors.append(message)

    def exchanges(self, name: str) -> tuple[Exchange, ...]:
        with self._lock:
            known = self.latest.get(name)
        return known.exchanges if known else ()


@dataclass(frozen=True)
class Script:
    """A scenario's model: per script name, its steps in order; then it says it is done."""

    steps: Mapping[str, tuple[Step, ...]]
    memory: Memory = field(default_factory=Memory)
    # The output tokens every answer reports: 5, or with a cap, the request's own limit up to
    # the cap (so that a gateway's reservation is exactly what the answer then costs).
    output_cap: int | None = None
    reported: list[int] = field(default_factory=list)  # the output tokens each answer reported

    def output_tokens(self, requested: Any) -> int:
        output = 5
        if self.output_cap is not None:
            limit = requested if isinstance(requested, int) and requested > 0 else self.output_cap
            output = min(limit, self.output_cap)
        self.reported.append(output)  # list.append is atomic: the fake's threads may race
        return output

    def next(self, conversation: Conversation, resolve: Resolver) -> Named | Say:
        """The model's answer to `conversation`: a call named by `resolve`, or a text (the
        script's end, or why it stopped, noted in memory)."""
        name = conversation.script_name()
        if name is None or name not in self.steps:
            return Say("ok")
        self.memory.saw(name, conversation)
        steps = self.steps[name]
        done = len(conversation.exchanges)
        if done >= len(steps):
            return Say(f"script {name}: done")
        try:
            action = steps[done](conversation, self.memory)
            return resolve(action, conversation) if isinstance(action, Call) else action
        except ScriptError as exc:
            self.memory.failed(f"script {name}, step {done + 1}: {exc}")
            return Say(f"script {name} stopped: {exc}")


def declared(conversation: Conversation, *candidates: str) -> str:
    """The first of `candidates` the host declared as a tool; ScriptError if none is (a model
    calls only tools it was given)."""
    for name in candidates:
        if name in conversation.tools:
            return name
    raise ScriptError(f"the host declared none of {', '.join(candidates)}")


def declared_own(conversation: Conversation, tool: str) -> str:
    """The host's name of loopwarden's MCP tool `tool`, among the tools it declared."""
    names = sorted(n for n in conversation.tools if own_tool(n, tool))
    if not names:
        raise ScriptError(f"the host declared no loopwarden {tool} tool (is the MCP server up?)")
    return names[0]


def result_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in a tool result's text (loopwarden's tools answer with one)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def own_tool(tool: str, name: str) -> bool:
    """Whether a host's tool name is loopwarden's MCP tool `name` (each host spells it its way:
    `mcp__loopwarden__claim`, `mcp_loopwarden_claim`, …)."""
    return "loopwarden" in tool and re.search(rf"(^|[_/.]){re.escape(name)}$", tool) is not None


def loopwarden_result(conversation: Conversation, tool: str) -> dict[str, Any]:
    """The JSON result of the conversation's latest call of loopwarden's `tool`."""
    for exchange in reversed(conversation.exchanges):
        if own_tool(exchange.tool, tool):
            found = result_json(exchange.result)
            if found is None:
                raise ScriptError(f"{tool} answered no JSON: {exchange.result[:200]!r}")
            return found
    raise ScriptError(f"no {tool} call in the conversation")


def shell(command: str) -> Step:
    return lambda conversation, memory: Call("shell", {"command": command})


def claim(loop_id: str) -> Step:
    def step(conversation: Conversation, memory: Memory) -> Action:
        return Call("loopwarden", {"tool": "claim", "arguments": {"loop_id": loop_id}})

    return step


def granted_turn(conversation: Conversation, memory: Memory) -> dict[str, Any]:
    """The turn the conversation's claim was granted (noted in memory for a later session), or
    the one a previous session noted."""
    if not any(own_tool(e.tool, "claim") for e in conversation.exchanges):
        if "turn" not in memory.notes:
            raise ScriptError("no turn was claimed in this session or before")
        return dict(memory.notes["turn"])
    answer = loopwarden_result(conversation, "claim")
    if answer.get("granted") is not True:
        reasons = [r.get("code") for r in answer.get("reasons", []) if isinstance(r, dict)]
        raise ScriptError(f"claim was not granted: {reasons}")
    memory.notes["turn"] = {"turn_id": answer["turn_id"], "fence": answer["fence"]}
    return dict(memory.notes["turn"])


def update(
    used: Mapping[str, int], *, outcome: str = "progress", model_calls: int | None = 1
) -> Step:
    """Report the turn as having used `used` (policy name → calls): honest or not, the
    scenario says; `model_calls` None leaves the model usage out (a gateway observed it). The
    approvals an operator granted during the turn (`approve_then`) are cited."""

    def step(conversation: Conversation, memory: Memory) -> Action:
        turn = granted_turn(conversation, memory)
        calls = sum(used.values())
        arguments = {
            **turn,
            "outcome": outcome,
            "tools_used": [{"name": name, "count": count} for name, count in used.items()],
            "usage": {"tool_calls": calls}
            | ({"model_calls": model_calls} if model_calls is not None else {}),
            "evidence": [{"kind": "log", "summary": "scripted turn"}],
            "summary": f"scripted turn with {calls} tool call(s)",
            "idempotency_key": f"update-{turn['turn_id']}",
        }
        if memory.notes.get("approvals"):
            arguments["approval_ids"] = list(memory.notes["approvals"])
        return Call("loopwarden", {"tool": "update", "arguments": arguments})

    return step


def note_turn(conversation: Conversation, memory: Memory) -> Action:
    """A first session's last word: it remembers its turn and stops mid-turn."""
    granted_turn(conversation, memory)
    return Say("stopping mid-turn; a new session goes on with it")


def tool_search(*names: str) -> Step:
    return lambda conversation, memory: Call("tool_search", {"names": names})


def subagent(prompt: str) -> Step:
    return lambda conversation, memory: Call("subagent", {"prompt": prompt})


def wait_subagent(conversation: Conversation, memory: Memory) -> Action:
    """Wait for the subagent the last call spawned (hosts whose spawn returns at once)."""
    spawned = conversation.exchanges[-1] if conversation.exchanges else None
    answer = result_json(spawned.result) if spawned else None
    if not answer or not isinstance(answer.get("agent_id"), str):
        raise ScriptError(
            f"the spawn answered no agent_id: {spawned.result[:160] if spawned else None!r}"
        )
    return Call("subagent_wait", {"agent": answer["agent_id"]})


def downstream(tool: str, arguments: Mapping[str, Any]) -> Step:
    """Call a downstream tool through loopwarden's MCP gateway (`tool`: `S__T`)."""
    return lambda conversation, memory: Call(
        "downstream", {"tool": tool, "arguments": dict(arguments)}
    )


APPROVAL = re.compile(r"appr-[0-9a-f]{20}")


def approve_then(tool: str, arguments: Mapping[str, Any]) -> Step:
    """The operator approves the approval the previous call's refusal names (`loopwarden
    approve ID`, once, however often the host repeats the request), then the model calls `tool`
    again; the approval is noted for the turn's update to cite."""

    def step(conversation: Conversation, memory: Memory) -> Action:
        last = conversation.exchanges[-1] if conversation.exchanges else None
        found = APPROVAL.search(last.result) if last else None
        if last is None or found is None or "approval_required" not in last.result:
            shown = last.result[:200] if last else None
            raise ScriptError(f"the previous call was not refused for an approval: {shown!r}")
        approvals: list[str] = memory.notes.setdefault("approvals", [])
        if found[0] not in approvals:
            if memory.operator is None:
                raise ScriptError("no operator side to approve the approval")
            try:
                memory.operator("loopwarden", "approve", found[0], "--as", "ci-operator")
            except Exception as exc:  # the operator's command failed: the script stops there
                raise ScriptError(f"`loopwarden approve {found[0]}` failed: {exc}") from exc
            approvals.append(found[0])
        return Call("downstream", {"tool": tool, "arguments": dict(arguments)})

    return step
