"""AI SDK v6 adapter on REAL recorded runs: every stream is SSE-encoded, parsed back and checked by
the shared verifier (strict part schema, ordering, [DONE]); exact part sequences for a few; the
chat body parser (tool-approval-response and approval-responded parts) and its fuzzing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    StepStarted,
    SuspendTicket,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallResuming,
    ToolCallSuspended,
)
from agentlog.gateway.adapters.aisdk.translator import (
    DONE,
    HEADERS,
    AiSdkTranslator,
    acted_on_approvals,
    check_approvals,
    encode_stream,
    parse_chat_request,
    translate,
)
from agentlog.gateway.adapters.common import AdapterInputError, ResumeError, UnknownInterrupt
from agentlog.runtime import PermissionPlugin
from agentlog.runtime.models import ModelRequestRejected, Turn

from tests.support.adapters import Recorded, record, store  # noqa: F401  (fixture)
from tests.support.protocol_verify.aisdk import UiStreamError, part_types, verify_ui_stream

asyncio_mark = pytest.mark.asyncio


def stream(rec: Recorded, **kw: Any) -> list[dict[str, Any]]:
    r = rec.result
    wire = encode_stream(translate(r.thread_id, r.run_id, rec.items, **kw))
    assert wire.endswith(DONE)
    return verify_ui_stream(wire)


def test_headers() -> None:
    assert HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    assert HEADERS["content-type"] == "text/event-stream"


@asyncio_mark
async def test_plain_text_exact_sequence(store: Any) -> None:
    rec = await record(store, ["Hello there, friend!"])
    parts = stream(rec)
    assert part_types(parts) == ["start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert parts[0] == {"type": "start", "messageId": rec.result.run_id}
    assert parts[3]["delta"] == "Hello there, friend!" and parts[-1]["finishReason"] == "stop"


@asyncio_mark
async def test_live_text_and_tool_input_deltas(store: Any) -> None:
    rec = await record(store, [Turn.tool("echo", {"text": "x"}), "one two three"], live=True, chunk_words=1)
    parts = stream(rec)
    types = part_types(parts)
    assert "tool-input-delta" in types and types.count("text-delta") == 3
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "one two three"
    avail = [p for p in parts if p["type"] == "tool-input-available"]
    assert avail == [{"type": "tool-input-available", "toolCallId": "call_0_0", "toolName": "echo", "input": {"text": "x"}}]


@asyncio_mark
async def test_tool_run_exact_sequence(store: Any) -> None:
    rec = await record(store, [Turn.tool("add", {"a": 1, "b": 2}), "3"], tool_execution_mode="sequential")
    parts = stream(rec)
    assert part_types(parts) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "data-state-delta",
        "tool-output-available", "finish-step",
        "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish",
    ]
    assert parts[5] == {"type": "tool-output-available", "toolCallId": "call_0_0", "output": 3}
    assert parts[4]["transient"] is True and parts[4]["data"] == [{"op": "add", "path": "/last_sum", "value": 3}]


@asyncio_mark
async def test_parallel_tools_errors_and_denials(store: Any) -> None:
    perm = PermissionPlugin(allow=["*"], deny=[{"tool": "echo", "args": {"text": "secret"}}], default="deny")
    rec = await record(store, [Turn.tools(("echo", {"text": "a"}), ("echo", {"text": "secret"}), ("broken", {})), "ok"],
                       tool_execution_mode="parallel_streaming", plugins=[perm], live=True)
    parts = stream(rec)
    outputs = {p["toolCallId"]: p for p in parts if p["type"].startswith("tool-output")}
    assert outputs["call_0_0"] == {"type": "tool-output-available", "toolCallId": "call_0_0", "output": "a"}
    assert outputs["call_0_1"] == {"type": "tool-output-denied", "toolCallId": "call_0_1"}
    assert outputs["call_0_2"]["type"] == "tool-output-error"
    assert "disk is on fire" in outputs["call_0_2"]["errorText"]


@asyncio_mark
async def test_error_termination(store: Any) -> None:
    rec = await record(store, [Turn.fail(ModelRequestRejected("bad api key"))])
    parts = stream(rec)
    assert part_types(parts) == ["start", "start-step", "finish-step", "error", "finish"]
    assert "bad api key" in parts[3]["errorText"] and parts[-1]["finishReason"] == "error"


@asyncio_mark
async def test_suspended_turn_requests_approval_and_finishes_with_tool_calls(store: Any) -> None:
    rec = await record(store, [Turn.tools(("approve_me", {"what": "x"}), ("ask_name", {}))],
                       tool_execution_mode="parallel_batch_approval")
    parts = stream(rec)
    assert part_types(parts) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-input-start",
        "tool-input-available", "tool-approval-request", "data-agentlog-interrupt", "finish-step", "finish",
    ]
    assert parts[6] == {"type": "tool-approval-request", "approvalId": "call_0_0", "toolCallId": "call_0_0"}
    assert parts[7]["data"]["reason"] == "input_required" and parts[7]["id"] == "call_0_1"
    assert parts[-1] == {"type": "finish", "finishReason": "tool-calls"}
    # the client answers; the body parses to decisions that check against the waiting run
    body = {"id": rec.result.thread_id, "messages": [{"id": rec.result.run_id, "role": "assistant", "parts": [
        {"type": "tool-approve_me", "toolCallId": "call_0_0", "state": "approval-responded",
         "input": {"what": "x"}, "approval": {"id": "call_0_0", "approved": True}}]}]}
    req = parse_chat_request(body)
    open_ids = [c.call_id for c in rec.result.run.calls.values() if c.status == "suspended"]
    assert [d["target_id"] for d in check_approvals(req, open_ids)] == ["call_0_0"]


def test_a_tool_call_is_started_once_whichever_way_it_comes() -> None:
    """The step's commit after the next step's deltas (a live link far ahead, unmerged): one
    `tool-input-start` for the call, found by id whatever step is open."""
    tr = AiSdkTranslator("t", "r1")
    parts = tr.feed({"type": "tool_call_delta", "step": 1, "index": 0, "message_id": "m1", "call_id": "c1",
                     "name": "add", "arguments_delta": '{"a": 1}'})
    parts += tr.feed({"type": "text_delta", "step": 2, "text": "Done", "message_id": "m2"})
    parts += tr.feed(StepStarted(step=1))
    parts += tr.feed(MessageAppended(message=Message(
        id="m1", role="assistant", content="", tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1})])))
    parts += tr.feed({"type": "tool_call_delta", "step": 1, "index": 0, "message_id": "m1", "call_id": "c1",
                      "name": "add", "arguments_delta": "}"})
    assert [p["toolCallId"] for p in parts if p["type"] == "tool-input-start"] == ["c1"]
    assert [p["toolCallId"] for p in parts if p["type"] == "tool-input-available"] == ["c1"]


def test_a_replay_asks_again_for_approvals_the_run_has_not_gone_on_from() -> None:
    """Only a suspension the run resumed from with an approval loses its approval request in a
    replay: not one approved while the rest of its batch is unanswered, not a denied one, not
    the call's next suspension."""
    def suspended(call: str) -> ToolCallSuspended:
        return ToolCallSuspended(call_id=call, ticket=SuspendTicket(id=f"t-{call}"))

    def decided(call: str, action: str) -> ToolCallDecided:
        return ToolCallDecided(call_id=call, decision=ToolCallDecision(
            target_id=call, decision_id=f"d-{call}-{action}", action=action))  # type: ignore[arg-type]

    partial = [suspended("a"), suspended("b"), decided("a", "resume")]
    assert acted_on_approvals(partial) == []
    again = [suspended("a"), decided("a", "resume"), ToolCallResuming(call_id="a", mode="replay_tool_call"),
             suspended("a")]
    assert acted_on_approvals(again) == ["a"]
    denied = [suspended("a"), decided("a", "cancel"), ToolCallResuming(call_id="a", mode="replay_tool_call")]
    assert acted_on_approvals(denied) == []
    tr = AiSdkTranslator("t", "r")
    tr.approved_later(acted_on_approvals(again))
    parts = [p for ev in again for p in tr.feed(ev)]
    assert [p["type"] for p in parts if p["type"] == "tool-approval-request"] == ["tool-approval-request"]


