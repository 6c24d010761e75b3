"""Declarative agent configuration: a YAML or JSON file instead of `--app module:attr`.

    agentlog serve --app agents.yaml

The file is validated by `AgentlogConfig` (pydantic), whose JSON Schema is published in
`src/agentlog/runtime/agentlog-config.schema.json` (editors can use it: `# yaml-language-server: $schema=...`;
regenerate with `python -m agentlog.runtime.config > src/agentlog/runtime/agentlog-config.schema.json`; a test keeps it
up to date). It covers models (scripted, OpenAI-compatible, or `provider:model` ids on the official
SDKs: `anthropic:`, `openai-responses:`, `gemini:`), their prices, model pools, tools (Python import paths), MCP
servers, OpenAPI operations, plugins, permissions, stop conditions, context policy, sub-agents, handoffs and skills
(SKILL.md folders); `load_config` turns
it into an app (`agents`, `tools`, `models`) that every command accepting `--app` can run.

What cannot be expressed as data stays code, referenced by import path (`module:attr`): tools
(a `Tool`, a plain function, or a list of them) and plugins (an instance, or a class built with
`args`). Every problem is a `ConfigError` naming the file and the field, raised at load time,
never halfway through a run.
"""

from __future__ import annotations

import atexit
import fnmatch
import importlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.store import EventStore
from agentlog.runtime.agents.spec import AgentOptions, AgentSpec
from agentlog.runtime.models.breaker import CircuitBreakerPolicy, CircuitBreakers
from agentlog.runtime.models.pool import ModelPool
from agentlog.runtime.models.pricing import ModelPrices
from agentlog.runtime.models.providers import PROVIDERS, is_provider_id, model_from_id
from agentlog.runtime.permission import PermissionPlugin, PermissionRule
from agentlog.runtime.plugins import Plugin
from agentlog.runtime.stop import MaxRounds
from agentlog.runtime.toolkits.mcp import McpError, McpServerConfig, McpToolset
from agentlog.runtime.toolkits.openapi import OpenApiConfig, OpenApiError, load_all
from agentlog.runtime.toolkits.skills import SkillCatalog, SkillError, SkillsPlugin, skill_tools
from agentlog.runtime.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from agentlog.runtime.facade import Runtime

__all__ = ["AgentlogConfig", "ConfigError", "LoadedConfig", "is_config_path", "load_config", "schema"]

SCHEMA_PATH = Path(__file__).with_name("agentlog-config.schema.json")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


#: The rounds an agent of a configuration file may take when it sets no limit of its own.
DEFAULT_MAX_ROUNDS = 16


class ConfigError(AgentlogError):
    """The configuration file is missing, unreadable or invalid; the message says where."""

    code = "config_error"


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


# -- models ----------------------------------------------------------------------------------------


class ScriptedToolCall(_Model):
    name: str
    arguments: dict[str, Any] = {}
    id: str | None = None


class ScriptedTurn(_Model):
    text: str = ""
    tool_calls: list[ScriptedToolCall] = []


class ScriptedModelConfig(_Model):
    """A deterministic scripted model (demos, tests): one turn per inference."""

    type: Literal["scripted"]
    script: list[str | ScriptedTurn] = pydantic.Field(min_length=1)
    #: `conversation`: the turn is picked from the conversation (works across workers/restarts).
    position: Literal["counter", "conversation"] = "conversation"
    loop: bool = False
    prices: ModelPrices | None = None


class OpenAIModelConfig(_Model):
    """An OpenAI-compatible chat-completions endpoint: `base_url` (a local vLLM / Ollama / LM
    Studio server, a hosted one), else `$OPENAI_BASE_URL`, else OpenAI's. The key is read from
    the environment variable `api_key_env` (never written in the file), else `$OPENAI_API_KEY`."""

    type: Literal["openai"]
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = pydantic.Field(default=120.0, gt=0)
    headers: dict[str, str] = {}
    #: USD per 1M tokens: each inference's cost is recorded in the log.
    prices: ModelPrices | None = None


