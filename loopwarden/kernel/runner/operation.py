"""The declaration of a governance operation, made once and read by every edge.

An `Operation` names the request and result models, who may call it, how its request names a
loop (its *scope*, which decides visibility), how it seals a refusal, what an MCP client is told
about it (description and hints), and the function that does the work. The runner
(`runner.py`) applies the cross-cutting rules in one order for all of them; the MCP tools, the
typed agent client and the CLI are derived from these declarations. The `@operation`
decorator that makes one lives with the runner (`runner.py`).

    @operation(access="write", scope=by_loop, refuse=_refuse)
    def claim(call: Call[Txn], req: ClaimRequest) -> ClaimResult:
        '''Start a turn: ... (what clients are told)
        \\f
        Admit one turn, or refuse it ... (the developer's contract)'''

    result = await claim(store, principal, ClaimRequest(loop_id="ship"))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from loopwarden.kernel.state.rows import ApprovalRow, LoopRow, TurnRow
from loopwarden.kernel.store.reader import JournalRow, Reader, Rows
from loopwarden.kernel.store.store import Store, Txn
from loopwarden.policy.decision import Decision
from loopwarden.principals import Principal, Role

Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound=BaseModel)
R = TypeVar("R", Reader, Txn)
Access = Literal["read", "write"]

AGENT_CALLERS: frozenset[Role] = frozenset({"agent", "operator"})
OPERATOR_CALLERS: frozenset[Role] = frozenset({"operator"})
OBSERVER_CALLERS: frozenset[Role] = frozenset({"observer"})  # a host's hooks, for one agent


@dataclass(frozen=True)
class Hints:
    """What a client may assume (MCP tool annotations): no effect, safe to repeat, destructive."""

    read_only: bool
    idempotent: bool
    destructive: bool = False


READ = Hints(read_only=True, idempotent=True)
WRITE = Hints(read_only=False, idempotent=False)
IDEMPOTENT_WRITE = Hints(read_only=False, idempotent=True)


@dataclass(frozen=True)
class Located:
    """The rows a request names, found before visibility is decided."""

    loop: LoopRow
    turn: TurnRow | None = None
    approval: ApprovalRow | None = None
    receipt: JournalRow | None = None


@dataclass(frozen=True)
class Scope:
    """How a request names its loop. `locate` returns None when what it names does not exist;
    `missing` is the one message for "does not exist" and "not yours" alike, and `hint` (if
    any) what to add to it, from what the caller may see (so that it is alike in both cases
    too): "; did you mean 'release'?"."""

    locate: Callable[[Rows, Any], Located | None]
    missing: Callable[[Any], str]
    hint: Callable[[Reader, Principal, Any], str] | None = None


@dataclass
class Call(Generic[R]):
    """One running call: the transaction (`Txn`) or snapshot (`Reader`) it runs in, who calls,
    when, and the rows its scope located (already visible to the caller)."""

    tx: R
    store: Store
    who: Principal
    now: datetime
    found: Located | None = None
    predicting: bool = False
    waited: bool = False  # a read run again after `NeedsPublication`

    @property
    def loop(self) -> LoopRow:
        """The located loop as it stands now: in a write transaction, after whatever this
        call has appended so far (the transaction caches loop rows, so this costs no query)."""
        if self.found is None:
            raise LookupError("this operation has no loop scope")
        if isinstance(self.tx, Txn):
            return self.tx.rows.loop_row(self.found.loop.loop_id) or self.found.loop
        return self.found.loop

    @property
    def rows(self) -> Rows:
        """What the call decides on: its transaction's proved rows, or its snapshot."""
        return self.tx.rows

    @property
    def turn(self) -> TurnRow:
        """The located turn, as it was when the call began."""
        if self.found is None or self.found.turn is None:
            raise LookupError("this operation has no turn scope")
        return self.found.turn


Body = Callable[[Call[Any], Req], Res]
"""An operation's work: its call (a write's transaction or a read's snapshot) and request in,
its result out."""
Refuse = Callable[[Call[Any], Req, Decision], Res]
"""How an operation seals a refusal decided before its body runs (a reused key, an outsider)."""
Runner = Callable[["Operation[Req, Res]", Store, Principal, "Req | dict[str, Any]"], Awaitable[Res]]


@dataclass(frozen=True)
class Operation(Generic[Req, Res]):
    name: str
    request: type[Req]
    result: type[Res]
    body: Body[Req, Res]
    access: Access
    scope: Scope | None
    callers: frozenset[Role]
    hints: Hints
    description: str
    runner: Runner[Req, Res] = field(repr=False)
    refuse: Refuse[Req, Res] | None = None
    remember: Callable[[Res], bool] = field(default=lambda result: True)
    tool: bool = True

    @property
    def idempotency(self) -> Literal["none", "optional", "required"]:
        """Derived from the request model: does it carry an `idempotency_key`, and must it?"""
        key = self.request.model_fields.get("idempotency_key")
        if key is None:
            return "none"
        return "required" if key.is_required() else "optional"

    async def __call__(self, store: Store, who: Principal, request: Req | dict[str, Any]) -> Res:
        """Run this operation through the runner it was declared with (`runner.run`)."""
        return await self.runner(self, store, who, request)
