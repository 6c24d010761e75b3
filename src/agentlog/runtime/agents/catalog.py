"""The catalog of the agents an app runs (`GET /v1/agents`, NATS `agentlog.api.agents.list`): ids,
descriptions and tools with their JSON Schemas, for clients choosing an `agent_id`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from agentlog.runtime.agents.spec import AgentSpec, derived_tools
from agentlog.runtime.plugins import config_key
from agentlog.runtime.tools import Tool


class AgentApp(Protocol):
    """What a catalog reads of an app: its agents and its tools."""

    @property
    def agents(self) -> Iterable[AgentSpec]: ...

    @property
    def tools(self) -> Iterable[Tool]: ...


def agent_catalog(app: AgentApp) -> list[dict[str, Any]]:
    """The agents an app (a `Runtime`, an `App`, a loaded configuration) runs, for clients
    choosing `{agent_id}`: ids, descriptions, tools with their JSON Schemas (and UI category and
    label, `idempotent: false` where declared), and the configurable plugins with the JSON
    Schema of their section. A gateway without
    the app answers from its dispatcher (`Dispatcher.agent_catalog`: a work queue knows only the
    ids and descriptions); a server that knows its app gives the transports its catalog
    (`agentlog.cli.assembly`)."""
    agents, tools = app.agents, app.tools
    by_name = {t.name: t for t in tools}  # a ToolRegistry or an App's list of tools
    # the tools a Runtime makes for its agents (handoffs, tool_search: an App's list lacks them)
    specs_of_agents = list(agents)
    for derived in derived_tools(specs_of_agents, {a.id: a.description for a in specs_of_agents}):
        by_name.setdefault(derived.name, derived)
    out = []
    for spec in agents:
        offered = [by_name[n] for n in spec.tools if n in by_name]
        entry: dict[str, Any] = {"id": spec.id, "description": spec.description,
                                 "tools": [_tool_entry(t) for t in offered]}
        configurable = [{"id": p.id, "config_key": config_key(p), "config_schema": p.config_model.model_json_schema()}
                        for p in spec.plugins if p.config_model is not None]
        if configurable:  # what the agent's `sections` may hold, for a UI or an editor
            entry["plugins"] = configurable
        out.append(entry)
    return out


def _tool_entry(t: Tool) -> dict[str, Any]:
    """A tool as the catalog lists it: what the model sees, plus its UI category and label when
    set, and `idempotent: false` for a tool declared so (an interrupted call of it goes in doubt)."""
    entry: dict[str, Any] = {"name": t.name, "description": t.description, "parameters": t.parameters}
    for key in ("category", "label"):
        value = getattr(t, key, None)
        if value is not None:
            entry[key] = value
    if not getattr(t, "idempotent", True):
        entry["idempotent"] = False
    return entry


__all__ = ["AgentApp", "agent_catalog"]
