"""Pure folds: derived run status (table), scopes of state, thread/run bookkeeping, purity, and
properties over generated histories (batch fold == per-event fold, apply-once)."""

from __future__ import annotations

import copy
import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import (
    Commit,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunCancelRequested,
    RunFinished,
    RunStarted,
    StatePatched,
    StateReplaced,
    StepFinished,
    StepStarted,
    StoredCommit,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ThreadDeleted,
    ThreadMetadataUpdated,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
)
from agentlog.projections import (
    CallView,
    Folder,
    RunView,
    ThreadView,
    decode_run,
    decode_thread,
    derive_status,
    encode_view,
    fold_commits,
    fold_messages,
    fold_run,
    fold_thread,
)
from agentlog.projections.views import TERMINAL_CALL_STATUSES, ViewEncoder
from agentlog.testing.synth import generate_history, stored

T0 = 1_700_000_000_000


def run_of(events, run_id="r1", thread_id="t1") -> RunView:
    view = RunView(run_id=run_id, thread_id=thread_id)
    for seq, event in enumerate(events, start=1):
        view = fold_run(view, event, seq, T0 + seq)
    return view


def thread_of(commits) -> ThreadView:
    view = ThreadView(thread_id="t1")
    for seq, (run_id, events) in enumerate(commits, start=1):
        for event in events:
            view = fold_thread(view, event, seq, T0 + seq, run_id)
    return view


START = RunStarted(run_id="r1", agent_id="a")


def started(c):
    return ToolCallStarted(call_id=c, name="tool", arguments={"c": c})


def suspended(c):
    return ToolCallSuspended(call_id=c, ticket=SuspendTicket(id=f"k{c}"))


def decided(c, action="resume"):
    return ToolCallDecided(call_id=c, decision=ToolCallDecision(target_id=c, decision_id=f"d{c}", action=action))


def resuming(c):
    return ToolCallResuming(call_id=c, mode="replay_tool_call")


def completed(c, outcome="succeeded"):
    return ToolCallCompleted(call_id=c, outcome=outcome, result={"c": c})


FINISHED = RunFinished(termination=Termination(type="natural_end"))

# (case, events after RunStarted, expected run status, expected call statuses)
STATUS_TABLE = [
    ("no calls", [], "running", {}),
    ("no calls, steps", [StepStarted(step=1), StepFinished(step=1)], "running", {}),
    ("gated only", [ToolCallGated(call_id="a", verdict="allow")], "running", {"a": "new"}),
    ("one running", [started("a")], "running", {"a": "running"}),
    ("one suspended", [started("a"), suspended("a")], "waiting", {"a": "suspended"}),
    ("suspended + running", [started("a"), suspended("a"), started("b")], "running",
     {"a": "suspended", "b": "running"}),
    ("suspended + succeeded", [started("a"), suspended("a"), started("b"), completed("b")], "waiting",
     {"a": "suspended", "b": "succeeded"}),
    ("decided, not resumed yet", [started("a"), suspended("a"), decided("a")], "waiting",
     {"a": "suspended"}),
    ("partial decisions", [started("a"), suspended("a"), started("b"), suspended("b"), decided("a")],
     "waiting", {"a": "suspended", "b": "suspended"}),
    ("partial: one resuming", [started("a"), suspended("a"), started("b"), suspended("b"), decided("a"),
                               resuming("a")], "running", {"a": "resuming", "b": "suspended"}),
    ("partial: one replayed, other waits", [started("a"), suspended("a"), started("b"), suspended("b"),
                                            decided("a"), resuming("a"), completed("a")], "waiting",
     {"a": "succeeded", "b": "suspended"}),
    ("all decided and done", [started("a"), suspended("a"), decided("a"), resuming("a"), completed("a")],
     "running", {"a": "succeeded"}),
    ("failed call", [started("a"), completed("a", "failed")], "running", {"a": "failed"}),
    ("cancelled by decision", [started("a"), suspended("a"), decided("a", "cancel"),
                               completed("a", "cancelled")], "running", {"a": "cancelled"}),
    ("finished", [FINISHED], "done", {}),
    ("finished while suspended", [started("a"), suspended("a"), FINISHED], "done", {"a": "suspended"}),
    ("finished, then late event", [started("a"), FINISHED, completed("a")], "done", {"a": "succeeded"}),
    ("cancel requested still running", [started("a"), RunCancelRequested()], "running", {"a": "running"}),
    ("cancelled run", [started("a"), suspended("a"), RunCancelRequested(), completed("a", "cancelled"),
                       RunFinished(termination=Termination(type="cancelled"))], "done", {"a": "cancelled"}),
    # failed: the run ended in an error (a model's, a plugin's, a dead-lettered command's) or a block
    ("model error", [StepStarted(step=1), RunFinished(termination=Termination(
        type="error", code="model_rejected", detail="bad api key"))], "failed", {}),
    ("error while a call runs", [started("a"), RunFinished(termination=Termination(type="error"))], "failed",
     {"a": "running"}),
    ("blocked", [RunFinished(termination=Termination(type="blocked", detail="policy"))], "failed", {}),
    ("failed, then late event", [started("a"), RunFinished(termination=Termination(type="error")),
                                 completed("a")], "failed", {"a": "succeeded"}),
    ("stopped by a condition", [RunFinished(termination=Termination(type="stopped", code="max_rounds"))], "done", {}),
    ("a plugin ended it", [RunFinished(termination=Termination(type="behavior_requested"))], "done", {}),
]


