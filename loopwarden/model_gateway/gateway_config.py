"""What the operator configures of the model gateway, from `serve`'s flags: each provider's
upstream base URL (a request can never choose it), the price table, and how long an upstream
may stay silent before its call ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from loopwarden.errors import InvalidInput
from loopwarden.model_gateway.prices import PriceTable, load_prices

PRICES_FILE = "model-prices.toml"
"""The operator's price table in the home, read when `--model-prices` is not given."""


@dataclass(frozen=True)
class GatewaySettings:
    """The home (its `model-keys/`), each provider's upstream base URL (else its public one),
    the price table, and the seconds an upstream may stay silent (connect, and between bytes)."""

    home: Path
    prices: PriceTable
    upstreams: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0


def parse_upstream(text: str, providers: frozenset[str]) -> tuple[str, str]:
    """`PROVIDER=URL` as (provider, base URL); `InvalidInput` naming what is wrong."""
    name, sep, url = text.partition("=")
    if not sep or name not in providers:
        known = ", ".join(sorted(providers))
        raise InvalidInput(f"--model-upstream takes PROVIDER=URL with a provider of {known}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"--model-upstream {name}: {url!r} is not an http(s) URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise InvalidInput(
            f"--model-upstream {name}: a base URL has no query, fragment or credentials"
        )
    return name, url.rstrip("/")


def gateway_settings(
    home: Path, upstreams: list[str] | None, prices: Path | None, timeout: float | None
) -> GatewaySettings:
    """The gateway's settings from `serve`'s flags (`InvalidInput` for a bad one)."""
    from loopwarden.model_gateway.provider_registry import registry

    names = frozenset(registry())
    chosen = dict(parse_upstream(item, names) for item in upstreams or ())
    if prices is None and (home / PRICES_FILE).is_file():
        prices = home / PRICES_FILE
    if timeout is not None and not 0 < timeout <= 86_400:
        raise InvalidInput("--model-timeout must be between 0 and 86400 seconds")
    return GatewaySettings(
        home=home,
        prices=load_prices(prices),
        upstreams=chosen,
        idle_timeout=timeout if timeout is not None else 300.0,
    )
