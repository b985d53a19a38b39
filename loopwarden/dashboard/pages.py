"""The dashboard's pages. Each reads through the operations (or the store's read side) and
renders a template; each action runs the operation an operator's CLI command runs.

| path | what |
| --- | --- |
| `GET /login`, `POST /login`, `POST /logout` | sign in with an operator token; sign out |
| `GET /` | every loop: status, attention, budgets, approvals waiting, open turns (`?status=`) |
| `GET /loops/{id}` | one loop: board, live turns, budget charts, refusals, tools per turn |
| `POST /loops/{id}/control` | pause, resume or cancel (`pause_loop`, …) |
| `POST /loops/{id}/todos/{todo}/cancel` | cancel an open or blocked todo (`todo_cancel`) |
| `GET /loops/{id}/policy`, `POST` there | its policy; replace it (`set_policy`; `policy_page.py`) |
| `GET /loops/{id}/journal` | its receipts (`?kind=&principal=&effect=&page=`) |
| `GET /receipts/{id}` | one receipt: body, signature, inclusion proof (`receipt`) |
| `GET /pools` | every budget pool: status, window, a bar per limit, open turns, agents, loops |
| `POST /pools/{name}/control` | pause or resume a pool (`pool_pause`, `pool_resume`) |
| `GET /approvals`, `POST /approvals/{id}/decide` | the queue; approve or reject (`decide_approval`) |
| `GET /audit`, `POST /audit` | the full audit and its findings; the latest checkpoint |

A live page polls its own URL with `?since=VERSION` (htmx, every `POLL_SECONDS`): the version
is the journal head it was rendered at, so a poll while nothing moved costs one small read and
gets 204; otherwise it gets the page's live region, re-rendered.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from loopwarden.approvals.approval_ops import decide_approval, list_approvals
from loopwarden.auth.tokens import TOKEN_PREFIX, token_hash
from loopwarden.clock import format_time
from loopwarden.dashboard import approval, oidc, policy_page
from loopwarden.dashboard.board import Ctx, Dashboard, Probe, operator_problem
from loopwarden.dashboard.operator_sessions import (
    COOKIE,
    LOGIN_COOKIE,
    new_secret,
    next_page,
    same_secret,
)
from loopwarden.dashboard.views import (
    RECENT_LINES,
    RECENT_RECEIPTS,
    Fresh,
    PoolView,
    board,
    by_attention,
    charts,
    fresh_refusals,
    is_violation,
    journal_page,
    loop_pools,
    meters,
    pool_view,
    recent_turns,
    totals_disagree,
    unused,
)
from loopwarden.errors import Conflict, InvalidInput
from loopwarden.journal.receipt import receipt
from loopwarden.kernel.state.events import APPROVAL_ID_PATTERN, ID_PATTERN, RECEIPT_ID_PATTERN
from loopwarden.kernel.store.reader import Reader
from loopwarden.loops.lifecycle import CONTROLS
from loopwarden.policy.model import POOL_NAME_RE
from loopwarden.pools.pool_ops import POOL_CONTROLS
from loopwarden.pools.pool_ops import pools as list_pools
from loopwarden.principals import Principal
from loopwarden.projection.loop_list import list_loops
from loopwarden.projection.projection import ProjectionResult, projection
from loopwarden.statuses import ApprovalStatus, LoopStatus
from loopwarden.todos.todo_ops import todo_cancel
from loopwarden.witnesses.standing import witness_view

EXPIRIES = {"15m": 900, "1h": 3600, "4h": 4 * 3600, "1d": 86400, "7d": 7 * 86400}
LOGIN_MESSAGES = {
    "signin": "Sign in with an operator token.",
    "logout": "Signed out.",
    "unknown": "That token is not known here: it is mistyped, or was minted for another home.",
    "revoked": "That token has been revoked. Ask for a new operator token.",
    "expired": "That token has expired. Ask for a new operator token.",
    "forged": "That token's record fails its integrity check; it signs no one in. Ask an "
    "operator to run loopwarden verify.",
    "role": "The dashboard is for operators only, and this token is not an operator's.",
}
MAX_TOKEN = 200


def _match(pattern: str, value: str, what: str) -> str:
    if not re.fullmatch(pattern.strip("^$"), value):
        raise InvalidInput(f"{what} {value[:80]!r} is not a valid id")
    return value


def _global_head(request: Request) -> Probe:
    return lambda reader: reader.log_state()[0]


def _loop_head(request: Request) -> Probe:
    loop_id = request.path_params["loop_id"]

    def head(reader: Reader) -> int:
        row = reader.loop_row(loop_id)
        return row.head_seq if row is not None else 0

    return head


class Pages:
    def __init__(self, d: Dashboard) -> None:
        self.d = d

    # --- signing in and out -------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self.d.sessions.get(request.cookies.get(COOKIE)) is not None:
            return RedirectResponse("/", status_code=303)
        why = request.query_params.get("why", "signin")
        return self._login(request, LOGIN_MESSAGES.get(why, LOGIN_MESSAGES["signin"]), 200)

    def _login(self, request: Request, message: str, status: int, error: bool = False) -> Response:
        nonce = request.cookies.get(LOGIN_COOKIE) or new_secret()
        back = next_page(request.query_params.get("next", ""))
        response = self.d.render(
            "login.html", status, message=message, error=error, csrf=nonce, who=None,
            next=back, oidc=self.d.oidc is not None,
        )  # fmt: skip
        response.set_cookie(
            LOGIN_COOKIE, nonce, httponly=True, samesite="strict", path="/login",
            secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def login(self, request: Request) -> Response:
        form = await request.form(max_files=0, max_fields=8)
        given = str(form.get("csrf", ""))
        if not same_secret(given, request.cookies.get(LOGIN_COOKIE)):
            return self._login(request, "The sign-in form expired; try again.", 403, error=True)
        token = str(form.get("token", "")).strip()
        store = self.d.store()
        if store is None:
            return self.d.error_page(503, "the server is starting or stopping; retry in a moment")
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN:
            return self._login(
                request, "That is not a loopwarden token (they start lw_).", 401, True
            )
        hashed = token_hash(token)
        row = await store.read(lambda reader: reader.token(hashed))
        problem = operator_problem(row, store)
        if problem == "role" and row is not None:
            message = (
                f"This is an {row.role} token (for {row.agent!r}): the dashboard is for operators. "
                "Sign in with an operator token: loopwarden token create --agent NAME --role operator"
            )
            return self._login(request, message, 403, error=True)
        if problem is not None or row is None:
            return self._login(request, LOGIN_MESSAGES[problem or "unknown"], 401, error=True)
        session = self.d.sessions.create(hashed, Principal(id=row.agent, role="operator"))
        session.say("ok", f"Signed in as {row.agent}.")
        response = RedirectResponse(next_page(str(form.get("next", ""))), status_code=303)
        response.set_cookie(
            COOKIE, session.session_id, httponly=True, samesite="strict", path="/",
            secure=request.url.scheme == "https",
        )  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    async def logout(self, ctx: Ctx) -> Response:
        await self.d.form(ctx)
        self.d.sessions.end(ctx.session.session_id)
        response = RedirectResponse("/login?why=logout", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # --- loops --------------------------------------------------------------------------------

    async def loops(self, ctx: Ctx) -> Response:
        status = ctx.request.query_params.get("status", "")
        if status and status not in set(LoopStatus):
            raise InvalidInput(f"unknown status {status[:40]!r}")
        listed = (await list_loops(ctx.store, ctx.who, {"status": status or None})).loops
        now = self.d.clock()

        def refusals(reader: Reader) -> dict[str, Fresh]:
            found = {
                lp.loop_id: fresh_refusals(reader.recent_receipts(lp.loop_id, RECENT_RECEIPTS), now)
                for lp in listed
            }
            return {loop_id: seen for loop_id, seen in found.items() if seen is not None}

        fresh = await ctx.store.read(refusals)
        rows = [(lp, meters(lp.budgets, limited_only=True)) for lp in by_attention(listed, fresh)]
        return self.d.render_page(
            ctx,
            "loops.html",
            rows=rows,
            fresh=fresh,
            status=status,
            statuses=[str(s) for s in LoopStatus],
        )

    async def loop(self, ctx: Ctx) -> Response:
        loop_id = _match(ID_PATTERN, ctx.request.path_params["loop_id"], "loop id")
        state = await projection(ctx.store, ctx.who, {"loop_id": loop_id})
        history = await self.d.histories.get(ctx.store, ctx.who, loop_id, state.head.seq)
        recent = list(reversed(history.lines[-RECENT_LINES:]))
        refusals = [line for line in reversed(history.lines) if line.refused]
        drawn = charts(history, state.budgets, self.d.clock())
        return self.d.render_page(
            ctx,
            "loop.html",
            p=state,
            meters=meters(state.budgets),
            board=board(state.todos),
            charts=drawn,
            unused=unused(state.budgets, drawn),
            control=history.control,
            disagree=totals_disagree(history, state.budgets),
            recent=recent,
            refusals=refusals[:RECENT_LINES],
            refusal_count=len(refusals),
            is_violation=is_violation,
            turns=recent_turns(history),
            pending=[a for a in state.approvals if a.status == ApprovalStatus.PENDING],
            decided=[a for a in state.approvals if a.status == ApprovalStatus.APPROVED],
            expiries=list(EXPIRIES),
            pools=await self._drawn_pools(ctx, state),
        )

    @staticmethod
    async def _drawn_pools(ctx: Ctx, state: ProjectionResult) -> list[PoolView]:
        """The budget pools the loop draws from (by its policy, or through an agent it admits)."""
        listed = (await list_pools(ctx.store, ctx.who, {})).pools
        if not listed:
            return []
        policy = await ctx.store.read(lambda reader: reader.policy(state.policy_digest))
        return loop_pools(listed, policy)

    async def control(self, ctx: Ctx) -> Response:
        loop_id = _match(ID_PATTERN, ctx.request.path_params["loop_id"], "loop id")
        form = await self.d.form(ctx)
        action = form.get("action", "")
        if action not in CONTROLS:
            raise InvalidInput(f"unknown action {action[:40]!r}: pause, resume or cancel")
        if action == "cancel" and form.get("confirm") != "yes":
            ctx.session.say("error", "Tick the box to confirm: a cancelled loop cannot reopen.")
            return RedirectResponse(f"/loops/{loop_id}", status_code=303)
        request = {"loop_id": loop_id, "reason": form.get("reason", "")}
        result = await CONTROLS[action](ctx.store, ctx.who, request)
        ctx.session.say("ok", f"Loop {loop_id} is {result.status} (receipt {result.receipt_id}).")
        return RedirectResponse(f"/loops/{loop_id}", status_code=303)

    async def cancel_todo(self, ctx: Ctx) -> Response:
        loop_id = _match(ID_PATTERN, ctx.request.path_params["loop_id"], "loop id")
        todo_id = _match(ID_PATTERN, ctx.request.path_params["todo_id"], "todo id")
        form = await self.d.form(ctx)
        if form.get("confirm") != "yes":
            ctx.session.say("error", "Tick the box to confirm: a cancelled todo cannot reopen.")
            return RedirectResponse(f"/loops/{loop_id}", status_code=303)
        request = {"loop_id": loop_id, "todo_id": todo_id, "reason": form.get("reason", "")}
        result = await todo_cancel(ctx.store, ctx.who, request)
        ctx.session.say(
            "ok",
            f"Todo {todo_id} is cancelled (receipt {result.receipt_id}); the loop is "
            f"{result.status}.",
        )
        return RedirectResponse(f"/loops/{loop_id}", status_code=303)

    async def journal(self, ctx: Ctx) -> Response:
        loop_id = _match(ID_PATTERN, ctx.request.path_params["loop_id"], "loop id")
        state = await projection(ctx.store, ctx.who, {"loop_id": loop_id})
        history = await self.d.histories.get(ctx.store, ctx.who, loop_id, state.head.seq)
        q = ctx.request.query_params
        try:
            page_number = int(q.get("page", "1"))
        except ValueError:
            raise InvalidInput("page must be a number") from None
        filters = {k: q.get(k, "")[:128] for k in ("kind", "principal", "effect")}
        page = journal_page(history, page=page_number, **filters)
        return self.d.render_page(
            ctx, "journal.html", p=state, page=page, filters=filters, is_violation=is_violation
        )

    async def receipt(self, ctx: Ctx) -> Response:
        receipt_id = _match(RECEIPT_ID_PATTERN, ctx.request.path_params["receipt_id"], "receipt id")
        result = await receipt(ctx.store, ctx.who, {"receipt_id": receipt_id})
        checkpoint = result.checkpoint
        root_hex = base64.b64decode(checkpoint.root).hex() if checkpoint is not None else ""
        return self.d.render_page(ctx, "receipt.html", r=result, root_hex=root_hex)

    # --- budget pools -------------------------------------------------------------------------

    def _pools_probe(self, request: Request) -> Probe:
        """The journal's size and the current UTC hour: a pool's use moves with the journal,
        and a window (hourly or daily, from the hour) resets on an hour's turn."""

        def version(reader: Reader) -> str:
            return f"{reader.log_state()[0]}:{self.d.clock():%Y%m%d%H}"

        return version

    async def pools(self, ctx: Ctx) -> Response:
        listed = (await list_pools(ctx.store, ctx.who, {})).pools
        return self.d.render_page(ctx, "pools.html", pools=[pool_view(pool) for pool in listed])

    async def pool_control(self, ctx: Ctx) -> Response:
        name = _match(POOL_NAME_RE.pattern, ctx.request.path_params["name"], "pool name")
        form = await self.d.form(ctx)
        action = form.get("action", "")
        if action not in POOL_CONTROLS:
            raise InvalidInput(f"unknown action {action[:40]!r}: pause or resume")
        request = {"name": name, "reason": form.get("reason", "")}
        try:
            result = await POOL_CONTROLS[action](ctx.store, ctx.who, request)
        except Conflict as exc:  # paused or resumed meanwhile: say so, change nothing
            ctx.session.say("error", f"Pool {name} was not changed: {exc.message}.")
            return RedirectResponse("/pools", status_code=303)
        ctx.session.say("ok", f"Pool {name} is {result.status} (receipt {result.receipt_id}).")
        return RedirectResponse("/pools", status_code=303)

    # --- approvals ----------------------------------------------------------------------------

    async def approvals(self, ctx: Ctx) -> Response:
        rows = (await list_approvals(ctx.store, ctx.who, {})).approvals
        pending = [a for a in rows if a.status == ApprovalStatus.PENDING]
        decided = [a for a in reversed(rows) if a.status != ApprovalStatus.PENDING][:20]
        return self.d.render_page(
            ctx, "approvals.html", pending=pending, decided=decided, expiries=list(EXPIRIES)
        )

    async def decide(self, ctx: Ctx) -> Response:
        approval_id = _match(
            APPROVAL_ID_PATTERN, ctx.request.path_params["approval_id"], "approval id"
        )
        form = await self.d.form(ctx)
        back = form.get("back", "")
        if not re.fullmatch(
            r"/approvals(/appr-[0-9a-f]{20})?|/loops/[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", back
        ):
            back = "/approvals"
        request = self._decision(form, approval_id)
        if request is None:
            ctx.session.say("error", f"Rejecting {approval_id} needs a reason.")
            return RedirectResponse(back, status_code=303)
        result = await decide_approval(ctx.store, ctx.who, request)
        until = f" until {format_time(result.expires_at)}" if result.expires_at else ""
        ctx.session.say(
            "ok", f"{approval_id} {result.status}{until} (receipt {result.receipt_id})."
        )
        return RedirectResponse(back, status_code=303)

    @staticmethod
    def _decision(form: dict[str, str], approval_id: str) -> dict[str, Any] | None:
        """The `decide_approval` request a form asks for; None for a rejection without reason."""
        decision, reason = form.get("decision"), form.get("reason", "").strip()
        if decision == "approve":
            expires = form.get("expires", "1h")
            if expires not in EXPIRIES:
                raise InvalidInput(f"expiry must be one of {', '.join(EXPIRIES)}")
            seconds = EXPIRIES[expires]
            return {"approval_id": approval_id, "approve": True, "expires_in_seconds": seconds, "reason": reason}  # fmt: skip
        if decision != "reject":
            raise InvalidInput("decision must be approve or reject")
        if not reason:
            return None
        return {"approval_id": approval_id, "approve": False, "reason": reason}

    # --- audit --------------------------------------------------------------------------------

    def _audit_probe(self, request: Request) -> Probe:
        def version(reader: Reader) -> str:
            run = self.d.auditor.current
            state = "" if run is None else f"{run.started_at}:{run.done}:{run.finished_at}"
            witnesses = [(r.cosigned, r.error, r.conflict) for r in reader.witness_rows()]
            return f"{reader.log_state()[0]}:{state}:{witnesses}"

        return version

    async def audit(self, ctx: Ctx) -> Response:
        checkpoint, size, witnessed = await ctx.store.read(
            lambda reader: (
                reader.latest_checkpoint(),
                reader.log_state()[0],
                witness_view(reader),
            )
        )
        return self.d.render_page(
            ctx,
            "audit.html",
            checkpoint=checkpoint,
            tree_size=size,
            run=self.d.auditor.current,
            witnessed=witnessed,
        )

    async def start_audit(self, ctx: Ctx) -> Response:
        await self.d.form(ctx)
        self.d.auditor.start(ctx.who.id)
        return RedirectResponse("/audit", status_code=303)


