"""Lattice kinds for state ops: join-semilattices a fold merges without knowing the app.

A `lattice` op names its kind (`{"op": "lattice", "kind": "g_counter", "path": ..., "value":
delta}`), so folding it needs only this registry, never the app's code: the gateway folds logs of
apps it never loaded. Every join here is commutative, associative and idempotent, and returns a
canonical value (sorted keys, sorted set members), so parallel writers reach the same state in
any order (a property test checks all three laws for every kind).

Encodings (JSON):

* `g_counter`: `{replica: count}`, counts non-negative integers; join is the per-replica max,
  the counter's value the sum. A writer increments its own replica.
* `max` / `min`: a number; join is the larger / smaller.
* `flag`: a boolean that, once set, stays set (enable-wins); join is `or`.
* `g_set`: a grow-only set, a JSON array of distinct members in canonical order; join is union.
* `or_set`: an observed-remove set, `{"adds": {tag: member}, "removed": [tag, ...]}`; a member is
  in the set while one of its add tags is not removed, so a concurrent add wins over a remove
  that did not see it. Join is the union of both parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

_canonical = msgspec.json.Encoder(order="sorted")


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of a value (sorted object keys): what set members are ordered
    and compared by."""
    return _canonical.encode(value)


class LatticeError(ValueError):
    """A lattice value or delta that is not of its kind's encoding."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _counter(value: Any, what: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise LatticeError(f"a g_counter {what} is an object of replica -> count, got {type(value).__name__}")
    for replica, count in value.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise LatticeError(f"g_counter replica {replica!r} has count {count!r}: counts are integers >= 0")
    return dict(value)


def _join_g_counter(state: Any, delta: Any) -> Any:
    left = _counter(state, "state") if state is not None else {}
    right = _counter(delta, "delta")
    merged = dict(left)
    for replica, count in right.items():
        if count > merged.get(replica, -1):
            merged[replica] = count
    return {k: merged[k] for k in sorted(merged)}


def _number(value: Any, kind: str) -> Any:
    if not _is_number(value):
        raise LatticeError(f"a {kind} register holds a number, got {value!r}")
    return value


def _tie(a: Any, b: Any) -> Any:
    """Of two equal numbers (`0` and `0.0`), the one with the smaller encoding: either order of
    a join gives the same bytes."""
    return a if canonical(a) <= canonical(b) else b


def _join_max(state: Any, delta: Any) -> Any:
    right = _number(delta, "max")
    if state is None:
        return right
    left = _number(state, "max")
    return _tie(left, right) if left == right else max(left, right)


def _join_min(state: Any, delta: Any) -> Any:
    right = _number(delta, "min")
    if state is None:
        return right
    left = _number(state, "min")
    return _tie(left, right) if left == right else min(left, right)


def _join_flag(state: Any, delta: Any) -> Any:
    if not isinstance(delta, bool) or (state is not None and not isinstance(state, bool)):
        raise LatticeError(f"a flag is a boolean, got {delta!r}")
    return bool(state) or delta


def _members(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise LatticeError(f"a g_set {what} is an array, got {type(value).__name__}")
    return value


def _join_g_set(state: Any, delta: Any) -> Any:
    seen: dict[bytes, Any] = {}
    for member in [*(_members(state, "state") if state is not None else []), *_members(delta, "delta")]:
        seen.setdefault(canonical(member), member)
    return [seen[k] for k in sorted(seen)]


def _or_parts(value: Any, what: str) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(value, Mapping) or not set(value) <= {"adds", "removed"}:
        raise LatticeError(f"an or_set {what} is {{'adds': {{tag: member}}, 'removed': [tag]}}, got {value!r}")
    adds = value.get("adds", {})
    removed = value.get("removed", [])
    if not isinstance(adds, Mapping) or not isinstance(removed, list) or not all(isinstance(t, str) for t in removed):
        raise LatticeError(f"an or_set {what} has 'adds' an object of tag -> member and 'removed' an array of tags")
    return dict(adds), removed


def _join_or_set(state: Any, delta: Any) -> Any:
    left_adds, left_removed = _or_parts(state, "state") if state is not None else ({}, [])
    right_adds, right_removed = _or_parts(delta, "delta")
    adds = dict(left_adds)
    for tag, member in right_adds.items():
        # a tag names one add: two different members under one tag can only be a writer's
        # bug; keep the canonically smaller one so the join stays commutative
        if tag not in adds or canonical(member) < canonical(adds[tag]):
            adds[tag] = member
    removed = sorted(set(left_removed) | set(right_removed))
    return {"adds": {t: adds[t] for t in sorted(adds)}, "removed": removed}


def or_set_members(state: Any) -> list[Any]:
    """The members of an or_set value, in canonical order (each once)."""
    if state is None:
        return []
    adds, removed = _or_parts(state, "state")
    gone = set(removed)
    seen: dict[bytes, Any] = {}
    for tag, member in adds.items():
        if tag not in gone:
            seen.setdefault(canonical(member), member)
    return [seen[k] for k in sorted(seen)]


def or_set_tags(state: Any, member: Any) -> list[str]:
    """The live add tags of `member` in an or_set value: what a remove of it must name."""
    if state is None:
        return []
    adds, removed = _or_parts(state, "state")
    gone = set(removed)
    want = canonical(member)
    return sorted(t for t, m in adds.items() if t not in gone and canonical(m) == want)


@dataclass(frozen=True, slots=True)
class Lattice:
    """One lattice kind: its `join(state, delta)` (state None = the bottom) and what it reads as."""

    name: str
    join: Callable[[Any, Any], Any]
    #: The value an app reads (a counter's sum, a set's members); the stored form otherwise.
    value: Callable[[Any], Any]


def _g_counter_value(state: Any) -> int:
    return sum(_counter(state, "state").values()) if state is not None else 0


#: Every lattice kind a `lattice` op may name. Built in, not extended by apps: a fold must merge
#: any log without the app that wrote it.
LATTICES: dict[str, Lattice] = {
    "g_counter": Lattice("g_counter", _join_g_counter, _g_counter_value),
    "max": Lattice("max", _join_max, lambda s: s),
    "min": Lattice("min", _join_min, lambda s: s),
    "flag": Lattice("flag", _join_flag, lambda s: bool(s)),
    "g_set": Lattice("g_set", _join_g_set, lambda s: list(s or [])),
    "or_set": Lattice("or_set", _join_or_set, or_set_members),
}


def join(kind: str, state: Any, delta: Any) -> Any:
    """`state` joined with `delta` under lattice `kind`; `LatticeError` for an unknown kind or a
    value not of its encoding."""
    lattice = LATTICES.get(kind)
    if lattice is None:
        raise LatticeError(f"unknown lattice kind {kind!r}; expected one of {sorted(LATTICES)}")
    return lattice.join(state, delta)


__all__ = ["LATTICES", "Lattice", "LatticeError", "canonical", "join", "or_set_members", "or_set_tags"]
