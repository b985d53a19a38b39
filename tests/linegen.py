"""Command lines composed for the differential generator (issue 42): a command — one that runs a
denied command (`git push`, `rm` with `-r` and `-f`) or a harmless one — wrapped in layers bash
reads: spellings of its words, keywords and compound commands, substitutions, expansions, text
bash evaluates as code, shells and `eval`, launchers and their options, programs whose options
run a command, git settings. `tests/test_command_generator.py` runs what it composes in a real
bash (`bashtruth.py`) and holds loopwarden to what bash does; `python -m bench --only generator`
runs it long.

One composition drives both: `compose(draw, cores)` takes a `draw(options)` that picks one of a
list — hypothesis's `draw(st.sampled_from(…))` in the tests, a seeded `random.Random.choice`
in the bench. Each layer says how a harmless command inside it is read (`read`: admitted;
`doubt` and `opaque`: a documented doubt, docs/hooks.md), so the benign run asserts admission
exactly where the docs promise it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Draw = Callable[[Sequence[Any]], Any]
Reading = Literal["read", "doubt", "opaque"]


@dataclass(frozen=True)
class Piece:
    """Shell text, and what a layer may do with it."""

    text: str
    simple: bool  # one simple command: a launcher may run it
    oneline: bool = True
    plain: bool = True  # no quotes, backslashes, `$`, backquotes, `|`: fits any string
    reading: Reading = "read"  # how loopwarden reads it (the weakest of its layers)
    splitting: bool = False  # an unquoted expansion in its words (may become several words)


@dataclass(frozen=True)
class Layer:
    name: str
    wants: Literal["simple", "simple1", "any", "oneline", "plain"]
    wrap: Callable[[Piece], str]
    reading: Reading = "read"
    simple: bool = False  # the result is one simple command
    multiline: bool = False
    splitting: bool = False  # the result holds an unquoted expansion
    strict: bool = False  # an unquoted expansion among the words it reads is a doubt


DENIED: list[list[str]] = [
    ["git", "push", "origin", "main"],
    ["git", "-C", ".", "push", "origin", "main"],
    ["git", "push", "-f", "origin", "main"],
    ["git", "--no-pager", "push", "origin", "HEAD:main"],
    ["rm", "-rf", "victim"],
    ["rm", "-r", "-f", "victim"],
    ["rm", "--recursive", "--force", "victim"],
    ["rm", "-Rf", "victim"],
    ["rm", "-fr", "--", "victim"],
]
"""Commands that really push (the stub receive-pack logs it) or really delete recursively with
force (the stub rm logs it)."""

HARMLESS: list[list[str]] = [
    ["git", "status", "--short"],
    ["git", "log", "-1", "--oneline"],
    ["git", "rev-parse", "HEAD"],
    ["echo", "hi"],
    ["ls"],
    ["cat", "README.md"],
    ["rm", "-f", "nothing.tmp"],
    ["rm", "-r", "nothing.dir"],
    ["grep", "-c", "sandbox", "README.md"],
]
"""Commands an agent runs every day, none of which a rule denies."""


def _q(piece: Piece) -> str:
    return shlex.quote(piece.text)


def _end(piece: Piece) -> str:
    """What ends the piece inside a compound command: `;`, or a newline after a
    here-document's last line."""
    return ";" if piece.oneline else "\n"


def _eof(piece: Piece) -> str:
    """A here-document delimiter the piece does not use."""
    n = 0
    while f"EOF{n}" in piece.text:
        n += 1
    return f"EOF{n}"


def _single(piece: Piece) -> str:
    """The text, for the inside of a single-quoted word."""
    return piece.text.replace("'", "'\\''")


