"""Language runtimes as carriers of code, as data: each interpreter's whole option grammar
(closed: an option it does not list is a doubt), the options that take inline code, those after
which it runs no program of input, those that load code by name (`python -m`, `perl -M`,
`node --import`) with the modules known to run their arguments (`timeit`) and those known not to
(`pytest`), and those that make it read input after its program (`-i`). `shells.interpreter`
applies them.
"""

from __future__ import annotations

from typing import NamedTuple

from loopwarden.policy.commands.options import Grammar, grammar


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


class Interpreter(NamedTuple):
    """A language runtime: its whole option grammar (closed: an option it does not list is a
    doubt), the options that take inline code, those after which it runs no program of input
    (`--version`), those that load code from a name (`python -m`, `perl -M`, `node --import`:
    checked by `modules`), and those that make it read input after its program (`-i`)."""

    grammar: Grammar
    inline: frozenset[str]
    no_input: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    interactive: frozenset[str] = frozenset()


def _interpreter(
    values: str,
    inline: str,
    no_input: str = "",
    optional: str = "",
    flags: str | None = None,
    modules: str = "",
    interactive: str = "",
    ends: str = "",
    clusters: bool = True,
    octal: str = "",
) -> Interpreter:
    g = grammar(values=values, optional=optional, flags=flags, permute=False, clusters=clusters)
    return Interpreter(
        g._replace(ends=_set(ends), octal=_set(octal)), _set(inline), _set(no_input), _set(modules),
        _set(interactive),
    )  # fmt: skip


_PYTHON = _interpreter(
    "-c -m -W -X --check-hash-based-pycs",
    "-c",
    "-V --version -h --help --help-env --help-xoptions --help-all",
    flags="-b -bb -B -d -E -h -i -I -O -OO -P -q -s -S -u -v -V -x --version --help "
    "--help-env --help-xoptions --help-all -VV",
    modules="-m",
    interactive="-i",
    ends="-m -c",
)
INTERPRETERS: dict[str, Interpreter] = {
    "python": _PYTHON,
    "pypy": _PYTHON,
    "perl": _interpreter(
        "-e -E -I -M -m",
        "-e -E",
        "-v -V -h -c",
        optional="-i -x -d -D -C -V -F",
        flags="-a -c -f -g -h -l -0 -n -p -s -S -t -T -u -U -v -w -W -X",
        modules="-M -m -d",
        octal="-l -0",
    ),
    "ruby": _interpreter(
        "-e -I -r -C -E -F -W --encoding --external-encoding --internal-encoding --enable "
        "--disable",
        "-e",
        "-v --version -h --help -c",
        optional="-i -x -W -K -T",
        flags="-0 -a -c -d --debug -l -n -p -s -S -v -w -y --yydebug --verbose --version --help "
        "--copyright --jit -h",
        modules="-r",
        octal="-0",
    ),
    "node": _interpreter(
        "-e --eval -p --print -r --require --import --loader --experimental-loader "
        "--input-type -C --conditions --env-file --title --max-old-space-size --stack-size "
        "--experimental-specifier-resolution --unhandled-rejections --dns-result-order "
        "--max-http-header-size --disable-warning --heapsnapshot-signal --report-dir "
        "--inspect-port --test-reporter --test-reporter-destination --test-name-pattern "
        "--watch-path --openssl-config",
        "-e --eval -p --print",
        "-v --version -h --help -c --check --test",
        optional="--inspect --inspect-brk --inspect-wait --env-file-if-exists",
        flags="-c --check -i --interactive -v --version -h --help --test --watch "
        "--enable-source-maps --no-warnings --trace-warnings --trace-uncaught "
        "--experimental-vm-modules --no-deprecation "
        "--throw-deprecation --pending-deprecation --preserve-symlinks --abort-on-uncaught-exception "
        "--expose-gc --harmony --experimental-strip-types --experimental-transform-types "
        "--no-experimental-fetch "
        "--openssl-legacy-provider --use-openssl-ca --trace-exit --prof --cpu-prof "
        "--heap-prof --experimental-modules --test-only --frozen-intrinsics",
        modules="-r --require --import --loader --experimental-loader",
        interactive="-i --interactive",
    ),
    "deno": _interpreter("", "eval", "-V --version -h --help"),
    "bun": _interpreter("-e --eval -p --print", "-e --eval -p --print", "-v --version -h"),
    "php": _interpreter(
        "-c -d -f -t -S -z -r -B -R -E -F", "-r -B -R -E -F", "-v -h -m -i -l -S -f"
    ),
    "lua": _interpreter("-e -l", "-e", "-v", flags="-i -v -E -W -", modules="-l", interactive="-i"),
    "luajit": _interpreter("-e -l -b -j -O", "-e", "-v -b"),
    "rscript": _interpreter("-e", "-e", "--version"),
    "r": _interpreter("-e -f --file", "-e", "--version -f --file"),
    "osascript": _interpreter("-e -l -s", "-e"),
    "julia": _interpreter("-e -E -L --project -t --threads", "-e -E", "-v --version -h"),
    "tclsh": _interpreter("", "", flags="-encoding"),
    "wish": _interpreter("", ""),
    "expect": _interpreter("-c -f -D", "-c", "-v", flags="-d -i -n -N -b -v -"),
    "groovy": _interpreter("-e", "-e", "-v --version"),
    "elixir": _interpreter("-e --eval -r", "-e --eval", "-v --version"),
    "erl": _interpreter("-eval -s -run", "-eval -s -run", "-version", clusters=False),
    "guile": _interpreter("-c -l -e", "-c", "-v --version"),
    "racket": _interpreter("-e --eval -l -t -r", "-e --eval", "-v --version"),
    "gdb": _interpreter(
        "-ex --eval-command -x --command -p --pid -iex --init-eval-command -ix --init-command "
        "-cd --directory -s --symbols -e --exec -se -c --core -ex= -eval-command",
        "-ex --eval-command -iex --init-eval-command -eval-command",
        "--version -version",
        modules="-x --command -ix --init-command -command",
        clusters=False,
        ends="--args -args",
    ),
}
"""Interpreters given inline code are opaque (their code may run any command); one without a
program to run reads it from input, which is opaque too. `python3.12`, `nodejs`, … are these."""

