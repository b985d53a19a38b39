"""Argument rules (`[[tools.arguments]]`): a tool allowed only when named arguments match.

A rule names the tools it covers (a glob over policy names, `mcp.fs.*`), one argument (a key of
the call's arguments; dots reach into nested objects, `options.branch`) and one or more
conditions, every one of which must hold:

- `under = ["/srv/data"]`: a string that is an absolute POSIX path lying, once `.` and `..`
  are resolved lexically, at or under one of the directories;
- `one_of = ["staging", 3, true]`: exactly one of the values (type and value; `1` is not `true`);
- `matches = ["feature/*"]` / `not_matches = ["main", "release/*"]`: a string matching one of
  the globs / none of them (`*` any characters, `/` included; `?` one; `[...]` a class);
- `pattern = "^[a-z0-9-]{1,40}$"`: a string the regular expression matches whole;
- `sql = "read_only"` (with `dialect`, e.g. `"postgres"`): every statement the text holds is a
  query, as a real SQL parser (sqlglot) reads it, that writes nothing, locks nothing and calls
  no function the parser does not know.

A list value is judged item by item (every item must hold; an empty list touches nothing). Deny
on doubt: an argument that is missing (unless the rule says `absent = "allow"`), of the wrong
type, a relative path or one with a backslash or NUL, SQL that does not parse or that the parser
reads only as an opaque command: each is a refusal. Every rule covering a tool applies to it.

Pure: no I/O. The arguments are decided on and never kept: a reason names the tool, the rule and
the argument, never a value (it may be a secret).
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from loopwarden.errors import clip
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.patterns import check_pattern, matches

MAX_RULES = 200
MAX_VALUES = 200
MAX_TEXT = 1_000_000  # characters of one argument value a rule reads (more is a doubt)
MAX_REGEX = 500
ARGUMENT_RE = re.compile(r"^[A-Za-z0-9_$-]{1,64}(\.[A-Za-z0-9_$-]{1,64}){0,7}$")
RULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
SQL_DIALECTS: tuple[str, ...] = (
    "bigquery", "clickhouse", "databricks", "duckdb", "hive", "mysql", "oracle", "postgres",
    "presto", "redshift", "snowflake", "spark", "sqlite", "trino", "tsql",
)  # fmt: skip
"""The SQL dialects a `sql` condition may name (sqlglot's names); unset, its generic SQL."""

ARGUMENT_CODES = frozenset({ReasonCode.ARGUMENT_NOT_ALLOWED, ReasonCode.ARGUMENT_UNREADABLE})
"""Reasons decided on a call's arguments, which receipts do not carry (only their digest)."""

Scalar = str | int | float | bool


def _absolute_dir(path: str) -> str:
    if not path.startswith("/") or "\x00" in path or "\\" in path:
        raise ValueError(
            f"tools.arguments: under {clip(repr(path))} is not an absolute POSIX directory"
        )
    return posixpath.normpath(path)


def _regex(value: str) -> str:
    if len(value) > MAX_REGEX:
        raise ValueError(f"tools.arguments: a pattern of at most {MAX_REGEX} characters")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"tools.arguments: pattern does not compile ({exc.msg})") from None
    return value


def _globs(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(set(values)))


Globs = Annotated[
    tuple[str, ...], Field(min_length=1, max_length=MAX_VALUES), AfterValidator(_globs)
]


