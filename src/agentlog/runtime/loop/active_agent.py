"""The agent a run loop drives right now, and its plugins.

A handoff switches the agent mid-run, so every part of the loop reads the spec, the tools, the
stop conditions and the plugins from this one object (never a copy taken at construction). The
plugin hooks run here, and their patches are staged through the run's `Staging`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from agentlog.eventlog.events import (
    ActionScheduled,
    AgentHandedOff,
    ContextMessageSet,
    EffectEmitted,
    InputFiltered,
    Message,
    ScheduledActionsRan,
    StateConflicted,
    StatePatched,
    Termination,
    ToolCall,
    ToolCallDecision,
)
from agentlog.projections.state import validate_patch
from agentlog.runtime.agents.spec import AgentSpec
from agentlog.runtime.loop.decisions import tool_specs
from agentlog.runtime.loop.staging import Staging
from agentlog.runtime.models.base import ModelRequest, ToolSpec
from agentlog.runtime.plugins import (
    MAX_PHASE_ROUNDS,
    Action,
    ActionHandler,
    AddContext,
    Effect,
    EffectHandler,
    EffectSpec,
    Emit,
    HandOff,
    PatchState,
    PhaseContext,
    PhaseLoopExceeded,
    Plugin,
    PluginError,
    RejectInput,
    RemoveContext,
    Schedule,
    Terminate,
    WarnInput,
    answered,
    as_payload,
    check_phase,
    gather_hook,
    overrides,
    run_hook,
    typed_payload,
    with_config,
)
from agentlog.runtime.state.batch import MutationBatch, Touch, plan_merge, untyped_touches
from agentlog.runtime.state.keys import StateKeys, collect_keys
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
    #: The typed state keys of the agent, its plugins and its tools.
    keys: StateKeys

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
        active = spec.active_plugins()
        self._hooks: dict[str, list[Plugin]] = {hook: [p for p in active if overrides(p, hook)] for hook in HOOKS}
        self._transforms = [p for p in active if overrides(p, "transform_request")]
        self._filters = [p for p in active if overrides(p, "filter_input")]
        # structural: every plugin's handlers, whatever the hook filter
        self._actions: dict[str, tuple[Plugin, ActionHandler]] = {}
        self._effects: dict[str, EffectHandler] = {}
        for plugin in spec.plugins:
            for key, handler in plugin.action_handlers().items():
                self._actions.setdefault(key, (plugin, handler))
            for key, effect in plugin.effect_handlers().items():
                self._effects.setdefault(key, effect)
        self.agent_tools = {n: tools[n] for n in spec.tools if n in tools}
        self.base_tool_specs = tool_specs(spec, self.agent_tools, (), self.staging.ctx)
        self.keys = collect_keys(spec.state_keys, spec.plugins, self.agent_tools.values())

    @property
    def effect_handlers(self) -> Mapping[str, EffectHandler]:
        return self._effects

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

    def _phase(self, decision: ToolCallDecision | None = None, call_id: str | None = None) -> PhaseContext:
        ctx = self.staging.ctx
        return PhaseContext(
            agent=self.spec, thread_id=ctx.thread_id, run_id=ctx.run_id,
            step=ctx.step, state=ctx.state, messages=ctx.messages, decision=decision,
            run_state=ctx.run_state, call_id=call_id,
            call_state=ctx.call_states.get(call_id, {}) if call_id is not None else None,
        )

    async def hook(self, hook: str, *args: Any, decision: ToolCallDecision | None = None) -> list[Action]:
        """The phase's actions: its plugins' hooks, all on the phase's snapshot (the async ones
        concurrently), their typed writes merged by their keys' strategies (`_merged_hooks`); then
        the scheduled actions of this phase (those recorded for it earlier, and those the hooks
        and handlers schedule now) until none is left (`MAX_PHASE_ROUNDS`). A plain `AddContext`
        outside BeforeInference is keyed by its text (it is recorded: it cannot change an
        inference already made)."""
        plugins = self._hooks[hook]
        pending = [a for a in self.staging.ctx.scheduled if a.phase == hook]
        if not plugins and not pending:
            return []
        await self.staging.messages_ready()
        call_id = args[0].id if args and isinstance(args[0], ToolCall) else None
        ctx = self._phase(decision, call_id)
        actions = await self._merged_hooks(plugins, hook, ctx, decision, call_id, *args) if plugins else []
        if pending:
            self.staging.emit(ScheduledActionsRan(phase=hook, count=len(pending)))
            actions = [*(Schedule(a.key, a.payload) for a in pending), *actions]
        actions = await self._converge(hook, ctx, actions)
        if hook != "before_inference":
            actions = [AddContext(a.text, key=a.text) if isinstance(a, AddContext) and not a.recorded else a
                       for a in actions]
        return actions

    async def _merged_hooks(self, plugins: Sequence[Plugin], hook: str, phase: PhaseContext,
                            decision: ToolCallDecision | None, call_id: str | None, *args: Any) -> list[Action]:
        """The hooks' actions with their typed writes merged (the seeds' mutation lifecycle):
        batches that do not conflict stay among the actions for `apply_patches`; a hook whose
        writes conflict with an earlier hook's on an exclusive key runs again, after the earlier
        ones' writes are staged, on the state they made (sequential fallback, recorded as
        `StateConflicted`)."""
        results = [actions for _plugin, actions in await gather_hook(plugins, hook, phase, *args)]
        if not any(isinstance(a, MutationBatch) for actions in results for a in actions):
            return [a for actions in results for a in actions]
        plan = plan_merge([_touches(actions) for actions in results])
        if not plan.deferred:
            return [a for actions in results for a in actions]
        out: list[Action] = []
        for index in plan.merged:  # committed as one batch, in registration order
            out.extend(self._stage_writes(results[index], "plugin"))
        for index in plan.deferred:  # then each deferred hook again, on the state made so far
            plugin = plugins[index]
            mine, theirs = plan.conflicts[index]
            self.staging.emit(StateConflicted(
                key=mine.key or theirs.key or "", path=mine.path, writer=f"plugin:{plugin.id}",
                with_writer=_writer_of(results, plan.merged, theirs, plugins), resolution="sequential",
                scope=mine.scope, call_id=call_id,  # type: ignore[arg-type]
            ))
            again = await run_hook([plugin], hook, self._phase(decision, call_id), *args)
            out.extend(self._stage_writes(again, "plugin"))
        return out

    def _stage_writes(self, actions: Sequence[Action], source: str) -> list[Action]:
        """Stage the state writes among `actions` now; the other actions, for the caller."""
        rest: list[Action] = []
        for action in actions:
            if isinstance(action, (PatchState, MutationBatch)):
                self.apply_patches([action], source)
            else:
                rest.append(action)
        return rest

    async def _converge(self, hook: str, ctx: PhaseContext, actions: list[Action]) -> list[Action]:
        """Run this phase's scheduled actions, round by round; the rest of the actions, in order."""
        out: list[Action] = []
        state = ctx.state
        for round_ in range(MAX_PHASE_ROUNDS + 1):
            now: list[tuple[Plugin, ActionHandler, Schedule]] = []
            for action in actions:
                if isinstance(action, Schedule):
                    found = self._actions.get(action.key)
                    if found is None:
                        raise PluginError(f"no plugin of agent {self.spec.id!r} handles the scheduled action "
                                          f"{action.key!r} (handled: {', '.join(sorted(self._actions)) or 'none'})")
                    payload = typed_payload(found[1].payload, action.payload, f"scheduled action {action.key!r}")
                    action = Schedule(action.key, payload)
                    if found[1].phase == hook:
                        now.append((*found, action))
                        continue
                elif isinstance(action, Effect):
                    effect = self._effects.get(action.key)
                    if effect is None:
                        raise PluginError(f"no plugin of agent {self.spec.id!r} handles the effect {action.key!r} "
                                          f"(handled: {', '.join(sorted(self._effects)) or 'none'})")
                    model = effect.payload if isinstance(effect, EffectSpec) else None
                    action = Effect(action.key, typed_payload(model, action.payload, f"effect {action.key!r}"))
                elif isinstance(action, PatchState):
                    state = validate_patch(state, action.ops)  # handlers of later rounds see it
                out.append(action)
            if not now:
                return out
            if round_ == MAX_PHASE_ROUNDS:
                raise PhaseLoopExceeded(f"scheduled actions of {hook} kept scheduling more after "
                                        f"{MAX_PHASE_ROUNDS} rounds: {', '.join(s.key for _, _, s in now)}")
            actions = []
            fresh = replace(ctx, state=state)
            for plugin, handler, scheduled in now:
                payload = as_payload(handler.payload, scheduled.payload)
                result = await answered(handler.handle(with_config(fresh, plugin), payload))
                actions += check_phase(result, hook, f"the handler of scheduled action {scheduled.key!r}")
        return out

    def apply_patches(self, actions: Sequence[Action], source: str) -> None:
        for action in actions:
            if isinstance(action, PatchState):
                self.staging.emit(StatePatched(ops=list(action.ops), source=source))
            elif isinstance(action, MutationBatch):
                for write in action.writes:
                    self.staging.emit(write.event(source=action.writer, call_id=None))
            elif isinstance(action, Emit):
                self.staging.emit(action.event)
            elif isinstance(action, HandOff):
                self._hand_off(action)
            elif isinstance(action, AddContext) and action.recorded:
                self.staging.emit(ContextMessageSet(key=action.key or action.text, text=action.text,
                                                    persistent=action.persistent, cooldown=max(0, action.cooldown)))
            elif isinstance(action, RemoveContext):
                self.staging.emit(ContextMessageSet(key=action.key))
            elif isinstance(action, Schedule):  # for a later phase (this one's ran in `hook`)
                self.staging.emit(ActionScheduled(key=action.key, phase=self._actions[action.key][1].phase,
                                                  payload=action.payload))
            elif isinstance(action, Effect):
                self.staging.emit(EffectEmitted(key=action.key, payload=action.payload))

    # -- input filters and request transforms ----------------------------------------------------

    async def filter_input(self, messages: Sequence[Message]) -> Termination | None:
        """The active plugins' input filters on the run's starting messages: each verdict
        recorded (`InputFiltered`); the first rejection ends the run `blocked` before any
        model call (returned)."""
        if not self._filters or not messages:
            return None
        await self.staging.messages_ready()
        ctx = self._phase()
        ids = [m.id for m in messages]
        rejected: Termination | None = None
        for plugin in self._filters:
            verdicts = plugin.filter_input(with_config(ctx, plugin), list(messages)) or ()
            for verdict in verdicts:
                if not isinstance(verdict, (RejectInput, WarnInput)):
                    raise PluginError(f"plugin {plugin.id!r} returned {type(verdict).__name__} from filter_input, "
                                      "which answers RejectInput or WarnInput")
                kind: Literal["reject", "warn"] = "reject" if isinstance(verdict, RejectInput) else "warn"
                self.staging.emit(InputFiltered(verdict=kind, reason=verdict.reason, plugin=plugin.id,
                                                message_ids=ids))
                if kind == "reject" and rejected is None:
                    rejected = Termination(type="blocked", code="input_rejected", detail=verdict.reason)
        return rejected

    def transform(self, request: ModelRequest) -> ModelRequest:
        """The model request after the active plugins' request transforms, in order."""
        if not self._transforms:
            return request
        ctx = self._phase()
        for plugin in self._transforms:
            changed = plugin.transform_request(with_config(ctx, plugin), request)
            if changed is not None:
                if not isinstance(changed, ModelRequest):
                    raise PluginError(f"plugin {plugin.id!r} returned {type(changed).__name__} from "
                                      "transform_request, not a ModelRequest")
                request = changed
        return request

    @staticmethod
    def terminate(actions: Sequence[Action]) -> Termination | None:
        for action in actions:
            if isinstance(action, Terminate):
                return Termination(type="behavior_requested", code=action.code, detail=action.detail)
        return None


def _touches(actions: Sequence[Action]) -> list[Touch]:
    out: list[Touch] = []
    for action in actions:
        if isinstance(action, MutationBatch):
            out.extend(action.touches())
        elif isinstance(action, PatchState):
            out.extend(untyped_touches(action.ops))
    return out


def _writer_of(results: Sequence[Sequence[Action]], merged: Sequence[int], touch: Touch,
               plugins: Sequence[Plugin]) -> str:
    """The merged hook whose writes hold `touch`."""
    for index in merged:
        if touch in _touches(results[index]):
            return f"plugin:{plugins[index].id}"
    return "plugin"
