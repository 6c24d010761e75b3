"""agentlog: an event-sourced runtime for AI agents on NATS JetStream.

    from agentlog import AgentSpec, JetStreamEventStore, Runtime, ScriptedModel, Turn, tool

The names here are the ones an app needs; everything else lives in the subpackages, by layer:
`agentlog.eventlog` (events, the JetStream store), `agentlog.projections` (folds, KV views),
`agentlog.runtime` (agents, tools, models, plugins, the loop, replay, snapshots, workers),
`agentlog.gateway` (the operations every transport shares, HTTP, the NATS micro service, the
protocol adapters), `agentlog.cli`, `agentlog.client` (the Python client of the HTTP API) and
`agentlog.testing` (helpers for tests of agentlog apps). The names are imported on first use, so
`import agentlog` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the log
    "JetStreamEventStore": "agentlog.eventlog.jetstream.store",
    "MemoryEventStore": "agentlog.eventlog.memory",
    "EmbeddedNatsServer": "agentlog.eventlog.embedded.server",
    "AgentlogError": "agentlog.eventlog.errors",
    # agents, tools, models
    "Runtime": "agentlog.runtime.facade",
    "RunHandle": "agentlog.runtime.runs.handle",
    "RunResult": "agentlog.runtime.runs.handle",
    "AgentSpec": "agentlog.runtime.agents.spec",
    "ContextPolicy": "agentlog.runtime.context_policy",
    "tool": "agentlog.runtime.tools",
    "Tool": "agentlog.runtime.tools",
    "ToolContext": "agentlog.runtime.tools",
    "ToolError": "agentlog.runtime.tools",
    "PermissionPlugin": "agentlog.runtime.permission",
    # typed state
    "StateKey": "agentlog.runtime.state.keys",
    "MemoryPlugin": "agentlog.runtime.toolkits.memory",
    "McpServerConfig": "agentlog.runtime.toolkits.mcp",
    "McpToolset": "agentlog.runtime.toolkits.mcp",
    "SubAgents": "agentlog.runtime.toolkits.subagents",
    "Worker": "agentlog.runtime.workers.worker",
    "load_config": "agentlog.runtime.config",
    "Model": "agentlog.runtime.models.base",
    "OpenAIChatModel": "agentlog.runtime.models.openai",
    "OpenAIResponsesModel": "agentlog.runtime.models.openai_responses",
    "AnthropicModel": "agentlog.runtime.models.anthropic",
    "GeminiModel": "agentlog.runtime.models.gemini",
    "ModelPrices": "agentlog.runtime.models.pricing",
    "ModelPool": "agentlog.runtime.models.pool",
    "ScriptedModel": "agentlog.runtime.models.scripted",
    "Turn": "agentlog.runtime.models.scripted",
    # an app for `agentlog serve|worker --app module:attr`
    "App": "agentlog.runtime.facade",
}

__all__ = [
    "__version__",
    "AgentSpec", "AgentlogError", "App", "ContextPolicy", "EmbeddedNatsServer", "JetStreamEventStore",
    "McpServerConfig", "McpToolset", "MemoryEventStore", "MemoryPlugin", "Model", "OpenAIChatModel", "PermissionPlugin",
    "RunHandle", "RunResult", "Runtime", "ScriptedModel", "StateKey", "SubAgents", "Tool", "ToolContext", "ToolError",
    "Turn", "Worker", "load_config", "tool",
    "AnthropicModel", "GeminiModel", "OpenAIResponsesModel", "ModelPrices", "ModelPool",
]


def _installed_version() -> str:
    """The installed distribution's version. Read on first use: `importlib.metadata` costs ~45 ms
    of CPU to import, in every agentlog process, and only `--version` and a few answers need it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("agentlog")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        version = globals()["__version__"] = _installed_version()
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    __version__: str
    from agentlog.eventlog.embedded.server import EmbeddedNatsServer
    from agentlog.eventlog.errors import AgentlogError
    from agentlog.eventlog.jetstream.store import JetStreamEventStore
    from agentlog.eventlog.memory import MemoryEventStore
    from agentlog.runtime.agents.spec import AgentSpec
    from agentlog.runtime.config import load_config
    from agentlog.runtime.context_policy import ContextPolicy
    from agentlog.runtime.facade import App, Runtime
    from agentlog.runtime.models.anthropic import AnthropicModel
    from agentlog.runtime.models.base import Model
    from agentlog.runtime.models.gemini import GeminiModel
    from agentlog.runtime.models.openai import OpenAIChatModel
    from agentlog.runtime.models.openai_responses import OpenAIResponsesModel
    from agentlog.runtime.models.pool import ModelPool
    from agentlog.runtime.models.pricing import ModelPrices
    from agentlog.runtime.models.scripted import ScriptedModel, Turn
    from agentlog.runtime.permission import PermissionPlugin
    from agentlog.runtime.runs.handle import RunHandle, RunResult
    from agentlog.runtime.state.keys import StateKey
    from agentlog.runtime.toolkits.mcp import McpServerConfig, McpToolset
    from agentlog.runtime.toolkits.memory import MemoryPlugin
    from agentlog.runtime.toolkits.subagents import SubAgents
    from agentlog.runtime.tools import Tool, ToolContext, ToolError, tool
    from agentlog.runtime.workers.worker import Worker
