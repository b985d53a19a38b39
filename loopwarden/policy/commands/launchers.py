"""Programs that run another command, as data: each one's option grammar and where its command
starts (`carriers.py` applies them).

A launcher is read with its own grammar up to its first operand (its options end there, as
its own parser does); `before` operands come next (`timeout`'s duration, `flock`'s lock file,
`chroot`'s new root), then the command it runs. `shell` options carry a shell line instead
(`flock -c`, `su -c`, `script -c`); `joined` launchers run their words through a shell (`watch`
without `-x`); `tail` ones add words from input (`xargs`). Without a command, `bare` says what
it does: nothing, or run a shell that reads its commands from input (opaque). `transparent`
launchers only change how their command runs, so allow rules need not name them; the ones that
change who or where it runs (`sudo`, `doas`, `su`, `chroot`) must be allowed by name.
"""

from __future__ import annotations

from typing import NamedTuple

from loopwarden.policy.commands.options import Grammar, grammar
from loopwarden.policy.commands.runs import Tail


class Launcher(NamedTuple):
    grammar: Grammar
    before: int = 0
    shell: frozenset[str] = frozenset()  # options whose value is a shell line
    joined: bool = False  # the command's words are joined and run by `sh -c`
    exec_options: frozenset[str] = frozenset()  # options that make a joined launcher exec
    join_options: frozenset[str] = frozenset()  # options that make it run its words by a shell
    tail: Tail = ""
    replace: frozenset[str] = frozenset()  # options naming a placeholder filled from input
    no_run: frozenset[str] = frozenset()  # with one of these it runs no command
    shell_flags: frozenset[str] = frozenset()  # without a command, these run a shell
    bare: str = "nothing"  # without a command: "nothing" | "shell"
    transparent: bool = True
    assignments: bool = False  # `NAME=VALUE` words before the command (env)
    split: frozenset[str] = frozenset()  # options whose value is split into more arguments
    after_dashdash: bool = False  # the command starts after `--` (mise exec)


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _launcher(values: str = "", flags: str = "", optional: str = "", **kw: object) -> Launcher:
    del flags  # listed for the reader of the table: any option not taking a value is a flag
    return Launcher(grammar(values=values, optional=optional, permute=False), **kw)  # type: ignore[arg-type]


LAUNCHERS: dict[str, Launcher] = {
    "sudo": _launcher(
        values="-u --user -g --group -p --prompt -C --close-from -D --chdir -r --role -t --type "
        "-T --command-timeout -U --other-user -R --chroot --host",
        flags="-A -b -E -H -n -P -S -k -s -i -h",
        optional="--preserve-env",
        no_run=_set("-l --list -v --validate -K --remove-timestamp -V --version -e --edit -h"),
        shell_flags=_set("-s --shell -i --login"),
        transparent=False,
    ),
    "doas": _launcher(
        values="-u -C",
        flags="-n -s -L",
        no_run=_set("-L -C"),
        shell_flags=_set("-s"),
        transparent=False,
    ),
    "su": Launcher(
        grammar(
            values="-c --command --session-command -s --shell -g --group -G --supp-group "
            "-w --whitelist-environment -u --user"
        ),
        shell=_set("-c --command --session-command"),
        bare="shell",
        transparent=False,
    ),
    "runuser": _launcher(
        values="-u --user -g --group -G --supp-group -c --command --session-command -s --shell "
        "-w --whitelist-environment",
        shell=_set("-c --command --session-command"),
        transparent=False,
    ),
    "chroot": _launcher(
        values="--userspec --groups",
        flags="--skip-chdir",
        before=1,
        bare="shell",
        transparent=False,
    ),
    "timeout": _launcher(
        values="-s --signal -k --kill-after", flags="--preserve-status --foreground -v", before=1
    ),
    "nice": _launcher(values="-n --adjustment"),
    "ionice": _launcher(
        values="-c --class -n --classdata -p --pid -P --pgid -u --uid",
        flags="-t --ignore",
        no_run=_set("-p --pid -P --pgid -u --uid"),
    ),
    "nohup": _launcher(),
    "setsid": _launcher(flags="-c -f -w"),
    "time": _launcher(values="-o --output -f --format", flags="-p -a -v -q"),
    "stdbuf": _launcher(values="-i -o -e --input --output --error"),
    "flock": _launcher(
        values="-w --timeout -E --conflict-exit-code -c --command",
        flags="-s -x -e -u -n -o -F --verbose",
        before=1,
        shell=_set("-c --command"),
    ),
    "watch": _launcher(
        values="-n --interval -q --equexit",
        flags="-t -b -e -g -c -p -w -x --exec",
        optional="-d --differences",
        joined=True,
        exec_options=_set("-x --exec"),
    ),
    "command": _launcher(flags="-p -v -V", no_run=_set("-v -V")),
    "builtin": _launcher(),
    "exec": _launcher(values="-a", flags="-c -l"),
    "coproc": _launcher(),
    "xargs": _launcher(
        values="-a --arg-file -d --delimiter -E -I -L --max-lines -n --max-args -P --max-procs "
        "-s --max-chars --process-slot-var",
        flags="-0 -o -p -r -t -x --null --open-tty --interactive --no-run-if-empty --verbose",
        optional="-e --eof -i --replace -l",
        tail="words",
        replace=_set("-I -i --replace"),
    ),
    "env": _launcher(
        values="-u --unset -C --chdir -S --split-string",
        flags="-i -0 -v --ignore-environment --null --debug",
        optional="--block-signal --default-signal --ignore-signal",
        assignments=True,
        split=_set("-S --split-string"),
    ),
    "busybox": _launcher(),
    "strace": _launcher(values="-o -e -p -s -u -E -a -b -I -O -P -S -X"),
    "ltrace": _launcher(values="-o -e -p -s -u -a -n -l -L"),
    "script": _launcher(
        values="-c --command -E --echo -I -O -T -B -m", shell=_set("-c --command"), bare="shell"
    ),
    "caffeinate": _launcher(values="-t -w", flags="-d -i -m -s -u"),
    "unbuffer": _launcher(flags="-p"),
    "npx": _launcher(values="-p --package -c --call", shell=_set("-c --call")),
    "bunx": _launcher(values="-p --package"),
    "uvx": _launcher(values="--from --with -p --python --index"),
    "pipx run": _launcher(values="--spec --python"),
    "npm exec": _launcher(values="-p --package -c --call -w --workspace", shell=_set("-c --call")),
    "pnpm exec": _launcher(
        values="--filter -F -C --dir",
        flags="-c --shell-mode -r",
        join_options=_set("-c --shell-mode"),
    ),
    "pnpm dlx": _launcher(values="-p --package"),
    "yarn exec": _launcher(),
    "yarn dlx": _launcher(values="-p --package"),
    "uv run": _launcher(
        values="--with -p --python --project --directory --package --extra --group --env-file "
        "--index --with-requirements --only-group",
    ),
    "poetry run": _launcher(values="-C --directory -P --project"),
    "pipenv run": _launcher(),
    "pdm run": _launcher(values="-p --project"),
    "hatch run": _launcher(),
    "rye run": _launcher(),
    "conda run": _launcher(values="-n --name -p --prefix"),
    "bundle exec": _launcher(),
    "mise exec": _launcher(values="-C --cd", after_dashdash=True),
    "mise x": _launcher(values="-C --cd", after_dashdash=True),
    "direnv exec": _launcher(before=1),
    "nix-shell": _launcher(values="-p --packages -A --attr -I", shell=_set("--run --command")),
}
"""Every launcher loopwarden unwraps (docs/hooks.md lists them). A two-word name is a program
and its subcommand (`uv run`)."""

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "posh", "lksh"})
"""Shells whose `-c` text and input are bash-like enough to read with the bash grammar."""

