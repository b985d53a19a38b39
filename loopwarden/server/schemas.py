"""Output schemas as clients validate them: pydantic's JSON Schema, made flat and cheap to check.

An MCP client validates every structured result against the tool's output schema, on every
call. Pydantic writes unions as `anyOf` (`int | float | None` is three branches, each tried and
each failure a new error object) and shared models as `$ref`s into `$defs` (resolved per
instance). `slim` rewrites a schema into one that accepts exactly the same instances with
neither: references inlined, `integer | number` as `number` (JSON Schema's `number` includes
integers). A union that still has two types stays an `anyOf` of single-type branches (`X | None`
is `{"anyOf": [X, {"type": "null"}]}`), never a type list (`"type": ["string", "null"]`): a
client that maps tool schemas onto a single-`type` dialect (the OpenAPI subset of Gemini's
function declarations) may reject a list or drop its constraints, and the MCP Inspector's
`--strict` warns about each. Anything else stays as it was. Titles, which only repeat field
names, are dropped; descriptions stay.
"""

from __future__ import annotations

import copy
from typing import Any

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated"})
_VALUES = frozenset({"enum", "const", "default", "examples", "required"})  # data, not schemas


def slim(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema accepting exactly the instances `schema` accepts, without `$ref`s into its own
    `$defs` or the `anyOf` unions described above (see the module docstring)."""
    defs = schema.get("$defs", {})
    out: dict[str, Any] = _slim({k: v for k, v in schema.items() if k != "$defs"}, defs, ())
    if _refers(out):  # a recursive model: keep the definitions it still needs
        out["$defs"] = {name: _slim(d, defs, (name,)) for name, d in defs.items()}
    return out


def _refers(node: Any) -> bool:
    if isinstance(node, dict):
        return "$ref" in node or any(_refers(v) for v in node.values())
    if isinstance(node, list):
        return any(_refers(v) for v in node)
    return False


def _slim(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_slim(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    inlined = _inline(node, defs, seen)
    if inlined is not None:
        return inlined
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in ("properties", "$defs", "patternProperties"):  # maps of names to schemas
            out[key] = {name: _slim(v, defs, seen) for name, v in value.items()}
        elif key in _VALUES:
            out[key] = value
        else:
            out[key] = _slim(value, defs, seen)
    if "anyOf" in out:
        out = _merge_union(out)
    return out


def _inline(
    node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...]
) -> dict[str, Any] | None:
    """`{"$ref": "#/$defs/X", ...}` as X's keywords plus its siblings (both slim), when they do
    not clash; None for any other node, and for a reference to a definition being inlined."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return None
    name = ref.removeprefix("#/$defs/")
    target = defs.get(name)
    if not isinstance(target, dict) or name in seen:
        return None  # unknown or recursive: left as a reference
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    if any(k in target and k not in _ANNOTATIONS for k in siblings):
        return None
    inlined = _slim(copy.deepcopy(target), defs, (*seen, name))
    return {**inlined, **_slim(siblings, defs, seen)}


def _merge_union(node: dict[str, Any]) -> dict[str, Any]:
    """An `anyOf` of plain types as one type where they are one (`integer | number`), as an
    `anyOf` of the remaining plain types otherwise; any other union unchanged."""
    branches = node["anyOf"]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if any(k not in _ANNOTATIONS for k in rest):
        return node
    plain = [b for b in branches if isinstance(b, dict) and set(b) - _ANNOTATIONS == {"type"}]
    if len(plain) != len(branches) or not all(isinstance(b["type"], str) for b in plain):
        return node
    merged = list(dict.fromkeys(b["type"] for b in plain))
    if "number" in merged and "integer" in merged:
        merged.remove("integer")
    if len(merged) == 1:
        return {**rest, "type": merged[0]}
    return {**rest, "anyOf": [{"type": t} for t in merged]}
