"""Slim output schemas accept exactly what pydantic's schemas accept, and nothing else.

`slim` rewrites every tool's output schema so that clients validate results cheaply (no `$ref`,
no `anyOf`). The property: for values drawn near each schema (following it at every level, with
a wild value, a missing field or an extra one anywhere), a JSON Schema validator says the same
about the slim schema as about the original. And the real results of a real server pass.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from mcp import Client

from loopwarden.catalog import TOOLS
from loopwarden.clock import ManualClock
from loopwarden.server.app import build_server
from loopwarden.server.schemas import slim
from loopwarden.server.settings import Settings

SCHEMAS = {op.name: op.result.model_json_schema() for op in TOOLS}
WILD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.0, -0.0, 2.5]),
    st.text(max_size=4),
    st.just([]),
    st.just({}),
)


def near(node: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that follow `node` (a pydantic JSON Schema) at every level, but now and then take
    a wild value, leave out a required field or add an unknown one."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        return near({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs, depth)
    options: list[st.SearchStrategy[Any]] = []
    for branch in node.get("anyOf", []):
        options.append(near(branch, defs, depth))
    if "enum" in node:  # the enum is the type
        return _mostly(st.sampled_from(node["enum"]))
    for kind in node.get("type", []) if isinstance(node.get("type"), list) else [node.get("type")]:
        if kind == "object" and depth < 4:
            options.append(_objects(node, defs, depth))
        elif kind == "array" and depth < 4:
            options.append(st.lists(near(node.get("items", {}), defs, depth + 1), max_size=3))
        elif kind == "string":
            options.append(st.text(max_size=6))
        elif kind == "integer":
            options.append(st.integers(min_value=-5, max_value=2**53))
        elif kind == "number":
            options.append(st.one_of(st.integers(-5, 100), st.floats(-1e3, 1e3)))
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "null":
            options.append(st.none())
    return _mostly(st.one_of(*options) if options else WILD)


def _mostly(follow: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`follow`, but a wild value one time in 32 (so most drawn values are valid, or nearly)."""
    return st.integers(0, 31).flatmap(lambda n: WILD if n == 13 else follow)


def _objects(node: dict[str, Any], defs: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    props = node.get("properties", {})
    required = set(node.get("required", []))
    extra = node.get("additionalProperties")
    fields = {name: near(schema, defs, depth + 1) for name, schema in props.items()}
    shaped = st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )
    if isinstance(extra, dict):
        more = st.dictionaries(st.text(max_size=4), near(extra, defs, depth + 1), max_size=3)
        shaped = st.builds(lambda a, b: {**b, **a}, shaped, more)

    def spoil(value: dict[str, Any], how: int, key: str) -> dict[str, Any]:
        value = dict(value)
        if how == 1 and value:
            value.pop(sorted(value)[0])  # a field left out
        elif how == 2:
            value[key] = 1  # a field no schema names
        return value

    return st.builds(spoil, shaped, st.sampled_from([0] * 14 + [1, 2]), st.text(max_size=3))


def verdict(schema: dict[str, Any], value: Any) -> bool:
    return Draft202012Validator(schema).is_valid(value)


def keywords(node: Any) -> set[str]:
    """Every keyword used in a schema (property names are not keywords)."""
    if isinstance(node, list):
        return set().union(*(keywords(v) for v in node))
    if not isinstance(node, dict):
        return set()
    out = set(node)
    for key, value in node.items():
        if key == "properties":
            out |= set().union(*(keywords(v) for v in value.values()))
        elif key not in ("enum", "required", "default"):
            out |= keywords(value)
    return out


def descriptions(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(descriptions(v) for v in node))
    if not isinstance(node, dict):
        return set()
    own = {node["description"]} if isinstance(node.get("description"), str) else set()
    return own.union(*(descriptions(v) for k, v in node.items() if k != "description"))


def type_lists(node: Any) -> list[Any]:
    """Every `type` keyword whose value is a list (the Inspector's --strict warns about each)."""
    if isinstance(node, list):
        return [t for v in node for t in type_lists(v)]
    if not isinstance(node, dict):
        return []
    own = [node["type"]] if isinstance(node.get("type"), list) else []
    return own + [t for k, v in node.items() if k not in ("enum", "default") for t in type_lists(v)]


def test_slim_schemas_have_no_references_no_type_lists_and_no_titles_but_every_description():
    for name, schema in SCHEMAS.items():
        assert not keywords(slim(schema)) & {"$ref", "$defs", "title"}, name
        assert type_lists(slim(schema)) == [], name  # portable: one type per (sub)schema
        assert descriptions(slim(schema)) == descriptions(schema), name
        Draft202012Validator.check_schema(slim(schema))
    assert {"$ref", "anyOf", "title"} <= keywords(SCHEMAS["update"]) & keywords(SCHEMAS["claim"])


@settings(max_examples=250, deadline=None)  # each run draws new ones (no example database)
@given(data=st.data())
def test_a_slim_schema_accepts_exactly_the_values_its_pydantic_schema_accepts(data):
    name = data.draw(st.sampled_from(sorted(SCHEMAS)))
    schema = SCHEMAS[name]
    value = data.draw(near(schema, schema.get("$defs", {})))
    valid = verdict(schema, value)
    event(f"{name}: {'valid' if valid else 'invalid'}")
    assert verdict(slim(schema), value) == valid, (name, value)


@pytest.mark.parametrize(
    ("schema", "inside", "outside"),
    [
        ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, [1, 1.5], ["1", None]),
        (
            {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]},
            ["ab", None],
            ["abc", 1],
        ),
        ({"anyOf": [{"enum": ["a"], "type": "string"}, {"type": "null"}]}, ["a", None], ["b", 0]),
        ({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 3}]}, ["x", 3], [2, None]),
        ({"anyOf": [{"const": 1}, {"type": "null"}]}, [1, None], [2]),
        ({"anyOf": [{"type": "integer", "const": 1}, {"type": "null"}]}, [1, None], [2]),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, [1, None], [1.5, "1"]),
    ],
)
def test_unions_are_merged_only_where_the_merge_is_exact(schema, inside, outside):
    thin = slim(schema)
    assert type_lists(thin) == [], thin
    for value in inside:
        assert verdict(thin, value), (thin, value)
    for value in outside:
        assert not verdict(thin, value), (thin, value)


def test_a_reference_is_inlined_with_the_keywords_beside_it():
    schema = {"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "maxLength": 2}
    thin = slim({**schema, "description": "two at most"})
    assert thin == {"type": "string", "maxLength": 2, "description": "two at most"}
    assert verdict(thin, "ab") and not verdict(thin, "abc") and not verdict(thin, 1)


def test_a_recursive_model_keeps_the_definitions_it_needs():
    schema = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    thin = slim(schema)
    assert verdict(thin, {"next": {"next": {}}}) and not verdict(thin, {"next": 1})


@pytest.mark.anyio
async def test_the_server_lists_the_slim_schemas(tmp_path):
    # Clients check every structured result against these (the in-memory suite's calls do).
    server = build_server(Settings.create(home=tmp_path, agent="builder"), clock=ManualClock())
    async with Client(server) as client:
        listed = {t.name: t.output_schema for t in (await client.list_tools()).tools}
    assert listed == {name: slim(schema) for name, schema in SCHEMAS.items()}
