"""The app of the deployed plugin and tool-policy tests (tests/e2e/test_plugins_deployed.py):
`agentlog serve --app tests.apps.plugins_app:app`, with `PLUGINS_APP_OPENAPI_URL` naming the
pet-store document (tests/fakes/fake_openapi.py).

It is a configuration file's app (built from `CONFIG` by `agentlog.runtime.config`, so the
`openapi`, `circuit_breaker`, `max_rounds`, `sections`, `deferred_tools` and `overrides` keys are
loaded as users write them), plus what a config cannot say: the `flaky` model fails every
request (its circuit breaker opens, the fallback answers). Every scripted model picks its turn
from the conversation, so each new thread starts its script again.

Agents: `files` (a run's tool policy; a result's details and follow-up), `catalog` (deferred
tools found by tool_search), `pets` (an OpenAPI tool, the flaky primary model), `plugged` (a
plugin's tool and config section, a reminder, an input filter), `looping` (the file's default
max_rounds).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pydantic

from agentlog.runtime import PhaseContext, Plugin, RejectInput, Tool, ToolContext, tool
from agentlog.runtime.config import AgentlogConfig, LoadedConfig, build
from agentlog.runtime.models import ModelUnavailable, ScriptedModel, Turn


@tool(category="files", label="Read a file")
def read_file(path: str, ctx: ToolContext) -> str:
    """Read a file."""
    ctx.details({"bytes": 11, "path": path})
    ctx.follow_up(f"(The user attached {path}.)")
    return "hello world"


@tool
def delete_file(path: str) -> str:
    """Delete a file."""
    return "deleted"


def _issue_tool(i: int) -> Tool:
    def run(q: str = "") -> str:
        return f"ticket {i}: {q}"

    return Tool.from_function(run, name=f"gh_issue_{i}", description=f"GitHub issue operation number {i}")


ISSUES = [_issue_tool(i) for i in range(12)]


class StampConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    prefix: str = "[stamped]"


class StampPlugin(Plugin):
    """Gives its agents the `stamp` tool (its prefix from the agent's `stamp` section) and
    refuses a run whose input holds the word "secret"."""

    id = "stamp"
    config_model = StampConfig

    def __init__(self) -> None:
        @tool(category="stamps", label="Stamp a text")
        def stamp(text: str, ctx: ToolContext) -> str:
            """Stamp a text."""
            config = ctx.agent.sections.get("stamp") if ctx.agent is not None else None
            return f"{(config or StampConfig()).prefix} {text}"

        self._tools = [stamp]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def filter_input(self, ctx: PhaseContext, messages: Sequence[Any]) -> list[Any]:
        return [RejectInput("the input holds a secret")] if any("secret" in m.content for m in messages) else []


def config(openapi_url: str) -> dict[str, Any]:
    return {
        "models": {
            "files-model": {"type": "scripted", "script": [
                {"tool_calls": [{"name": "delete_file", "arguments": {"path": "/x"}},
                                {"name": "read_file", "arguments": {"path": "a.txt"}}]}, "files done"]},
            "catalog-model": {"type": "scripted", "script": [
                {"tool_calls": [{"name": "tool_search", "arguments": {"query": "select:gh_issue_7"}}]},
                {"tool_calls": [{"name": "gh_issue_7", "arguments": {"q": "bug"}}]}, "catalog done"]},
            "flaky": {"type": "scripted", "script": ["(never: replaced by a failing model)"]},
            "pets-model": {"type": "scripted", "script": [
                {"tool_calls": [{"name": "pets__getPet", "arguments": {"petId": 2}}]}, "Tom is a cat."]},
            "plugged-model": {"type": "scripted", "script": [
                {"tool_calls": [{"name": "stamp", "arguments": {"text": "ok"}}]}, "plugged done"]},
            "looping-model": {"type": "scripted", "loop": True, "script": [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "again.txt"}}]}]},
        },
        "tools": ["tests.apps.plugins_app:read_file", "tests.apps.plugins_app:delete_file",
                  "tests.apps.plugins_app:ISSUES"],
        "openapi": [{"name": "pets", "spec": openapi_url, "operations": ["getPet", "listPets"]}],
        "circuit_breaker": {"failure_threshold": 2, "cooldown_s": 3600},
        "max_rounds": 3,
        "agents": [
            {"id": "files", "model": "files-model", "tools": ["read_file", "delete_file"],
             "tool_execution_mode": "sequential", "overrides": {"tools": True}},
            {"id": "catalog", "model": "catalog-model", "tools": ["gh_issue_*"], "deferred_tools": ["gh_*"]},
            {"id": "pets", "model": "flaky", "fallback_models": ["pets-model"], "tools": ["pets__*"],
             "retry": {"max_attempts": 3, "backoff_ms": 0}},
            {"id": "plugged", "model": "plugged-model",
             "plugins": ["tests.apps.plugins_app:StampPlugin", "agentlog.runtime.rules.reminders:ReminderPlugin"],
             "sections": {"stamp": {"prefix": "[approved]"},
                          "reminder": {"rules": [{"name": "stamped", "tool": "stamp",
                                                  "output": {"status": "success", "content": "[[]approved]*"},
                                                  "message": "Stamped texts are final.", "cooldown": 1}]}}},
            {"id": "looping", "model": "looping-model", "tools": ["read_file"]},
        ],
    }


def app(store: Any) -> LoadedConfig:
    loaded = build(AgentlogConfig.model_validate(config(os.environ["PLUGINS_APP_OPENAPI_URL"])), "plugins_app")
    loaded.models["flaky"] = ScriptedModel([Turn.fail(ModelUnavailable("the provider is down"))], loop=True,
                                           name="flaky")
    return loaded
