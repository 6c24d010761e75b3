"""The agents a gateway can run (`GET /v1/agents`, NATS `agentlog.api.agents.list`): the one
catalog both transports answer with, so a client choosing an `agent_id` sees the same list."""

from __future__ import annotations

from typing import Any

from agentlog.runtime.handoff import handoff_tools


def agent_catalog(app_or_runtime: Any) -> list[dict[str, Any]]:
    """The agents an app (a `Runtime`, an `App`, or a dispatcher holding a runtime) runs, for
    clients choosing `{agent_id}`: ids, descriptions, tools with their JSON Schemas. A work-queue
    dispatcher without the app knows only the ids and descriptions (tools unknown here: `null`);
    a server that knows its app gives the transports its catalog (`agentlog.cli.server`)."""
    # an InProcessDispatcher holds its Runtime as `.runtime` (an App's `runtime` is a method)
    runtime = app_or_runtime if hasattr(app_or_runtime, "agents") else getattr(app_or_runtime, "runtime", None)
    agents = getattr(runtime, "agents", None)
    tools = getattr(runtime, "tools", None)
    if agents is None:
        return []
    if tools is None:  # QueueDispatcher: a set of ids
        described = getattr(runtime, "descriptions", {})
        return [{"id": a, "description": described.get(a, ""), "tools": None} for a in sorted(agents)]
    by_name = {t.spec.name: t.spec for t in tools}  # a ToolRegistry or an App's list of tools
    # the transfer tools a Runtime makes for declared handoffs (an App's list lacks them)
    specs_of_agents = list(agents)
    for transfer in handoff_tools(specs_of_agents, {a.id: a.description for a in specs_of_agents}):
        by_name.setdefault(transfer.name, transfer.spec)
    out = []
    for spec in agents:
        specs = [by_name[n] for n in spec.tools if n in by_name]
        out.append({"id": spec.id, "description": spec.description,
                    "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                              for t in specs]})
    return out


__all__ = ["agent_catalog"]