_SPELLINGS: list[Callable[[str], str]] = [
    lambda w: w,
    lambda w: f'"{w}"',
    lambda w: f"'{w[0]}'{w[1:]}",
    lambda w: f"{w[0]}\\{w[1:]}",
    lambda w: "$'" + "".join(f"\\x{ord(c):02x}" for c in w) + "'",
    lambda w: f'"{w[:1]}""{w[1:]}"',
    lambda w: f"../bin/{w}",
]
"""Spellings of a program's name that bash reads as the name (`../bin/` is the sandbox's PATH)."""

LAYERS: list[Layer] = [
    # keywords and compound commands
    Layer("group", "any", lambda p: f"{{ {p.text}{_end(p)} }}"),
    Layer("subshell", "any", lambda p: f"( {p.text}\n)"),
    Layer("if", "any", lambda p: f"if true; then {p.text}{_end(p)} fi"),
    Layer("for", "any", lambda p: f"for i in 1; do {p.text}{_end(p)} done"),
    Layer("while", "any", lambda p: f"while true; do {p.text}{_end(p)} break; done"),
    Layer("case", "any", lambda p: f"case x in x) {p.text}\n;; esac"),
    Layer("function", "any", lambda p: f"f() {{ {p.text}{_end(p)} }}; f"),
    Layer("function keyword", "any", lambda p: f"function g {{ {p.text}{_end(p)} }}; g"),
    Layer("and", "any", lambda p: f"true && {p.text}"),
    Layer("or", "any", lambda p: f"false || {p.text}"),
    Layer("list", "any", lambda p: f"true; {p.text}"),
    Layer("time", "simple", lambda p: f"time {p.text}"),
    Layer("time -p", "simple", lambda p: f"time -p {p.text}"),
    Layer("negation", "simple", lambda p: f"! {p.text}"),
    Layer("time group", "any", lambda p: f"time {{ {p.text}{_end(p)} }}", "doubt"),
    Layer("negated group", "any", lambda p: f"! {{ {p.text}{_end(p)} }}", "doubt"),
    Layer("time if", "any", lambda p: f"time if true; then {p.text}{_end(p)} fi", "doubt"),
    Layer("coproc group", "any", lambda p: f"coproc {{ {p.text}{_end(p)} }}; wait", "doubt"),
    # substitutions and expansions
    Layer("$( )", "any", lambda p: f"echo $( {p.text}\n)", simple=True, splitting=True),
    Layer("backquotes", "plain", lambda p: f"echo `{p.text}`", simple=True, splitting=True),
    Layer("assignment", "any", lambda p: f"v=$( {p.text}\n)"),
    Layer("${:-$( )}", "any", lambda p: f": ${{u:-$( {p.text}\n)}}", simple=True, splitting=True),
    Layer("${/ /$( )}", "any", lambda p: f'v=1; : "${{v/1/$( {p.text}\n)}}"'),
    Layer(
        "${:-` `}", "plain", lambda p: f": ${{u:-`{p.text}`}}", "doubt", simple=True, splitting=True
    ),
    Layer("${# $( )}", "any", lambda p: f"v=1; : ${{v#$( {p.text}\n)}}", "doubt"),
    Layer("<( )", "any", lambda p: f"cat <( {p.text}\n)", simple=True),
    Layer("here-string", "any", lambda p: f'cat <<< "$( {p.text}\n)"', simple=True),
    Layer(
        "here-document $( )",
        "any",
        lambda p: f"cat <<{_eof(p)}\n$({p.text})\n{_eof(p)}",
        multiline=True,
    ),
    Layer(
        "here-document ` `",
        "plain",
        lambda p: f"cat <<{_eof(p)}\n`{p.text}`\n{_eof(p)}",
        "doubt",
        multiline=True,
    ),
    Layer(
        "quotes in a quoted ${:-'…'}",
        "oneline",
        lambda p: f"echo \"${{u:-'$( {p.text} )'}}\"",
        "doubt",
        simple=True,
    ),
    Layer("[[ == $( ) ]]", "any", lambda p: f"[[ x == $( {p.text}\n) ]]"),
    Layer("case $( )", "any", lambda p: f"case $( {p.text}\n) in *) ;; esac"),
    # text bash evaluates as code
    Layer("arithmetic variable", "oneline", lambda p: f"v='a[$({_single(p)})]'; (( v ))", "doubt"),
    Layer("test -v", "oneline", lambda p: f"test -v 'a[$({_single(p)})]'", "doubt"),
    Layer("[ -v ]", "oneline", lambda p: f"[ -v 'a[$({_single(p)})]' ]", "doubt"),
    Layer("declare subscript", "oneline", lambda p: f"declare 'a[$({_single(p)})]=1'", "doubt"),
    Layer("printf -v", "oneline", lambda p: f"printf -v 'a[$({_single(p)})]' x", "doubt"),
    Layer("read name", "oneline", lambda p: f"read 'a[$({_single(p)})]' <<< x", "doubt"),
    Layer("let", "oneline", lambda p: f"let 'v=a[$({_single(p)})]'", "doubt"),
    Layer("[[ -eq ]]", "oneline", lambda p: f"v='a[$({_single(p)})]'; [[ $v -eq 0 ]]", "doubt"),
    Layer("declare -i", "oneline", lambda p: f"declare -i n; n='a[$({_single(p)})]'", "doubt"),
    Layer(
        "declare a quoted array",
        "oneline",
        lambda p: f"declare -a 'a=([$( {_single(p)} )]=1)'",
        "doubt",
    ),
    Layer("@P", "oneline", lambda p: f"v='$({_single(p)})'; : ${{v@P}}", "doubt"),
    Layer("indirection", "oneline", lambda p: f"v='a[$({_single(p)})]'; : ${{!v}}", "doubt"),
    # shells, eval, and builtins that run text
    Layer("bash -c", "any", lambda p: f"bash -c {_q(p)}", simple=True),
    Layer("sh -ec", "any", lambda p: f"sh -ec {_q(p)}", simple=True),
    Layer("eval", "any", lambda p: f"eval {_q(p)}", simple=True),
    Layer("eval --", "any", lambda p: f"eval -- {_q(p)}", simple=True),
    Layer("bash <<<", "any", lambda p: f"bash <<< {_q(p)}", simple=True),
    Layer(
        "bash <<EOF",
        "any",
        lambda p: f"bash <<'{_eof(p)}'\n{p.text}\n{_eof(p)}",
        simple=True,
        multiline=True,
    ),
    Layer("source /dev/stdin", "any", lambda p: f"source /dev/stdin <<< {_q(p)}", simple=True),
    Layer(". /dev//stdin", "any", lambda p: f". /dev//stdin <<< {_q(p)}", simple=True),
    Layer(
        "bash /proc/self/fd/0", "any", lambda p: f"bash /proc/self/fd/0 <<< {_q(p)}", simple=True
    ),
    Layer("bash /dev/fd/0", "any", lambda p: f"bash /dev/fd/0 <<< {_q(p)}", simple=True),
    Layer("pipe into bash", "any", lambda p: f"echo {_q(p)} | bash", "opaque"),
    Layer("trap", "any", lambda p: f"trap {_q(p)} EXIT", simple=True),
    Layer("bash -s", "any", lambda p: f"bash -s <<< {_q(p)}", simple=True),
    Layer("env -S", "plain", lambda p: f"env -S {_q(p)}", simple=True),
    Layer(
        "alias",
        "oneline",
        lambda p: f"shopt -s expand_aliases\nalias z={_q(p)}\nz",
        "doubt",
        multiline=True,
    ),
    Layer("eval a variable", "any", lambda p: f'v={_q(p)}; eval "$v"', "doubt"),
    Layer("coproc", "simple1", lambda p: f"coproc {p.text}; wait"),
    Layer("exec in a subshell", "simple", lambda p: f"( exec {p.text}\n)"),
    Layer("BASH_ENV", "any", lambda p: f"BASH_ENV=<(echo {_q(p)}) bash -c :", "doubt", simple=True),
    Layer(
        "mapfile -C",
        "oneline",
        lambda p: f"mapfile -c1 -C {shlex.quote(p.text + ' #')} a <<< x",
        simple=True,
    ),
    Layer("sg -c", "any", lambda p: f"sg root -c {_q(p)}", simple=True),
    Layer("script -qc", "any", lambda p: f"script -qc {_q(p)} /dev/null", simple=True),
    Layer("script FILE -qc", "any", lambda p: f"script /dev/null -qc {_q(p)}", simple=True),
    Layer("flock -c", "any", lambda p: f"flock .lock -c {_q(p)}", simple=True),
    Layer("lwsh", "any", lambda p: f"lwsh {_q(p)}", "doubt", simple=True),
    # launchers and their options
    *[
        Layer(prefix, "simple", lambda p, prefix=prefix: f"{prefix} {p.text}", simple=True)
        for prefix in (
            "timeout 20",
            "timeout --sig KILL 20",
            "timeout -s KILL 20",
            "timeout --kill 5 20",
            "nice -n 1",
            "nice --adj 1",
            "nice -5",
            "env",
            "env -u HOME",
            "env --chdir=.",
            "env V=1",
            "nohup",
            "setsid -w",
            "setsid --wait",
            "stdbuf -oL",
            "stdbuf --out=L",
            "flock .lock",
            "flock --tim 5 .lock",
            "chrt -o 0",
            "chrt --other 0",
            "taskset -c 0",
            "taskset 0x1",
            "prlimit --nofile=512",
            "prlimit -n512 --",
            "setarch x86_64",
            "setarch x86_64 -R",
            "linux64",
            "unshare -U",
            "unshare --user --",
            "setpriv --reuid=0",
            "fakeroot --",
            "fakeroot",
            "ssh-agent",
            "dbus-run-session --",
            "strace -o /dev/null",
            "strace --output /dev/null",
            "strace -qqo /dev/null",
            "command",
            "command --",
            "builtin command",
            "runuser -u root --",
            "nice",
            "timeout -k 1 20",
            "cmake -E env",
        )
    ],
    *[
        Layer(prefix, "simple", lambda p, prefix=prefix: f"{prefix} {p.text}", "doubt", simple=True)
        for prefix in ("xargs -a /dev/null", "xargs --max-a 1", "xargs -0 -a /dev/null --")
    ],  # words from input: a rule that depends on them cannot be decided
    Layer(
        "find -exec",
        "simple1",
        lambda p: f"find . -maxdepth 0 -exec {p.text} \\;",
        simple=True,
        strict=True,  # a split word among find's may be `-exec`: a doubt
    ),
    Layer("lwrun", "simple", lambda p: f"lwrun {p.text}", "doubt", simple=True),
    Layer(
        "xargs gives lwrun its words", "plain", lambda p: f"echo {p.text} | xargs lwrun", "doubt"
    ),
    Layer(
        "a git shell alias given words",
        "plain",
        lambda p: f"git -c alias.z='!lwrun' z {p.text}",
        "doubt",
        simple=True,
    ),
    Layer("lwopt", "simple", lambda p: f"lwopt -x --y {p.text}", "doubt", simple=True),
    # programs whose options run a command
    Layer(
        "tar --checkpoint-action",
        "oneline",
        lambda p: f"tar -cf /dev/null --checkpoint=1 --checkpoint-action=exec={_q(p)} README.md",
        simple=True,
    ),
    Layer("split --filter", "oneline", lambda p: f"split --filter={_q(p)} README.md", simple=True),
    Layer("ssh ProxyCommand", "oneline", lambda p: f"ssh -o ProxyCommand={_q(p)} x", simple=True),
    Layer(
        "git core.fsmonitor",
        "oneline",
        lambda p: f"git -c core.fsmonitor={shlex.quote(p.text + ' #')} status",
        simple=True,
    ),
    Layer(
        "git config, then git",
        "oneline",
        lambda p: f"git config core.fsmonitor {shlex.quote(p.text + ' #')}; git status --short",
    ),
    Layer(
        "git's settings written to its file",
        "plain",
        lambda p: f"printf '[core]\\n\\tfsmonitor = \"{p.text} #\"\\n' >> .git/config; git status",
        "doubt",
    ),
    Layer(
        "git shell alias",
        "oneline",
        lambda p: f"git -c alias.z={shlex.quote('!' + p.text)} z",
        simple=True,
    ),
    Layer(
        "awk system",
        "plain",
        lambda p: f"awk 'BEGIN {{ system(\"{p.text}\") }}'",
        "opaque",
        simple=True,
    ),
    Layer("sed e", "plain", lambda p: f"sed -n '1e {p.text}' README.md", "opaque", simple=True),
    Layer(
        "sqlite3 .shell",
        "plain",
        lambda p: f"sqlite3 :memory: '.shell {p.text}'",
        "opaque",
        simple=True,
    ),
    Layer("ed !", "plain", lambda p: f"ed -s <<< '!{p.text}'", "opaque", simple=True),
    Layer("ex -sc r !", "plain", lambda p: f"ex -sc 'r !{p.text}' -c 'q!'", "opaque", simple=True),
    Layer("vim -c !", "plain", lambda p: f"vim -es -c '!{p.text}' -c 'qa!'", "opaque", simple=True),
    Layer(
        "make from input",
        "plain",
        lambda p: f"make -f /dev/stdin <<< $'x:\\n\\t{p.text}'",
        "opaque",
        simple=True,
    ),
    Layer(
        "python3 -c",
        "plain",
        lambda p: f"python3 -c 'import os; os.system(\"{p.text}\")'",
        "opaque",
        simple=True,
    ),
]
"""Every layer the generator composes (its name says what bash reads there)."""

