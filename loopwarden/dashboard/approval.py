"""The page of one approval, `GET /approvals/{id}`: where an approval link leads (the URL-mode
elicitation an agent's client shows, `server/elicitation.py`, or a webhook's message).

It is behind the operator sign-in like every page (signing in from a link comes back here), and
its form is the queue's: the decision is sealed by the operator signed in, never by the agent
whose request made the link, whose token cannot sign in. The link carries no credential.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loopwarden.approvals.approval_ops import list_approvals
from loopwarden.dashboard.board import Ctx, Dashboard, Probe
from loopwarden.errors import InvalidInput, NotFound
from loopwarden.kernel.state.events import APPROVAL_ID_PATTERN
from loopwarden.kernel.store.reader import Reader

EXPIRIES = ("15m", "1h", "4h", "1d", "7d")  # the queue's choices (pages.EXPIRIES)


def _head(request: Request) -> Probe:
    return lambda reader: reader.log_state()[0]


def approval_id_of(request: Request) -> str:
    value = request.path_params["approval_id"]
    if not re.fullmatch(APPROVAL_ID_PATTERN, value):
        raise InvalidInput(f"approval id {value[:80]!r} is not a valid id")
    return str(value)


async def approval_page(d: Dashboard, ctx: Ctx) -> Response:
    approval_id = approval_id_of(ctx.request)

    def loop_of(reader: Reader) -> str | None:
        row = reader.approval(approval_id)
        return None if row is None else row.loop_id

    loop_id = await ctx.store.read(loop_of)
    listed = (
        []
        if loop_id is None
        else (await list_approvals(ctx.store, ctx.who, {"loop_id": loop_id})).approvals
    )
    found = [a for a in listed if a.approval_id == approval_id]
    if not found:
        raise NotFound(f"no approval with id {approval_id!r}")
    return d.render_page(ctx, "approval.html", a=found[0], expiries=list(EXPIRIES))


def routes(d: Dashboard) -> list[Route]:
    async def page(ctx: Ctx) -> Response:
        return await approval_page(d, ctx)

    return [Route("/approvals/{approval_id}", d.page(_head)(page), methods=["GET"])]
