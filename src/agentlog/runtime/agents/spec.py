"""Agent definitions (`AgentSpec`) and the registries the runtime resolves names from.

An `AgentSpec` is configuration, not behaviour: the loop is a pure function of it and the log. It
names its model and tools; the runtime resolves them from its model and tool registries, so the
same spec can run against a scripted model in tests and a real one in production.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import pydantic

from agentlog.eventlog.ids import validate_id
from agentlog.runtime.agents.deferred import TOOL_SEARCH, ToolSearch
from agentlog.runtime.agents.handoff import HandoffPlugin, handoff_tools, transfer_tool_name
from agentlog.runtime.context_policy import ContextPolicy
from agentlog.runtime.inputs.run_input import OverridePolicy
from agentlog.runtime.models.base import Model
from agentlog.runtime.models.pool import ModelPool
from agentlog.runtime.plugins import Plugin, config_key
from agentlog.runtime.state.keys import StateKey, collect_keys
from agentlog.runtime.stop import MaxRounds, StopCondition
from agentlog.runtime.tools import Tool

ToolExecutionMode = Literal["sequential", "parallel_batch_approval", "parallel_streaming"]


class RetryPolicy(pydantic.BaseModel):
    """Retries of retryable model errors (before moving on to the next fallback model).

    The one retry policy of a run: the loop makes `max_attempts` requests per model, and a
    self-retrying client (the OpenAI one) makes a single request per attempt under it, so the
    two never multiply. The default matches what the OpenAI client alone does (3 attempts)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = pydantic.Field(default=3, ge=1)
    backoff_ms: int = pydantic.Field(default=200, ge=0)
    backoff_multiplier: float = pydantic.Field(default=2.0, ge=1.0)

    def delay_s(self, failed_attempts: int, retry_after: float | None = None) -> float:
        """Seconds to wait after `failed_attempts` (>= 1) failed attempts: exponential backoff,
        or the provider's `Retry-After` when it gave one (capped at a minute)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, _MAX_RETRY_AFTER_S))
        return self.backoff_ms / 1000 * self.backoff_multiplier ** (failed_attempts - 1)


#: A provider's `Retry-After` longer than this is not honoured in full (the run would look hung).
_MAX_RETRY_AFTER_S = 60.0


class AgentOptions(pydantic.BaseModel):
    """How an agent behaves, apart from what it is (id, model, tools, plugins): shared by
    `AgentSpec` and the declarative configuration (`agentlog.runtime.config.AgentConfig`)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    #: What the agent is for, as `GET /v1/agents` shows it to clients (not sent to the model).
    description: str = ""
    system_prompt: str = ""
    tool_execution_mode: ToolExecutionMode = "parallel_streaming"
    #: Shorthand for a `max_rounds` stop condition (ignored if one is given explicitly).
    max_rounds: int | None = pydantic.Field(default=None, ge=1)
    stop_conditions: list[StopCondition] = []
    retry: RetryPolicy = RetryPolicy()
    #: Model registry names tried in order after the primary model fails.
    fallback_models: list[str] = []
    #: A pool of models (`agentlog.runtime.models.pool`): each run gets one by the pool's
    #: affinity, recorded in its `RunStarted`; the others are its fallbacks (instead of
    #: `model` / `fallback_models`).
    pool: ModelPool | None = None
    #: An answer cut off by the output token limit (no tool calls) is continued this many times
    #: at most in the same step: the partial answer is kept, an internal user message asks the
    #: model to go on, and every piece is recorded (replay answers each from the log).
    max_continuations: int = pydantic.Field(default=2, ge=0)
    #: Provider options passed to every inference (temperature, max_tokens...).
    model_options: dict[str, Any] = {}
    #: Token budget, tool-result shrinking, truncation and summaries (`agentlog.runtime.context_policy`).
    context: ContextPolicy | None = None
    #: Sub-agents (`agentlog.runtime.toolkits.subagents`): the agents this one may start with `agent_run`
    #: (None: every registered agent), minus `excluded_agents`.
    allowed_agents: list[str] | None = None
    excluded_agents: list[str] = []
    #: Agents this one may hand the thread to (`agentlog.runtime.agents.handoff`): each gets a
    #: `transfer_to_<agent>` tool; a successful call makes that agent the active one.
    handoffs: list[str] = []
    #: Tools (names or globs of this agent's tools) not offered to the model until it finds them
    #: with the `tool_search` tool the agent then gets (`agentlog.runtime.agents.deferred`): for
    #: catalogs of hundreds of tools.
    deferred_tools: list[str] = []

    @pydantic.field_validator("handoffs")
    @classmethod
    def _handoffs_are_ids(cls, v: list[str]) -> list[str]:
        for agent_id in v:
            validate_id(agent_id, "handoff agent id")
        return list(dict.fromkeys(v))

    #: What one request may change for its run (model, system prompt, option keys): nothing
    #: by default (`agentlog.runtime.inputs.run_input`).
    overrides: OverridePolicy = OverridePolicy()
    #: Plugins' configuration sections, by `config_key` (`agentlog.runtime.plugins.Plugin.config_model`):
    #: validated against the plugins when the agent is defined; a section no plugin of the agent
    #: claims is an error (a typo would silently configure nothing).
    sections: dict[str, Any] = {}
    #: Plugin ids whose behaviour (hooks, tools, request transform, input filter) applies to this
    #: agent; empty: every plugin's. Scheduled-action and effect handlers and configuration
    #: always apply.
    hook_filter: list[str] = []

    def options(self) -> dict[str, Any]:
        """These fields as keyword arguments (to build an `AgentSpec` from a config)."""
        return {name: getattr(self, name) for name in AgentOptions.model_fields}


