"""Programs that run another command, as data: each one's whole option grammar and where its
command starts (`carriers.py` applies them). This is class (a) of the three classes of programs
(docs/hooks.md, "Command rules"): launchers here, programs known to run no command of the line
in `bystanders.py`, and every other program unknown.

A launcher is read with its own grammar, closed: an option it does not list is a doubt, since it
may take the next word as its value and so move where the command starts. Long options are read
by any unambiguous prefix, as getopt_long reads them (`timeout --sig KILL`, `env --spl`).
`lead` operands come before the options (`setarch ARCH [options]`), `before` operands after them
(`timeout`'s duration, `flock`'s lock file, `chroot`'s new root), then the command it runs.
`shell` options carry a shell line instead (`flock -c`, `su -c`, `script -c`); `joined`
launchers run their words through a shell (`watch` without `-x`, `sg`); `tail` ones add words
from input (`xargs`); `programs` options name a program it runs (`fakeroot --faked`).
Without a command, `bare` says what it does: nothing, or run a shell that reads its commands
from input (opaque). `transparent` launchers only change how their command runs, so allow rules
need not name them; the ones that change who or where it runs (`sudo`, `doas`, `su`, `chroot`)
must be allowed by name. `operands=False`: its operands are files, never a command (`script`).
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
    lead: int = 0  # operands before its options (setarch ARCH)
    programs: frozenset[str] = frozenset()  # options whose value is a program it runs
    operands: bool = True  # its operands are the command it runs (script: files)


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _launcher(
    values: str = "",
    flags: str = "",
    optional: str = "",
    permute: bool = False,
    numbers: bool = False,
    **kw: object,
) -> Launcher:
    """A launcher with a closed grammar: `values`, `flags` and `optional` are all it takes."""
    g = grammar(values=values, optional=optional, flags=flags, permute=permute, numbers=numbers)
    return Launcher(g, **kw)  # type: ignore[arg-type]


_HELP = "-h --help -V --version"
_ARCH = "-B -F --fdpic-funcptrs -I --short-inode -L --addr-compat-layout -R --addr-no-randomize "
_ARCH += "-S --whole-seconds -T --sticky-timeouts -X --read-implies-exec -Z --mmap-page-zero "
_ARCH += "-3 --uname-2 -v --verbose --list " + _HELP
_NPM_FLAGS = (
    "-y --yes --no -q --quiet -s --silent --ignore-scripts --prefer-offline --offline "
    "--prefer-online --no-install --include-workspace-root -ws --workspaces --loglevel=silent "
    "-d --verbose --legacy-peer-deps"
)
_NPM_VALUES = "--registry --cache --userconfig --prefix -w --workspace --loglevel --node-options"

LAUNCHERS: dict[str, Launcher] = {
    "sudo": _launcher(
        values="-u --user -g --group -p --prompt -C --close-from -D --chdir -r --role -t --type "
        "-T --command-timeout -U --other-user -R --chroot -h --host",
        flags="-A --askpass -b --background -E -H --set-home -n --non-interactive -P "
        "--preserve-groups -S --stdin -k --reset-timestamp -K --remove-timestamp -s --shell "
        "-i --login -l --list -v --validate -e --edit -V --version -B --bell -N --no-update "
        "--help",
        optional="--preserve-env",
        no_run=_set("-l --list -v --validate -K --remove-timestamp -V --version -e --edit --help"),
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
    "pkexec": _launcher(
        values="--user -u", flags="--disable-internal-agent --keep-cwd " + _HELP, transparent=False
    ),
    "su": _launcher(
        values="-c --command --session-command -s --shell -g --group -G --supp-group "
        "-w --whitelist-environment -u --user",
        flags="-l --login -m -p --preserve-environment -f --fast -P --pty " + _HELP,
        permute=True,
        shell=_set("-c --command --session-command"),
        bare="shell",
        transparent=False,
        operands=False,
    ),
    "runuser": _launcher(
        values="-u --user -g --group -G --supp-group -c --command --session-command -s --shell "
        "-w --whitelist-environment",
        flags="-l --login -m -p --preserve-environment -f --fast -P --pty " + _HELP,
        shell=_set("-c --command --session-command"),
        transparent=False,
    ),
    "sg": _launcher(flags="-", before=1, joined=True, shell=_set("-c"), transparent=False),
    "chroot": _launcher(
        values="--userspec --groups",
        flags="--skip-chdir --help --version",
        before=1,
        bare="shell",
        transparent=False,
    ),
    "timeout": _launcher(
        values="-s --signal -k --kill-after",
        flags="--preserve-status --foreground -v --verbose --help --version",
        before=1,
    ),
    "gtimeout": _launcher(
        values="-s --signal -k --kill-after",
        flags="--preserve-status --foreground -v --verbose --help --version",
        before=1,
    ),
    "nice": _launcher(values="-n --adjustment", flags="--help --version", numbers=True),
    "ionice": _launcher(
        values="-c --class -n --classdata -p --pid -P --pgid -u --uid",
        flags="-t --ignore " + _HELP,
        no_run=_set("-p --pid -P --pgid -u --uid"),
    ),
    "chrt": _launcher(
        values="-T --sched-runtime -P --sched-period -D --sched-deadline",
        flags="-b --batch -d --deadline -f --fifo -i --idle -o --other -r --rr -R "
        "--reset-on-fork -a --all-tasks -m --max -p --pid -v --verbose " + _HELP,
        before=1,
        no_run=_set("-p --pid -m --max -h --help -V --version"),
    ),
    "taskset": _launcher(
        flags="-a --all-tasks -c --cpu-list " + _HELP,
        values="",
        optional="-p --pid",
        before=1,
        no_run=_set("-p --pid -h --help -V --version"),
    ),
    "prlimit": _launcher(
        values="-p --pid -o --output",
        optional="-c --core -d --data -e --nice -f --fsize -i --sigpending -l --memlock -m "
        "--rss -n --nofile -q --msgqueue -r --rtprio -s --stack -t --cpu -u --nproc -v --as "
        "-x --locks -y --rttime",
        flags="--noheadings --raw --verbose " + _HELP,
        no_run=_set("-p --pid -h --help -V --version"),
    ),
    "setarch": _launcher(flags=_ARCH, lead=1, bare="shell", no_run=_set("--list -h --help")),
    **{
        arch: _launcher(flags=_ARCH, bare="shell", no_run=_set("--list -h --help"))
        for arch in ("linux32", "linux64", "i386", "x86_64", "uname26", "aarch64", "arm64")
    },
    "unshare": _launcher(
        values="-R --root -w --wd -S --setuid -G --setgid --map-user --map-group --map-users "
        "--map-groups --propagation --setgroups --monotonic --boottime",
        optional="-m --mount -u --uts -i --ipc -n --net -p --pid -U --user -C --cgroup -T "
        "--time --kill-child --mount-proc",
        flags="-f --fork -r --map-root-user -c --map-current-user --map-auto --keep-caps " + _HELP,
        bare="shell",
    ),
    "nsenter": _launcher(
        values="-t --target -S --setuid -G --setgid -W --wdns",
        optional="-m --mount -u --uts -i --ipc -n --net -p --pid -C --cgroup -U --user -T "
        "--time -r --root -w --wd",
        flags="-a --all --preserve-credentials -F --no-fork -Z --follow-context " + _HELP,
        bare="shell",
    ),
    "setpriv": _launcher(
        values="--ambient-caps --inh-caps --bounding-set --ruid --euid --rgid --egid --reuid "
        "--regid --groups --securebits --pdeathsig --selinux-label --apparmor-profile",
        flags="-d --dump --nnp --no-new-privs --clear-groups --keep-groups --init-groups "
        "--reset-env " + _HELP,
        no_run=_set("-d --dump"),
    ),
    "fakeroot": _launcher(
        values="-l --lib --faked -i -s -b --fd-base",
        flags="-u --unknown-is-real -h --help -v --version",
        bare="shell",
        programs=_set("--faked"),
    ),
    "valgrind": Launcher(grammar(permute=False)),  # options are glued (--tool=x), never a word
    "ssh-agent": _launcher(
        values="-a -E -O -P -t", flags="-c -s -D -d -k -x", no_run=_set("-k -x")
    ),
    "dbus-run-session": _launcher(
        values="--config-file --dbus-daemon",
        flags="--help --version",
        programs=_set("--dbus-daemon"),
    ),
    "setsid": _launcher(flags="-c --ctty -f --fork -w --wait " + _HELP),
    "nohup": _launcher(flags="--help --version"),
    "time": _launcher(
        values="-o --output -f --format",
        flags="-p --portability -a --append -v --verbose -q --quiet -h --help -V --version",
    ),
    "stdbuf": _launcher(values="-i -o -e --input --output --error", flags="--help --version"),
    "gstdbuf": _launcher(values="-i -o -e --input --output --error", flags="--help --version"),
    "flock": _launcher(
        values="-w --timeout -E --conflict-exit-code -c --command",
        flags="-s --shared -x --exclusive -e -u --unlock -n --nonblock -o --close -F --no-fork "
        "--verbose " + _HELP,
        before=1,
        shell=_set("-c --command"),
    ),
    "watch": _launcher(
        values="-n --interval -q --equexit",
        flags="-b --beep -c --color -C --no-color -e --errexit -g --chgexit -p --precise -t "
        "--no-title -w --no-wrap -x --exec -r --no-rerun -h --help -v --version",
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
        flags="-0 --null -o --open-tty -p --interactive -r --no-run-if-empty -t --verbose "
        "-x --exit --show-limits --help --version",
        optional="-e --eof -i --replace -l",
        tail="words",
        replace=_set("-I -i --replace"),
    ),
    "env": _launcher(
        values="-u --unset -C --chdir -S --split-string",
        flags="-i --ignore-environment -0 --null -v --debug --list-signal-handling - "
        "--help --version",
        optional="--block-signal --default-signal --ignore-signal",
        assignments=True,
        split=_set("-S --split-string"),
    ),
    "busybox": _launcher(flags="--help --list --list-full --install -s", no_run=_set("--list")),
    "strace": _launcher(
        values="-e -o -p -s -u -E -a -b -I -O -P -S -U -X --attach --user --env --detach-on "
        "--interruptible --trace --signal --status --trace-path --columns --abbrev --verbose "
        "--raw --read --write --quiet --kvm --decode-fds --output --string-limit "
        "--const-print-style --summary-syscall-overhead --summary-sort-by --summary-columns "
        "--inject --fault --trace-fds --decode-pids --stack-trace-frame-limit",
        optional="--daemonize --relative-timestamps --absolute-timestamps --timestamps "
        "--syscall-times --strings-in-hex --tips --seccomp-bpf --secontext --always-show-pid",
        flags="-c -C -d -D -f -F -h -i -k -n -q -r -t -T -v -V -w -x -y -Y -z -Z -A "
        "--follow-forks --output-separately --successful-only --failed-only "
        "--instruction-pointer --stack-traces --syscall-number --output-append-mode "
        "--no-abbrev --summary-only --summary --summary-wall-clock --debug --help --version",
    ),
    "ltrace": _launcher(
        values="-o --output -e -p -s -u -a --align -n --indent -l --library -L -A -D --debug "
        "-F --config -w --where -x",
        flags="-b --no-signals -c -C --demangle -f -h --help -i -r -S -t -tt -ttt -T -V --version",
    ),
    "script": _launcher(
        values="-c --command -E --echo -I --log-in -O --log-out -B --log-io -T --log-timing "
        "-m --logging-format -o --output-limit",
        optional="-t --timing",
        flags="-a --append -e --return -f --flush --force -q --quiet " + _HELP,
        permute=True,
        shell=_set("-c --command"),
        bare="shell",
        operands=False,
    ),
    "caffeinate": _launcher(values="-t -w", flags="-d -i -m -s -u"),
    "unbuffer": _launcher(flags="-p"),
    "chronic": _launcher(flags="-e -v"),
    "ifne": _launcher(flags="-n"),
    "eatmydata": _launcher(flags="--help --version"),
    "nocache": _launcher(values="-n", flags="-r -h --help"),
    "catchsegv": _launcher(flags="--help --version"),
    "faketime": _launcher(values="-m -p -f", flags="--exclude-monotonic --help -h", before=1),
    "cpulimit": _launcher(
        values="-l --limit -p --pid -e --exe",
        flags="-z --lazy -i --include-children -v "
        "--verbose -h --help -k --kill -r --restore -q --quiet",
        no_run=_set("-p --pid -e --exe"),
    ),
    "trickle": _launcher(values="-d -u -w -t -l -n -L", flags="-h -v -V -s"),
    "torsocks": _launcher(
        values="-u --user -p --pass -a --address -P --port",
        flags="-d --debug -i --isolate -q --quiet -h --help --version --shell -6 --ipv6",
        bare="shell",
    ),
    "proxychains": _launcher(values="-f", flags="-q"),
    "proxychains4": _launcher(values="-f", flags="-q"),
    "sshpass": _launcher(values="-p -f -d -e -P", optional="", flags="-v -h -V"),
    "firejail": Launcher(grammar(permute=False)),  # options are glued (--private=dir)
    "xvfb-run": _launcher(
        values="-e --error-file -f --auth-file -n --server-num -p --xauth-protocol -s "
        "--server-args -w --wait",
        flags="-a --auto-servernum -h --help -l --listen-tcp",
    ),
    "daemonize": _launcher(values="-a -c -e -o -p -l -u -E", flags="-v"),
    "lckdo": _launcher(flags="-w -q", before=1),
    "runcon": _launcher(
        values="-u --user -r --role -t --type -l --range", flags="-c --compute " + _HELP
    ),
    "systemd-run": _launcher(
        values="--unit -u --property -p --description --slice --timer-property -E --setenv "
        "--uid --gid --nice --working-directory --machine -M --host -H --on-active "
        "--on-boot --on-startup --on-unit-active --on-unit-inactive --on-calendar --path-property "
        "--socket-property --service-type --expand-environment",
        flags="--user --system --scope --no-block --wait --pipe -P --pty -t --quiet -q -G "
        "--collect --same-dir -d --shell -S --remain-after-exit -r --send-sighup --no-ask-password "
        "--slice-inherit " + _HELP,
        shell_flags=_set("--shell -S"),
    ),
    "systemd-inhibit": _launcher(
        values="--what --who --why --mode",
        flags="--list --no-pager --no-legend " + _HELP,
        no_run=_set("--list"),
    ),
    "perf stat": _launcher(
        values="-e --event -p --pid -t --tid -C --cpu -r --repeat -o --output -G --cgroup -x "
        "--field-separator -I --interval-print --pre --post -M --metrics",
        flags="-a --all-cpus -i --no-inherit -v --verbose -n --null -d --detailed -S --sync "
        "-B --big-num -A --no-aggr --scale -c --per-socket --per-core --per-thread -q --quiet "
        "--append --topdown",
        programs=_set("--pre --post"),
    ),
    "perf record": _launcher(
        values="-e --event -p --pid -t --tid -C --cpu -o --output -c --count -F --freq -m "
        "--mmap-pages -G --cgroup --call-graph -u --uid",
        flags="-a --all-cpus -g -q --quiet -v --verbose -s --stat -i --no-inherit -R --raw-samples "
        "-d --data -T --timestamp -P --period -n --no-samples -N --no-buildid-cache",
    ),
    "perf trace": _launcher(
        values="-e --event -p --pid -t --tid -C --cpu -o --output -u --uid --duration",
        flags="-a --all-cpus -s --summary -S --with-summary -v --verbose -f --failure",
    ),
    "npx": _launcher(
        values="-p --package -c --call " + _NPM_VALUES,
        flags=_NPM_FLAGS,
        shell=_set("-c --call"),
    ),
    "bunx": _launcher(values="-p --package", flags="--bun --silent --verbose"),
    "uvx": _launcher(
        values="--from --with --with-editable --with-requirements -p --python --index "
        "--default-index --index-url --extra-index-url --env-file",
        flags="-q --quiet -v --verbose --isolated --no-cache --offline --refresh -n --no-config",
    ),
    "pipx run": _launcher(
        values="--spec --python --index-url --pip-args", flags="--no-cache -v --verbose -q --quiet"
    ),
    "npm exec": _launcher(
        values="-p --package -c --call " + _NPM_VALUES, flags=_NPM_FLAGS, shell=_set("-c --call")
    ),
    "npm explore": _launcher(
        values=_NPM_VALUES, flags=_NPM_FLAGS, before=1, after_dashdash=True, joined=True
    ),
    "pnpm exec": _launcher(
        values="--filter -F -C --dir --workspace-concurrency",
        flags="-c --shell-mode -r --recursive --parallel --no-bail --report-summary",
        join_options=_set("-c --shell-mode"),
    ),
    "pnpm dlx": _launcher(
        values="-p --package",
        flags="-c --shell-mode --silent -s",
        join_options=_set("-c --shell-mode"),
    ),
    "yarn exec": _launcher(),
    "yarn dlx": _launcher(values="-p --package", flags="-q --quiet"),
    "uv run": _launcher(
        values="--with -p --python --project --directory --package --extra --group --env-file "
        "--index --with-requirements --only-group --with-editable --default-index --index-url "
        "--extra-index-url --no-group --python-preference",
        flags="--frozen --locked --no-sync --isolated --no-project --all-extras --no-dev "
        "--dev --all-packages -q --quiet -v --verbose --offline --no-cache --active "
        "--no-env-file --script -m --module -s --exact --refresh -n --no-config "
        "--all-groups --no-default-groups --compile-bytecode",
    ),
    "poetry run": _launcher(
        values="-C --directory -P --project",
        flags="-q --quiet -v -vv -vvv --verbose "
        "-n --no-interaction --no-ansi --ansi --no-plugins --no-cache",
    ),
    "pipenv run": _launcher(flags="--python --three -v --verbose"),
    "pdm run": _launcher(
        values="-p --project -g --global",
        flags="-v --verbose -q --quiet -s --site-packages --list -l",
    ),
    "hatch run": _launcher(values="-e --env", flags="-v --verbose -q --quiet"),
    "rye run": _launcher(values="--pyproject", flags="-l --list -v --verbose -q --quiet"),
    "conda run": _launcher(
        values="-n --name -p --prefix --cwd",
        flags="--live-stream --no-capture-output --debug-wrapper-scripts -v --verbose",
    ),
    "mamba run": _launcher(
        values="-n --name -p --prefix --cwd", flags="--live-stream --no-capture-output"
    ),
    "micromamba run": _launcher(
        values="-n --name -p --prefix --cwd -a --attach", flags="--clean-env --detach"
    ),
    "pixi run": _launcher(
        values="-e --environment --manifest-path",
        flags="--frozen --locked -v --verbose -q --quiet --clean-env",
    ),
    "bundle exec": _launcher(flags="--keep-file-descriptors --gemfile"),
    "mise exec": _launcher(
        values="-C --cd -j --jobs", flags="--raw -q --quiet -v --verbose", after_dashdash=True
    ),
    "mise x": _launcher(
        values="-C --cd -j --jobs", flags="--raw -q --quiet -v --verbose", after_dashdash=True
    ),
    "direnv exec": _launcher(before=1),
    "asdf exec": _launcher(),
    "rbenv exec": _launcher(),
    "pyenv exec": _launcher(),
    "nodenv exec": _launcher(),
    "fnm exec": _launcher(values="--using", flags="--using-file"),
    "volta run": _launcher(
        values="--node --npm --yarn --pnpm",
        flags="--bundled-npm --no-yarn --no-pnpm -v --verbose --quiet",
    ),
    "nix-shell": _launcher(
        values="-p --packages -A --attr -I --arg --argstr --option --keep -k",
        flags="--pure --impure -Q --no-build-output -v --verbose --show-trace",
        shell=_set("--run --command"),
    ),
    "devbox run": _launcher(values="-c --config -e --env --env-file", flags="-q --quiet --pure"),
    "aws-vault exec": _launcher(
        values="-d --duration -t --mfa-token -r --region",
        flags="-n --no-session --json --server --ec2-server --ecs-server --stdout",
        before=1,
    ),
    "op run": _launcher(values="--env-file", flags="--no-masking"),
    "doppler run": _launcher(
        values="-p --project -c --config --command --mount --fallback",
        flags="--preserve-env --no-fallback --only-secrets",
        shell=_set("--command"),
    ),
    "infisical run": _launcher(
        values="--env --path --projectId --token --command",
        flags="--watch --silent",
        shell=_set("--command"),
    ),
    "chamber exec": _launcher(flags="--strict --pristine", after_dashdash=True),
    "dotenv": _launcher(values="-e -v -c", flags="-p --debug --override -o", after_dashdash=True),
    "cross-env": Launcher(grammar(permute=False), assignments=True),
    "env-cmd": _launcher(
        values="-f --file -r --rc-file -e --environments",
        flags="--fallback --no-override --use-shell --silent --verbose -x --expand-envs",
        join_options=_set("--use-shell"),
    ),
    "with-contenv": _launcher(),
    "s6-setuidgid": _launcher(before=1, transparent=False),
    "setuidgid": _launcher(before=1, transparent=False),
    "envdir": _launcher(before=1),
    "softlimit": _launcher(values="-m -a -d -s -l -f -c -o -p -t -r"),
    "chpst": _launcher(values="-u -U -b -e -/ -n -l -L -m -d -o -p -f -c", flags="-P -0 -1 -2 -v"),
}
"""Every launcher loopwarden unwraps (docs/hooks.md lists them). A two-word name is a program
and its subcommand (`uv run`, `perf stat`)."""

RESERVED = frozenset(
    [
        "!",
        "{",
        "}",
        "[[",
        "]]",
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "case",
        "esac",
        "for",
        "select",
        "while",
        "until",
        "do",
        "done",
        "in",
        "function",
    ]
)
"""bash's reserved words (but `time` and `coproc`, read as launchers): as a command's program
they mean the grammar read the line otherwise than bash does."""

SHELLS = frozenset({"sh", "bash", "dash", "ash"})
"""Shells whose language is bash's, or a part of it: their `-c` text and input are read with
the bash grammar."""

POWERSHELLS = frozenset({"pwsh", "powershell"})

FOREIGN_SHELLS = frozenset(
    {"zsh", "ksh", "ksh93", "mksh", "lksh", "oksh", "pdksh", "yash", "posh", "fish", "csh",
     "tcsh", "cmd", "nu", "xonsh", "elvish", "rc", "es", "ion", "murex", "oil", "osh", "ysh"}
)  # fmt: skip
"""Shells whose language loopwarden does not read with a real grammar (zsh's `=cmd`, `noglob`,
`repeat`; ksh's `${ …; }`): the text they are given is opaque."""

SHELL_GRAMMAR = grammar(
    values="-o +o -O +O --rcfile --init-file",
    permute=False,
    plus=True,
)

SHELL_FILES = frozenset({"--rcfile", "--init-file"})
"""Shell options naming a file of commands it runs first."""
