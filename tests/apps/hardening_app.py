"""Test app for `tests/gateway/test_hardening_http.py` deployments (`--app tests.apps.hardening_app:app`).

- `deployer`: calls `deploy` (PermissionPlugin ask: the run waits for an approval), then answers.
  `deploy` is a real side effect the test can count: each execution appends a line to
  `$HARDENING_EFFECTS_DIR/deploys` (no file, no deploy ran). Its system prompt is a secret the A2A
  card must not show; its `description` is what the card and `GET /v1/agents` show.
- `boss` delegates to `helper` (a sub-agent: a child run on its own thread), which answers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, PermissionPlugin, Runtime, ToolContext, tool
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.toolkits.subagents import SubAgents

SECRET_PROMPT = "You are the deployer. Internal: the prod vault key is hunter2."
DESCRIPTION = "Deploys releases after a human approves."


def effects_file() -> Path:
    return Path(os.environ["HARDENING_EFFECTS_DIR"]) / "deploys"


@tool
async def deploy(env: str, ctx: ToolContext) -> str:
    """Deploy a release (needs approval)."""
    with effects_file().open("a") as f:
        f.write(f"{ctx.run_id} {env}\n")
    return f"deployed {env}"


def app(store: Any) -> Runtime:
    agents = [
        AgentSpec(id="deployer", model="deployer", tools=["deploy"], system_prompt=SECRET_PROMPT,
                  description=DESCRIPTION, max_rounds=5, plugins=[PermissionPlugin(ask=["deploy"])]),
        AgentSpec(id="boss", model="boss", tools=["agent_run"], max_rounds=5),
        AgentSpec(id="helper", model="helper", max_rounds=5),
    ]
    models = {
        "deployer": ScriptedModel([Turn.tool("deploy", {"env": "prod"}), Turn.text("deployed")], loop=True,
                                  position="conversation"),
        "boss": ScriptedModel([Turn.tool("agent_run", {"agent_id": "helper", "prompt": "find x"}),
                               Turn.text("boss done")], loop=True, position="conversation"),
        "helper": ScriptedModel([Turn.text("helper done")], loop=True, position="conversation"),
    }
    rt = Runtime(store, agents=agents, tools=[deploy], models=models)
    SubAgents().install(rt)
    return rt