class AgentSpec(AgentOptions):
    model_config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    id: str
    #: A model registry name, or a `Model` instance (handy in tests and scripts).
    model: str | Any
    #: Tool names, resolved from the runtime's tool registry.
    tools: list[str] = []
    plugins: list[Plugin] = []
    #: Typed state keys of the agent (its plugins' and tools' are added to them: `state_keys`).
    state_keys: list[StateKey[Any]] = []

    @pydantic.field_validator("id")
    @classmethod
    def _id_is_token(cls, v: str) -> str:
        return validate_id(v, "agent_id")

    @pydantic.model_validator(mode="after")
    def _wire_plugins(self) -> AgentSpec:
        """Plugins' sections validated against their `config_model`s, the hook filter checked,
        and the active plugins' tools offered after the agent's own."""
        claimed = {config_key(p): p for p in self.plugins if p.config_model is not None}
        unclaimed = sorted(set(self.sections) - set(claimed))
        if unclaimed:
            raise ValueError(f"sections {', '.join(map(repr, unclaimed))}: no plugin of this agent has that "
                             f"config key (plugins' keys: {', '.join(sorted(claimed)) or 'none'})")
        for key, plugin in claimed.items():
            raw = self.sections.get(key)
            if raw is None or isinstance(raw, plugin.config_model):  # type: ignore[arg-type]
                continue
            try:
                self.sections[key] = plugin.config_model.model_validate(raw)  # type: ignore[union-attr]
            except pydantic.ValidationError as exc:
                detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"sections.{key}: {detail}") from None
        ids = {p.id for p in self.plugins}
        unknown = [i for i in self.hook_filter if i not in ids]
        if unknown:
            raise ValueError(f"hook_filter names {', '.join(map(repr, unknown))}, not a plugin of this agent "
                             f"(plugins: {', '.join(sorted(ids)) or 'none'})")
        for plugin in self.active_plugins():
            self.tools = [*self.tools, *(t.name for t in plugin.tools() if t.name not in self.tools)]
        return self

    def active_plugins(self) -> list[Plugin]:
        """The plugins whose behaviour applies to this agent (`hook_filter`), in order."""
        if not self.hook_filter:
            return list(self.plugins)
        # the plugin of declared handoffs is the agent's own wiring, not a behaviour to filter
        return [p for p in self.plugins if p.id in self.hook_filter or isinstance(p, HandoffPlugin)]

    @pydantic.model_validator(mode="after")
    def _wire_tool_search(self) -> AgentSpec:
        """Deferred tools come with `tool_search` (offered after the agent's own tools)."""
        if self.deferred_tools and TOOL_SEARCH not in self.tools:
            self.tools = [*self.tools, TOOL_SEARCH]
        return self

    @pydantic.model_validator(mode="after")
    def _wire_handoffs(self) -> AgentSpec:
        """Declared handoffs become tools (offered after the agent's own; a permission plugin
        gates a transfer like any call) and the plugin that turns their calls into `HandOff`
        (after the agent's own plugins, which see the transfer's result first)."""
        if self.handoffs:
            names = [transfer_tool_name(a) for a in self.handoffs]
            self.tools = [*self.tools, *(n for n in names if n not in self.tools)]
            if not any(isinstance(p, HandoffPlugin) for p in self.plugins):
                self.plugins = [*self.plugins, HandoffPlugin(self.handoffs)]
        return self

    @pydantic.model_validator(mode="after")
    def _keys_agree(self) -> AgentSpec:
        """Two declarations of one state key name (the agent's, its plugins') must agree."""
        collect_keys(self.state_keys, self.plugins)
        return self

    @pydantic.field_validator("model")
    @classmethod
    def _model_is_name_or_model(cls, v: Any) -> Any:
        if isinstance(v, str) or isinstance(v, Model):
            return v
        raise ValueError("model must be a registry name or an object with a stream(request) method")

    @property
    def model_name(self) -> str:
        """The name the model is known by in requests (the registry key, or the instance's
        `name` attribute, else its class name)."""
        if isinstance(self.model, str):
            return self.model
        return str(getattr(self.model, "name", type(self.model).__name__))

    def effective_stop_conditions(self) -> list[Any]:
        """`stop_conditions` with `max_rounds` lowered into a `MaxRounds` unless one is explicit."""
        conds = list(self.stop_conditions)
        if self.max_rounds is not None and not any(isinstance(c, MaxRounds) for c in conds):
            conds.insert(0, MaxRounds(rounds=self.max_rounds))
        return conds