@pytest.mark.parametrize(("case", "events", "status", "calls"), STATUS_TABLE, ids=[r[0] for r in STATUS_TABLE])
def test_run_status_table(case, events, status, calls):
    view = run_of([START, *events])
    assert view.status == status
    assert {c: v.status for c, v in view.calls.items()} == calls
    assert derive_status(view.calls, view.termination) == status


def test_call_details_are_recorded():
    view = run_of([START, ToolCallGated(call_id="a", verdict="ask", rule="rm*"), started("a"), suspended("a"),
                   decided("a"), resuming("a"), completed("a")])
    call = view.calls["a"]
    assert call == CallView(
        call_id="a", status="succeeded", name="tool", arguments={"c": "a"}, result={"c": "a"},
        ticket=SuspendTicket(id="ka"), decision=ToolCallDecision(target_id="a", decision_id="da", action="resume"),
        resume_mode="replay_tool_call", verdict="ask", rule="rm*", created=T0 + 2, updated=T0 + 7,
    )


def test_run_bookkeeping_and_usage():
    events = [
        RunStarted(run_id="r1", agent_id="a", parent_run_id="r0", parent_thread_id="t0", origin="api"),
        StepStarted(step=1),
        MessageAppended(message=Message(id="m1", role="assistant")),
        InferenceCompleted(model="m", usage=Usage(input_tokens=3, output_tokens=4)),
        StepFinished(step=1),
        StepStarted(step=2),
        InferenceCompleted(model="m", usage=Usage(input_tokens=1, output_tokens=1)),
    ]
    live = run_of(events)
    assert (live.agent_id, live.parent_run_id, live.parent_thread_id, live.origin) == ("a", "r0", "t0", "api")
    assert (live.steps, live.last_step, live.inferences, live.message_count) == (2, 2, 2, 1)
    assert live.usage == live.inference_usage == Usage(input_tokens=4, output_tokens=5)
    assert (live.created, live.updated, live.last_seq) == (T0 + 1, T0 + 7, 7)
    # RunFinished.usage, when given, is authoritative; the inference sum stays available.
    done = run_of([*events, RunFinished(termination=Termination(type="natural_end"), usage=Usage(input_tokens=10))])
    assert done.usage == Usage(input_tokens=10)
    assert done.inference_usage == Usage(input_tokens=4, output_tokens=5)
    assert done.termination == Termination(type="natural_end")
    # Without a figure in RunFinished, the sum is the total.
    assert run_of([*events, FINISHED]).usage == Usage(input_tokens=4, output_tokens=5)


