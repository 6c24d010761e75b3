"""The `Model` protocol: what the loop needs from any LLM, streaming.

A model streams `TextDelta`s (forwarded live, never persisted), optional `ReasoningDelta`s and
`ToolCallDelta`s (live progress of reasoning and of streamed arguments) and ends with exactly one `ModelDone` carrying the whole
`ModelResponse`, which is what the loop commits. Keeping the complete response in one final chunk
means the loop never re-assembles fragments and replay can answer with the recorded response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import ContentPart, Message, ReasoningPart, ToolCall, Usage


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: name, description and JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    messages: list[Message]
    tools: list[ToolSpec] = []
    #: Provider options passed through as-is (temperature, max_tokens, ...).
    options: dict[str, Any] = {}


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    text: str = ""
    tool_calls: list[ToolCall] = []
    usage: Usage = Usage()
    stop_reason: str | None = None
    #: USD, when the answerer already knows it (a replay answers the recorded cost); else the
    #: loop prices `usage` with the model's `prices`.
    cost: float | None = None
    #: The reasoning the provider returned (thinking, summaries, signatures), recorded in the
    #: assistant message and sent back with it.
    reasoning: list[ReasoningPart] = []


#: Stop reasons meaning "the output hit its token limit", as each provider spells it.
TRUNCATED_STOP_REASONS = frozenset({"length", "max_tokens", "max_output_tokens", "MAX_TOKENS"})


def is_truncated(response: ModelResponse) -> bool:
    """The answer was cut off by the output token limit (and asked for no tools)."""
    return response.stop_reason in TRUNCATED_STOP_REASONS and not response.tool_calls


class TextDelta(msgspec.Struct, frozen=True):
    text: str


def data_url(part: ContentPart) -> str:
    """An image/file part as the URL OpenAI's APIs take: its own `url`, or a `data:` URL of its
    bytes."""
    if part.data is None:
        return part.url or ""
    return f"data:{part.media_type or 'application/octet-stream'};base64,{part.data}"


class ReasoningDelta(msgspec.Struct, frozen=True):
    """Streamed reasoning text (live only; the whole reasoning is in the final response)."""

    text: str


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True):
    """Streamed fragment of a tool call's arguments (live progress only)."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments_delta: str = ""


class ModelDone(msgspec.Struct, frozen=True):
    response: ModelResponse


ModelChunk = TextDelta | ReasoningDelta | ToolCallDelta | ModelDone


@runtime_checkable
class Model(Protocol):
    """Anything that can stream a response to a request."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...


@runtime_checkable
class SelfRetrying(Protocol):
    """A model that retries transient failures itself, like a standalone HTTP client does.

    One policy must own retries, or they multiply (loop attempts x client attempts). When the
    run loop drives a model it owns them (`AgentSpec.retry`), so it streams from
    `single_attempt()`: the same model making one request per model per call. Used on its own,
    the model keeps its transport retries.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...

    def single_attempt(self) -> Model: ...


_Chunk = TypeVar("_Chunk")


class closing_stream(Generic[_Chunk]):
    """`async with closing_stream(model.stream(request)) as chunks:` the stream, closed on leaving
    the block when it can be (an async generator's `aclose`). A caller that returns at
    `ModelDone` (or fails midway) ends the stream there, its HTTP response with it, rather than
    leaving it to the garbage collector, which asyncio then closes in a task of its own after a
    wake-up of the event loop."""

    __slots__ = ("stream",)

    def __init__(self, stream: AsyncIterator[_Chunk]) -> None:
        self.stream = stream

    async def __aenter__(self) -> AsyncIterator[_Chunk]:
        return self.stream

    async def __aexit__(self, *exc: object) -> None:
        aclose = getattr(self.stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def complete(model: Model, request: ModelRequest) -> ModelResponse:
    """Drain a stream and return its final response (for callers that don't need deltas)."""
    async with closing_stream(model.stream(request)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, ModelDone):
                return chunk.response
    raise ModelProtocolError("model stream ended without a ModelDone chunk")


class ModelError(AgentlogError):
    """Inference failed. `retryable` says whether the same request may succeed later."""

    code = "model_error"
    retryable = False


class ModelUnavailable(ModelError):
    """Transport failure, timeouts, 429 and 5xx after retries were exhausted. `retry_after`:
    the seconds the provider asked to wait (`Retry-After`), if it said. A client that tried
    several requests may say how many (`attempts`), the last HTTP status and the models tried."""

    code = "model_unavailable"
    retryable = True
    retry_after: float | None = None
    attempts: int | None = None
    status: int | None = None
    models: list[str] | None = None


class ModelProtocolError(ModelError):
    """The provider answered something we cannot parse (malformed chunk, missing fields)."""

    code = "model_protocol_error"


class ModelRequestRejected(ModelError):
    """4xx other than 429: the request itself is wrong (bad key, unknown model, bad params)."""

    code = "model_request_rejected"


class ModelRateLimited(ModelUnavailable):
    """429 (or the provider's quota error): retryable, after `retry_after` when it said."""

    code = "model_rate_limited"


class ModelAuthError(ModelRequestRejected):
    """401/403: the key is missing, wrong or lacks access. Another attempt won't help."""

    code = "model_auth_failed"


class ContextOverflow(ModelRequestRejected):
    """The request is longer than the model's context window. The run loop answers it by
    compacting the conversation (a recorded `ContextCompacted`, reason "overflow") and trying
    once more, instead of retrying the same request."""

    code = "context_overflow"


#: Phrases providers use for a prompt over the context window (their error codes vary).
_OVERFLOW_HINTS = (
    "context_length_exceeded", "context length", "context window", "prompt is too long",
    "too many tokens", "maximum context", "input token count", "exceeds the maximum number of tokens",
)


def looks_like_overflow(text: str) -> bool:
    """Whether a provider's 400 message says the prompt is too long for the model."""
    low = text.lower()
    return any(h in low for h in _OVERFLOW_HINTS)
