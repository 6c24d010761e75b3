"""Views that outgrow one KV value, as users run it (`agentlog serve`, and `agentlog gateway` +
`agentlog worker`): a run's results, or a thread's state, that fit their commits one by one but
not one view together.

A view over the server's max payload cannot be written, and the projection runner would retry
that batch for ever: no view of any run would move again. So the run view is written without
its oldest finished calls (`calls_elided` counts them), the thread view without its state
(`state_elided`, which the routes fold from the log), and the projections go on: the runs read
as done, the next run's reads see their writes, `/health` stays ok."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.apps.large_results_app import BLOB, READS
from tests.support.deployed_runs import start_and_settle
from tests.support.topology import Deployment


@pytest.fixture
def deployment_options() -> dict[str, object]:
    return {"app": "tests.apps.large_results_app:app"}


async def run_to_end(deployment: Deployment, http: aiohttp.ClientSession, agent_id: str) -> tuple[dict[str, Any], int]:
    """Start a run and wait on the log until it ends, then read its view at least that far (the
    read waits for the projections to reach the end: a stalled runner fails it)."""
    started, seq, _ = await start_and_settle(deployment.nats_url, http, {"agent_id": agent_id, "messages": "go"})
    async with http.get(f"/v1/runs/{started['run_id']}", params={"min_seq": str(seq)}) as r:
        assert r.status == 200, (await r.text(), deployment.outputs())
        return await r.json(), len(await r.read())


async def projections_go_on(deployment: Deployment, http: aiohttp.ClientSession) -> None:
    """The next run's read sees its end, and the server is healthy."""
    greeted, _ = await run_to_end(deployment, http, "greeter")
    assert greeted["status"] == "done" and greeted["calls_elided"] == 0
    async with http.get("/health") as r:
        health = await r.json()
    assert r.status == 200 and health["status"] == "ok", health


async def test_a_run_view_over_one_kv_value_leaves_out_its_oldest_calls_and_the_projections_go_on(
        deployment: Deployment) -> None:
    async with aiohttp.ClientSession(deployment.http_url) as http:
        view, size = await run_to_end(deployment, http, "reader")
        assert view["status"] == "done" and view["termination"]["type"] == "natural_end"
        assert view["calls_elided"] >= 1 and size < 1024 * 1024
        kept = [f"read{i}" for i in range(view["calls_elided"], READS)]
        assert list(view["calls"]) == kept  # the newest, whole
        assert all(view["calls"][c]["result"] == c[-1] * BLOB for c in kept)

        await projections_go_on(deployment, http)


async def test_a_thread_state_over_one_kv_value_is_read_from_the_log_and_the_projections_go_on(
        deployment: Deployment) -> None:
    async with aiohttp.ClientSession(deployment.http_url) as http:
        view, _ = await run_to_end(deployment, http, "noter")
        assert view["status"] == "done" and view["calls_elided"] == 0
        notes = {f"note{i}": str(i) * BLOB for i in range(READS)}
        thread_id = view["thread_id"]
        async with http.get(f"/v1/threads/{thread_id}", params={"min_seq": str(view["last_seq"])}) as r:
            assert r.status == 200, await r.text()
            thread = await r.json()
        assert thread["state"] == notes and thread["state_elided"] is False  # folded from the log
        async with http.get(f"/v1/threads/{thread_id}/state") as r:
            assert r.status == 200 and (await r.json())["state"] == notes
        await projections_go_on(deployment, http)
