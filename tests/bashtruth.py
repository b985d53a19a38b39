"""Ground truth for command rules: what a real `bash` runs.

A `Sandbox` is a temporary directory holding a git repository whose `origin` is a bare
repository reached through a stub receive-pack (`remote.origin.receivepack`) that records
every push git makes and refuses it, a directory `victim`, and a `bin/` that is the whole PATH:
the real git (also as `GIT` and `git.exe`, as case-insensitive and Windows file systems resolve
them), an `rm` stub that records a forced recursive delete (its options read by util-linux
`getopt`, the parser GNU rm's own getopt_long matches) instead of deleting, and the real
programs the lines use to launch them (shells, `env`, `xargs`, `find`, `timeout`,
interpreters, …). `run` executes a batch of lines, each in its own `bash -c` with a time bound
(`victim` and the repository's configuration restored after each), in one driver process
(inside a network namespace where `unshare` allows one), and returns for each line the denied
commands it really ran: `"git push"` (git connected to push, or the remote received one) and
`"rm -r -f"`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIT_PUSH = "git push"
RM_RF = "rm -r -f"
TOOLS = [
    "sh",
    "bash",
    "dash",
    "env",
    "xargs",
    "find",
    "timeout",
    "nice",
    "nohup",
    "stdbuf",
    "flock",
    "chroot",
    "ionice",
    "watch",
    "su",
    "runuser",
    "setsid",
    "script",
    "perl",
    "node",
    "awk",
    "mawk",
    "sed",
    "base64",
    "cat",
    "echo",
    "printf",
    "tr",
    "head",
    "tail",
    "true",
    "false",
    "sleep",
    "tee",
    "wc",
    "ls",
    "grep",
    "diff",
    "mkdir",
    "cp",
    "mv",
    "touch",
    "sort",
    "uniq",
    "cut",
    "xxd",
    "id",
    "date",
    "seq",
    "test",
    "realpath",
    "dirname",
    "basename",
    "pwd",
    # launchers and programs outside the reader's first tables (issue 42): each is linked
    # when the machine has it, so a corpus line using one is checked where it can be
    "chrt",
    "taskset",
    "prlimit",
    "setarch",
    "linux32",
    "linux64",
    "x86_64",
    "unshare",
    "setpriv",
    "fakeroot",
    "faked",
    "faked-sysv",
    "getopt",
    "valgrind",
    "ssh-agent",
    "dbus-run-session",
    "dbus-daemon",
    "sg",
    "nsenter",
    "strace",
    "gdb",
    "tar",
    "ssh",
    "scp",
    "sftp",
    "gcc",
    "cc",
    "as",
    "ld",
    "sqlite3",
    "ed",
    "ex",
    "vi",
    "vim",
    "split",
    "zip",
    "unzip",
    "make",
    "cmake",
    "ninja",
    "tclsh",
    "m4",
    "mktemp",
    "chmod",
    "ln",
    "stat",
    "expr",
    "yes",
    "jq",
    "gzip",
]
_RM = """#!/bin/sh
opts=$(/usr/bin/getopt -q -o dfirRvI -l force,interactive::,one-file-system,no-preserve-root,\
preserve-root::,recursive,dir,verbose -n rm -- "$@") || exit 1
eval set -- "$opts"
r=; f=
while [ "$1" != "--" ]; do
  case "$1" in -r|-R|--recursive) r=1;; -f|--force) f=1;; esac
  shift
