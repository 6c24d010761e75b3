"""The app `agentlog serve` runs for tests/cli/test_cli_runs.py (`--app tests.apps.cli_runs_app:app`).

`deployer` asks a human before its one `deploy` call (permission `ask`), then answers "done";
`chat` answers "hello" to anything (continuations). Scripted models by conversation position, so
a continuation on the same thread gets the next turn.
"""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, tool
from agentlog.runtime.models import ScriptedModel, Turn


@tool
def deploy(env: str) -> str:
    """Deploy to an environment (asks a human first)."""
    return f"deployed {env}"


def app(store: Any) -> Runtime:
    agents = [
        AgentSpec(id="deployer", model="deployer", tools=["deploy"], plugins=[PermissionPlugin(ask=["deploy"])],
                  max_rounds=5),
        AgentSpec(id="chat", model="chat", max_rounds=2),
    ]
    models = {
        "deployer": ScriptedModel([Turn.tool("deploy", {"env": "prod"}), Turn.text("done")], loop=True,
                                  position="conversation"),
        "chat": ScriptedModel([Turn.text("hello")], loop=True, position="conversation"),
    }
    return Runtime(store, agents=agents, tools=[deploy], models=models)
