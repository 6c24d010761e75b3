"""The listing index on a key-value store: the runner writes it, listings read it.

`ListingIndex` runs the pure lists of `agentlog.projections.index` over a tiny `Blobs` protocol (get one
key, put many), implemented on a JetStream KV bucket (`KVBlobs`) and on a dict (`DictBlobs`, for
pure unit tests), so both view stores share one code path.

Costs: a listing with at most one filter reads 1 header + the 1-2 pages covering the slice +
`limit` views, whatever the number of runs. With several filters the smallest matching list is
walked and its views read (O(size of that list), e.g. a thread's runs). A tenant's listing reads
the resources list's range for its prefix, then merges its resources' lists (O(its resources +
limit)); with filters it walks that union. The writer (the runner holding the writer lease,
`agentlog.projections.lease`) keeps an LRU cache of headers and pages; it is dropped on any
failed write, since it might then hold what never reached the store, and whenever the writer
(re)takes the lease.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from agentlog.projections.errors import ListingBusy, ProjectionError
from agentlog.projections.index import (
    ALL_RUNS,
    ALL_THREADS,
    EMPTY,
    INDEX_FORMAT,
    RESOURCES,
    Changes,
    Header,
    Page,
    PageRef,
    Slot,
    apply_changes,
    bound_page,
    build,
    decode_header,
    decode_page,
    encode,
    header_key,
    key_id,
    locate,
    locate_prefix,
    matches,
    page_key,
    prefix_end,
    rank,
    resource_slot,
    run_slot,
    target_pages,
    thread_slot,
)
from agentlog.projections.kvpipe import WriteFence, put_many
from agentlog.projections.views import RunView, ThreadView

PUT_CONCURRENCY = 512
#: Reads that raced a write re-read the header; a write takes a few ms, so this never runs out
#: in practice (it would take that many writes of the same list during one listing).
READ_ATTEMPTS = 50

#: Written by `put_all`: the lists are complete (not a list name: those start with `h.`/`p.`). Its
#: value is the lists' format (`index.INDEX_FORMAT`; "1" for lists written before formats had a
#: number).
BUILT_KEY = "built"

V = TypeVar("V")
Span = tuple[PageRef, int, int]


class Blobs(Protocol):
    #: `put_many` stores its items in order and none after one it could not store (else any of
    #: them may land without the ones before it).
    chained: bool

    async def get(self, key: str) -> bytes | None: ...

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...


class DictBlobs:
    """`Blobs` in a dict (pure unit tests). `gets` counts reads."""

    chained = True

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.gets = 0

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        return self.data.get(key)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        self.data.update(items)


class KVBlobs:
    """`Blobs` on a JetStream KV bucket: direct gets, pipelined acked puts (fenced with `fence`:
    `agentlog.projections.kvpipe.WriteFence`)."""

    def __init__(self, kv: KeyValue, fence: WriteFence | None = None) -> None:
        self.kv = kv
        self.fence = fence
        #: Fenced puts are a chain (`agentlog.projections.kvpipe`).
        self.chained = fence is not None

    async def get(self, key: str) -> bytes | None:
        return await kv_get(self.kv, key)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        await put_pipelined([(self.kv, k, v) for k, v in items], fence=self.fence)


async def kv_get(kv: KeyValue, key: str) -> bytes | None:
    """The key's value, or None if it has none."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value


async def put_pipelined(writes: Sequence[tuple[KeyValue, str, bytes]], *, fence: WriteFence | None = None) -> None:
    """KV puts, many in flight, each acked (views and lists alike: `agentlog.projections.kvpipe`)."""
    if writes:
        await put_many(writes[0][0]._js._nc, writes, fence=fence)


