"""`/model/<provider>/…`: the model gateway (`model_gateway/gateway.py`) mounted beside `/mcp`.

Like the hook route, the gateway takes the short way through the server: `ModelFront` answers
every `/model/` request ahead of the MCP app's middleware (its sessions, OAuth gate, error pages
and router, none of which a model call uses), because a host sends every model call here and
its latency is the gateway's cost. The gateway checks its own credential (a gateway token,
never a `/mcp` one) and answers every error in the provider's shape. The connection limits and
timeouts of `connections.py` still apply (they sit in the HTTP protocol, under every app).
"""

from __future__ import annotations

from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from loopwarden.model_gateway.gateway import PREFIX, ModelGateway


class ModelRoute(Mount):
    """`/model` in the app's router, carrying the gateway that `ModelFront` puts ahead."""

    def __init__(self, gateway: ModelGateway) -> None:
        self.gateway = gateway

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await gateway.serve(scope, receive, send)

        super().__init__(PREFIX.rstrip("/"), app=app)


class ModelFront:
    """ASGI: every HTTP request under `/model/` straight to the gateway; the rest to `app`."""

    def __init__(self, app: ASGIApp, gateway: ModelGateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            await self.gateway.serve(scope, receive, send)
            return
        await self.app(scope, receive, send)


def model_route(gateway: ModelGateway) -> ModelRoute:
    return ModelRoute(gateway)
