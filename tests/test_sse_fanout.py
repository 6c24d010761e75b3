"""SSE fan-out: 200 concurrent followers of one run's events (`GET /v1/runs/{id}/events?follow=
true`) each receive every event of the run, in log order, live. Real server (`agentlog.cli.server`),
real aiohttp clients. Synchronisation without sleeps: the run's first tool blocks on an event
the test sets only once every follower has its stream open and has read the history so far."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from agentlog.cli.server import ServerConfig, serve
from agentlog.gateway.operations.app_loader import App
from agentlog.gateway.operations.connection import ConnectionOptions
from agentlog.runtime import AgentSpec, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

FOLLOWERS = 200
LIMIT = 90
_gates: dict[str, asyncio.Event] = {}


@tool
async def hold(ctx: ToolContext) -> str:
    """Wait until the test opens the gate (the run stays `running` meanwhile)."""
    _gates["entered"].set()
    await _gates["open"].wait()
    return "released"


@tool
async def work(k: int, ctx: ToolContext) -> str:
    """Some work that patches state (more events to deliver)."""
    ctx.set(f"/w{k}", k)
    return f"worked {k}"


def fanout_app(_store: Any) -> App:
    script = [
        Turn.tool("hold", {}),
        Turn.tools(("work", {"k": 1}), ("work", {"k": 2}), ("work", {"k": 3}), text="three at once"),
        Turn.tool("work", {"k": 4}),
        Turn.text("all done"),
    ]
    agent = AgentSpec(id="fan", model="m", tools=["hold", "work"], max_rounds=10)
    return App(agents=[agent], tools=[hold, work], models={"m": ScriptedModel(script, position="conversation")})


async def _follow(http: aiohttp.ClientSession, url: str, ready: asyncio.Event, counter: list[int]) -> list[str]:
    """Read one SSE stream to its end; returns the event ids. Signals `ready` once it has its
    first frame (the stream is open and the history is coming)."""
    ids: list[str] = []
    async with http.get(url, headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status == 200, await resp.text()
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                fields = dict(line.split(": ", 1) for line in block.decode().split("\n") if ": " in line
                              and not line.startswith(":"))
                if "id" in fields:
                    json.loads(fields["data"])
                    ids.append(fields["id"])
                    if len(ids) == 1:
                        counter[0] += 1
                        if counter[0] == FOLLOWERS:
                            ready.set()
    return ids


async def test_200_followers_receive_every_event_in_order(tmp_path: Path) -> None:
    _gates.update(entered=asyncio.Event(), open=asyncio.Event())
    config = ServerConfig(port=0, tokens="", app=fanout_app,
                          connection=ConnectionOptions(data_dir=tmp_path / "data"))
    async with asyncio.timeout(LIMIT), serve(config) as server:
        accepted = await server.dispatcher.start_run("fan", "go")
        await _gates["entered"].wait()  # the run is live, blocked in its first tool
        url = f"{server.http_url}/v1/runs/{accepted.run_id}/events?follow=true"
        ready, counter = asyncio.Event(), [0]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            followers = [asyncio.create_task(_follow(http, url, ready, counter)) for _ in range(FOLLOWERS)]
            await asyncio.wait({asyncio.ensure_future(ready.wait()), *followers},
                               return_when=asyncio.FIRST_COMPLETED)
            assert ready.is_set(), [f.exception() for f in followers if f.done()]
            _gates["open"].set()  # everything from here on reaches the followers live
            received = await asyncio.gather(*followers)
        assert server.store is not None
        events = [(str(p), e) for c in [c async for c in server.store.read_run(accepted.run_id)]
                  for p, e in c.positioned()]
    expected = [ident for ident, _e in events]
    assert type(events[-1][1]).__name__ == "RunFinished" and len(expected) > 20
    for ids in received:
        assert ids == expected
