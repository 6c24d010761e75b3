"""`GET /v1/ops/queue` (the inspector's operations view) against what users run, `serve` and
`gateway` + `worker`: it reports the command queue, the workers' consumer and the dead letters; a
command no worker can read is dead-lettered and shows up there with its error code; a
tenant-scoped token is refused (the queue spans every tenant)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import nats
import pytest

from agentlog.runtime.workers.commands import COMMANDS_STREAM, WORKER_CONSUMER

from tests.support.topology import Deployment

ADMIN, TENANT = "ops-admin", "ops-tenant"


@pytest.fixture
def deployment_options() -> dict[str, object]:
    return {"app": "tests.apps.inspector_app:app", "tokens": f"{ADMIN},{TENANT}:acme"}


async def _queue(http: aiohttp.ClientSession, url: str, token: str = ADMIN) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{url}/v1/ops/queue", headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


async def test_ops_queue_reports_the_queue_workers_and_dead_letters(deployment: Deployment) -> None:
    url = deployment.http_url
    async with aiohttp.ClientSession() as http:
        status, report = await _queue(http, url)
        assert status == 200, report
        # a worker is consuming: its shared consumer exists (serve's own worker, or the split worker)
        assert report["workers"]["consumer"] == WORKER_CONSUMER
        assert report["commands"]["stream"] == COMMANDS_STREAM
        before = report["dead_letters"]["count"] if report["dead_letters"] else 0

        # a command no worker can read: dead-lettered at once (unreadable), never retried
        nc = await nats.connect(deployment.nats_url)
        try:
            js = nc.jetstream()
            await js.publish("agentlog.cmd.opsbroken", b"not a command")
            # read from the DLQ stream itself (a core subscriber can hear the letter before the
            # stream has stored it, and the report counts the stream)
            dead = await js.subscribe("agentlog.dlq.opsbroken", ordered_consumer=True)
            async with asyncio.timeout(60):
                await dead.next_msg(timeout=60)
        finally:
            await nc.close()
        status, report = await _queue(http, url)
        assert report["dead_letters"]["count"] == before + 1, report
        letter = report["dead_letters"]["recent"][0]
        assert letter["thread_id"] == "opsbroken" and letter["code"], letter
        assert letter["time"] and letter["error"], letter

        status, refused = await _queue(http, url, TENANT)
        assert status == 403 and refused["code"] == "tenant_scoped_token", refused
        async with http.get(f"{url}/v1/ops/queue") as resp:
            assert resp.status == 401