class ProviderModelConfig(_Model):
    """A model on a provider's official SDK (an optional extra of agentlog: `anthropic`, `gemini`,
    `openai`). `anthropic`: Messages API (prompt caching on; `thinking_budget`
    turns extended thinking on); `openai-responses`: the Responses API (`reasoning_effort`);
    `gemini`: google-genai (`thinking_budget`); `openai-sdk`: Chat Completions on the SDK. The
    key is read from `api_key_env` (default: the provider's usual variable)."""

    type: Literal["anthropic", "gemini", "openai-responses", "openai-sdk"]
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = pydantic.Field(default=120.0, gt=0)
    headers: dict[str, str] = {}
    prices: ModelPrices | None = None
    thinking_budget: int | None = pydantic.Field(default=None, ge=0)
    reasoning_effort: str | None = None
    max_tokens: int | None = pydantic.Field(default=None, ge=1)


ModelConfig = Annotated[
    ScriptedModelConfig | OpenAIModelConfig | ProviderModelConfig, pydantic.Field(discriminator="type")
]

# -- agents ----------------------------------------------------------------------------------------


class PluginConfig(_Model):
    #: `module:attr` of a `Plugin` instance, or of a class built with `args`.
    path: str
    args: dict[str, Any] = {}


class PermissionsConfig(_Model):
    """Rules for the permission plugin: tool patterns (`read_*`, `Bash(npm *)`,
    `Edit(file_path ~ "src/**")`, `/mcp__(gh|gl)__.*/`: `agentlog.runtime.rules.patterns`) or
    `{tool, args, pattern, name}` rules."""

    allow: list[str | PermissionRule] = []
    ask: list[str | PermissionRule] = []
    deny: list[str | PermissionRule] = []
    default: Literal["allow", "deny"] = "allow"

    @pydantic.field_validator("allow", "ask", "deny")
    @classmethod
    def _patterns_parse(cls, rules: list[str | PermissionRule]) -> list[str | PermissionRule]:
        for rule in rules:
            if isinstance(rule, str):
                PermissionRule.from_text(rule)  # a PatternError names the pattern
        return rules


class AgentConfig(AgentOptions):
    """An agent: what it is (model key, tools, plugins, permissions, sub-agents) plus the
    behaviour options it shares with `AgentSpec` (`fallback_models` are keys of `models`)."""

    id: str
    #: A key of `models`, or a `provider:model` id (`anthropic:claude-sonnet-4-5`). Optional
    #: with a `pool` (its first model is the default).
    model: str | None = None
    #: A key of `pools`, or a pool written here: the run's model is picked from it.
    pool: str | ModelPool | None = None  # type: ignore[assignment]
    #: Tool names or globs over every tool of the file (local and `mcp__<server>__<tool>`).
    tools: list[str] = []
    plugins: list[str | PluginConfig] = []
    permissions: PermissionsConfig | None = None
    #: Ids of the agents of this file this agent may run as sub-agents (child runs): it gets the
    #: `agent_run` / `agent_output` / `agent_stop` tools (`agentlog.runtime.toolkits.subagents`) and, unless
    #: `allowed_agents` is set, may start exactly these agents.
    sub_agents: list[str] = []
    #: Names (or globs) of the file's `skills` this agent may use: it gets them listed in its
    #: system prompt and the `load_skill` / `read_skill_file` tools (`agentlog.runtime.toolkits.skills`).
    skills: list[str] = []


