"""git as a carrier of commands: the settings whose value git runs (`-c core.pager=…`,
`difftool.x.cmd`, `trailer.x.cmd`, `gpg.ssh.defaultKeyCommand`, `core.fsmonitor`, a shell alias
`alias.x=!…`), settings that make git read or run what the line cannot show (`include.path`,
`core.hooksPath`, `url.….insteadOf`, a remote's `vcs`), settings *written* in the line and used
later (`git config core.fsmonitor …` then `git status`: the value is read as a command where it
is written), the options whose value is a command (`rebase --exec`, `--upload-pack`,
`fetch-pack --upload-pack`, `grep -O`, `send-email --to-cmd`, …), the argv git runs
(`bisect run`, `for-each-repo`, `submodule foreach`), and `ext::` remotes.

A setting's value is read as a command line when its key is one of these, whatever the scope
it is written to (`-c`, `clone -c`, `git config [--global|--local|-f F]`, `git config set`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loopwarden.policy.commands.options import Scan, grammar, scan
from loopwarden.policy.commands.programs import GIT
from loopwarden.policy.commands.programs import read as read_argv
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import Word, joined

if TYPE_CHECKING:
    from collections.abc import Sequence

    from loopwarden.policy.commands.reading import Reading

_CODE_KEYS = lazy(
    r"^(core\.(pager|editor|sshcommand|askpass|fsmonitor|gitproxy|alternaterefscommand)"
    r"|sequence\.editor|diff\.external|interactive\.difffilter|imap\.tunnel|gpg\.program"
    r"|gpg\..+\.program|gpg\.ssh\.defaultkeycommand|credential(\..+)?\.helper|pager\..+"
    r"|(diff|difftool|mergetool|man|browser|guitool|trailer)\..+\.(cmd|command|path|textconv)"
    r"|filter\..+\.(clean|smudge|process)|merge\..+\.driver|uploadpack\.packobjectshook"
    r"|remote\..+\.(uploadpack|receivepack)|sendemail\.(.*cmd|smtpserver)"
    r"|lfs\.(customtransfer|extension)\..+\.(path|clean|smudge)|instaweb\.httpd"
    r"|.*\.(cmd|command|program|helper|hook|tunnel|editor|pager|textconv|driver))$"
)
"""git settings whose value is a command (or a program) git runs."""

_ELSEWHERE_KEYS = lazy(
    r"^(include\.path|includeif\..+\.path|core\.hookspath|core\.worktree|init\.templatedir"
    r"|url\..+\.(insteadof|pushinsteadof)|remote\..+\.vcs|protocol\.(.+\.)?allow"
    r"|submodule\..+\.update|alias\..+)$"
)
"""git settings that make git read settings or run programs from elsewhere (a file, a
directory of hooks, a rewritten URL): a doubt (an alias only when it is a shell alias)."""

_BOOLEAN = lazy(r"^(true|false|yes|no|on|off|1|0|)$", re.I)

_GIT_CODE_OPTIONS: dict[str, frozenset[str]] = {
    "rebase": frozenset({"-x", "--exec"}),
    "difftool": frozenset({"-x", "--extcmd"}),
    "mergetool": frozenset({"-x", "--extcmd"}),
    "clone": frozenset({"-u", "--upload-pack"}),
    "fetch": frozenset({"--upload-pack"}),
    "pull": frozenset({"--upload-pack"}),
    "ls-remote": frozenset({"--upload-pack"}),
    "fetch-pack": frozenset({"--upload-pack", "--exec"}),
    "archive": frozenset({"--exec"}),
    "push": frozenset({"--receive-pack", "--exec"}),
    "send-pack": frozenset({"--receive-pack", "--exec"}),
    "grep": frozenset({"-O", "--open-files-in-pager"}),
    "instaweb": frozenset({"-d", "--httpd"}),
    "send-email": frozenset(
        {"--to-cmd", "--cc-cmd", "--header-cmd", "--sendmail-cmd", "--smtp-server"}
    ),
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

_SUB_GRAMMAR = {
    sub: grammar(
        values=" ".join(options) + " -m --message -F --file -C -c --config -b --branch --depth "
        "--reference -o --origin --template --remote --prefix --format -t --tool -e --regexp",
        optional="-O --open-files-in-pager",
    )
    for sub, options in _GIT_CODE_OPTIONS.items()
}


def git(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """git's command-carrying settings, options, argv carriers and `ext::` remotes."""
    head = scan(GIT.main, run.argv, 1, stop=True)
    for option in head.options:
        if option.name == "--config-env" and option.value is not None:
            key = (option.value.text or "").partition("=")[0].lower()
            if option.value.text is None or _CODE_KEYS.match(key) or key.startswith("alias."):
                reading.doubt(run, "a git setting takes a command from the environment")
        elif option.name == "-c" and option.value is not None:
            setting(reading, run, option.value, "git -c")
    _shell_alias(reading, run, head)
    command = read_argv(run.argv)
    sub = command.subcommand or ""
    carriers = _GIT_CODE_OPTIONS.get(sub, frozenset())
    words = run.argv[head.rest + 1 :]
    options = scan(_SUB_GRAMMAR[sub], words).options if sub in _SUB_GRAMMAR else command.options
    for option in options:
        if option.name in carriers and (option.value is not None or option.name != "-O"):
            reading.line(option.value, "bash", f"git {sub} {option.name}", run)
        if sub == "clone" and option.name in ("-c", "--config") and option.value is not None:
            setting(reading, run, option.value, f"git {sub} --config")
        if option.name == "--template":
            reading.doubt(run, "`--template` gives the repository hooks from a directory")
    if any(w.text is not None and w.text.lower().startswith("ext::") for w in command.operands):
        reading.doubt(run, "a git `ext::` remote runs a command", True)
    if sub == "config":
        _config(reading, run, run.argv[head.rest + 1 :])
    elif sub == "for-each-repo":
        _for_each_repo(reading, run, run.argv[head.rest + 1 :])
    _git_argv_carriers(reading, run, sub, command.operands)


