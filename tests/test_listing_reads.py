"""Listings against a real nats-server: O(limit) reads, and the KV index equals the fold.

The read count is what the gateway's NATS connection receives while it answers one listing
(`nc.stats["in_msgs"]`: one message per KV get, one per key a watcher delivers). The app reads
its views through a connection of its own, so the runner's traffic is not counted. Before the
listing index, `GET /v1/runs?limit=1` received one message per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import nats
from aiohttp.test_utils import TestClient, TestServer

from agentlog.eventlog import collect
from agentlog.eventlog.events import Commit, RunFinished, RunStarted, Termination, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.rebuild import rebuild
from agentlog.projections.runner import ProjectionRunner
from agentlog.testing.synth import history_of_size

from test_http_support import body, stop_runner

TIMEOUT = 120


async def append_runs(store: JetStreamEventStore, start: int, count: int) -> int:
    """`count` threads with one run each (every other one finished), many appends in flight."""
    def commit(i: int) -> Commit:
        events: list[Any] = [ThreadCreated(resource_id=f"res{i % 3}"), RunStarted(run_id=f"r{i:06d}", agent_id="a")]
        if i % 2 == 0:
            events.append(RunFinished(termination=Termination(type="natural_end")))
        return Commit(commit_id=f"c{i}", thread_id=f"t{i:06d}", run_id=f"r{i:06d}", ts=1_700_000_000_000 + i,
                      events=events)

    last = 0
    for lo in range(start, start + count, 250):
        results = await asyncio.gather(*(store.append(commit(i), expected_version=0)
                                         for i in range(lo, min(lo + 250, start + count))))
        last = max(last, *(r.seq for r in results))
    return last


@contextlib.asynccontextmanager
async def counted_app(url: str) -> AsyncIterator[tuple[TestClient, JetStreamEventStore, ProjectionRunner, Any]]:
    store = await JetStreamEventStore.connect(url, request_timeout=2.0, connect_timeout=5.0)
    runner = ProjectionRunner(store.nc, await KVViewStore.open(store.nc), fetch_timeout=0.2)
    await runner.start()
    reader = await nats.connect(url)
    app = create_app(store, await KVViewStore.open(reader), runner, auth_tokens="admin,tenant:res1",
                     settings=Settings(read_wait=30))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, store, runner, reader
    finally:
        await client.close()
        await stop_runner(runner)
        await reader.close()
        await store.close()


async def received(client: TestClient, reader: Any, path: str, params: dict[str, Any], token: str,
                   ) -> tuple[int, Any]:
    """Messages the app's view connection received while answering one GET (and the answer)."""
    await reader.flush()
    before = reader.stats["in_msgs"]
    data = await body(await client.get(path, params=params, headers={"Authorization": f"Bearer {token}"}), 200)
    return reader.stats["in_msgs"] - before, data


LISTINGS = [
    ("/v1/runs", {"limit": 1}, "admin"),
    ("/v1/runs", {"limit": 1, "status": "done"}, "admin"),
    ("/v1/runs", {"limit": 2, "offset": 300}, "admin"),
    ("/v1/threads", {"limit": 1}, "admin"),
    ("/v1/threads", {"limit": 3, "resource_id": "res1"}, "admin"),
    ("/v1/runs", {"limit": 1}, "tenant"),  # a token scoped to resource_id prefix "res1"
    ("/v1/threads", {"limit": 1}, "tenant"),
]


async def test_listing_reads_do_not_grow_with_the_number_of_runs(nats_server) -> None:
    """limit=1 at 500 and at 2500 runs: a few reads (header, 1-3 pages, the views) whatever the
    number of runs; the code before read every view (503 and 2504)."""
    async with asyncio.timeout(TIMEOUT), counted_app(nats_server.url) as (client, store, runner, reader):
        counts: list[list[int]] = []
        for start, count in ((0, 500), (500, 2000)):
            seq = await append_runs(store, start, count)
            row = []
            for path, params, token in LISTINGS:
                n, data = await received(client, reader, path, {**params, "min_seq": seq}, token)
                items = data["runs" if path == "/v1/runs" else "threads"]
                assert len(items) == params["limit"] and data["total"] >= 100, (path, params, data["total"])
                row.append(n)
            counts.append(row)
        small, large = counts
        print("reads per listing at 500 and 2500 runs:", counts)
        # header + the pages bounding the filter's range and holding the slice (1-3: a range may
        # straddle a page boundary at one size and not at the other) + `limit` views; a tenant
        # also reads the resources list (header + page)
        for (path, params, token), n_small, n_large in zip(LISTINGS, small, large, strict=True):
            bound = 4 + params["limit"] + (2 if token == "tenant" else 0)
            assert n_small <= bound and n_large <= bound, (path, params, counts)


