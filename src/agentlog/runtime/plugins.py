"""Plugins: hooks at each phase of the loop that answer with typed actions.

A plugin never touches the log, the model or the tools. It reads a `PhaseContext` and returns
actions; the loop validates each action against the phase it came from (an action in the wrong
phase is a `PluginError`, which ends the run `error`) and turns accepted actions into events. That
keeps plugins replayable: the same context gives the same actions, and every effect they have is
an event in the log.

Hooks may be plain or async functions (async for plugins that must consult something).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import JSON, Emitted, SuspendTicket, ToolCall, ToolCallDecision, Verdict
from agentlog.runtime.models.base import ModelResponse
from agentlog.runtime.state.batch import MutationBatch
from agentlog.runtime.state.keys import StateKey
from agentlog.runtime.tools import ToolResult


class PluginError(AgentlogError):
    code = "plugin_error"


# -- actions --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddContext:
    """BeforeInference: append `text` to the system prompt of this inference only."""

    text: str


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


#: Typed state writes (`PhaseContext.mutate()`): any phase that takes `PatchState` takes a
#: `MutationBatch` too (`agentlog.runtime.state.batch`).
Action = Union[
    AddContext, ExcludeTools, IncludeOnlyTools, OverrideInference, Terminate, Block, Gate, Suspend,
    SetResult, PatchState, AddUserMessage, Emit, HandOff, MutationBatch,
]

#: Which actions each phase accepts.
PHASE_ACTIONS: dict[str, tuple[type[Action], ...]] = {
    "run_start": (PatchState, MutationBatch, Emit, Terminate, HandOff),
    "step_start": (PatchState, MutationBatch, Emit, Terminate, HandOff),
    "before_inference": (AddContext, ExcludeTools, IncludeOnlyTools, OverrideInference, Terminate, PatchState,
                         MutationBatch, Emit),
    "after_inference": (Terminate, PatchState, MutationBatch, Emit),
    "before_tool_execute": (Block, Gate, Suspend, SetResult, PatchState, MutationBatch, Emit),
    "after_tool_execute": (AddUserMessage, PatchState, MutationBatch, Emit, HandOff),
    "step_end": (PatchState, MutationBatch, Emit, Terminate, HandOff),
    "run_end": (PatchState, MutationBatch, Emit),
}


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


Actions = Sequence[Action]
HookResult = Actions | None | Awaitable[Actions | None]


class Plugin:
    """Base class: override the hooks you need; each returns actions (or None for none).
    `state_keys`: the typed state keys the plugin reads and writes, registered with every
    agent it is in."""

    id: str = "plugin"
    state_keys: Sequence[StateKey[Any]] = ()

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


async def run_hook(plugins: Sequence[Plugin], hook: str, ctx: PhaseContext, *args: Any) -> list[Action]:
    """Call `hook` on every plugin that implements it, in order; validate the actions' phase."""
    allowed = PHASE_ACTIONS[hook]
    out: list[Action] = []
    for plugin in plugins:
        if not overrides(plugin, hook):
            continue
        result = getattr(plugin, hook)(ctx, *args)
        if result is not None and not isinstance(result, (list, tuple)):
            result = await result
        for action in result or ():
            if not isinstance(action, allowed):
                raise PluginError(
                    f"plugin {plugin.id!r} returned {type(action).__name__} from {hook}, which accepts "
                    f"only {', '.join(t.__name__ for t in allowed)}"
                )
            out.append(action)
    return out
