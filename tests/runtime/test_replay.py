"""Verified replay on real JetStream recordings.

1. Every scenario of the runtime-loop suites (test_runtime_scenarios, test_runtime_stop,
   test_plugin_scenarios) is run
   as written -- recording on a real store, with its own asserts -- and then every run it wrote is
   re-executed against the log with the same agents and tools and verified commit by commit.
2. Tampered agents (another tool value, a plugin adding context, another system prompt, another
   tool_execution_mode, another max_rounds) raise NonDeterminismError at the first diverging event.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.events import StoredCommit
from agentlog.runtime import (
    AddContext,
    AgentSpec,
    App,
    DeterministicEntropy,
    Plugin,
    Runtime,
    ToolContext,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import (
    NonDeterminismError,
    plan_replay,
    request_digest,
    verify_run,
)
from agentlog.testing import RecordingModel

from tests.runtime import test_plugin_scenarios as plugin_scenarios
from tests.runtime import test_runtime_scenarios as scenarios
from tests.runtime import test_runtime_stop as stops
from tests.support.runtime import logged, store  # noqa: F401  (fixture)

#: These tests prove re-executed tools are checked: opt in to re-execution (the default answers
#: every tool from the log, see tests/cli/test_cli_replay.py); an explicit `tools_from_log=` still wins.
verify_run = functools.partial(verify_run, tools_from_log=False)

pytestmark = pytest.mark.asyncio


async def all_commits(store: Any) -> list[StoredCommit]:
    """The whole log, in order (follow from 0 up to the last seq)."""
    last = await store.last_seq()
    out: list[StoredCommit] = []
    if last == 0:
        return out
    follower: AsyncIterator[StoredCommit] = store.follow(None, 0)
    try:
        async with asyncio.timeout(10):
            async for sc in follower:
                out.append(sc)
                if sc.seq >= last:
                    break
    finally:
        await follower.aclose()  # type: ignore[attr-defined]
    return out


def _scenario_cases() -> list[Any]:
    cases = []
    for module in (scenarios, stops, plugin_scenarios):
        for name, fn in inspect.getmembers(module, inspect.iscoroutinefunction):
            if not name.startswith("test_"):
                continue
            params = [p for p in inspect.signature(fn).parameters if p not in ("store", "nats_server")]
            marks = getattr(fn, "pytestmark", [])
            modes = next((m.args[1] for m in marks if m.name == "parametrize"), None)
            if params == ["mode"] and modes:
                cases += [pytest.param(fn, {"mode": m}, id=f"{name}[{m}]") for m in modes]
            elif not params:
                cases.append(pytest.param(fn, {}, id=name))
    return cases


@pytest.mark.parametrize("scenario, kwargs", _scenario_cases())
async def test_every_recorded_scenario_replays(store: Any, nats_server: Any, monkeypatch: Any,
                                                scenario: Any, kwargs: dict[str, Any]) -> None:
    writers: dict[str, Runtime] = {}
    original_start = Runtime.start

    async def recording_start(self: Runtime, *args: Any, **kw: Any) -> Any:
        handle = await original_start(self, *args, **kw)
        writers[handle.run_id] = self
        return handle

    monkeypatch.setattr(Runtime, "start", recording_start)
    wanted = inspect.signature(scenario).parameters
    fixtures = {"store": store, "nats_server": nats_server}
    await scenario(**{k: v for k, v in fixtures.items() if k in wanted}, **kwargs)
    monkeypatch.setattr(Runtime, "start", original_start)

    log = await all_commits(store)
    assert writers, "the scenario started no run"
    for run_id, rt in writers.items():
        plan = plan_replay(log, run_id)
        async with asyncio.timeout(20):
            report = await verify_run(store, run_id, rt)
        assert report.ok and report.divergence is None
        assert report.commits_verified == report.commits_recorded == len(plan.loop)
        assert report.events_verified == plan.events
        assert report.termination == plan.termination
        assert report.inferences == len(plan.inferences)
        assert report.external_commits == len(plan.segment) - len(plan.loop)  # cancels fed back in


# == tampering ====================================================================================


@tool
def add(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum."""
    ctx.set("/last_sum", a + b)
    return a + b