async def check_listings(*args: Any) -> None:
    from test_listing_index import check_listings as check  # needs the index (not imported at the
    await check(*args)  # top, so the read-count test above also runs against the code before it)


async def test_kv_listings_equal_the_fold_through_the_runner_and_the_rebuild(nats_server) -> None:
    """Through the real runner (small batches, crashes between index and views), then after a
    rebuild into a new generation, then as the runner carries on there."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    rng = random.Random(5)
    try:
        async with asyncio.timeout(TIMEOUT):
            from test_listing_index import with_resources  # resources per tenant, some hashed

            commits = with_resources(history_of_size(rng, 1500, threads_per_chunk=10), rng)
            split = len(commits) * 2 // 3
            versions: dict[str, int] = {}

            async def append(part: list[Commit]) -> int:
                last = 0
                for c in part:
                    last = versions[c.thread_id] = (await store.append(c, versions.get(c.thread_id, 0))).seq
                return last

            async def expected():
                log = sorted([sc for t in versions for sc in await collect(store.read_thread(t))],
                             key=lambda sc: sc.seq)
                return fold_commits(log)

            views = await KVViewStore.open(nc)
            runner = ProjectionRunner(nc, views, batch=37, catch_up_batch=37, fetch_timeout=0.2)  # many batches
            last = await append(commits[:split])
            await runner.open()
            # Every third batch dies after its index changes, half-way through its view puts; the
            # batch comes again and re-applies the same changes to the views it still finds old.
            put_views, calls = views.put_views, [0]

            async def crashing_put_views(threads, runs) -> None:
                calls[0] += 1
                threads, runs = list(threads), list(runs)
                if calls[0] % 3 == 0:  # half the views written, then the crash
                    await put_views(threads[: len(threads) // 2], runs[: len(runs) // 2])
                    raise ConnectionError("crash between the index and the views")
                await put_views(threads, runs)

            views.put_views = crashing_put_views  # type: ignore[method-assign]
            crashes = 0
            while runner.applied_seq < last:
                try:
                    await runner.step()
                except ConnectionError:
                    crashes += 1
            views.put_views = put_views  # type: ignore[method-assign]
            assert crashes >= 3
            await check_listings(views, await expected(), rng)

            await rebuild(nc, runner=runner)
            fresh = await KVViewStore.open(nc)
            assert fresh.generation == 1
            await check_listings(fresh, await expected(), rng)

            last = await append(commits[split:])  # the runner goes on in the new generation
            while runner.applied_seq < last:
                await runner.step()
            await check_listings(fresh, await expected(), rng)
            await runner.stop()
    finally:
        await store.close()
        await nc.close()


async def test_views_older_than_the_index_are_indexed_when_the_runner_opens(nats_server) -> None:
    """A store written before the listing index existed has views and no lists: the runner
    indexes them once at open, so listings do not come back empty after an upgrade."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        async with asyncio.timeout(TIMEOUT):
            commits = history_of_size(random.Random(3), 300, threads_per_chunk=5)
            versions: dict[str, int] = {}
            for c in commits:
                versions[c.thread_id] = (await store.append(c, versions.get(c.thread_id, 0))).seq
            log = sorted([sc for t in versions for sc in await collect(store.read_thread(t))], key=lambda sc: sc.seq)
            views = fold_commits(log)
            old = await KVViewStore.open(nc)
            await old.put_views(views.threads.values(), views.runs.values())  # views only, no lists
            assert (await old.run_page({}, 5, 0)) == ([], 0)
            runner = ProjectionRunner(nc, await KVViewStore.open(nc), fetch_timeout=0.2)
            await runner.open()  # the consumer starts at seq 1, but the lists come from the views
            await check_listings(old, views, random.Random(1))
            await runner.stop()
    finally:
        await store.close()
        await nc.close()
