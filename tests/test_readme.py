"""The README and the docs pages checked offline: the client set-ups `make check-clients` runs
(the README's quickstart, then docs/clients.md) exist and agree on one data home, the quickstart
runs as written — its loop, and its hooks on a policy `policy check` has no note for — the demo
excerpt is what a real `loopwarden demo` prints, and every link between the pages lands.
(The clients themselves run in `make check-clients`, which needs npm.)"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from support import CLI_TIMEOUT, cli_env, loopwarden

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def check_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_clients", REPO / ".ci" / "check_clients.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's names
    spec.loader.exec_module(module)
    return module


CHECK = check_module()
PAGES = CHECK.documents_text(REPO)  # the README, then docs/clients.md: what check-clients runs
BLOCKS = CHECK.document_blocks(REPO)


def test_the_client_check_runs_every_block_of_its_pages_in_order_and_checks_only_blocks_it_runs():
    """One reader, top to bottom: the script is every block of the README and then of
    docs/clients.md in their order (no list of steps of its own to drift), the home first, and
    each check names a block."""
    assert CHECK.DOCUMENTS == ("README.md", "docs/clients.md")
    script = CHECK.bash_script(BLOCKS, tuple(BLOCKS), Path("/logs"))
    ran = re.findall(r"^echo '== ([a-z0-9-]+)'", script, re.MULTILINE)
    marked = [
        name for page in CHECK.DOCUMENTS
        for name in re.findall(r"<!-- client-check: ([a-z0-9-]+)", (REPO / page).read_text())
    ]  # fmt: skip
    assert ran == marked and ran[0] == "home"
    assert re.findall(r"<!-- client-check: ([a-z0-9-]+)", README) == ["home", "claude-stdio"]
    assert set(CHECK.CHECKS) <= set(BLOCKS)
    assert [name for name, block in BLOCKS.items() if block.background] == ["http-serve"]
    assert CHECK.BIND.search(BLOCKS["http-serve"].text)  # a background server binds loopback
    assert "trustedFolders" not in (REPO / ".ci" / "check_clients.py").read_text()


def test_every_inspector_command_names_the_pinned_version():
    """Unpinned, `npx @modelcontextprotocol/inspector` on Node 20 resolves 0.15.0, which fails
    `--strict` with no useful message."""
    pinned = CHECK.PACKAGES["@modelcontextprotocol/inspector"]
    calls = re.findall(r"npx (@modelcontextprotocol/inspector\S*)", PAGES)
    assert calls and set(calls) == {f"@modelcontextprotocol/inspector@{pinned}"}, calls
    assert CHECK.INSPECTOR[1] == calls[0]


def test_claude_code_http_set_up_follows_the_stdio_one_in_the_same_folder():
    """`claude mcp add` refuses a name the folder has ("already exists in local config")."""
    stdio, http = BLOCKS["claude-stdio"].text, BLOCKS["claude-http"].text
    assert "claude mcp add --transport stdio loopwarden" in stdio
    assert http.index("claude mcp remove loopwarden") < http.index("claude mcp add")


def test_every_gemini_mcp_list_runs_in_a_trusted_folder():
    """Gemini CLI connects no server in an untrusted folder (`Disabled`); its documented way
    for a non-interactive run is GEMINI_CLI_TRUST_WORKSPACE=true."""
    lines = [
        line for block in BLOCKS.values() for line in block.text.splitlines()
        if re.match(r"(\S+=\S+ )*gemini mcp list", line)
    ]  # fmt: skip
    assert len(lines) == 2 and all(
        line.startswith("GEMINI_CLI_TRUST_WORKSPACE=true gemini mcp list") for line in lines
    ), lines


def test_a_block_named_twice_is_refused():
    twice = "<!-- client-check: a -->\n```sh\ntrue\n```\n" * 2
    try:
        CHECK.readme_blocks(twice)
    except CHECK.CheckFailed as exc:
        assert "twice" in str(exc)
    else:
        raise AssertionError("a duplicated block name was accepted")


def test_every_client_set_up_uses_the_one_home_the_readme_exports():
    exported = re.search(r"^export LOOPWARDEN_HOME=(\S+)", BLOCKS["home"].text, re.MULTILINE)
    assert exported is not None
    for name in ("claude-stdio", "gemini", "codex", "inspector-stdio"):
        assert 'LOOPWARDEN_HOME="$LOOPWARDEN_HOME"' in BLOCKS[name].text, name
    desktop = re.search(r"```json\n(\{\n  \"mcpServers\".*?)\n```", PAGES, re.DOTALL)
    assert desktop is not None
    env = json.loads(desktop.group(1))["mcpServers"]["loopwarden"]["env"]
    assert env == {"LOOPWARDEN_HOME": exported.group(1)}
    # Claude Code's --env takes several values: the server's name must come before it.
    assert re.search(r"claude mcp add(?: --transport \w+)? --env", PAGES) is None


def test_the_operators_block_runs_as_written(tmp_path):
    """`export LOOPWARDEN_HOME=~/.loopwarden`, policy init, loop open, home — in bash, in a
    scratch HOME, with this checkout's `loopwarden` first on the PATH."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = Path(sys.executable).parent
    env = cli_env(HOME=str(home), PATH=f"{bin_dir}:/usr/bin:/bin")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", BLOCKS["home"].text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * CLI_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "opened loop csv-export with 2 todos" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == str(home / ".loopwarden")
    assert (home / ".loopwarden" / "loopwarden.db").is_file()