def test_resumed_stream_continues_the_same_message() -> None:
    tr = AiSdkTranslator("t", "r2", message_id="r1")
    decision = ToolCallDecision(target_id="c1", decision_id="d", action="cancel", reason="no")
    parts = tr.feed(ToolCallDecided(call_id="c1", decision=decision))
    parts += tr.feed(ToolCallCompleted(call_id="c1", outcome="cancelled", result={"error": "no"}))
    parts += tr.feed(MessageAppended(message=Message(id="m", role="tool", content="no", tool_call_id="c1")))
    parts += tr.finish()
    verify_ui_stream(parts, known_tool_calls=["c1"])
    assert parts[0] == {"type": "start", "messageId": "r1"}
    assert parts[1] == {"type": "tool-output-denied", "toolCallId": "c1"}
    assert part_types(parts)[-2:] == ["error", "finish"]
    with pytest.raises(UiStreamError, match="no tool-input-available"):
        verify_ui_stream(parts)


@pytest.mark.parametrize("parts, rule", [
    ([{"type": "text-start", "id": "a"}], "first part"),
    ([{"type": "start"}, {"type": "text-delta", "id": "a", "delta": "x"}], "not open"),
    ([{"type": "start"}, {"type": "text-start", "id": "a"}, {"type": "finish"}], "open text"),
    ([{"type": "start"}, {"type": "tool-output-available", "toolCallId": "c", "output": 1}], "no tool-input-available"),
    ([{"type": "start"}, {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "c"}], "no tool-input"),
    ([{"type": "start"}, {"type": "finish"}, {"type": "start-step"}], "nothing may follow"),
    ([{"type": "start"}, {"type": "error", "errorText": "x"}, {"type": "start-step"}], "only finish"),
    ([{"type": "start"}, {"type": "finish", "finishReason": "done"}], "finishReason"),
    ([{"type": "start"}, {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "c", "x": 1}], "strict"),
    ([{"type": "start"}, {"type": "tool-input-available", "toolCallId": "c", "toolName": "f"}], "missing"),
    ([{"type": "start"}, {"type": "start-step"}, {"type": "start-step"}], "inside an open step"),
    ([{"type": "start"}, {"type": "start-step"}, {"type": "finish"}], "open step"),
    ([{"type": "start"}, {"type": "wat"}], "unknown part"),
    ([{"type": "start"}], "ends without"),
])
def test_verifier_rejects(parts: list[dict[str, Any]], rule: str) -> None:
    with pytest.raises(UiStreamError, match=rule):
        verify_ui_stream(parts)