class ArgumentRule(BaseModel):
    """One argument rule (the module docstring says what each condition means)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None, description="What refusals call the rule (default: tool:argument)."
    )
    tool: str = Field(description="Glob over policy tool names, e.g. mcp.fs.*.")
    argument: str = Field(description="The argument's name; dots reach into nested objects.")
    under: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=MAX_VALUES)
    one_of: tuple[Scalar, ...] | None = Field(default=None, min_length=1, max_length=MAX_VALUES)
    matches: Globs | None = None
    not_matches: Globs | None = None
    pattern: str | None = None
    sql: Literal["read_only"] | None = None
    dialect: str | None = None
    absent: Literal["deny", "allow"] = Field(
        default="deny", description="A call without the argument: refused (default) or not."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not RULE_NAME_RE.fullmatch(value):
            raise ValueError(
                f"tools.arguments: rule name {clip(repr(value))}: 1-64 letters, digits, '_.:-'"
            )
        return value

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: str) -> str:
        return check_pattern(value)

    @field_validator("argument")
    @classmethod
    def _argument(cls, value: str) -> str:
        if not ARGUMENT_RE.fullmatch(value):
            raise ValueError(
                f"tools.arguments: argument {clip(repr(value))}: a name of letters, digits and "
                "'_$-', dots between the names of nested objects"
            )
        return value

    @field_validator("under")
    @classmethod
    def _under(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(sorted({_absolute_dir(p) for p in value}))

    @field_validator("one_of")
    @classmethod
    def _one_of(cls, value: tuple[Scalar, ...] | None) -> tuple[Scalar, ...] | None:
        if value is None:
            return None
        unique = {(type(v).__name__, v) for v in value}
        return tuple(v for _, v in sorted(unique, key=lambda tv: (tv[0], str(tv[1]))))

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return None if value is None else _regex(value)

    @field_validator("dialect")
    @classmethod
    def _dialect(cls, value: str | None) -> str | None:
        if value is not None and value not in SQL_DIALECTS:
            raise ValueError(
                f"tools.arguments: dialect {clip(repr(value))} is not one of "
                f"{', '.join(SQL_DIALECTS)}"
            )
        return value

    @model_validator(mode="after")
    def _some_condition(self) -> ArgumentRule:
        conditions = (self.under, self.one_of, self.matches, self.not_matches, self.pattern)
        if all(c is None for c in conditions) and self.sql is None:
            raise ValueError(
                f"tools.arguments: the rule for {self.tool} {self.argument} sets no condition "
                "(under, one_of, matches, not_matches, pattern or sql)"
            )
        if self.dialect is not None and self.sql is None:
            raise ValueError("tools.arguments: dialect goes with sql")
        return self

    @property
    def label(self) -> str:
        """What refusals call the rule: its name, else `tool:argument`."""
        return self.name or f"{self.tool}:{self.argument}"


def normalized(rules: tuple[ArgumentRule, ...] | None) -> tuple[ArgumentRule, ...] | None:
    """Rules in one order without repeats (every rule applies: order changes no decision), and
    None for none, so a policy without rules keeps its digest."""
    if not rules:
        return None
    unique = {rule.model_dump_json(exclude_none=True): rule for rule in rules}
    return tuple(unique[key] for key in sorted(unique))


# --- judging -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentVerdict:
    """How one rule judged one call: `outcome` is `ok`, `absent` (allowed missing),
    `not_allowed` (a value fails the rule) or `doubt` (a value it cannot judge); `why` says
    what failed, naming no value."""

    rule: ArgumentRule
    outcome: Literal["ok", "absent", "not_allowed", "doubt"]
    why: str = ""

    @property
    def denies(self) -> bool:
        return self.outcome in ("not_allowed", "doubt")


_MISSING = object()


def _lookup(arguments: Mapping[str, Any], path: str) -> Any:
    value: Any = arguments
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def covering(rules: tuple[ArgumentRule, ...] | None, tool: str) -> tuple[ArgumentRule, ...]:
    """The rules that apply to `tool` (its policy name)."""
    return tuple(rule for rule in rules or () if matches(rule.tool, tool))


def judge_arguments(
    rules: tuple[ArgumentRule, ...] | None, tool: str, arguments: Mapping[str, Any] | None
) -> list[ArgumentVerdict]:
    """Every rule covering `tool`, judged on `arguments` (None: the call's arguments were not
    seen, a doubt for every rule)."""
    out = []
    for rule in covering(rules, tool):
        if arguments is None:
            out.append(ArgumentVerdict(rule, "doubt", "the call's arguments were not seen"))
            continue
        value = _lookup(arguments, rule.argument)
        if value is _MISSING or value is None:
            if rule.absent == "allow":
                out.append(ArgumentVerdict(rule, "absent"))
            else:
                out.append(ArgumentVerdict(rule, "doubt", "the argument is missing"))
            continue
        items = value if isinstance(value, list) else [value]
        verdict = ArgumentVerdict(rule, "ok")
        for item in items:
            verdict = _judge_value(rule, item)
            if verdict.denies:
                break
        out.append(verdict)
    return out


def argument_reasons(
    rules: tuple[ArgumentRule, ...] | None, tool: str, arguments: Mapping[str, Any] | None
) -> list[Reason]:
    """Why a call of `tool` with `arguments` may not run under the argument rules, each worded
    for the model, naming the rule and the argument, never a value."""
    reasons = []
    for verdict in judge_arguments(rules, tool, arguments):
        if not verdict.denies:
            continue
        rule = verdict.rule
        code = (
            ReasonCode.ARGUMENT_NOT_ALLOWED
            if verdict.outcome == "not_allowed"
            else ReasonCode.ARGUMENT_UNREADABLE
        )
        reasons.append(
            Reason(
                code,
                f"{tool}: argument {rule.argument!r} {verdict.why} (argument rule "
                f"{rule.label!r}); call it with an argument the rule allows",
            )
        )
    return reasons


def _judge_value(rule: ArgumentRule, value: Any) -> ArgumentVerdict:
    """One value (an item of a list value) against every condition of `rule`."""
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return ArgumentVerdict(rule, "doubt", f"is longer than {MAX_TEXT} characters")
    checks = (
        (rule.one_of, _one_of),
        (rule.under, _under),
        (rule.matches, _matches),
        (rule.not_matches, _not_matches),
        (rule.pattern, _pattern),
    )
    for condition, check in checks:
        if condition is not None:
            verdict = check(rule, value)
            if verdict is not None:
                return verdict
    if rule.sql is not None:
        if not isinstance(value, str):
            return ArgumentVerdict(rule, "doubt", "is not SQL text")
        problem = sql_problem(value, rule.dialect)
        if problem is not None:
            outcome: Literal["not_allowed", "doubt"] = (
                "not_allowed" if problem.startswith("writes") else "doubt"
            )
            return ArgumentVerdict(rule, outcome, f"is not read-only SQL: it {problem}")
    return ArgumentVerdict(rule, "ok")


def _text(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    if not isinstance(value, str):
        return ArgumentVerdict(rule, "doubt", "is not a string")
    return None


def _one_of(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    if not isinstance(value, Scalar):
        return ArgumentVerdict(rule, "doubt", "is not a single value")
    allowed = {(type(v), v) for v in rule.one_of or ()}
    if (type(value), value) not in allowed:
        return ArgumentVerdict(rule, "not_allowed", "is not one of the rule's values")
    return None


def _under(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    wrong = _text(rule, value)
    if wrong is not None:
        return wrong
    if not value.startswith("/") or "\x00" in value or "\\" in value:
        return ArgumentVerdict(rule, "doubt", "is not an absolute POSIX path")
    path = posixpath.normpath(value)
    if path.startswith("//"):  # POSIX leaves a leading `//` to the implementation
        return ArgumentVerdict(rule, "doubt", "is not an absolute POSIX path")
    for directory in rule.under or ():
        if directory == "/" or path == directory or path.startswith(directory + "/"):
            return None
    return ArgumentVerdict(rule, "not_allowed", "is not under the rule's directories")


def _matches(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    wrong = _text(rule, value)
    if wrong is not None:
        return wrong
    if not any(fnmatch.fnmatchcase(value, glob) for glob in rule.matches or ()):
        return ArgumentVerdict(rule, "not_allowed", "matches none of the rule's patterns")
    return None


def _not_matches(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    wrong = _text(rule, value)
    if wrong is not None:
        return wrong
    if any(fnmatch.fnmatchcase(value, glob) for glob in rule.not_matches or ()):
        return ArgumentVerdict(rule, "not_allowed", "matches a pattern the rule refuses")
    return None


def _pattern(rule: ArgumentRule, value: Any) -> ArgumentVerdict | None:
    wrong = _text(rule, value)
    if wrong is not None:
        return wrong
    assert rule.pattern is not None
    if _compiled(rule.pattern).fullmatch(value) is None:
        return ArgumentVerdict(rule, "not_allowed", "does not match the rule's pattern")
    return None


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# --- SQL ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _sql() -> Any:
    """sqlglot, imported on first use (a policy without SQL rules never loads it), its fallback
    warnings silenced: an unreadable statement is a refusal here, not a log line."""
    import sqlglot

    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    return sqlglot


def sql_problem(text: str, dialect: str | None = None) -> str | None:
    """Why `text` is not read-only SQL (None if it is): each statement must parse as a query
    (SELECT, a set operation of them) holding no write (INSERT, UPDATE, DELETE, MERGE, CREATE,
    DROP, ALTER, `SELECT … INTO`), no lock (`FOR UPDATE`) and no function the parser does not
    know (`nextval`, `pg_sleep`, a user's function: any of them may write). Wording: a problem
    that starts with `writes` is a refusal of what the text says, any other a doubt."""
    sqlglot = _sql()
    from sqlglot import exp
    from sqlglot.errors import ErrorLevel

    try:
        statements = [
            s for s in sqlglot.parse(text, dialect=dialect, error_level=ErrorLevel.RAISE) if s
        ]
    except Exception:  # any parser failure is a doubt
        return "does not parse"
    if not statements:
        return "holds no statement"
    writes = (
        exp.Insert,
        exp.Update,
        exp.Delete,
        exp.Merge,
        exp.Create,
        exp.Drop,
        exp.Alter,
        exp.Into,
    )
    for statement in statements:
        if isinstance(statement, exp.Command):
            return "holds a statement the parser reads only as an opaque command"
        for node in statement.walk():
            if isinstance(node, writes):
                return "writes (a statement changes data or schema)"
            if isinstance(node, exp.Lock):
                return "takes row locks (FOR UPDATE / FOR SHARE)"
            if isinstance(node, exp.Anonymous):
                return "calls a function the parser does not know (it may write)"
        if not isinstance(statement, exp.Query):
            return "holds a statement that is not a query"
    return None