def derived_tools(agents: Iterable[AgentSpec], descriptions: Mapping[str, str] | None = None) -> list[Tool]:
    """The tools agents' specs call for besides the app's own, each once: the
    `transfer_to_<agent>` tools of declared handoffs (described with `descriptions` of their
    targets), `tool_search` for deferred tools, and the tools of their active plugins (marked
    with the plugin's id in `Tool.provided_by`). The `Runtime` registers them; replay and the
    agent catalog list them the same way."""
    specs = list(agents)
    out: list[Tool] = list(handoff_tools(specs, descriptions))
    if any(a.deferred_tools for a in specs):
        out.append(ToolSearch())
    seen = {t.name for t in out}
    for spec in specs:
        for plugin in spec.active_plugins():
            for t in plugin.tools():
                if t.name not in seen:
                    seen.add(t.name)
                    t.provided_by = plugin.id
                    out.append(t)
    return out


class UnknownAgent(LookupError):
    #: The API's code for it (agentlog.gateway.operations.dispatch.AgentNotFound has the same): a worker that
    #: dead-letters a start for an agent it does not have reports this code to the gateway.
    code = "agent_not_found"


class AgentRegistry:
    def __init__(self, agents: Iterable[AgentSpec] = ()) -> None:
        self._agents: dict[str, AgentSpec] = {}
        for a in agents:
            self.register(a)

    def register(self, agent: AgentSpec) -> AgentSpec:
        if agent.id in self._agents and self._agents[agent.id] is not agent:
            raise ValueError(f"an agent named {agent.id!r} is already registered")
        self._agents[agent.id] = agent
        return agent

    def get(self, agent_id: str) -> AgentSpec:
        try:
            return self._agents[agent_id]
        except KeyError:
            known = ", ".join(sorted(self._agents)) or "none"
            raise UnknownAgent(f"unknown agent {agent_id!r} (registered: {known})") from None

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._agents

    def __iter__(self) -> Iterator[AgentSpec]:
        """The registered specs (e.g. for a gateway that refuses unknown agents up front)."""
        return iter(list(self._agents.values()))


class ModelRegistry:
    """Models by name; `resolve` accepts a name or passes a `Model` instance through. `build`
    makes a model for a name nobody registered (the runtime's builds `provider:model` ids), or
    returns None; what it builds is kept."""

    def __init__(self, models: Mapping[str, Model] | None = None, *,
                 build: Callable[[str], Model | None] | None = None) -> None:
        self._models: dict[str, Model] = dict(models or {})
        self._build = build

    def register(self, name: str, model: Model) -> None:
        self._models[name] = model

    def resolve(self, model: str | Model) -> Model:
        if not isinstance(model, str):
            return model
        try:
            return self._models[model]
        except KeyError:
            built = self._build(model) if self._build is not None else None
            if built is not None:
                self._models[model] = built
                return built
            known = ", ".join(sorted(self._models)) or "none"
            raise LookupError(f"unknown model {model!r} (registered: {known})") from None
