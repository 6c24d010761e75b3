"""Counterfactual branches of runs and the diff of two branches, for every transport (HTTP
`POST /v1/runs/{id}/counterfactual` and `GET /v1/threads/{a}/diff/{b}`, NATS `runs.counterfactual`
and `threads.diff`).

A branch is written as the commits `agentlog.projections.counterfactual.branch_commits` gives (the
source thread's history, then the run up to the decision or the inference). Then, at a decision,
the new decision goes the way of any decision (the dispatcher: a worker records it and resumes
the new run); at an inference, the dispatcher has a worker resume the new run from the log
(`Dispatcher.resume_run`), which takes the replaced answer at that step. Every check is made
before the first commit: an unknown run, call or inference, a call that never waited, a decision
its ticket's `response_schema` refuses (`agentlog.runtime.check_decision_on`, on the
branch's own context) or a taken thread id write nothing.

A request is safe to retry with the same `new_thread_id`: every id of the branch (its run, its
commits, a generated decision id, a replaced answer's message and calls) is derived from the
request (`_request_ids`), so a retry of one that failed part way (NATS away between two commits)
finds the commits it wrote, appends the rest and goes on, and a retry of one that succeeded
answers the same branch. A thread of that id holding anything else is a 409.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from typing import Any

import msgspec

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import Message, StoredCommit, ThreadCreated, ToolCall
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.store import EventStore, first_commit
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.errors import ApiError, not_found
from agentlog.gateway.operations.models import CounterfactualBody
from agentlog.gateway.operations.services import Services, thread_from_log
from agentlog.gateway.operations.threads import conflict
from agentlog.projections import branchdiff
from agentlog.projections.counterfactual import AnswerAt, BranchError, branch_commits
from agentlog.projections.timeline import event_summary, learn_call_names
from agentlog.runtime import check_decision_on


async def _thread_of_run(svc: Services, run_id: str) -> str:
    first = await first_commit(svc.store.read_run(run_id))
    if first is None:
        raise not_found("run", run_id)
    return first.commit.thread_id


async def counterfactual(svc: Services, who: Principal, dispatcher: Dispatcher, run_id: str,
                         body: CounterfactualBody) -> dict[str, Any]:
    """Branch run `run_id` into a new thread at `body.at`: at a decision, the branch takes
    `body.decision` there (recorded and resumed like any decision); at an inference, the branch
    takes `body.answer` instead of the model's and its run goes on from the log on a worker.
    Answers `{"thread_id", "run_id", "forked_from", "seq"}` (`seq`: the new decision's commit, or
    the resumed run's first). A run on a thread the caller may not see is a 404, like any read."""
    thread_id = await _thread_of_run(svc, run_id)
    try:
        commits, _view = await thread_from_log(svc, who, thread_id)
    except ApiError:
        raise not_found("run", run_id) from None
    new_thread = body.new_thread_id or new_id()
    ids = _request_ids(run_id, body, new_thread)
    new_run = ids()
    at: str | AnswerAt
    if body.answer is not None and body.at.inference is not None:
        calls = [ToolCall(id=c.id or ids(), name=c.name, arguments=c.arguments) for c in body.answer.tool_calls]
        at = AnswerAt(body.at.inference, Message(id=ids(), role="assistant", content=body.answer.content,
                                                 tool_calls=calls or None))
    else:
        assert body.at.decision is not None
        at = body.at.decision
    try:
        branch = branch_commits(commits, run_id, at, new_thread_id=new_thread, new_run_id=new_run, new_id=ids,
                                ts=now_ms())
    except BranchError as exc:
        raise ApiError(exc.status, exc.code, str(exc)) from None
    decision = None
    if body.decision is not None:
        given = body.decision.model_dump(exclude_none=True)
        # InvalidDecision: e.g. the ticket's response_schema refuses it
        decision = check_decision_on([StoredCommit(seq=i + 1, commit=c) for i, c in enumerate(branch)], new_thread,
                                     new_run, {**given, "target_id": at, "decision_id": given.get("decision_id") or ids()},
                                     now_ms())
    version = await _write(svc.store, new_thread, branch)
    if decision is not None:
        done = await dispatcher.submit_inputs(new_run, decisions=[msgspec.to_builtins(decision)])
    else:
        done = await dispatcher.resume_run(new_run, new_thread, version)
    created = branch[0].events[0]
    assert isinstance(created, ThreadCreated) and created.forked_from is not None
    return {"thread_id": new_thread, "run_id": new_run, "seq": done.seq,
            "forked_from": msgspec.to_builtins(created.forked_from)}


async def diff(svc: Services, who: Principal, a: str, b: str) -> dict[str, Any]:
    """Threads `a` and `b` compared event by event (`agentlog.projections.branchdiff`): from their
    fork point when one is a fork of the other, else from their first events. Each side of a row
    also carries the timeline's one-line `summary` of its event."""
    left, _ = await thread_from_log(svc, who, a)
    right, _ = await thread_from_log(svc, who, b)
    if _origin(right) == a:
        events_a, events_b = branchdiff.since_fork(left, right)
    elif _origin(left) == b:
        events_b, events_a = branchdiff.since_fork(right, left)
    else:
        events_a, events_b = branchdiff.events_of(left), branchdiff.events_of(right)
    answer = branchdiff.diff(events_a, events_b)
    names: dict[str, str] = {}
    for _id, event in [*events_a, *events_b]:
        learn_call_names(event, names)
    by_id = {"a": dict(events_a), "b": dict(events_b)}
    for row in answer["rows"]:
        for side in ("a", "b"):
            if row[side] is not None:
                row[side]["summary"] = event_summary(by_id[side][row[side]["id"]], names)
    return {"a": a, "b": b, **answer}


def _request_ids(run_id: str, body: CounterfactualBody, new_thread: str) -> Callable[[], str]:
    """The ids of the branch a request asks for, in the order they are taken: the same for every
    attempt of the same request (the run, the thread id and the rest of the body), so another
    request for that thread id finds commits that are not its own (module doc)."""
    asked = json.dumps(body.model_dump(mode="json", exclude={"new_thread_id"}), sort_keys=True)
    base = hashlib.sha256(f"{run_id}\x00{new_thread}\x00{asked}".encode()).hexdigest()[:24]
    taken = itertools.count()
    return lambda: f"br{base}{next(taken)}"


async def _write(store: EventStore, thread_id: str, branch: list[Any]) -> int:
    """Append the branch's commits to its new thread, after those an earlier attempt of the same
    request wrote; the seq of its last one. A 409 when the thread holds anything else."""
    written = [sc async for sc in store.read_thread(thread_id)][:len(branch)]
    if [sc.commit.commit_id for sc in written] != [commit.commit_id for commit in branch[:len(written)]]:
        raise conflict(f"thread {thread_id!r} already exists")
    version = written[-1].seq if written else 0
    try:
        for commit in branch[len(written):]:
            version = (await store.append(commit, expected_version=version)).seq
    except VersionConflict:
        raise conflict(f"thread {thread_id!r} already exists") from None
    return version


def _origin(commits: list[StoredCommit]) -> str | None:
    first = commits[0].commit.events[0] if commits and commits[0].commit.events else None
    if isinstance(first, ThreadCreated) and first.forked_from is not None:
        return first.forked_from.thread_id
    return None


__all__ = ["counterfactual", "diff"]
