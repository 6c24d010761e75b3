"""Agent handoff: one agent hands the thread to another, as OpenAI Agents SDK handoffs do.

An agent declares the agents it may hand off to (`AgentSpec.handoffs`). Each target becomes a
tool, `transfer_to_<agent>` (built here, registered by the `Runtime` for its agents), and the
agent gets `HandoffPlugin`, which turns a successful call of one of those tools into the plugin
action `HandOff`. Any other plugin may return `HandOff` as well (a router that picks the agent
from the state, say). The loop records each `HandOff` as an `AgentHandedOff` event and from then
on uses the target's spec: the active agent is a fold of the log, so a resume, a replay and the
projections all agree on it.

Kept apart from `agentlog.runtime.agents.spec` (which imports it to wire the tools and the plugin into
a spec) so that it needs nothing but plugins and tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pydantic

from agentlog.eventlog.events import ToolCall
from agentlog.runtime.plugins import HandOff, HookResult, PhaseContext, Plugin
from agentlog.runtime.tools import Tool, ToolResult

#: The prefix of the generated handoff tools (`transfer_to_billing`).
TRANSFER_PREFIX = "transfer_to_"


def transfer_tool_name(agent_id: str) -> str:
    return f"{TRANSFER_PREFIX}{agent_id}"


class _TransferArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    reason: str | None = pydantic.Field(default=None, description="Why the conversation is handed over (optional).")


class HandoffTool(Tool):
    """`transfer_to_<agent>`: succeeds with `{"handed_off_to": agent}`; the agent's
    `HandoffPlugin` makes that success a `HandOff`. Pure (no side effect): a replay may run it."""

    def __init__(self, agent_id: str, description: str = "") -> None:
        self.target = agent_id
        about = f" ({description})" if description else ""
        text = (f"Hand the conversation over to the agent {agent_id!r}{about}. It answers from the next "
                "turn on, with its own instructions and tools; call this when the request is for it.")

        async def transfer(reason: str | None = None) -> ToolResult:
            value: dict[str, str] = {"handed_off_to": agent_id}
            if reason:
                value["reason"] = reason
            return ToolResult.success(value)

        super().__init__(transfer_tool_name(agent_id), text, _TransferArgs, transfer, None)


class HandoffPlugin(Plugin):
    """Turns a successful `transfer_to_<agent>` call of a declared target into `HandOff`."""

    id = "handoff"

    def __init__(self, targets: Iterable[str]) -> None:
        self.targets = {transfer_tool_name(a): a for a in targets}

    def after_tool_execute(self, ctx: PhaseContext, call: ToolCall, result: ToolResult) -> HookResult:
        target = self.targets.get(call.name)
        if target is None or result.status != "success":
            return None
        reason = call.arguments.get("reason") if isinstance(call.arguments, dict) else None
        return [HandOff(agent=target, reason=reason if isinstance(reason, str) else None, call_id=call.id)]


def handoff_tools(agents: Iterable[object], descriptions: Mapping[str, str] | None = None) -> list[HandoffTool]:
    """The `transfer_to_<agent>` tools the `agents` (specs with `handoffs`) need, each once,
    described with the target's description when `descriptions` knows it."""
    described = descriptions or {}
    out: dict[str, HandoffTool] = {}
    for spec in agents:
        for target in getattr(spec, "handoffs", ()):
            name = transfer_tool_name(target)
            if name not in out:
                out[name] = HandoffTool(target, described.get(target, ""))
    return list(out.values())


__all__ = ["TRANSFER_PREFIX", "HandoffPlugin", "HandoffTool", "handoff_tools", "transfer_tool_name"]
