"""Frontend tools in the runtime, on a real JetStream store: declared per run
(`Runtime.start(frontend_tools=...)`), recorded in `RunStarted`, offered to the model, suspended
instead of executed, answered by the client's result; cold resume and verified replay from the log
alone; a clash or a bad name is refused before anything is written."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import msgspec
import pytest

from agentlog.eventlog.codec import decode_commit, encode_commit
from agentlog.eventlog.events import (
    Commit,
    RunFinished,
    RunStarted,
    RunSuspended,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.gateway.operations.dispatch import InvalidInput, QueueDispatcher
from agentlog.runtime import AgentSpec, App, PermissionPlugin, RunRequest, Runtime, tool
from agentlog.runtime.inputs.commands import InvalidCommand, StartRun, decode_command, encode_command
from agentlog.runtime.inputs.frontend import (
    ACTION,
    FrontendToolConflict,
    InvalidFrontendTools,
    normalize_frontend_tools,
)
from agentlog.runtime.models import ToolSpec
from agentlog.runtime.models.scripted import ScriptedModel, Turn, last_tool_result
from agentlog.runtime.replay.verify import verify_run
from agentlog.runtime.workers.worker import Worker

from tests.support.frontend_stubs import frontend_tool
from tests.support.runtime import shape, store, thread_log  # noqa: F401  (fixture)

CONFIRM = {"name": "confirm", "description": "Ask the user to confirm",
           "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def echo_result(request: Any) -> str:
    return f"client said {last_tool_result(request)}"


def make_runtime(store: Any, turns: list[Any], *, plugins: tuple[Any, ...] = (), tools: list[Any] | None = None,
                 ) -> tuple[Runtime, ScriptedModel]:
    tools = [add] if tools is None else tools
    model = ScriptedModel(turns)
    agent = AgentSpec(id="agent", model=model, tools=[t.name for t in tools], plugins=list(plugins))
    return Runtime(store, agents=[agent], tools=tools), model


def confirm_turns() -> list[Any]:
    return [Turn.tool("confirm", {"text": "really?"}), Turn.text("Confirmed.")]


# -- pure: the recorded form, the encodings ------------------------------------------------------


def test_run_started_without_frontend_tools_encodes_as_before() -> None:
    enc = msgspec.json.encode(RunStarted(run_id="r", agent_id="a"))
    assert b"frontend_tools" not in enc
    ev = RunStarted(run_id="r", agent_id="a", frontend_tools=normalize_frontend_tools([CONFIRM]))
    commit = Commit(commit_id="c", thread_id="t", run_id="r", ts=1, events=[ev])
    assert decode_commit(encode_commit(commit)).events == [ev]


def test_normalize_frontend_tools() -> None:
    spec = ToolSpec(name="pick", description="d", parameters={"type": "object"})
    assert normalize_frontend_tools([spec, {"name": "bare"}]) == [
        {"name": "pick", "description": "d", "parameters": {"type": "object"}},
        {"name": "bare", "description": "", "parameters": {"type": "object", "properties": {}}},
    ]
    for bad in ([{"name": "a.b"}], [{"name": ""}], [{"name": 3}], [{"name": "x"}, {"name": "x"}],
                [{"name": "x", "parameters": "nope"}], ["x"]):
        with pytest.raises(InvalidFrontendTools):
            normalize_frontend_tools(bad)


def test_start_command_carries_frontend_tools() -> None:
    cmd = StartRun(thread_id="t", run_id="r", agent_id="a", frontend_tools=[CONFIRM])
    assert decode_command(encode_command(cmd)) == cmd
    assert b"frontend_tools" not in encode_command(StartRun(thread_id="t", run_id="r", agent_id="a"))
    with pytest.raises(InvalidCommand):
        encode_command(StartRun(thread_id="t", agent_id="a", frontend_tools=[{"name": "no spaces"}]))


# -- the runtime, on JetStream ---------------------------------------------------------------------


async def start_waiting(rt: Runtime) -> Any:
    result = await rt.run("agent", "go", thread_id="t1", run_id="r1", frontend_tools=[CONFIRM])
    assert result.status == "waiting" and result.termination is None
    return result


@pytest.mark.asyncio
async def test_round_trip_log_view_and_model(store: Any) -> None:
    rt, model = make_runtime(store, [Turn.tool("confirm", {"text": "really?"}), echo_result])
    result = await start_waiting(rt)
    # offered alongside the agent's own tools, backend first
    assert [t.name for t in model.requests[0].tools] == ["add", "confirm"]
    assert model.requests[0].tools[1] == ToolSpec(**CONFIRM)
    log = await thread_log(store, "t1")
    assert shape(log) == [
        ["ThreadCreated", "RunStarted", "MessageAppended"],
        # no ToolCallStarted: nothing runs on the backend
        ["StepStarted", "MessageAppended", "InferenceCompleted", "ToolCallSuspended", "StepFinished", "RunSuspended"],
    ]
    started = log[0].commit.events[1]
    assert started.frontend_tools == [CONFIRM]
    (call,) = result.run.calls.values()
    assert call.status == "suspended" and call.ticket is not None
    assert (call.ticket.action, call.ticket.resume_mode) == (ACTION, "use_decision_as_tool_result")
    assert call.ticket.parameters == {"text": "really?"} and call.ticket.id == call.call_id

    decided = await rt.decide("r1", {"target_id": call.call_id, "decision_id": "d1", "action": "resume",
                                     "result": {"confirmed": True}})
    done = await decided.handle.result()  # type: ignore[union-attr]
    assert done.termination is not None and done.termination.type == "natural_end"
    assert done.run.calls[call.call_id].status == "succeeded"
    assert done.run.calls[call.call_id].result == {"confirmed": True}
    # the model's next turn sees the client's result as the tool result, and still the tool
    assert last_tool_result(model.requests[1]) == json.dumps({"confirmed": True}, separators=(",", ":"))
    assert [t.name for t in model.requests[1].tools] == ["add", "confirm"]
    log = await thread_log(store, "t1")
    assert shape(log)[2:] == [
        ["ToolCallDecided", "RunResumed", "ToolCallResuming", "ToolCallCompleted", "MessageAppended"],
        ["StepStarted", "MessageAppended", "InferenceCompleted", "StepFinished", "RunFinished"],
    ]
    report = await verify_run(store, "r1", App(agents=rt.agents, tools=[add]))
    assert report.ok and report.commits_verified == len(log) and report.tools_executed == 0


@pytest.mark.asyncio
async def test_cancel_decision_cancels_the_call(store: Any) -> None:
    rt, model = make_runtime(store, [Turn.tool("confirm", {"text": "really?"}), "Cancelled then."])
    result = await start_waiting(rt)
    (call_id,) = result.run.calls
    decided = await rt.decide("r1", {"target_id": call_id, "decision_id": "d1", "action": "cancel",
                                     "reason": "user closed the dialog"})
    done = await decided.handle.result()  # type: ignore[union-attr]
    assert done.run.calls[call_id].status == "cancelled"
    assert "user closed the dialog" in (last_tool_result(model.requests[1]) or "")
    assert (await verify_run(store, "r1", App(agents=rt.agents, tools=[add]))).ok


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["decide", "resume"])
async def test_cold_resume_in_a_fresh_runtime(store: Any, how: str) -> None:
    """The process that started the run is gone; a new Runtime (no frontend tools given to it)
    finishes the run from the log alone: the specs come back from RunStarted."""
    rt1, _ = make_runtime(store, confirm_turns())
    result = await start_waiting(rt1)
    (call_id,) = result.run.calls
    await rt1.aclose()
    rt2, model2 = make_runtime(store, [echo_result])  # the remaining script: the model's next turn
    decision = ToolCallDecision(target_id=call_id, decision_id="d1", action="resume", result="yes", updated_at=1)
    if how == "decide":
        handle = (await rt2.decide("r1", decision)).handle
    else:  # the decision recorded by someone else who did not resume it (e.g. crashed)
        version = await store.thread_version("t1")
        await store.append(Commit(commit_id="c-dec", thread_id="t1", run_id="r1", ts=2,
                                  events=[ToolCallDecided(call_id=call_id, decision=decision)]), version)
        handle = await rt2.resume("r1")
    assert handle is not None
    done = await handle.result()
    assert done.termination is not None and done.termination.type == "natural_end"
    assert done.run.calls[call_id].result == "yes"
    (request,) = model2.requests
    assert [t.name for t in request.tools] == ["add", "confirm"] and last_tool_result(request) == "yes"
    assert (await verify_run(store, "r1", App(agents=rt2.agents, tools=[add]))).ok


@pytest.mark.asyncio
async def test_continuation_inherits_no_frontend_tools(store: Any) -> None:
    rt, model = make_runtime(store, ["first", "second", "third"])
    await rt.run("agent", "one", thread_id="t1", run_id="r1", frontend_tools=[CONFIRM])
    await rt.run("agent", "two", parent_run_id="r1", run_id="r2")
    await rt.run("agent", "three", parent_run_id="r2", run_id="r3", frontend_tools=[CONFIRM])
    assert [[t.name for t in r.tools] for r in model.requests] == [["add", "confirm"], ["add"], ["add", "confirm"]]
    started = [e for sc in await thread_log(store, "t1") for e in sc.commit.events if type(e) is RunStarted]
    assert [len(e.frontend_tools) for e in started] == [1, 0, 1]


@pytest.mark.asyncio
@pytest.mark.parametrize("tools,error", [
    ([{"name": "add"}], FrontendToolConflict),
    ([{"name": "not a name"}], InvalidFrontendTools),
    ([CONFIRM, CONFIRM], InvalidFrontendTools),
])
async def test_bad_frontend_tools_write_nothing(store: Any, tools: list[Any], error: type) -> None:
    rt, model = make_runtime(store, ["never"])
    with pytest.raises(error) as exc:
        await rt.start("agent", "go", thread_id="t1", run_id="r1", frontend_tools=tools)
    assert exc.value.code in ("frontend_tool_conflict", "invalid_frontend_tools")
    assert await store.last_seq() == 0 and model.requests == []


@pytest.mark.asyncio
async def test_permission_rules_apply_to_frontend_tools(store: Any) -> None:
    """`ask` on a frontend tool: approval first, then the client runs it (a second suspension)."""
    rt, model = make_runtime(store, [Turn.tool("confirm", {"text": "x"}), echo_result],
                             plugins=(PermissionPlugin(ask=["confirm"]),))
    result = await start_waiting(rt)
    (call_id,) = result.run.calls
    assert result.run.calls[call_id].ticket.action != ACTION  # type: ignore[union-attr]
    approved = await rt.decide("r1", {"target_id": call_id, "decision_id": "d1", "action": "resume",
                                       "result": {"approved": True}})
    waiting = await approved.handle.result()  # type: ignore[union-attr]
    assert waiting.status == "waiting" and waiting.run.calls[call_id].ticket.action == ACTION  # type: ignore[union-attr]
    answered = await rt.decide("r1", {"target_id": call_id, "decision_id": "d2", "action": "resume", "result": 42})
    done = await answered.handle.result()  # type: ignore[union-attr]
    assert done.termination.type == "natural_end" and last_tool_result(model.requests[1]) == "42"  # type: ignore[union-attr]
    assert (await verify_run(store, "r1", App(agents=rt.agents, tools=[add]))).ok


@pytest.mark.asyncio
async def test_stub_still_works_and_is_no_conflict(store: Any) -> None:
    """Backward compatible: an app-declared stub of the same name keeps handling the call; the
    request's declaration of it is not recorded again."""
    stub = frontend_tool("confirm", "Ask the user to confirm")
    rt, model = make_runtime(store, [Turn.tool("confirm", {"text": "x"}), echo_result], tools=[add, stub])
    result = await start_waiting(rt)
    log = await thread_log(store, "t1")
    assert log[0].commit.events[1].frontend_tools == []
    assert [t.name for t in model.requests[0].tools] == ["add", "confirm"]
    (call_id,) = result.run.calls
    decided = await rt.decide("r1", {"target_id": call_id, "decision_id": "d1", "action": "resume", "result": "ok"})
    done = await decided.handle.result()  # type: ignore[union-attr]
    assert done.termination.type == "natural_end"  # type: ignore[union-attr]
    assert (await verify_run(store, "r1", App(agents=rt.agents, tools=[add, stub]))).ok


