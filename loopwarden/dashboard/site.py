"""The dashboard as an ASGI app (its pages and static files behind the request guard), and the
mount that puts it at `/` beside `/mcp` on `serve --http`."""

from __future__ import annotations

from pathlib import Path

from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from loopwarden.dashboard import pages
from loopwarden.dashboard.app import Dashboard, fault
from loopwarden.dashboard.security import Guard
from loopwarden.server.runtime import Runtime


def build_dashboard(dashboard: Dashboard) -> Guard:
    """The dashboard as an ASGI app: its pages, static files, behind the request guard."""
    static = StaticFiles(directory=Path(__file__).parent / "static")
    routes: list[Route | Mount] = [
        *pages.routes(dashboard),
        Mount("/static", static, name="static"),
    ]
    app = Starlette(routes=routes)
    app.add_exception_handler(404, lambda request, exc: dashboard.error_page(404, "no such page"))
    app.add_exception_handler(Exception, lambda request, exc: fault(dashboard, exc))
    return Guard(app, dashboard.security)


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
    )
    return Mount("/", app=build_dashboard(dashboard))
