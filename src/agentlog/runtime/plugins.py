"""Plugins: hooks at each phase of the loop that answer with typed actions.

A plugin never touches the log, the model or the tools. It reads a `PhaseContext` and returns
actions; the loop validates each action against the phase it came from (an action in the wrong
phase is a `PluginError`, which ends the run `error`) and turns accepted actions into events. That
keeps plugins replayable: the same context gives the same actions, and every effect they have is
an event in the log.

Hooks may be plain or async functions (async for plugins that must consult something).
Scheduled actions, effects, input filters and request transforms are described on their types
(`Schedule`, `Effect`, `Plugin.filter_input`, `Plugin.transform_request`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Union, cast

import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import JSON, Emitted, SuspendTicket, ToolCall, ToolCallDecision, Verdict
from agentlog.runtime.models.base import ModelRequest, ModelResponse
from agentlog.runtime.state.batch import MutationBatch
from agentlog.runtime.state.keys import StateKey
from agentlog.runtime.tools import Tool, ToolResult


class PluginError(AgentlogError):
    code = "plugin_error"


# -- actions --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddContext:
    """A context message for the model's system prompt.

    Plain (`AddContext(text)` in BeforeInference): this inference only, not recorded (the hook
    runs again on replay). Keyed, persistent, throttled, or given in another phase: recorded
    (`ContextMessageSet`) and added from the next inference on (this one, in BeforeInference):
    once, or at every inference with `persistent=True` (until `RemoveContext(key)`), never
    more often than once every `cooldown` + 1 inferences (a one-shot message due within its
    cooldown is dropped: a reminder that fires on every matching call is shown at most that
    often). The key defaults to the text; a new message under a key replaces the old one."""

    text: str
    key: str | None = None
    persistent: bool = False
    cooldown: int = 0

    @property
    def recorded(self) -> bool:
        """Kept by the loop (recorded) rather than applied to this inference only."""
        return self.key is not None or self.persistent or self.cooldown > 0


@dataclass(frozen=True, slots=True)
class RemoveContext:
    """Stop adding the keyed context message `key` (recorded as `ContextMessageSet` without text)."""

    key: str


@dataclass(frozen=True, slots=True)
class ExcludeTools:
    """BeforeInference: hide these tools from the model for this inference."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IncludeOnlyTools:
    """BeforeInference: offer only these tools (intersected with the agent's) for this inference."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OverrideInference:
    """BeforeInference: use another model (registry name) and/or merge provider options."""

    model: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Terminate:
    """RunStart/StepStart/BeforeInference/AfterInference/StepEnd: end the run
    `behavior_requested` with `code`."""

    code: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Block:
    """BeforeToolExecute: do not run the call; the model gets a failed result with `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Gate:
    """BeforeToolExecute: a recorded verdict (`ToolCallGated`). deny acts as `Block(reason)`;
    ask suspends the call (human in the loop) with `ticket`."""

    verdict: Verdict
    rule: str | None = None
    reason: str | None = None
    ticket: SuspendTicket | None = None


@dataclass(frozen=True, slots=True)
class Suspend:
    """BeforeToolExecute: do not run the call now; it waits for a decision on `ticket`
    (`ToolCallSuspended`; the run is `waiting` once nothing else runs). Generic: frontend tools,
    approvals of any kind. A plugin should not suspend again a call whose `PhaseContext.decision`
    is set (that is the replay of the decision it asked for)."""

    ticket: SuspendTicket


@dataclass(frozen=True, slots=True)
class SetResult:
    """BeforeToolExecute: skip the tool and use `result` as its outcome."""

    result: ToolResult


@dataclass(frozen=True, slots=True)
class PatchState:
    """Any phase: RFC 6902 ops on the thread state, validated and committed as `StatePatched`."""

    ops: tuple[dict[str, JSON], ...]


@dataclass(frozen=True, slots=True)
class Emit:
    """Any phase that takes `PatchState`: an event for the run's clients (AG-UI `CUSTOM`, `RAW`,
    `ACTIVITY_SNAPSHOT`, `ACTIVITY_DELTA`), committed in the log as `Emitted` where the phase's
    other effects are, so every reader sees it in the same place."""

    event: Emitted


@dataclass(frozen=True, slots=True)
class AddUserMessage:
    """AfterToolExecute: a user message appended after this step's tool results."""

    text: str


@dataclass(frozen=True, slots=True)
class HandOff:
    """RunStart/StepStart/AfterToolExecute/StepEnd: hand the thread to agent `agent` (a
    registered agent id). Recorded as `AgentHandedOff`; the next inference (the next step, or
    this step's if given at RunStart/StepStart) uses that agent's instructions, tools, plugins
    and model. Not accepted where the current step's tool calls are still to be planned (after
    an inference): those calls belong to the agent that asked for them."""

    agent: str
    reason: str | None = None
    #: The tool call that asked for it (the `transfer_to_<agent>` tools set it).
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """Any phase: run the scheduled action `key` (a handler some plugin of the agent registers,
    `Plugin.action_handlers`) with `payload`, in the handler's phase. In this phase: the loop
    runs it once the hooks have answered, and again for what it schedules, until nothing is
    left (at most `MAX_PHASE_ROUNDS` rounds, else the run ends `error`, code
    `phase_loop_exceeded`). In a later phase: recorded (`ActionScheduled`) and run when the loop
    gets there."""

    key: str
    payload: JSON = None


@dataclass(frozen=True, slots=True)
class Effect:
    """Any phase: a typed side effect run after the phase's events are committed: the handler
    some plugin registers for `key` (`Plugin.effect_handlers`) gets `payload` and the thread
    state as of that commit. Recorded (`EffectEmitted`); at most once (a crash between the commit
    and the handler skips it); never run by verified replay. Its errors are logged, nothing is
    rolled back. An unknown key ends the run `error` before anything is written."""

    key: str
    payload: JSON = None


#: Typed state writes (`PhaseContext.mutate()`) are accepted wherever `PatchState` is
#: (`agentlog.runtime.state.batch`).
Action = Union[
    AddContext, RemoveContext, ExcludeTools, IncludeOnlyTools, OverrideInference, Terminate, Block, Gate, Suspend,
    SetResult, PatchState, AddUserMessage, Emit, HandOff, Schedule, Effect, MutationBatch,
]

_ANY_PHASE: tuple[type[Action], ...] = (PatchState, MutationBatch, Emit, Schedule, Effect)
_CONTEXT: tuple[type[Action], ...] = (AddContext, RemoveContext)

#: Which actions each phase accepts.
PHASE_ACTIONS: dict[str, tuple[type[Action], ...]] = {
    "run_start": (*_ANY_PHASE, *_CONTEXT, Terminate, HandOff),
    "step_start": (*_ANY_PHASE, *_CONTEXT, Terminate, HandOff),
    "before_inference": (*_ANY_PHASE, *_CONTEXT, ExcludeTools, IncludeOnlyTools, OverrideInference, Terminate),
    "after_inference": (*_ANY_PHASE, *_CONTEXT, Terminate),
    "before_tool_execute": (*_ANY_PHASE, Block, Gate, Suspend, SetResult),
    "after_tool_execute": (*_ANY_PHASE, *_CONTEXT, AddUserMessage, HandOff),
    "step_end": (*_ANY_PHASE, *_CONTEXT, Terminate, HandOff),
    "run_end": _ANY_PHASE,
}
PHASES = tuple(PHASE_ACTIONS)
#: The most rounds of scheduled actions one phase runs (each round: the actions the last one
#: scheduled for the same phase).
MAX_PHASE_ROUNDS = 16


class PhaseLoopExceeded(PluginError):
    """Scheduled actions kept scheduling more for their phase past `MAX_PHASE_ROUNDS` rounds."""

    code = "phase_loop_exceeded"


# -- input filters, scheduled actions, effects ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RejectInput:
    """From `Plugin.filter_input`: refuse the run's input; the run ends `blocked` (code
    `input_rejected`, detail `reason`) before any model call."""

    reason: str


@dataclass(frozen=True, slots=True)
class WarnInput:
    """From `Plugin.filter_input`: let the input through, recorded with `reason`, which the model
    is shown in its system prompt for this run."""

    reason: str


InputVerdict = RejectInput | WarnInput


@dataclass(frozen=True, slots=True)
class ActionHandler:
    """A scheduled action's handler: runs in `phase` (a hook name) with the phase context and
    the payload, and answers with actions that phase accepts (more `Schedule`s included).
    `payload`: a pydantic model the payload is validated against when the action is scheduled
    (a mismatch ends the run `error` before anything is written); the handler then gets an
    instance, and the log the model's JSON."""

    phase: str
    handle: Callable[..., HookResult]
    payload: type[pydantic.BaseModel] | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASE_ACTIONS:
            raise ValueError(f"unknown phase {self.phase!r} (phases: {', '.join(PHASE_ACTIONS)})")


@dataclass(frozen=True, slots=True)
class EffectSpec:
    """A typed post-commit effect's handler: `handle(payload, state)` (sync or async), its
    payload validated against `payload` (a pydantic model) when the effect is emitted, before
    anything is written; the handler gets an instance."""

    handle: Callable[[Any, Mapping[str, JSON]], Any]
    payload: type[pydantic.BaseModel] | None = None


#: A post-commit effect handler: `handler(payload, state)`, sync or async, or an `EffectSpec`.
EffectHandler = Callable[[JSON, Mapping[str, JSON]], Any] | EffectSpec


def typed_payload(model: type[pydantic.BaseModel] | None, payload: Any, what: str) -> Any:
    """`payload` as its JSON form after validation against `model` (None: as given). Raises
    `PluginError` naming `what` and the fields."""
    if model is None:
        return payload
    try:
        value = model.model_validate(payload)
    except pydantic.ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise PluginError(f"{what}: invalid payload: {detail}") from None
    return value.model_dump(mode="json")


def as_payload(model: type[pydantic.BaseModel] | None, payload: Any) -> Any:
    """What a handler gets: an instance of its payload model (validated before it was recorded),
    or the JSON as recorded."""
    return payload if model is None else model.model_validate(payload)


# -- context --------------------------------------------------------------------------------------


class AgentView(Protocol):
    """What a hook reads of its agent: at run time it is the run's `agentlog.runtime.agents.spec.AgentSpec`.
    Typed structurally because `AgentSpec` holds its plugins (agentlog.runtime.agents.spec imports this module),
    so this module must not import agentlog.runtime.agents.spec back (import-linter keeps it that way)."""

    @property
    def id(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def system_prompt(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def tools(self) -> list[str]: ...
    @property
    def tool_execution_mode(self) -> str: ...
    @property
    def model_options(self) -> dict[str, Any]: ...
    @property
    def sections(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class PhaseContext:
    """What a hook may read. `state` is the live thread state: read it, never mutate it
    (change it with `PatchState`). Typed keys: `read(key)` of the thread, run (and, in the hooks
    of a tool call, tool_call) scopes; `mutate()` gives a `MutationBatch` to stage typed writes
    in, returned as an action."""

    agent: AgentView
    thread_id: str
    run_id: str
    step: int
    state: Mapping[str, JSON]
    #: The conversation so far (read-only).
    messages: Sequence[Any]
    #: BeforeToolExecute of a resumed call (resume mode replay_tool_call): the human decision it
    #: was resumed with, so a gate that asked can now let it through (or turn it down).
    decision: ToolCallDecision | None = None
    #: The run scope's state (read-only, like `state`).
    run_state: Mapping[str, JSON] = field(default_factory=dict)
    #: In BeforeToolExecute / AfterToolExecute: the call and its tool_call scope's state.
    call_id: str | None = None
    call_state: Mapping[str, JSON] | None = None
    #: Who writes the batches `mutate()` gives (`plugin:<id>`): a G-counter's replica.
    writer: str = "plugin"

    def _documents(self) -> dict[str, dict[str, JSON]]:
        docs: dict[str, dict[str, JSON]] = {"thread": dict(self.state), "run": dict(self.run_state)}
        if self.call_state is not None:
            docs["tool_call"] = dict(self.call_state)
        return docs

    def read(self, key: StateKey[Any]) -> Any:
        """The key's typed value as of this phase (its default if never written)."""
        return MutationBatch(self._documents(), writer=self.writer).read(key)

    def mutate(self) -> MutationBatch:
        """A batch of typed writes on this phase's snapshot; return it among the hook's
        actions. Batches of the phase's hooks merge by their keys' strategies: one that
        conflicts on an exclusive key runs again after the others (sequential fallback)."""
        owners = {"tool_call": self.call_id} if self.call_id is not None else {}
        return MutationBatch(self._documents(), writer=self.writer, owners=owners)
    #: The hook's own plugin's configuration for this agent (its `config_model`, validated from
    #: the agent's `sections[config_key]`, else its defaults); None for a plugin without one.
    config: Any = None


Actions = Sequence[Action]
HookResult = Actions | None | Awaitable[Actions | None]


class Plugin:
    """Base class: override the hooks you need; each returns actions (or None for none).

    Besides the phase hooks, a plugin may give its agents tools (`tools`), a configuration
    section (`config_model`, read as `PhaseContext.config`), handlers of scheduled actions and
    of post-commit effects, a request transform and an input filter. Its behaviour (hooks,
    tools, the transform, the filter) applies to an agent only if the agent's `hook_filter` is
    empty or names the plugin's `id`; its handlers and configuration always do. `state_keys`:
    the typed state keys the plugin reads and writes, registered with every agent it is in."""

    id: str = "plugin"
    state_keys: Sequence[StateKey[Any]] = ()
    #: A pydantic model of the plugin's configuration: the agent's `sections[config_key]` is
    #: validated against it when the agent is defined (a config file: at load).
    config_model: type[pydantic.BaseModel] | None = None
    #: The agent section holding the configuration (default: the plugin's `id`).
    config_key: str | None = None

    def tools(self) -> Sequence[Tool]:
        """Tools this plugin gives the agents it is active for (offered after their own)."""
        return ()

    def action_handlers(self) -> Mapping[str, ActionHandler]:
        """Handlers of scheduled actions, by key (`Schedule`)."""
        return {}

    def effect_handlers(self) -> Mapping[str, EffectHandler]:
        """Handlers of post-commit effects, by key (`Effect`)."""
        return {}

    def transform_request(self, ctx: PhaseContext, request: ModelRequest) -> ModelRequest | None:
        """Change a model request before it is sent (after the loop built it; None: unchanged).
        Must be a pure function of its arguments: the recorded request digest is of its answer,
        and replay calls it again."""
        return None

    def filter_input(self, ctx: PhaseContext, messages: Sequence[Any]) -> Sequence[InputVerdict] | None:
        """Judge the messages a run starts with, before the model sees them: `RejectInput` or
        `WarnInput` (None / empty: let them through). Pure, like the hooks."""
        return None

    def run_start(self, ctx: PhaseContext) -> HookResult:
        return None

    def step_start(self, ctx: PhaseContext) -> HookResult:
        return None

    def before_inference(self, ctx: PhaseContext) -> HookResult:
        return None

    def after_inference(self, ctx: PhaseContext, response: ModelResponse) -> HookResult:
        return None

    def before_tool_execute(self, ctx: PhaseContext, call: ToolCall) -> HookResult:
        return None

    def after_tool_execute(self, ctx: PhaseContext, call: ToolCall, result: ToolResult) -> HookResult:
        return None

    def step_end(self, ctx: PhaseContext) -> HookResult:
        return None

    def run_end(self, ctx: PhaseContext) -> HookResult:
        return None


def overrides(plugin: Plugin, hook: str) -> bool:
    """True if `plugin` implements `hook` (lets the loop skip no-op hooks on the hot path)."""
    return getattr(type(plugin), hook) is not getattr(Plugin, hook)


def config_key(plugin: Plugin) -> str:
    return plugin.config_key or plugin.id


def with_config(ctx: PhaseContext, plugin: Plugin) -> PhaseContext:
    """The phase context a hook of `plugin` gets: with its configuration, if it has one."""
    if plugin.config_model is None:
        return ctx
    sections = getattr(ctx.agent, "sections", None) or {}
    return replace(ctx, config=sections.get(config_key(plugin)) or plugin.config_model())


async def answered(result: HookResult) -> Sequence[Action]:
    """A hook's (or handler's) answer, awaited if it is awaitable."""
    if result is None:
        return ()
    if isinstance(result, (list, tuple)):
        return result
    return (await cast(Awaitable[Actions | None], result)) or ()


def check_phase(actions: Sequence[Action], hook: str, who: str) -> list[Action]:
    allowed = PHASE_ACTIONS[hook]
    for action in actions:
        if not isinstance(action, allowed):
            raise PluginError(
                f"{who} returned {type(action).__name__} from {hook}, which accepts "
                f"only {', '.join(t.__name__ for t in allowed)}"
            )
    return list(actions)


async def gather_hook(plugins: Sequence[Plugin], hook: str, ctx: PhaseContext, *args: Any
                      ) -> list[tuple[Plugin, list[Action]]]:
    """Call `hook` on every plugin that implements it, all on the same frozen context: the async
    ones run concurrently (a hook that consults something does not wait for another's). Each
    plugin's actions, phase-checked, in registration order whatever order they finished in. A
    failing hook fails the phase: the first failure in registration order is raised, once every
    hook has answered (so which one is raised does not depend on timing)."""
    called = [(p, getattr(p, hook)(with_config(replace(ctx, writer=f"plugin:{p.id}"), p), *args))
              for p in plugins if overrides(p, hook)]
    pending = [(i, r) for i, (_p, r) in enumerate(called) if r is not None and not isinstance(r, (list, tuple))]
    answers: list[Any] = [r for _p, r in called]
    if pending:
        done = await asyncio.gather(*(answered(r) for _i, r in pending), return_exceptions=True)
        for (i, _r), value in zip(pending, done, strict=True):
            answers[i] = value
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            raise failed
    return [(p, check_phase(a or (), hook, f"plugin {p.id!r}")) for (p, _r), a in zip(called, answers, strict=True)]


async def run_hook(plugins: Sequence[Plugin], hook: str, ctx: PhaseContext, *args: Any) -> list[Action]:
    """`gather_hook`, its actions in registration order."""
    return [a for _plugin, actions in await gather_hook(plugins, hook, ctx, *args) for a in actions]
