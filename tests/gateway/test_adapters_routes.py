"""AG-UI and AI SDK adapters end to end against what users run (`agentlog serve`, and `agentlog
gateway` + `agentlog worker`: the shared `protocol_deployment` of tests/apps/protocol_app.py, whose
scenario is the first word of the user message), over HTTP AND NATS request/reply (same
scenarios, parametrized transport): every stream passes the shared verifiers (AG-UI:
ag-ui-protocol models too), approval and frontend-tool round trips complete, and a bad resume
writes nothing. Every test uses its own threads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallDecided

from tests.support.adapters_routes import TRANSPORTS, Deployed, Transport, open_deployed
from tests.support.http_stack import uid
from tests.support.protocol_verify.agui import event_types, verify_agui_stream
from tests.support.protocol_verify.aisdk import part_types, verify_ui_stream
from tests.support.topology import Deployment

pytestmark = [pytest.mark.asyncio, pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)]

#: protocol_app's agents: `sequential` asks before `echo`; `open` asks nothing (parallel_streaming);
#: `parallel_batch_approval` runs a batch once every call of it is decided.
ASKS, OPEN, BATCH = "sequential", "open", "parallel_batch_approval"
HELLO = "Hello from agentlog, streamed live."


@pytest.fixture
async def stack(protocol_deployment: Deployment) -> AsyncIterator[Deployed]:
    async with open_deployed(protocol_deployment) as value:
        yield value


def run_input(thread: str, run: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": list(messages), "tools": [], "context": [],
            "state": {}, "forwardedProps": {}, **extra}


def user(text: str, mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")


async def agui_ok(tr: Transport, stack: Deployed, body: dict[str, Any], agent: str = "agent") -> list[Any]:
    answer = await tr.agui(stack, body, agent)  # type: ignore[arg-type]
    assert answer.rejected is None, answer.rejected
    return verify_agui_stream(answer.events)


# -- AG-UI ---------------------------------------------------------------------------------------


async def test_agui_text_run_and_continuation(stack: Deployed, tr: Transport) -> None:
    t1, r1, r2 = uid("t"), uid("r"), uid("r")
    events = await agui_ok(tr, stack, run_input(t1, r1, user("text: hi", uid("u"))), OPEN)
    assert event_types(events)[0] == "RUN_STARTED" and event_types(events)[-1] == "RUN_FINISHED"
    assert text_of(events) == HELLO
    assert events[-1].outcome.type == "success"
    # the client sends the whole history again: only the new user message is new
    snapshot = [m.model_dump(by_alias=True, exclude_none=True)
                for m in next(e for e in events if e.type == "MESSAGES_SNAPSHOT").messages]
    events = await agui_ok(tr, stack, run_input(t1, r2, *snapshot, user("text: again", uid("u"))), OPEN)
    assert text_of(events) == HELLO
    assert events[0].parent_run_id == r1
    async with stack.client.get(f"/v1/runs/{r2}") as resp:
        view = await resp.json()
        assert resp.status == 200, view
    assert view["parent_run_id"] == r1
    roles = [getattr(e.message, "role", None) for e in await stack.events_of(t1) if type(e).__name__ == "MessageAppended"]
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_agui_tool_state_and_parallel_tools(stack: Deployed, tr: Transport) -> None:
    events = await agui_ok(tr, stack, run_input(uid("t"), uid("r"), user("trio: add", uid("u"))), OPEN)
    types = event_types(events)
    assert "STATE_DELTA" in types and types[-1] == "RUN_FINISHED"
    results = {e.tool_call_id: e.content for e in events if e.type == "TOOL_CALL_RESULT"}
    assert len(results) == 3 and "3" in results.values() and "b" in results.values()
    assert any("disk is on fire" in c for c in results.values())


async def test_agui_error_run(stack: Deployed, tr: Transport) -> None:
    events = await agui_ok(tr, stack, run_input(uid("t"), uid("r"), user("fail: hi", uid("u"))), OPEN)
    assert events[-1].type == "RUN_ERROR" and "bad api key" in events[-1].message


async def test_agui_approval_round_trip_idempotent(stack: Deployed, tr: Transport) -> None:
    t1 = uid("t")
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), user("approval: deploy it", uid("u"))), ASKS)
    outcome = events[-1].outcome
    assert outcome.type == "interrupt"
    (interrupt,) = outcome.interrupts
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approved": True}}]
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), resume=resume), ASKS)
    assert [e.type for e in events if e.type.startswith("TOOL_CALL")] == ["TOOL_CALL_RESULT"]
    assert events[-1].type == "RUN_FINISHED" and events[-1].outcome.type == "success"
    assert text_of(events) == "All done."
    seq = await stack.last_seq()
    # the same resume again: no second decision, nothing written, the stream replays
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), resume=resume), ASKS)
    assert events[-1].type == "RUN_FINISHED"
    assert await stack.last_seq() == seq
    decided = [e for e in await stack.events_of(t1) if type(e) is ToolCallDecided]
    assert len(decided) == 1


@pytest.mark.parametrize("resume", ["missing", "unknown", "none"])
async def test_agui_bad_resume_writes_nothing(stack: Deployed, tr: Transport, resume: str) -> None:
    t1 = uid("t")
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), user("pair: go", uid("u"))), BATCH)
    first, second = sorted(i.id for i in events[-1].outcome.interrupts)
    answers = {
        "missing": [{"interruptId": first, "status": "resolved"}],  # misses the second
        "unknown": [{"interruptId": first, "status": "resolved"}, {"interruptId": second, "status": "resolved"},
                    {"interruptId": "nope", "status": "resolved"}],
        "none": [],
    }[resume]
    seq = await stack.last_seq()
    extra = [user("new input", uid("u"))] if not answers else []
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), *extra, resume=answers or None), BATCH)
    assert event_types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1].code in ("missing_resume", "unknown_interrupt")
    assert await stack.last_seq() == seq


@pytest.mark.parametrize("via", ["resume", "tool_message"])
async def test_agui_frontend_tool_round_trip(stack: Deployed, tr: Transport, via: str) -> None:
    t1, first = uid("t"), user("confirm: do it", uid("u"))
    tools = [{"name": "confirm_action", "description": "confirm", "parameters": {"type": "object"}}]
    events = await agui_ok(tr, stack, run_input(t1, uid("r"), first, tools=tools), OPEN)
    # AG-UI 1.0: a frontend tool call is a pending tool call of a successful run, not an interrupt
    outcome = events[-1].outcome
    assert outcome.type == "success"
    (call_id,) = outcome.pending_tool_call_ids
    if via == "resume":  # still accepted
        body = run_input(t1, uid("r"), tools=tools, resume=[
            {"interruptId": call_id, "status": "resolved", "payload": {"confirmed": True}}])
    else:
        body = run_input(t1, uid("r"), first, {
            "id": uid("tm"), "role": "tool", "toolCallId": call_id, "content": json.dumps({"confirmed": True})},
            tools=tools)
    events = await agui_ok(tr, stack, body, OPEN)
    (result,) = [e for e in events if e.type == "TOOL_CALL_RESULT"]
    assert result.tool_call_id == call_id and json.loads(result.content) == {"confirmed": True}
    assert events[-1].type == "RUN_FINISHED" and text_of(events) == "Confirmed, thanks."


async def test_agui_invalid_request_writes_nothing(stack: Deployed, tr: Transport) -> None:
    seq = await stack.last_seq()
    answer = await tr.agui(stack, {"threadId": uid("t"), "messages": "nope"}, OPEN)  # type: ignore[arg-type]
    assert answer.rejected is not None
    if tr.name == "http":
        assert answer.rejected["status"] == 400 and answer.rejected["code"] == "invalid_input"
    else:
        assert len(answer.events) == 1
        verify_agui_stream(answer.events)
    assert await stack.last_seq() == seq


# -- AI SDK --------------------------------------------------------------------------------------


def chat(thread: str, text: str | None = None, *, mid: str | None = None, parts: list[Any] | None = None,
         role: str = "user") -> dict[str, Any]:
    msg_parts = parts if parts is not None else [{"type": "text", "text": text}]
    return {"id": thread, "trigger": "submit-message",
            "messages": [{"id": mid or uid("m"), "role": role, "parts": msg_parts}]}


async def aisdk_ok(tr: Transport, stack: Deployed, body: dict[str, Any], agent: str, **kw: Any
                   ) -> list[dict[str, Any]]:
    answer = await tr.aisdk(stack, body, agent)  # type: ignore[arg-type]
    assert answer.rejected is None, answer.rejected
    assert answer.done
    return verify_ui_stream(answer.events, **kw)


async def test_aisdk_text_tool_and_error(stack: Deployed, tr: Transport) -> None:
    c1 = uid("c")
    parts = await aisdk_ok(tr, stack, chat(c1, "trio: add"), OPEN)
    types = part_types(parts)
    assert types[0] == "start" and parts[-1] == {"type": "finish", "finishReason": "stop"}
    assert "tool-output-available" in types and "tool-output-error" in types
    assert "data-state-delta" in types
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "The sum is 3."
    parts = await aisdk_ok(tr, stack, chat(c1, "fail: again"), OPEN)
    assert part_types(parts)[-2:] == ["error", "finish"] and parts[-1]["finishReason"] == "error"


async def test_aisdk_approval_round_trip(stack: Deployed, tr: Transport) -> None:
    c1 = uid("c")
    parts = await aisdk_ok(tr, stack, chat(c1, "approval: deploy it"), ASKS)
    assert parts[-1] == {"type": "finish", "finishReason": "tool-calls"}
    (request,) = [p for p in parts if p["type"] == "tool-approval-request"]
    message_id = parts[0]["messageId"]
    approval = [{"type": "tool-echo", "toolCallId": request["toolCallId"], "state": "approval-responded",
                 "input": {"text": "deploy"}, "approval": {"id": request["approvalId"], "approved": True}}]
    body = chat(c1, mid=message_id, parts=approval, role="assistant")
    parts = await aisdk_ok(tr, stack, body, ASKS, known_tool_calls=[request["toolCallId"]])
    assert parts[0] == {"type": "start", "messageId": message_id}
    assert {"type": "tool-output-available", "toolCallId": request["toolCallId"], "output": "deploy"} in parts
    assert parts[-1] == {"type": "finish", "finishReason": "stop"}
    seq = await stack.last_seq()
    again = await aisdk_ok(tr, stack, body, ASKS, known_tool_calls=[request["toolCallId"]])
    # a replay from the log: same content (text synthesised from the commit, not live deltas)
    assert [p for p in again if p["type"].startswith("tool-")] == [p for p in parts if p["type"].startswith("tool-")]
    assert again[-1] == parts[-1] and await stack.last_seq() == seq


async def test_aisdk_unknown_approval_and_invalid_body(stack: Deployed, tr: Transport) -> None:
    c1 = uid("c")
    await aisdk_ok(tr, stack, chat(c1, "text: hi"), OPEN)
    seq = await stack.last_seq()
    approval = [{"type": "tool-approval-response", "approvalId": "nope", "approved": True}]
    parts = await aisdk_ok(tr, stack, chat(c1, parts=approval, role="assistant"), OPEN)
    assert part_types(parts) == ["start", "error", "finish"]
    answer = await tr.aisdk(stack, {"messages": []}, OPEN)  # type: ignore[arg-type]
    assert answer.rejected is not None
    if tr.name == "nats":
        assert answer.events == [answer.rejected]
    else:
        assert answer.rejected["status"] == 400
    assert await stack.last_seq() == seq
