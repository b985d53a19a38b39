"""Well-known programs, as data: their global options and arities, subcommands and subcommand
aliases, flag aliases, and how their own aliases are defined, so that a rule means the command
and not its spelling (`git push` covers `git -C d -c k=v --no-pager push`, `rm -r -f` covers
`rm -Rf` and `rm --recursive --force`).

`read` turns one argv into a `Command`: the program, its subcommand (resolved through the
program's aliases and inline alias definitions such as `git -c alias.p=push p`), its options
under canonical names and its operands. What it cannot resolve it says (`subcommand_doubt`),
so that a rule depending on it denies rather than guesses.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple

from loopwarden.policy.commands.options import Grammar, Option, Scan, grammar, scan
from loopwarden.policy.commands.words import Word

_NONE: Mapping[str, str] = MappingProxyType({})
_NO_PAIRS: Mapping[tuple[str, str], str] = MappingProxyType({})
_SUFFIXES = (".exe", ".com", ".cmd", ".bat")


@lru_cache(maxsize=4096)
def program_name(text: str) -> str:
    """How a rule names a program: the basename (`/usr/bin/git`, `C:\\Git\\git.exe` → `git`),
    without case (macOS and Windows file systems run `GIT` as git) or a Windows suffix."""
    base = re.split(r"[/\\]", text)[-1] or text
    base = base.lower()
    for suffix in _SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return base[: -len(suffix)]
    return base


class Program(NamedTuple):
    """One program's command grammar.

    `main` reads the options before the subcommand (all options, for a program without
    subcommands); `known` lists every option `main` may meet there (None: any). `subcommands`
    (None: the program has none) and `aliases` (spelling → subcommand) name what it runs;
    an unknown subcommand is a doubt when `unknown_doubt` (an alias or extension could run
    anything: git, npm, kubectl), else a script or operand (pnpm, yarn). `sub` reads what follows
    the subcommand; `pairs` fold two-word forms (`docker image push` → `push`), `by_flag`
    subcommands a flag turns into another (`terraform apply -destroy` → `destroy`)."""

    main: Grammar
    known: frozenset[str] | None = None
    subcommands: frozenset[str] | None = None
    aliases: Mapping[str, str] = _NONE
    unknown_doubt: bool = True
    sub: Grammar | None = None
    pairs: Mapping[tuple[str, str], str] = _NO_PAIRS
    by_flag: Mapping[tuple[str, str], str] = _NO_PAIRS
    inline_aliases: str = ""  # the option whose `alias.NAME=VALUE` values define aliases


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_GIT_GLOBAL = grammar(
    values="-C -c --exec-path --git-dir --work-tree --namespace --super-prefix --config-env "
    "--list-cmds --attr-source",
    optional="--exec-path",
    clusters=False,
)
GIT = Program(
    main=_GIT_GLOBAL,
    known=_words(
        "-C -c -v --version -h --help --exec-path --html-path --man-path --info-path -p "
        "--paginate -P --no-pager --no-replace-objects --no-lazy-fetch --no-optional-locks "
        "--no-advice --bare --git-dir --work-tree --namespace --super-prefix --config-env "
        "--list-cmds --attr-source --literal-pathspecs --glob-pathspecs --noglob-pathspecs "
        "--icase-pathspecs"
    ),
    subcommands=_words(
        "add am annotate apply archimport archive backfill bisect blame branch bugreport bundle "
        "cat-file check-attr check-ignore check-mailmap check-ref-format checkout "
        "checkout-index cherry cherry-pick citool clean clone column commit commit-graph "
        "commit-tree config count-objects credential credential-cache credential-store "
        "cvsexportcommit cvsimport cvsserver describe diagnose diff diff-files diff-index "
        "diff-pairs diff-tree difftool fast-export fast-import fetch fetch-pack filter-branch "
        "fmt-merge-msg for-each-ref for-each-repo format-patch fsck fsck-objects gc "
        "get-tar-commit-id grep gui hash-object help hook http-backend http-fetch http-push "
        "imap-send index-pack init init-db instaweb interpret-trailers last-modified lfs log "
        "ls-files ls-remote ls-tree mailinfo mailsplit maintenance merge merge-base merge-file "
        "merge-index merge-one-file merge-tree mergetool mktag mktree multi-pack-index mv "
        "name-rev notes p4 pack-objects pack-redundant pack-refs patch-id prune prune-packed "
        "pull push quiltimport range-diff read-tree rebase receive-pack reflog refs remote "
        "repack replace replay repo request-pull rerere reset restore rev-list rev-parse revert "
        "rm send-email send-pack shortlog show show-branch show-index show-ref sparse-checkout "
        "stage stash status stripspace submodule svn switch symbolic-ref tag unpack-file "
        "unpack-objects update-index update-ref update-server-info upload-archive upload-pack "
        "var verify-commit verify-pack verify-tag version whatchanged worktree write-tree"
    ),
    aliases={"stage": "add"},
    sub=grammar(
        values="-m --message -F --file -C --reuse-message -c --reedit-message -o --push-option "
        "--repo -x --exec -u --upload-pack --receive-pack -b -B --author --date -S "
        "--gpg-sign --format --pretty -n --max-count -U --unified --since --until --grep",
        optional="-S --gpg-sign",
        aliases={"--force": "-f", "--delete": "-d", "--all": "--all", "--mirror": "--mirror"},
    ),
    inline_aliases="-c",
)

_NPM_COMMANDS = _words(
    "access adduser audit bugs cache ci completion config dedupe deprecate diff dist-tag docs "
    "doctor edit exec explain explore find-dupes fund get help help-search hook init "
    "install install-ci-test install-test link ll login logout ls org outdated owner pack ping "
    "pkg prefix profile prune publish query rebuild repo restart root run run-script sbom search "
    "set shrinkwrap star stars start stop team test token undeprecate uninstall unpublish "
    "unstar update version view whoami"
)
_NPM_ALIASES = {
    **dict.fromkeys(
        ["i", "in", "ins", "inst", "insta", "instal", "isnt", "isnta", "isntal", "isntall", "add"],
        "install",
    ),
    **dict.fromkeys(["clean-install", "ic", "install-clean", "isntall-clean"], "ci"),
    **dict.fromkeys(["rm", "r", "un", "unlink", "remove"], "uninstall"),
    **dict.fromkeys(["t", "tst"], "test"),
    **dict.fromkeys(["up", "upgrade", "udpate"], "update"),
    **dict.fromkeys(["v", "info", "show"], "view"),
    **dict.fromkeys(["s", "se", "find"], "search"),
    **dict.fromkeys(["rum", "urn"], "run"),
    **dict.fromkeys(["it", "cit"], "install-ci-test"),
    "x": "exec",
    "c": "config",
    "ln": "link",
    "list": "ls",
    "la": "ls",
    "rb": "rebuild",
    "login": "adduser",
    "add-user": "adduser",
    "author": "owner",
    "home": "docs",
    "issues": "bugs",
    "hlep": "help",
    "dist-tags": "dist-tag",
    "why": "explain",
    "sit": "install-ci-test",
}
_NPM_VALUES = (
    "--registry --userconfig --globalconfig --prefix -C -w --workspace --tag --otp --access "
    "--cache --loglevel --script-shell --before --omit --include --auth-type --scope --filter -F "
    "--dir --reporter --store-dir --cwd --package"
)
NPM = Program(
    main=grammar(values=_NPM_VALUES, optional="--color"),
    known=None,
    subcommands=_NPM_COMMANDS,
    aliases=_NPM_ALIASES,
    sub=grammar(values=_NPM_VALUES),
)
_JS_KNOWN = _words(
    _NPM_VALUES + " -g --global -s --silent -q --quiet -d -dd -ddd -y --yes --force -f -r "
    "--recursive --workspace-root --dry-run --color --no-color --json --parseable -P --prod "
    "-D --dev --frozen-lockfile --offline -v --version -h --help"
)
PNPM = Program(
    main=NPM.main,
    known=_JS_KNOWN,
    subcommands=_NPM_COMMANDS | _words("add remove dlx create patch env store server why"),
    aliases={"i": "install", "rm": "remove", "un": "remove", "uninstall": "remove", "t": "test"},
    unknown_doubt=False,
    sub=NPM.sub,
)
YARN = Program(
    main=NPM.main,
    known=_JS_KNOWN,
    subcommands=_NPM_COMMANDS | _words("add remove dlx npm workspace workspaces why set plugin"),
    unknown_doubt=False,
    sub=NPM.sub,
    pairs={("npm", "publish"): "publish"},
)

_DOCKER_SUBS = _words(
    "attach build builder buildx checkpoint commit compose config container context cp create "
    "debug diff events exec export history image images import info init inspect kill load "
    "login logout logs manifest network node pause plugin port ps pull push rename restart rm "
    "rmi run save scout search secret service stack start stats stop swarm system tag top trust "
    "unpause update version volume wait sbom model ai bake offload"
)
DOCKER = Program(
    main=grammar(
        values="--config -c --context -H --host -l --log-level --tlscacert --tlscert --tlskey"
    ),
    known=_words(
        "--config -c --context -H --host -l --log-level --tlscacert --tlscert --tlskey -D "
        "--debug --tls --tlsverify -v --version -h --help"
    ),
    subcommands=_DOCKER_SUBS,
    sub=grammar(
        values="-t --tag -f --file -e --env -v --volume -p --publish -w --workdir -u --user "
        "--name --network --entrypoint --platform --build-arg --target -l --label --mount",
        aliases={"--force": "-f"},
    ),
    pairs={
        ("image", "push"): "push",
        ("image", "pull"): "pull",
        ("image", "rm"): "rmi",
        ("image", "build"): "build",
        ("image", "tag"): "tag",
        ("container", "run"): "run",
        ("container", "rm"): "rm",
        ("container", "exec"): "exec",
        ("container", "kill"): "kill",
        ("container", "stop"): "stop",
        ("container", "create"): "create",
        ("container", "start"): "start",
        ("buildx", "build"): "build",
        ("builder", "build"): "build",
    },
)
_KUBE_VALUES = (
    "-n --namespace --context --cluster --kubeconfig -s --server --user --token --as --as-group "
    "--as-uid --certificate-authority --client-certificate --client-key --cache-dir "
    "--request-timeout -v --v --password --username --tls-server-name --profile "
    "--profile-output --log-file -o --output -f --filename -l --selector -c --container "
    "--field-selector --grace-period --timeout"
)
KUBECTL = Program(
    main=grammar(values=_KUBE_VALUES),
    known=_words(
        _KUBE_VALUES + " --insecure-skip-tls-verify --match-server-version --warnings-as-errors "
        "-h --help --version -A --all-namespaces"
    ),
    subcommands=_words(
        "annotate api-resources api-versions apply attach auth autoscale certificate "
        "cluster-info completion config cordon cp create debug delete describe diff drain edit "
        "events exec explain expose get help kustomize label logs options patch plugin "
        "port-forward proxy replace rollout run scale set taint top uncordon version wait alpha"
    ),
    sub=grammar(values=_KUBE_VALUES),
)
TERRAFORM = Program(
    main=grammar(values="-chdir", clusters=False),
    known=_words("-chdir -help -version -h --help -v --version"),
    subcommands=_words(
        "init validate plan apply destroy console fmt force-unlock get graph import login logout "
        "metadata output providers refresh show state taint test untaint version workspace "
        "modules stacks query"
    ),
    sub=grammar(values="-var -var-file -target -replace -state -out -lock-timeout", clusters=False),
    by_flag={("apply", "-destroy"): "destroy"},
)
GH = Program(
    main=grammar(values="-R --repo"),
    known=_words("-R --repo -h --help --version"),
    subcommands=_words(
        "agent-task alias api attestation auth browse cache co codespace completion config "
        "copilot extension gist gpg-key help issue label org pr preview project release repo "
        "ruleset run search secret ssh-key status variable workflow"
    ),
    aliases={"co": "pr"},
    sub=grammar(
        values="-R --repo -t --title -b --body -B --base -H --head -m --message -X --method "
        "-f --field -F --raw-field -H --header -q --jq -L --label -a --assignee -s --state"
    ),
)
_CURL_ALIASES = {
    "--request": "-X",
    "--data": "-d",
    "--header": "-H",
    "--upload-file": "-T",
    "--form": "-F",
    "--output": "-o",
    "--user": "-u",
    "--config": "-K",
    "--remote-name": "-O",
    "--include": "-i",
    "--head": "-I",
    "--location": "-L",
    "--silent": "-s",
    "--show-error": "-S",
    "--fail": "-f",
    "--insecure": "-k",
    "--verbose": "-v",
    "--get": "-G",
    "--proxy": "-x",
    "--cookie": "-b",
    "--cookie-jar": "-c",
    "--user-agent": "-A",
    "--referer": "-e",
    "--max-time": "-m",
    "--write-out": "-w",
    "--dump-header": "-D",
    "--range": "-r",
    "--continue-at": "-C",
}
CURL = Program(
    main=grammar(
        values="-X -d -H -T -F -o -u -K -x -b -c -A -e -m -w -D -r -C -E -U -Y -y -z -P -Q -t "
        "--data-ascii --data-binary --data-raw --data-urlencode --json --form-string --url "
        "--cacert --capath --key --cert --resolve --connect-to --retry --connect-timeout "
        "--limit-rate --max-filesize --output-dir --variable --proto --proto-redir "
        "--proxy-header --unix-socket --interface --oauth2-bearer --aws-sigv4 --ciphers",
        aliases=_CURL_ALIASES,
    )
)
WGET = Program(
    main=grammar(
        values="-O -o -a -e -i -P -t -T -U -l -A -R -D -w -Q -B -n --header --post-data "
        "--post-file --method --body-data --body-file --user --password --limit-rate "
        "--bind-address --output-document --output-file --execute --input-file "
        "--directory-prefix --tries --timeout --user-agent --level --accept --reject",
        aliases={
            "--output-document": "-O",
            "--output-file": "-o",
            "--execute": "-e",
            "--input-file": "-i",
            "--directory-prefix": "-P",
            "--recursive": "-r",
            "--mirror": "-m",
            "--quiet": "-q",
            "--continue": "-c",
        },
    )
)
RM = Program(
    main=grammar(
        optional="--interactive --preserve-root",
        aliases={
            "-R": "-r",
            "--recursive": "-r",
            "--force": "-f",
            "--dir": "-d",
            "--verbose": "-v",
        },
        flags="-d -f -i -I -r -R -v --one-file-system --no-preserve-root --help --version",
    )
)
FIND = Program(
    main=grammar(
        values="-name -iname -path -ipath -wholename -iwholename -regex -iregex -regextype "
        "-type -xtype -newer -anewer -cnewer -mtime -atime -ctime -mmin -amin -cmin -size "
        "-user -group -uid -gid -perm -maxdepth -mindepth -printf -fprint -fprint0 -fls "
        "-inum -links -samefile -lname -ilname -fstype -used -context -files0-from",
        clusters=False,
    )
)

PROGRAMS: dict[str, Program] = {
    "git": GIT,
    "npm": NPM,
    "pnpm": PNPM,
    "yarn": YARN,
    "bun": YARN,
    "docker": DOCKER,
    "podman": DOCKER,
    "kubectl": KUBECTL,
    "oc": KUBECTL,
    "terraform": TERRAFORM,
    "tofu": TERRAFORM,
    "gh": GH,
    "curl": CURL,
    "wget": WGET,
    "rm": RM,
    "find": FIND,
}
"""The programs rules know by name (each listed in docs/hooks.md). Any other program is read
with `DEFAULT`: GNU style, every option a flag, operands in place."""

DEFAULT = Program(main=grammar())


class Command:
    """One argv, read with its program's grammar: the program, its subcommand (resolved; None
    if it has none or none is given), why the subcommand is not known (a rule naming one then
    denies), its options and operands, whether a computed word may be an option
    (`maybe_option`), whether an unquoted expansion may add or remove words (`shifted`), and
    whether `--` ended the options."""

    __slots__ = (
        "ended",
        "maybe_option",
        "operands",
        "options",
        "program",
        "shifted",
        "subcommand",
        "subcommand_doubt",
    )  # fmt: skip

    def __init__(
        self,
        program: str,
        subcommand: str | None,
        subcommand_doubt: str,
        options: Sequence[Option],
        operands: Sequence[Word],
        flags: tuple[bool, bool, bool] = (False, False, False),
    ) -> None:
        self.program, self.subcommand, self.subcommand_doubt = program, subcommand, subcommand_doubt
        self.options, self.operands = options, operands
        self.maybe_option, self.shifted, self.ended = flags


def spec_of(program: str) -> Program:
    return PROGRAMS.get(program, DEFAULT)


@lru_cache(maxsize=1_024)
def read(argv: tuple[Word, ...]) -> Command:
    """`argv` (a literal program first) read with the program's grammar. A pure function of
    the words and the tables, kept for the argv seen last (a carrier and the verdict read the
    same argv, and a session repeats its lines): the command is shared, so it is read-only
    (its sequences are typed so)."""
    name = program_name(argv[0].text or "")
    if name.startswith("git-") and name[4:] in (GIT.subcommands or ()):
        argv = (Word("git"), Word(name[4:]), *argv[1:])
        name = "git"
    spec = spec_of(name)
    if spec.subcommands is None:
        found = scan(spec.main, argv, 1)
        return _command(name, None, "", found, [w for _, w in found.operands])
    head = scan(spec.main, argv, 1, stop=True)
    doubt = _head_doubt(spec, head)
    if head.rest >= len(argv):
        return _command(name, None, doubt, head, [])
    word = argv[head.rest]
    if word.text is None:
        doubt = f"its subcommand is {word.kind}"
        rest = scan(spec.sub or spec.main, argv, head.rest + 1)
        return _merged(name, None, doubt or "", head, rest)
    words, sub, why = _resolved(spec, head, word.text, argv[head.rest + 1 :])
    rest = scan(spec.sub or spec.main, words, 0)
    operands = [w for _, w in rest.operands]
    if sub is not None and operands and operands[0].text is not None:
        paired = spec.pairs.get((sub, operands[0].text))
        if paired is not None:
            sub, operands = paired, operands[1:]
    for (base, flag), other in spec.by_flag.items():
        if sub == base and rest.has(flag):
            sub = other
    command = _merged(name, sub, doubt or why, head, rest)
    command.operands = operands
    return command


def _head_doubt(spec: Program, head: Scan) -> str:
    if head.maybe_option or head.shifted:
        return "a computed word comes before its subcommand"
    if spec.known is not None and any(o.name not in spec.known for o in head.options):
        return "an option loopwarden does not know comes before its subcommand"
    return ""


def _resolved(
    spec: Program, head: Scan, text: str, after: tuple[Word, ...]
) -> tuple[tuple[Word, ...], str | None, str]:
    """The subcommand `text` names (through the program's aliases and aliases defined inline),
    the words that follow it, and why it is not known, if it is not."""
    inline = _inline_aliases(spec, head)
    assert spec.subcommands is not None
    seen: set[str] = set()
    while True:
        text = spec.aliases.get(text, text)
        if text in spec.subcommands:
            return after, text, ""
        key = text.lower()
        if key not in inline or key in seen or len(seen) > 8:
            break
        seen.add(key)
        value = inline[key]
        if value is None:
            return after, None, "its subcommand is an alias whose value is computed"
        if value.startswith("!"):
            return after, None, ""  # a shell alias: its command is read as a run of its own
        parts = _split(value)
        if not parts:
            break
        text, after = parts[0], (*[Word(p) for p in parts[1:]], *after)
    if spec.unknown_doubt:
        return after, text, "its subcommand is not one loopwarden knows (an alias or an extension)"
    return after, text, ""


def _split(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def _inline_aliases(spec: Program, head: Scan) -> dict[str, str | None]:
    """`alias.NAME=VALUE` set by the program's config option (`git -c`), by lower-cased name;
    a computed value, or one taken from the environment (`--config-env`), is None."""
    out: dict[str, str | None] = {}
    if not spec.inline_aliases:
        return out
    for option in head.options:
        if option.name == "--config-env" and option.value is not None:
            key = (option.value.text or "").partition("=")[0].lower()
            if key.startswith("alias."):
                out[key[6:]] = None
        if option.name != spec.inline_aliases or option.value is None:
            continue
        if option.value.text is None:
            continue  # a computed -c: reported by the git carriers as a doubt
        key, _, value = option.value.text.partition("=")
        if key.lower().startswith("alias."):
            out[key[6:].lower()] = value
    return out


def _command(name: str, sub: str | None, doubt: str, found: Scan, operands: list[Word]) -> Command:
    flags = (found.maybe_option, found.shifted, found.ended)
    return Command(name, sub, doubt, list(found.options), operands, flags)


def _merged(name: str, sub: str | None, doubt: str, head: Scan, rest: Scan) -> Command:
    flags = (head.maybe_option or rest.maybe_option, head.shifted or rest.shifted, rest.ended)
    operands = [w for _, w in rest.operands]
    return Command(name, sub, doubt, [*head.options, *rest.options], operands, flags)
