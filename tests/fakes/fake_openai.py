"""A local fake of the OpenAI chat-completions API, scriptable per request, for client tests.

Runs on 127.0.0.1 on a free port. Each POST to `/v1/chat/completions` is recorded and answered by
the next scripted `Reply` (per model name first, then for any model), else by an `always` reply,
else with a 500. Hanging replies wait on an event that `close()` sets, so a test never leaks a
pending handler.

    async with FakeOpenAI() as fake:
        fake.script(Reply.error(429, retry_after="0"), Reply.text("hello world"))
        model = OpenAIChatModel("gpt-test", base_url=fake.url, api_key="k")
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from aiohttp import web


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model"))


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    model: str = "fake-model",
    choices: bool = True,
) -> str:
    """One `chat.completion.chunk` payload as JSON text."""
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}] if choices else [],
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    """The final chunk `stream_options.include_usage` asks for: no choices, just usage."""
    return chunk(
        choices=False,
        usage={
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    )


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass
class Reply:
    """How to answer one request.

    `events` are SSE data payloads sent in order (then `data: [DONE]` if `done`). `hang` makes the
    handler wait until the fake closes: before sending headers, or after that many events.
    `write_size` sends the body in pieces of that many bytes (to exercise line reassembly).
    """

    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    done: bool = True
    hang: Literal["before_headers"] | int | None = None
    write_size: int | None = None

    @classmethod
    def text(
        cls,
        text: str,
        *,
        chunks: int = 3,
        usage: tuple[int, int] | None = (7, 3),
        finish_reason: str = "stop",
    ) -> Reply:
        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _split(text, chunks)]
        events.append(chunk(finish_reason=finish_reason))
        if usage is not None:
            events.append(usage_chunk(*usage))
        return cls(events=events)

    @classmethod
    def tool_calls(
        cls,
        calls: list[tuple[str, str, str]],
        *,
        fragments: int = 3,
        text: str = "",
        usage: tuple[int, int] | None = (11, 5),
    ) -> Reply:
        """`calls` are (call_id, name, arguments JSON text); arguments arrive in `fragments` pieces."""
        events = [chunk({"role": "assistant", "content": text or None})]
        for index, (call_id, name, arguments) in enumerate(calls):
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _split(arguments, fragments):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        events.append(chunk(finish_reason="tool_calls"))
        if usage is not None:
            events.append(usage_chunk(*usage))
        return cls(events=events)

    @classmethod
    def error(cls, status: int, body: str | None = None, *, retry_after: str | None = None) -> Reply:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        payload = body if body is not None else json.dumps({"error": {"message": f"fake error {status}"}})
        return cls(status=status, body=payload, headers=headers)

    @classmethod
    def raw(cls, *events: str, done: bool = True) -> Reply:
        """Arbitrary SSE data payloads, e.g. a malformed chunk."""
        return cls(events=list(events), done=done)

    @classmethod
    def hanging(cls, after_events: int | None = None, *, events: list[str] | None = None) -> Reply:
        """Hang before the headers, or after sending `after_events` of `events`."""
        if after_events is None:
            return cls(hang="before_headers")
        return cls(events=list(events or []), hang=after_events)


class FakeOpenAI:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str | None, deque[Reply]] = {}
        self._always: dict[str | None, Reply] = {}
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- scripting ---------------------------------------------------------------------------------

    def script(self, *replies: Reply, model: str | None = None) -> None:
        """Queue replies, each used once, for requests naming `model` (or any model)."""
        self._queues.setdefault(model, deque()).extend(replies)

    def always(self, reply: Reply, *, model: str | None = None) -> None:
        """Answer every request (for `model`, or any) with `reply` once the queues are empty."""
        self._always[model] = reply

    def models_requested(self) -> list[str]:
        return [r.model for r in self.requests]

    def _next_reply(self, model: str | None) -> Reply:
        for key in (model, None):
            queue = self._queues.get(key)
            if queue:
                return queue.popleft()
            if key in self._always:
                return self._always[key]
        return Reply.error(500, "fake: no reply scripted")

    # -- server ------------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"
        return self.url

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.Response(status=400, text="fake: body is not JSON")
        self.requests.append(RecordedRequest(request.path, dict(request.headers), body))
        reply = self._next_reply(body.get("model"))
        if reply.hang == "before_headers":
            await self._release.wait()
            return web.Response(status=503, text="fake: released at shutdown")
        if reply.status != 200:
            return web.Response(
                status=reply.status, text=reply.body, headers=reply.headers, content_type="application/json"
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
        await resp.prepare(request)
        try:
            for n, event in enumerate(reply.events):
                if reply.hang == n:
                    await self._release.wait()
                    return resp
                await self._write(resp, f"data: {event}\n\n", reply.write_size)
            if isinstance(reply.hang, int) and reply.hang >= len(reply.events):
                await self._release.wait()
                return resp
            if reply.done:
                await self._write(resp, "data: [DONE]\n\n", reply.write_size)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away (timeouts do that)
        return resp

    @staticmethod
    async def _write(resp: web.StreamResponse, text: str, size: int | None) -> None:
        data = text.encode()
        step = size or len(data)
        for i in range(0, len(data), step):
            await resp.write(data[i : i + step])
