"""Local fakes of the Anthropic Messages, OpenAI Responses and Gemini APIs, on one aiohttp server
on loopback (port 0), each speaking its provider's wire format: SSE streams as the real services
send them, and their error bodies and headers. The official SDKs are pointed at it with base_url.

A test scripts provider-neutral `Answer`s; each request (whatever the provider) takes the next
one, rendered in that provider's format. Every request is recorded (path, headers, JSON body).

    async with FakeProviders() as fake:
        fake.script(Answer(text="hello"), Answer.failure(429, retry_after="0"))
        model = AnthropicModel("claude-test", base_url=fake.anthropic_url, api_key="k")
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web


@dataclass
class Answer:
    text: str = ""
    #: (name, arguments) of each tool call.
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0
    #: The answer hit its output token limit.
    truncated: bool = False
    status: int = 200
    error: str = ""
    error_code: str = ""
    retry_after: str | None = None
    #: Text pieces per answer (to see several deltas).
    pieces: int = 3
    #: Reasoning before the answer (Anthropic thinking, an OpenAI reasoning item, Gemini thoughts),
    #: with its signature / encrypted content.
    thinking: str = ""
    signature: str = "sig-1"

    @classmethod
    def failure(cls, status: int, message: str = "error", *, code: str = "", retry_after: str | None = None) -> Answer:
        return cls(status=status, error=message, error_code=code, retry_after=retry_after)

    @classmethod
    def overflow(cls) -> Answer:
        return cls(status=400, error="prompt is too long: 250000 tokens > 200000 maximum",
                   error_code="context_length_exceeded")

    def text_pieces(self) -> list[str]:
        if not self.text:
            return []
        size = max(1, -(-len(self.text) // self.pieces))
        return [self.text[i:i + size] for i in range(0, len(self.text), size)]




@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _b64_ok(data: Any, urlsafe: bool = False) -> bool:
    try:
        (base64.urlsafe_b64decode if urlsafe else base64.b64decode)(data)
    except (ValueError, TypeError):
        return False
    return isinstance(data, str) and bool(data)


def _data_url_ok(url: Any, prefix: str = "") -> bool:
    if not isinstance(url, str):
        return False
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        return head.startswith(prefix) and head.endswith(";base64") and _b64_ok(data)
    return url.startswith(("http://", "https://"))


def media_problems(path: str, body: dict[str, Any]) -> list[str]:
    """The image / file parts of a request that its API would refuse (the shapes of each API's
    reference): so a test passing through a fake proves the native form arrived."""
    out: list[str] = []
    if path.endswith("/messages"):  # Anthropic
        for m in body.get("messages", []):
            for b in m["content"] if isinstance(m.get("content"), list) else ():
                if b.get("type") in ("image", "document"):
                    src = b.get("source") or {}
                    ok = (src.get("type") == "base64" and isinstance(src.get("media_type"), str) and _b64_ok(src.get("data"))
                          and (b["type"] == "document" or src["media_type"].startswith("image/"))) or \
                        (src.get("type") == "url" and _data_url_ok(src.get("url")))
                    out += [] if ok else [f"anthropic: bad {b['type']} block {b}"]
    elif path.endswith("/responses"):
        for item in body.get("input", []):
            for c in item["content"] if isinstance(item.get("content"), list) else ():
                if c.get("type") == "input_image" and not _data_url_ok(c.get("image_url"), "image/"):
                    out.append(f"responses: bad input_image {c}")
                if c.get("type") == "input_file" and not (
                        (_data_url_ok(c.get("file_data")) and c.get("filename")) or _data_url_ok(c.get("file_url"))):
                    out.append(f"responses: bad input_file {c}")
    elif path.endswith("/chat/completions"):
        for m in body.get("messages", []):
            for c in m["content"] if isinstance(m.get("content"), list) else ():
                if c.get("type") == "image_url" and not _data_url_ok((c.get("image_url") or {}).get("url"), "image/"):
                    out.append(f"chat: bad image_url {c}")
                if c.get("type") == "file" and not _data_url_ok((c.get("file") or {}).get("file_data")):
                    out.append(f"chat: bad file {c}")
    elif "generateContent" in path:  # Gemini
        for content in body.get("contents", []):
            for part in content.get("parts", []):
                blob = part.get("inlineData")
                if blob is not None and not ((blob.get("mimeType") or blob.get("mime_type"))
                                             and _b64_ok(blob.get("data"), urlsafe=True)):
                    out.append(f"gemini: bad inlineData {blob}")
                ref = part.get("fileData")
                if ref is not None and not (ref.get("fileUri") or ref.get("file_uri")):
                    out.append(f"gemini: bad fileData {ref}")
    return out


class FakeProviders:
    def __init__(self) -> None:
        #: Malformed image / file parts the fakes refused (each API's native shape is checked).
        self.media_errors: list[str] = []
        self.answers: deque[Answer] = deque()
        self.always: Answer | None = None
        self.requests: list[Recorded] = []
        #: Models a test built against this fake, closed with it (tests' bookkeeping).
        self.clients: list[Any] = []
        #: Answers each request from what it holds (instead of the script), when set.
        self.responder: Callable[[Recorded], Answer] | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, *answers: Answer | str) -> None:
        self.answers.extend(Answer(text=a) if isinstance(a, str) else a for a in answers)

    @property
    def anthropic_url(self) -> str:
        return self.url

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def gemini_url(self) -> str:
        return self.url

    async def __aenter__(self) -> FakeProviders:
        app = web.Application()
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/{version}/models/{model}:streamGenerateContent", self._gemini)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _next(self, request: web.Request) -> Answer:
        body = await request.json()
        self.requests.append(Recorded(request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        problems = media_problems(request.path, body)
        if problems:  # what the real API answers to a malformed image or file: a 400
            self.media_errors += problems
            return Answer.failure(400, "; ".join(problems), code="invalid_request_error")
        if self.responder is not None:
            return self.responder(self.requests[-1])
        if self.answers:
            return self.answers.popleft()
        if self.always is not None:
            return self.always
        return Answer(status=500, error="fake: nothing scripted")

    @staticmethod
    def _headers(a: Answer) -> dict[str, str]:
        return {"retry-after": a.retry_after} if a.retry_after is not None else {}

    async def _stream(self, request: web.Request, frames: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for frame in frames:
            await resp.write(frame)
        await resp.write_eof()
        return resp

    # -- Anthropic Messages --------------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        a = await self._next(request)
        if a.status != 200:
            kind = {429: "rate_limit_error", 401: "authentication_error", 529: "overloaded_error"}.get(
                a.status, "invalid_request_error" if a.status < 500 else "api_error")
            return web.json_response({"type": "error", "error": {"type": kind, "message": a.error}},
                                     status=a.status, headers=self._headers(a))
        model = (await request.json())["model"]
        frames = [_sse("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": a.input_tokens - a.cache_read - a.cache_write, "output_tokens": 1,
                      "cache_read_input_tokens": a.cache_read, "cache_creation_input_tokens": a.cache_write}}})]
        index = 0
        if a.thinking:
            frames.append(_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            for piece in (a.thinking[: len(a.thinking) // 2], a.thinking[len(a.thinking) // 2:]):
                frames.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "thinking_delta", "thinking": piece}}))
            frames.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "signature_delta", "signature": a.signature}}))
            frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        if a.text:
            frames.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}}))
            for piece in a.text_pieces():
                frames.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "text_delta", "text": piece}}))
            frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        for n, (name, args) in enumerate(a.calls):
            frames.append(_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}}))
            raw = json.dumps(args)
            for part in (raw[: len(raw) // 2], raw[len(raw) // 2:]):
                frames.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "input_json_delta", "partial_json": part}}))
            frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        stop = "max_tokens" if a.truncated else ("tool_use" if a.calls else "end_turn")
        frames.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                             "usage": {"output_tokens": a.output_tokens}}))
        frames.append(_sse("message_stop", {"type": "message_stop"}))
        return await self._stream(request, frames)

    # -- OpenAI Responses ----------------------------------------------------------------------

    def _openai_error(self, a: Answer) -> web.Response:
        kind = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(a.status, a.error_code or "invalid_request_error")
        return web.json_response({"error": {"message": a.error, "type": "invalid_request_error", "param": None,
                                            "code": a.error_code or kind}}, status=a.status, headers=self._headers(a))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        a = await self._next(request)
        if a.status != 200:
            return self._openai_error(a)
        model = (await request.json())["model"]
        base = {"id": "resp_fake", "object": "response", "created_at": 0, "model": model, "output": [],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
        seq = iter(range(1000))
        frames = [_sse("response.created", {"type": "response.created", "sequence_number": next(seq),
                                            "response": {**base, "status": "in_progress"}})]
        output: list[dict[str, Any]] = []
        index = 0
        if a.thinking:
            item = {"type": "reasoning", "id": "rs_0", "summary": []}
            frames.append(_sse("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                              "item": item, "sequence_number": next(seq)}))
            frames.append(_sse("response.reasoning_summary_text.delta", {
                "type": "response.reasoning_summary_text.delta", "item_id": "rs_0", "output_index": index,
                "summary_index": 0, "delta": a.thinking, "sequence_number": next(seq)}))
            done = {**item, "summary": [{"type": "summary_text", "text": a.thinking}], "encrypted_content": a.signature}
            frames.append(_sse("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                             "item": done, "sequence_number": next(seq)}))
            output.append(done)
            index += 1
        if a.text:
            item = {"type": "message", "id": "msg_0", "role": "assistant", "status": "in_progress", "content": []}
            frames.append(_sse("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                              "item": item, "sequence_number": next(seq)}))
            for piece in a.text_pieces():
                frames.append(_sse("response.output_text.delta", {
                    "type": "response.output_text.delta", "item_id": "msg_0", "output_index": index,
                    "content_index": 0, "delta": piece, "logprobs": [], "sequence_number": next(seq)}))
            done = {**item, "status": "completed", "content": [{"type": "output_text", "text": a.text, "annotations": []}]}
            frames.append(_sse("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                             "item": done, "sequence_number": next(seq)}))
            output.append(done)
            index += 1
        for n, (name, args) in enumerate(a.calls):
            raw = json.dumps(args)
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
                    "arguments": "", "status": "in_progress"}
            frames.append(_sse("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                              "item": item, "sequence_number": next(seq)}))
            for part in (raw[: len(raw) // 2], raw[len(raw) // 2:]):
                frames.append(_sse("response.function_call_arguments.delta", {
                    "type": "response.function_call_arguments.delta", "item_id": f"fc_{n}", "output_index": index,
                    "delta": part, "sequence_number": next(seq)}))
            done = {**item, "arguments": raw, "status": "completed"}
            frames.append(_sse("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                             "item": done, "sequence_number": next(seq)}))
            output.append(done)
            index += 1
        usage = {"input_tokens": a.input_tokens, "input_tokens_details": {"cached_tokens": a.cache_read},
                 "output_tokens": a.output_tokens, "output_tokens_details": {"reasoning_tokens": a.reasoning},
                 "total_tokens": a.input_tokens + a.output_tokens}
        final = {**base, "output": output, "usage": usage}
        if a.truncated:
            frames.append(_sse("response.incomplete", {"type": "response.incomplete", "sequence_number": next(seq), "response": {
                **final, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}}))
        else:
            frames.append(_sse("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                                      "response": {**final, "status": "completed"}}))
        return await self._stream(request, frames)

    # -- OpenAI Chat Completions (for the SDK-vs-aiohttp bench and shared tests) ----------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        a = await self._next(request)
        if a.status != 200:
            return self._openai_error(a)
        model = (await request.json())["model"]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(None, {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        frames = [chunk({"role": "assistant", "content": ""})]
        frames += [chunk({"content": p}) for p in a.text_pieces()]
        for n, (name, args) in enumerate(a.calls):
            frames.append(chunk({"tool_calls": [{"index": n, "id": f"call_{n}", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args)}}]}))
        frames.append(chunk({}, "length" if a.truncated else ("tool_calls" if a.calls else "stop")))
        frames.append(_sse(None, {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                                  "choices": [], "usage": {"prompt_tokens": a.input_tokens, "completion_tokens": a.output_tokens,
                                                           "total_tokens": a.input_tokens + a.output_tokens}}))
        frames.append(b"data: [DONE]\n\n")
        return await self._stream(request, frames)

    # -- Gemini --------------------------------------------------------------------------------

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        a = await self._next(request)
        if a.status != 200:
            status = {429: "RESOURCE_EXHAUSTED", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}.get(
                a.status, "INVALID_ARGUMENT" if a.status < 500 else "INTERNAL")
            return web.json_response({"error": {"code": a.status, "message": a.error, "status": status}},
                                     status=a.status, headers=self._headers(a))
        frames = []
        if a.thinking:
            frames.append(self._gemini_chunk(a, [{"text": a.thinking, "thought": True,
                                                 "thoughtSignature": _b64(a.signature)}], False))
        pieces = a.text_pieces()
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1 and not a.calls
            frames.append(self._gemini_chunk(a, [{"text": piece}], last))
        if a.calls:
            parts = [{"functionCall": {"name": name, "args": args}, **({"thoughtSignature": _b64(f"{a.signature}-call")}
                                                                        if a.thinking else {})}
                     for name, args in a.calls]
            frames.append(self._gemini_chunk(a, parts, True))
        if not frames:
            frames.append(self._gemini_chunk(a, [{"text": ""}], True))
        return await self._stream(request, frames)

    @staticmethod
    def _gemini_chunk(a: Answer, parts: list[dict[str, Any]], last: bool) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-fake"}
        if last:
            candidate["finishReason"] = "MAX_TOKENS" if a.truncated else "STOP"
            body["usageMetadata"] = {
                "promptTokenCount": a.input_tokens, "candidatesTokenCount": a.output_tokens - a.reasoning,
                "cachedContentTokenCount": a.cache_read, "thoughtsTokenCount": a.reasoning,
                "totalTokenCount": a.input_tokens + a.output_tokens}
        return _sse(None, body)


class FakeProvidersThread:
    """The fake on its own event loop in a thread, for clients in other processes (a deployment's
    workers, a docs script): they reach it by URL while the test's own loop does other work.

        with FakeProvidersThread() as fake:
            fake.always = Answer(text="hello")
    """

    def __init__(self) -> None:
        self.fake = FakeProviders()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-providers")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.fake.__aenter__())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.fake.__aexit__(None, None, None))
        self._loop.close()

    def __enter__(self) -> FakeProviders:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fake providers server did not start")
        return self.fake

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def env(self) -> dict[str, str]:
        """Environment that points the provider SDKs (and agentlog's provider models) here."""
        f = self.fake
        return {"ANTHROPIC_BASE_URL": f.anthropic_url, "OPENAI_BASE_URL": f.openai_url,
                "GOOGLE_GEMINI_BASE_URL": f.gemini_url, "ANTHROPIC_API_KEY": "fake", "OPENAI_API_KEY": "fake",
                "GEMINI_API_KEY": "fake"}
