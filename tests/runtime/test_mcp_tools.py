"""MCP client tools against a real MCP server (tests/fakes/mcp_server.py, official SDK), started by the
test as a stdio subprocess and as a streamable-HTTP server on 127.0.0.1; runs on a real
nats-server. Covers: tool ids, results in the log, live progress, permission ask + approve then
the MCP call, `tools/list` refresh, typed failures, verified replay (re-executed and from log).
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentlog.runtime import AgentSpec, App, DeterministicEntropy, PermissionPlugin, Runtime
from agentlog.runtime.live import NatsLiveSink
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.toolkits.mcp import McpError, McpServerConfig, McpToolset
from agentlog.runtime.tools import ToolRegistry

from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

#: These tests prove re-executed tools are checked: opt in to re-execution (the default answers
#: every tool from the log, see tests/cli/test_cli_replay.py); an explicit `tools_from_log=` still wins.
verify_run = functools.partial(verify_run, tools_from_log=False)

pytestmark = pytest.mark.asyncio

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")


def stdio_config(name: str = "test") -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=[SERVER, "stdio"], timeout_s=20)


@pytest.fixture
def stdio_tools() -> Iterator[McpToolset]:
    toolset = McpToolset([stdio_config()]).start()
    try:
        yield toolset
    finally:
        toolset.close()


@pytest.fixture
def http_url() -> Iterator[str]:
    """The test server on streamable HTTP, 127.0.0.1 only: it binds a free port and reports it
    once it listens (tests/fakes/mcp_server.py), so the fixture waits on that line, not on time."""
    proc = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().decode().strip()
        if not port.isdigit():
            raise RuntimeError(f"the MCP HTTP server did not report a port (exit {proc.wait(10)})")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def agent(tools: list[str], script: list[Any], **kw: Any) -> AgentSpec:
    return AgentSpec(id="agent", model=ScriptedModel(script, position="conversation"), tools=tools,
                     max_rounds=6, **kw)


async def test_stdio_tools_listed_called_recorded_with_progress(store: Any, stdio_tools: McpToolset) -> None:
    assert sorted(stdio_tools.names()) == [
        "mcp__test__add", "mcp__test__count", "mcp__test__crash", "mcp__test__fail", "mcp__test__hang",
        "mcp__test__pid", "mcp__test__shout", "mcp__test__unlock"]
    add = next(t for t in stdio_tools.tools if t.name == "mcp__test__add")
    assert add.spec.parameters["required"] == ["a", "b"]  # the server's inputSchema, offered to the model
    # MCP progress notifications arrive on the live channel (core NATS agentlog.live.<thread>.<run>)
    progress: list[dict[str, Any]] = []
    all_progress = asyncio.Event()

    async def on_live(msg: Any) -> None:
        payload = msgspec.json.decode(msg.data)
        if payload["type"] == "tool_progress":
            progress.append(payload["data"])
            if len(progress) == 3:
                all_progress.set()

    sub = await store.nc.subscribe("agentlog.live.>", cb=on_live)
    await store.nc.flush()
    script = [Turn.tools(("mcp__test__add", {"a": 2, "b": 3}), ("mcp__test__count", {"n": 3})), "done"]
    spec = agent(["mcp__test__add", "mcp__test__count"], script)
    try:
        async with NatsLiveSink(store.nc) as live:
            rt = Runtime(store, agents=[spec], tools=stdio_tools.register(ToolRegistry()), live=live,
                         entropy=DeterministicEntropy())
            async with asyncio.timeout(30):
                result = await rt.run("agent", "go")
                log = await logged(rt, result)
                await all_progress.wait()
    finally:
        await sub.unsubscribe()
    assert result.termination.type == "natural_end"
    done = {e.call_id: e for e in events_of(log, "ToolCallCompleted")}
    assert [(e.outcome, e.result) for e in done.values()] == [
        ("succeeded", {"sum": 5}), ("succeeded", {"result": "counted to 3"})]
    assert [(p["progress"], p["total"], p["message"]) for p in progress] == [
        (1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]
    # verified replay: re-executing the MCP tools, and answering them from the log
    for from_log in (False, True):
        async with asyncio.timeout(30):
            report = await verify_run(store, result.run_id, App(agents=[spec], tools=stdio_tools.tools),
                                      tools_from_log=from_log)
        assert report.ok, report.divergence
        assert (report.tools_from_log, report.tools_executed) == ((2, 0) if from_log else (0, 2))


async def test_http_server_tool_call(store: Any, http_url: str) -> None:
    toolset = await McpToolset([McpServerConfig(name="web", url=http_url, timeout_s=20)]).astart()
    try:
        spec = agent(["mcp__web__shout"], [Turn.tool("mcp__web__shout", {"text": "hi"}), "done"])
        rt = Runtime(store, agents=[spec], tools=toolset.tools, entropy=DeterministicEntropy())
        async with asyncio.timeout(30):
            result = await rt.run("agent", "go")
            log = await logged(rt, result)
            report = await verify_run(store, result.run_id, App(agents=[spec], tools=toolset.tools))
        assert [(e.outcome, e.result) for e in events_of(log, "ToolCallCompleted")] == [
            ("succeeded", {"result": "HI"})]
        assert report.ok and report.tools_executed == 1
    finally:
        await toolset.aclose()


async def test_permission_ask_then_approve_runs_the_mcp_call(store: Any, stdio_tools: McpToolset) -> None:
    spec = agent(["mcp__test__add"], [Turn.tool("mcp__test__add", {"a": 1, "b": 1}), "done"],
                 plugins=[PermissionPlugin(ask=["mcp__*"])])
    rt = Runtime(store, agents=[spec], tools=stdio_tools.tools, entropy=DeterministicEntropy())
    async with asyncio.timeout(30):
        waiting = await rt.run("agent", "go")
        assert waiting.status == "waiting"
        log = await logged(rt, waiting)
        assert events_of(log, "ToolCallCompleted") == []  # nothing ran before the human said so
        assert [g.verdict for g in events_of(log, "ToolCallGated")] == ["ask"]
        call_id = events_of(log, "ToolCallSuspended")[0].call_id
        res = await rt.decide(waiting.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                "result": {"approved": True}}])
        final = await res.handle.result()
        log = await logged(rt, final)
        report = await verify_run(store, waiting.run_id, App(agents=[spec], tools=stdio_tools.tools))
    assert final.termination.type == "natural_end"
    assert [(e.outcome, e.result) for e in events_of(log, "ToolCallCompleted")] == [("succeeded", {"sum": 2})]
    assert report.ok, report.divergence


async def test_refresh_lists_tools_added_at_run_time(stdio_tools: McpToolset) -> None:
    registry = stdio_tools.register(ToolRegistry())
    assert "mcp__test__later" not in registry
    unlock = registry.get("mcp__test__unlock")
    from agentlog.runtime.tools import ToolContext

    ctx = ToolContext(thread_id="t", run_id="r", call_id="c", agent_id="a", tool_name="x", state={})
    async with asyncio.timeout(20):
        assert (await unlock.invoke({}, ctx)).value == {"result": "unlocked"}
        names = await stdio_tools.refresh()
        assert "mcp__test__later" in names and "mcp__test__later" in registry
        assert (await registry.get("mcp__test__later").invoke({}, ctx)).value == {"result": "late"}


async def test_bad_arguments_and_tool_errors_are_typed_results(store: Any, stdio_tools: McpToolset) -> None:
    script = [Turn.tools(("mcp__test__add", {"a": "x"}), ("mcp__test__fail", {"reason": "nope"})), "done"]
    spec = agent(["mcp__test__add", "mcp__test__fail"], script)
    rt = Runtime(store, agents=[spec], tools=stdio_tools.tools, entropy=DeterministicEntropy())
    async with asyncio.timeout(30):
        result = await rt.run("agent", "go")
        log = await logged(rt, result)
    assert result.termination.type == "natural_end"
    outcomes = [(e.outcome, e.result["error"]) for e in events_of(log, "ToolCallCompleted")]
    assert outcomes[0][0] == "failed" and "invalid arguments for tool 'mcp__test__add'" in outcomes[0][1]
    assert outcomes[1] == ("failed", "Error executing tool fail")


async def test_config_and_connect_errors_are_typed() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        McpServerConfig(name="x")
    with pytest.raises(ValueError, match="must match"):
        McpServerConfig(name="a_b", url="http://127.0.0.1:1/mcp")
    toolset = McpToolset([McpServerConfig(name="gone", command=sys.executable, args=["-c", "pass"], timeout_s=10)])
    try:
        with pytest.raises(McpError, match="'gone': could not connect"):
            await toolset.astart()
    finally:
        await toolset.aclose()
