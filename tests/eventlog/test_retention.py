"""Retention against a real nats-server: finished old threads leave the stream for one checksummed
Object Store object each, and every read (thread, run, whole log, view rebuild) still sees them
at their original positions. Crashes between the steps never lose a commit; unfinished or recent
threads are never archived; limits that would drop commits are refused at start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from agentlog.eventlog import Commit, EmbeddedNatsServer, StoreUnavailable, new_id, now_ms
from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    StepStarted,
    StoredCommit,
    Termination,
    ThreadCreated,
)
from agentlog.eventlog.jetstream.archive import (
    ARCHIVE_BUCKET,
    ARCHIVE_KEY,
    SHA_HEADER,
    ArchiveCorrupt,
    decode_archive,
    encode_archive,
    marker_commit,
    marker_of,
    sha256_hex,
)
from agentlog.eventlog.jetstream.limits import LossyStreamLimits, lossy_limits
from agentlog.eventlog.jetstream.retention import DAY_MS, archive_due, archive_thread, due, tally
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM, thread_filter
from agentlog.gateway.operations.connection import ConnectionOptions, open_store
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.rebuild import rebuild

from tests.support import forkserver

WAIT = 30.0
NOW = 1_800_000_000_000
OLD = NOW - 40 * DAY_MS


async def connect(server: EmbeddedNatsServer) -> JetStreamEventStore:
    async with asyncio.timeout(WAIT):
        return await JetStreamEventStore.connect(server.url)


async def write_thread(store: JetStreamEventStore, thread: str, *, ts: int, finished: bool = True,
                       runs: int = 1) -> list[str]:
    """A thread with `runs` runs (the last one left open unless `finished`); commits carry `ts`."""
    version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, ts=ts,
                                         events=[ThreadCreated(metadata={"title": thread})]), 0)).seq
    run_ids = []
    for i in range(runs):
        run = f"{thread}-r{i}"
        run_ids.append(run)
        events: list[Any] = [RunStarted(run_id=run, agent_id="a"), StepStarted(step=1),
                             MessageAppended(message=Message(id=new_id(), role="user", content=f"hi {i}"))]
        version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts,
                                             events=events), version)).seq
        if finished or i < runs - 1:
            version = (await store.append(Commit(commit_id=new_id(), thread_id=thread, run_id=run, ts=ts,
                                                 events=[RunFinished(termination=Termination(type="natural_end"))]),
                                          version)).seq
    return run_ids


async def stream_count(nc: nats.NATS, subject_filter: str) -> int:
    """Messages of the events stream under a subject filter, asked of JetStream itself."""
    body = json.dumps({"subjects_filter": subject_filter}).encode()
    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{EVENTS_STREAM}", body, timeout=5)).data)
    return sum((info["state"].get("subjects") or {}).values())


async def read_all(store: JetStreamEventStore, thread: str) -> list[StoredCommit]:
    return [sc async for sc in store.read_thread(thread)]


async def test_archive_moves_finished_old_threads_out_of_the_stream_and_reads_stay_equal(
        nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            old_runs = await write_thread(store, "old", ts=OLD, runs=2)
            await write_thread(store, "open", ts=OLD, finished=False)
            await write_thread(store, "recent", ts=NOW - DAY_MS)
            before = await read_all(store, "old")
            run_before = [sc async for sc in store.read_run(old_runs[0])]
            open_before = await read_all(store, "open")

            dry = await archive_due(store, 30 * DAY_MS, now=NOW, dry_run=True)
            assert [(o.thread_id, o.result) for o in dry] == [("old", "due")]
            assert await stream_count(store.nc, thread_filter("old")) == len(before)

            outcomes = await archive_due(store, 30 * DAY_MS, now=NOW)
            assert [(o.thread_id, o.result, o.commits, o.removed) for o in outcomes] == \
                [("old", "archived", len(before), len(before))]

            # JetStream itself: only the marker is left of the thread; the others are untouched
            assert await stream_count(store.nc, thread_filter("old")) == 1
            assert await stream_count(store.nc, thread_filter("open")) == len(open_before)
            assert await stream_count(store.nc, thread_filter("recent")) == 3

            after = await read_all(store, "old")
            assert after[:-1] == before  # same commits at the same positions
            marker = after[-1]
            assert marker.commit.events[0].metadata[ARCHIVE_KEY]["upto"] == before[-1].seq  # type: ignore[union-attr]
            assert await store.thread_version("old") == marker.seq
            assert [sc async for sc in store.read_run(old_runs[0])] == run_before
            assert [sc.seq async for sc in store.read_thread("old", after=before[1].seq)] == \
                [sc.seq for sc in before[2:]] + [marker.seq]
            assert await read_all(store, "open") == open_before

            # a second pass has nothing to do
            assert await archive_due(store, 30 * DAY_MS, now=NOW) == []
    finally:
        await store.close()


async def test_unfinished_and_recent_threads_are_never_archived(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            await write_thread(store, "waiting", ts=OLD, finished=False, runs=2)
            await write_thread(store, "fresh", ts=NOW - DAY_MS // 2)
            outcomes = await archive_due(store, DAY_MS, now=NOW)
            assert outcomes == []
            out = await archive_thread(store, "waiting", cutoff_ms=NOW)
            assert (out.result, out.reason) == ("skipped", "not finished")
            assert await stream_count(store.nc, thread_filter("waiting")) == 4
    finally:
        await store.close()


async def test_a_crash_between_marker_and_purge_leaves_the_thread_whole_then_the_next_pass_purges(
        nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            runs = await write_thread(store, "t", ts=OLD)
            before = await read_all(store, "t")
            out = await archive_thread(store, "t", cutoff_ms=NOW, now=NOW, purge=False)
            assert out.result == "archived" and out.removed == 0
            # double-present: in the stream AND in the archive; every read sees each commit once
            assert await stream_count(store.nc, thread_filter("t")) == len(before) + 1
            after = await read_all(store, "t")
            assert after[:-1] == before
            assert [sc async for sc in store.read_run(runs[0])] == [sc for sc in before if sc.commit.run_id]

            outcomes = await archive_due(store, 30 * DAY_MS, now=NOW)
            assert [(o.thread_id, o.result, o.removed) for o in outcomes] == [("t", "purged", len(before))]
            assert await stream_count(store.nc, thread_filter("t")) == 1
            assert await read_all(store, "t") == after
    finally:
        await store.close()


async def test_a_crash_after_the_object_before_the_marker_changes_nothing(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            await write_thread(store, "t", ts=OLD)
            before = await read_all(store, "t")
            # the object alone (a stale, different one even): without a marker nobody reads it
            js = store.nc.jetstream()
            obs = await js.create_object_store(ARCHIVE_BUCKET)
            stale = encode_archive("t", before[:1])
            await obs.put("t", stale, meta=nats.js.api.ObjectMeta(name="t", headers={SHA_HEADER: sha256_hex(stale)}))
            assert await read_all(store, "t") == before
            outcomes = await archive_due(store, 30 * DAY_MS, now=NOW)
            assert [o.result for o in outcomes] == ["archived"]
            assert (await read_all(store, "t"))[:-1] == before
    finally:
        await store.close()


async def test_a_corrupted_archive_is_a_typed_error_never_a_different_history(
        nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            runs = await write_thread(store, "t", ts=OLD)
            await archive_due(store, 30 * DAY_MS, now=NOW)
            obs = await store.nc.jetstream().object_store(ARCHIVE_BUCKET)
            info = await obs.get_info("t")
            data = bytes((await obs.get("t")).data or b"")
            tampered = data.replace(b"hi 0", b"HI 0")
            assert tampered != data
            # a new object with the old checksum in its headers: JetStream's own digest is fine
            await obs.put("t", tampered, meta=nats.js.api.ObjectMeta(name="t", headers=info.headers))
            fresh = await connect(nats_server)  # no cached copy
            try:
                with pytest.raises(ArchiveCorrupt, match="checksum"):
                    await read_all(fresh, "t")
                with pytest.raises(ArchiveCorrupt):
                    [sc async for sc in fresh.read_run(runs[0])]
            finally:
                await fresh.close()
    finally:
        await store.close()


async def test_a_new_run_after_the_archive_appends_after_the_marker(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            await write_thread(store, "t", ts=OLD)
            await archive_due(store, 30 * DAY_MS, now=NOW)
            history = await read_all(store, "t")
            version = await store.thread_version("t")
            assert version == history[-1].seq
            new = Commit(commit_id=new_id(), thread_id="t", run_id="t-r9", ts=NOW,
                         events=[RunStarted(run_id="t-r9", agent_id="a"),
                                 RunFinished(termination=Termination(type="natural_end"))])
            seq = (await store.append(new, version)).seq
            assert [sc.seq for sc in await read_all(store, "t")] == [sc.seq for sc in history] + [seq]
            # archived again later: one object holds everything, one marker is left
            outcomes = await archive_due(store, 0, now=NOW + 1)
            assert [(o.result, o.commits) for o in outcomes] == [("archived", len(history) + 1)]
            again = await read_all(store, "t")
            assert again[:len(history)] == history and again[len(history)].seq == seq
            assert await stream_count(store.nc, thread_filter("t")) == 1
    finally:
        await store.close()


async def test_lossy_stream_limits_are_refused_at_start(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            config = store.desired_stream_config()
            for lossy in ({"max_age": 3600 * 10**9}, {"max_bytes": 10**9, "discard": "old"}):
                await store.nc.request(f"$JS.API.STREAM.UPDATE.{EVENTS_STREAM}",
                                       msgspec.json.encode({**config, **lossy}), timeout=5)
                with pytest.raises(LossyStreamLimits):
                    await JetStreamEventStore.connect(nats_server.url)
            # a size limit that refuses new commits is fine, and fails appends loudly when reached
            await store.nc.request(f"$JS.API.STREAM.UPDATE.{EVENTS_STREAM}",
                                   msgspec.json.encode({**config, "max_msgs": 2, "discard": "new"}), timeout=5)
            other = await JetStreamEventStore.connect(nats_server.url)
            await other.close()
            v = (await store.append(Commit(commit_id=new_id(), thread_id="t", ts=NOW,
                                           events=[StepStarted(step=1)]), 0)).seq
            v = (await store.append(Commit(commit_id=new_id(), thread_id="t", ts=NOW,
                                           events=[StepStarted(step=2)]), v)).seq
            with pytest.raises(StoreUnavailable):
                await store.append(Commit(commit_id=new_id(), thread_id="t", ts=NOW,
                                          events=[StepStarted(step=3)]), v)
            assert [sc.seq async for sc in store.read_thread("t")] == [1, 2]
    finally:
        await store.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`agentlog ARGS` in its own process (forked from the fork server: tests/support/forkserver.py)."""
    return forkserver.run(args, cwd=os.getcwd(), env=os.environ, timeout=WAIT)


