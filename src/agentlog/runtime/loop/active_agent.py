"""The agent a run loop drives right now, and its plugins.

A handoff switches the agent mid-run, so every part of the loop reads the spec, the tools, the
stop conditions and the plugins from this one object (never a copy taken at construction). The
plugin hooks run here, and their patches are staged through the run's `Staging`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentlog.eventlog.events import AgentHandedOff, StatePatched, Termination, ToolCallDecision
from agentlog.runtime.agents.spec import AgentSpec
from agentlog.runtime.loop.decisions import tool_specs
from agentlog.runtime.loop.staging import Staging
from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.plugins import (
    Action,
    Emit,
    HandOff,
    PatchState,
    PhaseContext,
    Plugin,
    PluginError,
    Terminate,
    overrides,
    run_hook,
)
from agentlog.runtime.tools import Tool

#: Resolves an agent id to its spec and tools (for handoffs).
AgentResolver = Callable[[str], tuple[AgentSpec, Mapping[str, Tool]]]

HOOKS = (
    "run_start", "step_start", "before_inference", "after_inference",
    "before_tool_execute", "after_tool_execute", "step_end", "run_end",
)


class ActiveAgent:
    """The run's current agent: its spec, tools, stop conditions and plugin hooks."""

    spec: AgentSpec
    tools: Mapping[str, Tool]
    agent_tools: dict[str, Tool]
    base_tool_specs: list[ToolSpec]
    stop_conditions: list[Any]

    def __init__(self, staging: Staging, spec: AgentSpec, tools: Mapping[str, Tool],
                 agents: AgentResolver | None) -> None:
        self.staging = staging
        #: Resolves an agent id to its spec and tools, for handoffs (`agentlog.runtime.agents.handoff`);
        #: None: this loop cannot change agents (a `HandOff` then ends the run `error`).
        self.agents = agents
        self.use(spec, tools)
        ctx = staging.ctx
        # a run resumed after a handoff: the agent of the open step's calls, else the active one
        self.follow_handoff(ctx.step_agent or ctx.agent_id)

    def use(self, spec: AgentSpec, tools: Mapping[str, Tool]) -> None:
        """Make `spec` the agent this loop drives: its tools, plugins and stop conditions."""
        self.spec = spec
        self.tools = tools
        self.stop_conditions = spec.effective_stop_conditions()
        self._hooks: dict[str, list[Plugin]] = {hook: [p for p in spec.plugins if overrides(p, hook)] for hook in HOOKS}
        self.agent_tools = {n: tools[n] for n in spec.tools if n in tools}
        self.base_tool_specs = tool_specs(spec, self.agent_tools, (), self.staging.ctx)

    def follow_handoff(self, agent_id: str | None = None) -> None:
        """Switch to the run's active agent (or `agent_id`) if it is another one. Called only
        where no call of the current step is left to plan (a step's calls belong to the agent
        whose inference asked for them), so a handoff takes effect at the next step."""
        want = agent_id or self.staging.ctx.agent_id
        if want is None or want == self.spec.id or self.agents is None:
            return
        spec, tools = self.agents(want)
        self.staging.log.info("run.agent_switched", from_agent=self.spec.id, to_agent=want)
        self.use(spec, tools)

    def _hand_off(self, action: HandOff) -> None:
        ctx = self.staging.ctx
        if action.agent == ctx.agent_id:
            return
        if self.agents is None:
            raise PluginError(f"a handoff to {action.agent!r} needs a loop that can resolve agents")
        self.agents(action.agent)  # an unknown agent fails here, before anything is staged
        self.staging.emit(AgentHandedOff(from_agent=ctx.agent_id or self.spec.id, to_agent=action.agent,
                                         reason=action.reason, call_id=action.call_id))

    # -- plugins -------------------------------------------------------------------------------

    def _phase(self, decision: ToolCallDecision | None = None) -> PhaseContext:
        ctx = self.staging.ctx
        return PhaseContext(
            agent=self.spec, thread_id=ctx.thread_id, run_id=ctx.run_id,
            step=ctx.step, state=ctx.state, messages=ctx.messages, decision=decision,
        )

    async def hook(self, hook: str, *args: Any, decision: ToolCallDecision | None = None) -> list[Action]:
        plugins = self._hooks[hook]
        if not plugins:
            return []
        await self.staging.messages_ready()
        return await run_hook(plugins, hook, self._phase(decision), *args)

    def apply_patches(self, actions: Sequence[Action], source: str) -> None:
        for action in actions:
            if isinstance(action, PatchState):
                self.staging.emit(StatePatched(ops=list(action.ops), source=source))
            elif isinstance(action, Emit):
                self.staging.emit(action.event)
            elif isinstance(action, HandOff):
                self._hand_off(action)

    @staticmethod
    def terminate(actions: Sequence[Action]) -> Termination | None:
        for action in actions:
            if isinstance(action, Terminate):
                return Termination(type="behavior_requested", code=action.code, detail=action.detail)
        return None