def test_run_and_call_scope_state_are_cleared_at_their_end():
    view = run_of([
        START,
        StatePatched(ops=[{"op": "add", "path": "/r", "value": 1}], scope="run"),
        started("a"),
        StatePatched(ops=[{"op": "add", "path": "/c", "value": 2}], scope="tool_call", call_id="a"),
        StatePatched(ops=[{"op": "add", "path": "/t", "value": 3}], scope="thread"),  # not the run's
    ])
    assert view.state == {"r": 1}
    assert view.calls["a"].state == {"c": 2}
    after_call = fold_run(view, completed("a"), 6, T0 + 6)
    assert after_call.calls["a"].state == {}
    assert after_call.state == {"r": 1}
    assert view.calls["a"].state == {"c": 2}, "the input view must not change"
    after_run = fold_run(after_call, FINISHED, 7, T0 + 7)
    assert after_run.state == {}
    replaced = run_of([START, StateReplaced(state={"x": 1}, scope="run"),
                       StateReplaced(state={"y": 2}, scope="tool_call", call_id="b")])
    assert replaced.state == {"x": 1}
    assert replaced.calls["b"].state == {"y": 2}


def test_thread_fold():
    view = thread_of([
        (None, [ThreadCreated(resource_id="res", parent_thread_id="t0", metadata={"a": 1, "b": 2})]),
        (None, [ThreadMetadataUpdated(metadata={"a": None, "c": 3})]),
        ("r1", [RunStarted(run_id="r1", agent_id="x"), MessageAppended(message=Message(id="m", role="user")),
                StatePatched(ops=[{"op": "add", "path": "/k", "value": [1]}]),
                StatePatched(ops=[{"op": "add", "path": "/runonly", "value": 1}], scope="run")]),
        ("r1", [FINISHED]),
        ("r2", [RunStarted(run_id="r2", agent_id="x")]),
    ])
    assert view == ThreadView(
        thread_id="t1", resource_id="res", parent_thread_id="t0", metadata={"b": 2, "c": 3},
        created=T0 + 1, updated=T0 + 5, version=5, message_count=1, state={"k": [1]},
        run_ids=["r1", "r2"], active_run_id="r2", active_agent="x",
    )
    replaced = fold_thread(view, StateReplaced(state={"new": True}), 6, T0 + 6)
    assert replaced.state == {"new": True}
    deleted = fold_thread(replaced, ThreadDeleted(), 7, T0 + 7)
    assert deleted.deleted and not replaced.deleted


def test_thread_state_survives_runs_but_unapplicable_patches_are_skipped_and_counted():
    view = thread_of([
        ("r1", [RunStarted(run_id="r1", agent_id="x"), StatePatched(ops=[{"op": "add", "path": "/a", "value": 1}])]),
        ("r1", [FINISHED]),
        ("r2", [RunStarted(run_id="r2", agent_id="x"), StatePatched(ops=[{"op": "remove", "path": "/nope"}])]),
    ])
    assert view.state == {"a": 1}
    assert view.rejected_patches == 1


def test_fold_messages_is_pure():
    m1 = Message(id="1", role="user", content="hi")
    empty: list = []
    one = fold_messages(empty, MessageAppended(message=m1))
    assert one == [m1] and empty == []
    assert fold_messages(one, StepStarted(step=1)) is one


def test_views_round_trip_through_json():
    history = stored(generate_history(random.Random(7), threads=3))
    views = fold_commits(history)
    for view in views.threads.values():
        assert decode_thread(encode_view(view)) == view
    for run in views.runs.values():
        assert decode_run(encode_view(run)) == run
        msgspec.json.decode(encode_view(run))  # plain JSON


histories = st.randoms(use_true_random=False).map(lambda rng: stored(generate_history(rng, threads=3)))


