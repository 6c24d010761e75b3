"""Recorded runs outside the log (agentlog.runtime.replay.recorded, agentlog.eventlog.recording,
agentlog.testing.recorded), without a deployment: the file format's round trip and refusals
(hypothesis, on synthetic histories in the in-memory store), which runs an export takes, an
import's idempotence and its refusal of a thread with other content, every run of a recording
verified from memory, large payloads inline on a real nats-server, and the pytest helper.

What touches a deployment (export from a deployed log, import into one, verify over a live log)
is in tests/e2e/test_recorded_deployed.py; the CLI in tests/cli/test_cli_export.py.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
    SCHEMA_VERSION,
    Commit,
    MessageAppended,
    RunStarted,
    StatePatched,
    StoredCommit,
    ThreadCreated,
    ToolCallCompleted,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.eventlog.recording import (
    FORMAT_VERSION,
    CorruptRecording,
    Recording,
    UnsupportedRecording,
    encode_recording,
    read_recording,
)
from agentlog.projections.views import RunView
from agentlog.runtime import AgentSpec, App, DeterministicEntropy, Runtime, tool
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.recorded import (
    RunSelection,
    ThreadConflict,
    export_runs,
    import_runs,
    select_runs,
    verify_all,
)
from agentlog.testing import assert_recorded_runs_verify, verify_recorded_runs
from agentlog.testing.synth import generate_history, stored

from tests.apps import replay_app, subagents_app

HISTORIES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _log_of(history: list[StoredCommit]) -> MemoryEventStore:
    store = MemoryEventStore()
    for sc in history:
        await store.append(sc.commit, None)
    return store


async def _recording_of(seed: int, threads: int, pick: float = 1.0) -> tuple[MemoryEventStore, Recording]:
    """A synthetic log and the export of its runs (all, or a random share of them)."""
    rng = random.Random(seed)
    history = stored(generate_history(rng, threads=threads))
    store = await _log_of(history)
    run_ids = sorted({sc.commit.run_id for sc in history if sc.commit.run_id is not None})
    chosen = tuple(r for r in run_ids if rng.random() < pick) if pick < 1.0 else ()
    if pick < 1.0 and not chosen and run_ids:
        chosen = (run_ids[0],)
    return store, await export_runs(store, RunSelection(run_ids=chosen), created_at=1)


# -- the file format: round trip ------------------------------------------------------------------


@HISTORIES
@given(seed=st.integers(0, 2**32 - 1), threads=st.integers(1, 4), pick=st.sampled_from([1.0, 0.5]))
def test_export_runs_import_runs_export_runs_gives_the_same_commits(seed: int, threads: int, pick: float) -> None:
    async def go() -> None:
        _source, first = await _recording_of(seed, threads, pick)
        data = encode_recording(first.header, first.commits)
        assert read_recording(data) == first  # the file reads back as written
        target = MemoryEventStore()
        report = await import_runs(target, read_recording(data))
        assert report.written == len(first.commits) and report.present == 0
        again_selected = RunSelection(run_ids=tuple(first.header.filters.get("runs", ())))  # type: ignore[arg-type]
        second = await export_runs(target, again_selected, created_at=1)
        assert second.header == first.header
        assert [sc.commit for sc in second.commits] == [sc.commit for sc in first.commits]
        # the same file again: nothing new
        again = await import_runs(target, read_recording(data))
        assert (again.written, again.present) == (0, len(first.commits))
        assert await target.last_seq() == len(first.commits)

    run(go())


@HISTORIES
@given(seed=st.integers(0, 2**32 - 1))
def test_export_runs_of_a_whole_log_imported_into_an_empty_one_keeps_the_sequences(seed: int) -> None:
    """Commits are appended in the file's order, so a log of runs only (no thread commit after a
    run's end) comes back with the same sequences: the same file, byte for byte."""
    async def go() -> None:
        history = [sc for sc in stored(generate_history(random.Random(seed), threads=3))]
        ends: dict[str, int] = {}
        for sc in history:
            if sc.commit.run_id is not None:
                ends[sc.commit.thread_id] = sc.seq
        history = stored([sc.commit for sc in history if sc.seq <= ends.get(sc.commit.thread_id, 0)])
        first = await export_runs(await _log_of(history), RunSelection(), created_at=1)
        target = MemoryEventStore()
        await import_runs(target, first)
        second = await export_runs(target, RunSelection(), created_at=1)
        assert encode_recording(second.header, second.commits) == encode_recording(first.header, first.commits)

    run(go())


