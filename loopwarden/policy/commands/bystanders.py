"""Programs known not to run the commands of the line — class (b) of the three classes of
programs (docs/hooks.md, "Command rules") — with the options that would make them run one.

Each entry is data: the program's option grammar (enough to find its options and their values,
long options by any unambiguous prefix), the options whose value is a shell line it runs
(`lines`: read as commands), a program it runs with words of its own (`programs`: a run whose
further words are not known), or code loopwarden does not read (`opaque`), and, for programs
with a small language of their own, a reader (`scripts.py`: sed, awk, ed, vim's ex commands,
sqlite3's dot commands, psql's meta-commands, …). A program not here, not a launcher
(`launchers.py`) and not read otherwise is *unknown*: `verdicts.py` doubts it when its
arguments name a program a rule is about ("cannot tell whether `chrt` runs `git`").

Every program still runs what its own files say (a Makefile's recipes, a test suite, a
package's install scripts): that is documented as outside what command rules can see.
"""

from __future__ import annotations

from typing import NamedTuple

from loopwarden.policy.commands.options import Grammar, grammar


class Bystander(NamedTuple):
    grammar: Grammar
    lines: frozenset[str] = frozenset()  # options whose value is a shell line it runs
    programs: frozenset[str] = frozenset()  # options whose value is a program it runs
    opaque: frozenset[str] = frozenset()  # options that make it run code loopwarden cannot read
    reader: str = ""  # the name of its reader (carriers.READERS)
    reads_input: frozenset[str] = frozenset()  # options whose value may name its input


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _entry(
    values: str = "",
    optional: str = "",
    flags: str = "",
    lines: str = "",
    programs: str = "",
    opaque: str = "",
    reader: str = "",
    clusters: bool = True,
    inputs: str = "",
) -> Bystander:
    """An entry: the options named in `lines`, `programs`, `opaque` and `inputs` take a value
    unless they are in `flags`; a long option is read by any prefix of the ones named. The
    grammar stays open: an option it does not name is taken for a flag."""
    taking = " ".join(
        name
        for name in f"{lines} {programs} {opaque} {inputs}".split()
        if name not in flags.split()
    )
    g = grammar(
        values=f"{values} {taking}", optional=optional, flags=flags, clusters=clusters
    )._replace(closed=False)
    return Bystander(g, _set(lines), _set(programs), _set(opaque), reader, _set(inputs))


PLAIN = Bystander(grammar())
"""A program with no option that runs a command."""

_PLAIN_NAMES = """
cat ls head tail wc sort uniq cut tr tee mkdir cp mv ln chmod chown chgrp touch stat du df date
basename dirname realpath readlink pwd echo printf true false test [ seq yes sleep id whoami
groups uname hostname nproc tac nl od xxd hexdump base64 base32 sha1sum sha224sum sha256sum
sha384sum sha512sum md5sum b2sum cksum sum comm join paste fold fmt expand unexpand csplit shuf
numfmt truncate dd sync mktemp mkfifo mknod rmdir unlink shred rm tsort pr ptx factor expr tty
users who logname printenv arch dircolors column rev look iconv file tree grep egrep fgrep jq yq
gojq diff cmp patch most highlight pygmentize lsof ps pgrep pkill kill killall top htop free
uptime vmstat iostat ss netstat ifconfig ping dig nslookup host whois traceroute curl http https
openssl ssh-keygen ssh-add ssh-keyscan gpgconf uuidgen cal bc units zcat gzip gunzip bzip2
bunzip2 xz unxz zstd unzstd lz4 7z 7za unrar unzip zipinfo ar strings nm objdump readelf ldd
size strip locale getent lscpu lsblk lsusb lspci dmesg journalctl systemctl timedatectl
hostnamectl loginctl which whereis type info whatis apropos tldr cd pushd popd dirs wait jobs fg
bg disown suspend logout exit return break continue shift set shopt getopts times caller help
ulimit umask history bind compopt unalias : stty reset clear tput tabs pv inotifywait fswatch
pytest py.test nox mypy ruff black isort flake8 pyright bandit pre-commit pip3 pipx uv poetry
pdm hatch rye conda mamba micromamba virtualenv twine build maturin rustfmt gofmt golangci-lint
staticcheck javac java jar dotnet npm pnpm yarn bun tsc eslint prettier jest vitest mocha ava
playwright cypress webpack vite rollup esbuild parcel turbo node-gyp fnm volta asdf rbenv pyenv
nodenv gem bundle bundler rspec rubocop phpunit swiftc pod docker podman docker-compose buildah
skopeo kubectl oc kustomize k9s kind minikube k3d kubectx kubens stern argocd flux istioctl
linkerd terraform tofu terragrunt pulumi packer vagrant ansible-lint aws gcloud gsutil bq az
doctl flyctl heroku vercel netlify wrangler firebase supabase jira act circleci sentry-cli
railway meson bazel bazelisk autoconf automake autoreconf libtool pkg-config clang-format clang-
tidy cppcheck gcov redis-cli influx pg_dump pg_restore pg_isready createdb dropdb mysqldump
mysqladmin etcdctl vault kafka-topics.sh ffmpeg ffprobe mdbook hugo mkdocs sphinx-build dot
shellcheck shfmt hadolint yamllint markdownlint codespell typos vale cspell semgrep trivy grype
syft cosign gitleaks trufflehog snyk osv-scanner depcheck knip madge ncu npm-check-updates
csvlook xsv datamash gron htmlq pup xmllint xmlstarlet xq tomlq dasel sd exa eza lsd git-lfs
getconf lsattr chattr setfacl getfacl age loopwarden pbcopy pbpaste xclip xsel notify-send say
afplay apt-cache dpkg-query snap
"""
_OTHER = frozenset(_PLAIN_NAMES.split())

