"""AG-UI adapter on REAL recorded runs (real nats-server + JetStream store): every stream passes
the shared verifier, a few have their exact event sequence pinned; parser, resume validation
and the verifier itself are tested pure, and the parser is fuzzed with hypothesis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ag_ui import core as ag
from ag_ui.encoder import EventEncoder
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    RunFinished,
    RunSuspended,
    StepFinished,
    StepStarted,
    SuspendTicket,
    Termination,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.gateway.adapters.agui.translator import (
    AguiTranslator,
    check_resume,
    open_interrupts,
    parse_run_input,
    to_agui_messages,
    translate,
)
from agentlog.gateway.adapters.common import (
    AdapterInputError,
    DuplicateResume,
    MissingResume,
    ResumeError,
    UnknownInterrupt,
)
from agentlog.runtime import PermissionPlugin
from agentlog.runtime.models import ModelRequestRejected, Turn

from tests.support.adapters import Recorded, record, store  # noqa: F401  (fixture)
from tests.support.protocol_verify.agui import AguiStreamError, event_types, parse_sse, verify_agui_stream

asyncio_mark = pytest.mark.asyncio


def stream(rec: Recorded, **kw: Any) -> list[Any]:
    """Translate, encode with the official encoder, decode and verify: what a client receives."""
    r = rec.result
    events = translate(r.thread_id, r.run_id, rec.items, state=rec.state_before,
                       messages=rec.messages_before, **kw)
    wire = "".join(EventEncoder().encode(e) for e in events)
    return verify_agui_stream(parse_sse(wire))


# -- recorded runs -------------------------------------------------------------------------------


@asyncio_mark
async def test_plain_text_exact_sequence(store: Any) -> None:
    rec = await record(store, ["Hello there, friend!"])
    events = stream(rec)
    assert event_types(events) == [
        "RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "STEP_FINISHED", "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]
    assistant = [e.event.message for e in rec.committed
                 if type(e.event) is MessageAppended and e.event.message.role == "assistant"][0]
    assert events[3].message_id == assistant.id and events[3].role == "assistant"
    assert events[4].delta == "Hello there, friend!"
    assert events[0].thread_id == rec.result.thread_id and events[0].run_id == rec.result.run_id
    assert [m.role for m in events[-2].messages] == ["user", "assistant"]
    done = events[-1]
    assert done.outcome.type == "success" and done.usage[0].total_tokens > 0


@asyncio_mark
async def test_plain_text_from_live_deltas(store: Any) -> None:
    rec = await record(store, ["one two three four five"], live=True, chunk_words=1)
    events = stream(rec)
    contents = [e for e in events if e.type == ag.EventType.TEXT_MESSAGE_CONTENT]
    assert len(contents) == 5 and "".join(c.delta for c in contents) == "one two three four five"
    assert len({c.message_id for c in contents}) == 1
    # the final snapshot carries the log's message id
    committed = [e.event.message.id for e in rec.committed
                 if type(e.event) is MessageAppended and e.event.message.role == "assistant"]
    assert events[-2].messages[-1].id == committed[0]


@asyncio_mark
async def test_live_text_catches_up_on_dropped_deltas(store: Any) -> None:
    rec = await record(store, ["alpha beta gamma delta"], live=True, chunk_words=1)
    dropped = [i for i in rec.items if not (isinstance(i, dict) and i.get("text") in ("gamma ", "delta"))]
    r = rec.result
    events = verify_agui_stream(translate(r.thread_id, r.run_id, dropped, state={}))
    text = "".join(e.delta for e in events if e.type == ag.EventType.TEXT_MESSAGE_CONTENT)
    assert text == "alpha beta gamma delta"


@asyncio_mark
async def test_tool_run_with_state_exact_sequence(store: Any) -> None:
    rec = await record(store, [Turn.tool("add", {"a": 1, "b": 2}), "The sum is 3."],
                       tool_execution_mode="sequential")
    events = stream(rec)
    assert event_types(events) == [
        "RUN_STARTED", "STATE_SNAPSHOT",
        "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
        "STATE_DELTA", "TOOL_CALL_RESULT", "STEP_FINISHED",
        "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "STEP_FINISHED",
        "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]
    start, args = events[3], events[4]
    assert (start.tool_call_id, start.tool_call_name) == ("call_0_0", "add")
    assert json.loads(args.delta) == {"a": 1, "b": 2}
    assert start.parent_message_id == events[-2].messages[1].id
    assert [op.model_dump(by_alias=True) for op in events[6].delta] == [{"op": "add", "path": "/last_sum", "value": 3}]
    assert (events[7].tool_call_id, events[7].content) == ("call_0_0", "3")
    snapshot = events[-2].messages
    assert [m.role for m in snapshot] == ["user", "assistant", "tool", "assistant"]
    assert snapshot[1].tool_calls[0].function.name == "add"
    assert [e.step_name for e in events if e.type == ag.EventType.STEP_STARTED] == ["step-1", "step-2"]


@pytest.mark.parametrize("mode", ["parallel_streaming", "parallel_batch_approval"])
@asyncio_mark
async def test_parallel_tools(store: Any, mode: str) -> None:
    rec = await record(store, [Turn.tools(("echo", {"text": "a"}), ("echo", {"text": "b"}), ("broken", {})), "ok"],
                       tool_execution_mode=mode, live=True)
    events = stream(rec)
    results = {e.tool_call_id: e.content for e in events if e.type == ag.EventType.TOOL_CALL_RESULT}
    assert set(results) == {"call_0_0", "call_0_1", "call_0_2"}
    assert results["call_0_0"] == "a" and results["call_0_1"] == "b"
    assert "disk is on fire" in results["call_0_2"]
    starts = [e.tool_call_id for e in events if e.type == ag.EventType.TOOL_CALL_START]
    assert starts == ["call_0_0", "call_0_1", "call_0_2"]


@asyncio_mark
async def test_state_across_runs_applies_on_the_snapshot(store: Any) -> None:
    first = await record(store, [Turn.tool("add", {"a": 1, "b": 2}), "3"], prefix="a")
    second = await record(store, [Turn.tool("add", {"a": 5, "b": 5}), "10"], prefix="b",
                          thread_id=first.result.thread_id, rt=None)
    assert second.state_before == {"last_sum": 3}
    events = stream(second)
    assert events[1].type == ag.EventType.STATE_SNAPSHOT and events[1].snapshot == {"last_sum": 3}
    deltas = [e for e in events if e.type == ag.EventType.STATE_DELTA]
    import jsonpatch
    state = events[1].snapshot
    for d in deltas:
        state = jsonpatch.apply_patch(state, [op.model_dump(by_alias=True) for op in d.delta])
    assert len(deltas) == 1 and state == {"last_sum": 10}
    assert len(events[-2].messages) == 8  # two runs of user, assistant, tool, assistant


@asyncio_mark
async def test_error_termination_is_run_error(store: Any) -> None:
    rec = await record(store, [Turn.fail(ModelRequestRejected("bad api key"))])
    events = stream(rec)
    assert event_types(events) == ["RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED", "STEP_FINISHED", "RUN_ERROR"]
    assert events[-1].code == "model_request_rejected" and "bad api key" in events[-1].message


@asyncio_mark
async def test_suspended_run_ends_with_interrupt_exact_sequence(store: Any) -> None:
    rec = await record(store, [Turn.tool("approve_me", {"what": "the deploy"})])
    assert rec.result.status == "waiting"
    events = stream(rec)
    assert event_types(events) == [
        "RUN_STARTED", "STATE_SNAPSHOT", "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
        "STEP_FINISHED", "STATE_SNAPSHOT", "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]
    wire = json.loads(events[-1].model_dump_json(by_alias=True))
    (interrupt,) = wire["outcome"]["interrupts"]
    assert wire["outcome"]["type"] == "interrupt"
    assert interrupt["id"] == "call_0_0" and interrupt["reason"] == "tool_call"
    assert interrupt["toolCallId"] == "call_0_0" and interrupt["message"] == "approve the deploy?"
    assert interrupt["metadata"]["agentlog"]["ticketId"] == "ticket1"
    assert interrupt["metadata"]["agentlog"]["arguments"] == {"what": "the deploy"}
    # the route's check for the next AG-UI run: the run view's open interrupts are the same
    assert [i.id for i in open_interrupts(rec.result.run)] == ["call_0_0"]


@asyncio_mark
async def test_several_open_interrupts_with_reasons(store: Any) -> None:
    rec = await record(store, [Turn.tools(("approve_me", {"what": "x"}), ("ask_name", {}), ("echo", {"text": "z"}))],
                       tool_execution_mode="parallel_batch_approval")
    events = stream(rec)
    outcome = events[-1].outcome
    assert outcome.type == "interrupt"
    by_id = {i.id: i for i in outcome.interrupts}
    assert set(by_id) == {"call_0_0", "call_0_1"}
    assert by_id["call_0_0"].reason == "tool_call"
    assert by_id["call_0_1"].reason == "input_required"
    assert by_id["call_0_1"].response_schema == {"type": "object", "properties": {"name": {"type": "string"}}}
    results = [e.tool_call_id for e in events if e.type == ag.EventType.TOOL_CALL_RESULT]
    assert results == ["call_0_2"]


@asyncio_mark
async def test_permission_deny_and_progress_activity(store: Any) -> None:
    perm = PermissionPlugin(allow=["*"], deny=["broken"], default="deny")
    rec = await record(store, [Turn.tools(("slow_progress", {"n": 3}), ("broken", {})), "done"],
                       live=True, plugins=[perm], tool_execution_mode="sequential")
    events = stream(rec)
    activity = [e for e in events if e.type == ag.EventType.ACTIVITY_SNAPSHOT]
    assert [a.content["status"] for a in activity] == ["running", "running", "running", "done"]
    assert {a.message_id for a in activity} == {"tool_call:call_0_0"}
    assert activity[1].content["progress"] == 2 and activity[1].content["total"] == 3
    denied = [e for e in events if e.type == ag.EventType.TOOL_CALL_RESULT and e.tool_call_id == "call_0_1"]
    assert "permission denied" in denied[0].content


@asyncio_mark
async def test_echo_user_messages_for_replays(store: Any) -> None:
    rec = await record(store, ["hi back"], message="hello")
    events = stream(rec, echo_user_messages=True)
    starts = [(e.role) for e in events if e.type == ag.EventType.TEXT_MESSAGE_START]
    assert starts == ["user", "assistant"]


# -- pure translator cases -----------------------------------------------------------------------


def test_resumed_stream_emits_only_the_result_on_the_original_call() -> None:
    """A stream that follows decisions into a waiting run starts mid-run (new AG-UI run id)."""
    decision = ToolCallDecision(target_id="c1", decision_id="d1", action="resume", result={"ok": True})
    items = [
        ToolCallDecided(call_id="c1", decision=decision),
        ToolCallCompleted(call_id="c1", outcome="succeeded", result="deployed", message_id="m3"),
        MessageAppended(message=Message(id="m3", role="tool", content="deployed", tool_call_id="c1")),
        StepStarted(step=2),
        MessageAppended(message=Message(id="m4", role="assistant", content="Deployed.")),
        StepFinished(step=2),
    ]
    from agentlog.eventlog.events import RunFinished, Termination
    items.append(RunFinished(termination=Termination(type="natural_end")))
    events = verify_agui_stream(translate("t1", "agui-run-2", items))
    assert event_types(events) == [
        "RUN_STARTED", "TOOL_CALL_RESULT", "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "STEP_FINISHED", "MESSAGES_SNAPSHOT", "RUN_FINISHED",
    ]
    assert events[0].run_id == "agui-run-2" and events[1].tool_call_id == "c1"


def _step_with_call(step: int, mid: str, call: str) -> list[Any]:
    return [StepStarted(step=step), MessageAppended(message=Message(
        id=mid, role="assistant", content="Adding.", tool_calls=[ToolCall(id=call, name="add", arguments={"a": 1})]))]


def _result(call: str, mid: str) -> list[Any]:
    return [ToolCallCompleted(call_id=call, outcome="succeeded", result=1, message_id=mid),
            MessageAppended(message=Message(id=mid, role="tool", content="1", tool_call_id=call))]


def _wire_ids(out: list[Any], *types: str) -> list[str]:
    """The message / tool call ids of the events of `types`, in order."""
    wire = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in out]
    return [e.get("messageId") if e["type"].startswith("TEXT") else e.get("toolCallId") for e in wire
            if e["type"] in types]


def test_a_call_and_a_text_are_started_once_whichever_way_they_come() -> None:
    """A step's commit after the NEXT step's deltas (a live link far ahead, unmerged) does not
    start its text or tool call again: both are known by id. The next step's text waits for
    the call's result."""
    tr = AguiTranslator("t1", "r1")
    out = tr.feed({"type": "text_delta", "step": 1, "text": "Add", "message_id": "m1"})
    out += tr.feed({"type": "tool_call_delta", "step": 1, "index": 0, "message_id": "m1", "call_id": "c1",
                    "name": "add", "arguments_delta": '{"a": 1}'})
    out += tr.feed({"type": "text_delta", "step": 2, "text": "Done", "message_id": "m2"})
    for ev in _step_with_call(1, "m1", "c1"):
        out += tr.feed(ev)
    out += tr.feed(MessageAppended(message=Message(id="m1", role="assistant", content="Adding.")))
    for ev in _result("c1", "m1r"):
        out += tr.feed(ev)
    assert _wire_ids(out, "TEXT_MESSAGE_START", "TOOL_CALL_START", "TOOL_CALL_RESULT") == ["m1", "c1", "c1", "m2"]


