"""The model gateway end to end: the official Anthropic, OpenAI and Google GenAI SDKs as clients
of a real `loopwarden serve --http`, in front of a scripted upstream on loopback
(`model_upstream.py`) whose usage figures the receipts must charge."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types
from model_upstream import ScriptedUpstream
from support import (
    cli_env,
    cli_here,
    cli_open_loop,
    loop_entries,
    loopwarden,
    make_policy,
    open_db,
    start_server,
    stop_server,
)

from loopwarden.kernel.state.events import ReceiptKind
from loopwarden.model_gateway.prices import load_prices

LOOP = "ship"
SETTLE_WAIT = 120.0  # a hang guard: a test polls until the call's receipt is sealed
MODEL_POLICY = make_policy(
    agents=["builder"],
    budgets={"max_turns": 20, "max_cost_usd": 5.0, "max_model_calls": 100},
    model={"allow": ["claude-*", "gpt-*", "gemini-*"]},
    observe={"mode": "record"},
)


@dataclass
class Served:
    """One server and one scripted upstream for the module; each test gets its own loop."""

    home: Path
    base: str
    upstream: ScriptedUpstream


@dataclass
class Gateway:
    home: Path
    base: str
    token: str
    upstream: ScriptedUpstream
    loop: str = LOOP

    def url(self, provider: str) -> str:
        return f"{self.base}/model/{provider}"

    def receipts(self, kind: ReceiptKind | None = None, at_least: int = 0) -> list:
        """The loop's receipts (of `kind`), waiting (bounded) until there are `at_least`: a
        call is sealed right after its answer has gone to the client."""
        deadline = time.monotonic() + SETTLE_WAIT
        while True:
            with open_db(self.home) as reader:
                entries = loop_entries(reader, self.home, self.loop)
            found = [e.body for e in entries if kind is None or e.body.kind == kind]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def called(self, n: int = 1) -> list:
        """The `model.called` receipts, once there are `n`."""
        return self.receipts(ReceiptKind.MODEL_CALLED, at_least=n)

    def totals(self):
        with open_db(self.home) as reader:
            loop = reader.loop_row(self.loop)
        assert loop is not None
        return loop.totals


def set_key(home: Path, provider: str, key: str) -> None:
    done = subprocess.run(
        loopwarden("model", "key", "set", provider, "--home", str(home)),
        input=key + "\n", capture_output=True, text=True, env=cli_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def gateway_token(home: Path, agent: str = "builder", loop: str = LOOP) -> str:
    done = cli_here(
        "model", "token", "--agent", agent, "--loop", loop, "--home", str(home), "--json"
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["token"]


@contextmanager
def serving_gateway(root: Path, *args: str) -> Iterator[Served]:
    home = root / "home"
    home.mkdir(parents=True)
    with ScriptedUpstream() as upstream:
        for provider in ("anthropic", "openai", "gemini"):
            set_key(home, provider, upstream.key)
        ups = [f"--model-upstream={p}={upstream.url}" for p in ("anthropic", "openai", "gemini")]
        served = start_server(home, root / "logs", *ups, *args)
        try:
            yield Served(home, served.url.removesuffix("/mcp"), upstream)
        finally:
            stop_server(served)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving_gateway(tmp_path_factory.mktemp("gateway"), "--model-timeout", "3") as served:
        yield served


def new_loop(server: Served, policy: dict, agent: str = "builder") -> Gateway:
    """A fresh loop (its own id) and gateway token on the module's server."""
    loop = f"loop-{secrets.token_hex(4)}"
    cli_open_loop(server.home, loop, policy, ("build it",))
    upstream = server.upstream
    with upstream.lock:
        upstream.seen.clear()
    upstream.mode, upstream.pieces, upstream.delay = "ok", 3, 0.0
    upstream.release.clear()
    token = gateway_token(server.home, agent, loop)
    return Gateway(server.home, server.base, token, upstream, loop)


@pytest.fixture
def gw(server: Served) -> Gateway:
    return new_loop(server, MODEL_POLICY)


def expected_cost(model: str, gw: Gateway) -> float:
    u = gw.upstream.usage
    price = load_prices().price(model)
    assert price is not None
    return price.cost_micros(u.input, u.output, u.cache_write, u.cache_read) / 1_000_000


