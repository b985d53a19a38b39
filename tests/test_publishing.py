"""Publishing (issue 25): the MCP Registry's `server.json` and the README line its PyPI
ownership check reads. (The wheel and the sdist `twine check` accepts: `make check-dist`.)

The registry's documented `server.json` format: `$schema` names the released schema, `name` is
reverse-DNS with one slash, `description` at most 100 characters, versions exact and equal to
the package's, and a PyPI package entry per transport (stdio and streamable HTTP), each with the
arguments that start loopwarden that way. The README carries `mcp-name: NAME`.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from loopwarden import __version__

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"


def server_json() -> dict:
    return json.loads((REPO / "server.json").read_text())


def test_server_json_names_the_released_schema_a_reverse_dns_name_and_this_version():
    document = server_json()
    assert document["$schema"] == SCHEMA
    assert re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", document["name"])
    assert 1 <= len(document["description"]) <= 100
    assert document["version"] == __version__


def test_server_json_offers_the_pypi_package_over_stdio_and_streamable_http():
    document = server_json()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    packages = {p["transport"]["type"]: p for p in document["packages"]}
    assert set(packages) == {"stdio", "streamable-http"}
    for package in packages.values():
        assert (package["registryType"], package["identifier"]) == ("pypi", project)
        assert package["version"] == __version__
    stdio = [a.get("value") or a.get("name") for a in packages["stdio"]["packageArguments"]]
    assert stdio == ["serve", "--agent"]
    http = packages["streamable-http"]
    bind = next(a["value"] for a in http["packageArguments"] if a.get("name") == "--http")
    assert http["transport"]["url"] == f"http://{bind}/mcp"


def test_the_readme_carries_the_mcp_name_line_the_registry_checks_on_pypi():
    name = server_json()["name"]
    assert f"<!-- mcp-name: {name} -->" in (REPO / "README.md").read_text()
