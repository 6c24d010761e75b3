"""The deployments the end-to-end tests run (tests/support/topology.py) are what users run: a run goes
through each topology's HTTP API and its worker, and a killed process comes back on the same log.
Both ways the suite starts their processes: forked from the fork server (tests/support/forkserver.py, the
default) and as plain `python -m agentlog ...` subprocesses."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support import forkserver
from tests.support.topology import Deployment


@pytest.fixture(params=["forked", "plain"])
def spawn(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "plain":
        monkeypatch.setenv(forkserver.ENABLED_ENV, "0")
    return str(request.param)


@pytest.fixture
def deployment_options(tmp_path: Path, spawn: str) -> dict[str, object]:
    hold = tmp_path / "hold"
    hold.mkdir()
    # a short lease: the killed process's command is redelivered to the restarted one within it
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(hold), "AGENTLOG_WORKER_ACK_WAIT": "1"}}


async def _wait_status(http: aiohttp.ClientSession, url: str, run_id: str, seq: int, status: str) -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
                view = await resp.json()
            if resp.status == 200 and view["status"] == status:
                return view
            follow = f"{url}/v1/runs/{run_id}/events"
            async with http.get(follow, params={"follow": "true"}) as events:  # ends when the run pauses
                await events.read()


async def test_a_run_finishes_through_the_deployment_and_survives_a_kill(
        deployment: Deployment, deployment_options: dict[str, Any], spawn: str) -> None:
    started_as = forkserver.ForkedProcess if spawn == "forked" else subprocess.Popen
    assert all(isinstance(proc, started_as) for proc in deployment.procs.values()), deployment.procs
    hold = Path(deployment_options["env"]["SERVE_APP_HOLD_DIR"])
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{deployment.http_url}/v1/runs", json={"agent_id": "held", "messages": "go"}) as resp:
            assert resp.status == 202, await resp.text()
            accepted = await resp.json()
        (hold / accepted["thread_id"]).touch()  # the next process to drive the run may finish it
        deployment.kill()
        deployment.start()
        view = await _wait_status(http, deployment.http_url, accepted["run_id"], accepted["seq"], "done")
    assert view["run_id"] == accepted["run_id"], deployment.outputs()

