"""Two different apps for the "two apps on one NATS" tests (tests/runtime/test_apps.py): both have an
agent `greeter` (the same id, as two teams' apps might), with different tools and answers, so a
run driven by the wrong app shows in its log and fails `replay --verify` with the right one."""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, Runtime, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn


@tool
def stamp(text: str) -> str:
    """Stamp a text as alpha's."""
    return f"alpha:{text}"


@tool
def seal(text: str) -> str:
    """Seal a text as beta's."""
    return f"beta:{text}"


def alpha(store: Any) -> Runtime:
    model = ScriptedModel([Turn.tool("stamp", {"text": "hi"}), Turn.text("alpha done")], loop=True,
                          position="conversation")
    return Runtime(store, agents=[AgentSpec(id="greeter", model="m", tools=["stamp"], max_rounds=4)],
                   tools=[stamp], models={"m": model})


def beta(store: Any) -> Runtime:
    model = ScriptedModel([Turn.tool("seal", {"text": "hi"}), Turn.text("beta done")], loop=True,
                          position="conversation")
    return Runtime(store, agents=[AgentSpec(id="greeter", model="m", tools=["seal"], max_rounds=4)],
                   tools=[seal], models={"m": model})