def per_event_fold(commits: list[StoredCommit]):
    threads: dict[str, ThreadView] = {}
    runs: dict[str, RunView] = {}
    for sc in commits:
        c = sc.commit
        for event in c.events:
            t = threads.get(c.thread_id) or ThreadView(thread_id=c.thread_id)
            threads[c.thread_id] = fold_thread(t, event, sc.seq, c.ts, c.run_id)
            if c.run_id:
                r = runs.get(c.run_id) or RunView(run_id=c.run_id, thread_id=c.thread_id)
                runs[c.run_id] = fold_run(r, event, sc.seq, c.ts)
    return threads, runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_batch_fold_equals_per_event_fold(commits):
    snapshot = copy.deepcopy(commits)
    views = fold_commits(commits)
    threads, runs = per_event_fold(commits)
    assert views.threads == threads
    assert views.runs == runs
    assert commits == snapshot, "folding must not mutate the events"
    for run in views.runs.values():
        assert run.status == derive_status(run.calls, run.termination)
        if run.status == "done":
            assert run.state == {}
        for call in run.calls.values():
            if call.status in ("succeeded", "failed", "cancelled"):
                assert call.state == {}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_any_batching_and_redelivery_gives_the_same_views(commits, data):
    """Apply-once: replaying any earlier commits again (a redelivery) and freezing/thawing between
    arbitrary batches (a restart) changes nothing."""
    expected = fold_commits(commits)
    threads: dict = {}
    runs: dict = {}
    i = 0
    while i < len(commits):
        step = data.draw(st.integers(1, 8))
        back = data.draw(st.integers(0, min(i, 5)))
        batch = commits[i - back : i + step]  # `back` already-applied commits come again
        views = fold_commits(batch, threads, runs)
        threads, runs = views.threads, views.runs
        i += step
    assert threads == expected.threads
    assert runs == expected.runs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_the_view_encoder_writes_the_bytes_of_encode_view(commits, data):
    """A `ViewEncoder` that writes the views after every batch (as the runner does, reusing the
    encodings of the calls that did not change, dropping runs past its capacity) writes the same
    bytes as encoding each view whole."""
    encoder = ViewEncoder(capacity=data.draw(st.sampled_from([0, 400, 1 << 20])), min_calls=data.draw(st.integers(0, 3)))
    threads: dict = {}
    runs: dict = {}
    i = 0
    while i < len(commits):
        step = data.draw(st.integers(1, 8))
        views = fold_commits(commits[i : i + step], threads, runs)
        threads, runs = views.threads, views.runs
        for view in [*views.threads.values(), *views.runs.values()]:
            assert encoder.encode(view) == encode_view(view)
        i += step
    assert encoder.size <= encoder.capacity


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_a_fitted_run_view_leaves_out_only_its_oldest_finished_calls(commits, data):
    """`ViewEncoder.fit` under any byte limit: a view within it is returned as it is; else the
    oldest finished calls go (counted in `calls_elided`), as few as it takes to fit, and nothing
    else changes; only when all of them are not enough, the state goes too (`state_elided`),
    and then as few calls as the view without its state needs. Live calls always stay."""
    encoder = ViewEncoder(min_calls=data.draw(st.integers(0, 3)))
    for view in fold_commits(commits).runs.values():
        fitted, limit = _fitted_under_a_limit(encoder.fit, view, data, 3)
        if fitted is view:
            continue
        finished = [c for c, call in view.calls.items() if call.status in TERMINAL_CALL_STATUSES]
        dropped = [c for c in view.calls if c not in fitted.calls]
        assert dropped == finished[: len(dropped)] and fitted.calls_elided == view.calls_elided + len(dropped)
        assert all(fitted.calls[c] is view.calls[c] for c in fitted.calls)
        base = view
        if fitted.state_elided and not view.state_elided:
            assert fitted.state == {}
            everything = {c: v for c, v in view.calls.items() if c not in finished}
            assert len(encode_view(msgspec.structs.replace(
                view, calls=everything, calls_elided=view.calls_elided + len(finished)))) > limit  # not enough
            base = msgspec.structs.replace(view, state={}, state_elided=True)
        assert msgspec.structs.replace(fitted, calls=view.calls, calls_elided=view.calls_elided) == base
        assert len(encode_view(fitted)) <= limit or dropped == finished
        if dropped and len(encode_view(fitted)) <= limit:  # as few as it takes
            fewer = {c: v for c, v in base.calls.items() if c not in dropped[:-1]}
            fewer_view = msgspec.structs.replace(base, calls=fewer, calls_elided=view.calls_elided + len(dropped) - 1)
            assert len(encode_view(fewer_view)) > limit


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, st.data())
def test_a_fitted_thread_view_leaves_out_its_state_only_when_over(commits, data):
    encoder = ViewEncoder()
    for view in fold_commits(commits).threads.values():
        fitted, _ = _fitted_under_a_limit(encoder.fit_thread, view, data, 2)
        assert fitted is view or fitted == msgspec.structs.replace(view, state={}, state_elided=True)


