"""The one runner: every operation, from every edge, applies the same rules in the same order.

1. parse the request (`InvalidInput` names the field; nothing was changed);
2. the caller's role (`Forbidden` for an operation not open to it);
3. visibility: the scope locates the loop the request names; a caller outside that loop gets
   the same `NotFound` as for a loop that does not exist (a write's refusal is still recorded
   for operators, at most one sealed receipt per outsider per loop per window: `outsiders.py`),
   and nothing else;
4. idempotency, only after admission: a repeat with the same arguments returns the stored
   result, the same key with other arguments is refused through the operation's `refuse`;
5. the body, inside one write transaction (or one read snapshot);
6. the result, remembered under the key if there is one.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from loopwarden.errors import (
    Forbidden,
    InvalidInput,
    LoopwardenError,
    NotFound,
    describe_validation,
)
from loopwarden.kernel.runner.idempotency import prior, remember, request_digest
from loopwarden.kernel.runner.operation import (
    AGENT_CALLERS,
    OPERATOR_CALLERS,
    READ,
    WRITE,
    Access,
    Body,
    Call,
    Hints,
    Operation,
    Refuse,
    Req,
    Res,
    Scope,
)
from loopwarden.kernel.runner.outsiders import refuse_outsider
from loopwarden.kernel.runner.visibility import visible
from loopwarden.kernel.state.events import ReceiptKind
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Store, Txn
from loopwarden.observe import Watch
from loopwarden.observe.observer import Attribute
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.principals import Principal, Role

T = TypeVar("T")
CONFLICT = Decision(
    "deny",
    (
        Reason(
            ReasonCode.IDEMPOTENCY_CONFLICT, "this idempotency key was used with other arguments"
        ),
    ),
)


class NeedsPublication(Exception):
    """Raised by a read body asked to wait for a receipt's publication that finds it not yet
    under a stored checkpoint: the runner integrates what is pending and signs a checkpoint
    (`Store.checkpoint`), then runs the body once more (`Call.waited`)."""


class NeedsPrediction(Exception):
    """Raised by a read body whose answer depends on state changes the next write would make
    first (an expired lease, a due stop): the runner re-runs it in a transaction that is
    rolled back, so the answer is exactly what that write would see."""


@dataclass(frozen=True)
class _Hidden:
    """What the request names does not exist, or the caller is outside its loop: answered
    `NotFound` (alike for both) once the transaction has committed."""

    message: str


def parse(op: Operation[Req, Res], request: Req | dict[str, Any]) -> Req:
    if isinstance(request, op.request):
        return request
    try:
        return op.request.model_validate(request)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc)) from None


def check_role(op: Operation[Any, Any], who: Principal) -> None:
    if who.role in op.callers:
        return
    if op.callers == OPERATOR_CALLERS:
        raise Forbidden(f"{op.name} is an operator operation; {who.id!r} is an {who.role}")
    raise Forbidden(f"{op.name} is not open to the {who.role} role")


async def run(
    op: Operation[Req, Res], store: Store, who: Principal, request: Req | dict[str, Any]
) -> Res:
    """Run `op` for `who` (see the module docstring for the order). Policy refusals are
    results; `InvalidInput`, `Forbidden`, `NotFound`, `Conflict` and store errors raise.

    The call is watched by the store's observer (a span `loopwarden.<op>`, metrics) with the
    identifiers and codes of what was decided, never the request's content."""
    with store.observer.watch(op.name, caller_attributes(op, who)) as watch:
        try:
            req = parse(op, request)
            check_role(op, who)
            if op.access == "write":
                with store.observer.store_write(op.name, store.location.backend.name):
                    outcome: Res | _Hidden = await store.write(
                        lambda tx: _counted(watch, tx, lambda: _write(op, store, who, req, tx))
                    )
            else:
                outcome = await _read(op, store, who, req)
            if isinstance(outcome, _Hidden):
                raise NotFound(outcome.message + await _hint(op, store, who, req))
        except LoopwardenError as exc:
            watch.decided("error", (exc.code,))
            raise
        observed(watch, req, outcome)
        return outcome


def caller_attributes(op: Operation[Any, Any], who: Principal) -> dict[str, Attribute]:
    """A watch's first attributes: the operation and who calls it."""
    return {
        "loopwarden.operation": op.name,
        "loopwarden.agent": who.id,
        "loopwarden.role": who.role,
    }


def _counted(watch: Watch, tx: Txn, body: Callable[[], T]) -> T:
    """`body()`, with the lease expiries it sealed counted on `watch` (set, not added: a
    retried body counts once)."""
    result = body()
    watch.expired_leases = tx.sealed_kinds.count(ReceiptKind.LEASE_EXPIRED)
    return result


def observed(watch: Watch, req: Any, result: Any) -> None:
    """What `result` decided, as identifiers and codes on `watch`: the loop, the effect
    (`granted`/`accepted`/`decision`; `ok` for a call that decides nothing), the reason
    codes, the receipt id and seq."""
    if not watch.active:
        return
    effect = "ok"
    for flag in ("granted", "accepted"):
        value = getattr(result, flag, None)
        if isinstance(value, bool):
            watch.attributes[f"loopwarden.{flag}"] = value
            effect = "allow" if value else "deny"
    decision = getattr(result, "decision", None)
    if decision in ("allow", "deny"):
        effect = decision
    codes = (getattr(r, "code", None) for r in getattr(result, "reasons", None) or ())
    reasons = tuple(str(getattr(c, "value", c)) for c in codes if c is not None)
    watch.decided(effect, reasons)
    for name in ("loop_id", "receipt_id", "seq"):
        value = getattr(result, name, None) or getattr(req, name, None)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            watch.attributes[f"loopwarden.{name}"] = value


