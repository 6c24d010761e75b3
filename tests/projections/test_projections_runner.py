"""The projection runner against a real nats-server and real KV buckets.

The main property: for generated thread histories, the KV views equal the pure fold of the log
however the work is cut: appends interleaved with batches of any size, restarts (cold cache),
crashes before the position is written (the batch is read again), crashes between the puts of
one batch, and a lost position that has the runner read everything again from seq 1. Apply-once
holds throughout.

Each hypothesis example gets its own nats-server. Sharing one (the function-scoped fixture lives
across examples) and deleting the events stream between examples was flaky: a file-backed stream
re-created right after its deletion can come back holding the deleted stream's messages (seen
with nats-server 2.15: STREAM.INFO says "not found", the CREATE succeeds, and the new stream has
an earlier example's commits), so an example started on leftover data and its first append got a
VersionConflict. A server costs ~25 ms to start.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog import Commit, collect
from agentlog.eventlog.codec import encode_commit
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    RunStarted,
    StepStarted,
    ThreadCreated,
    ThreadMetadataUpdated,
)
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, event_subject
from agentlog.projections import ProjectionTimeout, fold_commits
from agentlog.projections.feed import LogFeed
from agentlog.projections.kv import KVViewStore
from agentlog.projections.runner import ProjectionRunner
from agentlog.testing.synth import generate_history


class Crash(Exception):
    pass


class FlakyStore:
    """A `ViewStore` that dies after writing `limit` views of a batch (a crash between puts)."""

    def __init__(self, inner: KVViewStore, limit: int) -> None:
        self.inner = inner
        self.limit = limit

    async def get_thread(self, thread_id):
        return await self.inner.get_thread(thread_id)

    async def get_run(self, run_id):
        return await self.inner.get_run(run_id)

    async def put_views(self, threads, runs):
        views = [*threads, *runs]
        await self.inner.put_views([v for v in views[: self.limit] if hasattr(v, "version")],
                                   [v for v in views[: self.limit] if not hasattr(v, "version")])
        raise Crash(f"crashed after {self.limit} puts")

    async def list_threads(self):
        return await self.inner.list_threads()

    async def list_runs(self):
        return await self.inner.list_runs()


async def append_all(store: JetStreamEventStore, commits: list[Commit], versions: dict[str, int]) -> int:
    seq = 0
    for commit in commits:
        res = await store.append(commit, versions.get(commit.thread_id, 0))
        versions[commit.thread_id] = seq = res.seq
    return seq


actions = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 15)),
        st.tuples(st.just("step"), st.integers(1, 8)),
        st.tuples(st.just("restart"), st.integers(1, 8)),
        st.tuples(st.just("crash_before_ack"), st.integers(1, 8)),
        st.tuples(st.just("crash_mid_put"), st.integers(0, 3)),
        st.tuples(st.just("reset_position"), st.integers(1, 8)),
    ),
    max_size=25,
)


async def scenario(url: str, history: list[Commit], plan: list[tuple[str, int]]) -> None:
    nc = await nats.connect(url)
    store = await JetStreamEventStore.connect(nc)
    assert await store.last_seq() == 0, "a fresh log per example"
    views = await KVViewStore.open(nc, prefix="ex")
    versions: dict[str, int] = {}
    pending = list(history)
    last = 0

    def new_runner(store=views) -> ProjectionRunner:
        return ProjectionRunner(nc, store, batch=8, fetch_timeout=0.5)

    async def until_crash(r: ProjectionRunner, limit: int | None = None) -> None:
        """Step until the injected crash fires (a step may fetch nothing while a batch is away)."""
        while r.applied_seq < last or r.applied_seq == 0:
            try:
                await r.step(limit)
            except Crash:
                return

    runner = new_runner()
    await runner.open()
    try:
        async with asyncio.timeout(60):
            for action, n in plan:
                if action == "append":
                    chunk, pending = pending[:n], pending[n:]
                    if chunk:
                        last = await append_all(store, chunk, versions)
                    continue
                if runner.applied_seq >= last:
                    continue  # nothing to fetch: a fetch would only wait out its timeout
                if action == "step":
                    await runner.step(n)
                elif action == "restart":
                    await runner.stop()
                    runner = new_runner()
                    await runner.step(n)
                elif action == "crash_before_ack":
                    def boom(seqs):
                        raise Crash(seqs)
                    runner.before_ack = boom
                    await until_crash(runner, n)
                    await runner.stop()
                    runner = new_runner()
                elif action == "crash_mid_put":
                    await runner.stop()
                    flaky = new_runner(FlakyStore(views, n))
                    await until_crash(flaky)
                    await flaky.stop()
                    await runner.stop()
                    runner = new_runner()
                elif action == "reset_position":
                    await runner.stop()
                    await views.meta.delete(f"position.{views.generation}")  # read all again from seq 1
                    runner = new_runner()
                    await runner.open()
                    assert runner.applied_seq == 0
                    await runner.step(n)
            if pending:
                last = await append_all(store, pending, versions)
            while runner.applied_seq < last:
                await runner.step()
            await runner.wait_for(last, timeout=5)
            assert await runner.lag() == 0

        commits = [sc for t in sorted(versions) for sc in await collect(store.read_thread(t))]
        commits.sort(key=lambda sc: sc.seq)
        assert [sc.seq for sc in commits] == list(range(1, last + 1))
        expected = fold_commits(commits)
        assert {t.thread_id: t for t in await views.list_threads()} == expected.threads
        assert {r.run_id: r for r in await views.list_runs()} == expected.runs
    finally:
        await runner.stop()
        await store.close()
        await nc.close()


@settings(max_examples=int(os.environ.get("PROJ_EXAMPLES", "20")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False), actions)
def test_runner_views_equal_the_pure_fold_however_the_stream_is_cut(rng, plan):
    history = generate_history(rng, threads=2, max_runs=2, max_steps=2)
    with tempfile.TemporaryDirectory(prefix="agentlog-runner-") as tmp, EmbeddedNatsServer(Path(tmp)) as server:
        asyncio.run(scenario(server.url, history, plan))


def commit(i: int, thread: str, run: str | None, events) -> Commit:
    return Commit(commit_id=f"c{i}", thread_id=thread, run_id=run, ts=1000 + i, events=events)


async def test_one_put_per_touched_view_per_batch_and_lag(nats_server):
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        views = await KVViewStore.open(nc)
        runner = ProjectionRunner(nc, views, batch=100)
        await runner.open()
        commits = [commit(0, "t1", None, [ThreadCreated()]),
                   commit(1, "t1", "r1", [RunStarted(run_id="r1", agent_id="a")])]
        commits += [commit(i, "t1", "r1", [StepStarted(step=i), MessageAppended(message=Message(id=f"m{i}", role="assistant"))])
                    for i in range(2, 50)]
        last = await append_all(store, commits, {})
        assert await runner.lag() == last == 50
        async with asyncio.timeout(20):
            assert await runner.step() == 50
        assert runner.puts == 2  # one thread view + one run view for 50 commits
        assert await runner.lag() == 0
        thread = await views.get_thread("t1")
        run = await views.get_run("r1")
        assert thread is not None and thread.version == 50 and thread.message_count == 48
        assert run is not None and run.last_seq == 50 and run.steps == 48
        await runner.stop()
    finally:
        await store.close()
        await nc.close()


async def test_read_your_writes_with_a_running_runner(nats_server):
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        views = await KVViewStore.open(nc)
        async with ProjectionRunner(nc, views, fetch_timeout=0.5) as runner:
            for i in range(5):
                res = await store.append(commit(i, f"t{i}", None, [ThreadCreated(metadata={"i": i})]), 0)
                await runner.wait_for(res.seq, timeout=10)
                view = await views.get_thread(f"t{i}")
                assert view is not None and view.metadata == {"i": i} and view.version == res.seq
        # A restarted runner knows how far the views got (the position they store).
        again = ProjectionRunner(nc, views)
        await again.open()
        await again.wait_for(5, timeout=0.01)
        with pytest.raises(ProjectionTimeout) as info:
            await again.wait_for(6, timeout=0.2)
        assert info.value.code == "projection_timeout" and info.value.applied == 5
        await again.stop()
    finally:
        await store.close()
        await nc.close()


async def test_raw_published_commits_and_undecodable_ones(nats_server):
    """Commits published straight to the subject (as other writers may) are projected; bytes that
    are not a commit are skipped and counted, never crash the runner."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    js = nc.jetstream()
    try:
        views = await KVViewStore.open(nc)
        await js.publish(event_subject("t1", None), encode_commit(commit(0, "t1", None, [ThreadCreated()])))
        await js.publish(event_subject("t1", None), b"{not json")
        await js.publish(event_subject("t1", None), encode_commit(commit(1, "t1", None, [ThreadCreated(resource_id="x")])))
        runner = ProjectionRunner(nc, views)
        await runner.open()
        async with asyncio.timeout(20):
            while runner.applied_seq < 3:
                await runner.step()
        assert [seq for seq, _ in runner.skipped] == [2]
        view = await views.get_thread("t1")
        assert view is not None and view.resource_id == "x" and view.version == 3
        await runner.stop()
    finally:
        await store.close()
        await nc.close()


