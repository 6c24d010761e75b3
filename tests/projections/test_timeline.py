"""Pure tests of `agentlog.projections.timeline`: the replay report and event summaries from in-memory commits
(no server needed: the report is a function of the commits alone)."""

from __future__ import annotations

import pytest

from agentlog.eventlog.events import (
    Commit,
    Message,
    MessageAppended,
    Position,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StatePatched,
    StepFinished,
    StepStarted,
    StoredCommit,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.timeline import (
    InvalidEventId,
    UnknownRun,
    build_replay,
    event_summary,
    excerpt,
    parse_event_id,
)


def history() -> list[StoredCommit]:
    """A run that asks a human: gated `ask`, suspended, decided, resumed, completed."""
    commits = [
        Commit(commit_id="c1", thread_id="t", ts=1, events=[ThreadCreated()]),
        Commit(commit_id="c2", thread_id="t", run_id="r", ts=2, events=[
            RunStarted(run_id="r", agent_id="a"),
            MessageAppended(message=Message(id="m1", role="user", content="delete /tmp/x please")),
        ]),
        Commit(commit_id="c3", thread_id="t", run_id="r", ts=3, events=[
            StepStarted(step=1),
            MessageAppended(message=Message(id="m2", role="assistant",
                                            tool_calls=[ToolCall(id="k1", name="rm", arguments={"path": "/tmp/x"})])),
            ToolCallGated(call_id="k1", verdict="ask", rule="rm"),
            ToolCallSuspended(call_id="k1", ticket=SuspendTicket(id="tk1", message="Delete /tmp/x?")),
            RunSuspended(call_ids=["k1"]),
            StepFinished(step=1),
        ]),
        Commit(commit_id="c4", thread_id="t", run_id="r", ts=4, events=[
            ToolCallDecided(call_id="k1", decision=ToolCallDecision(
                target_id="k1", decision_id="d1", action="resume", result=True, reason="ok")),
            RunResumed(call_ids=["k1"]),
        ]),
        Commit(commit_id="c5", thread_id="t", run_id="r", ts=5, events=[
            StepStarted(step=2),
            ToolCallResuming(call_id="k1", mode="replay_tool_call"),
            ToolCallStarted(call_id="k1", name="rm", arguments={"path": "/tmp/x"}),
            ToolCallCompleted(call_id="k1", outcome="succeeded", result="deleted"),
            StatePatched(ops=[{"op": "add", "path": "/deleted", "value": ["/tmp/x"]}], scope="run"),
            StepFinished(step=2),
            RunFinished(termination=Termination(type="natural_end")),
        ]),
    ]
    return [StoredCommit(i + 1, c) for i, c in enumerate(commits)]


def test_hitl_run_groups_decisions_between_steps_and_diffs_run_state() -> None:
    report = build_replay("r", history()).to_json()
    assert [g["label"] for g in report["steps"]] == ["start", "step 1", "after step 1", "step 2", "after step 2"]
    between = report["steps"][2]
    assert [e["type"] for e in between["events"]] == ["ToolCallDecided", "RunResumed"]
    assert "rm decided resume: true reason=ok" in between["events"][0]["summary"]
    step1 = {e["type"]: e["summary"] for e in report["steps"][1]["events"]}
    assert step1["ToolCallGated"].startswith("rm gate=ask")
    assert "Delete /tmp/x?" in step1["ToolCallSuspended"]
    step2 = report["steps"][3]
    assert step2["state_diff"] == [{"op": "add", "path": "/run/deleted", "value": ["/tmp/x"]}]
    assert [e["type"] for e in report["steps"][4]["events"]] == ["RunFinished"]
    assert report["status"] == "done" and report["termination"] == {"type": "natural_end"}


def test_to_inside_a_wait_shows_the_waiting_run() -> None:
    report = build_replay("r", history(), Position(3, 5)).to_json()
    assert report["status"] == "waiting" and report["termination"] is None
    assert [g["label"] for g in report["steps"]] == ["start", "step 1"]


def test_to_before_the_run_started_gives_an_empty_timeline() -> None:
    report = build_replay("r", history(), Position(1, 0)).to_json()
    assert report["steps"] == [] and report["status"] == "not_started"
    assert report["lineage"]["agent_id"] == "a"  # lineage is the run's, whatever the position


def test_unknown_run() -> None:
    with pytest.raises(UnknownRun) as info:
        build_replay("other", history())
    assert info.value.code == "run_not_found"


@pytest.mark.parametrize(("text", "expected"), [("3:2", Position(3, 2)), ("7", Position(7, 0)), (" 4:0 ", Position(4, 0))])
def test_parse_event_id(text: str, expected: Position) -> None:
    assert parse_event_id(text) == expected


@pytest.mark.parametrize("text", ["", ":", "a:1", "1:b", "0:0", "-1:0", "2:-1"])
def test_parse_event_id_rejects(text: str) -> None:
    with pytest.raises(InvalidEventId):
        parse_event_id(text)


def test_summaries_are_single_line_and_bounded() -> None:
    long = "line one\nline two " + "x" * 500
    text = event_summary(MessageAppended(message=Message(id="m", role="assistant", content=long)))
    assert "\n" not in text and len(text) < 120 and text.endswith("…")
    assert excerpt({"a": [1, 2]}) == '{"a": [1, 2]}'
    assert event_summary(ToolCallCompleted(call_id="zz", outcome="failed", result="boom")) == "? failed: boom call=zz"
