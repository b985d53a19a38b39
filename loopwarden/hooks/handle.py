"""One hook event, from the host's bytes to the host's answer: read, decided by the `hook`
operation for the observer of one agent, answered. Fails closed: anything that goes wrong
before a tool runs blocks it, with the reason."""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from loopwarden.errors import LoopwardenError, describe_validation
from loopwarden.hooks.protocols import MAX_EVENT, PROTOCOLS, Event, MalformedEvent, Reply
from loopwarden.ledger.store import Store
from loopwarden.operations.hooks import HookEvent, hook
from loopwarden.principals import Principal

log = logging.getLogger("loopwarden.hooks")


def read_event(host: str, raw: bytes) -> Event:
    """The host's event bytes as an `Event`; `MalformedEvent` if they are not one."""
    if len(raw) > MAX_EVENT:
        raise MalformedEvent(f"the event is larger than {MAX_EVENT} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise MalformedEvent("the event is not JSON") from None
    if not isinstance(data, dict):
        raise MalformedEvent("the event is not a JSON object")
    return PROTOCOLS[host].read(data)


async def handle(
    store: Store, host: str, raw: bytes, *, loop_id: str, agent: str, servers: list[str]
) -> Reply:
    """Answer one event of `host` for `agent`'s observer in `loop_id`, as that host expects."""
    protocol = PROTOCOLS[host]
    event: Event | None = None
    try:
        event = read_event(host, raw)
        request = HookEvent(loop_id=loop_id, host=host, servers=servers, **event.__dict__)
        answer = await hook(store, Principal(id=agent, role="observer"), request)
        return protocol.reply(event, answer)
    except ValidationError as exc:
        return protocol.failure(event.phase if event else None, describe_validation(exc))
    except LoopwardenError as exc:
        if exc.code in ("integrity_error", "store_error"):
            log.error("hook for %s in loop %s failed: %s", agent, loop_id, exc)
        return protocol.failure(event.phase if event else None, exc.message)
    except Exception:  # fail closed, and never a traceback to the model
        log.exception("hook for %s in loop %s failed unexpectedly", agent, loop_id)
        phase = event.phase if event else None
        return protocol.failure(phase, "loopwarden could not decide this event; it is blocked")
