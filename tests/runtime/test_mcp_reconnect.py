"""A stdio MCP server that exits or stops answering is started again with backoff: the call in
flight fails once with an error saying so, later calls go to the new server, and `/health` and
`/metrics` show each server's state. Against the real MCP test server (tests/fakes/mcp_server.py) and,
end to end, through `agentlog serve` and `agentlog gateway` + `agentlog worker`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from agentlog.eventlog import JetStreamEventStore
from agentlog.eventlog.events import RunFinished, ToolCallCompleted
from agentlog.runtime.toolkits.mcp import McpServerConfig, McpToolset, mcp_health
from agentlog.runtime.tools import ToolContext, ToolRegistry

from tests.support.topology import Deployment

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")


def config(timeout_s: float = 30) -> McpServerConfig:
    return McpServerConfig(name="test", command=sys.executable, args=[SERVER, "stdio"], timeout_s=timeout_s)


def ctx() -> ToolContext:
    return ToolContext(thread_id="t", run_id="r", call_id="c", agent_id="a", tool_name="x", state={})


async def test_a_crashed_or_killed_server_is_restarted_and_later_calls_work() -> None:
    toolset = McpToolset([config()], ping_interval=0.5)
    await toolset.astart()
    try:
        tools = toolset.register(ToolRegistry())
        pid, crash = tools.get("mcp__test__pid"), tools.get("mcp__test__crash")
        async with asyncio.timeout(120):
            first = (await pid.invoke({}, ctx())).value["result"]
            died = await crash.invoke({}, ctx())  # the server exits mid-call
            assert died.status == "error" and "was lost during tools/call 'crash'" in (died.error or ""), died
            assert "not retried" in (died.error or "")
            second = (await pid.invoke({}, ctx())).value["result"]  # waits for the restart
            assert second != first
            assert toolset.health()["test"]["status"] == "ok" and toolset.health()["test"]["restarts"] == 1
            assert mcp_health()["test"]["restarts"] == 1

            os.kill(second, signal.SIGKILL)  # dies between calls: a ping or the next call finds out
            failures = 0
            while True:
                answer = await pid.invoke({}, ctx())
                if answer.status == "success":
                    break
                failures += 1
                assert failures == 1 and "was lost" in (answer.error or ""), answer
            assert answer.value["result"] not in (first, second)
            assert toolset.health()["test"]["restarts"] == 2
    finally:
        await toolset.aclose()
    assert mcp_health() == {}


async def test_a_server_that_stops_answering_is_restarted() -> None:
    # the hung call is given up after `timeout_s`: long enough for a restart on a loaded machine
    toolset = McpToolset([config(timeout_s=5)])
    await toolset.astart()
    try:
        tools = toolset.register(ToolRegistry())
        async with asyncio.timeout(120):
            before = (await tools.get("mcp__test__pid").invoke({}, ctx())).value["result"]
            hung = await tools.get("mcp__test__hang").invoke({}, ctx())
            assert hung.status == "error" and "was lost during tools/call 'hang'" in (hung.error or ""), hung
            after = (await tools.get("mcp__test__pid").invoke({}, ctx())).value["result"]
        assert after != before and toolset.health()["test"]["restarts"] == 1
    finally:
        await toolset.aclose()


# -- through what users run ------------------------------------------------------------------------

CONFIG = """
models:
  main:
    type: scripted
    script:
      - tool_calls: [{{name: mcp__calc__crash, arguments: {{}}}}]
      - tool_calls: [{{name: mcp__calc__pid, arguments: {{}}}}]
      - done
mcp_servers:
  - {{name: calc, command: {python}, args: [{server}, stdio], timeout_s: 30}}
agents:
  - id: crasher
    model: main
    tools: ["mcp__calc__*"]
    max_rounds: 5
"""


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "agents.yaml"
    path.write_text(CONFIG.format(python=json.dumps(sys.executable), server=json.dumps(SERVER)))
    return {"app": str(path)}


async def test_a_run_survives_its_mcp_server_crashing(deployment: Deployment) -> None:
    url = deployment.http_url
    store = await JetStreamEventStore.connect(deployment.nats_url)
    async with store, aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/runs", json={"agent_id": "crasher", "messages": "go"}) as resp:
            assert resp.status == 202, await resp.text()
            accepted = await resp.json()
        outcomes: list[ToolCallCompleted] = []
        async with asyncio.timeout(120):
            async for stored in store.follow(accepted["thread_id"]):
                outcomes += [e for e in stored.commit.events if isinstance(e, ToolCallCompleted)]
                ends = [e for e in stored.commit.events if isinstance(e, RunFinished)]
                if ends:
                    break
        assert ends[0].termination.type == "natural_end", deployment.outputs()
        crashed, later = outcomes
        assert crashed.outcome == "failed" and "was lost during tools/call 'crash'" in crashed.result["error"]
        assert later.outcome == "succeeded", later
        if deployment.kind == "serve":  # the MCP servers run in this process: its health shows them
            async with http.get(f"{url}/health") as resp:
                body = await resp.json()
            assert body["mcp"]["calc"]["restarts"] == 1 and body["mcp"]["calc"]["status"] == "ok", body
            assert body["status"] == "ok", body
            async with http.get(f"{url}/metrics") as resp:
                text = await resp.text()
            assert 'agentlog_mcp_server_restarts_total{server="calc"} 1.0' in text, text
            assert 'agentlog_mcp_server_up{server="calc"} 1.0' in text, text