class AgentlogConfig(_Model):
    """An agentlog application as data (version 1)."""

    version: Literal[1] = 1
    #: Models by name: a model entry, or a `provider:model` id string.
    models: dict[str, ModelConfig | str] = {}
    #: Model pools by name (`agentlog.runtime.models.pool`): `{models: [...], affinity: thread}`.
    pools: dict[str, ModelPool] = {}
    #: `module:attr` import paths of tools: a `Tool`, a function (made a tool), or a list of them.
    tools: list[str] = []
    mcp_servers: list[McpServerConfig] = []
    #: OpenAPI documents whose operations become tools `<name>__<operationId>`
    #: (`agentlog.runtime.toolkits.openapi`).
    openapi: list[OpenApiConfig] = []
    #: Skill folders (relative to this file): each a skill (it holds SKILL.md) or a folder of
    #: them (`agentlog.runtime.toolkits.skills`). Agents choose theirs with their own `skills`.
    skills: list[str] = []
    #: Circuit breakers for every model (`agentlog.runtime.models.breaker`): a model that fails
    #: `failure_threshold` times in a row is skipped for `cooldown_s` (its fallbacks answer).
    circuit_breaker: CircuitBreakerPolicy | None = None
    #: The `max_rounds` of every agent that sets none (neither `max_rounds` nor a `max_rounds`
    #: stop condition), so a model that keeps calling tools stops (`stopped`, code
    #: `max_rounds`). null: no default (such agents run until the model stops calling tools).
    max_rounds: int | None = pydantic.Field(default=DEFAULT_MAX_ROUNDS, ge=1)
    agents: list[AgentConfig] = pydantic.Field(min_length=1)

    @pydantic.model_validator(mode="after")
    def _references(self) -> AgentlogConfig:
        ids = [a.id for a in self.agents]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate agent ids: {', '.join(dupes)}")
        names = [s.name for s in self.mcp_servers]
        if len(set(names)) != len(names):
            raise ValueError("duplicate MCP server names")
        apis = [o.name for o in self.openapi]
        if len(set(apis)) != len(apis):
            raise ValueError("duplicate OpenAPI names")
        for name, entry in self.models.items():
            if isinstance(entry, str) and not is_provider_id(entry):
                raise ValueError(f"model {name!r}: {entry!r} is not a provider:model id ({', '.join(PROVIDERS)})")
        for a in self.agents:
            if a.model is None and a.pool is None:
                raise ValueError(f"agent {a.id!r}: needs a model or a pool")
            if isinstance(a.pool, str) and a.pool not in self.pools:
                raise ValueError(f"agent {a.id!r}: unknown pool {a.pool!r} (pools: {', '.join(self.pools) or 'none'})")
            pool = self.pools.get(a.pool) if isinstance(a.pool, str) else a.pool
            for m in [*([a.model] if a.model else []), *a.fallback_models, *(pool.models if pool else []),
                      *a.overrides.models]:
                if m not in self.models and not is_provider_id(m):
                    raise ValueError(f"agent {a.id!r}: unknown model {m!r} (models: {', '.join(self.models) or 'none'})")
            for sub in a.sub_agents:
                if sub not in ids or sub == a.id:
                    raise ValueError(f"agent {a.id!r}: sub_agents names {sub!r}, not another agent of this file")
            for target in a.handoffs:
                if target not in ids or target == a.id:
                    raise ValueError(f"agent {a.id!r}: handoffs names {target!r}, not another agent of this file")
            if a.skills and not self.skills:
                raise ValueError(f"agent {a.id!r}: uses skills but the file declares no `skills` folders")
        return self


def schema() -> dict[str, Any]:
    """The published JSON Schema of the configuration file."""
    out = AgentlogConfig.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "agentlog configuration"
    return out


# -- loading ---------------------------------------------------------------------------------------


@dataclass
class LoadedConfig:
    """What a configuration file becomes: an app (`agents`, `tools`, `models`) plus the MCP
    toolset it opened (close it with `close()`) and each agent's allowed sub-agents."""

    agents: list[AgentSpec]
    tools: ToolRegistry
    models: dict[str, Any]
    toolset: McpToolset | None = None
    sub_agents: dict[str, list[str]] = field(default_factory=dict)
    config: AgentlogConfig | None = None
    #: The models' circuit breakers (`circuit_breaker:`), shared by the runtimes made from this.
    breakers: CircuitBreakers | None = None

    def runtime(self, store: EventStore, **options: Any) -> Runtime:
        from agentlog.runtime.facade import Runtime

        options.setdefault("breakers", self.breakers)
        return Runtime(store, agents=self.agents, tools=self.tools, models=dict(self.models), **options)

    def close(self) -> None:
        if self.toolset is not None:
            self.toolset.close()


def is_config_path(spec: str) -> bool:
    return spec.lower().endswith(CONFIG_SUFFIXES)


def parse_config(text: str, source: str = "<config>") -> AgentlogConfig:
    """Validate YAML or JSON text (YAML is a superset of JSON). Raises `ConfigError`."""
    import yaml

    try:
        raw = json.loads(text) if source.lower().endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from None
    try:
        return AgentlogConfig.model_validate(raw)
    except pydantic.ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{source}: {detail}") from None


