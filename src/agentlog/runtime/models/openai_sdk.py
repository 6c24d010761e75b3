"""`OpenAISDKChatModel`: Chat Completions through the official `openai` SDK, streamed.

The hand-written aiohttp client (`agentlog.runtime.models.openai.OpenAIChatModel`) speaks the same
wire and stays the default for `openai:` ids because it measured faster per streamed answer
(`scripts/bench_models.py`, figure in the docs' measurements); this one is for users who want the SDK's
behaviour (its auth helpers, Azure clients, proxies) and as the bench's contender. Same request
mapping as the hand-written client, same `Model` contract and typed errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentlog.eventlog.events import ToolCall, Usage
from agentlog.runtime.models.base import (
    ModelChunk,
    ModelDone,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    TextDelta,
    ToolCallDelta,
)
from agentlog.runtime.models.openai import to_wire_messages, to_wire_tools
from agentlog.runtime.models.pricing import ModelPrices
from agentlog.runtime.models.sdk import (
    ClientPerLoop,
    client_options,
    derived_call_id,
    guarded,
    import_sdk,
    parse_arguments,
    sdk_setup,
)

__all__ = ["OpenAISDKChatModel"]


class OpenAISDKChatModel:
    provider = "openai-sdk"

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 120.0,
        headers: Mapping[str, str] | None = None,
        prices: ModelPrices | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.name = name or model or "openai"
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

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return guarded(self._stream(request), f"openai model {self.model or request.model!r}: ")

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        model = self.model or request.model
        if not model:
            raise ModelRequestRejected("no model name: set OpenAISDKChatModel(model=...) or ModelRequest.model")
        params: dict[str, Any] = {**request.options, "model": model, "messages": to_wire_messages(request.messages)}
        if request.tools:
            params["tools"] = to_wire_tools(request.tools)
        params["stream_options"] = {**(request.options.get("stream_options") or {}), "include_usage": True}
        stream = await self._clients.get().chat.completions.create(**params, stream=True)
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage = Usage()
        finish: str | None = None
        completion_id = ""
        async for chunk in stream:
            completion_id = completion_id or chunk.id
            if chunk.usage is not None:
                u = chunk.usage
                cached = getattr(u.prompt_tokens_details, "cached_tokens", 0) or 0
                reasoning = getattr(u.completion_tokens_details, "reasoning_tokens", 0) or 0
                usage = Usage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
                              cache_read_tokens=cached, reasoning_tokens=reasoning)
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    yield TextDelta(delta.content)
                for tc in delta.tool_calls or ():
                    call = calls.setdefault(tc.index, {"id": None, "name": None, "args": []})
                    fn = tc.function
                    call["id"] = call["id"] or tc.id
                    call["name"] = call["name"] or (fn.name if fn else None)
                    args = (fn.arguments if fn else None) or ""
                    call["args"].append(args)
                    yield ToolCallDelta(index=tc.index, call_id=tc.id, name=fn.name if fn else None, arguments_delta=args)
                if choice.finish_reason:
                    finish = choice.finish_reason
        tool_calls = []
        for index, c in sorted(calls.items()):
            raw = "".join(c["args"])
            name = c["name"] or ""
            tool_calls.append(ToolCall(id=c["id"] or derived_call_id(completion_id, index, name, raw), name=name,
                                       arguments=parse_arguments(raw, name)))
        yield ModelDone(ModelResponse(model=model, text="".join(text), tool_calls=tool_calls, usage=usage,
                                      stop_reason=finish))
