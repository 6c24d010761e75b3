"""`OpenAIResponsesModel`: OpenAI's Responses API through the official `openai` SDK, streamed.

- System messages become `instructions`; the conversation is sent as input items (messages,
  `function_call` and `function_call_output` items), so the request is stateless (`store` is
  off unless the options say otherwise): the log, not the provider, holds the conversation.
- Reasoning (`reasoning_effort=`): summaries stream as `ReasoningDelta`s; each reasoning item is
  recorded with its encrypted content (`include`) and sent back before the answer it led to.
- Text and tool-call argument deltas are streamed; the final `response.completed` (or
  `response.incomplete` when the output hit `max_output_tokens`) gives usage, including cached
  input and reasoning tokens.
- Errors are the SDK's, mapped by `agentlog.runtime.models.sdk`; an `error` / `response.failed`
  event in the stream maps the same way by its code.
"""

from __future__ import annotations

import json
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
    data_url,
)
from agentlog.runtime.models.pricing import ModelPrices
from agentlog.runtime.models.sdk import (
    ClientPerLoop,
    client_options,
    guarded,
    import_sdk,
    map_status_error,
    parse_arguments,
    sdk_setup,
    system_text,
)

__all__ = ["OpenAIResponsesModel", "to_responses_input"]


class OpenAIResponsesModel:
    """Streams responses from the OpenAI Responses API. `model` is sent on the wire (None: the
    request's). `reasoning_effort` sets `reasoning.effort` for reasoning models."""

    provider = "openai-responses"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        reasoning_effort: str | None = None,
        timeout: float = 120.0,
        headers: Mapping[str, str] | None = None,
        prices: ModelPrices | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.name = name or model or "openai-responses"
        self.reasoning_effort = reasoning_effort
        self.prices = prices
        options = client_options(api_key=api_key, key_env="OPENAI_API_KEY", base_url=base_url,
                                 base_url_env="OPENAI_BASE_URL", timeout=timeout, headers=headers)
        self.setup = sdk_setup(options, "openai", "openai", "OPENAI_API_KEY")
        self._clients = ClientPerLoop(lambda: import_sdk("openai", "openai").AsyncOpenAI(**options))

    def setup_problems(self) -> list[str]:
        """What this model lacks before its first request (the SDK, a key): `SdkSetup.problems`."""
        return self.setup.problems()

    async def aclose(self) -> None:
        await self._clients.aclose()

    def params(self, request: ModelRequest) -> dict[str, Any]:
        model = self.model or request.model
        if not model:
            raise ModelRequestRejected("no model name: set OpenAIResponsesModel(model=...) or ModelRequest.model")
        options = dict(request.options)
        if "max_tokens" in options:  # the chat-completions spelling, as agents' model_options often have it
            options.setdefault("max_output_tokens", options.pop("max_tokens"))
        params: dict[str, Any] = {"model": model, "input": to_responses_input(request.messages), "store": False}
        system = system_text(request.messages)
        if system:
            params["instructions"] = system
        if request.tools:
            params["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                                "parameters": t.parameters, "strict": False} for t in request.tools]
        if self.reasoning_effort is not None:  # stateless: the reasoning comes back encrypted, for the next turn
            params["reasoning"] = {"effort": self.reasoning_effort, "summary": "auto"}
            params["include"] = ["reasoning.encrypted_content"]
        params.update(options)
        return params

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return guarded(self._stream(request), f"openai responses model {self.model or request.model!r}: ")

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        params = self.params(request)
        stream = await self._clients.get().responses.create(**params, stream=True)
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}  # output_index -> {id, name, args, position}
        final: Any = None
        stop_reason = "stop"
        reasoning: list[ReasoningPart] = []
        async for event in stream:
            kind = event.type
            if kind == "response.output_text.delta":
                text.append(event.delta)
                yield TextDelta(event.delta)
            elif kind == "response.output_item.added" and event.item.type == "function_call":
                item = event.item
                calls[event.output_index] = {"id": item.call_id, "name": item.name, "args": [], "position": len(calls)}
                yield ToolCallDelta(index=len(calls) - 1, call_id=item.call_id, name=item.name)
            elif kind == "response.function_call_arguments.delta" and event.output_index in calls:
                call = calls[event.output_index]
                call["args"].append(event.delta)
                yield ToolCallDelta(index=call["position"], arguments_delta=event.delta)
            elif kind == "response.reasoning_summary_text.delta":
                yield ReasoningDelta(event.delta)
            elif kind == "response.output_item.done" and event.item.type == "reasoning":
                item = event.item
                summary = "\n\n".join(getattr(p, "text", "") for p in (getattr(item, "summary", None) or ()))
                reasoning.append(ReasoningPart(provider="openai", id=item.id, text=summary,
                                               data=getattr(item, "encrypted_content", None)))
            elif kind == "response.output_item.done" and event.item.type == "function_call":
                if event.output_index in calls:
                    calls[event.output_index]["done"] = event.item.arguments
            elif kind in ("response.completed", "response.incomplete"):
                final = event.response
                if kind == "response.incomplete":
                    details = getattr(final, "incomplete_details", None)
                    stop_reason = getattr(details, "reason", None) or "incomplete"
            elif kind in ("response.failed", "error"):
                raise _stream_error(event)
        tool_calls = [
            ToolCall(id=c["id"], name=c["name"],
                     arguments=parse_arguments(c.get("done") or "".join(c["args"]), c["name"]))
            for _, c in sorted(calls.items())
        ]
        if tool_calls and stop_reason == "stop":
            stop_reason = "tool_calls"
        yield ModelDone(ModelResponse(
            model=params["model"], text="".join(text), tool_calls=tool_calls,
            usage=_usage(getattr(final, "usage", None)), stop_reason=stop_reason, reasoning=reasoning,
        ))


