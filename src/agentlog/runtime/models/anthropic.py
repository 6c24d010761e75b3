"""`AnthropicModel`: Claude through the official `anthropic` SDK (Messages API, streamed).

- System messages become the request's `system` blocks; tool results become `tool_result` blocks
  of a user turn (consecutive ones merged, as the API wants alternating turns).
- Prompt caching (`prompt_cache=True`, the default): a `cache_control` breakpoint on the system
  prompt, the tool list and the last message, so each turn of a conversation reads the previous
  turns from the cache. The answer's cache reads / writes land in `Usage`.
- Extended thinking (`thinking_budget=N`): the request asks for thinking; the thinking streams as
  `ReasoningDelta`s and is recorded, signed, in the assistant message's `reasoning`, which goes
  back with the message in later requests (the API requires it around tool use).
- `Usage.input_tokens` counts cached tokens too (Anthropic reports them apart).
- Errors are the SDK's, mapped by `agentlog.runtime.models.sdk` (429 / 529 retryable with
  `retry-after`, "prompt is too long" -> `ContextOverflow`, 401 -> `ModelAuthError`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentlog.eventlog.events import ContentPart, Message, ReasoningPart, ToolCall, Usage
from agentlog.runtime.models.base import (
    ModelChunk,
    ModelDone,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from agentlog.runtime.models.pricing import ModelPrices
from agentlog.runtime.models.sdk import (
    ClientPerLoop,
    client_options,
    guarded,
    import_sdk,
    parse_arguments,
    sdk_setup,
    system_text,
)

__all__ = ["AnthropicModel", "to_anthropic_messages"]

_CACHE = {"type": "ephemeral"}


class AnthropicModel:
    """Streams messages from Anthropic. `model` is sent on the wire (None: the request's)."""

    provider = "anthropic"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        thinking_budget: int | None = None,
        prompt_cache: bool = True,
        timeout: float = 120.0,
        headers: Mapping[str, str] | None = None,
        prices: ModelPrices | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.name = name or model or "anthropic"
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.prompt_cache = prompt_cache
        self.prices = prices
        options = client_options(api_key=api_key, key_env="ANTHROPIC_API_KEY", base_url=base_url,
                                 base_url_env="ANTHROPIC_BASE_URL", timeout=timeout, headers=headers)
        self.setup = sdk_setup(options, "anthropic", "anthropic", "ANTHROPIC_API_KEY")
        self._clients = ClientPerLoop(lambda: import_sdk("anthropic", "anthropic").AsyncAnthropic(**options))

    def setup_problems(self) -> list[str]:
        """What this model lacks before its first request (the SDK, a key): `SdkSetup.problems`."""
        return self.setup.problems()

    async def aclose(self) -> None:
        await self._clients.aclose()

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for a request (options pass through)."""
        model = self.model or request.model
        if not model:
            raise ModelRequestRejected("no model name: set AnthropicModel(model=...) or ModelRequest.model")
        options = dict(request.options)
        params: dict[str, Any] = {"model": model, "max_tokens": options.pop("max_tokens", self.max_tokens)}
        system = system_text(request.messages)
        if system:
            block: dict[str, Any] = {"type": "text", "text": system}
            if self.prompt_cache:
                block["cache_control"] = _CACHE
            params["system"] = [block]
        messages = to_anthropic_messages(request.messages)
        if self.prompt_cache and messages:
            last = messages[-1]["content"][-1]
            last["cache_control"] = _CACHE
        params["messages"] = messages
        if request.tools:
            tools: list[dict[str, Any]] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
            if self.prompt_cache:
                tools[-1]["cache_control"] = _CACHE
            params["tools"] = tools
        if self.thinking_budget is not None and "thinking" not in options:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        params.update(options)
        return params

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return guarded(self._stream(request), f"anthropic model {self.model or request.model!r}: ")

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        params = self.params(request)
        stream = await self._clients.get().messages.create(**params, stream=True)
        text: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        usage = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
        stop_reason: str | None = None
        model = params["model"]
        async for event in stream:
            kind = event.type
            if kind == "message_start":
                message = event.message
                model = getattr(message, "model", None) or model
                _usage_into(usage, message.usage)
            elif kind == "content_block_start":
                block = event.content_block
                entry: dict[str, Any] = {"type": block.type, "args": []}
                if block.type == "redacted_thinking":
                    entry["data"] = block.data
                if block.type == "tool_use":
                    entry.update(id=block.id, name=block.name, position=sum(
                        1 for b in blocks.values() if b["type"] == "tool_use"))
                    yield ToolCallDelta(index=entry["position"], call_id=block.id, name=block.name)
                blocks[event.index] = entry
            elif kind == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    text.append(delta.text)
                    yield TextDelta(delta.text)
                elif delta.type == "thinking_delta" and event.index in blocks:
                    blocks[event.index]["args"].append(delta.thinking)
                    yield ReasoningDelta(delta.thinking)
                elif delta.type == "signature_delta" and event.index in blocks:
                    blocks[event.index]["signature"] = delta.signature
                elif delta.type == "input_json_delta" and event.index in blocks:
                    call = blocks[event.index]
                    call["args"].append(delta.partial_json)
                    yield ToolCallDelta(index=call.get("position", 0), arguments_delta=delta.partial_json)
            elif kind == "message_delta":
                stop_reason = getattr(event.delta, "stop_reason", None) or stop_reason
                if getattr(event, "usage", None) is not None:
                    _usage_into(usage, event.usage)
        calls = [
            ToolCall(id=b["id"], name=b["name"], arguments=parse_arguments("".join(b["args"]), b["name"]))
            for _, b in sorted(blocks.items()) if b["type"] == "tool_use"
        ]
        reasoning = [
            ReasoningPart(provider="anthropic", text="".join(b["args"]), signature=b.get("signature"))
            if b["type"] == "thinking" else ReasoningPart(provider="anthropic", data=b["data"])
            for _, b in sorted(blocks.items()) if b["type"] in ("thinking", "redacted_thinking")
        ]
        yield ModelDone(ModelResponse(
            model=model, text="".join(text), tool_calls=calls, stop_reason=stop_reason, reasoning=reasoning,
            usage=Usage(
                input_tokens=usage["input"] + usage["cache_read"] + usage["cache_write"],
                output_tokens=usage["output"], cache_read_tokens=usage["cache_read"],
                cache_write_tokens=usage["cache_write"],
            ),
        ))


def _usage_into(usage: dict[str, int], u: Any) -> None:
    """Anthropic's usage objects (message_start's, then message_delta's cumulative counts)."""
    for key, attr in (("input", "input_tokens"), ("output", "output_tokens"),
                      ("cache_read", "cache_read_input_tokens"), ("cache_write", "cache_creation_input_tokens")):
        value = getattr(u, attr, None)
        if isinstance(value, int):
            usage[key] = value


def to_anthropic_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """agentlog messages (minus system ones, which go in `system`) as Messages API turns."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            if not m.tool_call_id:
                raise ModelRequestRejected(f"tool message {m.id!r} has no tool_call_id")
            add("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}])
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = [  # thinking first, signed, as the API returned it
                {"type": "thinking", "thinking": r.text, "signature": r.signature} if r.data is None
                else {"type": "redacted_thinking", "data": r.data}
                for r in m.reasoning or () if r.provider == "anthropic" and (r.signature or r.data)
            ]
            blocks += [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls or ()]
            add("assistant", blocks or [{"type": "text", "text": ""}])
        else:
            add("user", [anthropic_part(p) for p in m.parts] if m.parts else [{"type": "text", "text": m.content}])
    return out


def anthropic_part(p: ContentPart) -> dict[str, Any]:
    """A content part as a Messages API block: `image`, or `document` for a file (PDF, text),
    from base64 data or a URL."""
    if p.type == "text":
        return {"type": "text", "text": p.text}
    source = ({"type": "base64", "media_type": p.media_type, "data": p.data} if p.data is not None
              else {"type": "url", "url": p.url})
    return {"type": "image" if p.type == "image" else "document", "source": source}