def test_verifier_needs_done_in_sse() -> None:
    good = encode_stream([{"type": "start"}, {"type": "finish"}])
    verify_ui_stream(good)
    with pytest.raises(UiStreamError, match="DONE"):
        verify_ui_stream(good[: -len(DONE)])


# -- the chat request body -------------------------------------------------------------------------


def test_parse_user_text() -> None:
    req = parse_chat_request({"id": "thread-1", "trigger": "submit-message", "messages": [
        {"id": "u0", "role": "user", "parts": [{"type": "text", "text": "earlier"}]},
        {"id": "a0", "role": "assistant", "parts": [{"type": "text", "text": "reply"}]},
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]},
    ]})
    assert req.thread_id == "thread-1" and req.trigger == "submit-message"
    assert req.message == {"role": "user", "content": "hello there", "id": "u1"} and req.decisions == []
    legacy = parse_chat_request({"id": "thread-1", "runId": "run-1", "messages": [{"id": "u1", "role": "user", "content": "hi"}]})
    assert legacy.message == {"role": "user", "content": "hi", "id": "u1"} and legacy.run_id == "run-1"


def test_parse_approval_responses() -> None:
    req = parse_chat_request({"id": "thread-1", "runId": "run-1", "messages": [{"role": "assistant", "parts": [
        {"type": "tool-approval-response", "approvalId": "call_1", "approved": True},
        {"type": "tool-approval-response", "approvalId": "call_2", "approved": False, "reason": "too risky"},
        {"type": "dynamic-tool", "toolName": "f", "toolCallId": "call_3", "state": "approval-responded",
         "input": {}, "approval": {"id": "call_3", "approved": True, "reason": "ok"}},
        {"type": "tool-g", "toolCallId": "call_4", "state": "output-available", "input": {}, "output": 1},
        {"type": "text", "text": "ignored"},
    ]}]})
    assert req.message is None
    by = {d["target_id"]: d for d in req.decisions}
    assert set(by) == {"call_1", "call_2", "call_3"}
    assert (by["call_1"]["action"], by["call_1"]["result"]) == ("resume", {"approved": True})
    assert (by["call_2"]["action"], by["call_2"]["reason"]) == ("cancel", "too risky")
    assert by["call_3"]["result"] == {"approved": True, "reason": "ok"}
    again = parse_chat_request({"id": "thread-1", "messages": [{"role": "assistant", "parts": [
        {"type": "tool-approval-response", "approvalId": "call_1", "approved": True}]}]})
    assert again.decisions[0]["decision_id"] == by["call_1"]["decision_id"]  # idempotent retries
    assert check_approvals(again, ["call_1", "call_9"]) == again.decisions  # partial is fine here
    with pytest.raises(UnknownInterrupt):
        check_approvals(again, ["call_9"])


