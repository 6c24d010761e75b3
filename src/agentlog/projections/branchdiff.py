"""Two branches of a conversation compared event by event (`GET /v1/threads/{a}/diff/{b}`).

Each side is a list of `(event id, event)`; events are compared by what they say, not by where
they are: a run's id (a branch copies its run under a new one), the answers a branch's run
starts with (`RunStarted.answers`: where it takes one shows as its own row) and the lineage of a
`ThreadCreated` are left out of the comparison (`comparable`). The answer is the length of the
common prefix and, after it, the rest of both sides aligned (`difflib`'s longest matching blocks):
each row holds an event of each side that are equal (`same`), differ (`changed`), or an event of
one side only (`only_a`, `only_b`). Reading the rows' `a` (or `b`) events in order gives back that
side exactly.

Pure: the caller reads the threads and picks where each side starts (`since_fork`).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from agentlog.eventlog.events import AnyEvent, Position, StoredCommit, ThreadCreated

T = TypeVar("T")
Kind = Literal["same", "changed", "only_a", "only_b"]

_enc = msgspec.json.Encoder(order="deterministic")
_IGNORED = ("run_id", "answers", "forked_from", "parent_thread_id")


def comparable(event: AnyEvent) -> bytes:
    """What two branches' events are compared by: the event as JSON without run ids, a run's
    replaced answers and lineage."""
    data = msgspec.to_builtins(event)
    if isinstance(data, dict):
        for key in _IGNORED:
            data.pop(key, None)
    return _enc.encode(data)


@dataclass(frozen=True, slots=True)
class Row(Generic[T]):
    kind: Kind
    a: T | None
    b: T | None


@dataclass(frozen=True, slots=True)
class Alignment(Generic[T]):
    common: int
    rows: tuple[Row[T], ...]


def align(a: Sequence[T], b: Sequence[T], key_a: Sequence[Hashable], key_b: Sequence[Hashable]) -> Alignment[T]:
    """Align `a` and `b` (compared by their keys `key_a`, `key_b`, one per item): the common
    prefix's length, then rows for everything after it (the prefix itself is not repeated)."""
    common = 0
    while common < len(a) and common < len(b) and key_a[common] == key_b[common]:
        common += 1
    rows: list[Row[T]] = []
    ka, kb = list(key_a[common:]), list(key_b[common:])
    matcher = difflib.SequenceMatcher(a=ka, b=kb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        left, right = a[common + i1: common + i2], b[common + j1: common + j2]
        if tag == "equal":
            rows += [Row("same", x, y) for x, y in zip(left, right, strict=True)]
            continue
        paired = min(len(left), len(right))
        rows += [Row("changed", left[k], right[k]) for k in range(paired)]
        rows += [Row("only_a", x, None) for x in left[paired:]]
        rows += [Row("only_b", None, y) for y in right[paired:]]
    return Alignment(common, tuple(rows))


def events_of(commits: Sequence[StoredCommit], after: Position | None = None) -> list[tuple[str, AnyEvent]]:
    """`(event id, event)` of `commits` after `after` (all when None), `ThreadCreated` left out."""
    out: list[tuple[str, AnyEvent]] = []
    for sc in commits:
        for i, ev in enumerate(sc.commit.events):
            if isinstance(ev, ThreadCreated) or (after is not None and (sc.seq, i) <= (after.seq, after.index)):
                continue
            out.append((str(Position(sc.seq, i)), ev))
    return out


def since_fork(parent: Sequence[StoredCommit], child: Sequence[StoredCommit]) -> tuple[
        list[tuple[str, AnyEvent]], list[tuple[str, AnyEvent]]]:
    """Both sides of a fork from where they branched: the parent's events after the event the
    child's history was taken as of, and the child's after its first commit (that history). A
    branch of a run (`forked_from.run_id`) shares the run's commits it copied, so its side starts
    with them and so does the parent's (the prefix they have in common)."""
    first = child[0].commit.events[0] if child else None
    origin = first.forked_from if isinstance(first, ThreadCreated) else None
    if origin is None:
        return events_of(parent), events_of(child)
    if origin.run_id is None:
        return events_of(parent, Position.parse(origin.position)), events_of(child[1:])
    return events_of([sc for sc in parent if sc.commit.run_id == origin.run_id]), events_of(child[1:])


def diff(a: Sequence[tuple[str, AnyEvent]], b: Sequence[tuple[str, AnyEvent]]) -> dict[str, Any]:
    """The JSON answer of a diff: `common` (the prefix both sides share, in events), `a`/`b` (how
    many events each side has from the fork), `rows` (`{kind, a, b}`, each side `{id, type,
    event}` or null) for what follows the prefix."""
    alignment = align(list(a), list(b), [comparable(e) for _, e in a], [comparable(e) for _, e in b])

    def side(item: tuple[str, AnyEvent] | None) -> dict[str, Any] | None:
        if item is None:
            return None
        return {"id": item[0], "type": type(item[1]).__name__, "event": msgspec.to_builtins(item[1])}

    return {"common": alignment.common, "a_events": len(a), "b_events": len(b),
            "rows": [{"kind": r.kind, "a": side(r.a), "b": side(r.b)} for r in alignment.rows]}


__all__ = ["Alignment", "Row", "align", "comparable", "diff", "events_of", "since_fork"]
