"""Frontend tools (AG-UI `RunAgentInput.tools`, tools the client executes): backend stubs.

Why stubs registered up front rather than per-run tools: the `Runtime` has no per-run tool list
(the loop offers and runs exactly `AgentSpec.tools`, and a call to any other name fails as
"unknown tool" before any plugin hook sees it), and a run must be resumable by any worker from
the log alone, so its tools cannot live in one request's memory. An app therefore declares the
frontend tools its agents may call: `frontend_tool(name, description, parameters)` builds a
`Tool` that never runs anything; it suspends the call (`ToolResult.pending`, action
`frontend_tool`, resume mode `use_decision_as_tool_result`). The AG-UI run ends with an
interrupt on that call; the client's result comes back as a `resume[]` entry (or a `role: tool`
message) and becomes the decision whose payload IS the tool result; the run continues.
"""

from __future__ import annotations

from typing import Any

import pydantic

from runtime import Tool, ToolContext, ToolResult

#: The ticket action of a frontend tool call (AG-UI interrupt reason `agentlog:frontend_tool`).
ACTION = "frontend_tool"


def frontend_tool(name: str, description: str = "", parameters: dict[str, Any] | None = None) -> Tool:
    """A stub `Tool` named `name` whose calls wait for the client's result. `parameters` (JSON
    Schema) is what the model is offered; arguments are passed through to the client as given."""
    args = pydantic.create_model(f"{name}_frontend_args", __config__=pydantic.ConfigDict(extra="allow"))

    def suspend(ctx: ToolContext) -> ToolResult:
        return ToolResult.pending(ctx.call_id, action=ACTION, message=f"run {name} in the client",
                                  resume_mode="use_decision_as_tool_result")

    t = Tool(name, description or f"{name} (runs in the client)", args, suspend, "ctx")
    t.parameters = dict(parameters) if parameters else {"type": "object", "properties": {}}
    return t


__all__ = ["ACTION", "frontend_tool"]