@settings(max_examples=30)
@given(st.booleans(), st.booleans(), st.integers(min_value=1, max_value=3))
def test_a_result_comes_before_the_next_steps_text_however_far_the_live_link_is_ahead(
        ahead: bool, streamed: bool, words: int) -> None:
    """The next step's deltas arrive before the commit of step 1's result (`ahead`: the live
    link outruns the log, and the step-end commit is pipelined, so the deltas after it cannot
    name its seq for `Merge` to wait for; they do follow step 1's inference commit): the result
    still comes before step 2's text, which is complete and started once, whether step 1
    streamed live or not."""
    step1: list[Any] = [{"type": "text_delta", "step": 1, "text": "Adding.", "message_id": "m1"},
                        {"type": "tool_call_delta", "step": 1, "index": 0, "message_id": "m1", "call_id": "c1",
                         "name": "add", "arguments_delta": '{"a": 1}'}] if streamed else []
    commits: list[list[Any]] = [_step_with_call(1, "m1", "c1"), [*_result("c1", "m1r"), StepFinished(step=1)]]
    text = ["The ", "sum ", "is 1."][:words]
    step2 = [{"type": "text_delta", "step": 2, "text": w, "message_id": "m2"} for w in text]
    cut = len(commits) - int(ahead)
    items = [*step1, *(e for c in commits[:cut] for e in c), *step2, *(e for c in commits[cut:] for e in c),
             StepStarted(step=2),
             MessageAppended(message=Message(id="m2", role="assistant", content="".join(text))),
             StepFinished(step=2), RunFinished(termination=Termination(type="natural_end"))]
    events = verify_agui_stream(translate("t1", "r1", items))
    order = _wire_ids(events, "TOOL_CALL_RESULT", "TEXT_MESSAGE_START")
    assert order.index("c1") < order.index("m2") and order.count("m2") == 1, order
    assert "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT" and e.message_id == "m2") == \
        "".join(text)


