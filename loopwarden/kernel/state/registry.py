"""The registry of receipt kinds: every kind's spec, and all that is derived from them.

Each feature declares its kinds' specs (`KindSpec`) next to their data models, fold steps and
judge rules (`loops/loop_kinds.py`, `turns/turn_kinds.py`, …); the application collects them
into one `Kinds` (`loopwarden/catalog.py`), which checks that every `ReceiptKind` has exactly one
spec and derives the rest: each kind's body class (its `kind` literal and `data` model), the
discriminated union that parses a body, and the sets of kinds the fold and the audit ask about.
The kernel never imports a feature: a store, the judge and the audit are given the registry.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal, Union, cast

from pydantic import Field, TypeAdapter, ValidationError, create_model

from loopwarden.kernel.state.events import Fact, ReceiptBody, ReceiptKind
from loopwarden.kernel.state.fold import apply
from loopwarden.kernel.state.rows import LoopView, Touched
from loopwarden.kernel.state.spec import KindSpec

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _collect(families: Iterable[Iterable[KindSpec[Any]]]) -> dict[ReceiptKind, KindSpec[Any]]:
    specs: dict[ReceiptKind, KindSpec[Any]] = {}
    for family in families:
        for spec in family:
            if spec.kind in specs:
                raise TypeError(f"receipt kind {spec.kind} is declared twice")
            if [spec.fold, spec.opens, spec.pool].count(None) != 2:
                raise TypeError(f"receipt kind {spec.kind} needs one of fold, opens and pool")
            specs[spec.kind] = spec
    missing = [str(kind) for kind in ReceiptKind if kind not in specs]
    if missing:
        raise TypeError(f"receipt kinds without a spec: {', '.join(missing)}")
    return {kind: specs[kind] for kind in ReceiptKind}  # in the enum's order


def _body_class(spec: KindSpec[Any]) -> type[ReceiptBody]:
    name = "".join(part.title() for part in re.split(r"[._]", spec.kind)) + "Body"
    kind: Any = Literal[spec.kind.value]  # the one value this body's `kind` may take
    model = create_model(
        name, __base__=ReceiptBody, __module__=__name__, kind=(kind, ...), data=(spec.data, ...)
    )
    return cast(type[ReceiptBody], model)


class Kinds(Mapping[ReceiptKind, KindSpec[Any]]):
    """Every kind's spec, by kind (a `str` lookup works: the kinds are a `StrEnum`), and what is
    derived from them. Immutable once built; `TypeError` if a kind has no spec, two, or a spec
    that neither folds, opens a loop nor belongs to a pool."""

    def __init__(self, *families: Iterable[KindSpec[Any]]) -> None:
        self._specs = _collect(families)
        self.refusals = frozenset(k for k, s in self._specs.items() if s.refusal)
        """Kinds that record a refusal."""
        self.host_kinds = frozenset(k for k, s in self._specs.items() if s.host)
        """Kinds a host's hooks seal (their principal is the agent the hook speaks for)."""
        self.after_close = frozenset(
            k for k, s in self._specs.items() if s.refusal or s.after_close
        )
        """The only receipts a closed loop still takes: refusals, and what a host saw run."""
        self.body_types: dict[str, type[ReceiptBody]] = {
            kind: _body_class(spec) for kind, spec in self._specs.items()
        }
        """Each kind's body class."""
        self.data_models: dict[str, type[Fact]] = {k: s.data for k, s in self._specs.items()}
        """Each kind's data model."""

    def __getitem__(self, kind: str) -> KindSpec[Any]:
        return self._specs[cast(ReceiptKind, kind)]

    def __iter__(self) -> Iterator[ReceiptKind]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    @functools.cached_property
    def _adapter(self) -> TypeAdapter[ReceiptBody]:
        """The union's validator, built on first use (a process that seals one receipt, a
        host hook, never builds it)."""
        union: Any = Annotated[Union[tuple(self.body_types.values())], Field(discriminator="kind")]  # noqa: UP007
        return cast(TypeAdapter[ReceiptBody], TypeAdapter(union))

    def parse_body(self, value: Any) -> ReceiptBody:
        """Validate a decoded receipt payload as its kind's body (raises `ValidationError`)."""
        return self._adapter.validate_python(value)

    def parse_payload(self, payload: bytes) -> ReceiptBody | None:
        """The typed body of a payload in one pass (pydantic parses and validates the JSON
        bytes), or None where that pass fails, or might read it differently from `json.loads`
        then `parse_body`: the caller then takes those two steps, which say what is wrong.
        Those are NaN and Infinity (which `json.loads` reads and a payload may not hold) and
        escaped surrogates; every payload this returns a body for, the two steps read as the
        same body (a property test holds it)."""
        if b"NaN" in payload or b"Infinity" in payload:
            return None
        if b"\\u" in payload and _SURROGATE.search(payload):
            return None
        try:
            return self._adapter.validate_json(payload)
        except ValidationError:
            return None

    def make_body(self, kind: ReceiptKind | str, **fields: Any) -> ReceiptBody:
        """Build the body of one kind from already-typed parts (validated as a parsed body)."""
        return self.body_types[kind].model_validate({"kind": str(kind), **fields})

    def touched(self, body: ReceiptBody) -> Touched:
        """The existing rows `body` reads or changes, so the write path loads only those."""
        spec = self[body.kind]
        return spec.touches(body, body.data)

    def apply(self, view: LoopView | None, body: ReceiptBody, digest: str) -> LoopView:
        """Fold one receipt of a loop into `view` by its kind's spec (`fold.apply`)."""
        return apply(self[body.kind], view, body, digest)

    def rebuild(self, receipts: Iterable[tuple[ReceiptBody, str]]) -> dict[str, LoopView]:
        """Replay (body, digest) pairs in journal order into whole views, one per loop (a
        pool's receipts fold into its row, not into a loop's view)."""
        views: dict[str, LoopView] = {}
        for body, digest in receipts:
            if self[body.kind].pool is None:
                views[body.loop_id] = self.apply(views.get(body.loop_id), body, digest)
        return views
