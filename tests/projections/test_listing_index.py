"""The listing index, pure: paged sorted lists against a set model, and listings against the fold.

Pages are made tiny (PAGE_MAX 3) so that a handful of ids already splits, empties and reuses
pages. The runner's write path is reproduced without NATS (load the views a chunk touches, fold,
`diff`, `update_index`, `put_views`) on the memory store, which runs the same `ListingIndex` code
as KV; `test_listing_reads` does the same against a real nats-server.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import Commit, ThreadCreated
from agentlog.projections import fold_commits
from agentlog.projections import index as ix
from agentlog.projections.fold import Folder
from agentlog.projections.index import Change, apply_changes, locate
from agentlog.projections.listing import READ_ATTEMPTS, DictBlobs, ListingIndex
from agentlog.projections.store import MemoryViewStore
from agentlog.testing.synth import generate_history, stored

IDS = [f"id{i:02d}" for i in range(24)]


@contextmanager
def tiny_pages(size: int = 3) -> Iterator[None]:
    with mock.patch.object(ix, "PAGE_MAX", size):
        yield


def run(coro):
    return asyncio.run(coro)


async def slice_of(index: ListingIndex, name: str, offset: int, limit: int) -> tuple[list[str], int]:
    """Ids `[offset, offset + limit)` of a whole list, and its length."""
    return (await index.ranges(name, [""], offset, limit))[0]


ops = st.lists(st.tuples(st.sets(st.sampled_from(IDS), max_size=8), st.sets(st.sampled_from(IDS), max_size=8)),
               max_size=25)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 30), st.integers(1, 10))
def test_paged_list_equals_a_sorted_set(steps, offset, limit) -> None:
    async def go() -> None:
        index = ListingIndex(DictBlobs())
        model: set[str] = set()
        for inserts, removes in steps:
            change = Change(inserts=set(inserts), removes=set(removes) - set(inserts))
            await index.apply({"l": change})
            model = (model | change.inserts) - change.removes
            ids, total = await slice_of(index, "l", 0, 1000)
            assert ids == sorted(model) and total == len(model)
            # again: idempotent, nothing written
            before = dict(index.blobs.data)
            await index.apply({"l": change})
            assert index.blobs.data == before
            header = ix.decode_header(index.blobs.data[ix.header_key("l")]) if model else None
            if header is not None:
                assert all(0 < p.count <= ix.PAGE_MAX for p in header.pages)
                assert not set(header.free) & {p.no for p in header.pages}
        ids, total = await slice_of(index, "l", offset, limit)
        assert ids == sorted(model)[offset : offset + limit] and total == len(model)

    with tiny_pages():
        run(go())


keyed = st.lists(st.tuples(st.sets(st.tuples(st.sampled_from("abc"), st.sampled_from(IDS)), max_size=10),
                          st.sets(st.tuples(st.sampled_from("abc"), st.sampled_from(IDS)), max_size=6)), max_size=12)


@settings(max_examples=100, deadline=None)
@given(keyed, st.integers(0, 12), st.integers(0, 6))
def test_ranges_of_a_shared_list_equal_the_model(steps, offset, limit) -> None:
    """A filter list holds `<value token>\\x00<id>`; each value's ids are one range of it, read
    with its size from the pages bounding it (values a, b, c; tiny pages so ranges straddle)."""
    async def go() -> None:
        index = ListingIndex(DictBlobs())
        model: set[tuple[str, str]] = set()
        for inserts, removes in steps:
            change = Change(inserts={k + ix.SEP + i for k, i in inserts},
                            removes={k + ix.SEP + i for k, i in removes - inserts})
            await index.apply({"l": change})
            model = (model | inserts) - (removes - inserts)
        prefixes = [k + ix.SEP for k in "abcd"]
        got = await index.ranges("l", prefixes, offset, limit)
        for k, (ids, size) in zip("abcd", got, strict=True):
            want = sorted(i for kk, i in model if kk == k)
            assert (ids, size) == (want[offset : offset + limit], len(want)), k

    with tiny_pages(2):
        run(go())


class Crash(Exception):
    pass


class CrashingBlobs(DictBlobs):
    """Dies on the n-th `put_many` (after the pages, before the headers, ...): having written
    the first half of its items (`chained`: a store that stops at its first failure), or every
    other one (a store whose puts land or fail each on its own)."""

    def __init__(self, chained: bool) -> None:
        super().__init__()
        self.chained = chained
        self.crash_at: int | None = None
        self.calls = 0

    async def put_many(self, items) -> None:
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            items = list(items)
            await super().put_many(items[: len(items) // 2] if self.chained else items[1::2])
            raise Crash()
        await super().put_many(items)


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(1, 3), st.booleans())
def test_a_crash_mid_write_leaves_the_committed_list_and_a_retry_completes_it(steps, crash_at, chained) -> None:
    """Copy-on-write: until the header is written, readers (and the next writer) see the old
    list whole; re-applying the same change (the redelivered batch) gives the new one."""
    async def go() -> None:
        blobs = CrashingBlobs(chained)
        index = ListingIndex(blobs)
        model: set[str] = set()
        for inserts, removes in steps:
            change = Change(inserts=set(inserts), removes=set(removes) - set(inserts))
            blobs.calls, blobs.crash_at = 0, crash_at
            try:
                await index.apply({"l": change})
            except Crash:
                ids, _ = await slice_of(ListingIndex(blobs), "l", 0, 1000)
                assert ids == sorted(model)  # the header was not written: the old list, whole
                blobs.crash_at = None
                await index.apply({"l": change})
            model = (model | change.inserts) - change.removes
            ids, total = await slice_of(ListingIndex(blobs), "l", 0, 1000)
            assert ids == sorted(model) and total == len(model)

    with tiny_pages():
        run(go())


def test_a_reader_that_races_a_write_reads_again() -> None:
    """A header read before a write, pages read after it: the stamps disagree, so the reader
    takes the header again instead of answering from a page the write replaced."""
    async def go() -> None:
        blobs = DictBlobs()
        index = ListingIndex(blobs)
        await index.apply({"l": Change(inserts={"a", "b", "c", "d"})})
        stale = blobs.data[ix.header_key("l")]
        await index.apply({"l": Change(removes={"a", "b"}, inserts={"e"})})
        await index.apply({"l": Change(inserts={"a0", "a1", "a2"})})  # reuses the freed pages
        fresh = blobs.data[ix.header_key("l")]
        served = iter([stale, fresh])
        real_get = blobs.get

        async def get(key: str):
            if key == ix.header_key("l"):
                blobs.gets += 1
                return next(served)
            return await real_get(key)

        blobs.get = get  # type: ignore[method-assign]
        ids, total = await slice_of(index, "l", 0, 10)
        assert ids == ["a0", "a1", "a2", "c", "d", "e"] and total == 6

    with tiny_pages(2):
        run(go())


def test_locate_slices_pages() -> None:
    with tiny_pages():
        header, _ = apply_changes(ix.EMPTY, {}, Change(inserts={f"x{i}" for i in range(7)}))
        spans = locate(header, 2, 3)
    assert [(s, e) for _, s, e in spans] == [(2, 3), (0, 2)]
    assert locate(header, 50, 3) == []


# -- listings against the fold -----------------------------------------------------------------


async def drive(store: MemoryViewStore, commits: list[Commit], chunk: int) -> None:
    """What `ProjectionRunner._apply_batch` does per batch, without NATS."""
    for i in range(0, len(commits), chunk):
        part = stored(commits[i : i + chunk], first_seq=i + 1)
        folder = Folder()
        old_t = {c.commit.thread_id: await store.get_thread(c.commit.thread_id) for c in part}
        old_r = {c.commit.run_id: await store.get_run(c.commit.run_id) for c in part if c.commit.run_id}
        folder.add_views([v for v in old_t.values() if v], [v for v in old_r.values() if v])
        for sc in part:
            folder.apply(sc)
        touched = folder.take_touched()
        await store.update_index(ix.diff(old_t, touched.threads, old_r, touched.runs))
        await store.put_views(touched.threads.values(), touched.runs.values())


Query = tuple[str, dict[str, str], "str | None"]
RESOURCE_IDS = [None, "res1", "acme/a", "acme/b", "acme b (free text)", "beta"]
TENANTS = ["acme", "res", "b", "zzz"]


def with_resources(commits: list[Commit], rng: random.Random) -> list[Commit]:
    """The generated threads, spread over resources: a few per tenant prefix, some not safe
    as KV tokens (hashed), some none."""
    out = []
    for c in commits:
        events = [msgspec.structs.replace(e, resource_id=rng.choice(RESOURCE_IDS)) if isinstance(e, ThreadCreated)
                  else e for e in c.events]
        out.append(msgspec.structs.replace(c, events=events))
    return out


def queries(views, rng: random.Random) -> Iterator[Query]:
    runs, threads = list(views.runs.values()), list(views.threads.values())
    yield "runs", {}, None
    yield "threads", {}, None
    for status in ("running", "waiting", "done", "failed"):
        yield "runs", {"status": status}, None
    for r in rng.sample(runs, min(3, len(runs))):
        yield "runs", {"thread_id": r.thread_id}, None
        yield "runs", {"agent_id": r.agent_id or "agent"}, None
        yield "runs", {"thread_id": r.thread_id, "status": r.status}, None
        if r.parent_run_id:
            yield "runs", {"parent_run_id": r.parent_run_id}, None
    yield "runs", {"parent_run_id": "nope"}, None
    for resource_id in RESOURCE_IDS[1:]:
        yield "threads", {"resource_id": resource_id}, None
    for t in rng.sample(threads, min(2, len(threads))):
        yield "threads", {"parent_thread_id": t.thread_id}, None
    for tenant in TENANTS:
        yield "runs", {}, tenant
        yield "threads", {}, tenant
        yield "runs", {"status": rng.choice(["running", "waiting", "done", "failed"])}, tenant
        for t in rng.sample(threads, min(1, len(threads))):
            yield "threads", {"parent_thread_id": t.thread_id}, tenant


def expected(views, kind: str, filters: dict[str, str], tenant: str | None) -> list:
    """What the listings answered when they filtered every view (the code before the index)."""
    def visible(thread_id: str) -> bool:
        t = views.threads.get(thread_id)
        return tenant is None or (t is not None and t.resource_id is not None and t.resource_id.startswith(tenant))

    items = views.runs if kind == "runs" else views.threads
    ordered = sorted(items.items(), key=lambda item: (item[1].created, item[0]))  # by creation, then id
    return [v for _, v in ordered if ix.matches(v, filters) and visible(v.thread_id)]


async def check_listings(store, views, rng: random.Random) -> None:
    """Every query, paged from either end: ascending id, and newest first (`descending`)."""
    for kind, filters, tenant in queries(views, rng):
        want = expected(views, kind, filters, tenant)
        get = store.run_page if kind == "runs" else store.thread_page
        for offset, limit in ((0, 200), (0, 1), (1, 2), (len(want), 5), (rng.randint(0, 6), rng.randint(1, 4))):
            for descending, order in ((False, want), (True, want[::-1])):
                got, total = await get(filters, limit, offset, tenant=tenant, descending=descending)
                assert total == len(want), (kind, filters, tenant)
                assert got == order[offset : offset + limit], (kind, filters, tenant, offset, limit, descending)


@settings(max_examples=30, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 40))
def test_listings_equal_the_fold_for_generated_histories(rng, chunk) -> None:
    """However the log is cut into batches, every listing (filters, pages, totals) equals
    filtering and sorting the pure fold: status changes move runs between status lists,
    deleted threads leave every list."""
    commits = with_resources(generate_history(rng, threads=6, max_runs=3, max_steps=3), rng)
    views = fold_commits(stored(commits))

    async def go() -> None:
        store = MemoryViewStore()
        await drive(store, commits, chunk)
        await check_listings(store, views, rng)
        # the rebuild path (every list at once) gives the same listings
        bulk = MemoryViewStore()
        await bulk.put_views(views.threads.values(), views.runs.values())
        assert await bulk.ensure_index() is True and await bulk.ensure_index() is False
        await check_listings(bulk, views, rng)

    with tiny_pages():
        run(go())


def test_listing_reads_do_not_grow_with_the_number_of_runs() -> None:
    """limit=1 reads one header, one page and one view, at 300 runs as at 3000 (pure count)."""
    async def reads(n: int) -> int:
        store = MemoryViewStore()
        commits = generate_history(random.Random(7), threads=n // 3, max_runs=3, max_steps=1)
        await drive(store, commits, 500)
        blobs = store.index.blobs
        assert isinstance(blobs, DictBlobs)
        blobs.gets = 0
        page, total = await store.run_page({}, 1, 0)
        assert len(page) == 1 and total == len(store.runs) >= n // 3
        return blobs.gets

    assert run(reads(300)) == run(reads(3000)) == 2



def test_a_reader_that_never_gets_a_consistent_list_gives_up_with_a_typed_503() -> None:
    from agentlog.gateway.http.errors import status_of
    from agentlog.projections.errors import ListingBusy

    class Churning(DictBlobs):
        async def get(self, key: str):
            data = await super().get(key)
            if key.startswith("p.") and data is not None:
                page = ix.decode_page(data)
                return ix.encode(ix.Page(page.stamp + 1, page.ids))  # always a newer write's page
            return data

    async def go() -> None:
        index = ListingIndex(Churning())
        await index.apply({"l": Change(inserts={"a"})})
        index.blobs.gets = 0
        try:
            await slice_of(index, "l", 0, 1)
        except ListingBusy as exc:
            assert status_of(exc) == 503
            assert index.blobs.gets == 2 * READ_ATTEMPTS
        else:
            raise AssertionError("expected ListingBusy")

    run(go())
