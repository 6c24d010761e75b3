"""Run-context snapshots are a cache derived by the same fold (issue #13), and the run view is
kept incrementally: pure unit tests, no store.

- property: for generated thread histories and any cut point, decode(encode(snapshot of the
  fold of the prefix)) + fold(rest) == fold(all), for the loop context and the run view;
- the run fold keeps its status in O(1) per event (it inspected every call on each call event);
- `RunHandle` folds each commit once, however often `view()` / `result()` are asked.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

import projections.fold as fold_mod
from eventlog.events import (
    Commit,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StatePatched,
    StateReplaced,
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
    Usage,
)
from projections.fold import RunFolder, fold_commits
from projections.views import RunView
from runtime import RunHandle
from runtime.loop import RunContext, fold_context
from runtime.snapshot import RunSnapshot, decode_snapshot, encode_snapshot

THREAD, RUN = "t-snap", "r-snap"
CALLS = ["c1", "c2", "c3"]

_call = st.sampled_from(CALLS)
_decision = st.builds(
    lambda cid, did, action: ToolCallDecision(target_id=cid, decision_id=did, action=action, result={"ok": True}),
    _call, st.sampled_from(["d1", "d2", "d3"]), st.sampled_from(["resume", "cancel"]),
)
_message = st.builds(
    lambda role, text, calls: Message(
        id=f"m-{text}", role=role, content=text,
        tool_calls=[ToolCall(id=c, name="tool", arguments={"n": 1}) for c in calls] if role == "assistant" and calls else None,
    ),
    st.sampled_from(["user", "assistant", "tool"]), st.text("ab", max_size=3), st.lists(_call, max_size=2, unique=True),
)
_event = st.one_of(
    st.builds(MessageAppended, message=_message),
    st.builds(lambda k, v: StatePatched(ops=[{"op": "add", "path": f"/{k}", "value": v}]),
              st.sampled_from("xyz"), st.integers(0, 9)),
    st.builds(lambda v: StateReplaced(state={"r": v}), st.integers(0, 9)),
    st.builds(lambda c: ToolCallGated(call_id=c, verdict="allow"), _call),
    st.builds(lambda c: ToolCallStarted(call_id=c, name="tool", arguments={"n": 1}), _call),
    st.builds(lambda c, mode: ToolCallSuspended(call_id=c, ticket=SuspendTicket(id=f"t-{c}", resume_mode=mode)),
              _call, st.sampled_from(["replay_tool_call", "pass_decision_to_tool"])),
    st.builds(lambda d: ToolCallDecided(call_id=d.target_id, decision=d), _decision),
    st.builds(lambda c: ToolCallResuming(call_id=c, mode="replay_tool_call"), _call),
    st.builds(lambda c, ok: ToolCallCompleted(call_id=c, outcome="succeeded" if ok else "failed", result=1,
                                              message_id=f"tm-{c}"), _call, st.booleans()),
    st.builds(StepStarted, step=st.integers(1, 5)),
    st.builds(StepFinished, step=st.integers(1, 5)),
    st.builds(lambda n: InferenceCompleted(model="m", usage=Usage(input_tokens=n, output_tokens=1),
                                           duration_ms=1, stop_reason="stop", message_id="mx"), st.integers(0, 5)),
    st.builds(lambda calls: RunSuspended(call_ids=calls), st.lists(_call, max_size=2)),
    st.builds(RunResumed),
    st.builds(RunCancelRequested),
    st.builds(lambda: RunFinished(termination=Termination(type="natural_end"))),
)
_commit = st.tuples(st.sampled_from([RUN, RUN, "r-other", None]), st.lists(_event, min_size=1, max_size=4))


def _history(raw: list[tuple[str | None, list[Any]]]) -> list[StoredCommit]:
    """Commits of one thread: it is created, the run starts, then the generated commits."""
    commits = [StoredCommit(1, Commit(commit_id="c0", thread_id=THREAD, run_id=RUN, ts=1,
                                      events=[ThreadCreated(), RunStarted(run_id=RUN, agent_id="a")]))]
    for i, (run_id, events) in enumerate(raw, start=2):
        commits.append(StoredCommit(i * 3, Commit(commit_id=f"c{i}", thread_id=THREAD, run_id=run_id, ts=i * 10,
                                                  events=events)))
    return commits


@given(st.lists(_commit, max_size=12), st.data())
def test_snapshot_of_a_prefix_plus_the_rest_folds_to_the_whole(raw: list[Any], data: st.DataObject) -> None:
    history = _history(raw)
    cut = data.draw(st.integers(1, len(history)))
    prefix, rest = history[:cut], history[cut:]

    whole_ctx = fold_context(RunContext(thread_id=THREAD, run_id=RUN), history)
    whole_run = fold_commits(history).runs[RUN]

    run_prefix = [sc for sc in prefix if sc.commit.run_id == RUN]
    snap = RunSnapshot.of(
        seq=prefix[-1].seq, agent_id="a",
        ctx=fold_context(RunContext(thread_id=THREAD, run_id=RUN), prefix),
        run=fold_commits(run_prefix).runs[RUN],
    )
    restored = decode_snapshot(encode_snapshot(snap))
    assert restored is not None and restored == snap

    assert fold_context(restored.ctx, rest) == whole_ctx
    folder = RunFolder(restored.run_view())
    for sc in rest:
        if sc.commit.run_id == RUN:
            folder.apply(sc)
    assert folder.view() == whole_run


@given(st.lists(_commit, max_size=12))
def test_incremental_run_view_equals_the_fold_after_every_commit(raw: list[Any]) -> None:
    history = [sc for sc in _history(raw) if sc.commit.run_id == RUN]
    folder = RunFolder(RunView(run_id=RUN, thread_id=THREAD))
    for i, sc in enumerate(history):
        folder.apply(sc)
        want = fold_commits(history[: i + 1]).runs[RUN]
        assert folder.view() == want
        assert want.status == fold_mod.derive_status(want.calls, want.termination is not None)


def test_unusable_snapshot_bytes_are_a_miss() -> None:
    snap = RunSnapshot.of(seq=3, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN),
                          run=RunView(run_id=RUN, thread_id=THREAD))
    assert decode_snapshot(b"\xc1 not msgpack") is None
    assert decode_snapshot(msgspec.msgpack.encode({"seq": "x"})) is None
    assert decode_snapshot(encode_snapshot(msgspec.structs.replace(snap, v=99))) is None
    assert decode_snapshot(encode_snapshot(msgspec.structs.replace(snap, schema="written-by-other-shapes"))) is None
    assert decode_snapshot(encode_snapshot(snap)) == snap


def _many_calls(n: int) -> list[StoredCommit]:
    """A run of `n` approval cycles: each call starts, suspends, resumes and completes."""
    commits = [StoredCommit(1, Commit(commit_id="c0", thread_id=THREAD, run_id=RUN, ts=1,
                                      events=[RunStarted(run_id=RUN, agent_id="a")]))]
    for i in range(n):
        cid = f"call{i}"
        decision = ToolCallDecision(target_id=cid, decision_id=f"d{i}", action="resume")
        commits.append(StoredCommit(2 + i, Commit(commit_id=f"c{i + 1}", thread_id=THREAD, run_id=RUN, ts=2, events=[
            ToolCallStarted(call_id=cid, name="approve"),
            ToolCallSuspended(call_id=cid, ticket=SuspendTicket(id=f"t{i}")),
            ToolCallDecided(call_id=cid, decision=decision),
            ToolCallResuming(call_id=cid, mode="replay_tool_call"),
            ToolCallCompleted(call_id=cid, outcome="succeeded", result=True, message_id=f"m{i}"),
        ])))
    return commits


def test_run_status_costs_o1_per_event(monkeypatch: Any) -> None:
    """The status of a run with n calls must not be re-derived from every call on each call
    event (that made `result()` of a 230-step run ~50 ms): the calls inspected stay O(n)."""
    inspected = 0
    real = fold_mod.derive_status

    def counting(calls: Any, finished: bool) -> Any:
        nonlocal inspected
        inspected += len(calls)
        return real(calls, finished)

    monkeypatch.setattr(fold_mod, "derive_status", counting)
    n = 120
    run = fold_commits(_many_calls(n)).runs[RUN]
    assert run.status == "running" and len(run.calls) == n
    assert inspected <= 2 * n


def test_run_handle_folds_each_commit_once(monkeypatch: Any) -> None:
    applied = 0
    real = fold_mod._RunAcc.apply

    def counting(self: Any, event: Any, seq: int, ts: int) -> None:
        nonlocal applied
        applied += 1
        real(self, event, seq, ts)

    monkeypatch.setattr(fold_mod._RunAcc, "apply", counting)
    commits = _many_calls(20)
    events = sum(len(sc.commit.events) for sc in commits)
    handle = RunHandle(RUN, THREAD, "a")
    views = []
    for sc in commits:
        handle._on_commit(sc)
        views.append(handle.view())
    views += [handle.view(), handle.view()]
    assert applied == events
    monkeypatch.setattr(fold_mod._RunAcc, "apply", real)
    assert views[-1] == fold_commits(commits).runs[RUN]
    assert views[0] == fold_commits(commits[:1]).runs[RUN]  # an earlier view is not changed later
