"""Parse a policy from TOML, YAML or JSON text. Pure: the caller reads the file.

Every failure is one `PolicyError` whose message names the file, the field and the reason.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from loopwarden.errors import PolicyError, clip, one_line
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.pool_policy import PoolPolicy

if TYPE_CHECKING:
    import yaml

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}


def format_for(filename: str) -> str:
    """The policy format named by a file's extension; `PolicyError` for any other extension."""
    lower = filename.lower()
    for ext, fmt in FORMATS.items():
        if lower.endswith(ext):
            return fmt
    raise PolicyError(f"{filename}: unknown policy file extension; use .toml, .yaml, .yml or .json")


def _decode(text: str, fmt: str, source: str) -> Any:
    if fmt == "yaml":
        import yaml  # only YAML files need it (a hook process never parses one)

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PolicyError(f"{source}: malformed YAML: {_yaml_problem(exc)}") from None
    if fmt == "toml":
        import tomllib  # only TOML files need it (a hook process reads its policy as JSON)

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(
                f"{source}: malformed TOML: {clip(one_line(str(exc)), 200)}{_opened_at(text, exc)}"
            ) from None
    try:
        if fmt == "json":
            return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{source}: malformed JSON: {clip(one_line(str(exc)), 200)}") from None
    raise PolicyError(f"{source}: unknown policy format {fmt!r}")


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'[^']*'")
_UNCLOSED = re.compile(r"Unclosed (array|inline table)|unclosed|Expected ']'|Expected '}'", re.I)


def _opened_at(text: str, exc: Exception) -> str:
    """Where an unclosed array or inline table began: tomllib reports where it gave up, which
    can be lines later (the next key, or the end of the file)."""
    if _UNCLOSED.search(str(exc)) is None:
        return ""
    depth, opened = 0, None
    for number, line in enumerate(text.splitlines(), start=1):
        code = _STRINGS.sub("", line).split("#", 1)[0]
        if depth == 0 and re.match(r"\s*\[", code) and "=" not in code:
            continue  # a [table] header, not an array
        for char in code:
            if char in "[{":
                if depth == 0:
                    opened = number
                depth += 1
            elif char in "]}" and depth:
                depth -= 1
    return f" (the one opened at line {opened} is not closed)" if depth and opened else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line report as one line: `line L, column C: problem`."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + clip(one_line(str(problem)), 200)


def _describe(exc: ValidationError, source: str) -> str:
    problems = []
    for error in exc.errors(include_url=False)[:10]:
        where = clip(".".join(str(part) for part in error["loc"]) or "(policy)")
        message = clip(error["msg"].removeprefix("Value error, "), 200)
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _nearest_key(model_keys(error["loc"]), str(error["loc"][-1]))
        problems.append(f"{where}: {message}")
    return f"{clip(source)}: invalid policy: " + one_line("; ".join(problems))


def model_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys a policy allows where `loc` names an unknown one (its section's fields)."""
    model: type[BaseModel] = LoopPolicy
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        found = next((a for a in getattr(annotation, "__args__", (annotation,))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)  # fmt: skip
        if found is None:
            return []
        model = found
    return list(model.model_fields)


def _nearest_key(known: list[str], given: str) -> str:
    import difflib

    near = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


M = TypeVar("M", LoopPolicy, PoolPolicy)


def _validated(model: type[M], data: Any, source: str) -> M:
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: a policy must be a table/mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_describe(exc, source)) from None


def policy_from_data(data: Any, source: str = "policy") -> LoopPolicy:
    """Validate already-decoded data (a mapping) as a `LoopPolicy`."""
    return _validated(LoopPolicy, data, source)


def pool_policy_from_data(data: Any, source: str = "pool policy") -> PoolPolicy:
    """Validate already-decoded data (a mapping) as a budget pool's `PoolPolicy`."""
    return _validated(PoolPolicy, data, source)


def parse_policy(text: str, fmt: str, source: str = "policy") -> LoopPolicy:
    """Decode `text` in `fmt` (`toml`, `yaml` or `json`) and validate it."""
    return policy_from_data(_decode(text, fmt, source), source)


def policy_schema() -> dict[str, Any]:
    """The JSON Schema of a policy document."""
    return LoopPolicy.model_json_schema()