# -- through the work queue: StartRun carries them to a worker -------------------------------------


async def until_event(store: Any, thread_id: str, kind: type, after: int = 0) -> int:
    """Follow the thread's log until a commit holds an event of `kind`; its seq."""
    async with contextlib.aclosing(store.follow(thread_id, after=after)) as commits:
        async for sc in commits:
            if any(type(e) is kind for e in sc.commit.events):
                return sc.seq
    raise AssertionError("the log ended")


@pytest.mark.asyncio
async def test_queue_dispatcher_and_worker(store: Any) -> None:
    rt, model = make_runtime(store, [Turn.tool("confirm", {"text": "really?"}), echo_result])
    worker = Worker(store, runtime=rt, ack_wait=5.0, fetch_timeout=0.2, shutdown_timeout=2.0)
    await worker.start()
    dispatcher = QueueDispatcher(store.nc, store, agents=["agent"], timeout=10.0)
    try:
        async with asyncio.timeout(30):
            with pytest.raises(InvalidInput):  # names are checked at the gateway: nothing queued
                await dispatcher.start_run(RunRequest(agent_id="agent", messages="go", thread_id="t1", run_id="r1",
                                                      frontend_tools=[{"name": "bad name"}]))
            assert await store.last_seq() == 0
            await dispatcher.start_run(RunRequest(agent_id="agent", messages="go", thread_id="t1", run_id="r1",
                                                  frontend_tools=[CONFIRM]))
            seq = await until_event(store, "t1", RunSuspended)
            view = await rt.run_view("r1")
            (call_id,) = view.calls
            assert view.calls[call_id].ticket.action == ACTION  # type: ignore[union-attr]
            await dispatcher.submit_inputs("r1", decisions=[
                {"target_id": call_id, "decision_id": "d1", "action": "resume", "result": "yes"}])
            await until_event(store, "t1", RunFinished, after=seq)
    finally:
        await worker.stop(timeout=2.0)
    assert [t.name for t in model.requests[0].tools] == ["add", "confirm"]
    assert last_tool_result(model.requests[1]) == "yes"
    assert (await verify_run(store, "r1", App(agents=rt.agents, tools=[add]))).ok
