"""The dashboard's wiring: its state, who is signed in, rendering, and the Starlette app.

`Dashboard` holds what outlives a request: the store accessor (the server's open store, or the
standalone command's), the sessions, the cached loop histories, the audit runner and the
templates. `Dashboard.page` wraps every page handler: it checks the session and the operator
token behind it (one store read, which also answers the page's "has anything changed?"
probe), answers a live-update poll whose version has not moved with 204 and no rendering, and
turns loopwarden errors into error pages. Pages are in `pages.py`, the app that serves
them in `site.py`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from loopwarden import __version__
from loopwarden.auth.tokens import token_problem
from loopwarden.clock import Clock, format_time, system_clock
from loopwarden.dashboard.audit_runs import Auditor
from loopwarden.dashboard.history import Histories
from loopwarden.dashboard.operator_sessions import COOKIE, Session, Sessions, next_page, same_secret
from loopwarden.dashboard.views import stop_reason_text
from loopwarden.errors import Conflict, Forbidden, InvalidInput, LoopwardenError, NotFound
from loopwarden.kernel.sql.location import Location
from loopwarden.kernel.store.reader import Reader, TokenRow
from loopwarden.kernel.store.store import Store
from loopwarden.principals import Principal

if TYPE_CHECKING:
    from loopwarden.dashboard.oidc import OidcLogin

log = logging.getLogger("loopwarden.dashboard")
POLL_SECONDS = 2.0
STATUS_OF: dict[type[LoopwardenError], int] = {
    InvalidInput: 400,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
}
Probe = Callable[[Reader], Any]


@dataclass
class Ctx:
    """One signed-in request: the session, the store, the operator, and the probe's answer."""

    request: Request
    session: Session
    store: Store
    version: str

    @property
    def who(self) -> Principal:
        return self.session.principal


Handler = Callable[[Ctx], Awaitable[Response]]


def operator_problem(row: TokenRow | None, store: Store) -> str | None:
    """Why a token row does not sign an operator in now (None if it does)."""
    problem = token_problem(row, store.clock(), store.integrity)
    if problem is None and row is not None and row.role != "operator":
        return "role"
    return problem


def stamp(value: datetime | str) -> str:
    """A time as the pages show it: `clock.format_time`'s UTC text (a receipt's own text as is)."""
    return format_time(value) if isinstance(value, datetime) else value


class Dashboard:
    def __init__(
        self,
        store: Callable[[], Store | None],
        *,
        db: Location,
        keys_home: Path,
        security: TransportSecuritySettings,
        clock: Clock = system_clock,
        poll_seconds: float = POLL_SECONDS,
        oidc: OidcLogin | None = None,
    ) -> None:
        self.store = store
        self.oidc = oidc  # operators may also sign in with the identity provider (oidc.py)
        self.security = security
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.sessions = Sessions(clock)
        self.histories = Histories()
        self.auditor = Auditor(db, keys_home, clock)
        self.templates = Environment(
            loader=PackageLoader("loopwarden.dashboard", "templates"),
            autoescape=True,  # every template, every value: agent text is text
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.globals.update(app_version=__version__, poll_seconds=poll_seconds)
        self.templates.filters["pretty"] = lambda value: json.dumps(
            value, indent=2, ensure_ascii=False
        )
        self.templates.filters["stamp"] = stamp
        self.templates.filters["stop_reason"] = stop_reason_text

    # --- rendering ----------------------------------------------------------------------------

    def render(self, name: str, code: int = 200, /, **values: Any) -> HTMLResponse:
        values.setdefault("who", None)
        values.setdefault("flash", [])
        return HTMLResponse(self.templates.get_template(name).render(**values), status_code=code)

    def render_page(self, ctx: Ctx, name: str, **values: Any) -> HTMLResponse:
        """A whole page `NAME.html`, or for a live-update poll (`?since=`) only its live region,
        `NAME_live.html` (which the page includes), polling on at the new version."""
        query = {k: v for k, v in ctx.request.query_params.items() if k != "since"}
        query["since"] = ctx.version
        values.update(
            who=ctx.who,
            csrf=ctx.session.csrf,
            version=ctx.version,
            live_url=f"{ctx.request.url.path}?{urlencode(query)}",
            path=ctx.request.url.path,
            now=self.clock(),
        )
        if "since" in ctx.request.query_params:
            return self.render(name.replace(".html", "_live.html"), **values)
        return self.render(name, flash=ctx.session.take_flash(), **values)

    def error_page(self, status: int, message: str, session: Session | None = None) -> HTMLResponse:
        """An error as a page with the site's navigation (and its sign-out, if signed in)."""
        who, csrf = (session.principal, session.csrf) if session else (None, "")
        return self.render("error.html", status, message=message, code=status, who=who, csrf=csrf)

    # --- who is signed in ---------------------------------------------------------------------

    def page(self, probe: Callable[[Request], Probe] | None = None) -> Callable[[Handler], Any]:
        """Wrap a handler: signed-in operators only, one read for token and probe, live polls
        answered 204 while nothing moved, loopwarden errors as pages."""

        def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                signed = await self._signed_in(request, probe(request) if probe else None)
                if isinstance(signed, Response):
                    return signed
                since = request.query_params.get("since")
                if since is not None and since == signed.version:
                    return Response(status_code=204)
                try:
                    return await handler(signed)
                except LoopwardenError as exc:
                    status = STATUS_OF.get(type(exc), 400)
                    return self.error_page(status, exc.message, signed.session)

            return endpoint

        return wrap

    async def _signed_in(self, request: Request, probe: Probe | None) -> Ctx | Response:
        store = self.store()
        if store is None:
            return self.error_page(503, "the server is starting or stopping; retry in a moment")
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            return self.to_login(request, "signin")
        hashed = session.token_hash

        def read(reader: Reader) -> tuple[TokenRow | None, Any]:
            row = reader.token(hashed) if hashed is not None else None
            return row, probe(reader) if probe else None

        row, version = await store.read(read)
        # A token session is re-checked on every page; an OIDC one (no token) lives its limits.
        problem = operator_problem(row, store) if hashed is not None else None
        if problem is not None:  # revoked since login (or no longer an operator's): out at once
            self.sessions.end(session.session_id)
            return self.to_login(request, problem)
        return Ctx(request, session, store, "" if version is None else str(version))

    @staticmethod
    def to_login(request: Request, why: str) -> Response:
        back = next_page(request.url.path)  # an approval link comes back to its page
        target = f"/login?why={why}" + ("" if back == "/" else f"&{urlencode({'next': back})}")
        if request.headers.get("hx-request"):  # a live poll: send the whole page to the login
            return Response(status_code=200, headers={"HX-Redirect": target})
        if request.method != "GET":
            return Response("sign in first", status_code=403)
        return RedirectResponse(target, status_code=303)

    @staticmethod
    async def form(ctx: Ctx) -> dict[str, str]:
        """The posted form, once its CSRF token matches the session's (`Forbidden` otherwise)."""
        form = await ctx.request.form(max_files=0, max_fields=32)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if not same_secret(fields.get("csrf"), ctx.session.csrf):
            raise Forbidden("this form's CSRF token is missing or wrong; reload the page and retry")
        return fields


def fault(dashboard: Dashboard, exc: Exception) -> Response:
    """An unexpected fault: a short page for the operator, the detail in the server log."""
    log.error("dashboard fault", exc_info=exc)
    return dashboard.error_page(
        500, "the dashboard failed unexpectedly; the server log has the detail"
    )
