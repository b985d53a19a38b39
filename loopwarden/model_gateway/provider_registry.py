"""Every provider the model gateway speaks, by the name in its path prefix (`/model/<name>/…`).

Apart from `providers.py` (what a provider is), which each provider's module builds on.
"""

from __future__ import annotations

from loopwarden.model_gateway.anthropic_api import Anthropic
from loopwarden.model_gateway.gemini_api import Gemini
from loopwarden.model_gateway.openai_api import OpenAI
from loopwarden.model_gateway.providers import Provider


def registry() -> dict[str, Provider]:
    """Every provider, by the name in its path prefix (`/model/<name>/…`)."""
    providers: tuple[Provider, ...] = (Anthropic(), OpenAI(), Gemini())
    return {p.name: p for p in providers}
