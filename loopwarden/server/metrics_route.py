"""`GET /metrics`: the server's Prometheus metrics (`observe/telemetry.py`), for operators.

Never open by accident: the request must carry an operator's bearer token, checked like every
token on `/mcp`: a static operator token (a revoked one stops at once) or, on a server that is
an OAuth resource server, a JWT from its issuer for this resource whose scopes name the
operator role alone (a Prometheus `oauth2` client-credentials scrape); under `--no-auth`
(loopback only) the launch principal must be an operator. Anything else is a 401 that says
why, and counts nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopwarden.auth.tokens import TOKEN_PREFIX
from loopwarden.server.runtime import Runtime

OPERATOR_SCOPE = "role:operator"


async def _refusal(request: Request, runtime: Runtime) -> str | None:
    """Why the request may not read the metrics, or None if it may."""
    if not runtime.settings.auth:
        principal = runtime.settings.principal
        if principal is not None and principal.role == "operator":
            return None
        return "metrics under --no-auth need --role operator"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "the metrics request carries no bearer token"
    token = token.strip()
    if token.startswith(TOKEN_PREFIX) or runtime.jwts is None:
        access = await runtime.tokens.verify_token(token)
    else:
        access = await runtime.jwts.verify_token(token)
    if access is None:
        return "the token is not valid (unknown, revoked or expired)"
    if OPERATOR_SCOPE not in access.scopes:
        return "metrics are read with an operator token"
    return None


def metrics_route(runtime: Runtime) -> Route:
    """The route; a 404 if the server keeps no metrics."""

    async def endpoint(request: Request) -> Response:
        refusal = await _refusal(request, runtime)
        if refusal is not None:
            return Response(
                refusal + "\n",
                status_code=401,
                media_type="text/plain",
                headers={"WWW-Authenticate": 'Bearer realm="loopwarden"'},
            )
        exposition = runtime.observer.metrics()
        if exposition is None:
            return Response("this server keeps no metrics\n", status_code=404)
        body, content_type = exposition
        return Response(body, media_type=content_type)

    return Route("/metrics", endpoint, methods=["GET"])
