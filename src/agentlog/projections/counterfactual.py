"""A counterfactual branch of a run: a new thread holding the run as it was up to one of its
decisions or one of its model's answers, so that the decision is taken again differently ("what
if the approver had denied?") or the answer replaced ("what if the model had called this tool?").

The branch is a new thread whose commits are, in order:

1. one thread commit with the source thread's history as of the event before the run started
   (its messages, its state and the context compaction in force), whose `ThreadCreated` names
   its lineage (`forked_from`: source thread, run, the replaced call, and the last event of the run
   the branch shares; `parent_thread_id`: the source thread, so the source lists it among its
   branches);
2. the run's own commits up to (not including) the one that recorded the decision of the call, or
   the one holding the replaced inference (which starts its step), copied under a new run id and
   new commit ids, events unchanged but for the `RunStarted`: it names the new run and, for a
   replaced answer, carries it (`answers`: the step and the message); a `ThreadCreated` the run's
   first commit held is in commit 1 instead.

At a decision, the new run is then waiting for the call exactly as the source run was, and takes
the new decision like any waiting run (`Runtime.decide`, on a worker). At an answer, it is a run
whose worker went away before that step: resumed from the log (`Runtime.resume`), it redoes the
step and takes the given answer instead of asking its model (`InferenceReplaced`). Either way its
log is complete on its own: `replay --verify` of it re-drives its start (answers included), the
copied commits, then what came after.

Pure: the caller reads the source thread's commits and appends the result in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    ContextCompacted,
    ForkOrigin,
    InferenceCompleted,
    InferenceReplaced,
    Message,
    MessageAppended,
    Position,
    ReplacedAnswer,
    RunFinished,
    RunStarted,
    RunSuspended,
    StateReplaced,
    StepStarted,
    StoredCommit,
    ThreadCreated,
    ToolCallDecided,
    ToolCallGated,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.fork import InvalidFork
from agentlog.projections.timetravel import messages_at, thread_at


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


@dataclass(frozen=True, slots=True)
class AnswerAt:
    """Replace the answer of one inference of the run: the one that produced assistant message
    `at` (its id), or the run's `at`-th inference (1-based); `message` is the new answer."""

    at: str | int
    message: Message


def answer_cut(run_commits: Sequence[StoredCommit], run_id: str, at: str | int) -> tuple[int, int, str]:
    """(how many of the run's commits the branch keeps, the step, the replaced message id) for a
    branch at an inference: the commits before the one holding it. Raises `BranchError`
    (`inference_not_found`, or `not_a_step_start` when the inference is not the first of a step
    that starts in its commit: only such a point is one the run can be resumed from)."""
    step, count = 0, 0
    for i, sc in enumerate(run_commits):
        started_here: int | None = None
        answers: dict[str, int] = {}
        for ev in sc.commit.events:
            if isinstance(ev, StepStarted):
                step = started_here = ev.step
            elif isinstance(ev, MessageAppended) and ev.message.role == "assistant":
                answers[ev.message.id] = step
            elif isinstance(ev, (InferenceCompleted, InferenceReplaced)) and ev.message_id in answers:
                count += 1
                if at not in (ev.message_id, count):
                    continue
                first = all(not isinstance(e, (InferenceCompleted, InferenceReplaced)) or e is ev
                            for e in sc.commit.events[:sc.commit.events.index(ev) + 1])
                if started_here is None or not first:
                    raise BranchError("not_a_step_start", f"inference {at!r} of run {run_id!r} is not the first of "
                                      "a step: only a step's first answer can be replaced", 409)
                return i, answers[ev.message_id], ev.message_id
    raise BranchError("inference_not_found", f"run {run_id!r} has no inference {at!r}", 404)


def _copy(sc: StoredCommit, thread_id: str, run_id: str, commit_id: str,
          answer: ReplacedAnswer | None) -> Commit:
    events: list[AnyEvent] = []
    for ev in sc.commit.events:
        if isinstance(ev, ThreadCreated):
            continue
        if isinstance(ev, RunStarted):
            kept = list(ev.answers) if answer is None else [a for a in ev.answers if a.step < answer.step] + [answer]
            ev = msgspec.structs.replace(ev, run_id=run_id, answers=kept)
        events.append(ev)
    return Commit(commit_id=commit_id, thread_id=thread_id, run_id=run_id, ts=sc.commit.ts, events=events)


def _history(before: Sequence[StoredCommit], first: StoredCommit, thread_id: str) -> list[AnyEvent]:
    """The thread as the run found it at its start, as the events of one commit: `ThreadCreated`
    first, then the messages, the thread state, and the compaction in force (what the run's
    context folds from the history: its model requests are then the same). Unlike a fork's, tool
    calls left unanswered stay so (the run saw them so)."""
    if not before:
        created = next((ev for ev in first.commit.events if isinstance(ev, ThreadCreated)), ThreadCreated())
        return [created]
    last = before[-1]
    at = Position(last.seq, len(last.commit.events) - 1)
    view = thread_at(before, thread_id, at)
    events: list[AnyEvent] = [ThreadCreated(resource_id=view.resource_id, metadata=dict(view.metadata))]
    events += [MessageAppended(message=m) for m in messages_at(before, thread_id, at)]
    if view.state:
        events.append(StateReplaced(state=view.state))
    compaction = [ev for sc in before for ev in sc.commit.events if isinstance(ev, ContextCompacted)]
    return events + compaction[-1:]


def branch_commits(thread: Sequence[StoredCommit], run_id: str, at: str | AnswerAt, *, new_thread_id: str,
                   new_run_id: str, new_id: Callable[[], str], ts: int) -> list[Commit]:
    """The commits of a branch of run `run_id` (whose thread's `thread` commits are given, in log
    order) at the decision of call `at` (a call id) or at an inference (`AnswerAt`), to append in
    order to the new thread `new_thread_id`. Raises `BranchError`: `run_not_found`, and the codes
    of `decision_cut` and `answer_cut`."""
    start = next((i for i, sc in enumerate(thread) if sc.commit.run_id == run_id
                  and any(isinstance(ev, RunStarted) for ev in sc.commit.events)), None)
    if start is None:
        raise BranchError("run_not_found", f"run {run_id!r} not found", 404)
    source_thread = thread[start].commit.thread_id
    run_commits = [sc for sc in thread[start:] if sc.commit.run_id == run_id]
    answer: ReplacedAnswer | None = None
    if isinstance(at, AnswerAt):
        cut, step, replaced = answer_cut(run_commits, run_id, at.at)
        answer = ReplacedAnswer(step=step, message=at.message)
        lineage = {"message_id": replaced}
    else:
        cut, lineage = decision_cut(run_commits, run_id, at), {"call_id": at}
    kept = run_commits[:cut]
    if not kept:
        raise BranchError("not_a_step_start", f"run {run_id!r} has no commit before {at!r} to branch from", 409)
    last = kept[-1]
    origin = ForkOrigin(thread_id=source_thread, position=str(Position(last.seq, len(last.commit.events) - 1)),
                        run_id=run_id, **lineage)
    history = _history(thread[:start], thread[start], source_thread)
    created = msgspec.structs.replace(history[0], forked_from=origin, parent_thread_id=source_thread)
    out = [Commit(commit_id=new_id(), thread_id=new_thread_id, run_id=None, ts=ts, events=[created, *history[1:]])]
    out += [_copy(sc, new_thread_id, new_run_id, new_id(), answer) for sc in kept]
    return out


__all__ = ["AnswerAt", "BranchError", "answer_cut", "branch_commits", "decision_cut"]
