"""The README's client set-ups, checked offline: the blocks `make check-clients` runs exist and
agree on one data home, and the operator's block runs as written. (The clients themselves
run in `make check-clients`, which needs npm.)"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from support import CLI_TIMEOUT, cli_env

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
BLOCKS = CHECK.readme_blocks(README)


def test_every_step_the_client_check_runs_is_a_readme_block():
    steps = {step for scenario in CHECK.SCENARIOS for step in scenario.steps}
    assert steps == set(BLOCKS)
    assert [name for name, block in BLOCKS.items() if block.background] == ["http-serve"]
    assert CHECK.BIND.search(BLOCKS["http-serve"].text)  # a background server binds loopback


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
    desktop = re.search(r"```json\n(\{\n  \"mcpServers\".*?)\n```", README, re.DOTALL)
    assert desktop is not None
    env = json.loads(desktop.group(1))["mcpServers"]["loopwarden"]["env"]
    assert env == {"LOOPWARDEN_HOME": exported.group(1)}
    # Claude Code's --env takes several values: the server's name must come before it.
    assert re.search(r"claude mcp add(?: --transport \w+)? --env", README) is None


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
