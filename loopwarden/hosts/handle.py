"""One hook event, from the host's bytes to the host's answer: read, decided by the `hook`
operation for the observer of one agent, answered. Fails closed: anything that goes wrong
before a tool runs blocks it, with the reason."""

from __future__ import annotations

import json

from pydantic import ValidationError

from loopwarden import hosts
from loopwarden.errors import IntegrityError, LoopwardenError, StoreError, describe_validation
from loopwarden.hosts.hook import HookAnswer, HookEvent, hook
from loopwarden.hosts.host import MAX_EVENT, Event, MalformedEvent, Reply
from loopwarden.kernel.runner.runner import run_now
from loopwarden.kernel.store.store import Store
from loopwarden.observe.observer import Attribute
from loopwarden.principals import Principal

LOGGER = "loopwarden.hooks"
SPAN_OF_PHASE = {"session": "session_start", "pre": "pre_tool", "post": "post_tool", "stop": "stop"}


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
    return hosts.get(host).read(data)


def failure(host: str, raw: bytes, message: str) -> Reply:
    """`host`'s answer when no decision could be made for the event `raw`: a block if it is
    about to run a tool (or cannot be read), a report otherwise."""
    try:
        phase = hosts.get(host).phase_of(json.loads(raw))
    except (ValueError, UnicodeDecodeError):
        phase = None
    return hosts.get(host).failure(phase, message)


def _log_error(message: str, *args: object, exc: BaseException | None = None) -> None:
    import logging  # only on a failure: a hook process that decides never loads it

    logging.getLogger(LOGGER).error(message, *args, exc_info=exc)


def _failed(host: str, event: Event | None, exc: BaseException, loop_id: str, agent: str) -> Reply:
    protocol, phase = hosts.get(host), (event.phase if event else None)
    if isinstance(exc, ValidationError):
        return protocol.failure(phase, describe_validation(exc))
    if isinstance(exc, LoopwardenError):
        if isinstance(exc, IntegrityError) or type(exc) is StoreError:  # not a retryable one
            _log_error("hook for %s in loop %s failed: %s", agent, loop_id, exc)
        return protocol.failure(phase, exc.message)
    # Fail closed, and never a traceback to the model.
    _log_error("hook for %s in loop %s failed unexpectedly", agent, loop_id, exc=exc)
    return protocol.failure(phase, "loopwarden could not decide this event; it is blocked")


class _Call:
    """One event's parts: the host's event read, and the `hook` request built from it."""

    def __init__(self, host: str, event: Event, loop_id: str, agent: str, servers: list[str]):
        self.host, self.loop_id, self.agent = host, loop_id, agent
        self.event = event
        self.request = HookEvent(loop_id=loop_id, host=host, servers=servers, **self.event.__dict__)
        self.observer = Principal(id=agent, role="observer")

    @property
    def span_name(self) -> str:
        """The event's span: `hook.pre_tool`, `hook.post_tool`, `hook.session_start`, `hook.stop`."""
        return f"hook.{SPAN_OF_PHASE[self.event.phase]}"

    @property
    def span_attributes(self) -> dict[str, Attribute]:
        """Who and where, never what: the event's tool input and text stay out of spans."""
        return {
            "loopwarden.host": self.host,
            "loopwarden.loop_id": self.loop_id,
            "loopwarden.agent": self.agent,
        }

    async def answer(self, store: Store) -> Reply:
        """The `hook` operation's decision in the host's form, or its failure answer."""
        try:
            with store.observer.span(self.span_name, self.span_attributes):
                return self.reply(await hook(store, self.observer, self.request))
        except Exception as exc:
            return self.failed(exc)

    def answer_now(self, store: Store) -> Reply:
        """`answer` on the calling thread (`run_now`)."""
        try:
            return self.reply(run_now(hook, store, self.observer, self.request))
        except Exception as exc:
            return self.failed(exc)

    def reply(self, answer: HookAnswer) -> Reply:
        return hosts.get(self.host).reply(self.event.phase, answer.block, answer.message)

    def failed(self, exc: BaseException) -> Reply:
        return _failed(self.host, self.event, exc, self.loop_id, self.agent)


def _prepare(host: str, raw: bytes, loop_id: str, agent: str, servers: list[str]) -> _Call | Reply:
    """The event read into a call, or the host's failure answer if it cannot be."""
    event: Event | None = None
    try:
        event = read_event(host, raw)
        return _Call(host, event, loop_id, agent, servers)
    except Exception as exc:
        return _failed(host, event, exc, loop_id, agent)


async def handle(
    store: Store, host: str, raw: bytes, *, loop_id: str, agent: str, servers: list[str]
) -> Reply:
    """Answer one event of `host` for `agent`'s observer in `loop_id`, as that host expects."""
    call = _prepare(host, raw, loop_id, agent, servers)
    return await call.answer(store) if isinstance(call, _Call) else call


def handle_now(
    store: Store, host: str, raw: bytes, *, loop_id: str, agent: str, servers: list[str]
) -> Reply:
    """`handle` on the calling thread, for the one event a hook process answers."""
    call = _prepare(host, raw, loop_id, agent, servers)
    return call.answer_now(store) if isinstance(call, _Call) else call
