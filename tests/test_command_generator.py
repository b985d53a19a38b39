"""Real bash finds the holes (issue 42): a differential generator composes commands with the
layers bash reads (`linegen.py`: spellings, keywords, substitutions, text bash evaluates as
code, shells, launchers and their options, programs whose options run a command, git settings),
runs each line in a real bash with stub programs in a scratch repository with a bare remote
(`bashtruth.py`), and holds loopwarden to what bash did:

- whenever bash really pushes or really deletes recursively with force, the rules deny the line
  (a line that seems to escape is run again alone before it counts: a background process of an
  earlier line must not be blamed on a later one);
- composed the same way around harmless commands, a line whose layers are all read is admitted
  (the documented doubts apart), and bash runs nothing denied for it.

The budget here is fixed and the examples derandomized (the same lines every run); the long run
is `python -m bench --only generator`. An escape either finds goes into
tests/fixtures/commands/generated.txt once fixed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import linegen
import pytest
from bashtruth import Sandbox
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.policy.evaluate import command_reasons
from loopwarden.policy.model import CommandRules

DENY = CommandRules(deny=("git push", "rm -r -f"))
LEGACY = CommandRules(deny=("git push*", "rm -rf *"))
BATCH = 30
_SETTINGS = settings(
    max_examples=2,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox()
    yield box
    box.close()


@st.composite
def composed(draw: st.DrawFn, commands: list[list[str]]) -> linegen.Piece:
    return linegen.compose(lambda options: draw(st.sampled_from(list(options))), commands)


def escapes(sandbox: Sandbox, lines: list[str]) -> list[tuple[str, set[str]]]:
    """The lines bash really ran a denied command for that the rules let run (each confirmed
    by a run of its own)."""
    out = []
    for line, ran in zip(lines, sandbox.run(lines, settle=True), strict=True):
        if ran and not command_reasons(DENY, line):
            again = sandbox.run([line], bound=8)[0]
            if again:
                out.append((line, again))
    return out


@_SETTINGS
@given(st.lists(composed(linegen.DENIED), min_size=BATCH, max_size=BATCH))
def test_whatever_bash_really_runs_that_a_rule_denies_is_denied(sandbox, pieces):
    lines = [piece.text for piece in pieces]
    assert escapes(sandbox, lines) == []
    for line in lines:
        assert command_reasons(LEGACY, line), line


@_SETTINGS
@given(st.lists(composed(linegen.HARMLESS), min_size=BATCH // 2, max_size=BATCH // 2))
def test_harmless_commands_in_layers_loopwarden_reads_are_admitted(sandbox, pieces):
    lines = [piece.text for piece in pieces]
    for piece, ran in zip(pieces, sandbox.run(lines, settle=True), strict=True):
        assert not ran or sandbox.run([piece.text], bound=8)[0] == set(), (
            "the benign generator made a line that runs a denied command",
            piece.text,
        )
        if piece.reading == "read":
            reasons = command_reasons(DENY, piece.text)
            assert not reasons, (piece.text, [r.message for r in reasons])


def test_the_generator_can_fail_most_of_its_evasions_really_run_in_bash(sandbox):
    rng = random.Random(42)
    pieces = [linegen.compose(rng.choice, linegen.DENIED) for _ in range(BATCH)]
    ran = sandbox.run([piece.text for piece in pieces])
    assert sum(1 for r in ran if r) >= BATCH * 3 // 4, "the evasions must be real"
    assert {"git push", "rm -r -f"} == set().union(*ran)


def test_every_layer_carries_a_denied_command_in_bash(sandbox):
    """Each layer, around a plain `git push` or `rm -rf`, really runs it: no layer is a no-op
    that would make the property vacuous."""
    lines, names = [], []
    for layer in linegen.LAYERS:
        core = linegen.Piece("git push origin main", simple=True)
        lines.append(linegen.wrap(layer, core).text)
        names.append(layer.name)
    ran = sandbox.run(lines, bound=8)
    assert [n for n, r in zip(names, ran, strict=True) if not r] == []
    assert [
        n for n, line in zip(names, lines, strict=True) if not command_reasons(DENY, line)
    ] == []
