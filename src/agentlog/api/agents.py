"""The agents a gateway can run (`GET /v1/agents`, NATS `agentlog.api.agents.list`): the one
catalog both transports answer with, so a client choosing an `agent_id` sees the same list."""

from __future__ import annotations

from typing import Any


def agent_catalog(runtime_or_dispatcher: Any) -> list[dict[str, Any]]:
    """The agents this gateway can run, for clients choosing `{agent_id}`: from the runtime when
    it runs here (ids, descriptions, tools with their JSON Schemas), else only the ids a
    work-queue dispatcher knows from the app, with their descriptions (tools unknown here: `null`)."""
    runtime = getattr(runtime_or_dispatcher, "runtime", runtime_or_dispatcher)
    agents = getattr(runtime, "agents", None)
    tools = getattr(runtime, "tools", None)
    if agents is None:
        return []
    if tools is None:  # QueueDispatcher: a set of ids
        described = getattr(runtime, "descriptions", {})
        return [{"id": a, "description": described.get(a, ""), "tools": None} for a in sorted(agents)]
    out = []
    for spec in agents:
        specs = [tools.get(n).spec for n in spec.tools if tools.get(n) is not None]
        out.append({"id": spec.id, "description": spec.description,
                    "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                              for t in specs]})
    return out


__all__ = ["agent_catalog"]
