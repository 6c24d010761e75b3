"""`OpenAIChatModel`: a streaming client for OpenAI-compatible chat-completions APIs, on aiohttp.

Why it is shaped this way:
- Always streams (`stream: true` with `stream_options.include_usage`), so the loop can forward text
  live and still get token usage from the final chunk.
- Transient failures (429, 5xx, connection errors, timeouts, a stream cut before it finished) are
  retried with capped exponential backoff and jitter, honouring `Retry-After`, but only while
  nothing has been yielded to the caller: once a delta went out, a retry could duplicate output, so
  a later failure surfaces as `ModelUnavailable` instead.
- When the primary model is still unavailable after its retries, each fallback model is tried in
  order with its own retry budget. Rejected requests (4xx) and protocol errors are not retried or
  failed over: another attempt would get the same answer.
- Those retries are for standalone use. Under the run loop one policy owns retries
  (`AgentSpec.retry`), so the loop streams from `single_attempt()`: one request per model, and
  the error carries `retry_after` for the loop's own wait (`agentlog.runtime.models.base.SelfRetrying`).
- One `aiohttp.ClientSession` per instance, created lazily in the running loop; close it with
  `aclose()` or `async with`.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from agentlog.eventlog.events import ContentPart, Message, ReasoningPart, ToolCall, Usage
from agentlog.runtime.models.base import (
    ContextOverflow,
    Model,
    ModelAuthError,
    ModelChunk,
    ModelDone,
    ModelProtocolError,
    ModelRateLimited,
    ModelRequest,
    ModelRequestRejected,
    ModelResponse,
    ModelUnavailable,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    data_url,
    looks_like_overflow,
)
from agentlog.runtime.models.pricing import ModelPrices

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: The environment variables of the endpoint and its key (the official SDK's names).
BASE_URL_ENV = "OPENAI_BASE_URL"
KEY_ENV = "OPENAI_API_KEY"
_BODY_EXCERPT = 300


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry transient failures of one model.

    The delay before attempt n+1 is `min(max_delay, base_delay * 2**(n-1))`, reduced by up to
    `jitter` (a fraction) at random so that many clients don't retry in lockstep. A server's
    `Retry-After` replaces that delay, capped at `max_retry_after`.
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.25
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after))
        backoff = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return backoff * (1 - self.jitter * random.random())


@dataclass(eq=False)
class _Transient(Exception):
    """An attempt failed in a way that another attempt may fix."""

    reason: str
    status: int | None = None
    retry_after: float | None = None


@dataclass
class _Failure:
    model: str
    attempts: int
    last: _Transient


class OpenAIChatModel:
    """Streams chat completions from an OpenAI-compatible endpoint.

    `model` is the model name sent on the wire; when it is None, the request's `model` is sent.
    `base_url` is the endpoint (a local vLLM / Ollama / LM Studio server, a hosted one), else
    `$OPENAI_BASE_URL`, else OpenAI's; `api_key` the key, else `$OPENAI_API_KEY` (a local server
    may need none; OpenAI's does: `setup_problems` says so before the first request).
    `timeout` bounds one whole attempt, `read_timeout` each wait for the next bytes of the stream
    (a stalled stream fails fast even if the total budget is large).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        fallback_models: list[str] | None = None,
        timeout: float = 120.0,
        read_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        prices: ModelPrices | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        #: USD per 1M tokens (`agentlog.runtime.models.pricing`): the loop records each call's cost.
        self.prices = prices
        if name is not None:
            self.name = name
        self.base_url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        self.fallback_models = list(fallback_models or [])
        self.timeout = aiohttp.ClientTimeout(
            total=timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self.retry = retry or RetryPolicy()
        self.headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def setup_problems(self) -> list[str]:
        """What this model lacks before its first request: a key, when it talks to OpenAI's own
        endpoint (any other may take none)."""
        if self.api_key or self.base_url != DEFAULT_BASE_URL:
            return []
        return [f"{KEY_ENV} is not set (needed by {self.base_url}; for another OpenAI-compatible server, set "
                f"{BASE_URL_ENV} or the model's base_url)"]

    # -- lifecycle ---------------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- streaming ---------------------------------------------------------------------------------

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._stream(request, self.retry.max_attempts)

    def single_attempt(self) -> Model:
        """This client making one request per model (no retries): for a caller that owns the
        retry policy, like the run loop. Shares this client's session."""
        return _SingleAttempt(self)

    async def _stream(self, request: ModelRequest, attempts: int) -> AsyncIterator[ModelChunk]:
        primary = self.model or request.model
        if not primary:
            raise ModelRequestRejected("no model name: set OpenAIChatModel(model=...) or ModelRequest.model")
        messages = to_wire_messages(request.messages)  # reject a bad request before any network I/O
        failures: list[_Failure] = []
        for name in [primary, *(m for m in self.fallback_models if m != primary)]:
            body = build_body(name, messages, request.tools, request.options)
            last: _Transient | None = None
            for attempt in range(1, attempts + 1):
                if last is not None:
                    await asyncio.sleep(self.retry.delay(attempt - 1, last.retry_after))
                yielded = False
                attempt_stream = self._attempt(name, body)
                try:
                    while True:
                        try:
                            chunk = await attempt_stream.__anext__()
                        except StopAsyncIteration:
                            return
                        except _Transient as err:
                            if yielded:
                                mid_stream = ModelUnavailable(
                                    f"model {name!r} at {self.url} failed mid-stream ({err.reason}); "
                                    "not retried because output was already streamed"
                                )
                                mid_stream.retryable = False  # nor by the loop: output went out live
                                raise mid_stream from None
                            last = err
                            break
                        yield chunk
                        yielded = True
                finally:
                    await attempt_stream.aclose()
            assert last is not None
            failures.append(_Failure(name, attempts, last))
        raise self._unavailable(failures)

    def _unavailable(self, failures: list[_Failure]) -> ModelUnavailable:
        parts = [f"{f.model!r}: {f.attempts} attempt(s), last error {f.last.reason}" for f in failures]
        text = f"model unavailable at {self.url}: " + "; ".join(parts)
        err = ModelRateLimited(text) if failures[-1].last.status == 429 else ModelUnavailable(text)
        err.attempts = sum(f.attempts for f in failures)
        err.status = failures[-1].last.status
        err.models = [f.model for f in failures]
        err.retry_after = failures[-1].last.retry_after
        return err

    async def _attempt(self, model: str, body: dict[str, Any]) -> AsyncGenerator[ModelChunk, None]:
        """One HTTP request. Raises `_Transient` for anything worth retrying."""
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **self.headers}
        if self.api_key:
            headers.setdefault("Authorization", f"Bearer {self.api_key}")
        try:
            async with self._get_session().post(self.url, json=body, headers=headers) as resp:
                if resp.status != 200:
                    await self._raise_for_status(model, resp)
                parser = _StreamParser(model)
                async for data in _sse_data(resp.content):
                    if data == "[DONE]":
                        break
                    for chunk in parser.feed(data):
                        yield chunk
                else:
                    if parser.finish_reason is None:
                        raise _Transient("stream ended before [DONE] and without a finish_reason")
                yield ModelDone(parser.response())
        except (aiohttp.ClientError, TimeoutError) as err:
            if isinstance(err, TimeoutError):
                reason = f"timed out (total {self.timeout.total}s, read {self.timeout.sock_read}s)"
            else:
                reason = f"{type(err).__name__}: {err}"
            raise _Transient(reason) from err

    async def _raise_for_status(self, model: str, resp: aiohttp.ClientResponse) -> None:
        text = (await resp.text(errors="replace"))[:_BODY_EXCERPT]
        reason = f"HTTP {resp.status}: {text}"
        if resp.status == 429 or resp.status >= 500:
            raise _Transient(reason, resp.status, retry_after_from(resp.headers))
        text = f"{self.url} rejected the request for model {model!r}: {reason}"
        if resp.status in (401, 403):
            raise ModelAuthError(text)
        if resp.status == 413 or looks_like_overflow(text):
            raise ContextOverflow(text)
        raise ModelRequestRejected(text)


