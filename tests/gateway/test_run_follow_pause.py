"""When a followed run stream ends (`agentlog.gateway.http.runs.paused`): the history's last pause or go
event decides whether the stream ends after the history or waits live for the next pause, and
those are the events the live part ends on (`RunSuspended`, `RunFinished`), so the two can never
disagree (a stream that saw the pause in its history and waited live for another hung)."""

from __future__ import annotations

from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StoredCommit,
    SuspendTicket,
    Termination,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.gateway.http.runs import paused


def commits(*groups: list[AnyEvent]) -> list[StoredCommit]:
    return [StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t", run_id="r", ts=seq, events=events))
            for seq, events in enumerate(groups, start=1)]


SUSPEND = [ToolCallStarted(call_id="a", name="ask", arguments={}),
           ToolCallSuspended(call_id="a", ticket=SuspendTicket(id="t-a"))]
DECIDED = ToolCallDecided(call_id="a", decision=ToolCallDecision(target_id="a", decision_id="d", action="resume"))


def test_the_last_pause_or_go_event_decides() -> None:
    started = [RunStarted(agent_id="x", run_id="r")]
    assert paused(commits(started)) is False
    assert paused(commits(started, [*SUSPEND, RunSuspended(call_ids=["a"])])) is True
    # a decision recorded for only some of the suspended calls: still paused
    assert paused(commits(started, [*SUSPEND, RunSuspended(call_ids=["a", "b"])], [DECIDED])) is True
    # for all of them: a worker is to apply them, the run is on its way
    assert paused(commits(started, [*SUSPEND, RunSuspended(call_ids=["a"])], [DECIDED])) is False
    # the decision that resumes it
    assert paused(commits(started, [*SUSPEND, RunSuspended(call_ids=["a"])], [DECIDED, RunResumed(call_ids=["a"])])) \
        is False
    assert paused(commits(started, [RunFinished(termination=Termination(type="success"))])) is True


def test_a_suspended_call_without_the_runs_pause_is_followed_until_the_pause() -> None:
    """The call is suspended (a fold says `waiting`) but the run's `RunSuspended` is still to
    come: the stream waits for it rather than ending before it."""
    assert paused(commits([RunStarted(agent_id="x", run_id="r")], SUSPEND)) is False


def test_commits_without_pause_or_go_events_cannot_tell() -> None:
    """(A read from a resume position inside a step: the caller reads the run from its start.)"""
    assert paused(commits(SUSPEND)) is None
    assert paused([]) is None
