"""Scenarios of the plugin model and the tools and policies around it, on a real nats-server +
JetStream store, each asserting what its runs wrote. test_replay re-runs every one against its
log with the same Runtime and verifies it commit by commit, and test_cli_replay_all verifies each
through `agentlog replay --verify` (`tests.apps.replay_scenarios_app`): tool results' details and
follow-ups, a run's tool policy, deferred tools found by tool_search, OpenAPI tools, circuit
breakers, plugin tools, config sections, scheduled actions, effects, input filters, request
transforms, context messages and reminders, a config file's default max_rounds."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pydantic
import pytest

from agentlog.eventlog.events import (
    ActionScheduled,
    CircuitBreakerChanged,
    ContextMessageSet,
    EffectEmitted,
    InputFiltered,
    StatePatched,
    ToolCallCompleted,
)
from agentlog.runtime import (
    ActionHandler,
    AddContext,
    AgentSpec,
    DeterministicEntropy,
    Effect,
    PhaseContext,
    Plugin,
    RejectInput,
    ReminderPlugin,
    RetryPolicy,
    Runtime,
    Schedule,
    Tool,
    ToolContext,
    WarnInput,
    tool,
)
from agentlog.runtime.agents.deferred import TOOL_SEARCH
from agentlog.runtime.config import build, parse_config
from agentlog.runtime.inputs.run_input import OverridePolicy
from agentlog.runtime.models import ModelUnavailable, ScriptedModel, Turn
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.models.breaker import CircuitBreakerPolicy, CircuitBreakers
from agentlog.runtime.toolkits.openapi import OpenApiConfig, load_openapi_tools

from tests.fakes.fake_openapi import FakePetStore
from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio


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


def _catalog(n: int) -> list[Tool]:
    def make(i: int) -> Tool:
        def run(q: str = "") -> str:
            return f"ticket {i}: {q}"

        return Tool.from_function(run, name=f"gh_issue_{i}", description=f"GitHub issue tool number {i}")

    return [make(i) for i in range(n)]


async def test_scenario_tool_results_policy_and_deferred_tools(store: Any) -> None:
    """One sequential run: a deferred catalog found with tool_search, a call its tool policy
    excludes (failed, never run), a call with details and a follow-up."""
    catalog = _catalog(6)
    model = ScriptedModel([
        Turn.tool(TOOL_SEARCH, {"query": "select:gh_issue_4"}),
        Turn.tools(("gh_issue_4", {"q": "bug"}), ("delete_file", {"path": "/x"}), ("read_file", {"path": "a.txt"})),
        "done",
    ])
    spec = AgentSpec(id="fs", model=model, tools=["read_file", "delete_file", *(t.name for t in catalog)],
                     deferred_tools=["gh_*"], overrides=OverridePolicy(tools=True), tool_execution_mode="sequential")
    rt = Runtime(store, agents=[spec], tools=[read_file, delete_file, *catalog], entropy=DeterministicEntropy())
    async with asyncio.timeout(20):
        result = await rt.run("fs", "triage", run_input={"overrides": {"excluded_tools": ["delete_*"]}})
    assert result.termination.type == "natural_end"
    assert [t.name for t in model.requests[0].tools] == ["read_file", TOOL_SEARCH]
    assert [t.name for t in model.requests[1].tools] == ["read_file", "gh_issue_4", TOOL_SEARCH]
    log = await logged(rt, result)
    done = {e.call_id: e for e in events_of(log, "ToolCallCompleted")}
    calls = {c.name or c.call_id: c for c in result.run.calls.values()}
    assert calls["read_file"].details == {"bytes": 11, "path": "a.txt"}
    assert [d.follow_up for d in done.values() if d.follow_up] == [["(The user attached a.txt.)"]]
    assert model.requests[2].messages[-1].content == "(The user attached a.txt.)"
    failed = [d for d in done.values() if d.outcome == "failed"]
    assert [d.result for d in failed] == [{"error": "tool 'delete_file' is not allowed in this run"}]


async def test_scenario_openapi_tools_and_a_circuit_breaker(store: Any) -> None:
    """Two runs of an agent whose primary model keeps failing: the first opens its breaker (the
    fallback answers and calls the pet-store API), the second skips the primary at once."""
    with FakePetStore().in_thread() as api:
        tools = load_openapi_tools(OpenApiConfig(name="pets", spec=api.spec_url, operations=["getPet"]))
        primary = ScriptedModel([Turn.fail(ModelUnavailable("503"))] * 2)
        fallback = ScriptedModel([Turn.tool("pets__getPet", {"petId": 2}), "Tom is a cat.", "second answer"])
        spec = AgentSpec(id="pets", model="primary", fallback_models=["fallback"], tools=["pets__getPet"],
                         retry=RetryPolicy(max_attempts=3, backoff_ms=0))
        breakers = CircuitBreakers(CircuitBreakerPolicy(failure_threshold=2, cooldown_s=3600))
        rt = Runtime(store, agents=[spec], tools=tools, models={"primary": primary, "fallback": fallback},
                     entropy=DeterministicEntropy(), breakers=breakers)
        async with asyncio.timeout(20):
            first = await rt.run("pets", "who is pet 2?")
            second = await rt.run("pets", "again", parent_run_id=first.run_id)
    assert first.termination.type == second.termination.type == "natural_end"
    assert len(primary.requests) == 2 and breakers.state("primary") == "open"
    log = await logged(rt, first)
    opened = [e for sc in log if sc.commit.run_id == first.run_id for e in sc.commit.events
              if isinstance(e, CircuitBreakerChanged)]
    assert [(e.model, e.state, e.failures) for e in opened] == [("primary", "open", 2)]
    (call,) = first.run.calls.values()
    assert call.result == {"id": 2, "name": "Tom", "tag": "cat"} and call.details["status"] == 200


class Motto(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str = "Be kind."


class Everything(Plugin):
    """A plugin using every part of the model: a tool, a config section, a scheduled action,
    an effect, an input filter, a request transform and context messages."""

    id = "everything"
    config_model = Motto

    def __init__(self) -> None:
        self.effects: list[Any] = []

        @tool
        def stamp(text: str) -> str:
            """Stamp a text."""
            return f"[stamped] {text}"

        self._tools = [stamp]

    def tools(self) -> Sequence[Tool]:
        return self._tools

    def step_start(self, ctx: PhaseContext) -> list[Any]:
        if ctx.step == 1:
            return [AddContext(ctx.config.text, key="motto", persistent=True), Schedule("tally", 1)]
        return []

    def action_handlers(self) -> Mapping[str, ActionHandler]:
        def tally(ctx: PhaseContext, n: int) -> list[Any]:
            from agentlog.runtime import PatchState

            return [PatchState(ops=({"op": "add", "path": "/tally", "value": n},)), Effect("audit", {"tally": n})]

        return {"tally": ActionHandler("step_start", tally)}

    def effect_handlers(self) -> Mapping[str, Any]:
        return {"audit": lambda payload, state: self.effects.append(payload)}

    def filter_input(self, ctx: PhaseContext, messages: Sequence[Any]) -> list[Any]:
        text = " ".join(m.content for m in messages)
        return [RejectInput("no secrets")] if "secret" in text else [WarnInput("be careful")] if "careful" in text else []

    def transform_request(self, ctx: PhaseContext, request: ModelRequest) -> ModelRequest:
        return msgspec.structs.replace(request, options={**request.options, "seed": 7})


async def test_scenario_plugin_model_in_one_run_then_a_rejected_input(store: Any) -> None:
    everything = Everything()
    reminder = ReminderPlugin([{"tool": "stamp", "message": "Stamped texts are final."}])
    model = ScriptedModel([Turn.tool("stamp", {"text": "ok"}), "done"])
    spec = AgentSpec(id="all", model=model, plugins=[everything, reminder], sections={"everything": {"text": "Be exact."}})
    rt = Runtime(store, agents=[spec], entropy=DeterministicEntropy())
    async with asyncio.timeout(20):
        first = await rt.run("all", "stamp it carefully")
        second = await rt.run("all", "a secret", parent_run_id=first.run_id)
    assert first.termination.type == "natural_end"
    assert (second.termination.type, second.termination.code) == ("blocked", "input_rejected")
    assert [t.name for t in model.requests[0].tools] == ["stamp"] and len(model.requests) == 2
    assert model.requests[0].options == {"seed": 7}
    systems = [r.messages[0].content for r in model.requests]
    assert systems == ["Warnings about the user's input:\n- be careful\n\nBe exact.",
                       "Warnings about the user's input:\n- be careful\n\nBe exact.\n\nStamped texts are final."]
    assert everything.effects == [{"tally": 1}]
    log = await logged(rt, first)
    kinds = {type(e) for sc in log for e in sc.commit.events}
    assert {ContextMessageSet, EffectEmitted, InputFiltered, StatePatched, ToolCallCompleted} <= kinds
    assert ActionScheduled not in kinds  # the tally ran in its own phase


async def test_scenario_config_default_max_rounds(store: Any) -> None:
    loaded = build(parse_config("""
models: {looping: {type: scripted, loop: true, script: [{tool_calls: [{name: add, arguments: {a: 1, b: 2}}]}]}}
tools: ["tests.apps.config_app:add"]
max_rounds: 3
agents: [{id: loop, model: looping, tools: [add]}]
"""))
    rt = loaded.runtime(store, entropy=DeterministicEntropy())
    async with asyncio.timeout(20):
        result = await rt.run("loop", "go")
    assert (result.termination.type, result.termination.code, result.run.steps) == ("stopped", "max_rounds", 3)