def test_anthropic_sdk_call_is_charged_the_upstreams_usage_and_sealed(gw: Gateway) -> None:
    client = anthropic.Anthropic(api_key=gw.token, base_url=gw.url("anthropic"), max_retries=0)
    answer = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=1000, messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.content[0].text.startswith("part0")
    assert answer.usage.input_tokens == gw.upstream.usage.input
    [called] = gw.called()
    usage = called.data.usage
    u = gw.upstream.usage
    assert (usage.model_calls, usage.input_tokens, usage.output_tokens) == (1, u.input, u.output)
    assert (usage.cache_write_tokens, usage.cache_read_tokens) == (u.cache_write, u.cache_read)
    assert usage.cost_usd == pytest.approx(expected_cost("claude-sonnet-4-5", gw))
    assert called.data.source == "provider" and called.data.outcome == "ok"
    gw.called()
    totals = gw.totals()
    assert totals.units("model_calls") == 1 and totals.units("input_tokens") == u.input
    assert totals.units("cache_read_tokens") == u.cache_read
    # the real key went upstream, the gateway token did not, the body byte for byte
    [seen] = gw.upstream.calls()
    assert seen.headers["x-api-key"] == gw.upstream.key
    assert gw.token not in json.dumps(seen.headers)
    assert called.data.request_digest.startswith("sha256:")