async def _hint(op: Operation[Req, Res], store: Store, who: Principal, req: Req) -> str:
    """The scope's hint for a request naming what the caller cannot find, read after the
    transaction (a scan of the loops never holds the write lock)."""
    hint = op.scope.hint if op.scope is not None else None
    if hint is None:
        return ""
    return await store.read(lambda reader: hint(reader, who, req))


def run_now(
    op: Operation[Req, Res], store: Store, who: Principal, request: Req | dict[str, Any]
) -> Res:
    """`run` for a write operation, on the calling thread (`Store.write_now`): the same rules
    in the same order, for a process that makes one call and exits (a host hook)."""
    if op.access != "write":
        raise TypeError(f"{op.name} is not a write operation")
    req = parse(op, request)
    check_role(op, who)
    with store.observer.watch(op.name, caller_attributes(op, who)) as watch:
        try:
            outcome: Res | _Hidden = store.write_now(
                lambda tx: _counted(watch, tx, lambda: _write(op, store, who, req, tx))
            )
            if isinstance(outcome, _Hidden):
                raise NotFound(outcome.message)
        except LoopwardenError as exc:
            watch.decided("error", (exc.code,))
            raise
        observed(watch, req, outcome)
        return outcome


def _write(
    op: Operation[Req, Res], store: Store, who: Principal, req: Req, tx: Txn
) -> Res | _Hidden:
    # The scope first: locating the loop takes its row (on PostgreSQL), and the transaction's
    # time is read after that (`Txn.now`), never before another writer of the loop committed.
    found = op.scope.locate(tx.rows, req) if op.scope is not None else None
    call: Call[Txn] = Call(tx, store, who, tx.now, found=found)
    if op.scope is not None:
        if call.found is None:  # nothing was written: answered like a hidden loop, after
            return _Hidden(op.scope.missing(req))
        if not visible(tx.rows, who, call.found.loop):
            if op.refuse is not None:  # recorded for operators, bounded; the caller learns nothing
                refuse_outsider(call, op.refuse, req)
            return _Hidden(op.scope.missing(req))
    key: str | None = getattr(req, "idempotency_key", None)
    digest = request_digest(op.name, req) if key is not None else ""
    if key is not None:
        earlier = prior(tx.rows, who.id, key)
        if earlier is not None:
            if earlier.repeats(op.name, digest):
                return op.result.model_validate_json(earlier.response)
            assert op.refuse is not None, f"{op.name} takes a key but cannot refuse"
            return op.refuse(call, req, CONFLICT)
    result: Res = op.body(call, req)
    if key is not None and op.remember(result):
        remember(tx, who.id, key, op.name, digest, result)
    return result


async def _read(op: Operation[Req, Res], store: Store, who: Principal, req: Req) -> Res | _Hidden:
    now = store.clock()
    try:
        return await store.read(lambda reader: _read_body(op, Call(reader, store, who, now), req))
    except NeedsPublication:
        await store.checkpoint()

        def again(reader: Reader) -> Call[Reader]:
            return Call(reader, store, who, store.clock(), waited=True)

        return await store.read(lambda reader: _read_body(op, again(reader), req))
    except NeedsPrediction:
        return await store.simulate(lambda tx: _read_body(op, _predicting(tx, store, who), req))


def _predicting(tx: Txn, store: Store, who: Principal) -> Call[Any]:
    """A read body's call in a write transaction that is rolled back (`NeedsPrediction`): the
    body reads through `call.rows` (proved), and may play the writes it predicts."""
    return Call(tx, store, who, tx.now, predicting=True)


def _read_body(op: Operation[Req, Res], call: Call[Reader], req: Req) -> Res | _Hidden:
    if op.scope is not None:
        call.found = op.scope.locate(call.tx.rows, req)
        if call.found is None or not visible(call.tx.rows, call.who, call.found.loop):
            return _Hidden(op.scope.missing(req))
    result: Res = op.body(call, req)
    return result


def operation(
    *,
    access: Access,
    scope: Scope | None = None,
    callers: frozenset[Role] = AGENT_CALLERS,
    hints: Hints | None = None,
    refuse: Refuse[Any, Any] | None = None,
    remember: Callable[[Any], bool] | None = None,
    tool: bool = True,
    name: str | None = None,
) -> Callable[[Body[Req, Res]], Operation[Req, Res]]:
    """Declare an operation from its body `def claim(call, req: Request) -> Result`.

    Its name (the function's, unless given), request and result models and description are
    read from the body, so each is written once. As in FastAPI, the docstring up to a form
    feed (a `\\f` line) is what clients are told; the rest is the developer's contract.
    """

    def declare(body: Body[Req, Res]) -> Operation[Req, Res]:
        hints_of = typing.get_type_hints(body)
        description = inspect.cleandoc(body.__doc__ or "").split("\f")[0].strip()
        if not description:
            raise TypeError(f"operation {body.__name__} has no docstring to tell clients about it")
        return Operation(
            name=name or body.__name__,
            request=hints_of["req"],
            result=hints_of["return"],
            body=body,
            access=access,
            scope=scope,
            callers=callers,
            hints=hints or (READ if access == "read" else WRITE),
            description=description,
            refuse=refuse,
            remember=remember or (lambda result: True),
            tool=tool,
            runner=run,
        )

    return declare
