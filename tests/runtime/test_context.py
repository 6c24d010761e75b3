"""Context management (agentlog.runtime.context_policy): pure properties of estimate / units / fit / plan_summary,
and on a real nats-server: a summary recorded as `ContextCompacted`, used by the next request,
by a cold resume in a fresh Runtime (no second summary), and by verified replay."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.eventlog.events import ContextCompacted, Message, ToolCall
from agentlog.runtime import AgentSpec, App, DeterministicEntropy, PermissionPlugin, Runtime, tool
from agentlog.runtime.context_policy import (
    SUMMARY_MESSAGE_ID,
    ContextPolicy,
    estimate_tokens,
    fit,
    plan_summary,
    units,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import verify_run

from tests.support.runtime import events_of, logged, store  # noqa: F401  (fixture)

# -- pure ------------------------------------------------------------------------------------------


@st.composite
def conversations(draw: Any) -> list[Message]:
    """user / plain assistant messages and assistant tool-call rounds with all their results."""
    out: list[Message] = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "tools"]))
        text = "w" * draw(st.integers(0, 300))
        if kind != "tools":
            out.append(Message(id=f"m{i}", role=kind, content=text))
            continue
        n = draw(st.integers(1, 3))
        calls = [ToolCall(id=f"c{i}_{k}", name="t", arguments={"k": k}) for k in range(n)]
        out.append(Message(id=f"m{i}", role="assistant", content="", tool_calls=calls))
        out += [Message(id=f"m{i}_{k}", role="tool", content=text, tool_call_id=c.id) for k, c in enumerate(calls)]
    return out


def _pairs_intact(messages: list[Message]) -> bool:
    calls = {c.id for m in messages for c in m.tool_calls or ()}
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    return calls == results


@given(conversations(), st.integers(1, 400), st.none() | st.integers(8, 60))
def test_fit_never_splits_a_call_from_its_result(messages: list[Message], budget: int, shrink: int | None) -> None:
    policy = ContextPolicy(max_tokens=budget, max_tool_result_tokens=shrink)
    out = fit(policy, messages)
    assert _pairs_intact(out)
    ids = [m.id for m in out]
    assert ids == [m.id for m in messages][len(messages) - len(out):]  # a suffix: the newest kept
    assert out and out[-1].id == messages[-1].id  # the newest unit always stays
    if len(units(out)) > 1:
        assert estimate_tokens(out, policy.chars_per_token) <= budget
    if shrink is not None:
        assert all(len(m.content) <= shrink * 4 + 60 for m in out if m.role == "tool")


@given(conversations())
def test_units_partition_the_conversation(messages: list[Message]) -> None:
    parts = units(messages)
    assert [m for u in parts for m in u] == messages
    assert all(_pairs_intact(u) for u in parts)


@given(conversations(), st.integers(20, 300))
def test_plan_summary_takes_whole_units_from_the_front(messages: list[Message], budget: int) -> None:
    policy = ContextPolicy(max_tokens=budget, summarize=True)
    older = plan_summary(policy, messages)
    if estimate_tokens(messages) <= budget:
        assert older is None
    if older is not None:
        assert older == messages[: len(older)] and len(older) < len(messages)
        assert _pairs_intact(older) and _pairs_intact(messages[len(older):])
        compaction = ContextCompacted(summary="s", upto_message_id=older[-1].id)
        seen = fit(None, messages, compaction)
        assert seen[0].id == SUMMARY_MESSAGE_ID and seen[1:] == messages[len(older):]


def test_a_long_tool_result_is_shrunk_head_and_tail() -> None:
    long = "a" * 500 + "z" * 500
    msgs = [Message(id="u", role="user", content=long),
            Message(id="t", role="tool", content=long, tool_call_id="c")]
    out = fit(ContextPolicy(max_tool_result_tokens=20), msgs)
    assert out[0].content == long  # only tool results shrink
    assert out[1].content.startswith("a") and out[1].content.endswith("z") and "characters omitted" in out[1].content
    with pytest.raises(ValueError, match="summarize needs"):
        ContextPolicy(summarize=True)


# -- on the log ------------------------------------------------------------------------------------

POLICY = ContextPolicy(max_tokens=200, summarize=True, summary_model="summarizer", max_tool_result_tokens=100)


@tool
def blob() -> str:
    """A tool with a long result."""
    return "b" * 1000


@tool
def deploy() -> str:
    """Guarded by a permission ask."""
    return "deployed"


def spec(model: Any) -> AgentSpec:
    return AgentSpec(id="agent", model=model, system_prompt="sys", tools=["blob", "deploy"], context=POLICY,
                     plugins=[PermissionPlugin(ask=["deploy"])], max_rounds=8)


@pytest.mark.asyncio
async def test_summary_is_recorded_and_reused_by_resume_and_replay(store: Any) -> None:
    model = ScriptedModel([Turn.tool("blob", {}), "ok", Turn.tool("deploy", {}), "done"])
    summarizer = ScriptedModel(["SUMMARY: the user said hi, blob returned b's"])
    rt = Runtime(store, agents=[spec(model)], tools=[blob, deploy], models={"summarizer": summarizer},
                 entropy=DeterministicEntropy())
    async with asyncio.timeout(30):
        first = await rt.run("agent", "hi")
        assert first.termination.type == "natural_end" and summarizer.calls == 0  # under budget
        # the first run's tool result reached the model shrunk
        assert "characters omitted" in model.requests[1].messages[-1].content
        second = await rt.run("agent", "please deploy " + "x" * 450, thread_id=first.thread_id)
        assert second.status == "waiting"
        log = await logged(rt, second)
    [compacted] = events_of(log, "ContextCompacted")
    assert summarizer.calls == 1 and compacted.summary.startswith("SUMMARY")
    assert compacted.tokens_after < compacted.tokens_before
    # the request after the summary: system prompt, summary, then only the new user message
    req = model.requests[2]
    assert [m.id for m in req.messages][:2] == ["system", SUMMARY_MESSAGE_ID]
    assert req.messages[2].content.startswith("please deploy")

    # a cold resume in a fresh Runtime (nothing in memory) folds the same compaction
    model2 = ScriptedModel(["done"])
    summarizer2 = ScriptedModel(["a second summary (must not be asked for)"])
    rt2 = Runtime(store, agents=[spec(model2)], tools=[blob, deploy], models={"summarizer": summarizer2})
    call_id = events_of(log, "ToolCallSuspended")[0].call_id
    async with asyncio.timeout(30):
        res = await rt2.decide(second.run_id, [{"target_id": call_id, "decision_id": "d1", "action": "resume",
                                                "result": {"approved": True}}])
        final = await res.handle.result()
    assert final.termination.type == "natural_end"
    assert summarizer2.calls == 0  # the summary came from the log
    assert [m.id for m in model2.requests[0].messages][:2] == ["system", SUMMARY_MESSAGE_ID]
    assert model2.requests[0].messages[1].content.endswith(compacted.summary)

    # verified replay answers the summary from the log and checks every request digest
    async with asyncio.timeout(30):
        report = await verify_run(store, second.run_id, App(agents=[spec(model)], tools=[blob, deploy]))
    assert report.ok, report.divergence