def test_parse_regenerate() -> None:
    req = parse_chat_request({"id": "t", "trigger": "regenerate-message", "messageId": "m1", "messages": []})
    assert (req.trigger, req.message_id, req.message) == ("regenerate-message", "m1", None)


@pytest.mark.parametrize("bad, field", [
    ("nope", None),
    ({"sessionId": "t1", "input": "hi"}, None),
    ({"messages": []}, "id"),
    ({"id": "", "messages": []}, "id"),
    ({"id": "a b", "messages": []}, "id"),
    ({"id": "t", "messages": []}, "messages"),
    ({"id": "t", "messages": {}}, "messages"),
    ({"id": "t", "messages": [{"role": "robot", "parts": []}]}, "messages[0].role"),
    ({"id": "t", "messages": [{"role": "user", "parts": [{"type": "file", "mediaType": "a/b"}]}]},
     "messages[0].parts[0]"),  # a file part without its url
    ({"id": "t", "trigger": "regenerate-message", "messages": []}, "messageId"),
    ({"id": "t", "trigger": "reload", "messages": []}, "trigger"),
    ({"id": "t", "runId": "r r", "messages": []}, "runId"),
    ({"id": "t", "messages": [{"role": "assistant", "parts": [
        {"type": "tool-approval-response", "approvalId": "c", "approved": "yes"}]}]}, "messages[0].parts[0]"),
    ({"id": "t", "messages": [{"role": "assistant", "parts": [
        {"type": "tool-approval-response", "approvalId": "c", "approved": True},
        {"type": "tool-approval-response", "approvalId": "c", "approved": False}]}]}, "messages[0].parts[1]"),
])
def test_parse_rejects(bad: Any, field: str | None) -> None:
    with pytest.raises(AdapterInputError) as info:
        parse_chat_request(bad)
    if field:
        assert info.value.field == field


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
part_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "file", "tool-approval-response", "tool-x", "dynamic-tool", "data-x"])},
    optional={"text": json_values, "approvalId": json_values, "approved": json_values, "reason": json_values,
              "toolCallId": json_values, "state": st.sampled_from(["approval-responded", "output-denied", "x"]),
              "approval": st.fixed_dictionaries({}, optional={"id": json_values, "approved": json_values,
                                                              "reason": json_values})})
body_like = st.fixed_dictionaries(
    {"id": st.one_of(st.just("t1"), json_values)},
    optional={"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "x"])},
        optional={"id": json_values, "parts": st.lists(part_like, max_size=3) | json_values,
                  "content": json_values}), max_size=3) | json_values,
        "trigger": st.sampled_from(["submit-message", "regenerate-message"]) | json_values,
        "messageId": json_values, "runId": json_values})


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, body_like))
def test_parser_never_crashes(value: Any) -> None:
    try:
        req = parse_chat_request(value)
    except AdapterInputError as exc:
        assert str(exc)
        return
    assert req.message is not None or req.decisions or req.trigger == "regenerate-message"
    try:
        check_approvals(req, ["call_0_0"])
    except ResumeError:
        pass
