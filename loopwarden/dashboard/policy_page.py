"""A loop's policy, `GET /loops/{id}/policy`, and its replacement, `POST` there: what `loopwarden
loop set-policy` does, from the dashboard.

The page shows the policy as the store keeps it (normalized JSON, every default written out)
and a form prefilled with it. A replacement is parsed as the CLI parses a policy file (JSON,
TOML or YAML), needs the confirm box, and is sealed by the operator signed in as
`loop.policy_changed` with both digests. A policy that does not parse comes back to the form
with the error and the text as sent; nothing is sealed.
"""

from __future__ import annotations

import json
import re

from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from loopwarden.dashboard.board import Ctx, Dashboard
from loopwarden.errors import InvalidInput, LoopwardenError
from loopwarden.kernel.state.events import ID_PATTERN
from loopwarden.loops.lifecycle import set_policy
from loopwarden.policy.digest import policy_document
from loopwarden.policy.lint import policy_notes
from loopwarden.policy.loader import parse_policy
from loopwarden.projection.projection import ProjectionResult, projection

FORMATS = ("json", "toml", "yaml")
MAX_POLICY_TEXT = 64 * 1024  # characters a posted policy may have


def _loop_id(ctx: Ctx) -> str:
    value = str(ctx.request.path_params["loop_id"])
    if not re.fullmatch(ID_PATTERN, value):
        raise InvalidInput(f"loop id {value[:80]!r} is not a valid id")
    return value


async def _current(ctx: Ctx, loop_id: str) -> tuple[ProjectionResult, str]:
    state = await projection(ctx.store, ctx.who, {"loop_id": loop_id})
    policy = await ctx.store.read(lambda reader: reader.policy(state.policy_digest))
    return state, json.dumps(policy_document(policy), indent=2, sort_keys=True)


def _form_page(
    d: Dashboard,
    ctx: Ctx,
    state: ProjectionResult,
    current: str,
    *,
    text: str | None = None,
    fmt: str = "json",
    error: str | None = None,
) -> Response:
    response = d.render_page(
        ctx,
        "policy.html",
        p=state,
        current=current,
        text=current if text is None else text,
        fmt=fmt,
        formats=FORMATS,
        error=error,
        limit=MAX_POLICY_TEXT,
    )
    if error is not None:
        response.status_code = 400
    return response


async def policy_page(d: Dashboard, ctx: Ctx) -> Response:
    loop_id = _loop_id(ctx)
    state, current = await _current(ctx, loop_id)
    return _form_page(d, ctx, state, current)


async def replace_policy(d: Dashboard, ctx: Ctx) -> Response:
    loop_id = _loop_id(ctx)
    form = await d.form(ctx)
    text, fmt = form.get("policy", ""), form.get("format", "json")
    state, current = await _current(ctx, loop_id)
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown policy format {fmt[:20]!r}: json, toml or yaml")
    if form.get("confirm") != "yes":
        return _form_page(
            d, ctx, state, current, text=text, fmt=fmt,
            error="Tick the box to confirm: every later call is decided by the new policy.",
        )  # fmt: skip
    try:
        if len(text) > MAX_POLICY_TEXT:
            raise InvalidInput(f"the policy is over {MAX_POLICY_TEXT:,} characters")
        parsed = parse_policy(text, fmt, source="the policy")
        request = {"loop_id": loop_id, "policy": policy_document(parsed)}
        result = await set_policy(ctx.store, ctx.who, {**request, "reason": form.get("reason", "")})
    except LoopwardenError as exc:
        return _form_page(d, ctx, state, current, text=text, fmt=fmt, error=exc.message)
    if not result.changed:
        ctx.session.say("ok", f"Loop {loop_id} already has this policy: nothing was sealed.")
    else:
        notes = policy_notes(parsed)
        ctx.session.say(
            "ok",
            f"Loop {loop_id} now has policy {result.policy_digest[:19]}… (receipt "
            f"{result.receipt_id})." + (f" Note: {'; '.join(notes)}." if notes else ""),
        )
    return RedirectResponse(f"/loops/{loop_id}", status_code=303)


def routes(d: Dashboard) -> list[Route]:
    async def page(ctx: Ctx) -> Response:
        return await policy_page(d, ctx)

    async def replace(ctx: Ctx) -> Response:
        return await replace_policy(d, ctx)

    return [
        Route("/loops/{loop_id}/policy", d.page()(page), methods=["GET"]),
        Route("/loops/{loop_id}/policy", d.page()(replace), methods=["POST"]),
    ]
