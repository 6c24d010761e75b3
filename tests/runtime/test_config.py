"""Declarative agent configuration (agentlog.runtime.config): the published JSON Schema is current, a YAML
file with models, tools, an MCP server (real stdio subprocess), plugins, permissions, stop
conditions, context policy and sub-agents loads through `--app file.yaml` and runs on a real
nats-server, and every mistake is a typed error naming the field."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agentlog.gateway.operations.app_loader import AppConfigInvalid, load_app, resolve_app
from agentlog.runtime.config import SCHEMA_PATH, AgentlogConfig, load_config, schema
from agentlog.runtime.context_policy import ContextPolicy
from agentlog.runtime.permission import PermissionPlugin
from agentlog.runtime.stop import MaxRounds, StopOnTool

from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

MCP_SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")

CONFIG = f"""
version: 1
models:
  main:
    type: scripted
    position: counter
    script:
      - tool_calls: [{{name: add, arguments: {{a: 2, b: 3}}}}]
      - tool_calls: [{{name: mcp__calc__shout, arguments: {{text: hey}}}}]
      - done
  helper: {{type: scripted, script: ["ok"]}}
tools: ["tests.apps.config_app:add", "tests.apps.config_app:echo"]
mcp_servers:
  - {{name: calc, command: {json.dumps(sys.executable)}, args: [{json.dumps(MCP_SERVER)}, stdio], timeout_s: 20}}
agents:
  - id: assistant
    model: main
    system_prompt: You help.
    tools: [add, "mcp__calc__sh*"]
    plugins: [{{path: "tests.apps.config_app:Motto", args: {{text: Be exact.}}}}]
    permissions: {{deny: [echo], default: allow}}
    tool_execution_mode: sequential
    max_rounds: 5
    stop_conditions: [{{type: stop_on_tool, tool_name: never_called}}]
    context: {{max_tokens: 4000, max_tool_result_tokens: 500}}
    sub_agents: [helper_agent]
  - id: helper_agent
    model: helper
"""


def write(tmp_path: Path, text: str, name: str = "agents.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_published_schema_is_up_to_date() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == schema(), (
        "regenerate: python -m agentlog.runtime.config > src/agentlog/runtime/agentlog-config.schema.json")
    assert schema()["properties"]["agents"]["minItems"] == 1


@pytest.mark.asyncio
async def test_yaml_config_runs_with_local_and_mcp_tools(store: Any, tmp_path: Path) -> None:
    app = load_app(write(tmp_path, CONFIG))
    try:
        assert resolve_app(app, store) is app
        spec = {a.id: a for a in app.agents}["assistant"]
        # the glob expanded over the MCP listing; `sub_agents` added the sub-agent tools
        assert spec.tools == ["add", "mcp__calc__shout", "agent_run", "agent_output", "agent_stop"]
        assert spec.allowed_agents == ["helper_agent"]
        assert isinstance(spec.plugins[0], PermissionPlugin) and spec.plugins[1].text == "Be exact."
        assert spec.effective_stop_conditions() == [MaxRounds(rounds=5), StopOnTool(tool_name="never_called")]
        assert spec.context == ContextPolicy(max_tokens=4000, max_tool_result_tokens=500)
        assert app.sub_agents == {"assistant": ["helper_agent"], "helper_agent": []}
        assert "echo" in app.tools  # a plain function became a tool
        rt = app.runtime(store)
        async with asyncio.timeout(30):
            result = await rt.run("assistant", "go")
            log = await logged(rt, result)
        assert result.termination.type == "natural_end"
        assert [e.result for e in events_of(log, "ToolCallCompleted")] == [5, {"result": "HEY"}]
        assert "Be exact." in app.models["main"].requests[0].messages[0].content
    finally:
        app.close()


SUB_AGENT_CONFIG = """
version: 1
models:
  boss: {type: scripted, script: [{tool_calls: [{name: agent_run, arguments: {agent_id: helper, prompt: help}}]}, done]}
  helper: {type: scripted, script: ["helped"]}
