"""Op builders for typed state writes (`MutationBatch.update`, `ToolContext.update`).

Paths are JSON pointers relative to the key's value: `""` is the value itself, `"/label"` a field
of it. Each builder returns one op of the extended vocabulary
(`agentlog.projections.state.apply_ops`). The lattice builders `count`, `or_add` and `or_remove`
are completed by the batch that takes them (the writer's replica of a counter, the tags of a set
member), since only it knows the current value and who writes.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]

#: Marks an op the batch completes before recording it (never in the log).
PENDING = "_pending"


class Changes(list[Op]):
    """What a reducer returns to give ops instead of a new value (`changes(...)`): a value of the
    key's type is never mistaken for ops, whatever that type is."""


def changes(*ops: Op) -> Changes:
    """The ops a reducer returns instead of a new value: `return changes(increment("", n))`."""
    return Changes(ops)


def set(path: str, value: Any) -> Op:
    """Set the value at `path` (absent parent objects are created)."""
    return {"op": "set", "path": path, "value": value}


def delete(path: str) -> Op:
    """Remove the value at `path` (nothing there: no-op)."""
    return {"op": "delete", "path": path}


def increment(path: str = "", by: int | float = 1) -> Op:
    """Add `by` to the number at `path` (absent: 0). Commutes with other increments."""
    return {"op": "increment", "path": path, "value": by}


def decrement(path: str = "", by: int | float = 1) -> Op:
    """Subtract `by` from the number at `path` (absent: 0). Commutes with increments."""
    return {"op": "decrement", "path": path, "value": by}


def merge(path: str, value: dict[str, Any]) -> Op:
    """Shallow-merge `value`'s members into the object at `path` (absent: created)."""
    return {"op": "merge", "path": path, "value": value}


def append(path: str, value: Any) -> Op:
    """Append `value` to the array at `path` (absent: created)."""
    return {"op": "append", "path": path, "value": value}


def insert(path: str, index: int, value: Any) -> Op:
    """Insert `value` at `index` (0..length) of the array at `path`."""
    return {"op": "insert", "path": path, "index": index, "value": value}


def remove_value(path: str, value: Any) -> Op:
    """Remove the first member equal to `value` from the array at `path`."""
    return {"op": "remove_value", "path": path, "value": value}


def lattice(path: str, kind: str, delta: Any) -> Op:
    """Join `delta` into the lattice value at `path` (`kind`: g_counter, max, min, flag, g_set,
    or_set; see `agentlog.projections.lattice`)."""
    return {"op": "lattice", "path": path, "kind": kind, "value": delta}


def max(path: str, value: int | float) -> Op:
    """Raise the max register at `path` to `value` (kept if larger already)."""
    return lattice(path, "max", value)


def min(path: str, value: int | float) -> Op:
    """Lower the min register at `path` to `value`."""
    return lattice(path, "min", value)


def flag(path: str) -> Op:
    """Set the flag at `path` (it stays set)."""
    return lattice(path, "flag", True)


def add_to_set(path: str, *members: Any) -> Op:
    """Add `members` to the grow-only set at `path`."""
    return lattice(path, "g_set", list(members))


def count(path: str = "", by: int = 1) -> Op:
    """Add `by` (>= 0) to the G-counter at `path`, on the writer's own replica."""
    return {"op": PENDING, "kind": "g_counter", "path": path, "by": by}


def or_add(path: str, member: Any) -> Op:
    """Add `member` to the observed-remove set at `path` (with a tag of the writer's)."""
    return {"op": PENDING, "kind": "or_add", "path": path, "member": member}


def or_remove(path: str, member: Any) -> Op:
    """Remove `member` from the observed-remove set at `path`: the adds of it the writer sees
    (a concurrent add of it by another writer survives)."""
    return {"op": PENDING, "kind": "or_remove", "path": path, "member": member}


__all__ = ["PENDING", "Changes", "Op", "add_to_set", "changes", "append", "count", "decrement", "delete", "flag", "increment", "insert",
           "lattice", "max", "merge", "min", "or_add", "or_remove", "remove_value", "set"]
