"""A counterfactual branch of a run (`agentlog.projections.counterfactual.branch_commits`) driven in
process on the in-memory store (pure logic: no NATS): the branch copies the run up to the
decision, the new run takes another decision there like any waiting run, and verified replay of
it passes from the branch's log alone. The run is a thread's second run, so the branch's first
commit carries the history of the first."""

from __future__ import annotations

from agentlog.eventlog.events import (
    Commit,
    InferenceReplaced,
    Message,
    MessageAppended,
    RunStarted,
    StoredCommit,
    ThreadCreated,
    ToolCall,
    ToolCallDecided,
)
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.projections.counterfactual import AnswerAt, BranchError, branch_commits
from agentlog.runtime.replay.verify import verify_run

from tests.apps.protocol_app import app


async def _two_runs(store: MemoryEventStore) -> tuple[object, str, str, str]:
    rt = app.runtime(store)
    first = await rt.start("sequential", "text: hi")
    await first.result()
    second = await rt.start("sequential", "approval: deploy", thread_id=first.thread_id)
    await second.result()
    commits = [sc async for sc in store.read_thread(first.thread_id)]
    call = next(e.call_id for sc in commits for e in sc.commit.events if type(e).__name__ == "ToolCallSuspended")
    decided = await rt.decide(second.run_id, {"target_id": call, "decision_id": "yes", "action": "resume",
                                              "result": {"approved": True}})
    assert decided.handle is not None
    await decided.handle.result()
    return rt, first.thread_id, second.run_id, call


async def _append(store: MemoryEventStore, commits: list[Commit]) -> None:
    version = 0
    for commit in commits:
        version = (await store.append(commit, expected_version=version)).seq


async def test_counterfactual_branch_of_a_second_run_takes_a_denial_and_replays_verified() -> None:
    store = MemoryEventStore()
    rt, thread, run_id, call = await _two_runs(store)
    source = [sc async for sc in store.read_thread(thread)]
    branch = branch_commits(source, run_id, call, new_thread_id="branch", new_run_id="branch-run", new_id=new_id,
                            ts=now_ms())
    created = branch[0].events[0]
    assert isinstance(created, ThreadCreated) and created.forked_from is not None
    assert (created.forked_from.thread_id, created.forked_from.run_id, created.forked_from.call_id) == (
        thread, run_id, call)
    assert created.parent_thread_id == thread and branch[0].run_id is None
    # the history: the first run's messages (user + answer), none of its run events
    assert [e.message.content for e in branch[0].events[1:] if hasattr(e, "message")][:1] == ["text: hi"]
    assert all(c.run_id == "branch-run" and c.thread_id == "branch" for c in branch[1:])
    started = next(e for e in branch[1].events if isinstance(e, RunStarted))
    assert started.run_id == "branch-run"
    assert not any(isinstance(e, ToolCallDecided) for c in branch for e in c.events)  # cut before the decision
    await _append(store, branch)
    denied = await rt.decide("branch-run", {"target_id": call, "decision_id": "no", "action": "resume",
                                            "result": {"approved": False}})
    assert denied.handle is not None
    ended = await denied.handle.result()
    assert ended.termination is not None and ended.termination.type == "natural_end"
    report = await verify_run(store, "branch-run", rt)
    assert report.ok and report.commits_verified == report.commits_recorded
    assert (await verify_run(store, run_id, rt)).ok  # the source run is untouched


async def test_counterfactual_branch_refuses_a_point_it_cannot_branch_at() -> None:
    store = MemoryEventStore()
    _rt, thread, run_id, call = await _two_runs(store)
    source = [sc async for sc in store.read_thread(thread)]
    for run, at, code in ((run_id, "nope", "unknown_call"), ("no-run", call, "run_not_found")):
        try:
            branch_commits(source, run, at, new_thread_id="b", new_run_id="r", new_id=new_id, ts=0)
        except BranchError as exc:
            assert exc.code == code
        else:
            raise AssertionError(f"{code} expected")
    # a decision point after which the run never waited (a truncated log: no RunSuspended)
    cut = [StoredCommit(sc.seq, Commit(commit_id=sc.commit.commit_id, thread_id=sc.commit.thread_id,
                                       run_id=sc.commit.run_id, ts=sc.commit.ts,
                                       events=[e for e in sc.commit.events if type(e).__name__ != "RunSuspended"]))
           for sc in source]
    try:
        branch_commits(cut, run_id, call, new_thread_id="b", new_run_id="r", new_id=new_id, ts=0)
    except BranchError as exc:
        assert (exc.code, exc.status) == ("run_not_waiting", 409)
    else:
        raise AssertionError("run_not_waiting expected")


