"""What an operator meets first, against real processes: the banner of `serve` and `gateway` names
the inspector (`/ui`) and the API docs (`/docs`); `serve` on a taken port says how to get a free
one; the demo agent (the default app of `serve`) does not claim a deploy a human turned down."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer

from tests.support.topology import Deployment


@pytest.fixture
def deployment_options() -> dict[str, object]:
    return {"app": "agentlog.cli.demo:app"}


async def _until(http: aiohttp.ClientSession, url: str, run_id: str, seq: int, status: str) -> dict[str, Any]:
    """The run's view once it has `status`: read it, and while it is not there follow its events
    (the follow ends when the run pauses or ends)."""
    async with asyncio.timeout(60):
        while True:
            async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
                view = await resp.json()
            if resp.status == 200 and view["status"] == status:
                return view
            async with http.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
                await events.read()


async def test_the_banner_and_the_demo_agent_after_a_denial(deployment: Deployment) -> None:
    # the banner names the inspector and the API docs of this very server
    out = deployment.output("serve" if deployment.kind == "serve" else "gateway")
    assert f"{deployment.http_url}/ui" in out and f"{deployment.http_url}/docs" in out, out
    # the demo agent (the default app of serve) does not claim a deploy a human turned down
    url = deployment.http_url
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/runs", json={"agent_id": "deployer",
                                                     "messages": "Ship release 1.4.2 to staging."}) as resp:
            assert resp.status == 202, await resp.text()
            started = await resp.json()
        run_id = started["run_id"]
        waiting = await _until(http, url, run_id, started["seq"], "waiting")
        (call,) = [c for c, v in waiting["calls"].items() if v["status"] == "suspended"]
        deny = {"decisions": [{"target_id": call, "decision_id": "no-1", "action": "resume",
                               "result": {"approved": False}}]}
        async with http.post(f"{url}/v1/runs/{run_id}/inputs", json=deny) as resp:
            assert resp.status == 202, await resp.text()
            decided = await resp.json()
        await _until(http, url, run_id, decided["seq"], "done")
        async with http.get(f"{url}/v1/threads/{started['thread_id']}/messages") as resp:
            messages = [m["message"] for m in (await resp.json())["messages"]]
    last = messages[-1]
    assert last["role"] == "assistant", messages
    assert "is live" not in last["content"] and "Not deployed" in last["content"], last
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/threads/{started['thread_id']}/state") as resp:
        assert "deployed" not in (await resp.json())["state"], deployment.outputs()


def test_serve_on_a_busy_port_suggests_port_0(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # held for the whole test: the port is busy, not guessed free
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "agentlog", "serve", "--nats", nats_server.url,
                               "--host", "127.0.0.1", "--port", str(port)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error [port_busy]" in proc.stderr and "--port 0" in proc.stderr, proc.stderr
    assert "internal" not in proc.stderr, proc.stderr
