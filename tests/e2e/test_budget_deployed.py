"""Cost and the `budget` stop condition as users reach them: a config-file agent with prices and
a budget, under `agentlog serve` and under `agentlog gateway` + `agentlog worker`. The run waits at
its budget (HTTP shows the ticket and the cost), a human extends it over `POST /v1/runs/{id}/inputs`,
it waits again at twice the budget, and a cancel there ends it `stopped` / budget."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.cli.demo import follow_run
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.support.topology import Deployment

LIMIT = 60

CONFIG = """\
version: 1
models:
  counter:
    type: scripted
    script:
      - {tool_calls: [{name: add, arguments: {a: 1, b: 1}}]}
      - {tool_calls: [{name: add, arguments: {a: 2, b: 2}}]}
      - {tool_calls: [{name: add, arguments: {a: 3, b: 3}}]}
      - done
    prices: {input: 1000, output: 1000}
tools: ["tests.apps.config_app:add"]
agents:
  - id: spender
    model: counter
    tools: [add]
    stop_conditions: [{type: budget, max_tokens: 1}]
"""


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    config = tmp_path / "budget.yaml"
    config.write_text(CONFIG)
    return {"app": str(config)}


async def settle(deployment: Deployment, http: aiohttp.ClientSession, thread_id: str, run_id: str,
                 after: int) -> tuple[int, dict[str, Any]]:
    """Wait (on the log) until the run waits or ends again, then read its view at least that far."""
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(LIMIT):
            seq, _ = await follow_run(store, thread_id, run_id, after, lambda _c: None)
    finally:
        await store.close()
    async with http.get(f"/v1/runs/{run_id}", params={"min_seq": str(seq)}) as r:
        assert r.status == 200, await r.text()
        return seq, await r.json()


async def decide(http: aiohttp.ClientSession, run_id: str, call_id: str, action: str) -> None:
    body = {"decisions": [{"target_id": call_id, "decision_id": f"{action}-{call_id}", "action": action,
                           "result": {"approved": action == "resume"}}]}
    async with http.post(f"/v1/runs/{run_id}/inputs", json=body) as r:
        assert r.status == 202, await r.text()


async def test_budget_waits_for_a_human_extend_then_cancel_deployed(deployment: Deployment) -> None:
    async with aiohttp.ClientSession(deployment.http_url) as http:
        async with http.post("/v1/runs", json={"agent_id": "spender", "messages": "add things"}) as r:
            assert r.status == 202, await r.text()
            started = await r.json()
        run_id, thread_id = started["run_id"], started["thread_id"]
        seq, view = await settle(deployment, http, thread_id, run_id, 0)
        assert view["status"] == "waiting", deployment.outputs()
        ticket = view["calls"]["budget-1"]["ticket"]
        assert ticket["action"] == "budget" and ticket["parameters"]["tokens"] >= 1
        assert view["cost"] > 0 and view["cost"] == pytest.approx(ticket["parameters"]["cost"])
        await decide(http, run_id, "budget-1", "resume")
        seq, view = await settle(deployment, http, thread_id, run_id, seq)
        assert view["status"] == "waiting" and view["calls"]["budget-2"]["ticket"]["action"] == "budget"
        await decide(http, run_id, "budget-2", "cancel")
        _, view = await settle(deployment, http, thread_id, run_id, seq)
        assert view["status"] == "done"
        assert view["termination"]["type"] == "stopped" and view["termination"]["code"] == "budget"
        async with http.get(f"/v1/threads/{thread_id}") as r:
            thread = await r.json()
        assert thread["cost"] == pytest.approx(view["cost"])
        # the gateway counts cost from the log it follows (whichever process ran the run)
        async with asyncio.timeout(LIMIT):
            while True:
                async with http.get("/metrics") as r:
                    text = await r.text()
                if "agentlog_run_cost_usd_count 1.0" in text:
                    break
                await asyncio.sleep(0.05)  # polling another process's endpoint, bounded above
        assert 'agentlog_model_cost_usd_total{model="counter"}' in text
