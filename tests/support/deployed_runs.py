"""Driving a run of a real deployment (tests/support/topology.py) the way a client does: start it over
HTTP, wait on the log until it pauses or ends (whichever process drives it), read its view."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from agentlog.cli.demo import follow_run
from agentlog.eventlog.events import StoredCommit
from agentlog.eventlog.jetstream.store import JetStreamEventStore

#: Generous: a run on a loaded 2-core machine. A bound, not a sync.
LIMIT = 60.0


async def start_and_settle(nats_url: str, http: aiohttp.ClientSession, body: dict[str, Any],
                           ) -> tuple[dict[str, Any], int, StoredCommit]:
    """POST `body` to `/v1/runs`, then follow the run's thread on the log until it suspends or
    finishes: (the 202's body, the seq that paused it, that commit)."""
    async with http.post("/v1/runs", json=body) as r:
        assert r.status == 202, await r.text()
        started: dict[str, Any] = await r.json()
    store = await JetStreamEventStore.connect(nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            seq, last = await follow_run(store, started["thread_id"], started["run_id"], 0, lambda _c: None)
    finally:
        await store.close()
    return started, seq, last
