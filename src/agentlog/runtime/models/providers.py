"""`provider:model` ids (`anthropic:claude-sonnet-4-5`, `gemini:gemini-2.5-flash`...) as models.

One table maps a provider prefix to its class; the declarative config and `AgentSpec.model`
strings use it, so an agent can name a model without code. Keys and endpoints come from each
provider's usual environment variables unless given (`OPENAI_API_KEY` and `OPENAI_BASE_URL` for
`openai:`, a local OpenAI-compatible server included).
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime.models.anthropic import AnthropicModel
from agentlog.runtime.models.gemini import GeminiModel
from agentlog.runtime.models.openai import OpenAIChatModel
from agentlog.runtime.models.openai_responses import OpenAIResponsesModel
from agentlog.runtime.models.openai_sdk import OpenAISDKChatModel

__all__ = ["PROVIDERS", "build_provider_model", "is_provider_id", "model_from_id"]

#: provider prefix -> model class. `openai` is Chat Completions on the hand-written client (it
#: measured faster than the SDK); `openai-sdk` the same API on the official SDK.
PROVIDERS: dict[str, type] = {
    "openai": OpenAIChatModel,
    "openai-sdk": OpenAISDKChatModel,
    "openai-responses": OpenAIResponsesModel,
    "anthropic": AnthropicModel,
    "gemini": GeminiModel,
    "google": GeminiModel,
}


def is_provider_id(name: str) -> bool:
    prefix, sep, model = name.partition(":")
    return bool(sep and model) and prefix in PROVIDERS


def model_from_id(model_id: str, *, base_url: str | None = None, **options: Any) -> Any:
    """Build the model a `provider:model` id names; `options` go to its class (api_key,
    prices, timeout, headers...). ValueError for an unknown provider."""
    prefix, sep, model = model_id.partition(":")
    cls = PROVIDERS.get(prefix) if sep and model else None
    if cls is None:
        raise ValueError(f"not a provider:model id: {model_id!r} (providers: {', '.join(PROVIDERS)})")
    return cls(model, base_url=base_url, **options)


def build_provider_model(name: str) -> Any:
    """The model a `provider:model` id names (configured from the environment), else None: what
    the runtime's model registry builds for an id nobody registered."""
    return model_from_id(name) if is_provider_id(name) else None
