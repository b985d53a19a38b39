"""The model gateway's pure parts: prices, reservations, the usage readers, the routes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopwarden.errors import InvalidInput
from loopwarden.model_gateway.calls import reservation
from loopwarden.model_gateway.gateway_config import parse_upstream
from loopwarden.model_gateway.prices import PriceFile, PriceTable, load_prices, shipped
from loopwarden.model_gateway.provider_registry import registry
from loopwarden.model_gateway.providers import PROMPT_SLACK, Route

PROVIDERS = registry()


def sse(*events: dict) -> bytes:
    return b"".join(b"event: x\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events)


def read(provider: str, route: Route, stream: bool, body: bytes, chunk: int = 7):
    reader = PROVIDERS[provider].reader(route, stream)
    for i in range(0, len(body), chunk):  # split anywhere, as a network does
        reader.feed(body[i : i + chunk])
    return reader.finish()


def test_the_shipped_table_is_dated_sourced_and_prices_the_major_models():
    table = load_prices()
    assert table.as_of and table.source
    for model in ("claude-sonnet-4-5-20250929", "claude-opus-4-1", "gpt-5", "gpt-5-mini-2025-08-07",
                  "gemini-2.5-pro", "models/gemini-2.5-flash-lite", "o3-mini"):  # fmt: skip
        assert table.price(model) is not None, model
    assert table.price("gpt-5-mini").key == "gpt-5-mini"  # the longest key wins
    assert table.price("gemini-2.5-flash-lite").key == "gemini-2.5-flash-lite"
    assert table.price("claude-unheard-of") is None  # refused, never free


def test_an_operators_table_overrides_entries_adds_a_default_or_replaces_the_shipped_one():
    extra = PriceFile.model_validate(
        {"models": {"gpt-5": {"input": 9, "output": 9}}, "default": {"input": 1, "output": 2}}
    )
    table = PriceTable(shipped(), extra)
    assert table.price("gpt-5").entry.input == 9 and table.price("anything").key == "default"
    only = PriceTable(shipped(), PriceFile.model_validate({"replace": True, "models": {}}))
    assert only.price("gpt-5") is None


def test_a_cost_is_rounded_up_to_the_micro_dollar_and_long_prompts_take_their_tier():
    price = load_prices().price("claude-sonnet-4-5")
    assert price.cost_micros(1, 0, 0, 0) == 3  # $3 per million: 3 micro-dollars a token
    assert price.cost_micros(0, 0, 0, 1) == 1  # $0.30 per million: 0.3, rounded up
    assert price.cost_micros(200_001, 0, 0, 0) == 200_001 * 6  # above 200k: $6


@given(
    body=st.integers(min_value=0, max_value=400_000),
    max_out=st.integers(min_value=1, max_value=64_000),
    split=st.tuples(*[st.floats(0, 1)] * 3),
    out_share=st.floats(0, 1),
)
def test_a_reservation_bounds_what_any_call_within_its_bounds_costs(
    body, max_out, split, out_share
):
    """Whatever the prompt's split between uncached input, cache writes and cache reads, and
    whatever output up to the limit, the call costs at most its reservation."""
    from loopwarden.model_gateway.providers import Shape

    price = load_prices().price("claude-sonnet-4-5")
    shape = Shape("claude-sonnet-4-5", max_out, 1, False, False, b"x" * body)
    reserve = reservation(shape, price)
    prompt = body + PROMPT_SLACK
    total = sum(split) or 1
    inp, write = int(prompt * split[0] / total), int(prompt * split[1] / total)
    read_ = prompt - inp - write
    cost = price.cost_micros(inp, int(max_out * out_share), write, read_)
    assert cost <= round(reserve.cost_usd * 1_000_000)
    assert reserve.output_tokens == max_out and reserve.input_tokens == prompt


def test_anthropic_usage_is_read_from_a_stream_split_anywhere():
    body = sse(
        {"type": "message_start", "message": {"usage": {"input_tokens": 11, "output_tokens": 1,
         "cache_creation_input_tokens": 7, "cache_read_input_tokens": 5}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "message_delta", "usage": {"output_tokens": 42}},
    )  # fmt: skip
    counts = read("anthropic", Route("messages"), True, body)
    assert (counts.input_tokens, counts.output_tokens) == (11, 42)
    assert (counts.cache_write_tokens, counts.cache_read_tokens) == (7, 5) and counts.complete
    cut = read("anthropic", Route("messages"), True, body[: body.index(b"\n\n") + 2])
    assert cut.seen and not cut.complete and cut.input_tokens == 11


def test_openai_usage_is_read_from_responses_and_chat_completions():
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 60}, "output_tokens": 9}
    body = sse({"type": "response.completed", "response": {"usage": usage}})
    counts = read("openai", Route("responses"), True, body)
    assert (counts.input_tokens, counts.cache_read_tokens, counts.output_tokens) == (40, 60, 9)
    chat = json.dumps({"usage": {"prompt_tokens": 10, "completion_tokens": 3}}).encode()
    counts = read("openai", Route("chat"), False, chat)
    assert (counts.input_tokens, counts.output_tokens, counts.complete) == (10, 3, True)


def test_gemini_usage_is_read_from_events_and_from_a_streamed_array():
    meta = {"promptTokenCount": 30, "cachedContentTokenCount": 10, "candidatesTokenCount": 4,
            "thoughtsTokenCount": 6}  # fmt: skip
    last = {"candidates": [{"finishReason": "STOP"}], "usageMetadata": meta}
    for body in (sse(last), json.dumps([{"candidates": []}, last]).encode()):
        counts = read("gemini", Route("generate", "m", True), True, body, chunk=5)
        assert (counts.input_tokens, counts.cache_read_tokens, counts.output_tokens) == (20, 10, 10)
        assert counts.complete


@pytest.mark.parametrize(
    ("provider", "method", "path"),
    [
        ("anthropic", "GET", "/v1/models/.."),
        ("anthropic", "GET", "/v1/models/a/../../x"),
        ("anthropic", "POST", "/v1/complete"),
        ("openai", "POST", "/v1/embeddings"),
        ("gemini", "POST", "/v1beta/models/..:generateContent"),
        ("gemini", "POST", "/v1beta/models/m:embedContent"),
    ],
)
def test_only_the_apis_paths_are_served(provider, method, path):
    assert PROVIDERS[provider].route(method, path) is None


@pytest.mark.parametrize(
    "text",
    [
        "anthropic",
        "nobody=http://x",
        "openai=ftp://x",
        "openai=http://u:p@x",
        "gemini=http://x?a=1",
    ],
)
def test_an_upstream_is_a_known_provider_and_a_plain_http_base_url(text):
    with pytest.raises(InvalidInput):
        parse_upstream(text, frozenset(PROVIDERS))