def test_a_replay_leaves_out_what_the_request_already_holds() -> None:
    """A retried resume from a client that saw the first answer: the tool result and the text
    it holds are not sent again (the official client would append them under the same ids);
    the snapshot still carries them."""
    held = ag.RunAgentInput.model_validate({
        "threadId": "t1", "runId": "r9", "state": {}, "tools": [], "context": [], "forwardedProps": {},
        "messages": [{"id": "m3", "role": "tool", "content": "deployed", "toolCallId": "c1"},
                     {"id": "m4", "role": "assistant", "content": "Deployed."}]})
    items = [ToolCallCompleted(call_id="c1", outcome="succeeded", result="deployed", message_id="m3"),
             MessageAppended(message=Message(id="m3", role="tool", content="deployed", tool_call_id="c1")),
             StepStarted(step=2), MessageAppended(message=Message(id="m4", role="assistant", content="Deployed.")),
             MessageAppended(message=Message(id="m5", role="assistant", content="And more."))]
    from agentlog.eventlog.events import RunFinished, Termination
    items.append(RunFinished(termination=Termination(type="natural_end")))
    events = verify_agui_stream(translate("t1", "r9", items, input=held))
    assert [e.message_id for e in events if e.type == "TEXT_MESSAGE_START"] == ["m5"]
    assert not any(e.type == "TOOL_CALL_RESULT" for e in events)
    snapshot = next(e for e in events if e.type == "MESSAGES_SNAPSHOT")
    assert [m.id for m in snapshot.messages] == ["m3", "m4", "m5"]


