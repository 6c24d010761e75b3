"""The listing index on a key-value store: the runner writes it, listings read it.

`ListingIndex` runs the pure lists of `projections.index` over a tiny `Blobs` protocol (get one
key, put many), implemented on a JetStream KV bucket (`KVBlobs`) and on a dict (`DictBlobs`, for
pure unit tests), so both view stores share one code path.

Costs: a listing with at most one filter reads 1 header + the 1-2 pages covering the slice +
`limit` views, whatever the number of runs. With several filters the smallest matching list is
walked and its views read (O(size of that list), e.g. a thread's runs). The writer (ONE runner
per view set) keeps an LRU cache of headers and pages; it is dropped on any failed write, since
it might then hold what never reached the store.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from .errors import ListingBusy, ProjectionError
from .index import (
    ALL_RUNS,
    ALL_THREADS,
    EMPTY,
    Changes,
    Header,
    Page,
    apply_changes,
    build,
    decode_header,
    decode_page,
    encode,
    header_key,
    locate,
    matches,
    page_key,
    run_list,
    target_pages,
    thread_list,
)
from .views import RunView, ThreadView

PUT_CONCURRENCY = 512
#: Reads that raced a write re-read the header; a write takes a few ms, so this never runs out
#: in practice (it would take that many writes of the same list during one listing).
READ_ATTEMPTS = 50

#: Written by `put_all`: the lists are complete (not a list name: those start with `h.`/`p.`).
BUILT_KEY = "built"

V = TypeVar("V")


class Blobs(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...


class DictBlobs:
    """`Blobs` in a dict (pure unit tests). `gets` counts reads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.gets = 0

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        return self.data.get(key)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        self.data.update(items)


