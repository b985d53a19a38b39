"""The release machinery: the version in one place, the changelog dating it, and a wheel that
ships everything the package needs (`.ci/check_wheel.py`, which CI runs after `make test`)."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from support import cli

import loopwarden

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def wheel_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_wheel", REPO / ".ci" / "check_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = wheel_module()


def test_the_version_is_written_once_and_every_surface_reports_it():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "loopwarden.__version__"}
    assert importlib.metadata.version("loopwarden") == loopwarden.__version__
    shown = cli("--version")
    assert shown.returncode == 0 and shown.stdout.strip() == loopwarden.__version__


def test_the_changelog_dates_the_version_the_package_states():
    """Keep a Changelog: an Unreleased section first, and the released version's own section
    dated, so bumping `__version__` without dating its section fails here."""
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](?: - (.+))?$", text, re.MULTILINE)
    assert headings and headings[0][0] == "Unreleased", headings
    dated = {name: when for name, when in headings}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", dated.get(loopwarden.__version__, "")), (
        f"CHANGELOG.md has no dated section for {loopwarden.__version__}: {headings}"
    )


def test_every_file_the_package_ships_is_named_in_its_package_data():
    """A template, stylesheet or policy git tracks under loopwarden/ but pyproject does not
    name would be missing from the wheel (an installed `loopwarden dashboard` or `demo` fails)."""
    tracked = subprocess.run(
        ["git", "ls-files", "loopwarden"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    unnamed = []
    for name in (n for n in tracked if not n.endswith(".py")):
        path = Path(name)
        owners = [p for p in data if Path(*p.split(".")) in path.parents]
        if not any(
            fnmatch.fnmatch(path.relative_to(Path(*o.split("."))).as_posix(), glob)
            for o in owners
            for glob in data[o]
        ):
            unnamed.append(name)
    assert not unnamed, f"not in [tool.setuptools.package-data]: {unnamed}"


def test_the_wheel_check_names_a_file_missing_from_a_wheel(tmp_path):
    wheel = tmp_path / "loopwarden-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("loopwarden/dashboard/templates/base.html", "")
    wanted = {"loopwarden/dashboard/templates/base.html", "loopwarden/dashboard/static/a.css"}
    assert CHECK.missing_from(wheel, wanted) == {"loopwarden/dashboard/static/a.css"}


@pytest.mark.slow
def test_a_wheel_built_from_a_clean_clone_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path):
    """`.ci/check_wheel.py` end to end (CI runs it after `make test`; it needs the package
    index for the build backend and the wheel's dependencies)."""
    shown = CHECK.check(tmp_path)
    assert len(shown) == 2 and "ran the demo clean" in shown[1], shown
