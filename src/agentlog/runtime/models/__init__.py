"""Models: the streaming `Model` protocol and its implementations: scripted, OpenAI-compatible
(hand-written client), and the providers on their official SDKs (Anthropic, OpenAI Responses,
Gemini; optional extras, imported when a model is built)."""

from .anthropic import AnthropicModel
from .base import (
    ContextOverflow,
    Model,
    ModelAuthError,
    ModelChunk,
    ModelDone,
    ModelError,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ModelUnavailable,
    ReasoningDelta,
    SelfRetrying,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    complete,
    is_truncated,
)
from .gemini import GeminiModel
from .openai import OpenAIChatModel, RetryPolicy
from .openai_responses import OpenAIResponsesModel
from .openai_sdk import OpenAISDKChatModel
from .pool import ModelPool
from .pricing import ModelPrices
from .providers import is_provider_id, model_from_id
from .scripted import ScriptedCall, ScriptedModel, ScriptExhausted, Turn, last_tool_result

__all__ = [
    "AnthropicModel",
    "ContextOverflow",
    "GeminiModel",
    "Model",
    "ModelAuthError",
    "ModelPool",
    "ModelPrices",
    "ModelRateLimited",
    "OpenAIResponsesModel",
    "OpenAISDKChatModel",
    "is_provider_id",
    "is_truncated",
    "model_from_id",
    "ModelChunk",
    "ModelDone",
    "ModelError",
    "ModelProtocolError",
    "ModelRequest",
    "ModelRequestRejected",
    "ModelResponse",
    "ModelUnavailable",
    "ReasoningDelta",
    "OpenAIChatModel",
    "RetryPolicy",
    "ScriptExhausted",
    "SelfRetrying",
    "ScriptedCall",
    "ScriptedModel",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Turn",
    "complete",
    "last_tool_result",
]
