"""The registry of receipt kinds: every kind's spec, and all that is derived from them.

Each family module of `kinds/` declares its kinds' specs (`KindSpec`) next to their fold steps
and judge rules; this module collects them, checks that every `ReceiptKind` has exactly one,
and derives the rest: each kind's body class (its `kind` literal and `data` model), the
discriminated union that parses a body, and the sets of kinds the fold and the audit ask about.
A new kind is an enum entry and a data model (`events.py`) and a spec in its family module.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal, Union, cast

from pydantic import Field, TypeAdapter, ValidationError, create_model

from loopwarden.ledger.state.events import Fact, ReceiptBody, ReceiptKind
from loopwarden.ledger.state.kinds import approvals, hosts, loops, pools, requests, todos, turns
from loopwarden.ledger.state.spec import KindSpec

FAMILIES = (loops, turns, approvals, todos, requests, hosts, pools)


def _collect() -> dict[ReceiptKind, KindSpec]:
    specs: dict[ReceiptKind, KindSpec] = {}
    for family in FAMILIES:
        for spec in family.SPECS:
            if spec.kind in specs:
                raise TypeError(f"receipt kind {spec.kind} is declared twice")
            if [spec.fold, spec.opens, spec.pool].count(None) != 2:
                raise TypeError(f"receipt kind {spec.kind} needs one of fold, opens and pool")
            specs[spec.kind] = spec
    missing = [str(kind) for kind in ReceiptKind if kind not in specs]
    if missing:
        raise TypeError(f"receipt kinds without a spec: {', '.join(missing)}")
    return specs


KINDS: dict[ReceiptKind, KindSpec] = _collect()
"""Every kind's spec, by kind (a `str` lookup works: the kinds are a `StrEnum`)."""

REFUSALS = frozenset(k for k, s in KINDS.items() if s.refusal)
"""Kinds that record a refusal."""
HOST_KINDS = frozenset(k for k, s in KINDS.items() if s.host)
"""Kinds a host's hooks seal (their principal is the agent the hook speaks for)."""
AFTER_CLOSE = frozenset(k for k, s in KINDS.items() if s.refusal or s.after_close)
"""The only receipts a closed loop still takes: refusals, and what a host saw run."""


def _body_class(spec: KindSpec) -> type[ReceiptBody]:
    name = "".join(part.title() for part in re.split(r"[._]", spec.kind)) + "Body"
    kind: Any = Literal[spec.kind.value]  # the one value this body's `kind` may take
    model = create_model(
        name, __base__=ReceiptBody, __module__=__name__, kind=(kind, ...), data=(spec.data, ...)
    )
    return cast(type[ReceiptBody], model)


BODY_TYPES: dict[str, type[ReceiptBody]] = {kind: _body_class(spec) for kind, spec in KINDS.items()}
"""Each kind's body class."""
DATA_MODELS: dict[str, type[Fact]] = {kind: spec.data for kind, spec in KINDS.items()}
"""Each kind's data model."""

_UNION: Any = Annotated[Union[tuple(BODY_TYPES.values())], Field(discriminator="kind")]  # noqa: UP007


@functools.cache
def _body_adapter() -> TypeAdapter[ReceiptBody]:
    """The union's validator, built once on first use (a process that seals one receipt, a host
    hook, pays only for what it touches)."""
    return cast(TypeAdapter[ReceiptBody], TypeAdapter(_UNION))


def parse_body(value: Any) -> ReceiptBody:
    """Validate a decoded receipt payload as its kind's body (raises pydantic `ValidationError`)."""
    return _body_adapter().validate_python(value)


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_payload(payload: bytes) -> ReceiptBody | None:
    """The typed body of a payload in one pass (pydantic parses and validates the JSON bytes),
    or None where that pass fails, or might read it differently from `json.loads` then
    `parse_body`: the caller then takes those two steps, which say what is wrong. Those are
    NaN and Infinity (which `json.loads` reads and a payload may not hold) and escaped
    surrogates; every payload this returns a body for, the two steps read as the same body (a
    property test holds it)."""
    if b"NaN" in payload or b"Infinity" in payload:
        return None
    if b"\\u" in payload and _SURROGATE.search(payload):
        return None
    try:
        return _body_adapter().validate_json(payload)
    except ValidationError:
        return None


def make_body(kind: ReceiptKind | str, **fields: Any) -> ReceiptBody:
    """Build the body of one kind from already-typed parts (validated like any parsed body)."""
    return BODY_TYPES[kind].model_validate({"kind": str(kind), **fields})