@tool(name="add")
def add_off_by_one(a: int, b: int, ctx: ToolContext) -> int:
    """Add two integers and remember the last sum."""
    # Same name, schema and description as `add` (so the model request is unchanged), another value.
    ctx.set("/last_sum", a + b + 1)
    return a + b + 1


@tool
def echo(text: str) -> str:
    """Echo."""
    return text


@tool
def noop() -> str:
    """Nothing."""
    return "ok"


def _script() -> list[Any]:
    return [
        Turn.tool("add", {"a": 1, "b": 2}),
        Turn.tools(("echo", {"text": "x"}), ("echo", {"text": "y"})),
        "done",
    ]


async def record(store: Any, *, tools: list[Any] | None = None, script: list[Any] | None = None,
                 **spec: Any) -> tuple[Any, RecordingModel, list[StoredCommit], dict[str, Any]]:
    """Record one run with a request-recording model; returns (result, recorder, thread log, spec)."""
    tools = tools if tools is not None else [add, echo]
    spec = {"tool_execution_mode": "sequential", "system_prompt": "Be exact.", **spec}
    recorder = RecordingModel(ScriptedModel(script if script is not None else _script()))
    agent = AgentSpec(id="agent", model=recorder, tools=[t.name for t in tools], **spec)
    rt = Runtime(store, agents=[agent], tools=tools, entropy=DeterministicEntropy())
    async with asyncio.timeout(10):
        result = await rt.run("agent", "compute")
    return result, recorder, await logged(rt, result), spec


def app(recorder: RecordingModel, tools: list[Any] | None = None, **spec: Any) -> App:
    tools = tools if tools is not None else [add, echo]
    return App(agents=[AgentSpec(id="agent", model=recorder, tools=[t.name for t in tools], **spec)], tools=tools)


def position_of(log: list[StoredCommit], kind: str, nth: int = 0) -> Any:
    found = [(p, e) for sc in log for p, e in sc.positioned() if type(e).__name__ == kind]
    return found[nth]


async def test_unchanged_agent_verifies_including_requests(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    async with asyncio.timeout(10):
        report = await verify_run(store, result.run_id, app(recorder, **spec), requests=recorder.requests)
    assert report.ok and report.commits_verified == len(log) and report.tools_executed == 3
    # digests work as well as full requests (what a future InferenceCompleted.request_digest holds)
    digests = [request_digest(r) for r in recorder.requests]
    async with asyncio.timeout(10):
        assert (await verify_run(log, result.run_id, app(recorder, **spec), requests=digests)).ok


async def test_a_tool_returning_another_value_diverges_at_its_completion(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, [add_off_by_one, echo], **spec))
    err = info.value
    # the state patch comes first in the completion commit: the first diverging event
    position, patched = position_of(log, "StatePatched")
    assert err.position == position
    assert type(err.expected).__name__ == type(err.actual).__name__ == "StatePatched"
    assert err.expected == patched and err.actual.ops[0]["value"] == 4
    assert str(position) in str(err) and "expected" in str(err)


async def test_a_tool_returning_another_value_diverges_at_tool_call_completed(store: Any) -> None:
    @tool(name="add")
    def add_plain(a: int, b: int) -> int:
        """As recorded."""
        # No state edit: the completion itself is the first difference.
        return a + b + 1

    @tool(name="add")
    def add_plain_recorded(a: int, b: int) -> int:
        """As recorded."""
        return a + b

    result, recorder, log, spec = await record(store, tools=[add_plain_recorded, echo])
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, [add_plain, echo], **spec))
    position, completed = position_of(log, "ToolCallCompleted")
    assert info.value.position == position
    assert info.value.expected == completed and completed.result == 3
    assert type(info.value.actual).__name__ == "ToolCallCompleted" and info.value.actual.result == 4
    # answered from the log, the changed tool does not matter
    async with asyncio.timeout(10):
        report = await verify_run(store, result.run_id, app(recorder, [add_plain, echo], **spec),
                                  tools_from_log=["add"])
    assert report.ok and report.tools_from_log == 1 and report.tools_executed == 2


