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

import msgspec
import nats
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentlog.eventlog import collect
from agentlog.eventlog.events import Commit, RunFinished, RunStarted, Termination, ThreadCreated
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.gateway.http import Settings, create_app
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.rebuild import rebuild
from agentlog.projections.runner import ProjectionRunner
from agentlog.projections.views import RunView, ThreadView
from agentlog.testing.synth import generate_history, history_of_size

from tests.support.http_stack import body, stop_runner

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
    from tests.projections.test_listing_index import (
        check_listings as check,  # needs the index (not imported at the
    )
    await check(*args)  # top, so the read-count test above also runs against the code before it)


async def test_kv_listings_equal_the_fold_through_the_runner_and_the_rebuild(nats_server) -> None:
    """Through the real runner (small batches, crashes between index and views), then after a
    rebuild into a new generation, then as the runner carries on there."""
    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    rng = random.Random(5)
    try:
        async with asyncio.timeout(TIMEOUT):
            from tests.projections.test_listing_index import (
                with_resources,  # resources per tenant, some hashed
            )

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


class Crash(Exception):
    pass


#: One batch of a plan: its size (`step(limit)`), where it crashes (None; ("index", n): after n of
#: its list changes; ("views", n): after the whole index and n of its view puts), and whether
#: the runner then dies with it (the next one opens on the same views) or carries on.
Batch = tuple[int, "tuple[str, int] | None", bool]
batches = st.lists(st.tuples(st.integers(1, 16),
                             st.one_of(st.none(), st.tuples(st.sampled_from(["index", "views"]), st.integers(0, 4))),
                             st.booleans()),
                   min_size=1, max_size=10)


def crashing(views: KVViewStore, crash: tuple[str, int] | None) -> None:
    """Make the next batch die at `crash` (popping the two from `vars(views)` undoes it)."""
    if crash is None:
        return
    where, n = crash
    update_index, put_views = views.update_index, views.put_views

    async def index_then_crash(changes) -> None:
        if where == "index":
            await update_index(dict(list(changes.items())[:n]))
            raise Crash("crash in the middle of the index")
        await update_index(changes)

    async def views_then_crash(threads, runs) -> None:
        written = [*threads, *runs][:n]
        await put_views([v for v in written if isinstance(v, ThreadView)], [v for v in written if isinstance(v, RunView)])
        raise Crash("crash between the index and the views")

    views.update_index = index_then_crash  # type: ignore[method-assign]
    views.put_views = views_then_crash  # type: ignore[method-assign]


async def listings_equal_the_fold(store: KVViewStore, views: Any) -> None:
    from tests.projections.test_listing_index import expected, queries

    for kind, filters, tenant in queries(views, random.Random(0)):
        want = expected(views, kind, filters, tenant)
        get = store.run_page if kind == "runs" else store.thread_page
        assert await get(filters, 1000, 0, tenant=tenant) == (want, len(want)), (kind, filters, tenant)


def test_kv_listings_equal_the_fold_wherever_the_batches_end_and_crash(nats_server) -> None:
    """The runner's batches end anywhere, any of them dies in the middle of its index changes or
    between them and its views, in the runner or with it: the listings equal the fold. The batch
    read again after such a crash must end where the failed one did, not where the feed happens to
    be (under load, on CI: elsewhere); otherwise the failed batch's list members stay behind though
    the views it goes on from never had them, and a run started in it and finished just after stays
    listed as running too. The boundaries here are the plan's: the runner holds the whole log before
    each batch, so `step(limit)` takes exactly `limit` commits."""
    from tests.projections.test_listing_index import with_resources

    rng = random.Random(0)
    history = with_resources(generate_history(rng, threads=4, max_runs=2, max_steps=1), rng)

    async def append() -> tuple[int, Any]:
        store = await JetStreamEventStore.connect(nats_server.url)
        try:
            versions: dict[str, int] = {}
            for c in history:
                versions[c.thread_id] = (await store.append(c, versions.get(c.thread_id, 0))).seq
            log = sorted([sc for t in versions for sc in await collect(store.read_thread(t))], key=lambda sc: sc.seq)
            assert [sc.seq for sc in log] == list(range(1, len(history) + 1))
            return len(log), fold_commits(log)
        finally:
            await store.close()

    last, want = asyncio.run(append())
    examples = iter(range(1000))

    async def run_plan(plan: list[Batch], prefix: str) -> None:
        nc = await nats.connect(nats_server.url)
        views = await KVViewStore.open(nc, prefix=prefix)
        runner = ProjectionRunner(nc, views, fetch_timeout=5)
        try:
            async with asyncio.timeout(TIMEOUT):
                await runner.open()
                for limit, crash, dies in plan:
                    if runner.applied_seq >= last:
                        break
                    while runner.buffered < last - runner.applied_seq:  # the rest of the log is in
                        await asyncio.sleep(0.002)  # (a poll on that condition, bounded above)
                    crashing(views, crash)
                    try:
                        await runner.step(limit)
                    except Crash:
                        if dies:
                            await runner.stop()
                            runner = ProjectionRunner(nc, views, fetch_timeout=5)
                            await runner.open()
                    finally:
                        vars(views).pop("update_index", None)
                        vars(views).pop("put_views", None)
                while runner.applied_seq < last:
                    await runner.step()
                await listings_equal_the_fold(views, want)
        finally:
            await runner.stop()
            js = nc.jetstream()
            for bucket in ("projections", "threads", "runs", "index"):
                await js.delete_key_value(f"{prefix}_{bucket}")
            await nc.close()

    @settings(max_examples=20, deadline=None, database=None)
    @given(batches)
    @example([(3, ("views", 0), False)])  # what CI met: the batch read again was longer
    @example([(5, ("index", 2), True), (2, ("views", 1), False)])
    def plans(plan: list[Batch]) -> None:
        asyncio.run(run_plan(plan, f"ex{next(examples)}"))

    plans()


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


