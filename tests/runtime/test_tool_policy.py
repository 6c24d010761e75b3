"""A run's tool policy: the start request's `overrides.allowed_tools` / `excluded_tools` (names or
globs), within the agent's `OverridePolicy(tools=True)`. Recorded in `RunStarted.overrides`, so
what the model is offered and what may run is a function of the log: resume and replay agree.
Pure: the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.eventlog.events import RunStarted
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.gateway.adapters.common import AdapterInputError, request_overrides
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, tool
from agentlog.runtime.inputs.run_input import OverrideNotAllowed, OverridePolicy
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@tool
def write_file(path: str, text: str) -> str:
    """Write a file."""
    return "written"


@tool
def delete_file(path: str) -> str:
    """Delete a file."""
    return "deleted"


TOOLS = [read_file, write_file, delete_file]


def runtime(script: list[Any], *, tools: bool = True) -> tuple[Runtime, ScriptedModel]:
    model = ScriptedModel(script)
    spec = AgentSpec(id="fs", model=model, tools=[t.name for t in TOOLS], overrides=OverridePolicy(tools=tools))
    return Runtime(MemoryEventStore(), agents=[spec], tools=TOOLS, entropy=DeterministicEntropy()), model


async def test_tool_policy_allowed_tools_narrow_what_the_model_is_offered() -> None:
    rt, model = runtime(["ok"])
    result = await rt.run("fs", "hi", run_input={"overrides": {"allowed_tools": ["read_*", "write_file"]}})
    assert [t.name for t in model.requests[0].tools] == ["read_file", "write_file"]
    log = [sc async for sc in rt.store.read_thread(result.thread_id)]
    (started,) = [e for sc in log for e in sc.commit.events if isinstance(e, RunStarted)]
    assert started.overrides is not None and started.overrides.allowed_tools == ["read_*", "write_file"]


async def test_tool_policy_excluded_tools_are_hidden_and_cannot_run() -> None:
    # the model calls a tool it was not offered: the call fails, the tool never runs
    rt, model = runtime([Turn.tools(("delete_file", {"path": "/x"}), ("read_file", {"path": "/x"})), "done"])
    result = await rt.run("fs", "hi", run_input={"overrides": {"excluded_tools": ["delete_*"]}})
    assert [t.name for t in model.requests[0].tools] == ["read_file", "write_file"]
    calls = sorted((c.status, c.result) for c in result.run.calls.values())
    assert calls == [("failed", {"error": "tool 'delete_file' is not allowed in this run"}),
                     ("succeeded", "contents of /x")]
    assert "Error: tool 'delete_file' is not allowed in this run" in [m.content for m in model.requests[1].messages]
    report = await verify_run(rt.store, result.run_id, rt)
    assert report.ok and report.commits_verified == report.commits_recorded


async def test_tool_policy_excluded_wins_over_allowed() -> None:
    rt, model = runtime(["ok"])
    await rt.run("fs", "hi", run_input={"overrides": {"allowed_tools": ["*_file"], "excluded_tools": ["write_file"]}})
    assert [t.name for t in model.requests[0].tools] == ["read_file", "delete_file"]


async def test_tool_policy_is_refused_when_the_agent_does_not_allow_it() -> None:
    rt, _ = runtime(["ok"], tools=False)
    with pytest.raises(OverrideNotAllowed) as caught:
        await rt.start("fs", "hi", run_input={"overrides": {"excluded_tools": ["delete_file"]}})
    assert caught.value.code == "override_not_allowed" and caught.value.field == "excluded_tools"
    assert await rt.store.last_seq() == 0  # nothing written


@pytest.mark.parametrize("field, names", [("allowed_tools", ["read_fil"]), ("excluded_tools", ["rm_*"])])
async def test_tool_policy_naming_no_tool_of_the_agent_is_refused(field: str, names: list[str]) -> None:
    rt, _ = runtime(["ok"])
    with pytest.raises(OverrideNotAllowed, match="none of the agent's tools") as caught:
        await rt.start("fs", "hi", run_input={"overrides": {field: names}})
    assert caught.value.field == field
    assert await rt.store.last_seq() == 0


async def test_tool_policy_holds_across_a_continuation_only_when_sent_again() -> None:
    rt, model = runtime(["one", "two"])
    first = await rt.run("fs", "hi", run_input={"overrides": {"allowed_tools": ["read_file"]}})
    await rt.run("fs", "again", parent_run_id=first.run_id)
    assert [t.name for t in model.requests[0].tools] == ["read_file"]
    assert [t.name for t in model.requests[1].tools] == ["read_file", "write_file", "delete_file"]


def test_tool_policy_from_a_protocol_request() -> None:
    assert request_overrides({"allowedTools": ["read_*"], "excludedTools": ["x"]}) == {
        "allowed_tools": ["read_*"], "excluded_tools": ["x"]}
    with pytest.raises(AdapterInputError) as caught:
        request_overrides({"allowedTools": "read_file"}, "forwardedProps.")
    assert caught.value.field == "forwardedProps.allowedTools"
