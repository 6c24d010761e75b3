"""A counterfactual branch of a run: a new thread holding the run as it was up to one of its
decisions, so that the decision can be taken again differently ("what if the approver had
denied?").

The branch is a new thread whose commits are, in order:

1. one thread commit with the source thread's history as of the event before the run started
   (`agentlog.projections.fork.fork_events`: its messages and state), whose `ThreadCreated` names
   its lineage (`forked_from`: source thread, run, the replaced call, and the last event of the run
   the branch shares; `parent_thread_id`: the source thread, so the source lists it among its
   branches);
2. the run's own commits up to (not including) the one that recorded the decision of the call,
   copied under a new run id and new commit ids, events unchanged (the `RunStarted` names the new
   run; a `ThreadCreated` the run's first commit held is in commit 1 instead).

The new run is then waiting for the call exactly as the source run was, and takes the new decision
like any waiting run (`Runtime.decide`, on a worker). Its log is complete on its own: `replay
--verify` of it re-drives its start and the copied commits, then the new decision.

Pure: the caller reads the source thread's commits and appends the result in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    ForkOrigin,
    Position,
    RunFinished,
    RunStarted,
    RunSuspended,
    StoredCommit,
    ThreadCreated,
    ToolCallDecided,
    ToolCallGated,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.fork import InvalidFork, fork_events


class BranchError(InvalidFork):
    """A counterfactual branch cannot be made (`code` says why, `status` the HTTP status it
    answers with); nothing is written."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(code, message)
        self.status = status


def _call_ids(commits: Sequence[StoredCommit]) -> set[str]:
    out: set[str] = set()
    for sc in commits:
        for ev in sc.commit.events:
            if isinstance(ev, (ToolCallSuspended, ToolCallStarted, ToolCallGated, ToolCallDecided)):
                out.add(ev.call_id if not isinstance(ev, ToolCallDecided) else ev.decision.target_id)
    return out


def decision_cut(run_commits: Sequence[StoredCommit], run_id: str, call_id: str) -> int:
    """How many of the run's commits the branch at `call_id`'s decision keeps: those before the
    first that recorded a decision for it (all of them when none did). Raises `BranchError`
    (`unknown_call`, `call_not_suspended`, `run_not_waiting`) unless the run was then waiting
    for that call."""
    suspended_at = next((i for i, sc in enumerate(run_commits) for ev in sc.commit.events
                         if isinstance(ev, ToolCallSuspended) and ev.call_id == call_id), None)
    if suspended_at is None:
        if call_id in _call_ids(run_commits):
            raise BranchError("call_not_suspended",
                              f"tool call {call_id!r} of run {run_id!r} never waited for a decision", 409)
        raise BranchError("unknown_call", f"run {run_id!r} has no tool call {call_id!r}", 404)
    cut = next((i for i, sc in enumerate(run_commits) if i > suspended_at for ev in sc.commit.events
                if isinstance(ev, ToolCallDecided) and ev.decision.target_id == call_id), len(run_commits))
    kept = run_commits[suspended_at:cut]
    waiting = any(isinstance(ev, RunSuspended) and call_id in ev.call_ids for sc in kept for ev in sc.commit.events)
    if not waiting or any(isinstance(ev, RunFinished) for sc in kept for ev in sc.commit.events):
        raise BranchError("run_not_waiting",
                          f"run {run_id!r} was not waiting for call {call_id!r} before its decision", 409)
    return cut


def _copy(sc: StoredCommit, thread_id: str, run_id: str, commit_id: str) -> Commit:
    events: list[AnyEvent] = []
    for ev in sc.commit.events:
        if isinstance(ev, ThreadCreated):
            continue
        events.append(msgspec.structs.replace(ev, run_id=run_id) if isinstance(ev, RunStarted) else ev)
    return Commit(commit_id=commit_id, thread_id=thread_id, run_id=run_id, ts=sc.commit.ts, events=events)


def branch_commits(thread: Sequence[StoredCommit], run_id: str, call_id: str, *, new_thread_id: str,
                   new_run_id: str, new_id: Callable[[], str], ts: int) -> list[Commit]:
    """The commits of a branch of run `run_id` (whose thread's `thread` commits are given, in log
    order) at the decision of `call_id`, to append in order to the new thread `new_thread_id`.
    Raises `BranchError`: `run_not_found`, and the codes of `decision_cut`."""
    start = next((i for i, sc in enumerate(thread) if sc.commit.run_id == run_id
                  and any(isinstance(ev, RunStarted) for ev in sc.commit.events)), None)
    if start is None:
        raise BranchError("run_not_found", f"run {run_id!r} not found", 404)
    source_thread = thread[start].commit.thread_id
    run_commits = [sc for sc in thread[start:] if sc.commit.run_id == run_id]
    cut = decision_cut(run_commits, run_id, call_id)
    kept = run_commits[:cut]
    last = kept[-1]
    origin = ForkOrigin(thread_id=source_thread, position=str(Position(last.seq, len(last.commit.events) - 1)),
                        run_id=run_id, call_id=call_id)
    if start > 0:
        before = thread[start - 1]
        history = fork_events(thread[:start], source_thread, Position(before.seq, len(before.commit.events) - 1),
                              new_id=new_id)
    else:
        created = next((ev for ev in thread[start].commit.events if isinstance(ev, ThreadCreated)), ThreadCreated())
        history = [created]
    first = history[0]
    assert isinstance(first, ThreadCreated)
    history[0] = msgspec.structs.replace(first, forked_from=origin, parent_thread_id=source_thread)
    out = [Commit(commit_id=new_id(), thread_id=new_thread_id, run_id=None, ts=ts, events=history)]
    out += [_copy(sc, new_thread_id, new_run_id, new_id()) for sc in kept]
    return out


__all__ = ["BranchError", "branch_commits", "decision_cut"]
