"""Settings that carry commands: git's command-carrying settings and options (`-c
alias.x=!…`, `-c core.pager=…`, `rebase --exec`, `--upload-pack`, `bisect run`, `submodule
foreach`, `ext::` remotes) and environment variables whose value a program runs as a command
(`PAGER`, `GIT_SSH_COMMAND`, …) or that set git configuration loopwarden cannot read."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loopwarden.policy.commands.options import scan
from loopwarden.policy.commands.programs import GIT
from loopwarden.policy.commands.programs import read as read_argv
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import Word, joined

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

CODE_VARIABLES = frozenset(
    [
        "PAGER",
        "GIT_PAGER",
        "MANPAGER",
        "SYSTEMD_PAGER",
        "EDITOR",
        "VISUAL",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_SSH_COMMAND",
        "GIT_SSH",
        "GIT_EXTERNAL_DIFF",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "GIT_PROXY_COMMAND",
        "LESSOPEN",
        "LESSCLOSE",
        "PROMPT_COMMAND",
        "BROWSER",
        "PS0",
        "PS1",
        "PS2",
        "PS4",
    ]
)
"""Variables whose value a program runs as a command (a pager, an editor, `ssh`): their value
is read as a command line."""

CONFIG_VARIABLES = r"^GIT_CONFIG_(PARAMETERS|COUNT|KEY_\d+|VALUE_\d+)$"
"""Variables that set git configuration (aliases, pagers) where loopwarden cannot read it."""

_GIT_CODE_KEYS = (
    r"^(alias\..+|core\.(pager|editor|sshcommand|askpass|fsmonitor|gitproxy)|sequence\.editor"
    r"|diff\.external|gpg(\..+)?\.program|credential(\..+)?\.helper|pager\..+"
    r"|diff\..+\.(textconv|command)|filter\..+\.(clean|smudge|process)|merge\..+\.driver"
    r"|uploadpack\.packobjectshook|remote\..+\.(uploadpack|receivepack)"
    r"|sendemail\..*(cccmd|tocmd|sendmailcmd))$"
)
"""git settings whose value is a command git runs (through a shell)."""

_GIT_CODE_OPTIONS: dict[str, frozenset[str]] = {
    "rebase": frozenset({"-x", "--exec"}),
    "difftool": frozenset({"-x", "--extcmd"}),
    "mergetool": frozenset({"-x", "--extcmd"}),
    "clone": frozenset({"-u", "--upload-pack"}),
    "fetch": frozenset({"--upload-pack"}),
    "pull": frozenset({"--upload-pack"}),
    "ls-remote": frozenset({"--upload-pack"}),
    "archive": frozenset({"--exec"}),
    "push": frozenset({"--receive-pack", "--exec"}),
    "send-pack": frozenset({"--receive-pack", "--exec"}),
    "filter-branch": frozenset(
        [
            "--env-filter",
            "--tree-filter",
            "--index-filter",
            "--parent-filter",
            "--msg-filter",
            "--commit-filter",
            "--tag-name-filter",
        ]
    ),
}
"""git subcommand options whose value is a shell command."""


def assigned(reading: Reading, run: Run | None, variable: str, value: Word) -> None:
    """A variable set in the line: remembered, and its value read if a program runs it."""
    reading.assigned[variable] = value.text
    if variable in CODE_VARIABLES:
        reading.line(value, run.dialect if run else "bash", f"${variable}", run)
    elif re.match(CONFIG_VARIABLES, variable):
        reading.doubt(run, f"${variable} sets git configuration loopwarden cannot read")


def git(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """git's command-carrying settings (`-c core.pager=…`, shell aliases `-c alias.x=!…`)
    and options (`rebase --exec`, `--upload-pack`, …), and `ext::` remotes."""
    head = scan(GIT.main, run.argv, 1, stop=True)
    for option in head.options:
        if option.name == "--config-env" and option.value is not None:
            key = (option.value.text or "").partition("=")[0].lower()
            if option.value.text is None or re.match(_GIT_CODE_KEYS, key):
                reading.doubt(run, "a git setting takes a command from the environment")
        if option.name != "-c" or option.value is None:
            continue
        if option.value.text is None:
            reading.doubt(run, f"cannot read a `git -c` setting: it is {option.value.kind}")
            continue
        key, _, value = option.value.text.partition("=")
        key = key.lower()
        if re.match(_GIT_CODE_KEYS, key) and (
            not key.startswith("alias.") or value.startswith("!")
        ):
            reading.line(Word(value.removeprefix("!")), "bash", "git -c", run)
    command = read_argv(run.argv)
    carriers = _GIT_CODE_OPTIONS.get(command.subcommand or "", frozenset())
    for option in command.options:
        if option.name in carriers:
            reading.line(option.value, "bash", f"git {command.subcommand} {option.name}", run)
    if any(w.text is not None and w.text.startswith("ext::") for w in command.operands):
        reading.doubt(run, "a git `ext::` remote runs a command", True)
    _git_argv_carriers(reading, run, command.subcommand, command.operands)


def _git_argv_carriers(reading: Reading, run: Run, sub: str | None, operands: list[Word]) -> None:
    """`git bisect run CMD …` (an argv) and `git submodule foreach CMD` (a shell line)."""
    words = [w.text for w in operands]
    if sub == "bisect" and words[:1] == ["run"]:
        reading.add(tuple(operands[1:]), via="git bisect run", parent=run, dialect=run.dialect)
    if sub == "submodule" and "foreach" in words:
        rest = [w for w in operands[words.index("foreach") + 1 :] if w.text != "--recursive"]
        if rest:
            reading.line(joined(tuple(rest)), "bash", "git submodule foreach", run)
