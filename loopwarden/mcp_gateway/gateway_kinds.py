"""The MCP gateway's own receipt kind: a downstream tool whose description changed after it was
pinned (`mcp.tool_changed`). The gateway's decisions on calls and what the calls came to are the
hook path's kinds (`tool.admitted`, `tool.refused`, `tool.observed`, `host.attached`, in
`hosts/host_kinds.py`), whose `host` is `mcp-gateway`."""

from __future__ import annotations

from pydantic import Field

from loopwarden.hosts.host_kinds import HostSession, HostToolName
from loopwarden.kernel.state.events import Digest, Fact, ReceiptBody, ReceiptKind, ToolName
from loopwarden.kernel.state.legality import Judging, Verdict, VerdictRule
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.state.spec import OBSERVERS, KindSpec


class ToolChanged(Fact):
    """A downstream tool the gateway saw with a description other than its pin: both digests
    (name, description and input schema; never the text). The tool is hidden and refused until
    an operator pins it again."""

    server: str = Field(min_length=1, max_length=64)
    host_tool: HostToolName  # as the gateway names it, `mcp__<server>__<tool>`
    tool: ToolName  # its policy name
    pinned_digest: Digest
    seen_digest: Digest
    session_id: HostSession


def _fold(view: LoopView, body: ReceiptBody, data: ToolChanged) -> None:
    """Nothing to fold: a change refuses the tool by the pins, not by the loop's state."""


def _judge(ctx: Judging, view: LoopView, body: ReceiptBody, data: ToolChanged) -> list[Verdict]:
    found = []
    if view.policy.observe_mode == "off":
        found.append(Verdict(VerdictRule.OBSERVE_OFF, "mcp.tool_changed in a loop observing none"))
    if data.pinned_digest == data.seen_digest:
        found.append(Verdict(VerdictRule.TOOL_NAME, "a change whose two digests are equal"))
    if body.decision.effect != "deny" or body.turn_id is not None:
        found.append(Verdict(VerdictRule.EFFECT, "a tool change is a refusal of no turn"))
    if not data.host_tool.startswith(f"mcp__{data.server}__"):
        found.append(Verdict(VerdictRule.TOOL_NAME, f"{data.host_tool} is not {data.server}'s"))
    return found


SPECS = (
    KindSpec(
        ReceiptKind.MCP_TOOL_CHANGED,
        ToolChanged,
        callers=OBSERVERS,
        fold=_fold,
        judge=_judge,
        after_close=True,
    ),
)
