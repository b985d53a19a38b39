"""The dashboard as an ASGI app (its pages and static files behind the request guard), and the
mount that puts it at `/` beside `/mcp` on `serve --http`."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from loopwarden.dashboard import pages
from loopwarden.dashboard.board import Dashboard, fault
from loopwarden.dashboard.operator_sessions import COOKIE
from loopwarden.dashboard.security import Guard


def build_dashboard(dashboard: Dashboard) -> Guard:
    """The dashboard as an ASGI app: its pages, static files, behind the request guard."""
    static = StaticFiles(directory=Path(__file__).parent / "static")
    routes: list[Route | Mount] = [
        *pages.routes(dashboard),
        Mount("/static", static, name="static"),
    ]
    app = Starlette(routes=routes)
    app.add_exception_handler(404, lambda request, exc: not_found(dashboard, request))
    app.add_exception_handler(Exception, lambda request, exc: fault(dashboard, exc))
    return Guard(app, dashboard.security)


def not_found(dashboard: Dashboard, request: Request) -> Response:
    """A path with no page: said so, with the navigation (and who is signed in, if anyone)."""
    session = dashboard.sessions.get(request.cookies.get(COOKIE))
    path = request.url.path[:200]
    return dashboard.error_page(404, f"there is no page at {path}", session)
