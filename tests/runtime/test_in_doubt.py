"""In-doubt tool calls: a resumed run never runs an interrupted call of a tool declared
`idempotent=False` again on its own; it suspends it for a human (mark_done, retry, cancel).

The interruption is a process going away mid-call (`Runtime.abandon_runs`: the loop is fenced and
its task cancelled, nothing more is written), after the call's `ToolCallStarted` is committed:
the tool body is only entered once its start commit is in the store. A fresh `Runtime` (nothing
in memory) resumes the run from the log. Pure unit tests on the in-memory store; the deployed
paths are in tests/e2e/test_in_doubt_deployed.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    IN_DOUBT_ACTION,
    Message,
    MessageAppended,
    StoredCommit,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecision,
    ToolCallStarted,
)
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import App
from agentlog.runtime.loop.hitl import InvalidDecision
from agentlog.runtime.loop.in_doubt import IN_DOUBT_SCHEMA, in_doubt_calls, resolution
from agentlog.runtime.loop.run_context import RunContext, apply_event
from agentlog.runtime.replay.verify import verify_run

from tests.support.in_doubt import Payments, interrupted, resumed
from tests.support.runtime import events_of, thread_log

# -- the pure decision -------------------------------------------------------------------------


def test_in_doubt_decision_is_a_function_of_the_log_and_the_declarations() -> None:
    """Started, uncompleted calls: the non-idempotent one is in doubt, the idempotent one (and a
    call of a tool the agent no longer has) runs again; completed calls are neither."""
    app = Payments(mode="parallel_streaming")
    tools = {t.name: t for t in app.tools}
    ctx = RunContext(thread_id="t", run_id="r")
    calls = [ToolCall(id="c-pay", name="pay", arguments={"amount": 5}), ToolCall(id="c-look", name="lookup"),
             ToolCall(id="c-gone", name="gone")]
    apply_event(ctx, MessageAppended(message=Message(id="m", role="assistant", content="", tool_calls=calls)), 1, "r")
    for call in calls:
        apply_event(ctx, ToolCallStarted(call_id=call.id, name=call.name, arguments=call.arguments), 1, "r")
    assert in_doubt_calls(ctx, tools) == ["c-pay"]
    tools["lookup"].idempotent = False
    try:
        assert in_doubt_calls(ctx, tools) == ["c-pay", "c-look"]
    finally:
        tools["lookup"].idempotent = True
    apply_event(ctx, ToolCallCompleted(call_id="c-pay", outcome="succeeded"), 2, "r")
    assert in_doubt_calls(ctx, tools) == []


def test_in_doubt_resolution_reads_the_three_answers() -> None:
    def d(result: Any, action: str = "resume") -> ToolCallDecision:
        return ToolCallDecision(target_id="c", decision_id="d", action=action, result=result)  # type: ignore[arg-type]

    assert resolution(d({"action": "mark_done", "result": {"id": 7}})) == ("mark_done", {"id": 7})
    assert resolution(d({"action": "retry"})) == ("retry", None)
    assert resolution(d({"action": "cancel"})) == ("cancel", None)
    assert resolution(d(None, "cancel")) == ("cancel", None)


# -- resuming ------------------------------------------------------------------------------------


async def test_in_doubt_resume_suspends_the_call_instead_of_running_it_again() -> None:
    store = MemoryEventStore()
    first = await interrupted(store, thread="t1", run="r1")
    assert first.executions == [("pay", "c-pay")]
    second, rt, result = await resumed(store, "r1")
    assert second.executions == []  # never run again
    assert result.status == "waiting"
    log = await thread_log(store, "t1")
    suspended = events_of(log, "ToolCallSuspended")
    assert [s.call_id for s in suspended] == ["c-pay"]
    ticket = suspended[0].ticket
    assert ticket.action == IN_DOUBT_ACTION and ticket.response_schema == IN_DOUBT_SCHEMA
    assert ticket.parameters == {"tool": "pay", "arguments": {"amount": 5}}
    assert events_of(log, "RunSuspended")[-1].call_ids == ["c-pay"]
    view = await rt.run_view("r1")
    assert view.status == "waiting"
    assert view.calls["c-pay"].status == "suspended" and view.calls["c-pay"].in_doubt


async def test_in_doubt_idempotent_call_runs_again_with_its_call_id() -> None:
    """The default is unchanged: the interrupted idempotent call runs again (parallel round)
    while the non-idempotent one next to it goes in doubt."""
    store = MemoryEventStore()
    await interrupted(store, thread="t2", run="r2", mode="parallel_streaming")
    second, rt, result = await resumed(store, "r2", mode="parallel_streaming")
    assert second.executions == [("lookup", "c-look")]
    assert result.status == "waiting"
    view = await rt.run_view("r2")
    assert view.calls["c-look"].status == "succeeded"
    assert view.calls["c-pay"].in_doubt
    app = Payments(mode="parallel_streaming")
    report = await verify_run(store, "r2", App(agents=[app.spec], tools=app.tools))
    assert report.ok and report.commits_verified == report.commits_recorded


async def test_in_doubt_mark_done_records_the_result_and_the_run_goes_on() -> None:
    store = MemoryEventStore()
    await interrupted(store, thread="t3", run="r3")
    second, rt, _ = await resumed(store, "r3")
    res = await rt.decide("r3", [{"target_id": "c-pay", "decision_id": "done", "action": "resume",
                                  "result": {"action": "mark_done", "result": {"paid": 5, "ref": "x1"}}}])
    assert res.handle is not None
    result = await res.handle.result()
    assert result.status == "done" and second.executions == []
    call = (await rt.run_view("r3")).calls["c-pay"]
    assert call.status == "succeeded" and call.result == {"paid": 5, "ref": "x1"} and not call.in_doubt
    tool_msgs = [e.message.content for e in events_of(await thread_log(store, "t3"), "MessageAppended")
                 if e.message.role == "tool"]
    assert tool_msgs == ['{"paid":5,"ref":"x1"}']


async def test_in_doubt_retry_runs_it_again_once_with_the_same_call_id_and_first_decision() -> None:
    """A call resumed after an approval (pass_decision_to_tool) and interrupted: `retry` runs it
    again with the same call id and the approval it first ran with, not the retry answer."""
    store = MemoryEventStore()
    first = await interrupted(store, thread="t4", run="r4", ask=True)
    assert first.decisions == [{"approved": True}]
    second, rt, waiting = await resumed(store, "r4", ask=True)
    assert waiting.status == "waiting" and second.executions == []
    res = await rt.decide("r4", [{"target_id": "c-pay", "decision_id": "again", "action": "resume",
                                  "result": {"action": "retry"}}])
    assert res.handle is not None
    result = await res.handle.result()
    assert result.status == "done"
    assert second.executions == [("pay", "c-pay")] and second.decisions == [{"approved": True}]
    call = (await rt.run_view("r4")).calls["c-pay"]
    assert call.status == "succeeded" and call.result == {"paid": 5}


async def test_in_doubt_cancel_completes_the_call_cancelled_and_tells_the_model() -> None:
    store = MemoryEventStore()
    await interrupted(store, thread="t5", run="r5")
    second, rt, _ = await resumed(store, "r5")
    res = await rt.decide("r5", [{"target_id": "c-pay", "decision_id": "no", "action": "resume",
                                  "result": {"action": "cancel"}}])
    assert res.handle is not None
    assert (await res.handle.result()).status == "done"
    assert second.executions == []
    call = (await rt.run_view("r5")).calls["c-pay"]
    assert call.status == "cancelled"
    log = await thread_log(store, "t5")
    tool_msg = [e.message.content for e in events_of(log, "MessageAppended") if e.message.role == "tool"]
    assert len(tool_msg) == 1 and "unknown" in tool_msg[0]
    final = [e.message.content for e in events_of(log, "MessageAppended") if e.message.role == "assistant"][-1]
    assert final.startswith("told: Error: the call was cancelled by a human")


@pytest.mark.parametrize("answer", [{"action": "mark_done", "result": 1}, {"action": "retry"}, {"action": "cancel"}])
async def test_in_doubt_runs_replay_verified_whichever_way_they_were_resolved(answer: dict[str, Any]) -> None:
    store = MemoryEventStore()
    await interrupted(store, thread="t6", run="r6")
    second, rt, _ = await resumed(store, "r6")
    res = await rt.decide("r6", [{"target_id": "c-pay", "decision_id": "d", "action": "resume", "result": answer}])
    assert res.handle is not None
    assert (await res.handle.result()).status == "done"
    app = Payments()
    report = await verify_run(store, "r6", App(agents=[app.spec], tools=app.tools))
    assert report.ok and report.commits_verified == report.commits_recorded
    assert app.executions == []  # answered from the log


async def test_in_doubt_retry_interrupted_again_goes_in_doubt_again_and_replays() -> None:
    store = MemoryEventStore()
    await interrupted(store, thread="t7", run="r7")
    second, rt, _ = await resumed(store, "r7")
    second.hang = True
    res = await rt.decide("r7", [{"target_id": "c-pay", "decision_id": "again", "action": "resume",
                                  "result": {"action": "retry"}}])
    async with asyncio.timeout(10):
        await second.entered.wait()
    await asyncio.gather(*rt.abandon_runs(), return_exceptions=True)
    assert res.handle is not None
    third, rt3, waiting = await resumed(store, "r7")
    assert waiting.status == "waiting" and third.executions == []
    res = await rt3.decide("r7", [{"target_id": "c-pay", "decision_id": "done", "action": "resume",
                                   "result": {"action": "mark_done", "result": "ok"}}])
    assert res.handle is not None
    assert (await res.handle.result()).status == "done"
    tickets = [s.ticket.action for s in events_of(await thread_log(store, "t7"), "ToolCallSuspended")]
    assert tickets == [IN_DOUBT_ACTION, IN_DOUBT_ACTION]
    app = Payments()
    report = await verify_run(store, "r7", App(agents=[app.spec], tools=app.tools))
    assert report.ok and app.executions == []


# -- decisions that do not answer the ticket --------------------------------------------------------


def _in_doubt_log() -> list[StoredCommit]:
    """The log of run r8 waiting in doubt (built once, on a loop of its own)."""
    async def build() -> list[StoredCommit]:
        store = MemoryEventStore()
        await interrupted(store, thread="t8", run="r8")
        await resumed(store, "r8")
        return await thread_log(store, "t8")

    return asyncio.run(build())


_IN_DOUBT_LOG: list[list[StoredCommit]] = []


def _answers_ticket(result: Any) -> bool:
    return isinstance(result, dict) and (
        (set(result) == {"action", "result"} and result.get("action") == "mark_done")
        or (set(result) == {"action"} and result.get("action") in ("retry", "cancel")))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=6)
_near = st.fixed_dictionaries({"action": st.sampled_from(["mark_done", "retry", "cancel", "done", "", "RETRY"])},
                              optional={"result": _json, "reason": st.text(max_size=5)})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=st.one_of(_json, _near))
def test_in_doubt_a_decision_not_matching_the_ticket_never_changes_the_log(result: Any) -> None:
    """Any resume whose result does not match the ticket's schema is `invalid_decision` and
    appends nothing; the call stays in doubt. (Answers that match are the resolution tests'.)"""
    if _answers_ticket(result):
        return
    if not _IN_DOUBT_LOG:
        _IN_DOUBT_LOG.append(_in_doubt_log())
    before = _IN_DOUBT_LOG[0]

    async def check() -> None:
        store = MemoryEventStore()
        for sc in before:
            await store.append(sc.commit, None)
        rt = Payments().runtime(store)
        with pytest.raises(InvalidDecision) as raised:
            await rt.decide("r8", [{"target_id": "c-pay", "decision_id": "x", "action": "resume", "result": result}])
        assert raised.value.code == "invalid_decision"
        after = await thread_log(store, "t8")
        assert [sc.commit for sc in after] == [sc.commit for sc in before]
        assert (await rt.run_view("r8")).calls["c-pay"].in_doubt

    asyncio.run(check())
