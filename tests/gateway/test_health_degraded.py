"""`/health` says `degraded`, with machine-readable reasons, while the views are catching up on
the log or failing to be written, and `ok` once they keep up (the real app, a real nats-server
and real KV views; the end-to-end restart is tests/e2e/test_views_restart.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import Commit, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner


class RefusingViews:
    """KV views whose writes are refused (a full disk, a lost bucket): reads still work."""

    def __init__(self, inner: KVViewStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put_views(self, threads: Any, runs: Any) -> None:
        raise OSError("no space left on device")


async def _health(client: TestClient) -> dict[str, Any]:
    resp = await client.get("/health")
    data = await resp.json()
    assert resp.status == 200, data
    return data


async def test_catching_up_then_ok_and_failing_writes(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    views = await KVViewStore.open(store.nc)
    for i in range(3):  # the log has commits no runner has applied (a gateway was down)
        await store.append(Commit(commit_id=f"c{i}", thread_id=f"t{i}", ts=1, events=[ThreadCreated()]), 0)
    runner = ProjectionRunner(store.nc, views, fetch_timeout=0.2)
    await runner.open()  # opened, not yet applying
    client = TestClient(TestServer(create_app(store, views, runner, settings=Settings()), host="127.0.0.1"))
    await client.start_server()
    try:
        async with asyncio.timeout(60):
            health = await _health(client)
            assert health["status"] == "degraded", health
            assert [r["code"] for r in health["reasons"]] == ["projection_catching_up"]
            assert health["projection"] == {"applied_seq": 0, "lag": 3, "catching_up": True, "writer": True}

            while await runner.step():
                pass
            health = await _health(client)
            assert health == {"status": "ok", "reasons": [], "nats": {"connected": True},
                              "projection": {"applied_seq": 3, "lag": 0, "catching_up": False, "writer": True}}

            runner.store = RefusingViews(views)
            await store.append(Commit(commit_id="c3", thread_id="t3", ts=1, events=[ThreadCreated()]), 0)
            while runner.failing is None:  # until the batch holding c3 is taken and refused
                try:
                    await runner.step()
                except OSError:
                    pass
            health = await _health(client)
            assert health["status"] == "degraded", health
            [reason] = health["reasons"]
            assert reason["code"] == "projection_failing" and "no space left" in reason["detail"], health
            assert health["projection"]["lag"] == 1

            runner.store = views  # writable again: the batch is read again and applied
            while runner.applied_seq < 4:
                await runner.step()
            assert (await _health(client))["status"] == "ok"
    finally:
        await client.close()
        await runner.stop()
        await store.close()