async def test_a_commit_on_a_subject_that_does_not_name_it_still_folds_onto_its_stored_view(nats_server):
    """The runner loads a batch's views by the ids its subjects name; a commit published where its
    subject names other ids (or none) gets its own views loaded when it is decoded."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    js = nc.jetstream()
    try:
        views = await KVViewStore.open(nc)
        await js.publish(event_subject("tx", None), encode_commit(commit(0, "tx", None, [ThreadCreated(metadata={"a": 1})])))
        runner = ProjectionRunner(nc, views, fetch_timeout=0.2)
        await runner.open()
        async with asyncio.timeout(20):
            while runner.applied_seq < 1:
                await runner.step()
        await runner.stop()
        # a new runner (cold cache): the next commit of tx comes on t1's subject, then one on a
        # subject that is no event subject at all
        await js.publish(event_subject("t1", None), encode_commit(commit(1, "tx", None, [ThreadMetadataUpdated(metadata={"b": 2})])))
        await js.publish("agentlog.ev.tx.x.y", encode_commit(commit(2, "tx", None, [ThreadMetadataUpdated(metadata={"c": 3})])))
        runner = ProjectionRunner(nc, views, fetch_timeout=0.2)
        await runner.open()
        async with asyncio.timeout(20):
            while runner.applied_seq < 3:
                await runner.step()
        view = await views.get_thread("tx")
        assert view is not None and view.metadata == {"a": 1, "b": 2, "c": 3} and view.version == 3
        assert await views.get_thread("t1") is None
        await runner.stop()
    finally:
        await store.close()
        await nc.close()


async def test_the_feed_gives_a_batch_again_whole_past_its_bound(nats_server):
    """`take_through` (how the runner reads a failed batch again: the same batch, however large)
    gets every message up to the batch's end although the feed buffers at most 4: the bound is
    lifted while it waits. Nothing past the end comes with it, and the rest follows in order."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    feed = LogFeed(nc.jetstream(), EVENTS_STREAM, EVENTS_SUBJECTS, max_buffered=4)
    try:
        await append_all(store, [commit(i, f"t{i}", None, [ThreadCreated()]) for i in range(12)], {})
        await feed.open(1)
        async with asyncio.timeout(20):
            assert [seq for seq, _, _ in await feed.take_through(9, timeout=20)] == list(range(1, 10))
            rest: list[int] = []
            while len(rest) < 3:
                rest += [seq for seq, _, _ in await feed.take(100, timeout=20)]
            assert rest == [10, 11, 12]
    finally:
        await feed.close()
        await store.close()
        await nc.close()


async def test_the_batch_end_is_stored_before_list_changes_and_only_for_them(nats_server):
    """A batch stores its end before it changes a list (module doc of the runner); a batch whose
    commits change no list (a step, a message: the run stays where it was listed) stores none."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        views = await KVViewStore.open(nc)
        runner = ProjectionRunner(nc, views)
        await runner.open()
        listed = [commit(0, "t1", None, [ThreadCreated()]), commit(1, "t1", "r1", [RunStarted(run_id="r1", agent_id="a")])]
        async with asyncio.timeout(20):
            last = await append_all(store, listed, {})
            while runner.applied_seq < last:
                await runner.step()
            assert (await views.read_batch_end(), await views.read_position()) == (last, last)
            quiet = [commit(2, "t1", "r1", [StepStarted(step=1), MessageAppended(message=Message(id="m1", role="assistant"))])]
            latest = await append_all(store, quiet, {"t1": last})
            while runner.applied_seq < latest:
                await runner.step()
            assert (await views.read_batch_end(), await views.read_position()) == (last, latest)
            assert (await views.get_run("r1")).last_seq == latest  # type: ignore[union-attr]
        await runner.stop()
    finally:
        await store.close()
        await nc.close()
