"""Frontend tools: tools the client executes (AG-UI `RunAgentInput.tools`), declared per run.

Why per run and in the log: a client offers its own tools with each request, so they cannot be
part of `AgentSpec` (fixed at deploy) nor live in one process's memory (a suspended run is
resumed, or verified, by any process from the log alone). `Runtime.start(frontend_tools=...)`
therefore records them in `RunStarted.frontend_tools`; the loop folds them into its
`RunContext`, offers them to the model after the agent's own tools, and turns a call to one into
a suspension instead of an execution (`frontend_ticket`): the client runs the tool, and its
result comes back as a decision whose payload IS the tool result
(`use_decision_as_tool_result`); a cancel decision cancels the call.

Everything here is pure: normalising the declarations at the edge (typed errors before anything
is written), the model-facing specs, the ticket.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.events import JSON, SuspendTicket, ToolCall
from agentlog.eventlog.ids import validate_id
from agentlog.runtime.models.base import ToolSpec

#: The ticket action of a frontend tool call (AG-UI: a pending tool call of a successful run,
#: not an interrupt; AI SDK: the client answers with addToolOutput).
ACTION = "frontend_tool"
_EMPTY_SCHEMA: dict[str, JSON] = {"type": "object", "properties": {}}


class InvalidFrontendTools(AgentlogError, ValueError):
    """A frontend tool declaration that cannot be recorded (bad name, duplicate, wrong shape).
    Raised before anything is written."""

    code = "invalid_frontend_tools"


class FrontendToolConflict(AgentlogError, ValueError):
    """A frontend tool named like one of the agent's backend tools: which one a call means would
    be ambiguous, so the run is refused at start (nothing written)."""

    code = "frontend_tool_conflict"


def normalize_frontend_tools(tools: Iterable[ToolSpec | Mapping[str, Any]] | None) -> list[dict[str, JSON]]:
    """`ToolSpec`s or `{name, description?, parameters?}` dicts -> the recorded form, in order:
    `{"name", "description", "parameters"}` with a JSON Schema object (default: no properties).
    Names must be ids (`[A-Za-z0-9_-]{1,128}`, as every tool name) and unique.
    Raises `InvalidFrontendTools`."""
    out: list[dict[str, JSON]] = []
    seen: set[str] = set()
    for i, t in enumerate(tools or ()):
        name: object  # a caller's object may hold anything: each is checked below
        description: object
        parameters: object
        if isinstance(t, ToolSpec):
            name, description, parameters = t.name, t.description, t.parameters
        elif isinstance(t, Mapping):
            name, description, parameters = t.get("name"), t.get("description") or "", t.get("parameters")
        else:
            raise InvalidFrontendTools(f"frontend_tools[{i}]: a tool is a ToolSpec or an object, not {type(t).__name__}")
        if not isinstance(name, str):
            raise InvalidFrontendTools(f"frontend_tools[{i}].name: a string is required")
        try:
            validate_id(name, "frontend tool name")
        except InvalidId as exc:
            raise InvalidFrontendTools(f"frontend_tools[{i}].name: {exc}") from None
        if name in seen:
            raise InvalidFrontendTools(f"frontend_tools[{i}].name: duplicate tool name {name!r}")
        seen.add(name)
        if not isinstance(description, str):
            raise InvalidFrontendTools(f"frontend_tools[{i}].description: a string is required")
        if parameters is None:
            parameters = dict(_EMPTY_SCHEMA)
        if not isinstance(parameters, Mapping):
            raise InvalidFrontendTools(f"frontend_tools[{i}].parameters: a JSON Schema object is required")
        out.append({"name": name, "description": description, "parameters": dict(parameters)})
    return out


def check_no_conflict(frontend: Sequence[Mapping[str, Any]], backend: Iterable[str]) -> None:
    """Raise `FrontendToolConflict` if a frontend tool has the name of a backend tool."""
    clash = sorted({t["name"] for t in frontend} & set(backend))
    if clash:
        raise FrontendToolConflict(
            f"frontend tool(s) {', '.join(map(repr, clash))} have the name of a tool of the agent; "
            "rename the client's tool (or drop the backend one)"
        )


def frontend_specs(recorded: Iterable[Mapping[str, Any]]) -> dict[str, ToolSpec]:
    """`RunStarted.frontend_tools` -> name -> the `ToolSpec` offered to the model (in order)."""
    return {
        t["name"]: ToolSpec(name=t["name"], description=t.get("description") or "",
                            parameters=dict(t.get("parameters") or _EMPTY_SCHEMA))
        for t in recorded
    }


def frontend_ticket(call: ToolCall) -> SuspendTicket:
    """The suspension of a call to a frontend tool: the client gets the arguments, its result
    (the decision's payload) becomes the tool result."""
    return SuspendTicket(
        id=call.id, action=ACTION, message=f"run {call.name} in the client",
        parameters=dict(call.arguments), resume_mode="use_decision_as_tool_result",
    )


def is_frontend_stub(tool: Any) -> bool:
    """A backend `Tool` that an app declares as a frontend tool stub (`Tool.frontend_stub`): its
    calls suspend for the client like a frontend tool's."""
    return bool(getattr(tool, "frontend_stub", False))


__all__ = [
    "ACTION", "FrontendToolConflict", "InvalidFrontendTools", "check_no_conflict", "frontend_specs",
    "frontend_ticket", "is_frontend_stub", "normalize_frontend_tools",
]