class KVBlobs:
    """`Blobs` on a JetStream KV bucket: direct gets, pipelined acked puts."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, key: str) -> bytes | None:
        try:
            return (await self.kv.get(key)).value
        except KeyNotFoundError:
            return None

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        await put_pipelined([(self.kv, k, v) for k, v in items])


async def put_pipelined(writes: Sequence[tuple[KeyValue, str, bytes]]) -> None:
    """KV puts, PUT_CONCURRENCY in flight, each acked (views and lists alike)."""
    for i in range(0, len(writes), PUT_CONCURRENCY):
        await asyncio.gather(*(kv.put(key, value) for kv, key, value in writes[i : i + PUT_CONCURRENCY]))


class ListingIndex:
    def __init__(self, blobs: Blobs, *, cache_size: int = 20_000) -> None:
        self.blobs = blobs
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Header | Page] = OrderedDict()

    # -- writer (the projection runner) ------------------------------------------------------

    async def _cached(self, key: str, decode: Callable[[bytes], Any], default: Any) -> Any:
        value = self._cache.get(key)
        if value is None:
            data = await self.blobs.get(key)
            value = decode(data) if data is not None else default
        return value

    async def apply(self, changes: Changes) -> None:
        """Apply list changes: every changed page first, then the headers (see `index`)."""
        if not changes:
            return
        try:
            names = list(changes)
            headers: list[Header] = await asyncio.gather(
                *(self._cached(header_key(n), decode_header, EMPTY) for n in names))
            wanted = [(n, h, h.pages[pos]) for n, h in zip(names, headers, strict=True)
                      for pos in target_pages(h, changes[n].inserts | changes[n].removes)]
            loaded: list[Page | None] = await asyncio.gather(
                *(self._cached(page_key(n, ref.no), decode_page, None) for n, _, ref in wanted))
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
            for puts in (page_puts, header_puts):
                await self.blobs.put_many([(k, encode(v)) for k, v in puts])
                self._remember(puts)
        except BaseException:
            self._cache.clear()
            raise

    async def put_all(self, threads: Sequence[ThreadView], runs: Sequence[RunView]) -> None:
        """Write every list of these views at once, into an empty store (the rebuild)."""
        puts: list[tuple[str, bytes]] = []
        headers: list[tuple[str, bytes]] = []
        for name, (header, pages) in build(threads, runs).items():
            puts += [(page_key(name, no), encode(p)) for no, p in pages.items()]
            headers.append((header_key(name), encode(header)))
        await self.blobs.put_many(puts)
        await self.blobs.put_many(headers)
        await self.blobs.put_many([(BUILT_KEY, b"1")])
        self._cache.clear()

    async def is_built(self) -> bool:
        """Whether the lists cover every view (`put_all` ran on this store); a store whose views
        predate the index has views but no lists yet, and must be indexed once."""
        return await self.blobs.get(BUILT_KEY) is not None

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

    async def _slice(self, name: str, offset: int, limit: int) -> tuple[list[str], int]:
        """Ids `[offset, offset + limit)` of a list and its length, from one consistent header."""
        for _ in range(READ_ATTEMPTS):
            header = await self._header(name)
            spans = locate(header, offset, limit)
            datas = await asyncio.gather(*(self.blobs.get(page_key(name, ref.no)) for ref, _, _ in spans))
            ids: list[str] = []
            for (ref, start, end), data in zip(spans, datas, strict=True):
                page = decode_page(data) if data is not None else None
                if page is None or page.stamp != ref.stamp:
                    break  # a write replaced the page since we read the header: read again
                ids.extend(page.ids[start:end])
            else:
                return ids, header.total
        raise ListingBusy(f"listing index {name!r} kept changing while read; retry")

    async def total(self, name: str) -> int:
        return (await self._header(name)).total

    async def page(
        self, lists: Mapping[str, str], filters: Mapping[str, Any], limit: int, offset: int,
        load: Callable[[str], Awaitable[V | None]], everything: str,
    ) -> tuple[list[V], int]:
        """One page of the views in `lists[attr]` for every filter (`everything` when none):
        `(views, total)`. Views that do not (yet) match their filter are left out: the index is
        written before the views, so a listing that races the runner (no `min_seq`) may see an
        id a moment before its view."""
        names = list(lists.values()) or [everything]
        if len(names) == 1:
            ids, total = await self._slice(names[0], offset, limit)
            views = await asyncio.gather(*(load(i) for i in ids))
            return [v for v in views if v is not None and matches(v, filters)], total
        totals = await asyncio.gather(*(self.total(n) for n in names))
        smallest = min(zip(totals, names, strict=True))[1]
        ids, _ = await self._slice(smallest, 0, min(totals))
        found: list[V] = []
        for i in range(0, len(ids), PUT_CONCURRENCY):
            views = await asyncio.gather(*(load(x) for x in ids[i : i + PUT_CONCURRENCY]))
            found += [v for v in views if v is not None and matches(v, filters)]
        return found[offset : offset + limit], len(found)


class IndexedListings:
    """The listing part of a `ViewStore`, for a store with an `index` and `get_run`/`get_thread`."""

    index: ListingIndex
    get_run: Callable[[str], Awaitable[RunView | None]]
    get_thread: Callable[[str], Awaitable[ThreadView | None]]
    list_threads: Callable[[], Awaitable[list[ThreadView]]]
    list_runs: Callable[[], Awaitable[list[RunView]]]

    async def ensure_index(self) -> bool:
        """Index the views once if they predate the index (a store written before it existed):
        a full scan, done by the runner at open, before it applies anything. True if it ran."""
        if await self.index.is_built():
            return False
        threads, runs = await self.list_threads(), await self.list_runs()
        await self.index.put_all(threads, runs)
        return True

    async def update_index(self, changes: Changes) -> None:
        """Apply the runner's list changes (before it writes the views they come from)."""
        await self.index.apply(changes)

    async def run_page(self, filters: Mapping[str, str], limit: int, offset: int) -> tuple[list[RunView], int]:
        """Runs with every `filters` attribute at its value, ascending run id: `(page, total)`."""
        lists = {attr: run_list(attr, value) for attr, value in filters.items()}
        return await self.index.page(lists, filters, limit, offset, self.get_run, ALL_RUNS)

    async def thread_page(self, filters: Mapping[str, str], limit: int, offset: int,
                          ) -> tuple[list[ThreadView], int]:
        """Live (not deleted) threads matching `filters`, ascending thread id: `(page, total)`."""
        lists = {attr: thread_list(attr, value) for attr, value in filters.items()}
        return await self.index.page(lists, filters, limit, offset, self.get_thread, ALL_THREADS)


__all__ = ["Blobs", "DictBlobs", "IndexedListings", "KVBlobs", "ListingIndex", "PUT_CONCURRENCY", "READ_ATTEMPTS",
           "put_pipelined"]
