"""Models: the streaming `Model` protocol and its implementations: scripted, OpenAI-compatible
(hand-written client), and the providers on their official SDKs (Anthropic, OpenAI Responses,
Gemini; optional extras, imported when a model is built)."""

from agentlog.runtime.models.anthropic import AnthropicModel
from agentlog.runtime.models.base import (
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
from agentlog.runtime.models.gemini import GeminiModel
from agentlog.runtime.models.openai import OpenAIChatModel, RetryPolicy
from agentlog.runtime.models.openai_responses import OpenAIResponsesModel
from agentlog.runtime.models.openai_sdk import OpenAISDKChatModel
from agentlog.runtime.models.pool import ModelPool
from agentlog.runtime.models.pricing import ModelPrices
from agentlog.runtime.models.providers import is_provider_id, model_from_id
from agentlog.runtime.models.scripted import (
    ScriptedCall,
    ScriptedModel,
    ScriptExhausted,
    Turn,
    last_tool_result,
)

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
