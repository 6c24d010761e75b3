"""App of the inspector's end-to-end tests (`agentlog serve|gateway|worker --app tests.apps.inspector_app:app`):
the demo's agents (a `deployer` whose `deploy` waits for approval, after a `checker` sub-agent ran
the checks) plus `release`, whose one tool asks a human a structured question.

`ask_release` suspends with a ticket whose `response_schema` has an enum, an integer, a string
and a boolean; the human's answer becomes the tool's result (`use_decision_as_tool_result`), so
the test reads back exactly what the inspector's form sent.
"""

from __future__ import annotations

from typing import Any

from agentlog.cli.demo import demo_app
from agentlog.runtime import AgentSpec, App, ToolResult, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn

RELEASE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "enum": ["staging", "prod"], "description": "where it goes"},
        "replicas": {"type": "integer"},
        "note": {"type": "string"},
        "urgent": {"type": "boolean"},
    },
    "required": ["target", "replicas"],
}


@tool
def ask_release() -> Any:
    """Ask the operator where and how to release (the answer is the result)."""
    return ToolResult.pending("release-plan", action="input", message="Where should 1.4.2 go, and how many replicas?",
                              response_schema=RELEASE_SCHEMA, resume_mode="use_decision_as_tool_result")


def app(_store: Any) -> App:
    base = demo_app()
    spec = AgentSpec(id="release", model="release", tools=["ask_release"], max_rounds=3)
    model = ScriptedModel([Turn.tool("ask_release"), Turn.text("Release plan recorded.")], loop=True,
                          position="conversation")
    return App(agents=[*base.agents, spec], tools=[*base.tools, ask_release], models={**base.models, "release": model})
