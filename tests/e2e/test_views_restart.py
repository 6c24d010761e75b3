"""A killed gateway (`serve`, or `gateway` beside its workers) comes back with views that catch up
at once: what the log got while it was down, and what its runner had in flight when it died, is
readable right after the restart, and `/health` says how far the views are.

The runner reads the log from the position its views store (`agentlog.projections.feed`), so nothing of
the log is leased to a dead process: the restarted gateway writes the views as soon as the dead
one's writer lease has run out (`agentlog.projections.lease`, a few seconds), and reads the
position the views hold until then.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from agentlog.eventlog import Commit
from agentlog.eventlog.events import RunStarted, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM
from agentlog.gateway.adapters.a2a.push import SCAN_ACK_WAIT, SCAN_CONSUMER

from tests.support.topology import Deployment

#: Well above the writer lease's TTL (3 s); a bound, not a synchronisation.
CATCH_UP_BOUND = 15.0


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    hold = tmp_path / "hold"
    hold.mkdir()
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(hold)}}


def _gateway(deployment: Deployment) -> str:
    return "serve" if deployment.kind == "serve" else "gateway"


async def _read_run(http: aiohttp.ClientSession, url: str, run_id: str, seq: int) -> dict[str, Any]:
    """The run's view once it includes `seq` (each GET waits for it server-side, bounded)."""
    while True:
        async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
            if resp.status == 200:
                return await resp.json()
            assert resp.status in (404, 503), await resp.text()


async def test_views_catch_up_at_once_after_the_gateway_is_killed(deployment: Deployment) -> None:
    gateway = _gateway(deployment)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{deployment.http_url}/v1/runs", json={"agent_id": "held", "messages": "go"}) as resp:
            assert resp.status == 202, await resp.text()
            accepted = await resp.json()
        async with asyncio.timeout(30):
            await _read_run(http, deployment.http_url, accepted["run_id"], accepted["seq"])
        deployment.kill(gateway)

        nc = await nats.connect(deployment.nats_url)
        store = await JetStreamEventStore.connect(nc)
        try:
            # The log goes on while the gateway is down (another writer: here the test).
            late = Commit(commit_id="c-late", thread_id="t-late", run_id="r-late", ts=1,
                          events=[ThreadCreated(), RunStarted(run_id="r-late", agent_id="held")])
            written = await store.append(late, 0)

            deployment.start(gateway)
            async with asyncio.timeout(CATCH_UP_BOUND):
                view = await _read_run(http, deployment.http_url, "r-late", written.seq)
                assert view["thread_id"] == "t-late", deployment.outputs()
                # and the run started before the kill is still there
                await _read_run(http, deployment.http_url, accepted["run_id"], accepted["seq"])
                while True:
                    async with http.get(f"{deployment.http_url}/health") as resp:
                        health = await resp.json()
                    assert resp.status == 200, health
                    if not health["projection"]["catching_up"]:
                        break
            assert health["projection"]["applied_seq"] >= written.seq
            assert health["status"] in ("ok", "degraded"), health
            assert "projection_catching_up" not in [r["code"] for r in health["reasons"]], health
            # Nothing on the server holds the views back for a dead process: no consumer of the
            # events stream has messages out unacked, but the A2A push scan, whose lease of one
            # commit (a killed gateway may hold it) is bounded by a few seconds.
            consumers = await nc.jetstream().consumers_info(EVENTS_STREAM)
            held = [c.name for c in consumers if c.num_ack_pending and c.name != SCAN_CONSUMER]
            assert held == [], deployment.outputs()
            for consumer in consumers:
                if consumer.name == SCAN_CONSUMER:
                    assert consumer.config.ack_wait is not None and consumer.config.ack_wait <= SCAN_ACK_WAIT
        finally:
            await store.close()
            await nc.close()