def _usage(u: Any) -> Usage:
    if u is None:
        return Usage()
    cached = getattr(getattr(u, "input_tokens_details", None), "cached_tokens", 0) or 0
    reasoning = getattr(getattr(u, "output_tokens_details", None), "reasoning_tokens", 0) or 0
    return Usage(input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                 cache_read_tokens=cached, reasoning_tokens=reasoning)


def _stream_error(event: Any) -> Exception:
    err = getattr(getattr(event, "response", None), "error", None) or event
    code = getattr(err, "code", None)
    message = getattr(err, "message", None) or str(err)
    status = 429 if code in ("rate_limit_exceeded", "insufficient_quota") else (
        500 if code in (None, "server_error") else 400)
    return map_status_error(status, str(message), code=code if isinstance(code, str) else None,
                            where="openai responses stream: ")


def to_responses_input(messages: list[Message]) -> list[dict[str, Any]]:
    """agentlog messages (minus system ones, sent as `instructions`) as Responses input items."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            if not m.tool_call_id:
                raise ModelRequestRejected(f"tool message {m.id!r} has no tool_call_id")
            items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content})
        elif m.role == "assistant":
            items += [{"type": "reasoning", "id": r.id, "encrypted_content": r.data,
                       "summary": [{"type": "summary_text", "text": r.text}] if r.text else []}
                      for r in m.reasoning or () if r.provider == "openai" and r.id and r.data]
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            items += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": json.dumps(c.arguments)}
                      for c in m.tool_calls or ()]
        elif m.parts:  # images and files: input_image / input_file content
            items.append({"role": "user", "content": [responses_part(p) for p in m.parts]})
        else:
            items.append({"role": "user", "content": m.content})
    return items


def responses_part(p: ContentPart) -> dict[str, Any]:
    """A content part as Responses input content (`input_text`, `input_image`, `input_file`)."""
    if p.type == "text":
        return {"type": "input_text", "text": p.text}
    if p.type == "image":
        return {"type": "input_image", "image_url": data_url(p)}
    if p.data is None:
        return {"type": "input_file", "file_url": p.url}
    return {"type": "input_file", "filename": p.filename or "file", "file_data": data_url(p)}