GIT_FILES = lazy(
    r"(^|/)\.git/(config|hooks(/|$))|(^|/)\.?gitconfig$|(^|/)git/config$"
    r"|(^|/)\.git/modules/.+/(config|hooks(/|$))"
)
"""Files whose content git runs (settings, hooks): a line writing one is a doubt."""

WRITES_GIT_FILES = (
    "the line writes git's settings or hooks, whose commands git runs later: set a setting "
    "with `git config` (loopwarden reads it), not by writing the file"
)


def writes(reading: Reading, run: Run | None, target: Word) -> None:
    """A file the line writes (a redirection, `tee`, `cp`'s target, …): one git runs is a
    doubt."""
    if target.text is not None and GIT_FILES.search(target.text):
        reading.doubt(run, WRITES_GIT_FILES)


def _shell_alias(reading: Reading, run: Run, head: Scan) -> None:
    """`git -c alias.x='!CMD' x ARGS…` runs `CMD ARGS…` through a shell: read with its
    arguments (the setting alone was read as a command too)."""
    if head.rest >= len(run.argv) or run.argv[head.rest].text is None:
        return
    name = (run.argv[head.rest].text or "").lower()
    for option in head.options:
        value = option.value.text if option.name == "-c" and option.value is not None else None
        if value is None:
            continue
        key, _, command = value.partition("=")
        if key.lower() == f"alias.{name}" and command.startswith("!"):
            words = (Word(command[1:]), *run.argv[head.rest + 1 :])
            reading.line(joined(words), "bash", "git alias", run)


def setting(reading: Reading, run: Run, word: Word, via: str) -> None:
    """One `KEY=VALUE` setting (`-c`, `clone --config`): a command-carrying value is read."""
    if word.text is None:
        reading.doubt(run, f"cannot read a `{via}` setting: it is {word.kind}")
        return
    key, eq, value = word.text.partition("=")
    _set(reading, run, key, Word(value) if eq else Word("true"), via)


