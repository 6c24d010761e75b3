"""The listing index, pure part: which ordered lists a view belongs to, and paged sorted lists.

Why: `GET /v1/runs?limit=1` must not read every view. So the runner keeps, in the same pass
as the views, a few sorted lists: all runs and all (live) threads by their sort key (`sort_key`:
creation time, then id), and one list per filter whose members are `<token of the value>\\x00<sort
key>`, so the runs of one thread (status, agent, parent run, resource) and the threads of one
resource (parent thread) are one key range of it. A
listing reads a header, the 1-2 pages bounding the range, the page(s) holding
`[offset, offset + limit)` of it and `limit` views: O(limit) reads whatever the number of runs
(the header's size grows with pages, n / PAGE_MAX, not its reads). Shared lists, not one list
per thread or parent: a new run touches a fixed handful of lists (mostly their last pages, sort
keys starting with the creation time), which keeps the runner's extra KV writes per batch small.

Lists are kept in ascending sort key order, i.e. creation order (the view's `created`: its first
commit's time; ids break ties), whatever the ids look like (generated ones are time-ordered, a
client's may be random); a listing reads a slice from either end (`descending`: newest first).
Keys are kept sorted inside pages; pages are sorted by their first key.

A list is stored as a `Header` (page refs: number, stamp, count, first id; plus the free page
numbers) and `Page`s (sorted ids). Writes are copy-on-write: a changed page is written under a
page number the committed header does not reference, then the header; the pages it replaced go
to the free list for the next write. So a crash mid-write leaves the committed header and its
pages intact (the batch is redelivered and re-applied; inserts/removes are idempotent), and a
reader that raced a write notices through the stamps (every page carries the stamp of the write
that made it, the header names the stamp it expects) and reads again.

The format of the stored lists is `INDEX_FORMAT`; an index of an older format is brought to it
once, when the runner opens (`agentlog.projections.listing.IndexedListings.ensure_index`).

Everything here is pure (no I/O): `run_entries`, `diff`, `apply_changes`, `locate`, `rank`, `build`.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from agentlog.projections.views import RunView, ThreadView

#: Most ids in one page; a page growing past it is split. Pages built in bulk are filled to it.
PAGE_MAX = 256

#: Run filters of `GET /v1/runs` (view attribute -> index token) and of `GET /v1/threads`.
RUN_FILTERS: dict[str, str] = {"thread_id": "thread", "status": "status", "agent_id": "agent",
                               "parent_run_id": "parent"}
THREAD_FILTERS: dict[str, str] = {"resource_id": "resource", "parent_thread_id": "parent"}
ALL_RUNS = "r"
ALL_THREADS = "t"
#: The distinct `resource_id`s of threads (raw values, insert-only): a tenant's resources are the
#: range of it that starts with the tenant's prefix.
RESOURCES = "res"

#: What the stored lists hold. 1: ids, a failed run under status `done` (its view said so);
#: 2: sort keys (`sort_key`), a failed run under `failed`. Stored next to the lists
#: (`agentlog.projections.listing.BUILT_KEY`).
INDEX_FORMAT = 2

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def token(value: str) -> str:
    """A KV-key-safe token for a filter value: the value itself when it is a short safe id, else
    `=` + a hash (resource ids are free text). Safe values never contain `=`, so no collision."""
    if _SAFE.fullmatch(value):
        return value
    return "=" + hashlib.sha256(value.encode()).hexdigest()[:40]


#: Separates a filter value's token from the id in a member of a filter list (sorts below every
#: token character, so one value's members are one key range: `[prefix, prefix_end)`).
SEP = "\x00"

Slot = tuple[str, str]
"""A listing's place in the index: (list name, member prefix); prefix "" is the whole list."""


def _slot(kind: str, short: str, value: str) -> Slot:
    return f"{kind}.{short}", token(value) + SEP


def run_slot(attr: str, value: str) -> Slot:
    """Where the runs whose `attr` equals `value` are: one range of one shared list."""
    return _slot(ALL_RUNS, RUN_FILTERS[attr], value)


def thread_slot(attr: str, value: str) -> Slot:
    """Where the (not deleted) threads whose `attr` equals `value` are."""
    return _slot(ALL_THREADS, THREAD_FILTERS[attr], value)


def resource_slot(resource_id: str) -> Slot:
    """Where the runs on threads of `resource_id` are (tenant-scoped listings)."""
    return _slot(ALL_RUNS, "resource", resource_id)


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (which ends with SEP)."""
    return prefix[:-1] + chr(ord(SEP) + 1)


Entry = tuple[str, str]  # (list name, member)


def sort_key(created: int, key: str) -> str:
    """Where a view sorts in the lists: its creation time (commit ms, fixed width), then its id
    (ids are `[A-Za-z0-9_-]`: no `.`)."""
    return f"{created:015d}.{key}"


def key_id(member: str) -> str:
    """The id in a sort key (`sort_key`)."""
    return member.rpartition(".")[2]


def _entries(key: str, everything: str, slots: list[Slot]) -> frozenset[Entry]:
    return frozenset([(everything, key), *((name, prefix + key) for name, prefix in slots)])


def run_entries(view: RunView | None, resource_id: str | None = None) -> frozenset[Entry]:
    """Every (list, member) the run is in (none for no view); `resource_id` is its thread's."""
    if view is None:
        return frozenset()
    slots = [run_slot(attr, v) for attr in RUN_FILTERS if (v := getattr(view, attr)) is not None]
    if resource_id is not None:
        slots.append(resource_slot(resource_id))
    return _entries(sort_key(view.created, view.run_id), ALL_RUNS, slots)


