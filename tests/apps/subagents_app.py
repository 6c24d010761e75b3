"""A sub-agent app for `agentlog replay --verify --app tests.apps.subagents_app:<attr>`: `boss`
delegates to `helper` (a child run), which calls `lookup`. `tampered` is the same app with a
`lookup` that answers differently (the child's replay diverges)."""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.toolkits.subagents import SubAgents


def _lookup(answer: str) -> Any:
    @tool(name="lookup")
    async def lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        return f"{key}={answer}"

    return lookup


def _app(answer: str) -> Any:
    def build(store: Any) -> Runtime:
        agents = [AgentSpec(id="boss", model="boss", tools=["agent_run"]),
                  AgentSpec(id="helper", model="helper", tools=["lookup"])]
        models = {
            "boss": ScriptedModel([Turn.tool("agent_run", {"agent_id": "helper", "prompt": "find x"}, id="c-run"),
                                   Turn.text("boss done")], position="conversation"),
            "helper": ScriptedModel([Turn.tool("lookup", {"key": "x"}), Turn.text("helper done")],
                                    position="conversation"),
        }
        rt = Runtime(store, agents=agents, tools=[_lookup(answer)], models=models)
        SubAgents().install(rt)
        return rt

    return build


app = _app("42")
tampered = _app("43")
