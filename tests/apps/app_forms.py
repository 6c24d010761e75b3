"""Every form `--app module:attr` accepts (agentlog.gateway.operations.app_loader), for tests/cli/test_app_forms.py."""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, App, Runtime
from agentlog.runtime.agents.spec import AgentRegistry
from agentlog.runtime.models.scripted import ScriptedModel, Turn


def _agent() -> AgentSpec:
    return AgentSpec(id="echo", model=ScriptedModel([Turn.text("hi")], loop=True), system_prompt="echo")


app = App(agents=[_agent()])
agents_list = [_agent()]
registry = AgentRegistry([_agent()])
runtime_obj = Runtime(MemoryEventStore(), agents=[_agent()])


def factory_app(store: Any) -> App:
    return App(agents=[_agent()])


def factory_runtime(store: Any) -> Runtime:
    return Runtime(store, agents=[_agent()])


def factory_registry(store: Any) -> AgentRegistry:
    return AgentRegistry([_agent()])


FORMS = ["app", "agents_list", "registry", "runtime_obj", "factory_app", "factory_runtime", "factory_registry"]