class ListingIndex:
    """The lists of one view generation: `apply`/`put_all` for the writer, `page` for readers."""

    def __init__(self, blobs: Blobs, *, cache_size: int = 20_000) -> None:
        self.blobs = blobs
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Header | Page] = OrderedDict()

    # -- writer (the projection runner) ------------------------------------------------------

    async def _cached(self, keys: list[str], decode: Callable[[bytes], Any], default: Any) -> list[Any]:
        """The values of `keys`, from the cache, else read (the misses at once)."""
        values = [self._cache.get(key) for key in keys]
        missing = [i for i, value in enumerate(values) if value is None]
        if missing:
            datas = await asyncio.gather(*(self.blobs.get(keys[i]) for i in missing))
            for i, data in zip(missing, datas, strict=True):
                values[i] = decode(data) if data is not None else default
        return values

    async def apply(self, changes: Changes) -> None:
        """Apply list changes: every changed page, then the headers (see `index`), so a header
        never lands without its pages: in one `put_many` where the store chains its items."""
        if not changes:
            return
        try:
            names = list(changes)
            headers: list[Header] = await self._cached([header_key(n) for n in names], decode_header, EMPTY)
            wanted = [(n, h, h.pages[pos]) for n, h in zip(names, headers, strict=True)
                      for pos in target_pages(h, changes[n].inserts | changes[n].removes)]
            loaded: list[Page | None] = await self._cached([page_key(n, ref.no) for n, _, ref in wanted],
                                                           decode_page, None)
            pages: dict[str, dict[int, Page]] = {n: {} for n in names}
            for (n, _, ref), page in zip(wanted, loaded, strict=True):
                if page is None or page.stamp != ref.stamp:
                    raise ProjectionError(f"listing index {n!r}: page {ref.no} does not match its header")
                pages[n][ref.no] = page
            page_puts: list[tuple[str, Header | Page]] = []
            header_puts: list[tuple[str, Header | Page]] = []
            for n, h in zip(names, headers, strict=True):
                new, written = apply_changes(h, pages[n], changes[n])
                if new is h:
                    continue
                page_puts += [(page_key(n, no), p) for no, p in written.items()]
                header_puts.append((header_key(n), new))
            for puts in ([page_puts + header_puts] if self.blobs.chained else [page_puts, header_puts]):
                await self.blobs.put_many([(k, encode(v)) for k, v in puts])
                self._remember(puts)
        except BaseException:
            self._cache.clear()
            raise

    async def put_all(self, threads: Sequence[ThreadView], runs: Sequence[RunView]) -> None:
        """Write every list of these views at once: into an empty store (the rebuild), or over
        lists of an older format of the same views (the same lists: every header is replaced;
        pages past the new ones are left unreferenced, and the next writes reuse their numbers)."""
        puts: list[tuple[str, bytes]] = []
        headers: list[tuple[str, bytes]] = []
        for name, (header, pages) in build(threads, runs).items():
            puts += [(page_key(name, no), encode(p)) for no, p in pages.items()]
            headers.append((header_key(name), encode(header)))
        await self.blobs.put_many(puts)
        await self.blobs.put_many(headers)
        await self.mark_built()
        self._cache.clear()

    async def mark_built(self) -> None:
        """Record that the lists cover every view, in the current format."""
        await self.blobs.put_many([(BUILT_KEY, str(INDEX_FORMAT).encode())])

    async def built_format(self) -> int | None:
        """The format the lists are in, or None when they do not cover the views yet (`put_all`
        never ran on this store: its views predate the index and must be indexed once)."""
        data = await self.blobs.get(BUILT_KEY)
        if data is None:
            return None
        try:
            return int(data)
        except ValueError:
            return 1

    async def is_built(self) -> bool:
        """Whether the lists cover every view (in whatever format)."""
        return await self.built_format() is not None

    def _remember(self, items: list[tuple[str, Header | Page]]) -> None:
        for key, value in items:
            self._cache[key] = value
            self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def forget_cache(self) -> None:
        self._cache.clear()

    # -- readers ------------------------------------------------------------------------------

    async def _header(self, name: str) -> Header:
        data = await self.blobs.get(header_key(name))
        return decode_header(data) if data is not None else EMPTY

    async def _pages(self, name: str, refs: Iterable[PageRef]) -> dict[int, Page] | None:
        """The pages `refs` name, or None if one is not what its ref says (a write replaced it
        since the header was read: read again)."""
        wanted = list({ref.no: ref for ref in refs}.values())
        datas = await asyncio.gather(*(self.blobs.get(page_key(name, ref.no)) for ref in wanted))
        pages: dict[int, Page] = {}
        for ref, data in zip(wanted, datas, strict=True):
            page = decode_page(data) if data is not None else None
            if page is None or page.stamp != ref.stamp:
                return None
            pages[ref.no] = page
        return pages

    async def _read(self, name: str, select: Callable[[Header], list[Span]]) -> tuple[list[str], int]:
        """The ids of the spans `select` picks from a list's header, and the list's length, all
        from one consistent header."""
        for _ in range(READ_ATTEMPTS):
            header = await self._header(name)
            spans = select(header)
            pages = await self._pages(name, (ref for ref, _, _ in spans))
            if pages is not None:
                return [i for ref, a, b in spans for i in pages[ref.no].ids[a:b]], header.total
        raise ListingBusy(f"listing index {name!r} kept changing while read; retry")

    async def prefixed(self, name: str, prefix: str) -> list[str]:
        """The ids of a list that start with `prefix`: one key range, as the lists are sorted."""
        ids, _ = await self._read(name, lambda header: locate_prefix(header, prefix))
        return [i for i in ids if i.startswith(prefix)]

    async def ranges(self, name: str, prefixes: Sequence[str], offset: int, limit: int, *,
                     descending: bool = False) -> list[tuple[list[str], int]]:
        """Per prefix (`""`: the whole list), the ids `[offset, offset + limit)` of its range
        (prefix stripped; `descending`: counted from its end, highest id first) and the range's
        size, all from one consistent header: the header, the pages bounding each range (to rank
        its ends), the pages holding the slices."""
        for _ in range(READ_ATTEMPTS):
            header = await self._header(name)
            ends = [key for p in prefixes if p for key in (p, prefix_end(p))]
            pages = await self._pages(name, (ref for key in ends if (ref := bound_page(header, key)) is not None))
            if pages is None:
                continue
            plan: list[tuple[str, int, list[Span]]] = []
            for p in prefixes:
                start, end = (rank(header, pages, p), rank(header, pages, prefix_end(p))) if p else (0, header.total)
                size = end - start
                count = max(0, min(limit, size - offset))
                first = size - offset - count if descending else offset
                plan.append((p, size, locate(header, start + first, count)))
            more = await self._pages(name, (ref for _, _, spans in plan for ref, _, _ in spans if ref.no not in pages))
            if more is None:
                continue
            pages.update(more)
            out = [([m[len(p):] for ref, a, b in spans for m in pages[ref.no].ids[a:b]], size)
                   for p, size, spans in plan]
            if descending:
                for ids, _ in out:
                    ids.reverse()
            return out
        raise ListingBusy(f"listing index {name!r} kept changing while read; retry")

    async def _union(self, name: str, prefixes: Sequence[str], offset: int, limit: int, descending: bool,
                     ) -> tuple[list[str], int]:
        """Ids `[offset, offset + limit)` of the union of disjoint ranges of one list, in id order
        (`descending`: highest first), and its size: the first offset + limit of each range, merged."""
        if len(prefixes) == 1:
            return (await self.ranges(name, prefixes, offset, limit, descending=descending))[0]
        parts = await self.ranges(name, prefixes, 0, offset + limit, descending=descending)
        merged = heapq.merge(*(ids for ids, _ in parts), reverse=descending)
        return list(itertools.islice(merged, offset, offset + limit)), sum(size for _, size in parts)

    async def size(self, slot: Slot) -> int:
        name, prefix = slot
        return (await self.ranges(name, [prefix], 0, 0))[0][1]

    async def page(
        self, name: str, prefixes: Sequence[str], *, exact: bool, keep: Callable[[V], bool], limit: int,
        offset: int, load: Callable[[str], Awaitable[V | None]], descending: bool = False,
    ) -> tuple[list[V], int]:
        """One page of views, `(views, total)`, from the union of disjoint ranges of list `name`,
        in ascending sort key order (`index.sort_key`: oldest first; `descending`: newest first).
        `load` reads a view by id.

        `exact`: the union is the answer (no filter, one filter, or a tenant's resources): read
        the slice and `limit` views. Else the union holds the answer: read it all and `keep`
        what matches (O(size of the union); callers pass the smallest). Views `keep` rejects are
        left out in both cases: the index is written before the views, so a listing racing the
        runner (no `min_seq`) may see an id a moment before its view."""
        if exact:
            ids, total = await self._union(name, prefixes, offset, limit, descending)
            views = await asyncio.gather(*(load(key_id(i)) for i in ids))
            return [v for v in views if v is not None and keep(v)], total
        ids, _ = await self._union(name, prefixes, 0, sys.maxsize, descending)
        found: list[V] = []
        for i in range(0, len(ids), PUT_CONCURRENCY):
            views = await asyncio.gather(*(load(key_id(x)) for x in ids[i : i + PUT_CONCURRENCY]))
            found += [v for v in views if v is not None and keep(v)]
        return found[offset : offset + limit], len(found)

    async def smallest(self, slots: Sequence[Slot]) -> Slot:
        sizes = await asyncio.gather(*(self.size(slot) for slot in slots))
        return min(zip(sizes, slots, strict=True))[1]


