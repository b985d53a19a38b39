"""Command rules in a closed world (issue 42): a line is admitted only when the reader understood
every construct in it.

Ground truth both ways, on corpora written for this issue: an evasion corpus written without the
reader's tables in view (`closed-world.txt`, each line confirmed in a real bash) must be denied
line for line; ordinary lines in the shapes of agent sessions (`sessions.txt`) must be at least
99.5% admitted; every escape the differential generator found (`generated.txt`) stays denied.
Then the parts: the construct lists cover the whole grammar, each kind of doubt says which
construct and what to do, data bash evaluates as code, launchers' whole option grammars,
programs' command-running options, unknown programs, git's settings, stdin's many names, the
shells read and not read, and the precision the issue asks for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bashtruth import Sandbox
from corpora import Entry, load

from loopwarden.policy.commands import bash, bystanders, evaluation, launchers, readers, shells
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import command_reasons
from loopwarden.policy.model import CommandRules

DENY = CommandRules(deny=("git push", "rm -r -f"))
LEGACY = CommandRules(deny=("git push*", "rm -rf *"))
SESSIONS = load("sessions.txt")
CLOSED = load("closed-world.txt")
GENERATED = load("generated.txt")


def messages(rules: CommandRules, line: str) -> list[str]:
    return [r.message for r in command_reasons(rules, line)]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox()
    yield box
    box.close()


# --- the corpora ------------------------------------------------------------------------------


def test_the_new_corpora_are_as_large_as_the_issue_asks():
    assert len(SESSIONS) >= 300
    assert len({e.group for e in SESSIONS}) >= 10, "shapes from many kinds of session"
    assert sum(e.bash for e in CLOSED) >= 150, "evasions confirmed in a real bash"
    assert len({e.group for e in CLOSED}) >= 10, "every family of the issue"


@pytest.mark.parametrize("rules", [DENY, LEGACY], ids=["rules", "legacy-globs"])
def test_at_least_99_5_percent_of_session_lines_are_admitted(rules):
    refused = []
    for entry in SESSIONS:
        accepting = CommandRules(deny=rules.deny, opaque=entry.opaque or None)
        if command_reasons(accepting, entry.line):
            refused.append((entry.number, entry.line))
    assert len(refused) * 1000 <= len(SESSIONS) * 5, refused


def test_an_opaque_entry_accepts_the_here_document_and_here_string_forms():
    rules = CommandRules(deny=("git push",), opaque=("python3 -",))
    assert not command_reasons(rules, "python3 - <<'EOF'\nprint(1)\nEOF")
    assert not command_reasons(rules, "python3 - <<< 'print(1)'")
    assert not command_reasons(rules, "cat <<'EOF' | python3 -\nprint(1)\nEOF")
    assert command_reasons(rules, "python3 <<'EOF'\nprint(1)\nEOF"), "only what it names"
    assert command_reasons(DENY, "python3 - <<'EOF'\nprint(1)\nEOF"), "opaque unless accepted"


@pytest.mark.parametrize(
    "entry", [*CLOSED, *GENERATED], ids=lambda e: f"{e.group[:20]}-L{e.number}"
)
def test_every_closed_world_evasion_is_denied(entry):
    assert command_reasons(DENY, entry.line), entry.line
    assert command_reasons(LEGACY, entry.line), entry.line


def _really_run(sandbox: Sandbox, entries: list[Entry]) -> None:
    ran = sandbox.run([e.line for e in entries])
    missing = [(e.number, e.line) for e, commands in zip(entries, ran, strict=True) if not commands]
    assert missing == [], "each corpus line is a real evasion"


def _evasions_bash_runs() -> list[Entry]:
    return [e for e in (*CLOSED, *GENERATED) if e.bash]


def test_a_sample_of_the_closed_world_evasions_really_runs_its_denied_command_in_bash(sandbox):
    """The short variant: the first line of each family and every fourth line (the whole corpus
    takes a process or more per line, about 400 lines: the slow variant below)."""
    seen: set[str] = set()
    sample = []
    for i, entry in enumerate(_evasions_bash_runs()):
        if entry.group not in seen or i % 4 == 0:
            sample.append(entry)
        seen.add(entry.group)
    _really_run(sandbox, sample)


@pytest.mark.slow
def test_each_closed_world_evasion_really_runs_its_denied_command_in_bash(sandbox):
    _really_run(sandbox, _evasions_bash_runs())


def test_no_reason_says_the_grammar_passed_over_part_of_the_line():
    for entry in (*CLOSED, *SESSIONS):
        for message in messages(DENY, entry.line):
            assert "passed over" not in message, (entry.line, message)


# --- the constructs read ----------------------------------------------------------------------


def test_every_node_type_of_the_grammar_is_read_or_a_doubt():
    import tree_sitter
    import tree_sitter_bash

    language = tree_sitter.Language(tree_sitter_bash.language())
    named = {
        language.node_kind_for_id(i)
        for i in range(language.node_kind_count)
        if language.node_kind_is_named(i) and language.node_kind_is_visible(i)
    }
    assert named <= bash.STATEMENTS | evaluation.WORDS | bash.INNER, (
        "a new node type: read it or doubt"
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("time { git status; }", "`time` before a `{ }` group is not read"),
        ("time -p { git status; }", "`time` before a `{ }` group is not read"),
        ("time if true; then git status; fi", "`time` before an `if` block is not read"),
        ("coproc { git status; }", "`coproc` before a `{ }` group is not read"),
        ("coproc NAME { git status; }", "`coproc` before a `{ }` group is not read"),
        ("! { git status; }", "`!` before a `{ }` group is not read"),
        (": ${y:-`git status`}", "a substitution inside `${…}`"),
        ("x=1; : ${x#$(git status)}", "a substitution inside `${…}`"),
        ("cat <<EOF\n`git status`\nEOF", "quote its delimiter (<<'EOF')"),
        ("x='$(id)'; echo ${x@P}", "use the value without @P"),
        ("echo ${!x}", "a variable named by another variable's value"),
        ("test -v 'a[$(id)]'", "a subscript holds a command substitution"),
        ("declare 'a[$(id)]=1'", "a subscript holds a command substitution"),
        ("x=$(cat f); echo $((x))", "arithmetic reads a variable this line does not set"),
        ("lwrun git status", "cannot tell whether `lwrun` runs `git`"),
        ("timeout --bogus 5 git status", "`timeout` is given an option loopwarden does not know"),
        ("zsh -c 'noglob git status'", "`zsh` runs text in a shell language no grammar here reads"),
        ("echo ${!x@Q}", "a `${…}` form loopwarden does not read"),
    ],
)
def test_a_doubt_names_the_construct_and_what_to_do(line, says):
    told = " ".join(messages(DENY, line))
    assert says in told, told


@pytest.mark.parametrize(
    "line",
    [
        'files=(a.py b.py); for f in "${files[@]}"; do python3 -m py_compile "$f"; done',
        'args=(-q -x); pytest "${args[@]}"',
        'echo "${#files[@]} files"; echo ${#PATH}',
        "n=0; for f in *.py; do n=$((n + 1)); done; echo $n",
        "total=0; for i in 1 2 3; do total=$((total + i)); done",
        "for ((i = 0; i < 3; i++)); do echo $i; done",
        "start=$(date +%s); sleep 1; echo $(( $(date +%s) - start ))",
        "x=5; (( x > 3 )) && echo big",
        'sed -i "s/VERSION/$VERSION/" setup.cfg',
        'sed "s|@PREFIX@|${PREFIX:-/usr}|g" in > out',
        "rm -f build/*.o",
        "rm *.pyc",
        "git commit -F - <<'MSG'\nfix\nMSG",
        "kubectl apply -f - <<'EOF'\nkind: Namespace\nEOF",
        "gh pr create --title t --body-file - <<'EOF'\nbody\nEOF",
        "awk '/ERROR|WARN/ {c++} END {print c+0}' app.log",
        "awk -F, '$1 == \"|\" {next} {print}' t.csv",
        "awk '$5 ~ /systemd/' ps.txt",
        'tmp=$(mktemp -d); rm -r "$tmp"',
        "[[ $branch =~ ^release/ ]] && echo yes",
        'declare -A m=([a]=1 [b]=2); for k in "${!m[@]}"; do echo "$k ${m[$k]}"; done',
        'git grep -n "rm -rf" -- docs',
        "timeout --sig KILL 20 git status",
        "env --chdir=. git status",
        "chrt -o 0 git status",
        "python3 -m pytest -q -k 'not slow'",
        '[[ $# -eq 0 ]] && echo none; [[ "$?" -ne 0 ]] && echo failed',
        "for i in $(seq 1 5); do echo $((i * 2)); done",
        "n=$(grep -c TODO src/a.py); [[ $n -gt 0 ]] && echo some",
        "time ( git status )",
    ],
)
def test_what_the_issue_asks_to_read_precisely_is_admitted(line):
    assert messages(DENY, line) == []


# --- data bash evaluates as code --------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "x='a[$(git status)]'; (( x ))",
        "x='a[$(git status)]'; [[ $x -eq 0 ]]",
        "x='a[$(git status)]'; [[ x -lt 1 ]]",
        "x='a[$(git status)]'; arr[x]=1",
        "x='a[$(git status)]'; echo ${arr[x]}",
        "x='a[$(git status)]'; y=abc; echo ${y:x}",
        "declare -i n; n='a[$(git status)]'",
        "declare -i n='a[$(git status)]'",
        "let 'x=a[$(git status)]'",
        "printf -v 'a[$(git status)]' x",
        "read 'a[$(git status)]' <<< x",
        "unset 'a[$(git status)]'",
        "[[ -v 'a[$(git status)]' ]]",
        "[ -v 'a[$(git status)]' ]",
        "declare -n r='a[$(git status)]'; echo $r",
        "builtin declare 'a[$(git status)]=1'",
        "read x; echo $((x))",
        "echo $((RANDOMX + 1))",
    ],
)
def test_text_bash_would_evaluate_as_code_is_a_doubt(line):
    assert command_reasons(DENY, line), line


# --- the three classes of programs --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "runs"),
    [
        ("chrt -o 0 git push", True),
        ("chrt --other 0 git push", True),
        ("taskset -c 0 git push", True),
        ("prlimit --nofile=1024 -- git push", True),
        ("setarch x86_64 -R git push", True),
        ("unshare --user --map-root-user git push", True),
        ("setpriv --reuid=0 git push", True),
        ("fakeroot -- git push", True),
        ("ssh-agent git push", True),
        ("dbus-run-session -- git push", True),
        ("sg root -c 'git push'", True),
        ("timeout --sig KILL 20 git push", True),
        ("timeout --s KILL 20 git push", True),
        ("env --spl 'git push'", True),
        ("xargs --max-a 1 git push", True),
        ("script /dev/null -qc 'git push'", True),
        ("strace --output /dev/null git push", True),
        ("nice --adj 5 git push", True),
        ("flock --tim 5 .lock git push", True),
        ("chrt -p 0 1234", False),
        ("taskset -p 1234", False),
    ],
)
def test_launchers_are_read_with_their_whole_option_grammar(line, runs):
    codes = [r.code for r in command_reasons(DENY, line)]
    assert (ReasonCode.COMMAND_DENIED in codes) is runs, (line, messages(DENY, line))


def test_every_launcher_grammar_is_closed_but_the_ones_that_take_no_separate_values():
    open_ones = {n for n, spec in launchers.LAUNCHERS.items() if not spec.grammar.closed}
    assert open_ones == {"valgrind", "firejail", "cross-env"}


def test_every_launcher_is_in_the_docs_list():
    docs = (Path(__file__).parent.parent / "docs" / "hooks.md").read_text()
    section = docs[docs.index("## Command rules") : docs.index("## Checked inside the real hosts")]
    missing = [
        name
        for name in launchers.LAUNCHERS
        if f"`{name}`" not in section
        and f"`{name.split()[0]} {name.split()[-1]}" not in section
        and f"`{name.split()[0]}" not in section
    ]
    assert missing == []


def test_every_bystander_reader_exists():
    assert {s.reader for s in bystanders.BYSTANDERS.values() if s.reader} <= set(readers.READERS)


@pytest.mark.parametrize(
    "line",
    [
        "tar -cf x.tar --checkpoint=1 --checkpoint-action=exec='git push' .",
        "tar -xf x.tar --to-com 'git push'",
        "tar -c -I 'git push' -f x.tar .",
        "tar --use-compress-prog 'git push' -cf x.tar .",
        "tar cIf 'git push' x.tar .",
        "ssh -o ProxyCommand='git push' host",
        "ssh -oproxycommand='git push' host",
        "ssh -o 'LocalCommand git push' host",
        "scp -o ProxyCommand='git push' a host:b",
        "gcc -wrapper git,push -c x.c",
        "sqlite3 :memory: '.shell git push'",
        "sqlite3 -cmd '.system git push' db",
        "echo '.shell git push' | sqlite3",
        "ed -s f <<< '!git push'",
        "vim -es -c '!git push' -c 'qa!'",
        "vim -es -c 'call system(\"git push\")' -c 'qa!'",
        "split --filter='git push' f",
        "zip -T -TT 'git push' a.zip f",
        "awk -f /dev/stdin <<< 'BEGIN{system(\"git push\")}'",
        "sed -f <(echo '1e git push') f",
        "make -f - <<< $'x:\\n\\tgit push'",
        "make --eval 'x: ; git push' x",
        "python3 -m timeit 'import os; os.system(\"git push\")'",
        "perl '-Mstrict;system q(git push)' /dev/null",
        "node --import 'data:text/javascript,0' x.js",
        "NODE_OPTIONS='--require ./x.js' node app.js",
        "PERL5OPT=-Mfoo perl x.pl",
        "BASH_ENV=x.sh bash -c true",
        "BASH_CMDS[ls]=/usr/bin/git; ls push",
        "compgen -W '$(git push)' x",
        "mapfile -C 'git push #' -c 1 a < f",
        "fc -e 'git push'",
        "rg --pre git x",
        "find . -name x | fd -x git push",
    ],
)
def test_options_and_small_languages_that_run_a_command_are_read_or_doubted(line):
    assert command_reasons(DENY, line), line


@pytest.mark.parametrize(
    "line",
    [
        "lwrun git push",
        "./deploy.sh git push",
        "lwrun /usr/bin/git push",
        "lwrun $'\\x67it' push",
        'lwrun "$(echo git)" push',
        "lwrun --cmd='git push'",
        "x=git; lwrun $x push",
        "lwsh <<< 'git push'",
        "lwrun rm -rf victim",
    ],
)
def test_an_unknown_program_whose_words_name_a_rules_program_is_a_doubt(line):
    told = messages(DENY, line)
    assert any("cannot tell whether" in m for m in told), told


def test_an_unknown_program_is_not_a_doubt_when_its_words_name_no_rules_program():
    assert messages(DENY, "lwrun pytest -q") == []
    assert messages(DENY, 'mytool --out "$DIR"') == []


# --- git ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "git -c difftool.x.cmd='git push' difftool -y -t x",
        "git -c man.x.cmd='git push' help -m push",
        "git -c trailer.s.cmd='git push' interpret-trailers",
        "git -c gpg.ssh.defaultKeyCommand='git push' commit -S -m x",
        "git -c core.fsmonitor='git push' status",
        "git config core.fsmonitor 'git push'; git status",
        "git config --global core.fsmonitor 'git push'",
        "git config --add core.pager 'git push'",
        "git -c include.path=x.cfg status",
        "git -c core.hooksPath=h commit -m x",
        "git -c protocol.ext.allow=always fetch 'ext::sh -c x'",
        "git -c remote.o.url=ext::x fetch o",
        "git for-each-repo --config=x push",
        "git fetch-pack --upload-pack='git push' . main",
        "/usr/lib/git-core/git-push origin main",
        "git clone -c core.fsmonitor='git push' . /tmp/x",
        "git grep -O'git push' x",
        "GIT_CONFIG_GLOBAL=x.cfg git status",
    ],
)
def test_git_settings_and_options_that_run_a_command_are_read_or_doubted(line):
    assert command_reasons(DENY, line), line


def test_ordinary_git_settings_stay_admitted():
    for line in [
        "git -c user.name=x -c color.ui=never commit -m m",
        "git config user.email a@b.c",
        "git config --get remote.origin.url",
        "git -c core.fsmonitor=false status",
        "git config core.pager 'less -R'",
    ]:
        assert messages(DENY, line) == [], line


# --- stdin, shells --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["-", "/dev/stdin", "/dev//stdin", "//dev/stdin", "/dev/./stdin", "/dev/../dev/stdin",
     "/dev/fd/0", "/dev//fd//0", "/proc/self/fd/0", "/proc/thread-self/fd/0", "/proc/1/fd/0",
     "/proc/self/task/1/fd/0", "/dev/fd/3"],
)  # fmt: skip
def test_stdin_is_one_thing_under_every_spelling(path):
    assert shells.input_path(path)
    assert command_reasons(DENY, f"source {path} <<< 'git push'")


def test_shells_without_a_real_grammar_here_are_opaque():
    for line in ["zsh -c 'git status'", "fish -c 'ls'", "ksh -c ls", "echo ls | zsh"]:
        assert [r.code for r in command_reasons(DENY, line)] == [ReasonCode.COMMAND_OPAQUE], line
    assert not command_reasons(DENY, "zsh ./script.zsh"), "a script file is a program"
    assert "zsh" in launchers.FOREIGN_SHELLS and "bash" in launchers.SHELLS


# --- reasons never quote the line --------------------------------------------------------------

SECRET = "ghp_" + "Q" * 36


@pytest.mark.parametrize(
    "line",
    [
        f"lwrun {SECRET} git push",
        f"lwrun --token={SECRET} rm -rf x",
        f"timeout --{SECRET} 5 git push",
        f"tar -cf x.tar --checkpoint-action=exec='{SECRET} git push' .",
        f"sed 's/a/{SECRET}/e' f",
        f"git -c alias.{SECRET}='!sh' {SECRET}",
        f"x='a[$({SECRET})]'; (( x ))",
        f"time {{ {SECRET}; }}",
        f"{SECRET}=1; echo ${{!{SECRET}}}",
        f"zsh -c '{SECRET}'",
        f"python3 -m {SECRET} git push",
        f"echo {SECRET} | xargs lwrun",
        f"brew sh {SECRET}",
        f"printf x > .git/hooks/{SECRET}",
    ],
)
def test_a_closed_world_reason_never_quotes_the_line(line):
    allow = CommandRules(allow=("ls", "git status"), deny=("git push", "rm -r -f"))
    for rules in (DENY, allow):
        told = messages(rules, line)
        assert told, line
        assert all(SECRET not in m for m in told), told
