"""A cancel of a run blocked in a tool is recorded in the log (`RunCancelRequested`) before the
run stops, in both topologies: the cancel reaches the worker driving the run twice (a live
signal, then the queued command), and a run stopped by the signal alone ended `cancelled` with
no request in its log, which resume and `replay --verify` then could not explain."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.events import RunCancelRequested, RunFinished
from agentlog.eventlog.jetstream.store import JetStreamEventStore

from tests.support import forkserver
from tests.support.topology import PYTHONPATH, Deployment


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    hold = tmp_path / "hold"  # no thread released: `hold` blocks until the run is cancelled
    hold.mkdir()
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(hold)}}


async def _events(store: JetStreamEventStore, run_id: str) -> list[Any]:
    return [e for sc in [sc async for sc in store.read_run(run_id)] for e in sc.commit.events]


async def test_a_cancel_of_a_run_blocked_in_a_tool_is_recorded_and_verifies(deployment: Deployment) -> None:
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(60), aiohttp.ClientSession(deployment.http_url) as http:
            async with http.post("/v1/runs", json={"agent_id": "held", "messages": "go"}) as resp:
                assert resp.status == 202, await resp.text()
                run_id = (await resp.json())["run_id"]
            async for sc in store.follow((await resp.json())["thread_id"]):  # until the tool runs
                if any(type(e).__name__ == "ToolCallStarted" for e in sc.commit.events):
                    break
            async with http.post(f"/v1/runs/{run_id}/cancel", json={"reason": "enough"}) as resp:
                assert resp.status in (200, 202), await resp.text()
            async with http.get(f"/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
                await events.read()  # ends when the run has finished
            events_ = await _events(store, run_id)
        finished = [e for e in events_ if type(e) is RunFinished]
        assert finished and finished[0].termination.type == "cancelled", events_
        assert any(type(e) is RunCancelRequested for e in events_), events_
        verify = await asyncio.to_thread(
            forkserver.run, ["replay", run_id, "--verify", "--app", "tests.apps.serve_app:app", "--nats", deployment.nats_url],
            cwd=os.getcwd(), timeout=60,
            env={**os.environ, "PYTHONPATH": PYTHONPATH, "SERVE_APP_HOLD_DIR": deployment.env["SERVE_APP_HOLD_DIR"]})
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        await store.close()
