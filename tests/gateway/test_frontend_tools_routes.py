"""AG-UI frontend tools end to end, on a real nats-server, over HTTP and NATS: a tool declared ONLY
in the request's `tools` (no backend stub) is offered to the model, its call ends the run
successfully with the call pending (`pendingToolCallIds`, AG-UI 1.0: not an interrupt), the client's
`role: tool` message resumes it (a `resume[]` entry still works) and the model's next turn sees it;
the exact streams, the run view, verified replay, a cold resume by a fresh Runtime, and refusals
that write nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from agentlog.runtime import App
from agentlog.runtime.models import ToolSpec, Turn
from agentlog.runtime.models.scripted import last_tool_result
from agentlog.runtime.replay.verify import verify_run

from tests.gateway.test_adapters_routes import agui_ok, run_input, text_of, user
from tests.support.adapters_routes import TOOLS, TRANSPORTS, Transport, open_stack
from tests.support.protocol_verify.agui import event_types, verify_agui_stream

pytestmark = [pytest.mark.asyncio, pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)]

PICK = {"name": "pick_color", "description": "Let the user pick a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "array", "items": {"type": "string"}}}}}
ARGS = {"palette": ["red", "blue"]}


def echo_result(request: Any) -> str:
    return f"You picked {json.loads(last_tool_result(request) or 'null')['color']}."


#: Every stream ends with its log position (CUSTOM `agentlog.position`) before RUN_FINISHED.
INTERRUPTED = ["RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
               "STEP_FINISHED", "STATE_SNAPSHOT", "MESSAGES_SNAPSHOT", "CUSTOM", "RUN_FINISHED"]
_LIVE = {"STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"}


def assert_resumed(events: list[Any]) -> None:
    """The resumed stream, exactly. The next step's text streams live (core NATS) while the
    decision commit is read from the log, so where TOOL_CALL_RESULT lands among the step's
    live events depends on arrival: the log's events and the live ones are each exact."""
    types = event_types(events)
    assert [t for t in types if t not in _LIVE] == [
        "RUN_STARTED", "STATE_SNAPSHOT", "TOOL_CALL_RESULT", "STEP_FINISHED", "MESSAGES_SNAPSHOT", "CUSTOM",
        "RUN_FINISHED"]
    assert [t for t in types if t in _LIVE] == [
        "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert types.index("TEXT_MESSAGE_END") < types.index("STEP_FINISHED")


def model_of(stack: Any) -> Any:
    return stack.runtime.agents.get("agent").model


async def interrupt_run(tr: Transport, stack: Any) -> Any:
    """The first run: it finishes successfully with the frontend call pending. Returns the
    pending call as a small record (`.id`) and keeps the MESSAGES_SNAPSHOT for the answer."""
    events = await agui_ok(tr, stack, run_input("t1", "r1", user("pick one", "u1"), tools=[PICK]))
    assert event_types(events) == INTERRUPTED
    outcome = events[-1].outcome
    assert outcome.type == "success" and len(outcome.pending_tool_call_ids) == 1
    start = next(e for e in events if e.type == "TOOL_CALL_START")
    assert start.tool_call_name == "pick_color" and start.tool_call_id == outcome.pending_tool_call_ids[0]
    args = "".join(e.delta for e in events if e.type == "TOOL_CALL_ARGS")
    assert json.loads(args) == ARGS
    snapshot = next(e for e in events if e.type == "MESSAGES_SNAPSHOT")
    return Pending(start.tool_call_id, [m.model_dump(mode="json", by_alias=True, exclude_none=True)
                                        for m in snapshot.messages])


@dataclass
class Pending:
    id: str
    messages: list[dict[str, Any]]


def resume_body(pending: Any, *, legacy: bool = False) -> dict[str, Any]:
    """The client's answer: the conventional `role: tool` message after the history it has (or,
    `legacy`, a `resume[]` entry, still accepted for clients written against the interrupt)."""
    if legacy:
        return run_input("t1", "r2", *pending.messages, tools=[PICK], resume=[
            {"interruptId": pending.id, "status": "resolved", "payload": {"color": "blue"}}])
    tool_message = {"id": "client-tool-1", "role": "tool", "toolCallId": pending.id,
                    "content": json.dumps({"color": "blue"})}
    return run_input("t1", "r2", *pending.messages, tool_message, tools=[PICK])


@pytest.mark.parametrize("legacy", [False, True], ids=["tool-message", "resume-entry"])
async def test_request_only_frontend_tool_round_trip(nats_server: Any, tr: Transport, legacy: bool) -> None:
    turns = [Turn.tool("pick_color", ARGS), echo_result]
    async with open_stack(nats_server, turns) as stack:
        assert "pick_color" not in {t.name for t in TOOLS}  # declared by the request alone
        interrupt = await interrupt_run(tr, stack)
        model = model_of(stack)
        assert model.requests[0].tools[-1] == ToolSpec(**PICK)
        view = await stack.runtime.run_view("r1")
        assert view.status == "waiting"
        call = view.calls[interrupt.id]
        assert call.status == "suspended" and call.ticket.action == "frontend_tool"
        assert call.ticket.parameters == ARGS and call.ticket.resume_mode == "use_decision_as_tool_result"

        events = await agui_ok(tr, stack, resume_body(interrupt, legacy=legacy))
        assert_resumed(events)
        (result,) = [e for e in events if e.type == "TOOL_CALL_RESULT"]
        assert result.tool_call_id == interrupt.id and json.loads(result.content) == {"color": "blue"}
        assert text_of(events) == "You picked blue." and events[-1].outcome.type == "success"
        # the model's next turn saw the client's result as the tool's result
        assert json.loads(last_tool_result(model.requests[1]) or "") == {"color": "blue"}
        view = await stack.runtime.run_view("r1")
        assert view.status == "done" and view.termination.type == "natural_end"
        assert view.calls[interrupt.id].status == "succeeded"
        assert view.calls[interrupt.id].result == {"color": "blue"}
        report = await verify_run(stack.store, "r1", App(agents=stack.runtime.agents, tools=TOOLS))
        assert report.ok and report.status == "done" and report.tools_executed == 0


async def test_cold_resume_by_a_fresh_runtime(nats_server: Any, tr: Transport) -> None:
    """The gateway + runtime that started the run is gone; a new stack (new Runtime, new
    adapter service, same NATS) takes the client's result and finishes the run from the log."""
    async with open_stack(nats_server, [Turn.tool("pick_color", ARGS)]) as first:
        interrupt = await interrupt_run(tr, first)
    async with open_stack(nats_server, [echo_result]) as second:
        events = await agui_ok(tr, second, resume_body(interrupt))
        assert_resumed(events)
        assert text_of(events) == "You picked blue."
        (request,) = model_of(second).requests
        assert request.tools[-1] == ToolSpec(**PICK)  # from RunStarted, not from this process
        report = await verify_run(second.store, "r1", App(agents=second.runtime.agents, tools=TOOLS))
        assert report.ok


async def test_name_clash_is_an_error_and_writes_nothing(nats_server: Any, tr: Transport) -> None:
    clash = {"name": "add", "description": "the client's add", "parameters": {"type": "object"}}
    async with open_stack(nats_server, ["never"]) as stack:
        seq = await stack.last_seq()
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("hi", "u1"), tools=[PICK, clash]))
        assert event_types(events) == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_ERROR"]
        assert events[-1].code == "frontend_tool_conflict" and "'add'" in events[-1].message
        assert await stack.last_seq() == seq and model_of(stack).requests == []


async def test_invalid_tool_name_is_rejected_and_writes_nothing(nats_server: Any, tr: Transport) -> None:
    async with open_stack(nats_server, ["never"]) as stack:
        seq = await stack.last_seq()
        answer = await tr.agui(stack, run_input("t1", "r1", user("hi", "u1"), tools=[{**PICK, "name": "pick color"}]))
        assert answer.rejected is not None
        if tr.name == "http":
            assert answer.rejected["status"] == 400 and answer.rejected["code"] == "invalid_input"
        else:
            (event,) = verify_agui_stream(answer.events)
            assert event.type == "RUN_ERROR" and "tools[0].name" in event.message
        assert await stack.last_seq() == seq