# -- the file format: refusals (typed, nothing written) -------------------------------------------


async def _load_into_empty(data: bytes) -> MemoryEventStore:
    target = MemoryEventStore()
    try:
        await import_runs(target, read_recording(data))
    finally:
        assert await target.last_seq() == 0  # refused before anything was written
    return target


@HISTORIES
@given(seed=st.integers(0, 2**32 - 1), newer=st.integers(1, 1000),
       where=st.sampled_from(["format_version", "schema_version", "commit"]))
def test_import_runs_refuses_a_newer_version_and_writes_nothing(seed: int, newer: int, where: str) -> None:
    _store, rec = run(_recording_of(seed, 2))
    lines = encode_recording(rec.header, rec.commits).splitlines()
    if where == "commit" and len(lines) > 1:
        i = 1 + seed % (len(lines) - 1)
        doc = msgspec.json.decode(lines[i])
        doc["commit"]["v"] = SCHEMA_VERSION + newer
        lines[i] = msgspec.json.encode(doc)
    else:
        i = 0
        field = where if where != "commit" else "schema_version"
        header = msgspec.json.decode(lines[0])
        header[field] = (FORMAT_VERSION if field == "format_version" else SCHEMA_VERSION) + newer
        lines[0] = msgspec.json.encode(header)
    with pytest.raises(UnsupportedRecording) as err:
        run(_load_into_empty(b"\n".join(lines)))
    assert err.value.line == i + 1 and err.value.code == "recording_unsupported"
    assert "upgrade agentlog" in str(err.value)


def _corrupt(lines: list[bytes], i: int, how: str, cut: int) -> tuple[list[bytes], int | None]:
    """`lines` with line `i` corrupted `how`; the 1-based line the error must name (None: any)."""
    out = list(lines)
    if how == "truncate":
        out[i] = out[i][: 1 + cut % (len(out[i]) - 1)]
    elif how == "not_an_object":
        out[i] = b"[1, 2]"
    elif how == "garbage":
        out[i] = b"\x00\xffnot json"
    elif how == "empty_commit" and i > 0:
        doc = msgspec.json.decode(out[i])
        doc["commit"]["events"] = []
        out[i] = msgspec.json.encode(doc)
    elif how == "bad_id" and i > 0:
        doc = msgspec.json.decode(out[i])
        doc["commit"]["thread_id"] = "no spaces allowed"
        out[i] = msgspec.json.encode(doc)
    elif how == "duplicate" and i > 0:
        out.insert(i + 1, out[i])
        return out, i + 2
    elif how == "drop" and i > 0:
        del out[i]
        return out, None
    else:
        out[i] = out[i][:-1]
    return out, i + 1


@HISTORIES
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 10_000),
       how=st.sampled_from(["truncate", "not_an_object", "garbage", "empty_commit", "bad_id", "duplicate", "drop"]))
def test_import_runs_refuses_a_corrupt_line_and_writes_nothing(seed: int, cut: int, how: str) -> None:
    _store, rec = run(_recording_of(seed, 2))
    lines = encode_recording(rec.header, rec.commits).splitlines()
    i = seed % len(lines)
    bad, line = _corrupt(lines, i, how, cut)
    with pytest.raises(CorruptRecording) as err:
        run(_load_into_empty(b"\n".join(bad)))
    assert err.value.code == "recording_corrupt"
    if line is not None:
        assert err.value.line == line, str(err.value)


def test_import_runs_refuses_a_file_that_is_not_a_recording() -> None:
    for data, why in ((b"", "empty file"), (b'{"hello": 1}\n', "not an agentlog recording"),
                      (b'{"seq": 1, "commit": {}}\n', "not an agentlog recording")):
        with pytest.raises(CorruptRecording, match=why):
            run(_load_into_empty(data))


# -- import: a thread that exists ----------------------------------------------------------------


