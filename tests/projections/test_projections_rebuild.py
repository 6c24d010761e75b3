"""Rebuild from seq 1 into a fresh generation: same views as the incremental runner and as the
pure fold, progress reported, swapped in atomically, and the runner carries on after it."""

from __future__ import annotations

import asyncio
import random

import nats

from agentlog.eventlog import collect
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore, bucket_names
from agentlog.projections.rebuild import RebuildResult, rebuild
from agentlog.projections.runner import ProjectionRunner
from agentlog.testing.synth import history_of_size


async def test_rebuild_equals_incremental_runner_and_runner_continues(nats_server):
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        commits = history_of_size(random.Random(11), 2000, threads_per_chunk=10)
        split = len(commits) * 3 // 4
        versions: dict[str, int] = {}
        last = 0
        for c in commits[:split]:
            last = (await store.append(c, versions.get(c.thread_id, 0))).seq
            versions[c.thread_id] = last
        views = await KVViewStore.open(nc)
        runner = ProjectionRunner(nc, views, batch=200, fetch_timeout=0.5)
        await runner.open()
        async with asyncio.timeout(60):
            while runner.applied_seq < last:
                await runner.step()
        incremental_threads = await views.list_threads()
        incremental_runs = await views.list_runs()

        seen: list[tuple[int, int]] = []
        result = await rebuild(nc, runner=runner, progress=lambda done, total: seen.append((done, total)))
        assert isinstance(result, RebuildResult)
        assert (result.generation, result.last_seq, result.commits) == (1, last, last)
        assert result.events == sum(len(c.events) for c in commits[:split]) >= 1500
        assert seen[-1] == (last, last)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)

        fresh = await KVViewStore.open(nc)  # a new reader follows the pointer
        assert fresh.generation == 1
        assert await fresh.list_threads() == incremental_threads
        assert await fresh.list_runs() == incremental_runs
        old_threads, _ = bucket_names("agentlog", 0)
        assert old_threads not in [b async for b in _bucket_names(nc)]

        # The runner goes on in the new generation, applying each later commit once.
        for c in commits[split:]:
            last = (await store.append(c, versions.get(c.thread_id, 0))).seq
            versions[c.thread_id] = last
        async with asyncio.timeout(60):
            while runner.applied_seq < last:
                await runner.step()
        log = [sc for t in versions for sc in await collect(store.read_thread(t))]
        log.sort(key=lambda sc: sc.seq)
        expected = fold_commits(log)
        assert {t.thread_id: t for t in await fresh.list_threads()} == expected.threads
        assert {r.run_id: r for r in await fresh.list_runs()} == expected.runs
        await runner.stop()
    finally:
        await store.close()
        await nc.close()


async def _bucket_names(nc):
    js = nc.jetstream()
    for info in await js.streams_info():
        if info.config.name.startswith("KV_"):
            yield info.config.name[3:]


async def test_rebuild_of_an_empty_log(nats_server):
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        result = await rebuild(nc, prefix="empty")
        assert (result.last_seq, result.commits, result.threads, result.runs) == (0, 0, 0, 0)
        assert (await KVViewStore.open(nc, prefix="empty")).generation == 1
    finally:
        await store.close()
        await nc.close()
