"""Deferred tools (agentlog.runtime.agents.deferred): an agent's deferred tools are not offered to
the model until `tool_search` finds them; the promotion is a state patch of the search call, so it
holds for the thread's later inferences and runs, and a resume or replay reads it from the log.
Pure: the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.events import StatePatched
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, Tool, agent_catalog, tool
from agentlog.runtime.agents.deferred import MAX_RESULTS, PROMOTED_KEY, TOOL_SEARCH, search
from agentlog.runtime.config import ConfigError, build, parse_config
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.replay.verify import verify_run


def _catalog_tool(name: str, about: str) -> Tool:
    def run(x: int = 0) -> str:
        return f"{name}:{x}"

    return Tool.from_function(run, name=name, description=about)


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


CATALOG = [_catalog_tool(f"gh_issue_{i}", f"GitHub issue operation number {i}") for i in range(8)] + [
    _catalog_tool("gh_create_repo", "Create a GitHub repository"),
    _catalog_tool("weather_now", "Current weather for a city"),
]


def runtime(script: list[Any], **spec: Any) -> tuple[Runtime, ScriptedModel]:
    model = ScriptedModel(script)
    agent = AgentSpec(id="a", model=model, tools=["ping", *(t.name for t in CATALOG)],
                      deferred_tools=["gh_*", "weather_*"], **spec)
    return Runtime(MemoryEventStore(), agents=[agent], tools=[ping, *CATALOG], entropy=DeterministicEntropy()), model


def offered(model: ScriptedModel, k: int) -> list[str]:
    return [t.name for t in model.requests[k].tools]


async def test_deferred_tools_are_offered_only_once_tool_search_promotes_them() -> None:
    rt, model = runtime([Turn.tool(TOOL_SEARCH, {"query": "select:weather_now,nope"}),
                         Turn.tool("weather_now", {"x": 3}), "done"])
    result = await rt.run("a", "weather?")
    assert offered(model, 0) == ["ping", TOOL_SEARCH]
    system = model.requests[0].messages[0].content
    assert "Tools you can load with tool_search" in system and "weather_now" in system and "gh_issue_3" in system
    assert offered(model, 1) == ["ping", "weather_now", TOOL_SEARCH]
    assert "weather_now" not in model.requests[1].messages[0].content.split("not loaded yet): ")[1]
    (search_call,) = [c for c in result.run.calls.values() if c.name == TOOL_SEARCH]
    assert [t["name"] for t in search_call.result["tools"]] == ["weather_now"]
    assert search_call.details == {"promoted": ["weather_now"]}
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    patches = [e for sc in log for e in sc.commit.events if isinstance(e, StatePatched)]
    assert [(p.source, p.ops) for p in patches] == [
        (f"tool:{TOOL_SEARCH}", [{"op": "add", "path": f"/{PROMOTED_KEY}", "value": ["weather_now"]}])]
    assert result.termination.type == "natural_end"


async def test_deferred_tool_promotion_holds_for_the_threads_next_run() -> None:
    rt, model = runtime([Turn.tool(TOOL_SEARCH, {"query": "+create github"}), "found", "again"])
    first = await rt.run("a", "make a repo")
    await rt.run("a", "and now?", parent_run_id=first.run_id)
    assert "gh_create_repo" in offered(model, 2)
    assert "gh_issue_0" not in offered(model, 2)


@pytest.mark.parametrize("tools_from_log", [True, False])
async def test_deferred_tools_run_replays_from_the_log(tools_from_log: bool) -> None:
    rt, _ = runtime([Turn.tool(TOOL_SEARCH, {"query": "github issue"}), Turn.tool("gh_issue_2", {"x": 1}), "ok"],
                    tool_execution_mode="sequential")
    result = await rt.run("a", "issues")
    report = await verify_run(rt.store, result.run_id, rt, tools_from_log=tools_from_log)
    assert report.ok and report.inferences == 3
    assert (report.tools_from_log, report.tools_executed) == ((2, 0) if tools_from_log else (0, 2))


async def test_a_deferred_tool_called_without_a_search_still_runs() -> None:
    rt, model = runtime([Turn.tool("gh_issue_1", {"x": 2}), "ok"])
    result = await rt.run("a", "go")
    (call,) = result.run.calls.values()
    assert call.status == "succeeded" and call.result == "gh_issue_1:2"
    assert "gh_issue_1" not in offered(model, 1)  # still not promoted


def test_deferred_tool_search_by_keywords_and_by_name() -> None:
    catalog = [t.spec for t in CATALOG]
    names = lambda q: [t.name for t in search(catalog, q)]  # noqa: E731
    assert names("select:gh_issue_7, weather_now,gh_issue_7") == ["gh_issue_7", "weather_now"]
    assert len(names("github issue")) == MAX_RESULTS
    assert names("+create github") == ["gh_create_repo"]
    assert names("weather city") == ["weather_now"]
    assert names("+weather github") == ["weather_now"]
    assert names("zebra") == []
    assert search([ToolSpec(name="x", description="", parameters={})], "select:") == []


def test_deferred_tool_search_is_in_the_catalog_and_the_spec() -> None:
    rt, _ = runtime(["ok"])
    assert rt.agents.get("a").tools[-1] == TOOL_SEARCH
    (agent,) = agent_catalog(rt)
    assert {"name": TOOL_SEARCH, "category": "tools", "label": "Search tools"}.items() <= agent["tools"][-1].items()


def test_deferred_tools_from_a_config_file() -> None:
    base = ("models: {m: {type: scripted, script: [x]}}\ntools: ['tests.apps.config_app:add', "
            "'tests.apps.config_app:echo']\n")
    loaded = build(parse_config(base + "agents: [{id: a, model: m, tools: [add, echo], deferred_tools: [ec*]}]"))
    (spec,) = loaded.agents
    assert spec.tools == ["add", "echo", TOOL_SEARCH] and spec.deferred_tools == ["ec*"]
    with pytest.raises(ConfigError, match="deferred_tools"):
        build(parse_config(base + "agents: [{id: a, model: m, tools: [add], deferred_tools: [nothing_*]}]"))