def thread_entries(view: ThreadView | None) -> frozenset[Entry]:
    """Every (list, member) the thread is in: none once deleted (listings never show them)."""
    if view is None or view.deleted:
        return frozenset()
    slots = [thread_slot(attr, v) for attr in THREAD_FILTERS if (v := getattr(view, attr)) is not None]
    return _entries(sort_key(view.created, view.thread_id), ALL_THREADS, slots)


class Change(msgspec.Struct):
    """Ids to insert into / remove from one list."""

    inserts: set[str] = msgspec.field(default_factory=set)
    removes: set[str] = msgspec.field(default_factory=set)


Changes = dict[str, Change]


def diff(
    old_threads: Mapping[str, ThreadView | None], new_threads: Mapping[str, ThreadView],
    old_runs: Mapping[str, RunView | None], new_runs: Mapping[str, RunView],
) -> Changes:
    """The list changes that take the index from the old views to the new ones (a status change
    moves a run from one status list to another; a delete takes a thread out of every list)."""
    changes: Changes = {}

    def note(before: frozenset[Entry], after: frozenset[Entry]) -> None:
        for name, member in after - before:
            changes.setdefault(name, Change()).inserts.add(member)
        for name, member in before - after:
            changes.setdefault(name, Change()).removes.add(member)

    for tid, view in new_threads.items():
        old = old_threads.get(tid)
        note(thread_entries(old), thread_entries(view))
        if view.resource_id is not None and (old is None or old.resource_id != view.resource_id):
            changes.setdefault(RESOURCES, Change()).inserts.add(view.resource_id)
    for rid, rview in new_runs.items():
        # A thread's resource_id is set when it is created, before its runs: the same for the
        # run's old and new entries. Every thread of a batch is in `old_threads` (loaded).
        thread = new_threads.get(rview.thread_id) or old_threads.get(rview.thread_id)
        resource_id = thread.resource_id if thread is not None else None
        note(run_entries(old_runs.get(rid), resource_id), run_entries(rview, resource_id))
    return changes


# -- paged sorted lists --------------------------------------------------------------------------


class PageRef(msgspec.Struct, array_like=True, frozen=True):
    no: int
    stamp: int
    count: int
    first: str


class Header(msgspec.Struct, frozen=True):
    stamp: int = 0
    next: int = 0
    pages: tuple[PageRef, ...] = ()
    free: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return sum(p.count for p in self.pages)


class Page(msgspec.Struct, array_like=True, frozen=True):
    stamp: int
    ids: tuple[str, ...]


EMPTY = Header()


def header_key(name: str) -> str:
    return f"h.{name}"


def page_key(name: str, no: int) -> str:
    return f"p.{name}.{no}"


