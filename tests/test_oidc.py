"""Operators sign into the dashboard with OpenID Connect (issue 25): authorization code + PKCE
against the real loopback issuer of `tests/issuer.py`, the token sign-in beside it.

The browser's part is played with an HTTP client that keeps cookies and follows each redirect
by hand, so every step is checked: the authorization request (PKCE S256, state, nonce, the
resource, the operator scope), the issuer's redirect with `iss`, the callback's checks, and the
session it opens. A user whose token names no operator role, a callback without the state's
cookie, and a replayed callback sign nobody in.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from issuer import Client, Issuer
from support import Served, dashboard_url, free_port, start_server, stop_server

OPERATOR_SCOPE = "loopwarden:operator"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Issuer]]:
    root = tmp_path_factory.mktemp("oidc")
    port = free_port()
    callback = f"http://127.0.0.1:{port}/login/oidc/callback"
    issuer = Issuer(
        clients={"dashboard": Client(redirect_uris=[callback])},
        users={"alice": f"openid {OPERATOR_SCOPE}", "bob": "openid loopwarden:agent"},
    ).start()
    config = root / "oauth.toml"
    config.write_text(
        f'[oauth]\nissuer = "{issuer.url}"\nresource = "http://127.0.0.1:{port}/mcp"\n'
        'dashboard_client_id = "dashboard"\n'
    )
    served = start_server(root / "home", root / "logs", "--oauth-config", str(config), port=port)
    try:
        yield served, issuer
    finally:
        stop_server(served)
        issuer.stop()


def sign_in(
    served: Served, issuer: Issuer, user: str
) -> tuple[httpx2.Client, httpx2.Response, str]:
    """A browser's OIDC sign-in as `user`: (its client, the callback's answer, the callback URL)."""
    issuer.login_as = user
    http = httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30)
    assert 'href="/login/oidc?' in http.get("/login").text
    start = http.get("/login/oidc")
    assert start.status_code == 303
    to_issuer = start.headers["location"]
    query = parse_qs(urlsplit(to_issuer).query)
    assert to_issuer.startswith(f"{issuer.url}/authorize?")
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["resource"] == [served.url] and OPERATOR_SCOPE in query["scope"][0].split()
    assert query["state"][0] and query["nonce"][0]
    back = httpx2.get(to_issuer, follow_redirects=False, timeout=10)
    assert back.status_code == 302
    callback = back.headers["location"]
    assert parse_qs(urlsplit(callback).query)["iss"] == [issuer.url]
    return http, http.get(callback.removeprefix(dashboard_url(served))), callback


def test_an_operator_signs_in_with_the_identity_provider_and_the_session_opens(setup):
    served, issuer = setup
    http, answer, callback = sign_in(served, issuer, "alice")
    redeemed = issuer.seen["/token"]
    try:
        assert answer.status_code == 200 and 'http-equiv="refresh"' in answer.text
        home = http.get("/")
        assert home.status_code == 200 and "alice" in home.text
        again = http.get(callback.removeprefix(dashboard_url(served)))  # a replayed callback
        assert again.status_code == 403 and "expired" in again.text
    finally:
        http.close()
    assert issuer.seen["/token"] == redeemed  # the replay never reached the token endpoint


def test_a_user_without_the_operator_role_is_refused(setup):
    served, issuer = setup
    http, answer, _ = sign_in(served, issuer, "bob")
    try:
        assert answer.status_code == 403 and "for operators" in answer.text
        assert http.get("/").status_code == 303  # no session
    finally:
        http.close()


def test_a_callback_without_the_browsers_state_cookie_signs_nobody_in(setup):
    served, issuer = setup
    http, _, callback = sign_in(served, issuer, "alice")
    http.close()
    with httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30) as other:
        stolen = other.get(callback.removeprefix(dashboard_url(served)))
        assert stolen.status_code == 403
        assert other.get("/").status_code == 303


def test_the_token_sign_in_stays_beside_it(setup):
    served, _ = setup
    with httpx2.Client(base_url=dashboard_url(served), timeout=30) as http:
        page = http.get("/login").text
        assert 'name="token"' in page and "/login/oidc" in page


def test_a_thousand_strangers_starting_sign_ins_cannot_cancel_an_operators(setup):
    """Issue 44, finding 8: the sign-in in progress lives in the operator's own sealed cookie,
    so no number of other sign-ins started elsewhere can evict it (there was one table of 1,000
    pending sign-ins for the whole server)."""
    served, issuer = setup
    issuer.login_as = "alice"
    with httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30) as http:
        to_issuer = http.get("/login/oidc").headers["location"]
        with httpx2.Client(base_url=dashboard_url(served), timeout=30) as stranger:
            for _ in range(1_005):  # unauthenticated, each a sign-in of its own
                assert stranger.get("/login/oidc", follow_redirects=False).status_code == 303
        callback = httpx2.get(to_issuer, follow_redirects=False, timeout=10).headers["location"]
        answer = http.get(callback.removeprefix(dashboard_url(served)))
        assert answer.status_code == 200, answer.text
        assert "alice" in http.get("/").text


def test_a_state_cookie_that_is_not_the_servers_own_signs_nobody_in(setup):
    served, issuer = setup
    issuer.login_as = "alice"
    with httpx2.Client(base_url=dashboard_url(served), follow_redirects=False, timeout=30) as http:
        to_issuer = http.get("/login/oidc").headers["location"]
        sealed = http.cookies["lw_oidc"]
        callback = httpx2.get(to_issuer, follow_redirects=False, timeout=10).headers["location"]
        parts = sealed.split(".")
        middle = len(parts[3]) // 2
        flipped = "B" if parts[3][middle] == "A" else "A"
        parts[3] = parts[3][:middle] + flipped + parts[3][middle + 1 :]  # one byte edited
        http.cookies.clear()
        http.cookies.set("lw_oidc", ".".join(parts))
        refused = http.get(callback.removeprefix(dashboard_url(served)))
        assert refused.status_code == 403 and "expired" in refused.text
        assert http.get("/").status_code == 303
