"""Run-context snapshots are a cache derived by the same fold, and the run view is kept
incrementally: pure unit tests, no store.

- property: for generated thread histories and any cut point, decode(encode(snapshot of the
  fold of the prefix)) + fold(rest) == fold(all), for the loop context and the run view;
- the run fold keeps its status in O(1) per event, not by inspecting every call on each call event;
- `RunHandle` folds each commit once, however often `view()` / `result()` are asked; resumed
  from a snapshot, it decodes the finished calls' views only when the whole view is read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

import agentlog.projections.fold as fold_mod
import agentlog.runtime.snapshots.format as snapshot_format
from agentlog.eventlog.events import (
    ActionScheduled,
    CircuitBreakerChanged,
    Commit,
    ContextMessageSet,
    EffectEmitted,
    InferenceCompleted,
    InputFiltered,
    Message,
    MessageAppended,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    ScheduledActionsRan,
    StateCleared,
    StatePatched,
    StateReplaced,
    StateWritten,
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
from agentlog.projections.fold import RunFolder, fold_commits
from agentlog.projections.views import CallView, RunView
from agentlog.runtime import RunHandle
from agentlog.runtime.loop.run_context import RunContext, fold_context
from agentlog.runtime.snapshots.format import (
    ChunkCache,
    RunSnapshot,
    chunk_key,
    chunk_keys,
    chunk_spans,
    decode_chunk,
    decode_snapshot,
    encode_snapshot,
    make_snapshot,
)
from agentlog.runtime.snapshots.store import MemorySnapshotStore, load_chunks

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
    # typed state: writes of each scope (ops that always apply) and their cleanup
    st.builds(lambda scope, key, n, c, transient: StateWritten(
        key=key, ops=[{"op": "increment", "path": f"/{key}", "value": n}] if key != "k3"
        else [{"op": "lattice", "path": "/k3", "kind": "g_set", "value": [n]}],
        scope=scope, call_id=c if scope == "tool_call" else None, transient=transient and scope == "thread"),
        st.sampled_from(["thread", "run", "tool_call"]), st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 5), _call,
        st.booleans()),
    st.builds(lambda scope, keys, c: StateCleared(scope=scope, keys=keys, call_id=c if scope == "tool_call" else None),
              st.sampled_from(["thread", "run", "tool_call"]), st.lists(st.sampled_from(["k1", "k2", "k3"]), max_size=2),
              _call),
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
    # the plugin model's run-scoped state: context messages (their showings fold at inferences),
    # actions scheduled for later phases, input warnings; breaker changes and effects fold to nothing
    st.builds(lambda k, text, persistent, cooldown: ContextMessageSet(key=k, text=text, persistent=persistent,
                                                                      cooldown=cooldown),
              st.sampled_from(["k1", "k2"]), st.sampled_from([None, "a", "b"]), st.booleans(), st.integers(0, 2)),
    st.builds(lambda phase, n: ActionScheduled(key="act", phase=phase, payload=n),
              st.sampled_from(["step_start", "before_inference"]), st.integers(0, 3)),
    st.builds(lambda phase: ScheduledActionsRan(phase=phase, count=1), st.sampled_from(["step_start", "before_inference"])),
    st.builds(lambda v, why: InputFiltered(verdict=v, reason=why), st.sampled_from(["warn", "reject"]),
              st.sampled_from(["w1", "w2"])),
    st.builds(lambda state: CircuitBreakerChanged(model="m", state=state, failures=2),
              st.sampled_from(["open", "half_open", "closed"])),
    st.builds(lambda n: EffectEmitted(key="fx", payload=n), st.integers(0, 3)),
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


def _round_trip(entry: RunSnapshot, chunks: dict[str, bytes], cache: ChunkCache) -> Any:
    """What a resume in another process does: decode the stored entry, read the chunks it
    names that `cache` does not hold from the store (`load_chunks`: bytes checked against their
    digests, messages decoded, call views only when the run view is asked for), join them."""
    restored = decode_snapshot(encode_snapshot(entry))
    assert restored is not None and restored == entry
    store = MemorySnapshotStore()
    keys = chunk_keys(entry)
    store.entries = {keys[d]: data for d, data in chunks.items() if d in keys}
    loaded = asyncio.run(load_chunks(store, restored, cache))
    assert loaded is not None
    return loaded


@given(st.lists(_commit, max_size=12), st.data())
def test_snapshot_of_a_prefix_plus_the_rest_folds_to_the_whole(raw: list[Any], data: st.DataObject) -> None:
    """For any cut and chunk size, read cold (chunks decoded from their bytes) or warm (from the
    process cache): snapshot(prefix) + fold(rest) == fold(all), context and run view."""
    history = _history(raw)
    cut = data.draw(st.integers(1, len(history)))
    chunk_size = data.draw(st.integers(1, 4))
    # the byte budget: large (count alone cuts), or small enough to cut spans into pieces and
    # to push the entry's rest into chunks
    max_bytes = data.draw(st.sampled_from([1 << 20, 400, 120]))
    warm = data.draw(st.booleans())
    prefix, rest = history[:cut], history[cut:]

    whole_ctx = fold_context(RunContext(thread_id=THREAD, run_id=RUN), history)
    whole_run = fold_commits(history).runs[RUN]

    run_prefix = [sc for sc in prefix if sc.commit.run_id == RUN]
    writer_cache = ChunkCache()
    prefix_ctx = fold_context(RunContext(thread_id=THREAD, run_id=RUN), prefix)
    entry, chunks = make_snapshot(seq=prefix[-1].seq, agent_id="a", ctx=prefix_ctx,
                                  run=fold_commits(run_prefix).runs[RUN], chunk_size=chunk_size, cache=writer_cache,
                                  max_bytes=max_bytes)
    assert set(chunks) == set(entry.chunks)  # nothing known yet: every chunk is to be written
    assert len(entry.ctx.messages) < chunk_size  # only the unchunked rest is in the entry
    for digest, raw in chunks.items():  # within the budget, or one item alone
        assert len(raw) <= max_bytes or len(decode_chunk(b"m", digest, raw) or decode_chunk(b"c", digest, raw) or ()) == 1
    if len(encode_snapshot(entry)) > max_bytes:  # too large even so: no message left to move out
        assert not entry.ctx.messages
    loaded = _round_trip(entry, chunks, writer_cache if warm else ChunkCache())
    assert loaded.ctx == prefix_ctx
    # what `decide` checks decisions against, read without decoding the views
    known = set(fold_commits(run_prefix).runs[RUN].calls) | {c.id for c in prefix_ctx.step_tool_calls}
    assert set(loaded.call_ids) == known

    assert fold_context(loaded.ctx, rest) == whole_ctx
    folder = RunFolder(loaded.run_view())
    for sc in rest:
        if sc.commit.run_id == RUN:
            folder.apply(sc)
    assert folder.view() == whole_run
    assert set(loaded.call_ids) == known  # the same once the views are decoded

    # a handle resumed from it (read cold): folds the rest on the view without the chunked
    # finished calls, knows the status without decoding them, and joins them (folding again
    # if a commit touched one) only for the whole view
    cold = _round_trip(entry, chunks, ChunkCache())
    handle = RunHandle(RUN, THREAD, "a", base=cold.tail_view(), finished=cold if cold.has_finished_calls else None,
                       base_seq=prefix[-1].seq)
    for sc in rest:
        if sc.commit.run_id == RUN:
            handle.on_commit(sc)
    assert handle.status == whole_run.status
    assert cold._finished is None  # nothing decoded the finished calls' views yet
    assert handle.view() == whole_run

    # the next snapshot of the resumed run: the same chunks stay (not written again), the
    # messages and finished calls since then fill new ones
    again, new = make_snapshot(seq=history[-1].seq, agent_id="a", ctx=loaded.ctx, run=folder.view(),
                               known=loaded.chunks, chunk_size=chunk_size, cache=writer_cache, max_bytes=max_bytes)
    assert not set(new) & loaded.chunks.keys()  # what the store has is not written again
    final = _round_trip(again, {**chunks, **new}, ChunkCache())
    assert final.ctx == whole_ctx and final.run_view() == whole_run


@given(st.integers(0, 2000), st.integers(0, 2000), st.integers(1, 8), st.integers(2, 5), st.integers(0, 4))
def test_chunk_spans_are_immutable_and_few(n: int, more: int, size: int, fanout: int, levels: int) -> None:
    """Spans tile the full chunks of the prefix, each aligned to its size, at most fanout - 1
    of a size below the largest allowed; growing the prefix only merges whole spans (a written
    chunk never changes)."""
    top = size * fanout**levels
    spans = chunk_spans(n, size, fanout, top)
    assert [s for s, _ in spans] == [0, *(e for _, e in spans)][: len(spans)]
    assert (spans[-1][1] if spans else 0) == n - n % size
    for start, end in spans:
        assert start % (end - start) == 0 and (end - start) // size in {fanout ** k for k in range(12)}
    lengths = [e - s for s, e in spans]
    assert max(lengths, default=0) <= top
    assert all(lengths.count(x) < fanout for x in set(lengths) if x < top)
    later = chunk_spans(n + more, size, fanout, top)
    assert all(any(s2 <= s and e <= e2 for s2, e2 in later) for s, e in spans)


def test_chunks_whose_bytes_do_not_match_their_digest_are_a_miss() -> None:
    ctx = RunContext(thread_id=THREAD, run_id=RUN, messages=[Message(id=f"m{i}", role="user", content="x")
                                                             for i in range(5)])
    entry, chunks = make_snapshot(seq=3, agent_id="a", ctx=ctx, run=RunView(run_id=RUN, thread_id=THREAD),
                                  chunk_size=2, cache=ChunkCache())
    assert len(entry.message_chunks) == 2 and [m.id for m in entry.ctx.messages] == ["m4"]
    first, second = entry.message_chunks
    assert decode_chunk(b"m", first, chunks[second]) is None  # another chunk's bytes
    assert decode_chunk(b"c", first, chunks[first]) is None  # right bytes, other kind
    assert decode_chunk(b"m", first, b"\xc1") is None
    assert [m.id for m in decode_chunk(b"m", first, chunks[first])] == ["m0", "m1"]
    assert chunk_key(THREAD, first) == f"c.{THREAD}.m.{first}"  # a thread's message chunks, by digest
    assert chunk_key(THREAD, first, RUN) == f"c.{THREAD}.c.{RUN}.{first}"  # a run's call chunks


def test_a_call_chunk_is_checked_when_read_though_its_views_are_decoded_later() -> None:
    """The finished calls' chunks are not decoded on a resume (only their call ids are read),
    but their bytes are checked against their digests at once: a bad one is a miss there and
    then, never a surprise when the run view is asked for."""
    calls = {f"c{i}": CallView(call_id=f"c{i}", status="succeeded", name="tool") for i in range(5)}
    entry, chunks = make_snapshot(seq=3, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN),
                                  run=RunView(run_id=RUN, thread_id=THREAD, calls=calls), chunk_size=2,
                                  cache=ChunkCache())
    assert len(entry.call_chunks) == 2
    store = MemorySnapshotStore()
    store.entries = {chunk_keys(entry)[d]: data for d, data in chunks.items()}
    loaded = asyncio.run(load_chunks(store, entry, ChunkCache()))
    assert loaded is not None and loaded.call_ids == list(calls)
    assert loaded.run_view().calls == calls
    first = entry.call_chunks[0]
    store.entries[chunk_keys(entry)[first]] = chunks[first][:-1] + bytes([chunks[first][-1] ^ 1])
    assert asyncio.run(load_chunks(store, entry, ChunkCache())) is None


def test_decide_reads_the_snapshots_call_ids_only_for_a_decision_whose_call_is_not_suspended(
        monkeypatch: Any) -> None:
    """`check_decisions` reads the run's known call ids only to tell `UnknownCall` from
    `CallNotSuspended`; a decision for a suspended call does not make a resume read them out of
    the call chunks, one for another call gets them all (chunked ones included)."""
    from agentlog.runtime.facade import Runtime, _Loaded

    calls = {f"c{i}": CallView(call_id=f"c{i}", status="succeeded", name="tool") for i in range(4)}
    ctx = RunContext(thread_id=THREAD, run_id=RUN, suspended={"s": SuspendTicket(id="t-s")})
    entry, chunks = make_snapshot(seq=3, agent_id="a", ctx=ctx, run=RunView(run_id=RUN, thread_id=THREAD, calls={
        **calls, "s": CallView(call_id="s", status="suspended")}), chunk_size=2, cache=ChunkCache())
    assert len(entry.call_chunks) == 2
    store = MemorySnapshotStore()
    store.entries = {chunk_keys(entry)[d]: data for d, data in chunks.items()}
    loaded = asyncio.run(load_chunks(store, entry, ChunkCache()))
    assert loaded is not None
    snap = _Loaded(THREAD, None, loaded.ctx, 3, [], snapshot=loaded)  # type: ignore[arg-type]
    decision = lambda target: ToolCallDecision(target_id=target, decision_id="d", action="resume")  # noqa: E731
    assert Runtime._known_calls(snap, [decision("c1")]) == {*calls, "s"}
    monkeypatch.setattr(snapshot_format, "_call_ids_decoder", None)  # reading the ids now would fail
    assert Runtime._known_calls(snap, [decision("s")]) == set()


def test_a_chunk_that_matches_its_digest_but_does_not_decode_is_a_miss() -> None:
    """Only a bug can name undecodable bytes by their digest (the digest covers the shapes that
    wrote them); should it happen, the resume misses and folds the log instead of failing."""
    ctx = RunContext(thread_id=THREAD, run_id=RUN, messages=[Message(id=f"m{i}", role="user") for i in range(3)])
    entry, chunks = make_snapshot(seq=3, agent_id="a", ctx=ctx, run=RunView(run_id=RUN, thread_id=THREAD),
                                  chunk_size=2, cache=ChunkCache())
    bad = b"\xc1"  # never valid MessagePack
    forged = msgspec.structs.replace(entry, message_chunks=[snapshot_format.chunk_digest(snapshot_format.MESSAGES_KIND, bad)])
    store = MemorySnapshotStore()
    store.entries = {chunk_key(THREAD, forged.message_chunks[0]): bad}
    assert asyncio.run(load_chunks(store, forged, ChunkCache())) is None


@given(st.lists(_commit, max_size=12))
def test_incremental_run_view_equals_the_fold_after_every_commit(raw: list[Any]) -> None:
    history = [sc for sc in _history(raw) if sc.commit.run_id == RUN]
    folder = RunFolder(RunView(run_id=RUN, thread_id=THREAD))
    for i, sc in enumerate(history):
        folder.apply(sc)
        want = fold_commits(history[: i + 1]).runs[RUN]
        assert folder.view() == want
        assert want.status == fold_mod.derive_status(want.calls, want.termination)


def test_unusable_snapshot_bytes_are_a_miss() -> None:
    snap, _ = make_snapshot(seq=3, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN),
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

    def counting(calls: Any, termination: Any) -> Any:
        nonlocal inspected
        inspected += len(calls)
        return real(calls, termination)

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
        handle.on_commit(sc)
        views.append(handle.view())
    views += [handle.view(), handle.view()]
    assert applied == events
    monkeypatch.setattr(fold_mod._RunAcc, "apply", real)
    assert views[-1] == fold_commits(commits).runs[RUN]
    assert views[0] == fold_commits(commits[:1]).runs[RUN]  # an earlier view is not changed later


def test_chunk_cache_evicts_least_recently_used_past_its_size_and_matches_by_identity() -> None:
    cache = ChunkCache(capacity=100)
    a, b, c = ([Message(id=f"{k}{i}", role="user") for i in range(3)] for k in "abc")
    cache.put("da", tuple(a), 40)
    cache.put("db", tuple(b), 40)
    assert cache.get("da") is not None  # a is now the most recently used
    cache.put("dc", tuple(c), 40)  # 120 > 100: b goes
    assert (cache.get("db"), len(cache), cache.size) == (None, 2, 80)
    assert cache.digest_of(a) == "da"  # the very objects of a cached chunk
    assert cache.digest_of([Message(id=m.id, role="user") for m in a]) is None  # equal, not the same
    assert cache.digest_of(b) is None  # evicted


def test_a_resumed_runs_next_snapshot_finds_its_call_chunks_by_the_views_not_the_pairs() -> None:
    """A call chunk holds `(call_id, CallView)` pairs; the run view of the next snapshot is a new
    dict whose `items()` are new pairs around the same views. The cache knows them as the
    chunk it wrote (so the writer neither encodes nor hashes them again); a pair around an equal
    but new view, or the same view under another key, is not the same item."""
    history = [StoredCommit(1, Commit(commit_id="c0", thread_id=THREAD, run_id=RUN, ts=1,
                                      events=[ThreadCreated(), RunStarted(run_id=RUN, agent_id="a")]))]
    for i in range(2, 10):
        history.append(StoredCommit(i, Commit(commit_id=f"c{i}", thread_id=THREAD, run_id=RUN, ts=i, events=[
            ToolCallStarted(call_id=f"k{i}", name="tool", arguments={"i": i}),
            ToolCallCompleted(call_id=f"k{i}", outcome="succeeded", result=i, message_id=f"m{i}")])))
    run = fold_commits(history).runs[RUN]
    cache = ChunkCache()
    entry, _ = make_snapshot(seq=9, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN), run=run,
                             chunk_size=4, cache=cache)
    assert len(entry.call_chunks) == 2
    resumed = msgspec.structs.replace(run, calls=dict(run.calls))  # same views, new dict and pairs
    first = list(resumed.calls.items())[:4]
    assert cache.digest_of(first) == entry.call_chunks[0]
    assert cache.digest_of([(k, msgspec.structs.replace(v)) for k, v in first]) is None  # equal, not the same
    assert cache.digest_of([("other", first[0][1]), *first[1:]]) is None
    again, new = make_snapshot(seq=9, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN), run=resumed,
                               known=entry.chunks, chunk_size=4, cache=cache)
    assert again == entry and new == {}


def test_a_resumed_handle_joins_a_finished_call_a_later_commit_touched() -> None:
    """The handle folds the commits after its snapshot on the view without the chunked finished
    calls; a commit that touches one of them starts a call the folded view lacks. The status is
    right without them, and the whole view folds again with the finished call found, so the call
    keeps its fields and its place: equal to the fold of the whole log, at every step."""
    def commit(seq: int, *events: Any) -> StoredCommit:
        return StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id=THREAD, run_id=RUN, ts=seq, events=list(events)))

    history = [commit(1, ThreadCreated(), RunStarted(run_id=RUN, agent_id="a"))]
    for i, call in enumerate(("c1", "c2", "c3"), start=2):
        history.append(commit(i, ToolCallStarted(call_id=call, name="tool", arguments={"i": i}),
                              ToolCallCompleted(call_id=call, outcome="succeeded", result=i, message_id=f"m{i}")))
    prefix_view = fold_commits(history).runs[RUN]
    entry, chunks = make_snapshot(seq=4, agent_id="a", ctx=RunContext(thread_id=THREAD, run_id=RUN), run=prefix_view,
                                  chunk_size=2, cache=ChunkCache())
    assert len(entry.call_chunks) == 1  # c1, c2 in a chunk; c3 in the entry
    later = [
        commit(5, StatePatched(scope="tool_call", call_id="c1", ops=[{"op": "add", "path": "/k", "value": 1}])),
        commit(6, ToolCallStarted(call_id="c4", name="tool", arguments={}), ToolCallSuspended(
            call_id="c4", ticket=SuspendTicket(id="t4"))),
        commit(7, ToolCallGated(call_id="c2", verdict="ask")),
    ]
    loaded = _round_trip(entry, chunks, ChunkCache())
    handle = RunHandle(RUN, THREAD, "a", base=loaded.tail_view(), finished=loaded, base_seq=4)
    as_of: list[Any] = []
    for n, sc in enumerate(later, start=1):
        handle.on_commit(sc)
        as_of.append((handle.view_as_of(), fold_commits(history + later[:n]).runs[RUN]))
        assert handle.status == as_of[-1][1].status
    assert loaded._finished is None  # the status never needed the finished calls
    for view_of, expected in as_of:  # each as of its own commit, built after all of them
        assert view_of() == expected
    whole = handle.view()
    assert list(whole.calls) == ["c1", "c2", "c3", "c4"] and whole.status == "waiting"
    assert whole.calls["c1"].result == 2 and whole.calls["c1"].state == {"k": 1}
    assert whole.calls["c2"].verdict == "ask" and whole.calls["c2"].name == "tool"
