"""What `serve --http` mounts beside `/mcp` that needs the server's runtime: the dashboard (its
store, its OIDC client), under the same Host and Origin rules as `/mcp`. The dashboard itself
knows nothing of the MCP server: it is given a store getter."""

from __future__ import annotations

from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Mount

from loopwarden.dashboard.board import Dashboard
from loopwarden.dashboard.oidc import OidcLogin, sealing_key
from loopwarden.dashboard.site import build_dashboard
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.server.runtime import Runtime


def oidc_login(runtime: Runtime) -> OidcLogin | None:
    """The dashboard's OIDC client, when OAuth names one (`dashboard_client_id`)."""
    oauth, jwts = runtime.settings.oauth, runtime.jwts
    if oauth is None or jwts is None or oauth.dashboard_client_id is None:
        return None
    return OidcLogin(
        jwts,
        client_id=oauth.dashboard_client_id,
        client_secret=oauth.client_secret,
        redirect_uri=f"{runtime.settings.dashboard_url}/login/oidc/callback",
        seal_key=sealing_key(KeyStore(runtime.settings.home).load_secret()),
        clock=runtime.clock,
    )


def dashboard_mount(runtime: Runtime, security: TransportSecuritySettings) -> Mount:
    """The dashboard at `/` of a running server (`/mcp` is matched first), reading the
    runtime's store, under the same Host and Origin rules as `/mcp`."""
    settings = runtime.settings
    dashboard = Dashboard(
        lambda: runtime.store,
        db=settings.location,
        keys_home=settings.home,
        security=security,
        clock=runtime.clock,
        oidc=oidc_login(runtime),
    )
    return Mount("/", app=build_dashboard(dashboard))