_WEAKER = {"read": 0, "doubt": 1, "opaque": 2}


def core(draw: Draw, commands: list[list[str]]) -> Piece:
    """A command, its program's name — and, one time in two, another of its words — spelled one
    of the ways bash reads as that word."""
    argv = draw(commands)
    words = [draw(_SPELLINGS)(argv[0]), *argv[1:]]
    if len(argv) > 1 and draw([False, True]):
        at = draw(list(range(1, len(argv))))
        spelling = draw(_SPELLINGS[:-1])  # `../bin/` spells a program, not its arguments
        words[at] = spelling(argv[at])
    text = " ".join(words)
    return Piece(text, simple=True, plain=text == " ".join(argv))


def _fits(layer: Layer, piece: Piece) -> bool:
    if layer.wants == "simple":
        return piece.simple
    if layer.wants == "simple1":
        return piece.simple and piece.oneline
    if layer.wants == "oneline":
        return piece.oneline
    if layer.wants == "plain":
        return piece.plain and piece.oneline
    return True


def wrap(layer: Layer, piece: Piece) -> Piece:
    text = layer.wrap(piece)
    doubt: Reading = "doubt" if layer.strict and piece.splitting else "read"
    reading = max(piece.reading, layer.reading, doubt, key=_WEAKER.__getitem__)
    oneline = piece.oneline and not layer.multiline and "\n" not in text
    return Piece(text, layer.simple, oneline, False, reading, layer.splitting and layer.simple)


def compose(draw: Draw, commands: list[list[str]], layers: int = 3) -> Piece:
    """A command of `commands` wrapped in up to `layers` layers that fit it."""
    piece = core(draw, commands)
    for _ in range(draw(list(range(1, layers + 1)))):
        fitting = [layer for layer in LAYERS if _fits(layer, piece)]
        piece = wrap(draw(fitting), piece)
    return piece
