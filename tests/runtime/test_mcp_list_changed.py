"""MCP client: the tool list follows the server's. A real MCP server (tests/fakes/mcp_server.py, official
SDK, stdio subprocess) adds a tool at run time: a server that says so
(`notifications/tools/list_changed`, a `subscriptions/listen` event on 2026-07-28 sessions) is
re-listed at once, one that does not is found by the periodic `tools/list` (`refresh_s`); either
way the registered registries get the new tool, callable, with no explicit `refresh()`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlog.runtime.toolkits.mcp import McpServerConfig, McpToolset
from agentlog.runtime.tools import ToolContext, ToolRegistry

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")
TIMEOUT = 30
CTX = ToolContext(thread_id="t", run_id="r", call_id="c", agent_id="a", tool_name="x", state={})


def toolset(env: dict[str, str] | None = None, **kw: float) -> Iterator[McpToolset]:
    tools = McpToolset([McpServerConfig(name="test", command=sys.executable, args=[SERVER, "stdio"],
                                        timeout_s=20, env=env, **kw)]).start()
    try:
        yield tools
    finally:
        tools.close()


@pytest.fixture
def notified() -> Iterator[McpToolset]:
    yield from toolset()


@pytest.fixture
def slow_to_listen() -> Iterator[McpToolset]:
    """A server that serves `subscriptions/listen` only after a while (tests/fakes/mcp_server.py)."""
    yield from toolset(env={**os.environ, "MCP_TEST_SLOW_LISTEN": "1"})


@pytest.fixture
def periodic() -> Iterator[McpToolset]:
    yield from toolset(refresh_s=0.2)


async def test_list_changed_notification_relists_the_tools(notified: McpToolset) -> None:
    registry = notified.register(ToolRegistry())
    assert "mcp__test__later" not in registry
    async with asyncio.timeout(TIMEOUT):
        assert (await registry.get("mcp__test__unlock").invoke({}, CTX)).value == {"result": "unlocked"}
        await notified.wait_listed("mcp__test__later")
        assert "mcp__test__later" in registry
        assert (await registry.get("mcp__test__later").invoke({}, CTX)).value == {"result": "late"}


async def test_list_changed_by_a_call_is_listed_when_the_call_returns(notified: McpToolset) -> None:
    """The server says its list changed before it answers the call that changed it: the call
    returns once the registries have the new tool, so the next step or run can name it."""
    registry = notified.register(ToolRegistry())
    async with asyncio.timeout(TIMEOUT):
        assert (await registry.get("mcp__test__unlock").invoke({}, CTX)).value == {"result": "unlocked"}
        assert "mcp__test__later" in registry and "mcp__test__later" in notified.names()


async def test_a_change_right_after_start_is_heard_from_a_server_slow_to_listen(slow_to_listen: McpToolset) -> None:
    """The session counts as ready once its listen stream is acknowledged, and its tools are
    listed after that: a change made by the very first call, however slowly the server takes
    up the stream, is heard (subscribe, then list, as a log's follower does)."""
    registry = slow_to_listen.register(ToolRegistry())
    async with asyncio.timeout(TIMEOUT):
        assert (await registry.get("mcp__test__unlock").invoke({}, CTX)).value == {"result": "unlocked"}
        assert "mcp__test__later" in registry


async def test_list_changed_not_sent_is_found_by_the_periodic_refresh(periodic: McpToolset) -> None:
    registry = periodic.register(ToolRegistry())
    async with asyncio.timeout(TIMEOUT):
        assert (await registry.get("mcp__test__unlock").invoke({"quietly": True}, CTX)).value == {"result": "unlocked"}
        await periodic.wait_listed("mcp__test__quiet")
        assert (await registry.get("mcp__test__quiet").invoke({}, CTX)).value == {"result": "quiet"}


async def test_list_changed_without_periodic_refresh_does_not_find_a_quiet_tool(notified: McpToolset) -> None:
    """Without `refresh_s` only the server's word re-lists: a quietly added tool stays unknown
    until something (here the notifying `unlock`) triggers a listing, which then finds both."""
    registry = notified.register(ToolRegistry())
    async with asyncio.timeout(TIMEOUT):
        await registry.get("mcp__test__unlock").invoke({"quietly": True}, CTX)
        assert "mcp__test__quiet" not in registry
        await registry.get("mcp__test__unlock").invoke({}, CTX)
        await notified.wait_listed("mcp__test__later")
        assert "mcp__test__quiet" in registry
