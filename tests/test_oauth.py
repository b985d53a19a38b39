"""loopwarden as an OAuth 2.1 resource server (issue 25), against a real authorization server.

`tests/issuer.py` is a small issuer on loopback (joserfc JWTs, a JWKS, client credentials,
authorization code + PKCE). A real `loopwarden serve --http --oauth-config FILE` trusts it: its
tokens work beside the static ones, with the principal from the configured claim, and every bad
token is refused with the status and `WWW-Authenticate` the MCP specification asks for. The
JWKS cache's rotation rules are checked in-process on a manual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest
from issuer import Client, Issuer, new_key
from support import (
    MCP_HEADERS,
    Served,
    bounded,
    cli,
    connect_http,
    free_port,
    initialize_request,
    make_policy,
    mint_tokens,
    start_server,
    stop_server,
)

from loopwarden.auth.identity import OAuthSettings, oauth_settings
from loopwarden.auth.oauth import REFETCH_SECONDS, JwtVerifier
from loopwarden.clients.agent import ToolCallError
from loopwarden.clock import ManualClock
from loopwarden.errors import InvalidInput

pytestmark = pytest.mark.anyio

AGENT, OPERATOR = "loopwarden:agent", "loopwarden:operator"


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    found = Issuer(
        clients={
            "builder-cc": Client(secret="builder-secret", subject="builder", scope=AGENT),
            "alice-cc": Client(secret="alice-secret", subject="alice", scope=OPERATOR),
            "mallory-cc": Client(secret="mallory-secret", subject="mallory", scope=AGENT),
        }
    ).start()
    try:
        yield found
    finally:
        found.stop()


def write_config(path: Path, issuer: Issuer, resource: str, **extra: str) -> Path:
    lines = ["[oauth]", f'issuer = "{issuer.url}"', f'resource = "{resource}"']
    lines += ['agents = ["builder", "reviewer", "alice"]']
    lines += [f"{key} = {value}" for key, value in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, issuer: Issuer) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("oauth")
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    config = write_config(root / "oauth.toml", issuer, resource)
    served = start_server(root / "home", root / "logs", "--oauth-config", str(config), port=port)
    try:
        yield served
    finally:
        stop_server(served)


def client_token(
    issuer: Issuer, client_id: str, secret: str, resource: str, scope: str | None = None
) -> str:
    """An access token from the issuer's real token endpoint (client credentials)."""
    form = {
        "grant_type": "client_credentials",
        "client_id": client_id,
        "client_secret": secret,
        "resource": resource,
    }
    if scope is not None:
        form["scope"] = scope
    response = httpx2.post(f"{issuer.url}/token", data=form, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["access_token"]


def post_mcp(url: str, token: str | None = None) -> httpx2.Response:
    headers = dict(MCP_HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(url, json=initialize_request("oauth-test"), headers=headers, timeout=10)


def params(header: str) -> dict[str, str]:
    """The auth-params of a `Bearer k="v", …` challenge."""
    assert header.startswith("Bearer ")
    out = {}
    for part in header.removeprefix("Bearer ").split('", '):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip().strip('"')
    return out


# --- discovery and the 401 -------------------------------------------------------------------


def test_protected_resource_metadata_names_the_issuer_the_resource_and_the_agent_scope(
    server, issuer
):
    base = server.url.removesuffix("/mcp")
    for path in (
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ):
        document = httpx2.get(base + path, timeout=10).json()
        assert document["resource"] == server.url
        assert document["authorization_servers"] == [issuer.url]  # exactly, no slash added
        assert document["scopes_supported"] == [AGENT]
        assert document["bearer_methods_supported"] == ["header"]


def test_a_request_without_a_token_is_401_pointing_at_the_metadata(server):
    response = post_mcp(server.url)
    assert response.status_code == 401
    challenge = params(response.headers["www-authenticate"])
    assert challenge["resource_metadata"] == server.url.replace(
        "/mcp", "/.well-known/oauth-protected-resource/mcp"
    )
    assert challenge["scope"] == AGENT
    assert "error" not in challenge  # no credentials were presented (RFC 6750 §3.1)


@bounded(60)
async def test_a_client_credentials_token_works_and_the_principal_is_its_claim_not_an_argument(
    server, issuer
):
    operator = client_token(issuer, "alice-cc", "alice-secret", server.url)
    agent = client_token(issuer, "builder-cc", "builder-secret", server.url)
    async with connect_http(server.url, operator) as alice:
        await alice.open_loop(
            "oauth", make_policy(agents=["builder"]), [{"id": "t1", "title": "one"}], loop_id="jwt"
        )
    async with connect_http(server.url, agent) as builder:
        turn = await builder.claim("jwt")
        assert turn.granted
        with pytest.raises(ToolCallError):  # an agent's JWT is an agent's: no operator tools
            await builder.open_loop("x", make_policy(), [], loop_id="nope")
        state = await builder.projection("jwt")
    assert [t.agent for t in state.turns] == ["builder"]
    opened = next(r for r in state.recent_receipts if r.kind == "loop.opened")
    assert opened.principal == "alice"


# --- refusals --------------------------------------------------------------------------------


REFUSED_401 = {
    "wrong audience": lambda i, url: i.mint(
        sub="builder", aud="http://127.0.0.1:1/mcp", scope=AGENT
    ),
    "expired": lambda i, url: i.mint(
        sub="builder", aud=url, scope=AGENT, exp=1_000_000, iat=999_000
    ),
    "not yet valid": lambda i, url: i.mint(sub="builder", aud=url, scope=AGENT, nbf=4_000_000_000),
    "another issuer": lambda i, url: i.mint(
        sub="builder", aud=url, scope=AGENT, iss="http://127.0.0.1:2"
    ),
    "a key the issuer never published": lambda i, url: i.mint(
        new_key(), sub="builder", aud=url, scope=AGENT
    ),
    "no identity claim": lambda i, url: i.mint(sub=None, aud=url, scope=AGENT),
    "an unknown agent": lambda i, url: client_token(i, "mallory-cc", "mallory-secret", url),
    "no expiry": lambda i, url: i.mint(sub="builder", aud=url, scope=AGENT, exp=None),
}


@pytest.mark.parametrize("case", list(REFUSED_401))
def test_a_bad_token_is_401_invalid_token(server, issuer, case):
    response = post_mcp(server.url, REFUSED_401[case](issuer, server.url))
    assert response.status_code == 401, case
    challenge = params(response.headers["www-authenticate"])
    assert challenge["error"] == "invalid_token"
    assert challenge["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
    assert "Traceback" not in server.stderr() and "eyJ" not in server.stderr()  # no token logged


@pytest.mark.parametrize(
    ("scope", "why"), [("openid", "no loopwarden role"), (f"{AGENT} {OPERATOR}", "more than one")]
)
def test_a_token_without_exactly_one_role_scope_is_403_insufficient_scope(
    server, issuer, scope, why
):
    token = issuer.mint(sub="builder", aud=server.url, scope=scope)
    response = post_mcp(server.url, token)
    assert response.status_code == 403
    challenge = params(response.headers["www-authenticate"])
    assert challenge["error"] == "insufficient_scope"
    assert challenge["scope"] == AGENT and "resource_metadata" in challenge
    assert why in challenge["error_description"]


@pytest.fixture
def static_token(server: Served) -> str:
    return mint_tokens(server.home, [("reviewer", "agent")])["reviewer"].token


@bounded(60)
async def test_static_tokens_keep_working_beside_oauth(server, issuer, static_token):
    operator = client_token(issuer, "alice-cc", "alice-secret", server.url)
    async with connect_http(server.url, operator) as alice:
        await alice.open_loop("static", make_policy(agents=["reviewer"]), [], loop_id="static")
    async with connect_http(server.url, static_token) as reviewer:
        assert (await reviewer.quota("static")).status == "active"
    assert post_mcp(server.url, "lw_not-a-real-token").status_code == 401


# --- the key cache, on a manual clock --------------------------------------------------------


@bounded(30)
async def test_a_rotated_out_key_is_refused_after_the_next_fetch_and_a_rotated_in_key_at_once(
    issuer,
):
    resource = "http://127.0.0.1:9/mcp"
    clock = ManualClock(datetime.now(UTC))  # the issuer stamps its tokens on the system clock
    verifier = JwtVerifier(
        OAuthSettings(issuer=issuer.url, resource=resource, jwks_cache_seconds=60), clock=clock
    )
    old_token = issuer.mint(sub="builder", aud=resource, scope=AGENT)
    assert (await verifier.verify_token(old_token)) is not None
    issuer.rotate()
    try:
        new_token = issuer.mint(sub="builder", aud=resource, scope=AGENT)
        assert (
            await verifier.verify_token(new_token)
        ).client_id == "builder"  # unknown kid: fetched
        assert verifier.keys.fetches == 2
        clock.advance(61)  # the cache is stale: the next token fetches again
        assert (await verifier.verify_token(old_token)) is None
        assert verifier.keys.fetches == 3
        clock.advance(REFETCH_SECONDS)
        forged = [
            issuer.mint(new_key(), sub="builder", aud=resource, scope=AGENT) for _ in range(5)
        ]
        assert [await verifier.verify_token(t) for t in forged] == [None] * 5
        assert verifier.keys.fetches == 4  # one fetch for the five unknown key ids, not five
    finally:
        issuer.key = issuer.retired.pop()  # the module's issuer keeps the key the server cached


@bounded(30)
async def test_metadata_that_names_another_issuer_is_not_trusted(issuer):
    verifier = JwtVerifier(
        OAuthSettings(issuer=issuer.url + "/", resource="http://127.0.0.1:9/mcp")
    )
    token = issuer.mint(
        iss=issuer.url + "/", sub="builder", aud="http://127.0.0.1:9/mcp", scope=AGENT
    )
    assert (await verifier.verify_token(token)) is None


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"issuer": "http://auth.example.com", "resource": "http://127.0.0.1:1/mcp"}, "https"),
        (
            {
                "issuer": "https://a.example",
                "resource": "https://r.example/mcp",
                "algorithms": ["HS256"],
            },
            "asymmetric",
        ),
        (
            {"issuer": "https://a.example", "resource": "https://r.example/mcp", "colour": "red"},
            "colour",
        ),
        ({"issuer": "https://a.example"}, "missing: resource"),
    ],
)
def test_a_bad_oauth_configuration_is_refused_naming_the_problem(tmp_path, values, message):
    lines = ["[oauth]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in values.items()]
    (tmp_path / "c.toml").write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInput, match=message):
        oauth_settings(config=tmp_path / "c.toml")


def test_serve_with_oauth_but_without_http_exits_2(tmp_path):
    done = cli(
        "serve",
        "--agent",
        "a",
        "--home",
        str(tmp_path),
        "--oauth-issuer",
        "https://a.example",
        "--resource",
        "https://r.example/mcp",
    )
    assert done.returncode == 2
    assert "only applies to --http" in done.stderr


def test_the_oauth_config_example_of_docs_clients_loads(tmp_path):
    text = (Path(__file__).parent.parent / "docs" / "clients.md").read_text()
    example = text.split("```toml\n[oauth]\n", 1)[1].split("```", 1)[0]
    (tmp_path / "oauth.toml").write_text("[oauth]\n" + example)
    loaded = oauth_settings(config=tmp_path / "oauth.toml")
    assert loaded is not None and loaded.dashboard_client_id == "loopwarden-dashboard"