async def test_counterfactual_answer_replaced_runs_its_tool_and_replays_verified() -> None:
    """A branch at the run's first inference with another answer (a call of `echo`, not `add`):
    resumed from the log, the run takes that answer without asking its model (recorded as
    `InferenceReplaced`), runs `echo`, and goes on with its model; verified replay passes."""
    store = MemoryEventStore()
    rt = app.runtime(store)
    source = await rt.start("open", "add: go")
    await source.result()
    thread = [sc async for sc in store.read_thread(source.thread_id)]
    answer = Message(id="ignored", role="assistant", content="echo instead",
                     tool_calls=[ToolCall(id="c-echo", name="echo", arguments={"text": "hi"})])
    branch = branch_commits(thread, source.run_id, AnswerAt(1, answer), new_thread_id="b2", new_run_id="b2-run",
                            new_id=new_id, ts=now_ms())
    first_answer = next(e.message.id for sc in thread for e in sc.commit.events
                        if isinstance(e, MessageAppended) and e.message.role == "assistant")
    origin = branch[0].events[0].forked_from
    assert origin is not None and (origin.run_id, origin.message_id) == (source.run_id, first_answer)
    assert [type(e).__name__ for c in branch[1:] for e in c.events] == ["RunStarted", "MessageAppended"]
    started = branch[1].events[0]
    assert isinstance(started, RunStarted) and [(a.step, a.message.content) for a in started.answers] == [
        (1, "echo instead")]
    await _append(store, branch)
    handle = await rt.resume("b2-run", thread_id="b2")
    assert handle is not None
    assert (await handle.result()).termination.type == "natural_end"
    events = [e async for sc in store.read_thread("b2") for e in [*sc.commit.events]]
    replaced = [e for e in events if isinstance(e, InferenceReplaced)]
    assert [e.step for e in replaced] == [1]
    said = [(e.message.role, e.message.content) for e in events if isinstance(e, MessageAppended)]
    assert said == [("user", "add: go"), ("assistant", "echo instead"), ("tool", "hi"),
                    ("assistant", "The sum is three.")]
    report = await verify_run(store, "b2-run", rt)
    assert report.ok and report.inferences == 1  # the replaced answer asked no model


async def test_counterfactual_answer_at_a_later_step_keeps_the_steps_before() -> None:
    """At the second inference (by its message id), a text answer: the branch shares step 1 (the
    `add` call and its result) and ends with the given text; verified replay passes."""
    store = MemoryEventStore()
    rt = app.runtime(store)
    source = await rt.start("open", "add: go")
    await source.result()
    thread = [sc async for sc in store.read_thread(source.thread_id)]
    second = [e.message.id for sc in thread for e in sc.commit.events
              if isinstance(e, MessageAppended) and e.message.role == "assistant"][1]
    branch = branch_commits(thread, source.run_id, AnswerAt(second, Message(id="x", role="assistant", content="Four.")),
                            new_thread_id="b3", new_run_id="b3-run", new_id=new_id, ts=now_ms())
    await _append(store, branch)
    handle = await rt.resume("b3-run", thread_id="b3")
    assert handle is not None
    await handle.result()
    said = [e.message.content async for sc in store.read_thread("b3") for e in sc.commit.events
            if isinstance(e, MessageAppended) and e.message.role != "tool"]
    assert said == ["add: go", "Let me add those numbers", "Four."]
    assert (await verify_run(store, "b3-run", rt)).ok
    for at, code in ((3, "inference_not_found"), ("nope", "inference_not_found")):
        try:
            branch_commits(thread, source.run_id, AnswerAt(at, Message(id="x", role="assistant", content="")),
                           new_thread_id="b", new_run_id="r", new_id=new_id, ts=0)
        except BranchError as exc:
            assert exc.code == code
        else:
            raise AssertionError(code)