CODE_MODULES: dict[str, frozenset[str]] = {
    "python": frozenset(
        [
            "timeit",
            "pdb",
            "code",
            "asyncio",
            "cProfile",
            "profile",
            "trace",
            "runpy",
            "doctest",
            "idlelib",
            "idlelib.idle",
            "IPython",
            "ipython",
            "webbrowser",
            "ensurepip",
        ]
    ),
}
"""Modules that run code or programs they are given as arguments (`python -m timeit CODE`,
`-m pdb -c CMD`, `-m runpy MODULE`): opaque."""

INERT_MODULES: dict[str, frozenset[str]] = {
    "python": frozenset(
        [
            "pytest",
            "pip",
            "venv",
            "virtualenv",
            "json.tool",
            "http.server",
            "unittest",
            "mypy",
            "black",
            "ruff",
            "isort",
            "flake8",
            "pylint",
            "build",
            "twine",
            "compileall",
            "py_compile",
            "coverage",
            "pydoc",
            "site",
            "sysconfig",
            "platform",
            "zipfile",
            "tarfile",
            "gzip",
            "base64",
            "calendar",
            "uuid",
            "tokenize",
            "ast",
            "dis",
            "tabnanny",
            "pyclbr",
            "pipx",
            "poetry",
            "uv",
            "tox",
            "nox",
            "pre_commit",
            "sphinx",
            "mkdocs",
            "jupyter",
            "notebook",
            "ipykernel",
            "uvicorn",
            "gunicorn",
            "flask",
            "django",
            "alembic",
            "celery",
            "hypothesis",
            "sqlite3",
            "encodings.rot_13",
            "this",
            "idlelib.idle",
            "pip._internal",
            "nuitka",
            "pyright",
            "pytest_benchmark",
            "bandit",
            "safety",
            "pip_audit",
            "yamllint",
            "jsonschema",
            "locust",
        ]
    ),
    "perl": frozenset(
        ["strict", "warnings", "utf8", "POSIX", "Data::Dumper", "JSON::PP", "List::Util"]
    ),
    "ruby": frozenset(["json", "yaml", "set", "pp", "fileutils", "optparse"]),
    "node": frozenset(
        [
            "ts-node/register",
            "tsx",
            "ts-node/esm",
            "@babel/register",
            "dotenv/config",
            "source-map-support/register",
            "esm",
        ]
    ),
}
"""Modules an interpreter may load by name (`python -m pytest`, `node -r dotenv/config`) that
run no code of the line's (they run the project's files, as any program may). Any other module
named on the line is a doubt: a module such as `timeit` runs its arguments as code, and a
`data:` URL or a name loopwarden does not know may be anything."""


def interpreter(name: str) -> Interpreter | None:
    """The interpreter `name` runs (`python3.12` is python, `nodejs` node), if any."""
    base = interpreter_base(name)
    return INTERPRETERS.get(base)


def interpreter_base(name: str) -> str:
    base = name.rstrip("0123456789.")
    if base == "nodejs":
        base = "node"
    if base in ("python", "pypy", "pypy-c"):
        base = "pypy" if base.startswith("pypy") else "python"
    if base == "pypy":
        base = "python"
    return base
