"""Test app for deployments (tests/support/topology.py): agent `cycler` asks for approval after every
answer, forever: a tool that is pending until a human decides, and a scripted model that calls
it again. One run then goes through as many approval cycles as a test drives (the shape of
scripts/bench_e2e.py's app)."""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, App, ToolContext, ToolResult, tool
from agentlog.runtime.models import ScriptedModel, Turn


@tool
def approve(why: str, ctx: ToolContext) -> Any:
    """Pending until a human decides, then approved."""
    if ctx.decision is None:
        return ToolResult.pending(f"t-{ctx.call_id}", resume_mode="pass_decision_to_tool")
    return "approved"


def ask_again(req: Any) -> Turn:
    """Ask for approval after every answer (call ids from the conversation: any process numbers alike)."""
    asked = sum(1 for m in req.messages if m.role == "assistant")
    return Turn.tool("approve", {"why": f"cycle {asked}"}, id=f"ask{asked}", text=f"asking approval #{asked}")


def app(_store: Any) -> App:
    agent = AgentSpec(id="cycler", model="cycler", tools=["approve"], tool_execution_mode="sequential",
                      max_rounds=100_000)
    return App(agents=[agent], tools=[approve], models={"cycler": ScriptedModel([ask_again], loop=True)})