POWERSHELLS = frozenset({"pwsh", "powershell"})

FOREIGN_SHELLS = frozenset({"fish", "csh", "tcsh", "cmd", "nu", "xonsh", "elvish", "rc", "es"})
"""Shells whose language loopwarden does not read: any use is opaque."""

SHELL_GRAMMAR = grammar(
    values="-o +o -O +O --rcfile --init-file",
    permute=False,
    plus=True,
)


class Interpreter(NamedTuple):
    """A language runtime: the options that take inline code, those after which it runs no
    program of input (a module, `--version`), and its option grammar."""

    grammar: Grammar
    inline: frozenset[str]
    no_input: frozenset[str] = frozenset()


def _interpreter(values: str, inline: str, no_input: str = "", optional: str = "") -> Interpreter:
    return Interpreter(
        grammar(values=values, optional=optional, permute=False), _set(inline), _set(no_input)
    )


_PYTHON = _interpreter("-c -m -W -X --check-hash-based-pycs", "-c", "-m -V --version -h --help")
INTERPRETERS: dict[str, Interpreter] = {
    "python": _PYTHON,
    "pypy": _PYTHON,
    "perl": _interpreter(
        "-e -E -I -M -m -x -C -d -D", "-e -E", "-v -V -h -c", optional="-i -l -0 -x"
    ),
    "ruby": _interpreter("-e -I -r -C -E -F -W", "-e", "-v --version -h --help -c"),
    "node": _interpreter(
        "-e --eval -p --print -r --require --import --loader --experimental-loader "
        "--input-type -C --conditions --env-file",
        "-e --eval -p --print",
        "-v --version -h --help -c --check --test",
    ),
    "deno": _interpreter("", "eval", "-V --version -h --help"),
    "bun": _interpreter("-e --eval -p --print", "-e --eval -p --print", "-v --version -h"),
    "php": _interpreter(
        "-c -d -f -t -S -z -r -B -R -E -F", "-r -B -R -E -F", "-v -h -m -i -l -S -f"
    ),
    "lua": _interpreter("-e -l", "-e", "-v"),
    "luajit": _interpreter("-e -l -b -j -O", "-e", "-v -b"),
    "rscript": _interpreter("-e", "-e", "--version"),
    "r": _interpreter("-e -f --file", "-e", "--version -f --file"),
    "osascript": _interpreter("-e -l -s", "-e"),
    "julia": _interpreter("-e -E -L --project -t --threads", "-e -E", "-v --version -h"),
    "tclsh": _interpreter("", ""),
    "wish": _interpreter("", ""),
    "groovy": _interpreter("-e", "-e", "-v --version"),
    "elixir": _interpreter("-e --eval -r", "-e --eval", "-v --version"),
    "erl": _interpreter("-eval -s -run", "-eval -s -run", "-version"),
    "guile": _interpreter("-c -l -e", "-c", "-v --version"),
    "racket": _interpreter("-e --eval -l -t -r", "-e --eval", "-v --version"),
    "gdb": _interpreter("-ex --eval-command -x --command -p", "-ex --eval-command", "--version"),
}
"""Interpreters given inline code are opaque (their code may run any command); one without a
program to run reads it from input, which is opaque too. `python3.12`, `nodejs`, … are these."""


def interpreter(name: str) -> Interpreter | None:
    """The interpreter `name` runs (`python3.12` is python, `nodejs` node), if any."""
    base = name.rstrip("0123456789.")
    if base == "nodejs":
        base = "node"
    if base in ("python", "pypy", "pypy-c"):
        base = "pypy" if base.startswith("pypy") else "python"
    return INTERPRETERS.get(base)