def test_import_runs_refuses_a_thread_with_other_content_and_writes_nothing() -> None:
    async def go() -> None:
        _store, rec = await _recording_of(7, 3)
        threads = list(rec.threads())
        target = MemoryEventStore()
        # the log already has the recording's second thread, made by someone else
        other = Commit(commit_id="other1", thread_id=threads[1], ts=1, events=[ThreadCreated()])
        await target.append(other, 0)
        with pytest.raises(ThreadConflict) as err:
            await import_runs(target, rec)
        assert err.value.thread_id == threads[1] and err.value.code == "import_conflict"
        assert "other1" in str(err.value) and "nothing was imported" in str(err.value)
        assert await target.last_seq() == 1  # not even the first thread was written

    run(go())


def test_import_runs_appends_only_what_a_thread_lacks() -> None:
    async def go() -> None:
        _store, rec = await _recording_of(11, 2)
        target = MemoryEventStore()
        half = Recording(rec.header, rec.commits[: len(rec.commits) // 2])
        for sc in half.commits:
            await target.append(sc.commit, None)
        report = await import_runs(target, rec)
        assert (report.present, report.written) == (len(half.commits), len(rec.commits) - len(half.commits))
        imported = sorted([sc for t in rec.threads() async for sc in target.read_thread(t)], key=lambda sc: sc.seq)
        assert [sc.commit for sc in imported] == [sc.commit for sc in rec.commits]

    run(go())


# -- which runs an export takes -------------------------------------------------------------------


def _view(run_id: str, *, agent: str = "a", status: Any = "done", created: int = 0, parent: str | None = None,
          thread: str | None = None) -> RunView:
    return RunView(run_id=run_id, thread_id=thread or f"t-{run_id}", agent_id=agent, status=status, created=created,
                   parent_run_id=parent)


def test_export_runs_selection_filters_and_takes_sub_agents_and_parents() -> None:
    views = {v.run_id: v for v in (
        _view("r1", agent="a", created=10), _view("r2", agent="b", status="waiting", created=20),
        _view("c1", agent="helper", created=11, parent="r1"), _view("g1", agent="helper", created=12, parent="c1"),
        _view("r3", agent="a", created=30, status="running"),
    )}
    def ids(sel: RunSelection) -> tuple[tuple[str, ...], list[str]]:
        chosen = select_runs(views, sel)
        return chosen.matched, [v.run_id for v in chosen.runs]

    assert ids(RunSelection()) == (("r1", "c1", "g1", "r2", "r3"), ["r1", "c1", "g1", "r2", "r3"])
    assert ids(RunSelection(agent_id="a")) == (("r1", "r3"), ["r1", "c1", "g1", "r3"])  # and r1's sub-agents
    assert ids(RunSelection(status="waiting")) == (("r2",), ["r2"])
    assert ids(RunSelection(since_ms=20, until_ms=30)) == (("r2",), ["r2"])
    assert ids(RunSelection(run_ids=("c1",))) == (("c1",), ["r1", "c1", "g1"])  # its parent and its child
    assert ids(RunSelection(run_ids=("r1", "r2"), agent_id="b")) == (("r2",), ["r2"])
    with pytest.raises(Exception, match="unknown run 'nope'"):
        select_runs(views, RunSelection(run_ids=("nope",)))


def test_export_runs_with_sub_agents_holds_the_child_thread_and_verify_all_verifies_both() -> None:
    async def go() -> None:
        source = MemoryEventStore()
        rt = subagents_app.app(source)
        async with asyncio.timeout(30):
            result = await rt.run("boss", "go")
        assert result.termination.type == "natural_end"
        rec = await export_runs(source, RunSelection(run_ids=(result.run_id,)))
        started = {e.run_id: e for sc in rec.commits for e in sc.commit.events if type(e) is RunStarted}
        [child] = [r for r, e in started.items() if e.parent_run_id == result.run_id]
        assert len(rec.threads()) == 2 and rec.header.runs == [result.run_id]
        report = await verify_all(read_recording(encode_recording(rec.header, rec.commits)), rt)
        assert [(v.run_id, v.outcome) for v in report.runs] == [(result.run_id, "verified"), (child, "verified")]
        tampered = await verify_all(rec, subagents_app.tampered(MemoryEventStore()), tools_from_log=False)
        outcomes = {v.run_id: v for v in tampered.runs}
        assert outcomes[result.run_id].outcome == "verified"  # its agent_run call answers from the log
        assert outcomes[child].outcome == "diverged"
        assert type(outcomes[child].divergence.expected) is ToolCallCompleted  # type: ignore[union-attr]

    run(go())


# -- verify every run of a recording --------------------------------------------------------------


async def _recorded_calc(runs: int = 2) -> tuple[MemoryEventStore, list[str]]:
    store = MemoryEventStore()
    rt = replay_app.app.runtime(store, entropy=DeterministicEntropy())
    ids = []
    for i in range(runs):
        result = await rt.run("calc", f"compute {i}")
        assert result.termination.type == "natural_end"
        ids.append(result.run_id)
    return store, ids


def test_verify_all_says_verified_diverged_and_skipped_with_the_first_differing_event() -> None:
    async def go() -> None:
        store, ids = await _recorded_calc()
        other = Runtime(store, agents=[AgentSpec(id="other", model=ScriptedModel(["hi"]))],
                        entropy=DeterministicEntropy(prefix="other"))
        extra = await other.run("other", "hello")
        rec = read_recording(encode_recording(*_parts(await export_runs(store, RunSelection()))))

        same = await verify_all(rec, replay_app.app)
        assert same.counts == {"verified": 2, "diverged": 0, "skipped": 1} and same.ok
        [skipped] = same.of("skipped")
        assert skipped.run_id == extra.run_id and skipped.reason == "the app has no agent 'other'"

        changed = await verify_all(rec, replay_app.app_prompt_changed)
        assert changed.counts["diverged"] == 2 and not changed.ok
        for verdict, run_id in zip(changed.of("diverged"), ids, strict=True):
            d = verdict.divergence
            assert verdict.run_id == run_id and d is not None
            first_inference = next(p for sc in rec.commits if sc.commit.run_id == run_id
                                   for p, e in sc.positioned() if type(e).__name__ == "InferenceCompleted")
            assert d.position == first_inference  # the source log's event id
            assert "system prompt" in (d.detail or "")
            assert f"diverged at {first_inference}" in verdict.explain()
        doc = changed.to_json()
        assert doc["ok"] is False and doc["counts"] == {"verified": 0, "diverged": 2, "skipped": 1}
        assert doc["runs"][0]["report"]["divergence"]["position"] == str(changed.of("diverged")[0].divergence.position)  # type: ignore[union-attr]

    run(go())


def _parts(rec: Recording) -> tuple[Any, Any]:
    return rec.header, rec.commits


def test_verify_all_over_a_store_reads_each_run_from_it() -> None:
    async def go() -> None:
        store, ids = await _recorded_calc()
        from agentlog.runtime.replay.recorded import selected_runs

        chosen = await selected_runs(store, RunSelection(run_ids=(ids[1],)))
        report = await verify_all(store, replay_app.app_tool_changed, list(chosen.runs), tools_from_log=False)
        assert [(v.run_id, v.outcome) for v in report.runs] == [(ids[1], "diverged")]
        d = report.runs[0].divergence
        assert d is not None and type(d.expected) is StatePatched  # the changed tool's state patch
        assert d.expected.ops[0]["value"] == 3 and d.actual.ops[0]["value"] == 4  # type: ignore[union-attr]
        assert report.source == "log"

    run(go())


# -- large payloads: inline in the file, by reference in each log ----------------------------------

LIMIT = 64 * 1024
BIG = 100 * 1024


@tool
def dump(n: int) -> dict[str, Any]:
    """A tool with a large output."""
    return {"rows": ["r" * 99 for _ in range(n)]}


def _dump_app() -> App:
    spec = AgentSpec(id="agent", model=ScriptedModel([Turn.tool("dump", {"n": BIG // 100}), "done"],
                                                     position="conversation"), tools=["dump"])
    return App(agents=[spec], tools=[dump])


def test_export_runs_inlines_large_payloads_and_import_runs_stores_them_by_reference_again(tmp_path: Path) -> None:
    servers = [EmbeddedNatsServer(tmp_path / name, max_payload=LIMIT) for name in ("a", "b")]
    for server in servers:
        server.start()

    async def go() -> None:
        source, target = [await JetStreamEventStore.connect(s.url) for s in servers]
        try:
            app = _dump_app()
            rt = Runtime(source, agents=list(app.agents), tools=list(app.tools), entropy=DeterministicEntropy())
            async with asyncio.timeout(30):
                result = await rt.run("agent", "go")
            rec = await export_runs(source, RunSelection(run_ids=(result.run_id,)))
            data = encode_recording(rec.header, rec.commits)
            assert b"result_ref" not in data and len(data) > BIG  # the output itself, inline
            await import_runs(target, read_recording(data))
            # in the target log the oversized commit went to the Object Store again
            raw = [m async for m in _raw_commits(target)]
            assert any(b"result_ref" in m for m in raw)
            [done] = [e for sc in [c async for c in target.read_thread(result.thread_id)]
                      for e in sc.commit.events if type(e) is ToolCallCompleted]
            assert len(done.result["rows"]) == BIG // 100
            report = await verify_all(read_recording(data), app)
            assert report.counts["verified"] == 1
        finally:
            await source.close()
            await target.close()

    try:
        run(go())
    finally:
        for server in servers:
            server.stop()


async def _raw_commits(store: JetStreamEventStore) -> Any:
    async for sc in store.read_log():  # references left as stored
        yield msgspec.json.encode(sc.commit)


# -- the pytest helper (agentlog.testing) ----------------------------------------------------------


def test_verify_all_helper_passes_for_the_app_that_recorded_and_names_the_event_when_a_prompt_changes(
        tmp_path: Path) -> None:
    store, ids = run(_recorded_calc())
    rec = run(export_runs(store, RunSelection()))
    folder = tmp_path / "recorded"
    (folder / "calc").mkdir(parents=True)
    (folder / "calc" / "runs.jsonl").write_bytes(encode_recording(rec.header, rec.commits))

    report = assert_recorded_runs_verify(folder, replay_app.app)
    assert report.counts == {"verified": 2, "diverged": 0, "skipped": 0}
    assert verify_recorded_runs(folder, "tests.apps.replay_app:app").ok  # an --app spec works too

    with pytest.raises(AssertionError) as err:
        assert_recorded_runs_verify(folder, replay_app.app_prompt_changed)
    text = str(err.value)
    assert text.startswith("2 of 2 recorded run(s) diverged, 0 skipped:")
    for run_id in ids:
        position = next(p for sc in rec.commits if sc.commit.run_id == run_id for p, e in sc.positioned()
                        if type(e).__name__ == "InferenceCompleted")
        assert f"run {run_id} (agent calc, thread " in text and f"diverged at {position}" in text
    assert "system prompt (incl. plugin context) changed" in text


def test_verify_all_helper_fails_on_skipped_runs_and_on_a_folder_without_runs(tmp_path: Path) -> None:
    store, _ids = run(_recorded_calc(1))
    rec = run(export_runs(store, RunSelection()))
    path = tmp_path / "runs.jsonl"
    path.write_bytes(encode_recording(rec.header, rec.commits))
    no_calc = App(agents=[AgentSpec(id="renamed", model=ScriptedModel(["x"]))])
    with pytest.raises(AssertionError, match="the app has no agent 'calc'"):
        assert_recorded_runs_verify(path, no_calc)
    assert assert_recorded_runs_verify(path, no_calc, allow_skipped=True).counts["skipped"] == 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssertionError, match="no recorded run in"):
        assert_recorded_runs_verify(tmp_path / "empty", replay_app.app)


def test_import_runs_keeps_ids_and_timestamps() -> None:
    async def go() -> None:
        store, ids = await _recorded_calc(1)
        rec = await export_runs(store, RunSelection())
        target = MemoryEventStore()
        # something else first: the imported commits get other sequences, same everything else
        await target.append(Commit(commit_id="x1", thread_id="elsewhere", ts=5,
                                   events=[ThreadCreated(), MessageAppended(message=_msg())]), 0)
        await import_runs(target, rec)
        again = await export_runs(target, RunSelection(run_ids=(ids[0],)), created_at=rec.header.created_at)
        assert [sc.seq for sc in again.commits] == [sc.seq + 1 for sc in rec.commits]
        assert [sc.commit for sc in again.commits] == [sc.commit for sc in rec.commits]

    run(go())


def _msg() -> Any:
    from agentlog.eventlog.events import Message

    return Message(id="m1", role="user", content="hi")