async def test_lists_of_format_1_are_indexed_again_when_the_runner_opens(nats_server) -> None:
    """Views and lists written by the code before `failed` and creation order (format 1: lists
    of ids, a failed run under `done`, its view saying `done`): the runner indexes the views
    again at open, once; the views read as `failed` without a rewrite; every listing (`failed`
    and `done` among them, either order) then equals the fold, and new batches go on from
    there."""
    from unittest import mock

    from agentlog.projections import index as ix
    from agentlog.projections.listing import BUILT_KEY

    nc = await nats.connect(nats_server.url)
    store = await JetStreamEventStore.connect(nc)
    try:
        async with asyncio.timeout(TIMEOUT):
            commits = history_of_size(random.Random(11), 300, threads_per_chunk=5)
            versions: dict[str, int] = {}
            for c in commits:
                versions[c.thread_id] = (await store.append(c, versions.get(c.thread_id, 0))).seq
            log = sorted([sc for t in versions for sc in await collect(store.read_thread(t))], key=lambda sc: sc.seq)
            views = fold_commits(log)
            failed = {r for r, v in views.runs.items() if v.status == "failed"}
            assert failed and any(v.status == "done" for v in views.runs.values())
            # what the code before wrote: the views and the lists with `done`, format 1
            before = [msgspec.structs.replace(v, status="done") if v.status == "failed" else v
                      for v in views.runs.values()]
            old = await KVViewStore.open(nc)
            await old.put_views(views.threads.values(), before)
            with mock.patch.object(ix, "sort_key", lambda _created, key: key):  # lists of ids
                await old.index.put_all(list(views.threads.values()), before)
            await old.index.blobs.put_many([(BUILT_KEY, b"1")])
            await old.write_position(log[-1].seq)
            assert (await old.run_page({"status": "failed"}, 5, 0)) == ([], 0)
            assert all(r.status == "failed" for r in (await old.get_views([], sorted(failed)))[1] if r)

            runner = ProjectionRunner(nc, await KVViewStore.open(nc), fetch_timeout=0.2)
            await runner.open()
            assert await old.index.built_format() == ix.INDEX_FORMAT
            await check_listings(old, views, random.Random(2))
            got, total = await old.run_page({"status": "failed"}, 1000, 0)
            assert {r.run_id for r in got} == failed and total == len(failed)
            # once: a runner opening again has nothing to move
            assert await runner.store.ensure_index() is False  # type: ignore[attr-defined]

            # and the runner goes on: a new failed run is listed as failed
            tid, rid = "t-after", "r-after"
            await store.append(Commit(commit_id="after", thread_id=tid, run_id=rid, ts=1_800_000_000_000, events=[
                ThreadCreated(), RunStarted(run_id=rid, agent_id="a"),
                RunFinished(termination=Termination(type="error", detail="x" * 300))]), 0)
            while runner.applied_seq < await store.last_seq():
                await runner.step()
            got, total = await old.run_page({"status": "failed"}, 1, 0, descending=True)
            assert [r.run_id for r in got] == [rid] and total == len(failed) + 1
            await runner.stop()
    finally:
        await store.close()
        await nc.close()
