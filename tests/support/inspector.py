"""Fixtures of the run inspector tests (no tests here): an app whose run changes state before it
waits for an approval and again after it, so the timeline has state diffs on both sides of the
human decision.

Agent `inspect`: calls `note` (no approval: sets `/note`), then `deploy` (PermissionPlugin ask ->
suspends; once approved sets `/deployed`), then answers "deployed".
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

from tests.gateway.test_http_write import until_status
from tests.support.http_write import Stack, open_stack

AGENT = "inspect"
#: What the scripted model thinks before its first call (the inspector shows it collapsed).
REASONING = "Before deploying I should take a note."


@tool
async def note(text: str, ctx: ToolContext) -> str:
    """Write a note into the thread state."""
    ctx.set("/note", text)
    return "noted"


@tool
async def deploy(env: str, ctx: ToolContext) -> str:
    """Deploy (needs approval); records where in the thread state."""
    ctx.set("/deployed", env)
    return f"deployed {env}"


def inspect_app(store: Any, note_tool: Any = note, system_prompt: str = "") -> Runtime:
    """The app; `note_tool` swaps in another `note`, `system_prompt` another prompt (changed apps)."""
    spec = AgentSpec(id=AGENT, model=AGENT, tools=["note", "deploy"], max_rounds=5, system_prompt=system_prompt,
                     plugins=[PermissionPlugin(ask=["deploy"])])
    model = ScriptedModel([Turn.tool("note", {"text": "first"}, reasoning=REASONING), Turn.tool("deploy", {"env": "prod"}),
                           Turn.text("deployed")], loop=True, position="conversation")
    return Runtime(store, agents=[spec], tools=[note_tool, deploy], models={AGENT: model})


async def waiting_run(s: Stack) -> dict[str, Any]:
    """Start an `inspect` run over HTTP and return its view once it waits for the approval."""
    resp = await s.client.post("/v1/runs", json={"agent_id": AGENT, "messages": "ship it"})
    assert resp.status == 202, await resp.text()
    return await until_status(s, (await resp.json())["run_id"], {"waiting"})


__all__ = ["AGENT", "REASONING", "Stack", "inspect_app", "open_stack", "until_status", "waiting_run"]
