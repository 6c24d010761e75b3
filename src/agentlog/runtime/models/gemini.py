"""`GeminiModel`: Google's Gemini through the official `google-genai` SDK, streamed.

- System messages become `system_instruction`; assistant turns are `model` contents with
  `function_call` parts; tool results are `function_response` parts naming their tool (looked up
  from the call they answer).
- Gemini may stream a function call without an id: the id is then derived from the answer
  (same answer, same id), as replay and resume need stable ids.
- The SDK's automatic function calling is off: the run loop executes tools.
- Thoughts (`thinking_budget=`, `include_thoughts` in the options) stream as `ReasoningDelta`s;
  thought signatures (on thoughts, text or a call's part) are recorded in the message's
  `reasoning` and sent back on the same parts.
- Usage: `prompt_token_count` (includes cached), `cached_content_token_count`, and output as
  candidates + thoughts (thinking tokens are billed as output), with `reasoning_tokens` the latter.
- Errors: `google.genai.errors.APIError` carries the HTTP code; mapped like the other providers.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentlog.eventlog.events import ContentPart, Message, ReasoningPart, ToolCall, Usage
from agentlog.runtime.models.base import (
    ModelChunk,
    ModelDone,
    ModelError,
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
    SdkSetup,
    call_names,
    derived_call_id,
    guarded,
    import_sdk,
    map_sdk_error,
    map_status_error,
    system_text,
)

__all__ = ["GeminiModel", "to_gemini_contents"]


class GeminiModel:
    """Streams content from the Gemini API. `model` is sent on the wire (None: the request's)."""

    provider = "gemini"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        thinking_budget: int | None = None,
        timeout: float = 120.0,
        headers: Mapping[str, str] | None = None,
        prices: ModelPrices | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.name = name or model or "gemini"
        self.thinking_budget = thinking_budget
        self.prices = prices
        key = api_key if api_key is not None else (os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY"))
        http: dict[str, Any] = {"timeout": int(timeout * 1000)}
        if base_url := base_url or os.environ.get("GOOGLE_GEMINI_BASE_URL"):
            http["base_url"] = base_url
        if headers:
            http["headers"] = dict(headers)
        self.setup = SdkSetup("google.genai", "gemini", "GEMINI_API_KEY (or GOOGLE_API_KEY)", has_key=bool(key),
                              base_url=http.get("base_url"))
        self._clients = ClientPerLoop(lambda: import_sdk("google.genai", "gemini").Client(
            api_key=key or "unset", http_options=http,
        ))

    def setup_problems(self) -> list[str]:
        """What this model lacks before its first request (the SDK, a key): `SdkSetup.problems`."""
        return self.setup.problems()

    async def aclose(self) -> None:
        await self._clients.aclose()

    def params(self, request: ModelRequest) -> dict[str, Any]:
        model = self.model or request.model
        if not model:
            raise ModelRequestRejected("no model name: set GeminiModel(model=...) or ModelRequest.model")
        config: dict[str, Any] = {"automatic_function_calling": {"disable": True}}
        system = system_text(request.messages)
        if system:
            config["system_instruction"] = system
        if request.tools:
            config["tools"] = [{"function_declarations": [
                {"name": t.name, "description": t.description, "parameters_json_schema": t.parameters}
                for t in request.tools
            ]}]
        if self.thinking_budget is not None:
            config["thinking_config"] = {"thinking_budget": self.thinking_budget}
        options = dict(request.options)
        if "max_tokens" in options:
            options.setdefault("max_output_tokens", options.pop("max_tokens"))
        config.update(options)
        return {"model": model, "contents": to_gemini_contents(request.messages), "config": config}

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return guarded(self._stream(request), f"gemini model {self.model or request.model!r}: ", _map_error)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        params = self.params(request)
        stream = await self._clients.get().aio.models.generate_content_stream(**params)
        text: list[str] = []
        calls: list[tuple[str | None, str, dict[str, Any], str | None]] = []
        thoughts: list[ReasoningPart] = []
        usage = Usage()
        stop_reason: str | None = None
        model = params["model"]
        async for chunk in stream:
            if chunk.usage_metadata is not None:
                usage = _usage(chunk.usage_metadata)
            for candidate in (chunk.candidates or [])[:1]:  # one candidate: the loop wants one answer
                if candidate.finish_reason is not None:
                    stop_reason = str(getattr(candidate.finish_reason, "value", candidate.finish_reason))
                content = candidate.content
                for part in (content.parts if content is not None else None) or ():
                    signature = _b64(part.thought_signature)
                    if part.function_call is not None:
                        fc = part.function_call
                        calls.append((fc.id, fc.name or "", dict(fc.args or {}), signature))
                        yield ToolCallDelta(index=len(calls) - 1, call_id=fc.id, name=fc.name)
                    elif part.thought:
                        thoughts.append(ReasoningPart(provider="gemini", text=part.text or "", signature=signature))
                        if part.text:
                            yield ReasoningDelta(part.text)
                    elif part.text:
                        text.append(part.text)
                        yield TextDelta(part.text)
                        if signature:  # a signature on the answer's text: kept to send it back
                            thoughts.append(ReasoningPart(provider="gemini", signature=signature))
        body = "".join(text)
        tool_calls = [
            ToolCall(id=cid or derived_call_id(model, i, name, body, sorted(args.items())), name=name, arguments=args)
            for i, (cid, name, args, _) in enumerate(calls)
        ]
        thoughts += [ReasoningPart(provider="gemini", signature=sig, call_id=call.id)
                     for call, (_, _, _, sig) in zip(tool_calls, calls, strict=True) if sig]
        if tool_calls and stop_reason == "STOP":
            stop_reason = "tool_calls"
        yield ModelDone(ModelResponse(model=model, text=body, tool_calls=tool_calls, usage=usage,
                                      stop_reason=stop_reason, reasoning=thoughts))


def _usage(u: Any) -> Usage:
    thoughts = u.thoughts_token_count or 0
    return Usage(
        input_tokens=u.prompt_token_count or 0,
        output_tokens=(u.candidates_token_count or 0) + thoughts,
        cache_read_tokens=u.cached_content_token_count or 0,
        reasoning_tokens=thoughts,
    )


def to_gemini_contents(messages: list[Message]) -> list[dict[str, Any]]:
    """agentlog messages (minus system ones) as Gemini contents (roles `user` and `model`)."""
    names = call_names(messages)
    out: list[dict[str, Any]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": role, "parts": parts})

    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            if not m.tool_call_id:
                raise ModelRequestRejected(f"tool message {m.id!r} has no tool_call_id")
            add("user", [{"function_response": {"id": m.tool_call_id, "name": names.get(m.tool_call_id, "tool"),
                                                "response": {"result": m.content}}}])
        elif m.role == "assistant":
            mine = [r for r in m.reasoning or () if r.provider == "gemini"]
            signed = {r.call_id: r.signature for r in mine if r.call_id and r.signature}
            parts: list[dict[str, Any]] = [
                {"text": r.text, "thought": True, **_signature(r.signature)} for r in mine if r.text and not r.call_id
            ]
            text_signature = next((r.signature for r in mine if not r.text and not r.call_id and r.signature), None)
            parts += [{"text": m.content, **_signature(text_signature)}] if m.content else []
            parts += [{"function_call": {"id": c.id, "name": c.name, "args": c.arguments}, **_signature(signed.get(c.id))}
                      for c in m.tool_calls or ()]
            add("model", parts or [{"text": ""}])
        else:
            add("user", [gemini_part(p) for p in m.parts] if m.parts else [{"text": m.content}])
    return out


def gemini_part(p: ContentPart) -> dict[str, Any]:
    """A content part as a Gemini part: `inline_data` (the bytes) or `file_data` (a URI)."""
    if p.type == "text":
        return {"text": p.text}
    mime = p.media_type or "application/octet-stream"
    if p.data is None:
        return {"file_data": {"file_uri": p.url, "mime_type": mime}}
    return {"inline_data": {"mime_type": mime, "data": base64.b64decode(p.data)}}


def _map_error(exc: BaseException, where: str) -> ModelError:
    """google-genai's `APIError` carries the HTTP status as `code`; anything else maps as the
    other SDKs' errors do."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and type(exc).__module__.startswith("google"):
        response = getattr(exc, "response", None)
        return map_status_error(code, str(getattr(exc, "message", None) or exc),
                                getattr(response, "headers", None) or {}, where=where)
    return map_sdk_error(exc, where)


def _b64(value: bytes | None) -> str | None:
    """A thought signature (bytes from the SDK) as text for the log."""
    return base64.b64encode(value).decode() if value else None


def _signature(value: str | None) -> dict[str, Any]:
    return {"thought_signature": base64.b64decode(value)} if value else {}