class _SingleAttempt:
    """`OpenAIChatModel.single_attempt()`: the client's stream with one attempt per model."""

    def __init__(self, client: OpenAIChatModel) -> None:
        self._client = client

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return self._client._stream(request, 1)


def retry_after_from(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms` (OpenAI) or `Retry-After` as seconds or an HTTP date."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """Data payloads of a server-sent-event stream (multi-line data joined with newlines)."""
    data: list[str] = []
    while True:
        try:
            raw = await content.readline()
        except ValueError as err:  # line over aiohttp's limit
            raise ModelProtocolError(f"unreadable event stream line: {err}") from err
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        fieldname, _, value = line.partition(":")
        if fieldname == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


@dataclass
class _PartialCall:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class _StreamParser:
    """Turns chat.completion.chunk payloads into deltas and accumulates the final response."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.completion_id = ""
        self.reasoning: list[str] = []

    def feed(self, data: str) -> list[ModelChunk]:
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as err:
            raise _malformed(f"not JSON: {err}", data) from None
        if not isinstance(chunk, dict):
            raise _malformed("not an object", data)
        if chunk.get("error"):
            raise _Transient(f"provider error in stream: {json.dumps(chunk['error'])[:_BODY_EXCERPT]}")
        if isinstance(chunk.get("id"), str) and not self.completion_id:
            self.completion_id = chunk["id"]
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = _usage(usage, data)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise _malformed("choices is not a list", data)
        out: list[ModelChunk] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise _malformed("choice is not an object", data)
            if choice.get("index", 0) != 0:
                continue  # n > 1 is not supported: the loop wants one answer
            out.extend(self._delta(choice.get("delta") or {}, data))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def _delta(self, delta: Any, data: str) -> list[ModelChunk]:
        if not isinstance(delta, dict):
            raise _malformed("delta is not an object", data)
        out: list[ModelChunk] = []
        # compatible servers (vLLM, DeepSeek, OpenRouter...) stream the reasoning beside the content
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise _malformed("content is not a string", data)
        if content:
            self.text.append(content)
            out.append(TextDelta(content))
        tool_calls = delta.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise _malformed("tool_calls is not a list", data)
        for position, tc in enumerate(tool_calls):
            if not isinstance(tc, dict):
                raise _malformed("tool call is not an object", data)
            index = tc.get("index", position)
            fn = tc.get("function") or {}
            if not isinstance(index, int) or not isinstance(fn, dict):
                raise _malformed("bad tool call index or function", data)
            partial = self.calls.setdefault(index, _PartialCall())
            call_id, name, args = tc.get("id"), fn.get("name"), fn.get("arguments") or ""
            if not isinstance(args, str):
                raise _malformed("tool call arguments are not a string", data)
            # Ids and names arrive whole (some servers repeat them on every delta): first one wins.
            if call_id and partial.id is None:
                partial.id = str(call_id)
            if name and partial.name is None:
                partial.name = str(name)
            partial.arguments.append(args)
            out.append(
                ToolCallDelta(index=index, call_id=call_id or None, name=name or None, arguments_delta=args)
            )
        return out

    def response(self) -> ModelResponse:
        return ModelResponse(
            model=self.model,
            text="".join(self.text),
            tool_calls=[self._call(i, p) for i, p in sorted(self.calls.items())],
            usage=self.usage,
            stop_reason=self.finish_reason,
            # recorded for people and replay; not sent back (those servers ask not to)
            reasoning=[ReasoningPart(provider="openai-chat", text="".join(self.reasoning))] if self.reasoning else [],
        )

    def _call(self, index: int, partial: _PartialCall) -> ToolCall:
        if not partial.name:
            raise ModelProtocolError(f"tool call #{index} was streamed without a function name")
        raw = "".join(partial.arguments)
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as err:
            raise ModelProtocolError(
                f"arguments of tool call #{index} ({partial.name}) are not valid JSON ({err}): {raw[:200]!r}"
            ) from None
        if not isinstance(arguments, dict):
            raise ModelProtocolError(
                f"arguments of tool call #{index} ({partial.name}) are not a JSON object: {raw[:200]!r}"
            )
        call_id = partial.id or _derived_call_id(self.completion_id, index, partial.name, raw)
        return ToolCall(id=call_id, name=partial.name, arguments=arguments)


def _malformed(what: str, data: str) -> ModelProtocolError:
    return ModelProtocolError(f"malformed stream chunk ({what}): {data[:200]!r}")


def _derived_call_id(completion_id: str, index: int, name: str, raw: str) -> str:
    """Some compatible servers omit call ids; derive one from the completion instead of inventing it."""
    digest = hashlib.sha256(f"{completion_id}\0{index}\0{name}\0{raw}".encode()).hexdigest()[:24]
    return f"call_{digest}"


def _usage(usage: Any, data: str) -> Usage:
    if not isinstance(usage, dict):
        raise _malformed("usage is not an object", data)
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    if not isinstance(prompt, int) or not isinstance(completion, int):
        raise _malformed("usage token counts are not integers", data)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return Usage(input_tokens=prompt, output_tokens=completion,
                 cache_read_tokens=cached if isinstance(cached, int) else 0,
                 reasoning_tokens=reasoning if isinstance(reasoning, int) else 0)


# -- request mapping --------------------------------------------------------------------------------


def to_wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """agentlog messages as chat-completions messages. Internal messages are sent too: visibility
    governs what people see, not what the model sees."""
    wire: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                out["content"] = m.content or None
                out["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            wire.append(out)
        elif m.role == "tool":
            if not m.tool_call_id:
                raise ModelRequestRejected(f"tool message {m.id!r} has no tool_call_id")
            wire.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.parts:  # images and files: chat-completions content parts
            wire.append({"role": m.role, "content": [chat_part(p) for p in m.parts]})
        else:
            wire.append({"role": m.role, "content": m.content})
    return wire


def chat_part(p: ContentPart) -> dict[str, Any]:
    """A content part in Chat Completions' form (`text`, `image_url`, `file` with `file_data`)."""
    if p.type == "text":
        return {"type": "text", "text": p.text}
    if p.type == "image":
        return {"type": "image_url", "image_url": {"url": data_url(p)}}
    return {"type": "file", "file": {"filename": p.filename or "file", "file_data": data_url(p)}}


def to_wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    wire = []
    for t in tools:
        fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters}
        if t.description:
            fn["description"] = t.description
        wire.append({"type": "function", "function": fn})
    return wire


def build_body(
    model: str, messages: list[dict[str, Any]], tools: list[ToolSpec], options: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON body of one request. Options pass through; the streaming keys are ours."""
    body: dict[str, Any] = {**options, "model": model, "messages": messages}
    if tools:
        body["tools"] = to_wire_tools(tools)
    body["stream"] = True
    body["stream_options"] = {**(options.get("stream_options") or {}), "include_usage": True}
    return body