def routes(d: Dashboard) -> list[Route]:
    p = Pages(d)
    return [
        Route("/login", p.login_form, methods=["GET"]),
        Route("/login", p.login, methods=["POST"]),
        Route("/logout", d.page()(p.logout), methods=["POST"]),
        Route("/", d.page(_global_head)(p.loops), methods=["GET"]),
        Route("/loops/{loop_id}", d.page(_loop_head)(p.loop), methods=["GET"]),
        Route("/loops/{loop_id}/control", d.page()(p.control), methods=["POST"]),
        Route("/loops/{loop_id}/todos/{todo_id}/cancel", d.page()(p.cancel_todo), methods=["POST"]),
        Route("/loops/{loop_id}/journal", d.page(_loop_head)(p.journal), methods=["GET"]),
        Route("/receipts/{receipt_id}", d.page()(p.receipt), methods=["GET"]),
        Route("/pools", d.page(p._pools_probe)(p.pools), methods=["GET"]),
        Route("/pools/{name}/control", d.page()(p.pool_control), methods=["POST"]),
        Route("/approvals", d.page(_global_head)(p.approvals), methods=["GET"]),
        Route("/approvals/{approval_id}/decide", d.page()(p.decide), methods=["POST"]),
        *approval.routes(d),  # one approval's page, where approval links lead
        *policy_page.routes(d),  # a loop's policy, and replacing it
        *oidc.routes(d),  # signing in with the identity provider, when one is configured
        Route("/audit", d.page(p._audit_probe)(p.audit), methods=["GET"]),
        Route("/audit", d.page()(p.start_audit), methods=["POST"]),
    ]
