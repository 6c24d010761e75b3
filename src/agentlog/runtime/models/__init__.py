"""Models: the streaming `Model` protocol and its implementations (scripted, OpenAI-compatible)."""

from .base import (
    Model,
    ModelChunk,
    ModelDone,
    ModelError,
    ModelProtocolError,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ModelUnavailable,
    SelfRetrying,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    complete,
)
from .openai import OpenAIChatModel, RetryPolicy
from .scripted import ScriptedCall, ScriptedModel, ScriptExhausted, Turn, last_tool_result

__all__ = [
    "Model",
    "ModelChunk",
    "ModelDone",
    "ModelError",
    "ModelProtocolError",
    "ModelRequest",
    "ModelRequestRejected",
    "ModelResponse",
    "ModelUnavailable",
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
