"""The projection runner recovers from a feed that died without telling: its ordered consumer
gone from the server (what nats-py leaves behind when it resets the consumer after missed idle
heartbeats, an event loop held up on a loaded machine, and fails to create the new one). Seen as
a fresh `agentlog gateway` whose views sat at seq 0 while reads with `min_seq` timed out (503).

The runner's idle checks see commits waiting past its cursor and open the feed again, rather than
waiting for nats-py's next reset (10 s and more), which the bounded wait below would not outlast."""

from __future__ import annotations

import asyncio
import json

from agentlog.eventlog import Commit
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import ThreadCreated, ThreadMetadataUpdated
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner

#: Below nats-py's own recovery (two missed 5 s heartbeats, then a new consumer); a bound, not a sync.
RECOVERY_BOUND = 6.0


async def _append(store: JetStreamEventStore, thread_id: str, event: object, version: int | None) -> int:
    commit = Commit(commit_id=new_id(), thread_id=thread_id, run_id=None, ts=now_ms(), events=[event])  # type: ignore[list-item]
    return (await store.append(commit, expected_version=version)).seq


async def _consumers(store: JetStreamEventStore) -> list[str]:
    reply = await store.nc.request(f"$JS.API.CONSUMER.NAMES.{EVENTS_STREAM}", b"{}", timeout=5)
    return list(json.loads(reply.data).get("consumers") or [])


async def test_a_feed_whose_consumer_is_gone_is_opened_again(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url, request_timeout=2.0, connect_timeout=5.0)
    try:
        views = await KVViewStore.open(store.nc)
        runner = ProjectionRunner(store.nc, views, fetch_timeout=0.1, stall_check_interval=0.2)
        async with runner:
            first = await _append(store, "stall", ThreadCreated(), 0)
            await runner.wait_for(first, timeout=RECOVERY_BOUND)
            # the feed's consumer disappears from the server; the client is not told
            (name,) = await _consumers(store)
            await store.nc.jetstream().delete_consumer(EVENTS_STREAM, name)
            second = await _append(store, "stall", ThreadMetadataUpdated(metadata={"n": 1}), first)
            async with asyncio.timeout(RECOVERY_BOUND + 1):
                await runner.wait_for(second, timeout=RECOVERY_BOUND)
            assert runner.feed_reopens == 1
            view = await views.get_thread("stall")
            assert view is not None and view.metadata == {"n": 1}
    finally:
        await store.close()