def test_source_ending_early_closes_and_errors() -> None:
    tr = AguiTranslator("t1", "r1")
    out = tr.feed({"type": "text_delta", "step": 1, "text": "partial"})
    out += tr.finish()
    events = verify_agui_stream(out)
    assert event_types(events)[-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_ERROR"]
    assert events[-1].code == "incomplete"
    assert tr.feed(StepStarted(step=2)) == [] and tr.finish() == []


def test_messages_encoder() -> None:
    msgs = [
        Message(id="u", role="user", content="hi"),
        Message(id="s", role="system", content="ctx", visibility="internal"),
        Message(id="a", role="assistant", content="", tool_calls=[ToolCall(id="c", name="f", arguments={"x": [1]})]),
        Message(id="t", role="tool", content="ok", tool_call_id="c"),
    ]
    out = [m.model_dump(by_alias=True) for m in to_agui_messages(msgs)]
    assert out == [
        {"id": "u", "role": "user", "content": "hi"},
        {"id": "a", "role": "assistant",
         "toolCalls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x":[1]}'}}]},
        {"id": "t", "role": "tool", "content": "ok", "toolCallId": "c"},
    ]


def test_interrupt_for_a_call_without_a_seen_ticket() -> None:
    tr = AguiTranslator("t", "r")
    out = tr.feed(ToolCallStarted(call_id="c9", name="f")) + tr.feed(
        ToolCallSuspended(call_id="c8", ticket=SuspendTicket(id="k", action="review"))) + tr.feed(
        RunSuspended(call_ids=["c8", "c9"]))
    events = verify_agui_stream(out)
    reasons = {i.id: i.reason for i in events[-1].outcome.interrupts}
    assert reasons == {"c8": "agentlog:review", "c9": "tool_call"}


# -- the verifier rejects broken streams ----------------------------------------------------------


START = {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
END = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}


@pytest.mark.parametrize("events, rule", [
    ([{"type": "STEP_STARTED", "stepName": "s"}], "first event"),
    ([START, {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"}, END], "not open"),
    ([START, {"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "{}"}, END], "not open"),
    ([START, {"type": "STEP_STARTED", "stepName": "s"}, END], "open messages"),
    ([START, {"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f"}, END], "open messages"),
    ([START, END, {"type": "RUN_STARTED", "threadId": "t", "runId": "r2"}], "nothing may follow"),
    ([START, {"type": "RUN_ERROR", "message": "x"}, END], "nothing may follow"),
    ([START, {"type": "STEP_FINISHED", "stepName": "s"}, END], "was not started"),
    ([START, {**END, "outcome": {"type": "interrupt", "interrupts": [{"id": "i", "reason": "tool_call"}]}}],
     "STATE_SNAPSHOT"),
    ([START, {"type": "STATE_SNAPSHOT", "snapshot": {}}, {"type": "MESSAGES_SNAPSHOT", "messages": []},
      {**END, "outcome": {"type": "interrupt", "interrupts": [{"id": "i", "reason": "tool_call"}]}}], "toolCallId"),
    ([START, {**END, "outcome": {"type": "interrupt", "interrupts": []}}], "validate"),
    ([START, {"type": "TEXT_MESSAGE_START", "messageId": "m", "bogus": 1}], "unknown field"),
    ([START, {"type": "STATE_SNAPSHOT", "snapshot": {}},
      {"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/nope"}]}, END], "does not apply"),
    ([START, {**END, "runId": "other"}], "differ"),
    ([START], "ends without"),
])
def test_verifier_rejects(events: list[dict[str, Any]], rule: str) -> None:
    with pytest.raises(AguiStreamError, match=rule):
        verify_agui_stream(events)


# -- RunAgentInput parsing and resume validation --------------------------------------------------


def body(**kw: Any) -> dict[str, Any]:
    return {"threadId": "t1", "runId": "r2", "messages": [], **kw}


def test_parse_run_input() -> None:
    req = parse_run_input(body(
        messages=[
            {"id": "m1", "role": "user", "content": "old"},
            {"id": "m2", "role": "assistant", "content": "reply"},
            {"id": "m3", "role": "user", "content": "new one"},
            {"id": "bad id!", "role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        tools=[{"name": "confirm", "description": "Ask the user", "parameters": {"type": "object", "properties": {}}}],
        context=[{"description": "page", "value": "/home"}],
        state={"x": 1}, forwardedProps={"debug": True}, parentRunId="r1",
        resume=[{"interruptId": "call_0_0", "status": "resolved", "payload": {"approved": True}},
                {"interruptId": "call_0_1", "status": "cancelled"}],
    ))
    assert (req.thread_id, req.run_id, req.parent_run_id) == ("t1", "r2", "r1")
    assert req.messages == [{"role": "user", "content": "new one", "id": "m3"}, {"role": "user", "content": "ab"}]
    assert [t.name for t in req.tools] == ["confirm"] and req.tools[0].description == "Ask the user"
    assert req.context == [("page", "/home")] and req.state == {"x": 1}
    assert req.forwarded_props == {"debug": True}
    d0, d1 = req.decisions
    assert (d0["target_id"], d0["action"], d0["result"]) == ("call_0_0", "resume", {"approved": True})
    assert (d1["target_id"], d1["action"], d1["result"]) == ("call_0_1", "cancel", None)
    # idempotent: the same resume gives the same decision ids
    assert parse_run_input(body(resume=[{"interruptId": "call_0_0", "status": "resolved",
                                         "payload": {"approved": True}}])).decisions[0] == d0
    assert d0["decision_id"] != d1["decision_id"]


def test_parse_known_ids_and_tool_results() -> None:
    req = parse_run_input(body(messages=[
        {"id": "m1", "role": "user", "content": "q"},
        {"id": "m2", "role": "assistant", "toolCalls": [
            {"id": "c1", "type": "function", "function": {"name": "confirm", "arguments": "{}"}}]},
        {"id": "m3", "role": "tool", "content": "yes", "toolCallId": "c1"},
    ]))
    assert req.messages == [] and req.tool_results == [
        {"tool_call_id": "c1", "message_id": "m3", "content": "yes", "error": None}]
    req = parse_run_input(body(messages=[{"id": "m1", "role": "user", "content": "q"},
                                         {"id": "m2", "role": "assistant", "content": "a"}]),
                          known_ids={"m2"})
    assert req.messages == [{"role": "user", "content": "q", "id": "m1"}]


@pytest.mark.parametrize("bad, field", [
    ([], None),
    ({"runId": "r"}, "threadId"),
    (body(threadId="has space"), "threadId"),
    (body(runId=""), "runId"),
    (body(messages="nope"), "messages"),
    (body(messages=[{"id": "m", "role": "wizard", "content": "x"}]), "messages[0]"),
    (body(messages=[{"id": "m", "role": "user", "content": [{"type": "image", "source": {
        "type": "file", "value": "file-abc"}}]}]), "messages[0].content[0].source"),  # a provider's handle
    (body(resume=[{"interruptId": "c", "status": "maybe"}]), "resume[0].status"),
    (body(resume=[{"interruptId": "a.b", "status": "resolved"}]), "resume[0].interruptId"),
    (body(tools=[{"name": "a", "description": ""}, {"name": "a", "description": ""}]), "tools"),
])
def test_parse_run_input_rejects(bad: Any, field: str | None) -> None:
    with pytest.raises(AdapterInputError) as info:
        parse_run_input(bad)
    assert info.value.code == "invalid_input"
    if field:
        assert info.value.field is not None and info.value.field.startswith(field), info.value.field


def test_check_resume_against_open_interrupts() -> None:
    req = parse_run_input(body(resume=[{"interruptId": "c1", "status": "resolved", "payload": 1}]))
    assert check_resume(req, ["c1"]) == req.decisions
    with pytest.raises(MissingResume, match="c2") as info:
        check_resume(req, ["c1", "c2"])
    assert info.value.ids == ["c2"]
    with pytest.raises(UnknownInterrupt, match="c1"):
        check_resume(req, ["c9"])
    with pytest.raises(UnknownInterrupt):
        check_resume(req, [])
    with pytest.raises(MissingResume):  # a waiting run refuses plain new input
        check_resume(parse_run_input(body(messages=[{"id": "m", "role": "user", "content": "hi"}])), ["c1"])
    two = parse_run_input(body(resume=[{"interruptId": "c1", "status": "resolved"},
                                       {"interruptId": "c1", "status": "cancelled"}]))
    with pytest.raises(DuplicateResume):
        check_resume(two, ["c1"])
    assert check_resume([], []) == []


@asyncio_mark
async def test_check_resume_against_a_real_waiting_run(store: Any) -> None:
    rec = await record(store, [Turn.tools(("approve_me", {"what": "x"}), ("ask_name", {}))],
                       tool_execution_mode="parallel_batch_approval")
    ok = parse_run_input(body(resume=[{"interruptId": "call_0_0", "status": "resolved"},
                                      {"interruptId": "call_0_1", "status": "resolved", "payload": {"name": "Ann"}}]))
    assert len(check_resume(ok, rec.result.run)) == 2
    with pytest.raises(MissingResume):
        check_resume(parse_run_input(body(resume=[{"interruptId": "call_0_0", "status": "resolved"}])), rec.result.run)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(["threadId", "runId", "messages", "tools", "context", "state", "resume",
                               "forwardedProps", "parentRunId", "id", "role", "content", "interruptId", "status"])
message_like = st.fixed_dictionaries(
    {"id": st.text(max_size=6), "role": st.sampled_from(["user", "assistant", "tool", "system", "x"])},
    optional={"content": json_values, "toolCallId": json_values, "toolCalls": json_values})
input_like = st.fixed_dictionaries(
    {"threadId": st.one_of(st.just("t1"), json_values), "runId": st.one_of(st.just("r1"), json_values)},
    optional={"messages": st.lists(message_like, max_size=3) | json_values,
              "resume": st.lists(st.dictionaries(field_names, json_values, max_size=4), max_size=3) | json_values,
              "tools": json_values, "state": json_values})


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.dictionaries(field_names, json_values, max_size=6), input_like))
def test_parser_never_crashes(value: Any) -> None:
    try:
        req = parse_run_input(value)
    except AdapterInputError as exc:
        assert str(exc)
        return
    try:
        check_resume(req, ["call_0_0"])
    except ResumeError:
        pass


def test_dropped_argument_deltas_are_completed_in_the_providers_json_spelling() -> None:
    """A provider streams arguments as `json.dumps` spells them ('{"a": 1, ...'); when the rest of
    its deltas were dropped, the commit completes the call in that spelling, so the client's
    arguments parse to the committed ones without waiting for a snapshot."""
    tr = AguiTranslator("t", "r")
    out = tr.feed({"type": "tool_call_delta", "step": 1, "index": 0, "call_id": "c1", "name": "add",
                   "message_id": "m1", "arguments_delta": '{"a": 1, '})
    out += tr.feed(MessageAppended(message=Message(id="m1", role="assistant",
                                                   tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})])))
    args = "".join(e.delta for e in out if e.type == ag.EventType.TOOL_CALL_ARGS)
    assert json.loads(args) == {"a": 1, "b": 2}