done
[ -n "$r" ] && [ -n "$f" ] && echo RMRF >> "{log}"
exit 0
"""
_UNKNOWN_LAUNCHERS = {
    "lwrun": '#!/bin/sh\nexec "$@"\n',  # runs its arguments
    "lwsh": '#!/bin/sh\nexec sh -c "$*"\n',  # runs its arguments joined, by a shell
    "lwopt": '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',  # options first
}
"""Stub launchers whose names no program table knows: what loopwarden must treat as unknown."""
_RECEIVE = """#!/bin/sh
echo PUSH >> "{log}"
exit 1
"""
_DRIVER = r"""
shopt -s nullglob
read -r -d '' config < "$LW_CONFIG"
i=0
while IFS= read -r -d '' line; do
  printf '\n=== %d\n' "$i" >> "$LW_LOG"
  /usr/bin/timeout -k 1 "$LW_BOUND" /usr/bin/bash -c "$line" </dev/null >/dev/null 2>&1 &
  group=$!  # timeout leads a process group of its own: the line's processes are in it
  wait "$group"
  # what the line left running (an output `>( )`, a `<( )` bash does not wait for) ends
  # before the next line starts, so that what it does is its own line's (zombies aside)
  if [ -n "$LW_SETTLE" ] && kill -0 -- "-$group" 2>/dev/null; then  # (the builtin kill)
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      /usr/bin/pgrep -g "$group" -r R,S,D,T,t,I >/dev/null || break
      /usr/bin/sleep 0.05
    done
    kill -9 -- "-$group" 2>/dev/null
  fi
  refs=("$LW_REMOTE"/refs/heads/*)
  if (( ${#refs[@]} )) || [ -s "$LW_REMOTE/packed-refs" ]; then
    echo REMOTE >> "$LW_LOG"
    /usr/bin/git --git-dir="$LW_REMOTE" for-each-ref --format='delete %(refname)' \
      | /usr/bin/git --git-dir="$LW_REMOTE" update-ref --stdin
  fi
  if [ -d .git/rebase-merge ] || [ -d .git/rebase-apply ]; then
    /usr/bin/git rebase --abort >/dev/null 2>&1
  fi
  [ -f victim/file ] || { /usr/bin/mkdir -p victim && : > victim/file; }
  read -r -d '' now < .git/config
  [ "$now" = "$config" ] || printf '%s\n' "$config" > .git/config
  i=$((i + 1))
done < "$LW_LINES"
"""


def _git(*args: str, cwd: Path, env: dict[str, str]) -> None:
    subprocess.run(["/usr/bin/git", *args], cwd=cwd, env=env, check=True, capture_output=True)


class Sandbox:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lw-bash-"))
        self.bin, self.work, self.home = self.root / "bin", self.root / "work", self.root / "home"
        self.log, self.remote = self.root / "log", self.root / "remote.git"
        for folder in (self.bin, self.work, self.home):
            folder.mkdir()
        self.env = {
            "PATH": str(self.bin),
            "HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "LANG": "C.UTF-8",
        }
        self._tools()
        self._repository()

    def _tools(self) -> None:
        for tool in TOOLS:
            found = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            if found and not (self.bin / tool).exists():
                (self.bin / tool).symlink_to(os.path.realpath(found))
        pytest = self.bin / "pytest"  # reads the files it is given, as the real one would
        pytest.write_text('#!/bin/sh\nfor a; do [ -r "$a" ] && cat "$a" > /dev/null; done\n')
        pytest.chmod(0o755)
        python = os.path.realpath(sys.executable)
        for name in ("python", "python3"):
            (self.bin / name).symlink_to(python)
        for name in ("git", "GIT", "git.exe"):  # as case-insensitive and Windows file systems
            (self.bin / name).symlink_to("/usr/bin/git")
        for name, body in _UNKNOWN_LAUNCHERS.items():  # launchers no table names
            stub = self.bin / name
            stub.write_text(body)
            stub.chmod(0o755)
        rm = self.bin / "rm"
        rm.write_text(_RM.replace("{log}", str(self.log)))
        rm.chmod(0o755)

    def _repository(self) -> None:
        env = self.env
        (self.home / ".gitconfig").write_text(
            "[user]\n\tname = sandbox\n\temail = sandbox@example.invalid\n"
            "[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
        )
        _git("init", "-q", "--bare", str(self.remote), cwd=self.root, env=env)
        _git("init", "-q", cwd=self.work, env=env)
        (self.work / "README.md").write_text("sandbox\n")
        _git("add", "README.md", cwd=self.work, env=env)
        _git("commit", "-q", "-m", "one", cwd=self.work, env=env)
        _git("remote", "add", "origin", str(self.remote), cwd=self.work, env=env)
        _git("config", "push.default", "current", cwd=self.work, env=env)
        receive = self.root / "receive-pack"
        receive.write_text(_RECEIVE.replace("{log}", str(self.log)))
        receive.chmod(0o755)
        _git("config", "remote.origin.receivepack", str(receive), cwd=self.work, env=env)
        victim = self.work / "victim"
        victim.mkdir()
        (victim / "file").write_text("x")
        (self.work / "push").write_text("")  # so that `git pu?h` expands as it would
        shutil.copy(self.work / ".git" / "config", self.root / "config")

    def run(self, lines: list[str], bound: float = 4, settle: bool = False) -> list[set[str]]:
        """The denied commands each of `lines` really runs in bash. With `settle`, what a line
        leaves running (a `<( )` bash does not wait for) is waited for, then ended, before the
        next line starts, so that a denied command it runs late is not blamed on the next line
        (it costs a process-table scan after each line whose process group lives on)."""
        self.log.write_text("")
        listing = self.root / "lines"
        listing.write_bytes(b"".join(line.encode() + b"\0" for line in lines))
        env = {
            **self.env,
            "LW_LOG": str(self.log),
            "LW_LINES": str(listing),
            "LW_REMOTE": str(self.remote),
            "LW_BOUND": str(bound),
            "LW_CONFIG": str(self.root / "config"),
            "LW_SETTLE": "1" if settle else "",
        }
        command = ["/usr/bin/bash", "-c", _DRIVER]
        if _unshare_works():
            command = ["/usr/bin/unshare", "-n", *command]
        try:
            subprocess.run(
                command, cwd=self.work, env=env, timeout=60 + bound * len(lines), check=True
            )
        finally:
            _kill_strays(self.root)
        return _ran(self.log.read_text(), len(lines))

    def close(self) -> None:
        _kill_strays(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _ran(log: str, count: int) -> list[set[str]]:
    out: list[set[str]] = [set() for _ in range(count)]
    current = None
    for line in log.splitlines():
        if line.startswith("=== "):
            current = int(line[4:])
        elif current is not None and line in ("PUSH", "REMOTE"):
            out[current].add(GIT_PUSH)
        elif current is not None and line == "RMRF":
            out[current].add(RM_RF)
    return out


def _kill_strays(root: Path) -> None:
    """End what the lines left running in the sandbox (a `script` or `setsid` in a session of
    its own outlives its line's time bound, and `fakeroot` leaves its daemon): every process
    whose working directory is inside it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(root)):
                pids.append(int(entry))
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        if not pids:
            return
        time.sleep(0.05)


def _unshare_works() -> bool:
    try:
        done = subprocess.run(["/usr/bin/unshare", "-n", "/usr/bin/true"], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0
