"""MCP client: a configured server's resources and prompts usable by agents (`resources: true`,
`prompts: true`): two ordinary tools per server, `mcp__<server>__read_resource(uri)` and
`mcp__<server>__get_prompt(name, arguments)`, whose descriptions list what the server offers;
run by an agent on a real nats-server against the real MCP server (tests/fakes/mcp_server.py, stdio).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlog.runtime import AgentSpec, Runtime
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.toolkits.mcp import McpServerConfig, McpToolset
from agentlog.runtime.tools import ToolContext, ToolRegistry

from tests.support.runtime import store  # noqa: F401  (fixture)

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")
CTX = ToolContext(thread_id="t", run_id="r", call_id="c", agent_id="a", tool_name="x", state={})


@pytest.fixture
def toolset() -> Iterator[McpToolset]:
    tools = McpToolset([McpServerConfig(name="test", command=sys.executable, args=[SERVER, "stdio"], timeout_s=20,
                                        resources=True, prompts=True)]).start()
    try:
        yield tools
    finally:
        tools.close()


async def test_mcp_resources_and_prompts_are_tools(toolset: McpToolset) -> None:
    registry = toolset.register(ToolRegistry())
    read, prompt = registry.get("mcp__test__read_resource"), registry.get("mcp__test__get_prompt")
    assert "notes://release" in read.description and "review(path)" in prompt.description
    async with asyncio.timeout(30):
        assert (await read.invoke({"uri": "notes://release"}, CTX)).value == "1.4.2: faster resume"
        got = (await prompt.invoke({"name": "review", "arguments": {"path": "a.py"}}, CTX)).value
        assert got == [{"role": "user", "text": "Please review a.py."}]
        missing = await read.invoke({"uri": "notes://nope"}, CTX)
        assert missing.status == "error" and "read_resource failed" in (missing.error or "")


async def test_mcp_resource_read_by_an_agent_in_a_run(store: Any, toolset: McpToolset) -> None:
    registry = toolset.register(ToolRegistry())
    model = ScriptedModel([Turn.tool("mcp__test__read_resource", {"uri": "notes://release"}), "Read it."])
    agent = AgentSpec(id="reader", model="m", tools=["mcp__test__read_resource", "mcp__test__get_prompt"])
    rt = Runtime(store, agents=[agent], tools=registry, models={"m": model})
    async with asyncio.timeout(30):
        done = await (await rt.start("reader", "what is new?")).result()
    (call,) = done.run.calls.values()
    assert done.status == "done" and call.result == "1.4.2: faster resume"


def test_mcp_resources_and_prompts_are_opt_in() -> None:
    config = McpServerConfig(name="x", command="true")
    assert config.resources is False and config.prompts is False