def _import(path: str, what: str, source: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{source}: {what} {path!r} must be an import path module:attr")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - the user's module: any failure is a config error
        raise ConfigError(f"{source}: {what} {path!r} could not be imported: {type(exc).__name__}: {exc}") from None
    return obj


def _tools(paths: Iterable[str], source: str) -> list[Tool]:
    out: list[Tool] = []
    for path in paths:
        obj = _import(path, "tool", source)
        items = obj if isinstance(obj, (list, tuple)) else [obj]
        for item in items:
            if isinstance(item, Tool):
                out.append(item)
            elif callable(item):
                out.append(Tool.from_function(item))
            else:
                raise ConfigError(f"{source}: tool {path!r} is a {type(item).__name__}, not a tool or function")
    return out


def _plugin(entry: str | PluginConfig, source: str) -> Plugin:
    cfg = entry if isinstance(entry, PluginConfig) else PluginConfig(path=entry)
    obj = _import(cfg.path, "plugin", source)
    if isinstance(obj, type):
        try:
            obj = obj(**cfg.args)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"{source}: plugin {cfg.path!r}({cfg.args}) failed: {type(exc).__name__}: {exc}") from None
    elif cfg.args:
        raise ConfigError(f"{source}: plugin {cfg.path!r} is an instance; `args` needs a class")
    if not isinstance(obj, Plugin):
        raise ConfigError(f"{source}: plugin {cfg.path!r} is a {type(obj).__name__}, not an agentlog Plugin")
    return obj


def _model(name: str, cfg: ScriptedModelConfig | OpenAIModelConfig | ProviderModelConfig | str, source: str) -> Any:
    if isinstance(cfg, str):
        return model_from_id(cfg, name=name)
    if isinstance(cfg, ScriptedModelConfig):
        from agentlog.runtime.models import ScriptedCall, ScriptedModel, Turn

        turns = [t if isinstance(t, str) else Turn.tools(
            *(ScriptedCall(c.name, c.arguments, c.id) for c in t.tool_calls), text=t.text) for t in cfg.script]
        return ScriptedModel(turns, position=cfg.position, loop=cfg.loop, name=name, prices=cfg.prices)
    key = None
    if cfg.api_key_env is not None:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise ConfigError(f"{source}: model {name!r}: environment variable {cfg.api_key_env} is not set")
    if isinstance(cfg, ProviderModelConfig):
        extra: dict[str, Any] = {}
        if cfg.type in ("anthropic", "gemini") and cfg.thinking_budget is not None:
            extra["thinking_budget"] = cfg.thinking_budget
        if cfg.type == "openai-responses" and cfg.reasoning_effort is not None:
            extra["reasoning_effort"] = cfg.reasoning_effort
        if cfg.type == "anthropic" and cfg.max_tokens is not None:
            extra["max_tokens"] = cfg.max_tokens
        return model_from_id(f"{cfg.type}:{cfg.model}", base_url=cfg.base_url, api_key=key, timeout=cfg.timeout_s,
                             headers=cfg.headers or None, prices=cfg.prices, name=name, **extra)
    from agentlog.runtime.models import OpenAIChatModel

    return OpenAIChatModel(cfg.model, base_url=cfg.base_url, api_key=key, timeout=cfg.timeout_s,
                           headers=cfg.headers or None, prices=cfg.prices)


