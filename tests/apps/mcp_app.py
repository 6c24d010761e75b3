"""An app whose agents use a real MCP server (tests/fakes/mcp_server.py, official SDK, a stdio
subprocess of each process that runs agents), for the deployed MCP client tests
(tests/e2e/test_mcp_deployed.py): `--app tests.apps.mcp_app:app`.

- `mcp-user` calls the server's tool `add`, reads its resource `notes://release` and gets its
  prompt `review` in one step (`resources: true`, `prompts: true`);
- `unlocker` calls `unlock`, which adds the tool `later` to the server and says so (the
  `tools/list_changed` word);
- `late` names `mcp__calc__later`, which the server lists only after `unlock`: its runs are
  refused until the process's toolset has re-listed.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from typing import Any

from agentlog.runtime import AgentSpec, App, McpServerConfig, McpToolset
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.tools import ToolRegistry

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")


def _model(*turns: Any) -> ScriptedModel:
    return ScriptedModel(list(turns), loop=True, position="conversation")


def app(_store: Any) -> App:
    """A factory: each process connects its own MCP server (and closes it at exit)."""
    toolset = McpToolset([McpServerConfig(name="calc", command=sys.executable, args=[SERVER, "stdio"],
                                          timeout_s=30, resources=True, prompts=True)]).start()
    atexit.register(toolset.close)
    registry = toolset.register(ToolRegistry())  # kept up to date by the toolset's re-listing
    agents = [
        AgentSpec(id="mcp-user", model="mcp-user", max_rounds=3,
                  tools=["mcp__calc__add", "mcp__calc__read_resource", "mcp__calc__get_prompt"]),
        AgentSpec(id="unlocker", model="unlocker", tools=["mcp__calc__unlock"], max_rounds=3),
        AgentSpec(id="late", model="late", tools=["mcp__calc__later"], max_rounds=3),
    ]
    models = {
        "mcp-user": _model(Turn.tools(("mcp__calc__add", {"a": 2, "b": 3}),
                                      ("mcp__calc__read_resource", {"uri": "notes://release"}),
                                      ("mcp__calc__get_prompt", {"name": "review", "arguments": {"path": "a.py"}})),
                           Turn.text("used the server")),
        "unlocker": _model(Turn.tool("mcp__calc__unlock", {}), Turn.text("unlocked")),
        "late": _model(Turn.tool("mcp__calc__later", {}), Turn.text("late")),
    }
    return App(agents=agents, tools=registry, models=models)
