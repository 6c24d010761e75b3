#!/usr/bin/env python
"""Chat Completions clients compared: agentlog's hand-written aiohttp client (`OpenAIChatModel`)
against the same API on the official `openai` SDK (`OpenAISDKChatModel`), both streaming from one
local server on loopback that answers with canned SSE streams (no network, no model).

Per client: the time to drain a whole streamed answer (request, every delta, the final
response) for a short answer (a few deltas) and a long one (`--deltas` deltas, plus a tool call),
interleaved request by request so both see the same machine. The client that wins decides which
one `openai:` ids use (see docs/guides/models.md).

Prints a table and, as its very last line, one JSON object: {"bench": "models", ...}.

    scripts/bench_models.py            # default run
    scripts/bench_models.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # agentlog from this checkout

from aiohttp import web
from rich.console import Console
from rich.table import Table

from agentlog.eventlog.events import Message
from agentlog.runtime.models import ModelRequest, OpenAIChatModel, OpenAISDKChatModel, ToolSpec, complete


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream_body(deltas: int, tool: bool) -> bytes:
    out = [_chunk({"role": "assistant", "content": ""})]
    out += [_chunk({"content": f"word{i} "}) for i in range(deltas)]
    if tool:
        args = json.dumps({"query": "x" * 40, "limit": 10})
        out += [_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                        "function": {"name": "search", "arguments": ""}}]})]
        out += [_chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 8]}}]})
                for i in range(0, len(args), 8)]
    out.append(_chunk({}, "tool_calls" if tool else "stop"))
    usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench", "choices": [],
             "usage": {"prompt_tokens": 50, "completion_tokens": deltas, "total_tokens": 50 + deltas}}
    out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


async def serve(bodies: dict[str, bytes]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(bodies[body["model"]])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bodies = {"short": stream_body(3, False), "long": stream_body(args.deltas, True)}
    runner, url = await serve(bodies)
    clients = {"aiohttp": OpenAIChatModel(base_url=url, api_key="k"),
               "sdk": OpenAISDKChatModel(base_url=url, api_key="k")}
    request = ModelRequest(model="", messages=[Message(id="u", role="user", content="hello")],
                           tools=[ToolSpec(name="search")])
    times: dict[tuple[str, str], list[float]] = {(c, k): [] for c in clients for k in bodies}
    try:
        for _ in range(args.warmup + args.requests):
            for kind in bodies:
                for name, client in clients.items():
                    t0 = time.perf_counter()
                    response = await complete(client, ModelRequest(model=kind, messages=request.messages,
                                                                   tools=request.tools))
                    times[(name, kind)].append(time.perf_counter() - t0)
                    assert response.usage.output_tokens > 0
    finally:
        await clients["aiohttp"].aclose()  # type: ignore[attr-defined]
        await clients["sdk"].aclose()  # type: ignore[attr-defined]
        await runner.cleanup()
    p50 = {key: statistics.median(v[args.warmup:]) * 1000 for key, v in times.items()}
    table = Table(title=f"Chat Completions clients, p50 ms per streamed answer ({args.requests} requests each)")
    for column in ("answer", "aiohttp client", "openai SDK", "SDK / aiohttp"):
        table.add_column(column)
    for kind in bodies:
        table.add_row(f"{kind} ({'3' if kind == 'short' else args.deltas} deltas)", f"{p50[('aiohttp', kind)]:.3f}",
                      f"{p50[('sdk', kind)]:.3f}", f"{p50[('sdk', kind)] / p50[('aiohttp', kind)]:.2f}")
    Console().print(table)
    return {
        "bench": "models", "quick": args.quick, "requests": args.requests, "deltas": args.deltas,
        "aiohttp_short_p50_ms": round(p50[("aiohttp", "short")], 3), "sdk_short_p50_ms": round(p50[("sdk", "short")], 3),
        "aiohttp_long_p50_ms": round(p50[("aiohttp", "long")], 3), "sdk_long_p50_ms": round(p50[("sdk", "long")], 3),
        "sdk_over_aiohttp_short": round(p50[("sdk", "short")] / p50[("aiohttp", "short")], 3),
        "sdk_over_aiohttp_long": round(p50[("sdk", "long")] / p50[("aiohttp", "long")], 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few requests (a contract check, not a measurement)")
    parser.add_argument("--requests", type=int, default=None, help="measured requests per client and answer")
    parser.add_argument("--deltas", type=int, default=200, help="text deltas of the long answer")
    ns = parser.parse_args()
    ns.requests = ns.requests or (20 if ns.quick else 300)
    ns.warmup = 3 if ns.quick else 20
    print(json.dumps(asyncio.run(main(ns))))
