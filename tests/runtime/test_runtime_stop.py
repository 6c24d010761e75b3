"""Every way a run ends, on a real JetStream store: the seven stop conditions (each `stopped` with
its own code), plugin terminate (`behavior_requested`), model errors (`error`), suspension
(`waiting`). Timeouts use the injectable clock, never wall time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.eventlog.events import Usage
from agentlog.runtime import (
    AgentSpec,
    ConsecutiveErrors,
    ContentMatch,
    DeterministicEntropy,
    LoopDetection,
    MaxRounds,
    Plugin,
    RetryPolicy,
    Runtime,
    StopOnTool,
    Terminate,
    Timeout,
    TokenBudget,
    ToolContext,
    ToolError,
    ToolResult,
    tool,
)
from agentlog.runtime.models import ModelRequestRejected, ModelUnavailable, ScriptedModel, Turn

from tests.support.runtime import (  # noqa: F401  (fixture)
    DONE_CALL,
    INFER_TOOL,
    START,
    events_of,
    logged,
    shape,
    store,
)

pytestmark = pytest.mark.asyncio

STEP_END = [*DONE_CALL, "StepFinished"]
STOPPED_STEP = [*DONE_CALL, "StepFinished", "RunFinished"]

ENTROPY_HOLDER: dict[str, DeterministicEntropy] = {}


@tool
def noop() -> str:
    """Does nothing."""
    return "ok"


@tool
def finish() -> str:
    """Signals the work is finished."""
    return "finished"


@tool
def fail() -> str:
    """Always fails."""
    raise ToolError("nope")


@tool
def wait_a_while(ctx: ToolContext) -> str:
    """Takes 31 seconds of (injected) time."""
    ENTROPY_HOLDER[ctx.run_id].advance(31_000)
    return "waited"


async def run_agent(store: Any, model: ScriptedModel, **spec: Any) -> tuple[Any, list[Any]]:
    entropy = DeterministicEntropy()
    tools = [noop, finish, fail, wait_a_while]
    agent = AgentSpec(id="agent", model=model, tools=[t.name for t in tools], **spec)
    rt = Runtime(store, agents=[agent], tools=tools, entropy=entropy)
    async with asyncio.timeout(10):
        handle = await rt.start("agent", "go", run_id="run1")
        ENTROPY_HOLDER["run1"] = entropy
        result = await handle.result()
    return result, await logged(rt, result)


def assert_stopped(result: Any, log: list[Any], code: str, steps: int) -> None:
    assert shape(log) == [START, *([INFER_TOOL, STEP_END] * (steps - 1)), INFER_TOOL, STOPPED_STEP]
    (finished,) = events_of(log, "RunFinished")
    assert finished.termination.type == "stopped" and finished.termination.code == code
    assert finished.termination.detail
    assert result.termination == finished.termination
    assert result.run.status == "done" and result.run.steps == steps
    assert result.run.termination == finished.termination


async def test_max_rounds(store: Any) -> None:
    result, log = await run_agent(store, ScriptedModel([Turn.tool("noop")], loop=True), max_rounds=2)
    assert_stopped(result, log, "max_rounds", 2)


async def test_explicit_max_rounds_spec_wins(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop")], loop=True)
    result, log = await run_agent(store, model, max_rounds=5, stop_conditions=[MaxRounds(rounds=1)])
    assert_stopped(result, log, "max_rounds", 1)


async def test_timeout_by_the_injected_clock(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop"), Turn.tool("wait_a_while"), Turn.tool("noop")], loop=True)
    result, log = await run_agent(store, model, stop_conditions=[Timeout(seconds=30)])
    assert_stopped(result, log, "timeout", 2)
    assert log[-1].commit.ts - log[0].commit.ts >= 30_000


async def test_token_budget(store: Any) -> None:
    turn = Turn.tool("noop", usage=Usage(input_tokens=40, output_tokens=20))
    result, log = await run_agent(store, ScriptedModel([turn], loop=True),
                                  stop_conditions=[TokenBudget(max_tokens=100)])
    assert_stopped(result, log, "token_budget", 2)
    assert events_of(log, "RunFinished")[0].usage == Usage(input_tokens=80, output_tokens=40)
    assert result.run.usage.total_tokens == 120


async def test_consecutive_errors(store: Any) -> None:
    model = ScriptedModel([Turn.tool("fail"), Turn.tool("noop"), Turn.tool("fail"), Turn.tool("fail")])
    result, log = await run_agent(store, model, stop_conditions=[ConsecutiveErrors(max_errors=2)])
    assert_stopped(result, log, "consecutive_errors", 4)  # the success in round 2 reset the count
    assert [c.outcome for c in events_of(log, "ToolCallCompleted")] == ["failed", "succeeded", "failed", "failed"]


async def test_stop_on_tool(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop"), Turn.tool("finish"), Turn.tool("noop")])
    result, log = await run_agent(store, model, stop_conditions=[StopOnTool(tool_name="finish")])
    assert_stopped(result, log, "stop_on_tool", 2)
    assert events_of(log, "ToolCallCompleted")[-1].result == "finished"  # the call still ran


async def test_content_match(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop", text="working"), Turn.tool("noop", text="ALL DONE now"), Turn.tool("noop")])
    result, log = await run_agent(store, model, stop_conditions=[ContentMatch(pattern="DONE")])
    assert_stopped(result, log, "content_match", 2)


async def test_content_match_regex(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop", text="step 1"), Turn.tool("noop", text="answer: 42")])
    result, log = await run_agent(store, model, stop_conditions=[ContentMatch(pattern=r"answer: \d+", regex=True)])
    assert_stopped(result, log, "content_match", 2)


async def test_loop_detection(store: Any) -> None:
    model = ScriptedModel([Turn.tool("finish"), Turn.tool("noop"), Turn.tool("noop"), Turn.tool("noop"), "x"])
    result, log = await run_agent(store, model, stop_conditions=[LoopDetection(window=3)])
    assert_stopped(result, log, "loop_detection", 4)


async def test_natural_end_wins_over_stop_conditions(store: Any) -> None:
    model = ScriptedModel(["DONE"])
    result, log = await run_agent(store, model, max_rounds=1, stop_conditions=[ContentMatch(pattern="DONE")])
    assert result.termination.type == "natural_end"


class _StopAfterInference(Plugin):
    id = "stopper"

    def after_inference(self, ctx: Any, response: Any) -> list[Any]:
        return [Terminate(code="enough", detail="plugin said so")]


async def test_plugin_terminate_is_behavior_requested_and_answers_pending_calls(store: Any) -> None:
    model = ScriptedModel([Turn.tool("noop")])
    result, log = await run_agent(store, model, plugins=[_StopAfterInference()])
    assert shape(log) == [
        START,
        ["StepStarted", "MessageAppended", "InferenceCompleted", *DONE_CALL, "StepFinished", "RunFinished"],
    ]
    assert result.termination.type == "behavior_requested" and result.termination.code == "enough"
    # the model's call never ran but is answered, so the conversation stays valid
    assert [c.outcome for c in events_of(log, "ToolCallCompleted")] == ["cancelled"]


async def test_model_error_ends_the_run_with_error(store: Any) -> None:
    model = ScriptedModel([Turn.fail(ModelRequestRejected("bad api key"))])
    result, log = await run_agent(store, model)
    assert shape(log) == [START, ["StepStarted", "StepFinished", "RunFinished"]]
    assert result.termination.type == "error"
    assert result.termination.code == "model_request_rejected"
    assert "bad api key" in result.termination.detail


async def test_retryable_model_error_is_retried_then_falls_back(store: Any) -> None:
    primary = ScriptedModel([Turn.fail(ModelUnavailable("503")), Turn.fail(ModelUnavailable("503"))])
    backup = ScriptedModel(["from the backup"], name="backup")
    entropy = DeterministicEntropy()
    agent = AgentSpec(id="agent", model="primary", fallback_models=["backup"],
                      retry=RetryPolicy(max_attempts=2, backoff_ms=0))
    rt = Runtime(store, agents=[agent], models={"primary": primary, "backup": backup}, entropy=entropy)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "hi")
    assert primary.calls == 2 and backup.calls == 1
    assert result.termination.type == "natural_end"
    log = await logged(rt, result)
    assert events_of(log, "InferenceCompleted")[0].model == "backup"


async def test_pending_tool_leaves_the_run_waiting(store: Any) -> None:
    @tool
    def approve_me() -> ToolResult:
        """Needs a human."""
        return ToolResult.pending("ticket1", message="please approve")

    model = ScriptedModel([Turn.tool("approve_me")])
    entropy = DeterministicEntropy()
    agent = AgentSpec(id="agent", model=model, tools=["approve_me"])
    rt = Runtime(store, agents=[agent], tools=[approve_me], entropy=entropy)
    async with asyncio.timeout(10):
        result = await rt.run("agent", "go")
    log = await logged(rt, result)
    assert shape(log) == [START, INFER_TOOL, ["ToolCallSuspended", "StepFinished", "RunSuspended"]]
    assert result.status == "waiting" and result.termination is None
    assert result.run.calls["call_0_0"].status == "suspended"
    assert result.run.calls["call_0_0"].ticket.message == "please approve"