def test_anthropic_sdk_stream_is_passed_through_and_charged(gw: Gateway) -> None:
    client = anthropic.Anthropic(api_key=gw.token, base_url=gw.url("anthropic"), max_retries=0)
    with client.messages.stream(
        model="claude-haiku-4-5", max_tokens=500, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "part0 part1 part2 "
    assert final.usage.output_tokens == gw.upstream.usage.output
    [called] = gw.called()
    assert called.data.stream and called.data.usage.output_tokens == gw.upstream.usage.output
    assert called.data.usage.cost_usd == pytest.approx(expected_cost("claude-haiku-4-5", gw))


def test_anthropic_count_tokens_and_models_pass_through_uncharged(gw: Gateway) -> None:
    client = anthropic.Anthropic(api_key=gw.token, base_url=gw.url("anthropic"), max_retries=0)
    counted = client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens == 42
    assert [m.id for m in client.models.list()] == ["claude-sonnet-4-5"]
    assert gw.receipts(ReceiptKind.MODEL_CALLED) == []


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_responses_are_charged(gw: Gateway, stream: bool) -> None:
    client = openai.OpenAI(api_key=gw.token, base_url=gw.url("openai") + "/v1", max_retries=0)
    if stream:
        with client.responses.stream(model="gpt-5", input="hi") as events:
            final = events.get_final_response()
    else:
        final = client.responses.create(model="gpt-5", input="hi")
    assert final.output_text == "part0 part1 part2 "
    [called] = gw.called()
    u = called.data.usage
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (
        gw.upstream.usage.input, gw.upstream.usage.cache_read, gw.upstream.usage.output,
    )  # fmt: skip
    assert called.data.api == "responses" and called.data.stream == stream


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_chat_completions_are_charged_and_a_stream_asked_for_usage(
    gw: Gateway, stream: bool
) -> None:
    client = openai.OpenAI(api_key=gw.token, base_url=gw.url("openai") + "/v1", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    if stream:
        pieces = client.chat.completions.create(model="gpt-4.1", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    else:
        text = (
            client.chat.completions.create(model="gpt-4.1", messages=messages)
            .choices[0]
            .message.content
        )
    assert text == "part0 part1 part2 "
    [called] = gw.called()
    assert called.data.usage.output_tokens == gw.upstream.usage.output
    assert called.data.source == "provider"
    [seen] = gw.upstream.calls()
    if stream:  # the one change the gateway makes to a body: asking a stream for its usage
        assert json.loads(seen.body)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
def test_google_genai_sdk_calls_are_charged(gw: Gateway, stream: bool) -> None:
    client = genai.Client(
        api_key=gw.token, http_options=genai_types.HttpOptions(base_url=gw.url("gemini"))
    )
    if stream:
        text = "".join(
            c.text or ""
            for c in client.models.generate_content_stream(model="gemini-2.5-flash", contents="hi")
        )
    else:
        text = client.models.generate_content(model="gemini-2.5-flash", contents="hi").text
    assert text == "part0 part1 part2 "
    [called] = gw.called()
    u = called.data.usage
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (
        gw.upstream.usage.input, gw.upstream.usage.cache_read, gw.upstream.usage.output,
    )  # fmt: skip
    [seen] = gw.upstream.calls()
    assert seen.headers["x-goog-api-key"] == gw.upstream.key
    assert gw.token not in seen.path


def test_a_request_body_goes_upstream_byte_for_byte(gw: Gateway) -> None:
    import httpx2

    raw = b'{"model":  "claude-sonnet-4-5", "max_tokens": 10,\n "messages": [{"role":"user","content":"\\u00e9"}]}'
    answer = httpx2.post(
        gw.url("anthropic") + "/v1/messages", content=raw,
        headers={"x-api-key": gw.token, "content-type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert answer.status_code == 200
    [seen] = gw.upstream.calls()
    assert seen.body == raw


# --- refusals -------------------------------------------------------------------------------------


def anthropic_client(gw: Gateway, token: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=token or gw.token, base_url=gw.url("anthropic"), max_retries=0
    )


def ask(client: anthropic.Anthropic, model: str = "claude-sonnet-4-5", max_tokens: int = 1000):
    return client.messages.create(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": "hi"}]
    )


def test_a_budget_that_cannot_hold_the_call_refuses_it_in_the_providers_shape(
    server: Served,
) -> None:
    policy = make_policy(
        agents=["builder"], budgets={"max_turns": 20, "max_cost_usd": 0.03},
        model={"allow": ["claude-*"]},
    )  # fmt: skip
    gw = new_loop(server, policy)
    client = anthropic_client(gw)
    ask(client, max_tokens=100)  # reserves $0.0066 at most; spends $0.0092 … of $0.03
    gw.called()
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        ask(client, max_tokens=4000)  # its worst case ($0.06) does not fit what is left
    message = str(refused.value)
    assert "loopwarden" in message and f"loop {gw.loop}" in message
    assert "cost_usd budget" in message and "loopwarden loop set-policy" in message
    [refusal] = gw.receipts(ReceiptKind.MODEL_REFUSED)
    assert {r.code for r in refusal.decision.reasons} == {"budget_exhausted:cost_usd"}
    assert refusal.data.reserve.output_tokens == 4000
    assert len(gw.upstream.calls()) == 1  # the refused call never went upstream


def test_a_model_the_policy_does_not_allow_is_refused(server: Served) -> None:
    policy = make_policy(
        agents=["builder"], model={"allow": ["claude-*"], "deny": ["claude-opus-*"]}
    )
    gw = new_loop(server, policy)
    with pytest.raises(anthropic.PermissionDeniedError, match="denied by"):
        ask(anthropic_client(gw), model="claude-opus-4-1")
    openai_client = openai.OpenAI(
        api_key=gw.token, base_url=gw.url("openai") + "/v1", max_retries=0
    )
    with pytest.raises(openai.PermissionDeniedError, match="not in this loop's"):
        openai_client.responses.create(model="gpt-5", input="hi")
    assert gw.upstream.calls() == []
    refused = gw.receipts(ReceiptKind.MODEL_REFUSED)
    assert [r.decision.reasons[0].code for r in refused] == ["model_not_allowed"] * 2


def test_a_loop_without_a_model_section_admits_no_model_call(server: Served) -> None:
    gw = new_loop(server, make_policy(agents=["builder"]))
    with pytest.raises(anthropic.PermissionDeniedError, match=r"no \[model\] section"):
        ask(anthropic_client(gw))
    assert gw.upstream.calls() == []


def test_an_unpriced_model_is_refused_never_free(gw: Gateway) -> None:
    with pytest.raises(anthropic.PermissionDeniedError, match="no price"):
        ask(anthropic_client(gw), model="claude-unheard-of-9")
    assert gw.upstream.calls() == []


@pytest.mark.parametrize("which", ["none", "agent_token", "garbage", "revoked"])
def test_only_a_live_gateway_token_is_taken(server: Served, which: str) -> None:
    gw = new_loop(server, MODEL_POLICY)
    token = {"none": "", "garbage": "lwm_nope", "revoked": gw.token}.get(which, "")
    if which == "agent_token":
        done = cli_here("token", "create", "--agent", "builder", "--home", str(gw.home), "--json")
        token = json.loads(done.stdout)["token"]
    if which == "revoked":  # a token the gateway verified and remembers, revoked since
        ask(anthropic_client(gw), max_tokens=10)
        gw.called()
        with gw.upstream.lock:
            gw.upstream.seen.clear()
        listed = cli_here("token", "list", "--home", str(gw.home), "--json")
        ids = [
            t["token_id"] for t in json.loads(listed.stdout)["tokens"] if t["role"] == "observer"
        ]
        for token_id in ids:
            cli_here("token", "revoke", token_id, "--home", str(gw.home))
    import httpx2

    answer = httpx2.post(
        gw.url("anthropic") + "/v1/messages",
        json={"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": []},
        headers={"x-api-key": token}, timeout=30,
    )  # fmt: skip
    assert answer.status_code == 401
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "authentication_error"
    assert "loopwarden" in error["error"]["message"]
    assert gw.upstream.calls() == []


def test_a_gateway_token_is_refused_by_mcp_and_the_hooks(gw: Gateway) -> None:
    import httpx2

    bearer = {"authorization": f"Bearer {gw.token}"}
    for method, path in (
        ("POST", "/mcp"), ("POST", "/hooks/claude-code?loop=" + gw.loop), ("GET", "/metrics")
    ):  # fmt: skip
        answer = httpx2.request(method, gw.base + path, json={}, headers=bearer, timeout=30)
        refused = answer.status_code in (401, 403) or "not valid" in answer.text
        assert refused, (path, answer.text)


def test_the_providers_errors_come_back_as_they_are(gw: Gateway) -> None:
    gw.upstream.mode = "error"
    with pytest.raises(anthropic.InternalServerError, match="scripted failure"):
        ask(anthropic_client(gw))
    [called] = gw.called()
    assert called.data.status == 500 and called.data.outcome == "upstream_error"
    assert called.data.source == "none" and called.data.usage.cost_usd == 0
    assert called.data.usage.model_calls == 1


def read_stream(client: anthropic.Anthropic) -> None:
    """Read a streamed answer to its end (its final message, or the SDK's error)."""
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=500, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        "".join(stream.text_stream)
        stream.get_final_message()


def test_a_stream_the_upstream_drops_is_charged_what_was_observed(gw: Gateway) -> None:
    gw.upstream.mode = "drop"
    client = anthropic_client(gw)
    with pytest.raises((anthropic.APIConnectionError, anthropic.APIError)):
        read_stream(client)
    [called] = gw.called()
    assert called.data.outcome == "upstream_cut" and called.data.source == "provider"
    usage = called.data.usage
    assert usage.input_tokens == gw.upstream.usage.input  # message_start said so
    assert usage.output_tokens >= 1
    assert usage.cost_usd > 0


def test_a_stalled_upstream_ends_the_call_charged_its_reservation(gw: Gateway) -> None:
    gw.upstream.mode = "stall"
    client = anthropic.Anthropic(
        api_key=gw.token, base_url=gw.url("anthropic"), max_retries=0, timeout=30
    )
    started = time.monotonic()
    with pytest.raises((anthropic.APIConnectionError, anthropic.APIError)):
        read_stream(client)
    assert time.monotonic() - started < 25  # the gateway's --model-timeout (3 s) ended it
    gw.upstream.release.set()
    [called] = gw.called()
    assert called.data.outcome == "timeout" and called.data.source == "reserved"
    assert called.data.usage.output_tokens == 500  # its reservation: never free


def test_a_client_that_goes_away_mid_stream_is_charged_and_frees_its_reservation(
    server: Served,
) -> None:
    import httpx2

    gw = new_loop(server, MODEL_POLICY)
    gw.upstream.pieces, gw.upstream.delay = 40, 0.05
    body = {"model": "claude-sonnet-4-5", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with httpx2.stream(
        "POST", gw.url("anthropic") + "/v1/messages", json=body,
        headers={"x-api-key": gw.token}, timeout=30,
    ) as answer:  # fmt: skip
        for _ in answer.iter_raw():
            break  # the first bytes, then away
    [called] = gw.called()
    assert called.data.outcome == "client_gone"
    assert called.data.usage.input_tokens == gw.upstream.usage.input
    ask(anthropic_client(gw), max_tokens=10)  # its reservation is free again
    gw.called(2)


# --- concurrency ----------------------------------------------------------------------------------

RACERS = 16


def test_concurrent_streams_racing_the_last_units_never_overshoot_the_budget(
    server: Served,
) -> None:
    """16 streams at once against a budget that holds only a few of them: the calls admitted
    spend at most what the budget has left (every reservation bounds its call's spend: a
    prompt of at most its bytes, output at most its max_tokens), the rest are refused before
    they reach the upstream, and what was charged is what the upstream reported."""
    import asyncio

    u = server.upstream.usage
    price = load_prices().price("claude-haiku-4-5")
    assert price is not None
    one = price.cost_micros(u.input, u.output, u.cache_write, u.cache_read)
    limit = 5.5 * one / 1_000_000  # room for five calls' real spend, not for 16 reservations
    policy = make_policy(
        agents=["builder"], budgets={"max_turns": 20, "max_cost_usd": round(limit, 6)},
        model={"allow": ["claude-*"]},
    )  # fmt: skip
    gw = new_loop(server, policy)
    gw.upstream.pieces, gw.upstream.delay = 5, 0.05  # each stream stays in flight a while
    client = anthropic.AsyncAnthropic(api_key=gw.token, base_url=gw.url("anthropic"), max_retries=0)

    async def one_stream() -> str:
        try:
            async with client.messages.stream(
                model="claude-haiku-4-5", max_tokens=u.output,
                messages=[{"role": "user", "content": "x" * 1500}],
            ) as stream:  # fmt: skip
                await stream.get_final_message()
            return "ok"
        except anthropic.RateLimitError:
            return "retry"
        except anthropic.PermissionDeniedError:
            return "refused"

    async def race() -> list[str]:
        return await asyncio.wait_for(
            asyncio.gather(*(one_stream() for _ in range(RACERS))), timeout=120
        )

    outcomes = asyncio.run(race())
    admitted = outcomes.count("ok")
    assert 1 <= admitted < RACERS and set(outcomes) <= {"ok", "retry", "refused"}
    called = gw.called(admitted)
    assert len(called) == admitted == len(gw.upstream.calls())
    totals = gw.totals()
    assert totals.units("cost_usd") == admitted * one <= round(limit * 1_000_000)
    refused = gw.receipts(ReceiptKind.MODEL_REFUSED)
    assert len(refused) == RACERS - admitted


def test_a_compressed_body_is_read_for_its_model_and_forwarded_as_sent(gw: Gateway) -> None:
    import gzip

    import httpx2

    raw = gzip.compress(json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10}).encode())
    answer = httpx2.post(
        gw.url("anthropic") + "/v1/messages", content=raw, timeout=30,
        headers={"x-api-key": gw.token, "content-type": "application/json",
                 "content-encoding": "gzip"},
    )  # fmt: skip
    assert answer.status_code == 200
    [called] = gw.called()
    assert called.data.model == "claude-sonnet-4-5"
    [seen] = gw.upstream.calls()
    assert seen.body == raw and seen.headers["content-encoding"] == "gzip"
    odd = httpx2.post(
        gw.url("anthropic") + "/v1/messages", content=b"\x28\xb5", timeout=30,
        headers={"x-api-key": gw.token, "content-encoding": "zstd"},
    )  # fmt: skip
    assert odd.status_code == 415 and "zstd" in odd.json()["error"]["message"]


def test_the_metrics_show_observed_spend(gw: Gateway) -> None:
    import httpx2

    ask(anthropic_client(gw), max_tokens=100)
    gw.called()
    done = cli_here(
        "token", "create", "--agent", "ops", "--role", "operator", "--home", str(gw.home), "--json"
    )
    operator = json.loads(done.stdout)["token"]
    text = httpx2.get(
        gw.base + "/metrics", headers={"authorization": f"Bearer {operator}"}, timeout=30
    ).text
    assert 'loopwarden_model_calls_total{outcome="ok",provider="anthropic"}' in text
    assert 'loopwarden_model_tokens_total{provider="anthropic",sort="cache_read"}' in text
    assert "loopwarden_model_cost_usd_total" in text
    assert gw.token not in text and gw.upstream.key not in text