class IndexedListings:
    """The listing part of a `ViewStore`, for a store with an `index` and `get_run`/`get_thread`.

    Without a tenant: no filter or one filter reads one range (O(limit)); several walk the
    smallest of their ranges. With a tenant (a `resource_id` prefix): its resources are a key
    range of the resources list, and the answer is the union of their ranges (O(resources of
    the tenant + limit)); with filters too, that union is walked."""

    index: ListingIndex
    get_run: Callable[[str], Awaitable[RunView | None]]
    get_thread: Callable[[str], Awaitable[ThreadView | None]]
    list_threads: Callable[[], Awaitable[list[ThreadView]]]
    list_runs: Callable[[], Awaitable[list[RunView]]]

    async def ensure_index(self) -> bool:
        """Index the views once if the lists do not cover them, or are of an older format
        (`index.INDEX_FORMAT`): views that predate the index, or lists of ids that listed failed
        runs under `done`. A full scan, done by the runner at open, before it applies anything;
        the views need no rewrite (`views.decode_run` reads an older failed run as `failed`).
        True if it ran."""
        built = await self.index.built_format()
        if built is not None and built >= INDEX_FORMAT:
            return False
        threads, runs = await self.list_threads(), await self.list_runs()
        await self.index.put_all(threads, runs)
        return True

    async def update_index(self, changes: Changes) -> None:
        """Apply the runner's list changes (before it writes the views they come from)."""
        await self.index.apply(changes)

    async def _source(self, slots: list[Slot], everything: str, tenant: str | None,
                      tenant_slot: Callable[[str], Slot]) -> tuple[str, list[str], bool]:
        """Which ranges to read (one list, its prefixes), and whether they are exactly the answer."""
        if tenant is not None:
            mine = [tenant_slot(r) for r in await self.index.prefixed(RESOURCES, tenant)]
            name = mine[0][0] if mine else tenant_slot("")[0]
            return name, [prefix for _, prefix in mine], not slots
        if not slots:
            return everything, [""], True
        name, prefix = slots[0] if len(slots) == 1 else await self.index.smallest(slots)
        return name, [prefix], len(slots) == 1

    async def run_page(self, filters: Mapping[str, str], limit: int, offset: int, *, tenant: str | None = None,
                       descending: bool = False) -> tuple[list[RunView], int]:
        """Runs with every `filters` attribute at its value (on threads whose resource_id starts
        with `tenant`, if given), oldest first (`descending`: newest first): `(page, total)`."""
        slots = [run_slot(attr, value) for attr, value in filters.items()]
        name, prefixes, exact = await self._source(slots, ALL_RUNS, tenant, resource_slot)
        return await self.index.page(name, prefixes, exact=exact, keep=lambda v: matches(v, filters),
                                     limit=limit, offset=offset, load=self.get_run, descending=descending)

    async def thread_page(self, filters: Mapping[str, str], limit: int, offset: int, *, tenant: str | None = None,
                          descending: bool = False) -> tuple[list[ThreadView], int]:
        """Live (not deleted) threads matching `filters` (and whose resource_id starts with
        `tenant`, if given), oldest first (`descending`: newest first): `(page, total)`."""
        slots = [thread_slot(attr, value) for attr, value in filters.items()]
        name, prefixes, exact = await self._source(slots, ALL_THREADS, tenant,
                                                   lambda resource_id: thread_slot("resource_id", resource_id))

        def keep(view: ThreadView) -> bool:
            return matches(view, filters) and (
                tenant is None or (view.resource_id is not None and view.resource_id.startswith(tenant)))

        return await self.index.page(name, prefixes, exact=exact, keep=keep, limit=limit, offset=offset,
                                     load=self.get_thread, descending=descending)


__all__ = ["Blobs", "DictBlobs", "IndexedListings", "KVBlobs", "ListingIndex", "PUT_CONCURRENCY", "READ_ATTEMPTS",
           "kv_get", "put_pipelined"]
