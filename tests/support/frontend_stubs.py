"""Frontend tool stubs for the tests: backend declarations of tools the client executes.

A tool listed in a request's `tools` (AG-UI `RunAgentInput.tools`) is recorded with the run
(`RunStarted.frontend_tools`, see `agentlog.runtime.inputs.frontend`) and needs no declaration. The
runtime still honours a stub that an app declares itself (a `Tool` with `frontend_stub` set):
`frontend_tool(name, description, parameters)` builds one that never runs anything; it suspends
the call (`ToolResult.pending`, action `frontend_tool`, resume mode
`use_decision_as_tool_result`), and the client's result comes back as the decision whose payload
IS the tool result. The tests use it to check that a request listing a stubbed name in its
`tools` is not a conflict (`Runtime.start` leaves that name to the stub).
"""

from __future__ import annotations

from typing import Any

import pydantic

from agentlog.runtime import Tool, ToolContext, ToolResult
from agentlog.runtime.inputs.frontend import ACTION


def frontend_tool(name: str, description: str = "", parameters: dict[str, Any] | None = None) -> Tool:
    """A stub `Tool` named `name` whose calls wait for the client's result. `parameters` (JSON
    Schema) is what the model is offered; arguments are passed through to the client as given."""
    args = pydantic.create_model(f"{name}_frontend_args", __config__=pydantic.ConfigDict(extra="allow"))

    def suspend(ctx: ToolContext) -> ToolResult:
        return ToolResult.pending(ctx.call_id, action=ACTION, message=f"run {name} in the client",
                                  resume_mode="use_decision_as_tool_result")

    t = Tool(name, description or f"{name} (runs in the client)", args, suspend, "ctx")
    t.parameters = dict(parameters) if parameters else {"type": "object", "properties": {}}
    t.frontend_stub = True  # see agentlog.runtime.inputs.frontend.is_frontend_stub
    return t

