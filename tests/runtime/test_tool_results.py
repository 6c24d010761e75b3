"""What a tool's result carries besides its value: `details` (recorded, kept from the model),
`follow_up` messages (user messages after the step's tool results), and a tool's UI category and
label (the agent catalog). On the in-memory store: pure and fast; replay of each is verified."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallCompleted
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import (
    AgentSpec,
    DeterministicEntropy,
    Runtime,
    ToolContext,
    ToolError,
    ToolResult,
    agent_catalog,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run


@tool(category="search", label="Look something up")
def lookup(q: str) -> ToolResult:
    """Look `q` up."""
    return ToolResult.success(f"found {q}", details={"source": "https://example.test/" + q, "rows": 3},
                              follow_up=[f"Remember: {q} is spelled with care."])


@tool
def fetch(url: str, ctx: ToolContext) -> str:
    """Fetch a URL (details through the context)."""
    ctx.details({"status": 200, "url": url})
    ctx.follow_up("The page was fetched.")
    return "<html>"


@tool
def fails(ctx: ToolContext) -> str:
    """Always fails, with details."""
    ctx.details({"status": 503})
    raise ToolError("upstream down")


def runtime(mode: str = "parallel_streaming") -> tuple[Runtime, ScriptedModel]:
    model = ScriptedModel([Turn.tools(("lookup", {"q": "kea"}), ("fetch", {"url": "u"}), ("fails", {})), "done"])
    spec = AgentSpec(id="a", model=model, tools=["lookup", "fetch", "fails"], tool_execution_mode=mode)  # type: ignore[arg-type]
    return Runtime(MemoryEventStore(), agents=[spec], tools=[lookup, fetch, fails], entropy=DeterministicEntropy()), model


def completed(rt: Runtime, commits: list[Any]) -> dict[str, ToolCallCompleted]:
    return {e.call_id: e for sc in commits for e in sc.commit.events if isinstance(e, ToolCallCompleted)}


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming"])
async def test_details_are_recorded_and_kept_from_the_model(mode: str) -> None:
    rt, model = runtime(mode)
    result = await rt.run("a", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    calls = completed(rt, log)
    by_name = {c.name: c for c in result.run.calls.values()}
    assert by_name["lookup"].details == {"source": "https://example.test/kea", "rows": 3}
    assert by_name["fetch"].details == {"status": 200, "url": "u"}
    assert by_name["fails"].details == {"status": 503} and by_name["fails"].status == "failed"
    assert {c.details["status"] for c in calls.values() if c.details and "status" in c.details} == {200, 503}
    # the model saw the values and errors, never the details
    second = model.requests[1]
    text = " ".join(m.content for m in second.messages)
    assert "found kea" in text and "Error: upstream down" in text
    assert "example.test" not in text and "503" not in text and "rows" not in text


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming"])
async def test_follow_up_messages_come_after_the_steps_tool_results(mode: str) -> None:
    rt, model = runtime(mode)
    result = await rt.run("a", "go")
    second = model.requests[1]
    roles = [m.role for m in second.messages]
    # system-less agent: user, assistant (3 calls), 3 tool results, then the follow-ups
    assert roles == ["user", "assistant", "tool", "tool", "tool", "user", "user"], roles
    follow = [m.content for m in second.messages[-2:]]
    assert follow == ["Remember: kea is spelled with care.", "The page was fetched."]
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    recorded = {c.call_id: c.follow_up for c in completed(rt, log).values()}
    assert sorted(f for fs in recorded.values() if fs for f in fs) == sorted(follow)
    # replay answering the tools from the log asks for the same follow-ups
    report = await verify_run(rt.store, result.run_id, rt)
    assert report.ok and report.tools_from_log == 3


@pytest.mark.asyncio
async def test_a_tool_result_without_details_records_none() -> None:
    @tool
    def plain() -> int:
        """Plain."""
        return 1

    model = ScriptedModel([Turn.tool("plain"), "ok"])
    rt = Runtime(MemoryEventStore(), agents=[AgentSpec(id="a", model=model, tools=["plain"])], tools=[plain],
                 entropy=DeterministicEntropy())
    result = await rt.run("a", "go")
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    (done,) = completed(rt, log).values()
    assert done.details is None and done.follow_up is None
    assert b'"details"' not in __import__("msgspec").json.encode(done)  # omitted on the wire


def test_the_catalog_lists_a_tools_category_and_label() -> None:
    rt, _ = runtime()
    (agent,) = agent_catalog(rt)
    tools = {t["name"]: t for t in agent["tools"]}
    assert tools["lookup"]["category"] == "search" and tools["lookup"]["label"] == "Look something up"
    assert "category" not in tools["fetch"] and "label" not in tools["fetch"]
    # the model's view of the tool is unchanged
    assert set(lookup.spec.__struct_fields__) == {"name", "description", "parameters"}
