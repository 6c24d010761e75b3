"""The listing index, pure part: which ordered lists a view belongs to, and paged sorted lists.

Why: `GET /v1/runs?limit=1` used to read every view. Instead, the runner keeps, in the same pass
as the views, one ordered id list per listing it must serve: all runs, runs per thread / status /
agent / parent run, all (live) threads, threads per resource / parent thread. A listing then
reads a header, the page(s) holding `[offset, offset + limit)` and `limit` views: O(limit) reads
whatever the number of runs (the header's size grows with pages, n / PAGE_MAX, not its reads).

Order is the order listings always had: ascending id (generated ids are time-ordered, so that is
creation order for them). Ids are kept sorted inside pages; pages are sorted by their first id.

A list is stored as a `Header` (page refs: number, stamp, count, first id; plus the free page
numbers) and `Page`s (sorted ids). Writes are copy-on-write: a changed page is written under a
page number the committed header does not reference, then the header; the pages it replaced go
to the free list for the next write. So a crash mid-write leaves the committed header and its
pages intact (the batch is redelivered and re-applied; inserts/removes are idempotent), and a
reader that raced a write notices through the stamps (every page carries the stamp of the write
that made it, the header names the stamp it expects) and reads again.

Everything here is pure (no I/O): `memberships`, `diff`, `apply_changes`, `locate`, `build`.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from .views import RunView, ThreadView

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

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def token(value: str) -> str:
    """A KV-key-safe token for a filter value: the value itself when it is a short safe id, else
    `=` + a hash (resource ids are free text). Safe values never contain `=`, so no collision."""
    if _SAFE.fullmatch(value):
        return value
    return "=" + hashlib.sha256(value.encode()).hexdigest()[:40]


def run_list(attr: str, value: str) -> str:
    """Name of the list of runs whose `attr` equals `value`."""
    return f"{ALL_RUNS}.{RUN_FILTERS[attr]}.{token(value)}"


def thread_list(attr: str, value: str) -> str:
    """Name of the list of (not deleted) threads whose `attr` equals `value`."""
    return f"{ALL_THREADS}.{THREAD_FILTERS[attr]}.{token(value)}"


def _memberships(view: Any, everything: str, filters: Mapping[str, str], name: Any) -> frozenset[str]:
    lists = {everything}
    for attr in filters:
        value = getattr(view, attr)
        if value is not None:
            lists.add(name(attr, value))
    return frozenset(lists)


def resource_list(resource_id: str) -> str:
    """Name of the list of runs on threads of `resource_id` (for tenant-scoped listings)."""
    return f"{ALL_RUNS}.resource.{token(resource_id)}"


def run_memberships(view: RunView | None, resource_id: str | None = None) -> frozenset[str]:
    """Every list the run is in (none for no view); `resource_id` is its thread's."""
    if view is None:
        return frozenset()
    lists = _memberships(view, ALL_RUNS, RUN_FILTERS, run_list)
    return lists | {resource_list(resource_id)} if resource_id is not None else lists


def thread_memberships(view: ThreadView | None) -> frozenset[str]:
    """Every list the thread is in: none once deleted (listings never show deleted threads)."""
    if view is None or view.deleted:
        return frozenset()
    return _memberships(view, ALL_THREADS, THREAD_FILTERS, thread_list)


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

    def note(key: str, before: frozenset[str], after: frozenset[str]) -> None:
        for name in after - before:
            changes.setdefault(name, Change()).inserts.add(key)
        for name in before - after:
            changes.setdefault(name, Change()).removes.add(key)

    for tid, view in new_threads.items():
        old = old_threads.get(tid)
        note(tid, thread_memberships(old), thread_memberships(view))
        if view.resource_id is not None and (old is None or old.resource_id != view.resource_id):
            changes.setdefault(RESOURCES, Change()).inserts.add(view.resource_id)
    for rid, rview in new_runs.items():
        # A thread's resource_id is set when it is created, before its runs: the same for the
        # run's old and new memberships. Every thread of a batch is in `old_threads` (loaded).
        thread = new_threads.get(rview.thread_id) or old_threads.get(rview.thread_id)
        resource_id = thread.resource_id if thread is not None else None
        note(rid, run_memberships(old_runs.get(rid), resource_id), run_memberships(rview, resource_id))
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


def build(threads: Iterable[ThreadView], runs: Iterable[RunView]) -> dict[str, tuple[Header, dict[int, Page]]]:
    """Every list of the given views, built at once (the rebuild): full pages, stamp 1."""
    members: dict[str, list[str]] = {}
    resources: dict[str, str | None] = {}
    for t in threads:
        resources[t.thread_id] = t.resource_id
        for name in thread_memberships(t):
            members.setdefault(name, []).append(t.thread_id)
    distinct = {r for r in resources.values() if r is not None}
    if distinct:
        members[RESOURCES] = list(distinct)
    for r in runs:
        for name in run_memberships(r, resources.get(r.thread_id)):
            members.setdefault(name, []).append(r.run_id)
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
    "ALL_RUNS", "ALL_THREADS", "Change", "Changes", "EMPTY", "Header", "PAGE_MAX", "Page", "PageRef",
    "RESOURCES", "RUN_FILTERS", "THREAD_FILTERS", "apply_changes", "build", "decode_header", "decode_page", "diff",
    "encode", "header_key", "locate", "locate_prefix", "matches", "page_key", "resource_list", "run_list", "run_memberships", "target_pages",
    "thread_list", "thread_memberships", "token",
]
