"""SSE fan-out: 200 concurrent followers of one run's events (`GET /v1/runs/{id}/events?follow=
true`) each receive every event of the run, in log order, live. Against what users run (`agentlog
serve`, and `agentlog gateway` + `agentlog worker`: the shared `protocol_deployment`), real aiohttp
clients. Synchronisation without sleeps: the run's first tool (`hold`, tests/apps/protocol_app.py)
waits for a file the test writes only once every follower has its stream open and has read the
history so far."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

from tests.apps.protocol_app import HOLD_DIR
from tests.support.http_stack import body, open_remote
from tests.support.topology import Deployment

FOLLOWERS = 200
LIMIT = 90


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


async def test_200_followers_receive_every_event_in_order(protocol_deployment: Deployment) -> None:
    async with asyncio.timeout(LIMIT), open_remote(protocol_deployment) as remote:
        accepted = await body(await remote.client.post("/v1/runs", json={"agent_id": "open", "messages": "fan: go"}),
                              202)
        release = HOLD_DIR / accepted["thread_id"]
        url = f"{remote.url}/v1/runs/{accepted['run_id']}/events?follow=true"
        ready, counter = asyncio.Event(), [0]
        connector = aiohttp.TCPConnector(limit=0)
        try:
            async with aiohttp.ClientSession(connector=connector) as http:
                followers = [asyncio.create_task(_follow(http, url, ready, counter)) for _ in range(FOLLOWERS)]
                await asyncio.wait({asyncio.ensure_future(ready.wait()), *followers},
                                   return_when=asyncio.FIRST_COMPLETED)
                assert ready.is_set(), [f.exception() for f in followers if f.done()]
                HOLD_DIR.mkdir(parents=True, exist_ok=True)
                release.touch()  # everything from here on reaches the followers live
                received = await asyncio.gather(*followers)
        finally:
            with contextlib.suppress(FileNotFoundError):
                release.unlink()
        events = [(str(p), e) for c in [c async for c in remote.store.read_run(accepted["run_id"])]
                  for p, e in c.positioned()]
    expected = [ident for ident, _e in events]
    assert type(events[-1][1]).__name__ == "RunFinished" and len(expected) > 20
    for ids in received:
        assert ids == expected