def _set(reading: Reading, run: Run, key: str, value: Word, via: str) -> None:
    key = key.lower()
    if key.startswith("alias."):
        if value.text is None:
            reading.doubt(run, "a git alias this line defines is computed")
        elif value.text.startswith("!"):
            reading.line(Word(value.text[1:]), "bash", via, run)
        return
    if _CODE_KEYS.match(key):
        if value.text is not None and _BOOLEAN.match(value.text):
            return
        reading.line(value, "bash", via, run)
    elif _ELSEWHERE_KEYS.match(key):
        if (
            key.startswith("submodule.")
            and value.text is not None
            and not value.text.startswith("!")
        ):
            return
        reading.doubt(run, "a git setting makes git read settings or run programs from elsewhere")
    elif (
        key.startswith("remote.")
        and key.endswith(".url")
        and (value.text is None or value.text.lower().startswith("ext::"))
    ):
        reading.doubt(run, "a git `ext::` remote runs a command", True)


_CONFIG = grammar(
    values="-f --file --blob --type --default --comment --value --url --file",
    optional="--includes --no-includes",
)
_CONFIG_READS = frozenset(
    [
        "--get",
        "--get-all",
        "--get-regexp",
        "--get-urlmatch",
        "--get-color",
        "--get-colorbool",
        "-l",
        "--list",
        "--unset",
        "--unset-all",
        "--remove-section",
        "--rename-section",
        "-e",
        "--edit",
        "--show-origin",
        "--show-scope",
        "--name-only",
    ]
)
_CONFIG_SUBCOMMANDS = frozenset({"get", "list", "unset", "remove-section", "rename-section",
                                 "edit"})  # fmt: skip


def _config(reading: Reading, run: Run, words: tuple[Word, ...]) -> None:
    """`git config [options] KEY VALUE`, `git config set KEY VALUE`: a setting written now,
    used by later git commands of the line (or of later lines)."""
    found = scan(_CONFIG, words)
    if found.has("-e", "--edit"):
        return
    operands = [w for _, w in found.operands]
    if operands and operands[0].text in ("set", "get", "list", "unset", "edit"):
        if operands[0].text != "set":
            return
        operands = operands[1:]
    elif found.has(*_CONFIG_READS) or (operands and operands[0].text in _CONFIG_SUBCOMMANDS):
        return
    if len(operands) < 2:
        return
    key = operands[0]
    if key.text is None:
        reading.doubt(run, "`git config` writes a setting whose name is computed")
        return
    _set(reading, run, key.text, operands[1], "git config")


def _for_each_repo(reading: Reading, run: Run, words: tuple[Word, ...]) -> None:
    """`git for-each-repo --config=KEY [--] ARGS…` runs `git ARGS…` in each repository."""
    found = scan(grammar(values="--config", flags="--keep-going"), words, stop=True)
    rest = words[found.rest :]
    if found.maybe_option or found.unknown:
        reading.doubt(run, "cannot tell what `git for-each-repo` runs")
        return
    if rest:
        reading.add((Word("git"), *rest), via="git for-each-repo", parent=run, dialect=run.dialect)


def _git_argv_carriers(
    reading: Reading, run: Run, sub: str | None, operands: Sequence[Word]
) -> None:
    """`git bisect run CMD …` (an argv) and `git submodule foreach CMD` (a shell line)."""
    words = [w.text for w in operands]
    if sub == "bisect" and words[:1] == ["run"]:
        reading.add(tuple(operands[1:]), via="git bisect run", parent=run, dialect=run.dialect)
    if sub == "submodule" and "foreach" in words:
        rest = [w for w in operands[words.index("foreach") + 1 :] if w.text != "--recursive"]
        if rest:
            reading.line(joined(tuple(rest)), "bash", "git submodule foreach", run)