class _Context(Plugin):
    id = "context"

    def before_inference(self, ctx: Any) -> list[Any]:
        return [AddContext("Today is Tuesday.")]


async def test_a_plugin_adding_context_diverges_at_the_first_inference(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, plugins=[_Context()], **spec),
                             requests=recorder.requests)
    position, inference = position_of(log, "InferenceCompleted")
    assert info.value.position == position
    assert info.value.expected == inference and info.value.actual is None
    assert "system prompt" in info.value.detail and "Today is Tuesday." in info.value.detail


async def test_a_different_system_prompt_diverges_at_the_first_inference(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    changed = {**spec, "system_prompt": "Be creative."}
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, **changed),
                             requests=[request_digest(r) for r in recorder.requests])
    position, inference = position_of(log, "InferenceCompleted")
    assert info.value.position == position and type(info.value.expected).__name__ == "InferenceCompleted"
    assert info.value.actual is None and "request differs" in str(info.value)


async def test_a_different_system_prompt_diverges_from_the_log_alone(store: Any) -> None:
    """No `requests=`: the recorded `InferenceCompleted.request_digest` is enough."""
    result, recorder, log, spec = await record(store)
    position, inference = position_of(log, "InferenceCompleted")
    assert inference.request_digest == request_digest(recorder.requests[0])
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, **{**spec, "system_prompt": "Be creative."}))
    assert info.value.position == position and info.value.expected == inference and info.value.actual is None
    # and the same app with a plugin adding context, without any sidecar either
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, plugins=[_Context()], **spec))
    assert info.value.position == position


async def test_a_different_tool_execution_mode_diverges_where_the_calls_start(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    changed = {**spec, "tool_execution_mode": "parallel_streaming"}
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, **changed))
    # sequential starts only the first echo with the inference commit; parallel starts both
    position, second_step_start = position_of(log, "ToolCallStarted", 1)
    assert second_step_start.call_id == "call_1_0"
    assert info.value.position.seq == position.seq and info.value.position.index == position.index + 1
    assert info.value.expected is None
    assert type(info.value.actual).__name__ == "ToolCallStarted" and info.value.actual.call_id == "call_1_1"


async def test_a_different_max_rounds_diverges_at_the_run_end(store: Any) -> None:
    script = [Turn.tool("noop")] * 5
    result, recorder, log, spec = await record(store, tools=[noop], script=script, max_rounds=2)
    assert result.termination.code == "max_rounds"
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, [noop], **{**spec, "max_rounds": 3}))
    position, finished = position_of(log, "RunFinished")
    assert info.value.position == position
    assert info.value.expected == finished and info.value.actual is None
    # fewer rounds: the loop writes a RunFinished the recording does not have
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(10):
            await verify_run(store, result.run_id, app(recorder, [noop], **{**spec, "max_rounds": 1}))
    position, first_end = position_of(log, "StepFinished")
    assert info.value.position.seq == position.seq and info.value.position.index == position.index + 1
    assert info.value.expected is None and type(info.value.actual).__name__ == "RunFinished"


async def test_report_without_raising_and_from_a_list_of_commits(store: Any) -> None:
    result, recorder, log, spec = await record(store)
    async with asyncio.timeout(10):
        report = await verify_run(log, result.run_id, app(recorder, [add_off_by_one, echo], **spec),
                                  raise_on_divergence=False)
    assert not report.ok and isinstance(report.divergence, NonDeterminismError)
    assert report.to_json()["divergence"]["position"] == str(report.divergence.position)
    assert report.commits_verified == 2  # start + first inference, then the changed tool