agents:
  - {id: boss, model: boss, sub_agents: [helper]}
  - {id: helper, model: helper}
  - {id: other, model: helper}
"""


@pytest.mark.asyncio
async def test_config_sub_agents_run_as_child_runs(store: Any, tmp_path: Path) -> None:
    """`sub_agents` in a config is enough for an agent to delegate: the child is a real run on
    its own thread with the parent's lineage, and only the listed agents may be started."""
    app = load_app(write(tmp_path, SUB_AGENT_CONFIG))
    boss = {a.id: a for a in app.agents}["boss"]
    assert boss.allowed_agents == ["helper"] and "agent_run" in boss.tools
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        result = await rt.run("boss", "go")
        log = await logged(rt, result)
    assert result.termination.type == "natural_end"
    (done,) = events_of(log, "ToolCallCompleted")
    assert done.outcome == "succeeded" and done.result["output"] == "helped", done.result
    child = [sc async for sc in store.read_run(done.result["run_id"])]
    started = child[0].commit.events[[type(e).__name__ for e in child[0].commit.events].index("RunStarted")]
    assert started.agent_id == "helper" and started.parent_run_id == result.run_id
    assert child[0].commit.thread_id != result.thread_id  # its own child thread


@pytest.mark.parametrize(("text", "message"), [
    ("agents: []", "agents: List should have at least 1 item"),
    ("agents: [{id: a, model: nope}]", "unknown model 'nope'"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, overrides: {models: [nope]}}]",
     "unknown model 'nope'"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, overrides: {system: true}}]",
     "overrides.system"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, sub_agents: [b]}]",
     "sub_agents names 'b'"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, tools: [nothing*]}]",
     "no tool matches 'nothing*'"),
    ("models: {m: {type: scripted, script: [x]}}\ntools: ['tests.apps.config_app:not_a_tool']\nagents: [{id: a, model: m}]",
     "is a int, not a tool"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, plugins: ['tests.apps.config_app:add']}]",
     "not an agentlog Plugin"),
    ("models: {m: {type: openai, api_key_env: AGENTLOG_TEST_NO_SUCH_KEY}}\nagents: [{id: a, model: m}]",
     "AGENTLOG_TEST_NO_SUCH_KEY is not set"),
    ("models: {m: {type: scripted, script: [x]}}\nagents: [{id: a, model: m, max_rounds: 0}]",
     "agents.0.max_rounds"),
    ("agents: [{id: a, model: m", "not valid YAML"),
])
def test_config_mistakes_are_typed_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(AppConfigInvalid, match=None) as info:
        load_app(write(tmp_path, text))
    assert message in str(info.value) and "agents.yaml" in str(info.value)


def test_json_config_and_missing_file(tmp_path: Path) -> None:
    cfg = {"models": {"m": {"type": "scripted", "script": ["hi"]}}, "agents": [{"id": "a", "model": "m"}]}
    loaded = load_config(write(tmp_path, json.dumps(cfg), "agents.json"))
    assert [a.id for a in loaded.agents] == ["a"] and isinstance(AgentlogConfig.model_validate(cfg), AgentlogConfig)
    with pytest.raises(AppConfigInvalid, match="cannot read"):
        load_app(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("command", ["serve", "worker", "gateway"])
def test_cli_config_option_rejects_a_bad_file_before_connecting(tmp_path: Path, command: str,
                                                                dead_nats_url: str) -> None:
    from typer.testing import CliRunner

    from agentlog.cli.core import app as cli_app

    bad = write(tmp_path, "agents: [{id: a, model: nope}]")
    result = CliRunner().invoke(cli_app, [command, "--config", bad, "--nats", dead_nats_url])
    assert result.exit_code == 2, result.output
    assert "unknown model 'nope'" in result.output
