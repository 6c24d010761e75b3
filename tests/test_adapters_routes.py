"""AG-UI and AI SDK adapters end to end, on a real nats-server, over HTTP (real aiohttp server
and client) AND NATS request/reply (same scenarios, parametrized transport): every stream passes
the shared verifiers (AG-UI: ag-ui-protocol models too), approval and frontend-tool round trips
complete, and a bad resume writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallDecided
from agentlog.runtime import PermissionPlugin
from agentlog.runtime.models import ModelRequestRejected, Turn

from protocol_verify.agui import event_types, verify_agui_stream
from protocol_verify.aisdk import part_types, verify_ui_stream
from test_adapters_routes_support import TRANSPORTS, Stack, Transport, open_stack

pytestmark = [pytest.mark.asyncio, pytest.mark.parametrize("tr", TRANSPORTS, ids=lambda t: t.name)]


def run_input(thread: str, run: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": list(messages), "tools": [], "context": [],
            "state": {}, "forwardedProps": {}, **extra}


def user(text: str, mid: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")


async def agui_ok(tr: Transport, stack: Stack, body: dict[str, Any]) -> list[Any]:
    answer = await tr.agui(stack, body)
    assert answer.rejected is None, answer.rejected
    return verify_agui_stream(answer.events)


# -- AG-UI ---------------------------------------------------------------------------------------


async def test_agui_text_run_and_continuation(nats_server: Any, tr: Transport) -> None:
    async with open_stack(nats_server, ["Hello there my friend", "Second answer"]) as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("hi", "u1")))
        assert event_types(events)[0] == "RUN_STARTED" and event_types(events)[-1] == "RUN_FINISHED"
        assert text_of(events) == "Hello there my friend"
        assert events[-1].outcome.type == "success"
        # the client sends the whole history again: only the new user message is new
        snapshot = [m.model_dump(by_alias=True, exclude_none=True)
                    for m in next(e for e in events if e.type == "MESSAGES_SNAPSHOT").messages]
        events = await agui_ok(tr, stack, run_input("t1", "r2", *snapshot, user("again", "u2")))
        assert text_of(events) == "Second answer"
        assert events[0].parent_run_id == "r1"
        view = await stack.runtime.run_view("r2")
        assert view.parent_run_id == "r1"
        roles = [getattr(e.message, "role", None) for e in await stack.events_of("t1") if type(e).__name__ == "MessageAppended"]
        assert roles == ["user", "assistant", "user", "assistant"]


async def test_agui_tool_state_and_parallel_tools(nats_server: Any, tr: Transport) -> None:
    turns = [Turn.tools(("add", {"a": 1, "b": 2}), ("echo", {"text": "b"}), ("broken", {})), "The sum is 3."]
    async with open_stack(nats_server, turns, mode="parallel_streaming") as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("add", "u1")))
        types = event_types(events)
        assert "STATE_DELTA" in types and types[-1] == "RUN_FINISHED"
        results = {e.tool_call_id: e.content for e in events if e.type == "TOOL_CALL_RESULT"}
        assert len(results) == 3 and "3" in results.values() and "b" in results.values()
        assert any("disk is on fire" in c for c in results.values())


async def test_agui_error_run(nats_server: Any, tr: Transport) -> None:
    async with open_stack(nats_server, [Turn.fail(ModelRequestRejected("bad api key"))]) as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("hi", "u1")))
        assert events[-1].type == "RUN_ERROR" and "bad api key" in events[-1].message


async def test_agui_approval_round_trip_idempotent(nats_server: Any, tr: Transport) -> None:
    perm = PermissionPlugin(ask=["echo"])
    async with open_stack(nats_server, [Turn.tool("echo", {"text": "deploy"}), "Deployed."],
                          plugins=(perm,)) as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("deploy it", "u1")))
        outcome = events[-1].outcome
        assert outcome.type == "interrupt"
        (interrupt,) = outcome.interrupts
        resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approved": True}}]
        events = await agui_ok(tr, stack, run_input("t1", "r2", resume=resume))
        assert [e.type for e in events if e.type.startswith("TOOL_CALL")] == ["TOOL_CALL_RESULT"]
        assert events[-1].type == "RUN_FINISHED" and events[-1].outcome.type == "success"
        assert text_of(events) == "Deployed."
        seq = await stack.last_seq()
        # the same resume again: no second decision, nothing written, the stream replays
        events = await agui_ok(tr, stack, run_input("t1", "r3", resume=resume))
        assert events[-1].type == "RUN_FINISHED"
        assert await stack.last_seq() == seq
        decided = [e for e in await stack.events_of("t1") if type(e) is ToolCallDecided]
        assert len(decided) == 1


@pytest.mark.parametrize("resume", [
    [{"interruptId": "call_0_0", "status": "resolved"}],  # misses call_0_1
    [{"interruptId": "call_0_0", "status": "resolved"}, {"interruptId": "call_0_1", "status": "resolved"},
     {"interruptId": "nope", "status": "resolved"}],
    [],
], ids=["missing", "unknown", "none"])
async def test_agui_bad_resume_writes_nothing(nats_server: Any, tr: Transport, resume: list[Any]) -> None:
    turns = [Turn.tools(("approve_me", {"what": "x"}), ("approve_me", {"what": "y"}))]
    async with open_stack(nats_server, turns, mode="parallel_batch_approval") as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("go", "u1")))
        assert {i.id for i in events[-1].outcome.interrupts} == {"call_0_0", "call_0_1"}
        seq = await stack.last_seq()
        extra = [user("new input", "u2")] if not resume else []
        events = await agui_ok(tr, stack, run_input("t1", "r2", *extra, resume=resume or None))
        assert event_types(events) == ["RUN_STARTED", "RUN_ERROR"]
        assert events[-1].code in ("missing_resume", "unknown_interrupt")
        assert await stack.last_seq() == seq


@pytest.mark.parametrize("via", ["resume", "tool_message"])
async def test_agui_frontend_tool_round_trip(nats_server: Any, tr: Transport, via: str) -> None:
    turns = [Turn.tool("confirm_action", {"text": "really?"}), "Confirmed, thanks."]
    tools = [{"name": "confirm_action", "description": "confirm", "parameters": {"type": "object"}}]
    async with open_stack(nats_server, turns) as stack:
        events = await agui_ok(tr, stack, run_input("t1", "r1", user("do it", "u1"), tools=tools))
        # AG-UI 1.0: a frontend tool call is a pending tool call of a successful run, not an interrupt
        outcome = events[-1].outcome
        assert outcome.type == "success"
        (call_id,) = outcome.pending_tool_call_ids
        if via == "resume":  # still accepted
            body = run_input("t1", "r2", tools=tools, resume=[
                {"interruptId": call_id, "status": "resolved", "payload": {"confirmed": True}}])
        else:
            body = run_input("t1", "r2", user("do it", "u1"), {
                "id": "tm1", "role": "tool", "toolCallId": call_id, "content": json.dumps({"confirmed": True})},
                tools=tools)
        events = await agui_ok(tr, stack, body)
        (result,) = [e for e in events if e.type == "TOOL_CALL_RESULT"]
        assert result.tool_call_id == call_id and json.loads(result.content) == {"confirmed": True}
        assert events[-1].type == "RUN_FINISHED" and text_of(events) == "Confirmed, thanks."


async def test_agui_invalid_request_writes_nothing(nats_server: Any, tr: Transport) -> None:
    async with open_stack(nats_server, ["x"]) as stack:
        seq = await stack.last_seq()
        answer = await tr.agui(stack, {"threadId": "t1", "messages": "nope"})
        assert answer.rejected is not None
        if tr.name == "http":
            assert answer.rejected["status"] == 400 and answer.rejected["code"] == "invalid_input"
        else:
            assert len(answer.events) == 1
            verify_agui_stream(answer.events)
        assert await stack.last_seq() == seq


# -- AI SDK --------------------------------------------------------------------------------------


def chat(thread: str, text: str | None = None, *, mid: str = "m1", parts: list[Any] | None = None,
         role: str = "user") -> dict[str, Any]:
    msg_parts = parts if parts is not None else [{"type": "text", "text": text}]
    return {"id": thread, "trigger": "submit-message", "messages": [{"id": mid, "role": role, "parts": msg_parts}]}


async def aisdk_ok(tr: Transport, stack: Stack, body: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    answer = await tr.aisdk(stack, body)
    assert answer.rejected is None, answer.rejected
    assert answer.done
    return verify_ui_stream(answer.events, **kw)


async def test_aisdk_text_tool_and_error(nats_server: Any, tr: Transport) -> None:
    turns = [Turn.tools(("add", {"a": 1, "b": 2}), ("broken", {})), "The sum is 3.",
             Turn.fail(ModelRequestRejected("bad api key"))]
    async with open_stack(nats_server, turns, mode="parallel_streaming") as stack:
        parts = await aisdk_ok(tr, stack, chat("c1", "add"))
        types = part_types(parts)
        assert types[0] == "start" and parts[-1] == {"type": "finish", "finishReason": "stop"}
        assert "tool-output-available" in types and "tool-output-error" in types
        assert "data-state-delta" in types
        assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "The sum is 3."
        parts = await aisdk_ok(tr, stack, chat("c1", "again", mid="m2"))
        assert part_types(parts)[-2:] == ["error", "finish"] and parts[-1]["finishReason"] == "error"


async def test_aisdk_approval_round_trip(nats_server: Any, tr: Transport) -> None:
    perm = PermissionPlugin(ask=["echo"])
    async with open_stack(nats_server, [Turn.tool("echo", {"text": "deploy"}), "Deployed."],
                          plugins=(perm,)) as stack:
        parts = await aisdk_ok(tr, stack, chat("c1", "deploy it"))
        assert parts[-1] == {"type": "finish", "finishReason": "tool-calls"}
        (request,) = [p for p in parts if p["type"] == "tool-approval-request"]
        message_id = parts[0]["messageId"]
        approval = [{"type": "tool-echo", "toolCallId": request["toolCallId"], "state": "approval-responded",
                     "input": {"text": "deploy"}, "approval": {"id": request["approvalId"], "approved": True}}]
        body = chat("c1", mid=message_id, parts=approval, role="assistant")
        parts = await aisdk_ok(tr, stack, body, known_tool_calls=[request["toolCallId"]])
        assert parts[0] == {"type": "start", "messageId": message_id}
        assert {"type": "tool-output-available", "toolCallId": request["toolCallId"], "output": "deploy"} in parts
        assert parts[-1] == {"type": "finish", "finishReason": "stop"}
        seq = await stack.last_seq()
        again = await aisdk_ok(tr, stack, body, known_tool_calls=[request["toolCallId"]])
        # a replay from the log: same content (text synthesised from the commit, not live deltas)
        assert [p for p in again if p["type"].startswith("tool-")] == [p for p in parts if p["type"].startswith("tool-")]
        assert again[-1] == parts[-1] and await stack.last_seq() == seq


async def test_aisdk_unknown_approval_and_invalid_body(nats_server: Any, tr: Transport) -> None:
    async with open_stack(nats_server, ["hello"]) as stack:
        await aisdk_ok(tr, stack, chat("c1", "hi"))
        seq = await stack.last_seq()
        approval = [{"type": "tool-approval-response", "approvalId": "nope", "approved": True}]
        parts = await aisdk_ok(tr, stack, chat("c1", mid="a1", parts=approval, role="assistant"))
        assert part_types(parts) == ["start", "error", "finish"]
        answer = await tr.aisdk(stack, {"messages": []})
        assert answer.rejected is not None
        if tr.name == "nats":
            assert answer.events == [answer.rejected]
        else:
            assert answer.rejected["status"] == 400
        assert await stack.last_seq() == seq