async def test_listings_from_the_log_and_view_rebuilds_keep_archived_threads(nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            runs = await write_thread(store, "t", ts=OLD, runs=2)
            await write_thread(store, "u", ts=OLD, finished=False)
            before = fold_commits(await read_all(store, "t") + await read_all(store, "u"))
            await archive_due(store, 30 * DAY_MS, now=NOW)

            result = await rebuild(store.nc)
            assert (result.threads, result.runs) == (2, 3)
            kv = await KVViewStore.open(store.nc)
            thread = await kv.get_thread("t")
            assert thread is not None and thread.run_ids == runs == before.threads["t"].run_ids
            assert thread.metadata["title"] == "t" and ARCHIVE_KEY in thread.metadata
            assert [(await kv.get_run(r)) == before.runs[r] for r in runs] == [True, True]

            listed = await asyncio.to_thread(cli, "threads", "--json", "--nats", nats_server.url)
            assert listed.returncode == 0, listed.stderr
            by_id = {t["thread_id"]: t for t in json.loads(listed.stdout)}
            assert set(by_id) == {"t", "u"} and by_id["t"]["run_ids"] == runs
            listed = await asyncio.to_thread(cli, "runs", "--json", "--nats", nats_server.url)
            assert sorted(r["run_id"] for r in json.loads(listed.stdout)) == sorted([*runs, "u-r0"])
    finally:
        await store.close()


async def test_a_commit_appended_while_archiving_stops_the_archive_before_any_purge(
        nats_server: EmbeddedNatsServer) -> None:
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            await write_thread(store, "t", ts=OLD)
            before = await read_all(store, "t")
            load = store.archive.load
            raced: list[int] = []

            async def racing_load(thread_id: str) -> list[tuple[int, bytes]]:
                # between writing the object and the marker, a new run starts on the thread
                if not raced:
                    new = Commit(commit_id=new_id(), thread_id="t", run_id="t-new", ts=NOW,
                                 events=[RunStarted(run_id="t-new", agent_id="a")])
                    raced.append((await store.append(new, before[-1].seq)).seq)
                return await load(thread_id)

            store.archive.load = racing_load  # type: ignore[method-assign]
            out = await archive_thread(store, "t", cutoff_ms=NOW, now=NOW)
            assert (out.result, out.reason) == ("skipped", "changed while archiving")
            assert await stream_count(store.nc, thread_filter("t")) == len(before) + 1
            assert [sc.seq for sc in await read_all(store, "t")] == [sc.seq for sc in before] + raced
    finally:
        await store.close()


async def test_retention_on_the_embedded_server_logs_in_as_archiver(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with asyncio.timeout(WAIT):
        async with open_store(ConnectionOptions(data_dir=data), "serve") as store:  # keeps the server up
            await write_thread(store, "t", ts=now_ms() - 2 * DAY_MS)  # the command's clock is the real one
            count = len(await read_all(store, "t"))
            done = await asyncio.to_thread(cli, "retention", "--older-than", "1", "--json", "--data-dir", str(data))
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["result"] == "archived"
            assert await stream_count(store.nc, thread_filter("t")) == 1
            assert len(await read_all(store, "t")) == count + 1
            # the read commands log in as readonly: they read the archive too
            for args in (("events", "tail", "--thread", "t", "--json"), ("runs", "--json")):
                read = await asyncio.to_thread(cli, *args, "--data-dir", str(data))
                assert read.returncode == 0, read.stderr
                assert "t-r0" in read.stdout
            tail = await asyncio.to_thread(cli, "events", "tail", "--thread", "t", "--json", "--data-dir", str(data))
            assert len({json.loads(line)["id"].split(":")[0] for line in tail.stdout.splitlines()}) == count + 1


async def test_a_forged_marker_in_an_intact_thread_changes_no_read_and_purges_nothing(
        nats_server: EmbeddedNatsServer) -> None:
    """A NATS user allowed to append can write a commit that looks like an archive marker; in the
    middle of a thread it stands for nothing: reads stay whole, retention purges nothing."""
    store = await connect(nats_server)
    try:
        async with asyncio.timeout(WAIT):
            await write_thread(store, "other", ts=OLD)
            await write_thread(store, "t", ts=OLD)
            before = await read_all(store, "t")
            forged = marker_commit("t", before[-1].seq + 3, 1, "0" * 64, NOW)
            seq = (await store.append(forged, before[-1].seq)).seq
            assert [sc.seq for sc in await read_all(store, "t")] == [sc.seq for sc in before] + [seq]
            outcomes = {o.thread_id: o for o in await archive_due(store, 30 * DAY_MS, now=NOW)}
            assert outcomes["t"].result == "skipped" and "archive_corrupt" in outcomes["t"].reason
            assert outcomes["other"].result == "archived"  # one bad thread does not stop the pass
            assert await stream_count(store.nc, thread_filter("t")) == len(before) + 1
            result = await rebuild(store.nc)
            assert (result.threads, result.runs) == (2, 2)
    finally:
        await store.close()


def test_bench_retention_quick_prints_its_figures() -> None:
    """The contract only (figures of speed are never asserted)."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "scripts/bench_retention.py", "--quick", "--threads", "3", "--commits", "6"],
                          cwd=root, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (doc["bench"], doc["archived_threads"], doc["removed_from_stream"]) == ("retention", 3, 18)
    for key in ("archive_threads_per_s", "read_thread_archived_p50_ms", "read_run_archived_p50_ms",
                "read_run_missing_p50_ms", "archived_over_stream"):
        assert doc[key] > 0, (key, doc)


# -- the pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "lossy"), [
    ({}, []),
    ({"max_age": 0, "max_bytes": -1, "max_msgs": -1, "discard": "old"}, []),
    ({"max_age": 10**9}, ["max_age=1000000000ns"]),
    ({"max_age": 10**9, "discard": "new"}, ["max_age=1000000000ns"]),  # age expiry ignores discard
    ({"max_bytes": 1024, "discard": "old"}, ["max_bytes=1024"]),
    ({"max_msgs": 5, "max_msgs_per_subject": 2}, ["max_msgs=5", "max_msgs_per_subject=2"]),  # default discard: old
    ({"max_bytes": 1024, "max_msgs": 5, "discard": "new"}, []),
])
def test_lossy_limits_are_those_that_make_jetstream_delete_commits(config: dict[str, Any], lossy: list[str]) -> None:
    assert lossy_limits(config) == lossy


def test_an_archive_object_is_checked_line_by_line() -> None:
    commits = [StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t", ts=1, events=[StepStarted(step=seq)]))
               for seq in (3, 7, 9)]
    data = encode_archive("t", commits)
    assert [seq for seq, _ in decode_archive("t", data)] == [3, 7, 9]
    for bad in (data.replace(b"agentlog-archive 1 t", b"agentlog-archive 1 u"),  # another thread's
                data.replace(b"\n7 ", b"\n2 "),  # out of order
                data.replace(b"\n9 ", b"\nnine ")):  # not a sequence
        with pytest.raises(ArchiveCorrupt):
            decode_archive("t", bad)


def test_only_a_marker_is_a_marker() -> None:
    marker = marker_commit("t", 12, 3, "ab" * 32, NOW)
    assert marker_of(marker) == 12
    patch = Commit(commit_id=new_id(), thread_id="t", ts=NOW, events=marker.events)  # what PATCH writes
    assert marker_of(patch) is None
    other_upto = Commit(commit_id="archived-13", thread_id="t", ts=NOW, events=marker.events)
    assert marker_of(other_upto) is None
    in_a_run = Commit(commit_id="archived-12", thread_id="t", run_id="r", ts=NOW, events=marker.events)
    assert marker_of(in_a_run) is None


def test_due_is_finished_and_old_or_an_unfinished_purge() -> None:
    ts = NOW - 2 * DAY_MS

    def c(seq: int, run: str | None, *events: Any, commit_id: str | None = None) -> StoredCommit:
        return StoredCommit(seq, Commit(commit_id=commit_id or new_id(), thread_id="t", run_id=run, ts=ts,
                                        events=list(events)))

    done = [c(1, None, ThreadCreated()), c(2, "r", RunStarted(run_id="r", agent_id="a")),
            c(3, "r", RunFinished(termination=Termination(type="natural_end")))]
    assert due(tally(done)["t"], NOW - DAY_MS) == "archive"
    assert due(tally(done)["t"], NOW - 3 * DAY_MS) is None  # too recent
    assert due(tally(done[:2])["t"], NOW) is None  # a run still open
    marker = StoredCommit(4, marker_commit("t", 3, 3, "0" * 64, NOW))
    assert due(tally([*done, marker])["t"], NOW) == "purge"  # the purge did not happen
    assert due(tally([marker])["t"], NOW) is None  # archived and purged: nothing to do


def counted_lookups(store: JetStreamEventStore) -> list[str]:
    """The runs `store` asks the archive index about from now on, in order."""
    lookups: list[str] = []
    lookup = store.archive.thread_of_run

    async def counted(run_id: str) -> str | None:
        lookups.append(run_id)
        return await lookup(run_id)

    store.archive.thread_of_run = counted  # type: ignore[method-assign]
    return lookups


async def test_a_run_found_in_the_stream_is_read_again_without_an_index_lookup_until_archived(
        nats_server: EmbeddedNatsServer) -> None:
    """The archive index is asked about a run alongside its first read; once the run was found in
    the stream (or appended by this store), reads ask it only when the stream turns out empty (the
    run archived since)."""
    store = await connect(nats_server)
    lookups = counted_lookups(store)
    try:
        async with asyncio.timeout(WAIT):
            [run] = await write_thread(store, "lookups", ts=OLD)
            [other] = await write_thread(store, "lookups-other", ts=OLD)
            reader = await connect(nats_server)  # appended nothing: learns from its reads
            read_lookups = counted_lookups(reader)
            try:
                first = [sc async for sc in reader.read_run(other)]
                again = [sc async for sc in reader.read_run(other)]
                assert first and again == first and read_lookups == [other]
            finally:
                await reader.close()
            mine = [sc async for sc in store.read_run(run)]
            assert mine and lookups == []  # appended here: known to be in the stream
            await archive_due(store, 30 * DAY_MS, now=NOW)
            assert [sc async for sc in store.read_run(run)] == mine  # from the archive
            assert lookups == [run]
    finally:
        await store.close()
