"""The model gateway: loopwarden in the model path (docs/model-gateway.md). Calls to the
Anthropic, OpenAI and Gemini APIs pass through, each decided against its loop's budgets before
it goes upstream, charged what the provider's answer says it used, and sealed as a receipt."""