def _expand(patterns: list[str], known: list[str], agent: str, source: str) -> list[str]:
    """Tool names and globs -> names, in pattern order, each once; a pattern matching nothing
    is an error (a typo would otherwise silently remove a tool)."""
    out: list[str] = []
    for pattern in patterns:
        matched = [n for n in known if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ConfigError(f"{source}: agent {agent!r}: no tool matches {pattern!r} (tools: {', '.join(known) or 'none'})")
        out += [n for n in matched if n not in out]
    return out


def _skills(config: AgentlogConfig, base: Path, source: str) -> tuple[dict[str, list[str]], SkillCatalog | None]:
    """The skill catalog of the file's `skills` folders (relative to `base`) and each agent's
    chosen skill names. Raises `ConfigError`."""
    if not config.skills:
        return {}, None
    try:
        catalog = SkillCatalog.load(*(base / folder for folder in config.skills))
        return {a.id: catalog.select(a.skills) for a in config.agents if a.skills}, catalog
    except SkillError as exc:
        raise ConfigError(f"{source}: skills: {exc}") from None


def build(config: AgentlogConfig, source: str = "<config>", base: Path | None = None) -> LoadedConfig:
    """Turn a validated config into an app: import tools and plugins, build models, connect
    the MCP servers (blocking, bounded by each server's `timeout_s`) and register their tools.
    `base`: the folder relative paths (skills, OpenAPI documents) are read from (default: the
    working directory). OpenAPI documents given by URL are downloaded here."""
    chosen_skills, catalog = _skills(config, base or Path.cwd(), source)
    registry = ToolRegistry()
    for t in _tools(config.tools, source):
        try:
            registry.register(t)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    models = {name: _model(name, cfg, source) for name, cfg in config.models.items()}
    pools = {a.id: config.pools[a.pool] if isinstance(a.pool, str) else a.pool for a in config.agents}
    for a in config.agents:  # `provider:model` ids named directly by agents and pools
        pool = pools[a.id]
        for ref in [*([a.model] if a.model else []), *a.fallback_models, *(pool.models if pool else []),
                    *a.overrides.models]:
            if ref not in models:
                models[ref] = _model(ref, ref, source)
    try:
        for t in load_all(config.openapi, base or Path.cwd()):
            registry.register(t)
    except (OpenApiError, ValueError) as exc:
        raise ConfigError(f"{source}: openapi: {exc}") from None
    toolset: McpToolset | None = None
    if config.mcp_servers:
        toolset = McpToolset(config.mcp_servers)
        try:
            toolset.start()
        except McpError as exc:
            toolset.close()
            raise ConfigError(f"{source}: {exc}") from None
        toolset.register(registry)
        atexit.register(toolset.close)  # stdio servers end with us even without an explicit close
    delegating = [a for a in config.agents if a.sub_agents]
    if delegating:  # the sub-agent tools (`agentlog.runtime.toolkits.subagents`), once, for the agents that delegate
        from agentlog.runtime.toolkits.subagents import SubAgents

        sub_tools = SubAgents().tools
        for t in sub_tools:
            registry.register(t)
    skill_tool_names: list[str] = []
    if catalog is not None and chosen_skills:  # `load_skill` / `read_skill_file`, each agent its skills
        for t in skill_tools(catalog, chosen_skills):
            registry.register(t)
            skill_tool_names.append(t.name)
    try:
        known = registry.names()
        agents = []
        for a in config.agents:
            plugins = [_plugin(p, source) for p in a.plugins]
            if a.permissions is not None:
                p = a.permissions
                plugins.insert(0, PermissionPlugin(allow=p.allow, ask=p.ask, deny=p.deny, default=p.default))
            tools = _expand(a.tools, known, a.id, source)
            for pattern in a.deferred_tools:  # a typo would silently offer the tool at once
                if not any(fnmatch.fnmatchcase(n, pattern) for n in tools):
                    raise ConfigError(f"{source}: agent {a.id!r}: deferred_tools {pattern!r} matches none of its "
                                      f"tools ({', '.join(tools) or 'none'})")
            if a.id in chosen_skills and catalog is not None:
                plugins.append(SkillsPlugin(catalog, chosen_skills[a.id]))
                tools += [n for n in skill_tool_names if n not in tools]
            options = a.options()
            if (config.max_rounds is not None and a.max_rounds is None
                    and not any(isinstance(c, MaxRounds) for c in a.stop_conditions)):
                options["max_rounds"] = config.max_rounds
            if a.sub_agents:  # `sub_agents` is the config's spelling of the sub-agent tools + allowed_agents
                tools += [t.name for t in sub_tools if t.name not in tools]
                if options["allowed_agents"] is None:
                    options["allowed_agents"] = list(a.sub_agents)
            pool = pools[a.id]
            options["pool"] = pool
            model = a.model or (pool.models[0] if pool is not None else None)
            try:
                agents.append(AgentSpec(id=a.id, model=model, tools=tools, plugins=plugins, **options))
            except pydantic.ValidationError as exc:
                detail = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
                raise ConfigError(f"{source}: agent {a.id!r}: {detail}") from None
            except ValueError as exc:
                raise ConfigError(f"{source}: agent {a.id!r}: {exc}") from None
    except ConfigError:
        if toolset is not None:
            toolset.close()
        raise
    breakers = CircuitBreakers(config.circuit_breaker) if config.circuit_breaker is not None else None
    return LoadedConfig(agents=agents, tools=registry, models=models, toolset=toolset,
                        sub_agents={a.id: list(a.sub_agents) for a in config.agents}, config=config,
                        breakers=breakers)


def load_config(path: str | os.PathLike[str]) -> LoadedConfig:
    """Read, validate and build a YAML/JSON configuration file. Raises `ConfigError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc.strerror or exc}") from None
    return build(parse_config(text, str(p)), str(p), p.parent)


if __name__ == "__main__":  # python -m agentlog.runtime.config > src/agentlog/runtime/agentlog-config.schema.json
    print(json.dumps(schema(), indent=2, sort_keys=True))