def readme_check(name: str) -> str:
    """The README's block marked `<!-- readme-check: NAME -->`: run here, offline."""
    found = re.search(rf"<!-- readme-check: {name} -->\n```sh\n(.*?)\n```", README, re.DOTALL)
    assert found is not None, f"the README has no readme-check block {name!r}"
    return found.group(1)


def test_the_quickstarts_hooks_run_as_written_on_a_complete_policy(tmp_path):
    """The quickstart's third step after its first, in one bash session: the starter policy
    with the hooks lines is valid with no note (the starter allows `shell.run`, so the command
    rules are read and enforced hooks let the shell through), `ls -la` is allowed and `git push`
    denied, the loop takes the policy, and Claude Code's hooks are written for it."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = Path(sys.executable).parent
    env = cli_env(HOME=str(home), PATH=f"{bin_dir}:/usr/bin:/bin")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", BLOCKS["home"].text + "\n" + readme_check("hooks")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=8 * CLI_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.splitlines()
    assert any(re.match(r"allow +ls -la$", line) for line in printed), done.stdout
    assert any(re.match(r"deny +git push origin main$", line) for line in printed), done.stdout
    assert "loop csv-export now has policy" in done.stdout
    checked = subprocess.run(
        loopwarden("policy", "check", "policy.toml", "--json"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    verdict = json.loads(checked.stdout)
    assert verdict["notes"] == [] and verdict["policy"]["observe"]["mode"] == "enforce"
    assert "shell.run" in verdict["policy"]["tools"]["allow"]
    settings = json.loads((tmp_path / ".claude" / "settings.json").read_text())
    assert "--loop csv-export --agent builder" in json.dumps(settings["hooks"])


def test_only_the_pages_the_client_check_reads_mark_client_check_blocks():
    """A block marked on another page would never run."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    marking = [
        str(page.relative_to(REPO)) for page in pages if "<!-- client-check:" in page.read_text()
    ]
    assert marking == list(CHECK.DOCUMENTS)


def test_the_readme_is_a_short_quickstart_with_a_table_of_contents():
    """A newcomer's five minutes: the README stays short (the reference is under docs/), and
    its contents line links every section."""
    assert len(README.splitlines()) <= 175
    headings = re.findall(r"^#{2,3} (.+)$", README, re.MULTILINE)
    contents = README[README.index("**Contents:**") : README.index("## The two commands")]
    assert headings and all(f"(#{slug(h)})" in contents for h in headings), headings


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_between_the_pages_lands_on_a_file_and_a_heading():
    """The README's reference moved under docs/: every relative link of the README, the docs
    pages and the CHANGELOG names a file that exists and, with `#anchor`, one of its headings."""
    pages = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check offline
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


# What differs from run to run (ids, the time, the root over them, how the CLI was started);
# digests of the demo's policies and every count stay as they are, so a change to the demo shows.
VOLATILE = (
    (re.compile(r"\b(rcpt|turn|appr)-[0-9a-f]{16,32}\b"), r"\1-…"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "ROOT"),
    (re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+Z"), "TIME"),
    (re.compile(r"(?:\S+ -m )?\S*loopwarden demo --home DIR"), "loopwarden demo --home DIR"),
)


def steady(line: str) -> str:
    for pattern, replacement in VOLATILE:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def excerpt_chunks(readme: str) -> list[list[str]]:
    """The README's demo excerpt as runs of consecutive lines (`…` separates them)."""
    found = re.search(r"<!-- demo-excerpt -->\n```\n(.*?)\n```", readme, re.DOTALL)
    assert found is not None, "the README has no demo excerpt"
    chunks: list[list[str]] = [[]]
    for line in found.group(1).splitlines():
        if line == "…":
            chunks.append([])
        else:
            chunks[-1].append(steady(line))
    return [chunk for chunk in chunks if chunk]


def test_a_real_demo_run_prints_the_readmes_excerpt_and_removes_its_temporary_home(tmp_path):
    """The suite's one real demo run. Each run of lines in the README's excerpt appears, in
    order and consecutively, in its output (ids, times and the Merkle root aside), and the
    excerpt shows every section's heading (it used to describe three scenarios and show a tree
    size of 18); the temporary home is gone after, and the last line names a command that runs."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(
        loopwarden("demo"),
        env=cli_env(TMPDIR=str(scratch)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=4 * CLI_TIMEOUT,  # a whole demo: four scenarios, each with its own servers
    )
    assert done.returncode == 0, done.stdout + done.stderr
    printed = [steady(line) for line in done.stdout.splitlines()]
    at = 0
    for chunk in excerpt_chunks(README):
        starts = [
            i for i in range(at, len(printed) - len(chunk) + 1)
            if printed[i : i + len(chunk)] == chunk
        ]  # fmt: skip
        assert starts, (
            "the README's demo excerpt is not what the demo prints:\n"
            + "\n".join(chunk)
            + "\n--- a real run printed ---\n"
            + "\n".join(printed)
        )
        at = starts[0] + len(chunk)
    headings = [line for line in printed if line.startswith("━━ ")]
    shown = [line for chunk in excerpt_chunks(README) for line in chunk if line.startswith("━━ ")]
    assert shown == headings and len(headings) >= 5
    assert "all scenarios behaved as governed" in done.stdout
    assert list(scratch.iterdir()) == []  # the loopwarden-demo-* directory is gone
    hint = done.stdout.strip().splitlines()[-1]
    assert f"{sys.executable} -m loopwarden demo --home DIR" in hint