def _fitted_under_a_limit(fit, view, data, shrink):
    """`fit(view, limit)` under a drawn limit from a `shrink`th of the view's size to above it:
    (the fitted view, the limit). A view within the limit comes back as it is; the fitted view's
    bytes from the encoder that fitted it are those of `encode_view`."""
    size = len(encode_view(view))
    limit = data.draw(st.integers(size // shrink, size + 10))
    fitted = fit(view, limit)
    assert fit.__self__.encode(fitted) == encode_view(fitted)
    assert (fitted is view) == (size <= limit)
    return fitted, limit


def test_a_view_without_its_state_folds_no_patch_until_the_state_is_set_whole():
    """Patches onto a state the view left out would make a wrong state and count rejects that
    did not happen: they are skipped; a `StateReplaced` makes the state whole again, and a run's
    end clears it (the run scope ends)."""
    patch = [{"op": "replace", "path": "/a", "value": 2}]  # a replace needs /a: {} would reject it
    history = stored([
        Commit(commit_id="c1", thread_id="t1", run_id="r1", ts=T0, events=[
            ThreadCreated(), RunStarted(run_id="r1", agent_id="a")]),
        Commit(commit_id="c2", thread_id="t1", run_id="r1", ts=T0, events=[
            StatePatched(scope="thread", ops=patch), StatePatched(scope="run", ops=patch)]),
    ])
    thread = ThreadView(thread_id="t1", state_elided=True, version=0)
    run = RunView(run_id="r1", thread_id="t1", state_elided=True)
    views = fold_commits(history, {"t1": thread}, {"r1": run})
    for view in (views.threads["t1"], views.runs["r1"]):
        assert view.state == {} and view.state_elided and view.rejected_patches == 0
    more = stored([Commit(commit_id="c3", thread_id="t1", run_id="r1", ts=T0, events=[
        StateReplaced(scope="thread", state={"a": 1}), StateReplaced(scope="run", state={"a": 1}),
        StatePatched(scope="thread", ops=patch)])], first_seq=3)
    views = fold_commits(more, views.threads, views.runs)
    assert views.threads["t1"].state == {"a": 2} and not views.threads["t1"].state_elided
    assert views.runs["r1"].state == {"a": 1} and not views.runs["r1"].state_elided
    ended = stored([Commit(commit_id="c4", thread_id="t1", run_id="r1", ts=T0, events=[
        RunFinished(termination=Termination(type="natural_end"))])], first_seq=4)
    run_done = fold_commits(ended, {}, {"r1": run}).runs["r1"]
    assert run_done.state == {} and not run_done.state_elided


def test_folder_touched_sets():
    commits = stored([
        Commit(commit_id="c1", thread_id="t1", ts=T0, events=[ThreadCreated()]),
        Commit(commit_id="c2", thread_id="t1", run_id="r1", ts=T0, events=[RunStarted(run_id="r1", agent_id="a")]),
    ])
    folder = Folder()
    for sc in commits:
        folder.apply(sc)
    touched = folder.take_touched()
    assert set(touched.threads) == {"t1"} and set(touched.runs) == {"r1"}
    folder.apply(commits[1])  # already applied: skipped
    assert folder.take_touched() == ({}, {})