def _split(ids: list[str]) -> list[list[str]]:
    """Sorted ids in pieces of at most PAGE_MAX, of even size."""
    if len(ids) <= PAGE_MAX:
        return [ids]
    pieces = -(-len(ids) // PAGE_MAX)
    size = -(-len(ids) // pieces)
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def target_pages(header: Header, ids: Iterable[str]) -> dict[int, list[str]]:
    """Position (in `header.pages`) of the page each id belongs in: the last page whose first id
    is <= it (the first page for smaller ids). Empty if the list has no pages."""
    if not header.pages:
        return {}
    firsts = [p.first for p in header.pages]
    out: dict[int, list[str]] = {}
    for key in ids:
        out.setdefault(max(0, bisect.bisect_right(firsts, key) - 1), []).append(key)
    return out


def apply_changes(header: Header, pages: Mapping[int, Page], change: Change) -> tuple[Header, dict[int, Page]]:
    """The new header and the pages to write (by number) after `change`. `pages` must hold the
    pages `target_pages` names for every id of the change. Idempotent: an insert of a present id
    or a remove of an absent one changes nothing (and then nothing is written)."""
    by_pos = target_pages(header, change.inserts | change.removes)
    if not header.pages and change.inserts:
        by_pos = {-1: list(change.inserts)}
    stamp = header.stamp + 1
    free = list(header.free)
    nxt = header.next
    written: dict[int, Page] = {}
    freed: list[int] = []
    replaced: dict[int, list[PageRef]] = {}
    for pos, keys in by_pos.items():
        old = set(pages[header.pages[pos].no].ids) if pos >= 0 else set()
        new = (old | (change.inserts & set(keys))) - (change.removes & set(keys))
        if new == old:
            continue
        refs: list[PageRef] = []
        for piece in _split(sorted(new)) if new else []:
            if free:
                no = free.pop(0)
            else:
                no, nxt = nxt, nxt + 1
            written[no] = Page(stamp, tuple(piece))
            refs.append(PageRef(no, stamp, len(piece), piece[0]))
        replaced[pos] = refs
        if pos >= 0:
            freed.append(header.pages[pos].no)
    if not written and not replaced:
        return header, {}
    refs_out: list[PageRef] = list(replaced.get(-1, []))
    for pos, ref in enumerate(header.pages):
        refs_out.extend(replaced[pos] if pos in replaced else [ref])
    return Header(stamp=stamp, next=nxt, pages=tuple(refs_out), free=tuple(free + freed)), written


def locate(header: Header, offset: int, limit: int) -> list[tuple[PageRef, int, int]]:
    """The pages holding items `[offset, offset + limit)`, each with the slice to take from it."""
    out: list[tuple[PageRef, int, int]] = []
    start, end = offset, offset + limit
    pos = 0
    for ref in header.pages:
        if pos >= end:
            break
        nxt = pos + ref.count
        if nxt > start:
            out.append((ref, max(0, start - pos), min(ref.count, end - pos)))
        pos = nxt
    return out


def locate_prefix(header: Header, prefix: str) -> list[tuple[PageRef, int, int]]:
    """The pages that may hold ids starting with `prefix` (whole): from the last page starting
    before it to the last page starting inside it."""
    firsts = [p.first for p in header.pages]
    out: list[tuple[PageRef, int, int]] = []
    for ref in header.pages[max(0, bisect.bisect_left(firsts, prefix) - 1):]:
        if ref.first >= prefix and not ref.first.startswith(prefix):
            break
        out.append((ref, 0, ref.count))
    return out


def bound_page(header: Header, key: str) -> PageRef | None:
    """The page to read for `rank(key)`: the last one whose first id is below `key`."""
    pos = bisect.bisect_left([p.first for p in header.pages], key) - 1
    return header.pages[pos] if pos >= 0 else None


def rank(header: Header, pages: Mapping[int, Page], key: str) -> int:
    """How many ids of the list are below `key`; `pages` holds `bound_page(header, key)`."""
    ref = bound_page(header, key)
    if ref is None:
        return 0
    before = 0
    for p in header.pages:
        if p.no == ref.no:
            break
        before += p.count
    return before + bisect.bisect_left(pages[ref.no].ids, key)


def build(threads: Iterable[ThreadView], runs: Iterable[RunView]) -> dict[str, tuple[Header, dict[int, Page]]]:
    """Every list of the given views, built at once (the rebuild): full pages, stamp 1."""
    members: dict[str, list[str]] = {}
    resources: dict[str, str | None] = {}
    for t in threads:
        resources[t.thread_id] = t.resource_id
        for name, member in thread_entries(t):
            members.setdefault(name, []).append(member)
    distinct = {r for r in resources.values() if r is not None}
    if distinct:
        members[RESOURCES] = list(distinct)
    for r in runs:
        for name, member in run_entries(r, resources.get(r.thread_id)):
            members.setdefault(name, []).append(member)
    out: dict[str, tuple[Header, dict[int, Page]]] = {}
    for name, ids in members.items():
        ids.sort()
        pages = {no: Page(1, tuple(ids[i : i + PAGE_MAX])) for no, i in enumerate(range(0, len(ids), PAGE_MAX))}
        refs = tuple(PageRef(no, 1, len(p.ids), p.ids[0]) for no, p in pages.items())
        out[name] = (Header(stamp=1, next=len(pages), pages=refs), pages)
    return out


def matches(view: Any, filters: Mapping[str, Any]) -> bool:
    """Whether a view has every filtered attribute at its value (a deleted thread never does)."""
    if getattr(view, "deleted", False):
        return False
    return all(getattr(view, attr) == value for attr, value in filters.items())


#: JSON codecs of the stored lists (msgspec: the same encoder as the views).
encode = msgspec.json.Encoder().encode
decode_header = msgspec.json.Decoder(Header).decode
decode_page = msgspec.json.Decoder(Page).decode


__all__ = [
    "ALL_RUNS", "ALL_THREADS", "Change", "Changes", "EMPTY", "Entry", "Header", "INDEX_FORMAT", "PAGE_MAX", "Page",
    "PageRef",
    "RESOURCES", "RUN_FILTERS", "SEP", "Slot", "THREAD_FILTERS", "apply_changes", "bound_page", "build",
    "decode_header", "decode_page", "diff", "encode", "header_key", "locate", "locate_prefix", "matches",
    "key_id", "page_key", "prefix_end", "rank", "resource_slot", "run_entries", "run_slot", "sort_key", "target_pages",
    "thread_entries", "thread_slot", "token",
]
