"""A receipt kind's spec: everything that says what one kind is and how it applies.

One `KindSpec` per `ReceiptKind`, declared by its feature beside its data model, fold step and
judge rule (`loops/loop_kinds.py`, `turns/turn_kinds.py`, …), and collected in one registry
(`registry.py`, built in `loopwarden/catalog.py`) from which every set of kinds and the body
union are derived. A spec is generic in its data model `D`: its fold step, judge rule and
touches take a `D`, so the type checker holds each step to the data its kind carries. A spec names: the kind's data model, the rows it touches, how the fold applies it, how
the judge rules on its decision, the roles that may cause it, and whether it records a refusal,
is sealed by a host's hooks, or is still taken by a closed loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from loopwarden.kernel.state.events import Fact, ReceiptBody, ReceiptKind
from loopwarden.kernel.state.rows import LoopView, Touched
from loopwarden.principals import ROLES, Role

if TYPE_CHECKING:
    from loopwarden.kernel.state.legality import Judging, Verdict

D = TypeVar("D", bound=Fact)
"""A kind's data model."""

Touches = Callable[[ReceiptBody, D], Touched]
"""The existing rows a receipt (its body and data) reads or changes."""
Fold = Callable[[LoopView, ReceiptBody, D], None]
"""Apply one receipt to a loop's view (mutating it); raises `FoldError` if it is impossible."""
Open = Callable[[ReceiptBody, D], LoopView]
"""Make a loop's first view from its opening receipt."""
Rule = Callable[["Judging", LoopView, ReceiptBody, D], "list[Verdict]"]
"""Judge a receipt's recorded decision against the replayed view before it is folded."""
OpenRule = Callable[[ReceiptBody, D], "list[Verdict]"]
"""Judge an opening receipt (there is no view yet)."""
Remember = Callable[["Judging", LoopView, ReceiptBody, D], None]
"""After the fold: what later receipts of the loop are judged against."""

ANYONE: frozenset[Role] = frozenset(ROLES)
AGENTS: frozenset[Role] = frozenset({"agent", "operator"})  # an agent, or an operator acting
OPERATORS: frozenset[Role] = frozenset({"operator"})
OBSERVERS: frozenset[Role] = frozenset({"observer"})  # a host's hooks, for one agent


def no_rows(body: ReceiptBody, data: Any) -> Touched:
    return Touched()


def touching(**rows: str) -> Touches[Any]:
    """The `touches` of a kind whose data names one row of each sort it touches:
    `touching(todos="todo_id", turns="turn_id")` touches the todo `data.todo_id` and the turn
    `data.turn_id` (each keyword a field of `Touched`, each value a field of the kind's data)."""

    def touches(body: ReceiptBody, data: Any) -> Touched:
        return Touched(**{sort: frozenset([getattr(data, name)]) for sort, name in rows.items()})

    return touches


@dataclass(frozen=True)
class Opening(Generic[D]):
    """How an opening kind (`loop.opened`) makes a view, and how its decision is judged."""

    view: Open[D]
    judge: OpenRule[D]


@dataclass(frozen=True)
class PoolStep:
    """How a pool's kind applies (to the pool's row, not a loop's view) and how it is judged:
    `judge` returns what is wrong with the receipt's decision (its caller is checked apart)."""

    fold: Callable[[Any, ReceiptBody, str], Any]  # (PoolRow | None, body, digest) -> PoolRow
    judge: Callable[[ReceiptBody], list[str]]


@dataclass(frozen=True)
class KindSpec(Generic[D]):
    """One receipt kind: see the module docstring. Exactly one of `fold`, `opens` and `pool`
    (a budget pool's kind) is set; a spec without a `judge` rule (or an `opens.judge`) is
    judged `unjudged`, never legal."""

    kind: ReceiptKind
    data: type[D]
    callers: frozenset[Role]
    touches: Touches[D] = no_rows
    fold: Fold[D] | None = None
    judge: Rule[D] | None = None
    opens: Opening[D] | None = None
    pool: PoolStep | None = None
    remember: Remember[D] | None = None
    refusal: bool = False
    host: bool = False
    after_close: bool = False  # a closed loop still takes it (it takes every refusal)
    sweeps: bool = False  # releases a stale turn (a refusal right after may be about it)