BYSTANDERS: dict[str, Bystander] = {
    **dict.fromkeys(_OTHER, PLAIN),
    "tar": _entry(
        values="-f --file -b --blocking-factor -C --directory -g --listed-incremental -K "
        "--starting-file -L --tape-length -N --newer --after-date -T --files-from -V --label -X "
        "--exclude-from -H --format --exclude --transform --xform --owner --group --mode --mtime "
        "--index-file --warning --quoting-style --strip-components --suffix --record-size "
        "--volno-file --pax-option --sort --newer-mtime --level --exclude-tag",
        optional="--checkpoint --backup --occurrence --atime-preserve --one-top-level",
        lines="--to-command --checkpoint-action -I --use-compress-program --rsh-command "
        "--rmt-command",
        opaque="-F --info-script --new-volume-script",
        reader="tar",
    ),
    "ssh": _entry(
        values="-b -B -c -D -E -e -F -i -J -L -l -m -O -o -p -Q -R -S -W -w",
        opaque="-I",
        reader="ssh",
    ),
    "scp": _entry(values="-c -D -F -i -J -l -o -P -X", programs="-S", opaque="", reader="ssh"),
    "sftp": _entry(values="-B -b -c -F -i -J -l -o -P -R -s -X", programs="-S -D", reader="ssh"),
    "rsync": _entry(
        values="--rsync-path --exclude --include --exclude-from --include-from --files-from "
        "--filter -f --log-file --partial-dir --temp-dir -T --chmod --chown --password-file "
        "--port --timeout --contimeout --bwlimit --compare-dest --copy-dest --link-dest "
        "--backup-dir --suffix --max-size --min-size --max-delete --out-format --info --debug "
        "--usermap --groupmap --sockopts --outbuf --iconv --checksum-choice --compress-choice",
        lines="-e --rsh",
    ),
    **dict.fromkeys(
        ("gcc", "g++", "cc", "c++", "clang", "clang++", "gfortran", "cpp"),
        _entry(
            values="-o -x -I -L -l -D -U -include -imacros -isystem -iquote -idirafter -MF -MT "
            "-MQ -Xlinker -Xassembler -Xpreprocessor -T -e -u -z -aux-info --param -Xclang",
            programs="-wrapper",
            opaque="-fplugin -specs -B -fuse-ld -fpass-plugin",
            reader="compiler",
            clusters=False,
        ),
    ),
    "sqlite3": _entry(
        values="-cmd -init -separator -newline -nullvalue -vfs -mmap -heap -lookaside "
        "-pagecache -maxsize -A",
        flags="-safe -batch -bail -echo -header -noheader -interactive -readonly -json -csv "
        "-column -box -markdown -table -line -list -html -tabs -quote -ascii -memtrace -stats "
        "-version -help -nofollow -deserialize -append -zip -nonce",
        reader="sqlite3",
        clusters=False,
    ),
    "psql": _entry(
        values="-c --command -d --dbname -f --file -h --host -p --port -U --username -o "
        "--output -v --set --variable -F --field-separator -R --record-separator -P --pset -T "
        "--table-attr -L --log-file",
        reader="psql",
    ),
    "ed": _entry(
        values="-p --prompt", flags="-s -q --quiet --silent -G -l -r -v -E -V -h", reader="ed"
    ),
    "red": _entry(
        values="-p --prompt", flags="-s -q --quiet --silent -G -l -r -v -E -V -h", reader="ed"
    ),
    **dict.fromkeys(
        ("vim", "vi", "ex", "view", "nvim", "vimdiff", "rvim", "rview", "gvim"),
        _entry(
            values="-c --cmd -u -U -w -W -i -T -t --remote --remote-silent --startuptime "
            "--servername --remote-send --remote-expr --listen",
            optional="-S -q -V -o -O -p",
            flags="-s -e -E -b -l -m -M -n -N -r -L -R -Z -d -g -f -y -h --help --version "
            "--noplugin --clean --headless --not-a-term --ttyfail -X -A -H -F -D",
            reader="vim",
        ),
    ),
    "split": _entry(
        values="-a --suffix-length --additional-suffix -b --bytes -C --line-bytes -l --lines "
        "-n --number -t --separator --numeric-suffixes --hex-suffixes",
        lines="--filter",
    ),
    "zip": _entry(
        values="-b -n -t -tt -x -i -P -s -sp -sb -sc -sv -O --out -Z -ll -lF -la",
        lines="-TT --unzip-command",
        reader="zip",
        clusters=False,
    ),
    "sort": _entry(
        values="-k --key -t --field-separator -o --output -S --buffer-size -T "
        "--temporary-directory --parallel --batch-size --files0-from --random-source --sort",
        programs="--compress-program",
    ),
    "make": _entry(
        values="-C --directory -I --include-dir -j --jobs -l --load-average -o --old-file "
        "--assume-old -W --what-if --new-file --assume-new -O --output-sync --debug "
        "--jobserver-style --shuffle",
        opaque="-E --eval",
        inputs="-f --file --makefile",
        reader="make",
    ),
    "gmake": _entry(
        values="-C --directory -I --include-dir -j --jobs -l --load-average -o -W",
        opaque="-E --eval",
        inputs="-f --file --makefile",
        reader="make",
    ),
    "cmake": _entry(
        values="-S -B -G -T -A -C -D -U --build --install --preset --target --config -j --parallel",
        reader="cmake",
        inputs="-P",
    ),
    "ninja": _entry(values="-C -f -j -k -l -d -t -w", inputs="-f", reader="inputs"),
    "samu": _entry(values="-C -f -j -k -l -d -t -w", inputs="-f", reader="inputs"),
    "man": _entry(
        values="-M --manpath -S -s --sections -m --systems -L --locale -E --encoding -C "
        "--config-file -R --recode -T --troff-device",
        lines="-P --pager -H --html",
        opaque="-p --preprocessor",
    ),
    "wget": _entry(
        values="-O -o -a -i -P -t -T -U -l -A -R -D -w -Q -B -n --header --post-data "
        "--post-file --method --body-data --body-file --user --password --limit-rate "
        "--bind-address --output-document --output-file --input-file --directory-prefix "
        "--tries --timeout --user-agent --level --accept --reject --config",
        lines="--use-askpass",
        opaque="-e --execute",
    ),
    "gpg": _entry(
        values="-o --output -r --recipient -u --local-user --homedir --keyring "
        "--default-key --keyserver",
        lines="--photo-viewer",
        opaque="--exec-path --load-extension",
    ),
    "helm": _entry(
        values="-n --namespace -f --values --set --set-string --set-file "
        "--kube-context --kubeconfig --version --repo -o --output --timeout",
        programs="--post-renderer",
    ),
    "cargo": _entry(
        values="-p --package --bin --example --test --bench --features -F -j "
        "--jobs --target --target-dir --manifest-path --color -Z --profile",
        opaque="--config",
    ),
    "go": _entry(
        values="-C -o -p -tags -ldflags -gcflags -asmflags -mod -modfile -run -bench "
        "-count -timeout -coverprofile -covermode -cpu -parallel -pkgdir -trimpath "
        "-buildmode -compiler -installsuffix -overlay -pgo -benchtime -shuffle",
        programs="-exec -toolexec",
        clusters=False,
    ),
    "npm": _entry(
        values="--registry --cache --userconfig --globalconfig --prefix -C -w "
        "--workspace --tag --otp --access --loglevel --before --omit --include "
        "--auth-type --scope",
        programs="--script-shell",
    ),
    "pnpm": _entry(values="--filter -F -C --dir --reporter --store-dir", programs="--script-shell"),
    "yarn": _entry(values="--cwd --cache-folder --modules-folder --mutex", programs=""),
    "pip": _entry(
        values="-r --requirement -c --constraint -e --editable -t --target -i "
        "--index-url --extra-index-url -f --find-links --cache-dir --log --proxy "
        "--timeout --python"
    ),
    "docker": PLAIN,
    "podman": PLAIN,
    "kubectl": PLAIN,
    "oc": PLAIN,
    "terraform": PLAIN,
    "tofu": PLAIN,
    "gh": _entry(values="-R --repo", reader="gh"),
    "glab": _entry(values="-R --repo", reader="gh"),
    "rg": _entry(
        values="-e --regexp -f --file -g --glob --iglob -t --type -T --type-not -m --max-count "
        "-A --after-context -B --before-context -C --context -j --threads -M --max-columns "
        "--max-depth --max-filesize --type-add --type-clear --colors --color --sort --sortr "
        "-r --replace --path-separator --engine --encoding -E --field-match-separator "
        "--field-context-separator --context-separator --ignore-file --pre-glob --dfa-size-limit "
        "--regex-size-limit --hostname-bin",
        programs="--pre",
    ),
    "ripgrep": _entry(programs="--pre"),
    "bat": _entry(
        values="-l --language -H --highlight-line --style -r --line-range --theme "
        "--tabs --wrap --terminal-width --map-syntax --file-name --diff-context",
        lines="--pager",
    ),
    "install": _entry(
        values="-m --mode -o --owner -g --group -S --suffix -t --target-directory -Z --context",
        programs="--strip-program",
    ),
    "cpio": _entry(
        values="-E --pattern-file -F --file -H --format -I -O -M --message -R "
        "--owner -D --directory --block-size -C --io-size",
        lines="--rsh-command",
    ),
    "pandoc": _entry(
        values="-f --from -r --read -t --to -w --write -o --output -s "
        "--data-dir -M --metadata --metadata-file -d --defaults --template -V "
        "--variable --toc-depth --resource-path --css -H --include-in-header -B "
        "--include-before-body -A --include-after-body --bibliography --csl",
        programs="-F --filter",
        opaque="-L --lua-filter",
    ),
    "ctest": _entry(
        values="-C --build-config -R --tests-regex -E --exclude-regex -L "
        "--label-regex -j --parallel -I --tests-information --output-junit "
        "--timeout --repeat --test-dir",
        opaque="-S -SP --script",
    ),
    **dict.fromkeys(
        ("nc", "ncat", "netcat"),
        _entry(
            values="-p -s -w -i -q -x -X -W -I -O -T -V",
            lines="-e --exec -c --sh-exec",
            opaque="--lua-exec",
        ),
    ),
    "dpkg": _entry(
        values="--admindir --instdir --root -D --debug --force-all --log",
        lines="--pre-invoke --post-invoke",
    ),
    "apt": _entry(
        values="-t --target-release -c --config-file", opaque="-o --option", reader="apt"
    ),
    "apt-get": _entry(
        values="-t --target-release -c --config-file", opaque="-o --option", reader="apt"
    ),
    "brew": _entry(reader="subcommands"),
    "less": _entry(values="-b -h -j -k -o -O -p -P -t -T -x -y -z -#", reader="less"),
    "more": _entry(values="-n", reader="less"),
}
BYSTANDERS["batcat"] = BYSTANDERS["bat"]
"""Every program known to run no command of the line unless an option above says so."""

RUNNING_SUBCOMMANDS: dict[str, frozenset[str]] = {
    "brew": frozenset({"sh", "ruby", "irb", "bundle", "exec"}),
    "gh": frozenset({"extension", "ext", "extensions"}),
    "glab": frozenset(),
}
"""Subcommands after which a program runs code it is given (`brew sh`): opaque."""

SUBCOMMAND_BASES = frozenset(
    [
        "uv",
        "pipx",
        "npm",
        "pnpm",
        "yarn",
        "poetry",
        "pipenv",
        "pdm",
        "hatch",
        "rye",
        "conda",
        "mamba",
        "micromamba",
        "pixi",
        "bundle",
        "mise",
        "direnv",
        "asdf",
        "rbenv",
        "pyenv",
        "nodenv",
        "fnm",
        "volta",
        "devbox",
        "aws-vault",
        "op",
        "doppler",
        "infisical",
        "chamber",
        "perf",
    ]
)
"""Programs one of whose subcommands is a launcher (`uv run`): known, whatever the subcommand."""
