"""Operator sessions: held in memory by the dashboard process, named by a random cookie.

A session is a random 256-bit id → (the operator token's hash, the principal it was issued to,
a CSRF token, expiry). The token itself is never kept: on every request the dashboard looks
its hash up in the store again (`Dashboard.operator`), so a revoked token, or one whose role is
no longer operator, stops working at once. Sessions end at logout, after `IDLE` without a
request, or `LIFETIME` after login, and with the process (a restart means logging in again).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from loopwarden.clock import Clock
from loopwarden.principals import Principal

COOKIE = "lw_session"
LOGIN_COOKIE = "lw_login"  # the login form's own CSRF token (double submit), before any session
IDLE = timedelta(hours=1)
LIFETIME = timedelta(hours=12)
MAX_SESSIONS = 1_000  # the oldest session is dropped beyond this
MAX_FLASH = 5  # messages waiting for the next page (older ones are dropped)


def next_page(value: str) -> str:
    """Where to go after signing in: an approval's page (where an approval link leads), else
    `/` (nothing else is taken from a URL)."""
    return value if re.fullmatch(r"/approvals/appr-[0-9a-f]{20}", value) else "/"


def new_secret() -> str:
    """256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; an empty or missing value never matches."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass
class Session:
    session_id: str
    token_hash: str | None  # None: signed in with the identity provider (`oidc.py`)
    principal: Principal
    csrf: str
    created: datetime
    seen: datetime
    flash: list[tuple[str, str]] = field(default_factory=list)  # (level, message), shown once

    def say(self, level: str, message: str) -> None:
        self.flash = [*self.flash[-(MAX_FLASH - 1) :], (level, message)]

    def take_flash(self) -> list[tuple[str, str]]:
        messages, self.flash = self.flash, []
        return messages


class Sessions:
    """The process's sessions. Not shared between processes: each dashboard has its own."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self, token_hash: str | None, principal: Principal) -> Session:
        now = self._clock()
        self._expire(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        session = Session(new_secret(), token_hash, principal, new_secret(), now, now)
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session named by the cookie, its idle timer restarted; None if unknown or
        expired (an expired one is dropped)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.seen > IDLE or now - session.created > LIFETIME:
            self.end(session_id)
            return None
        session.seen = now
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self, now: datetime) -> None:
        for sid in [
            sid
            for sid, s in self._sessions.items()
            if now - s.seen > IDLE or now - s.created > LIFETIME
        ]:
            del self._sessions[sid]
