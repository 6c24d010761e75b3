"""`MutationBatch`: typed state writes staged against a frozen snapshot, and how batches of
parallel writers merge (the seeds' mutation lifecycle).

A tool call (its `ToolContext`) or a plugin hook (`PhaseContext.mutate()`) reads a snapshot of
the scope documents and stages writes into one batch; the loop records each write as a
`StateWritten`. Every write is validated when staged: its ops must apply to the key's current
value (the snapshot plus the batch's own earlier writes) and leave a value of the key's type,
else `StateValidationError` / `StateWriteRefused` and nothing is staged.

Batches of writers that ran side by side (the calls of a parallel round, the hooks of a phase)
merge by their keys' strategies (`find_conflict`): overlapping paths of an `exclusive` key are a
conflict; `commutative` ops concatenate; `lattice` ops join. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentlog.eventlog.events import JSON, StateWritten
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.lattice import canonical, or_set_tags
from agentlog.projections.state import (
    COMMUTATIVE_OPS,
    apply_ops,
    paths_overlap,
    pointer_tokens,
    touched_paths,
)
from agentlog.runtime.state.keys import ABSENT, StateKey, StateValidationError, StateWriteRefused
from agentlog.runtime.state.ops import PENDING, Changes

Strategy = Literal["exclusive", "commutative", "lattice", "untyped"]


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One staged write: the key, the ops (absolute paths in the scope's document) and the
    reducer action they came from (None: a plain write)."""

    key: StateKey[Any]
    ops: tuple[dict[str, JSON], ...]
    action: JSON = None
    #: The scope document's owner: the call id (tool_call scope), the profile id (profile).
    owner: str | None = None

    def event(self, *, source: str | None, call_id: str | None) -> StateWritten:
        key = self.key
        return StateWritten(
            key=key.name, ops=[dict(op) for op in self.ops], scope=key.scope, merge=key.merge, action=self.action,
            source=source, call_id=self.owner if key.scope == "tool_call" else call_id,
            profile_id=self.owner if key.scope == "profile" else None, transient=not key.persistent,
        )


@dataclass(frozen=True, slots=True)
class Touch:
    """A path a writer changed, with what decides whether another writer may change it too."""

    scope: str
    owner: str
    path: str
    strategy: Strategy
    key: str | None = None


def conflicts(a: Touch, b: Touch) -> bool:
    """Two writers' touches conflict when they change overlapping paths of one document and
    either is an exclusive key's, or one is an untyped patch over a typed key's value (untyped
    patches between themselves keep the last writer)."""
    if a.scope != b.scope or a.owner != b.owner or not paths_overlap(a.path, b.path):
        return False
    if "exclusive" in (a.strategy, b.strategy):
        return True
    return (a.strategy == "untyped") != (b.strategy == "untyped")


def find_conflict(mine: Iterable[Touch], theirs: Iterable[Touch]) -> tuple[Touch, Touch] | None:
    """The first pair of conflicting touches, mine first, or None."""
    others = list(theirs)
    for a in mine:
        for b in others:
            if conflicts(a, b):
                return a, b
    return None


def untyped_touches(ops: Sequence[Mapping[str, Any]]) -> list[Touch]:
    """The touches of untyped thread-state ops (`ToolContext.set`, `PatchState`)."""
    return [Touch("thread", "", path, "untyped") for path in touched_paths(ops)]


#: The scope documents a batch reads: `thread`, `run`, the call's `tool_call`, and the
#: `profile` once loaded. A scope absent from it cannot be read or written here.
Documents = dict[str, dict[str, JSON]]


class MutationBatch:
    """Typed reads over a snapshot and the writes staged on it, in order.

    `writer`: who writes (`tool:<call_id>`, `plugin:<id>`): a G-counter's replica and an
    observed-remove set's tag prefix. `owners`: per scope, whose document it is (the call id of
    `tool_call`, the profile id of `profile`)."""

    def __init__(self, docs: Documents, *, writer: str, owners: Mapping[str, str] | None = None) -> None:
        self._docs: Documents = dict(docs)
        self.writer = writer
        self.owners = dict(owners or {})
        self.writes: list[StateWrite] = []

    def add_scope(self, scope: str, doc: dict[str, JSON], owner: str | None = None) -> None:
        """Make `scope` readable and writable (the profile, once loaded)."""
        self._docs[scope] = doc
        if owner is not None:
            self.owners[scope] = owner

    # -- reads -----------------------------------------------------------------------------------

    def has_scope(self, scope: str) -> bool:
        return scope in self._docs

    def document(self, scope: str) -> dict[str, JSON]:
        """The scope's document as this batch sees it (the snapshot and its own writes)."""
        doc = self._docs.get(scope)
        if doc is None:
            raise StateWriteRefused(_no_scope(scope))
        return doc

    def raw(self, key: StateKey[Any]) -> JSON:
        """The JSON stored for `key` (`ABSENT` if never written)."""
        return self.document(key.scope).get(key.name, ABSENT)

    def read(self, key: StateKey[Any]) -> Any:
        """The key's typed value as this batch sees it (its default if never written)."""
        return key.load(self.raw(key))

    # -- writes ----------------------------------------------------------------------------------

    def write(self, key: StateKey[Any], value: Any) -> None:
        """Set the key's whole value (validated against its type). A lattice key joins each
        lattice field with the value's instead: writes of lattices only ever merge."""
        raw = key.dump(value)
        if key.merge == "lattice":
            self._stage(key, _lattice_join_ops(key, raw), None)
        else:
            self._stage(key, [{"op": "set", "path": key.path, "value": raw}], None)

    def delete(self, key: StateKey[Any]) -> None:
        """Remove the key's value (reads give its default again)."""
        self._stage(key, [{"op": "delete", "path": key.path}], None)

    def update(self, key: StateKey[Any], *ops: Mapping[str, Any]) -> None:
        """Apply ops (paths relative to the key's value, `agentlog.runtime.state.ops`)."""
        self._stage(key, [self._absolute(key, op) for op in ops], None)

    def reduce(self, key: StateKey[Any], action: Any) -> None:
        """The reducer form: `key.reduce(value, action)` against the current value gives a new
        value or ops; recorded with the action (validated against the key's action type)."""
        if key.reducer is None:
            raise StateWriteRefused(f"state key {key.name!r} has no reducer: write or update it")
        typed = key.parse_action(action)
        recorded = key.dump_action(typed)
        current = self.read(key)
        result = key.reducer(_private(key, current), typed)
        if isinstance(result, Changes):
            ops = [self._absolute(key, op) for op in result]
        else:
            before = self.raw(key)
            after = key.dump(result)
            ops = diff_ops(key.path, None if before is ABSENT else before, after)
        self._stage(key, ops, recorded)

    def replay(self, event: StateWritten, key: StateKey[Any] | None) -> None:
        """Stage a recorded write again (verified replay of a tool answered from the log): a
        reducer write is reduced again from its action (replay then checks the ops agree); any
        other is staged as recorded."""
        if key is not None and event.action is not None and key.is_reducer and event.scope != "profile":
            self.reduce(key, event.action)
            return
        if key is None:
            key = StateKey(event.key, scope=event.scope, merge=event.merge, persistent=not event.transient)
        owner = event.profile_id if event.scope == "profile" else event.call_id if event.scope == "tool_call" else None
        write = StateWrite(key, tuple(dict(op) for op in event.ops), event.action, owner)
        if event.scope in self._docs:
            self._docs[event.scope] = apply_ops(self._docs[event.scope], list(write.ops))
        self.writes.append(write)

    # -- staging -----------------------------------------------------------------------------------

    def _absolute(self, key: StateKey[Any], op: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(op, Mapping) or not isinstance(op.get("path", ""), str):
            raise StateWriteRefused(f"state key {key.name!r}: an op is a mapping with a 'path': {op!r}")
        path = op.get("path", "")
        if path and not path.startswith("/"):
            raise StateWriteRefused(f"state key {key.name!r}: op path {path!r} is not a JSON pointer "
                                    "(relative to the key's value: '' or '/field')")
        out = dict(op)
        out["path"] = key.path + path
        if "from" in out and isinstance(out["from"], str):
            out["from"] = key.path + out["from"]
        if out.get("op") == PENDING:
            return self._complete(key, out)
        return out

    def _complete(self, key: StateKey[Any], op: dict[str, Any]) -> dict[str, Any]:
        """A pending lattice op made whole: the writer's replica of a counter, the tags of a
        set member, from the current value."""
        current = _at(self.document(key.scope), op["path"])
        kind = op["kind"]
        if kind == "g_counter":
            by = op.get("by", 1)
            if not isinstance(by, int) or isinstance(by, bool) or by < 0:
                raise StateWriteRefused(f"state key {key.name!r}: a G-counter grows by an integer >= 0, not {by!r}")
            mine = current.get(self.writer, 0) if isinstance(current, dict) else 0
            return {"op": "lattice", "path": op["path"], "kind": "g_counter", "value": {self.writer: mine + by}}
        if kind == "or_add":
            adds = current.get("adds", {}) if isinstance(current, dict) else {}
            n = sum(1 for tag in adds if tag.startswith(self.writer + "#"))
            tag = f"{self.writer}#{n + 1}"
            return {"op": "lattice", "path": op["path"], "kind": "or_set", "value": {"adds": {tag: op["member"]}}}
        # or_remove
        tags = or_set_tags(current if isinstance(current, dict) else None, op["member"])
        return {"op": "lattice", "path": op["path"], "kind": "or_set", "value": {"removed": tags}}

    def _stage(self, key: StateKey[Any], ops: list[dict[str, Any]], action: JSON) -> None:
        doc = self.document(key.scope)
        _check_strategy(key, ops)
        try:
            after = apply_ops(doc, ops)
        except InvalidPatch as exc:
            raise StateValidationError(key.name, [{"loc": (), "msg": str(exc)}], "write") from None
        if key.name in after:
            key.check(after[key.name])
        self._docs[key.scope] = after
        self.writes.append(StateWrite(key, tuple(ops), action, self.owners.get(key.scope)))

    # -- merging -----------------------------------------------------------------------------------

    def touches(self) -> list[Touch]:
        """What this batch's writes change, for conflict checks against other writers."""
        out: list[Touch] = []
        for w in self.writes:
            owner = w.owner or ""
            for path in touched_paths(w.ops):
                out.append(Touch(w.key.scope, owner, path, w.key.merge, w.key.name))
        return out


def _no_scope(scope: str) -> str:
    if scope == "profile":
        return ("the profile is not loaded here: in a tool, `await ctx.profile.load()` (or use "
                "`ctx.profile`'s async methods) first; a thread with no resource_id has no profile")
    if scope == "tool_call":
        return "tool_call scope is a tool call's: only a tool (or a hook of its call) reads or writes it"
    return f"no {scope} state here"


def _check_strategy(key: StateKey[Any], ops: Sequence[Mapping[str, Any]]) -> None:
    if key.merge == "commutative":
        bad = [op["op"] for op in ops if op.get("op") not in COMMUTATIVE_OPS]
        if bad:
            raise StateWriteRefused(
                f"state key {key.name!r} is commutative: it takes only increment, decrement and lattice ops "
                f"(got {', '.join(sorted(set(map(str, bad))))}); declare it exclusive to set or append")
    elif key.merge == "lattice":
        bad = [op["op"] for op in ops if op.get("op") != "lattice" and not (op.get("op") == "delete"
                                                                            and op.get("path") == key.path)]
        if bad:
            raise StateWriteRefused(f"state key {key.name!r} merges by lattice joins only (got {', '.join(map(str, bad))})")


def _lattice_join_ops(key: StateKey[Any], raw: JSON) -> list[dict[str, Any]]:
    ops = []
    for rel, kind in key.lattice_fields.items():
        value = _at(raw, rel) if rel else raw
        if value is None or value == {} or value == []:
            continue
        ops.append({"op": "lattice", "path": key.path + rel, "kind": kind, "value": value})
    return ops


def _at(doc: Any, path: str) -> Any:
    node = doc
    for token in pointer_tokens(path):
        if isinstance(node, dict):
            node = node.get(token)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _private(key: StateKey[Any], value: Any) -> Any:
    """A copy of a typed value that a reducer may change in place without touching the batch."""
    if value is None:
        return None
    return key.load(key.dump(value))


def diff_ops(path: str, before: JSON, after: JSON) -> list[dict[str, Any]]:
    """Ops turning `before` into `after` at `path`: objects member by member (recursively),
    anything else set whole. Fine-grained, so that writers of different fields of one value do
    not conflict."""
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict[str, Any]] = []
        for name, value in after.items():
            child = path + "/" + name.replace("~", "~0").replace("/", "~1")
            if name not in before:
                ops.append({"op": "set", "path": child, "value": value})
            elif canonical(before[name]) != canonical(value):
                ops.extend(diff_ops(child, before[name], value))
        for name in before:
            if name not in after:
                ops.append({"op": "delete", "path": path + "/" + name.replace("~", "~0").replace("/", "~1")})
        return ops
    if before is not None and canonical(before) == canonical(after):
        return []
    return [{"op": "set", "path": path, "value": after}]


@dataclass
class MergePlan:
    """How the batches of writers that ran side by side combine: `merged` (indices, in order)
    commit together; each of `deferred` conflicted with an earlier one (`conflicts[i]`: its
    touch and the one it met) and runs again after them."""

    merged: list[int] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    conflicts: dict[int, tuple[Touch, Touch]] = field(default_factory=dict)


def plan_merge(batches: Sequence[Sequence[Touch]]) -> MergePlan:
    """Step 5 of the mutation lifecycle, in registration order: each batch joins the compatible
    set unless it conflicts with a batch already in it (then it is deferred)."""
    plan = MergePlan()
    taken: list[Touch] = []
    for index, touches in enumerate(batches):
        hit = find_conflict(touches, taken)
        if hit is None:
            plan.merged.append(index)
            taken.extend(touches)
        else:
            plan.deferred.append(index)
            plan.conflicts[index] = hit
    return plan


__all__ = ["Documents", "MergePlan", "MutationBatch", "StateWrite", "Touch", "conflicts", "diff_ops", "find_conflict",
           "plan_merge", "untyped_touches"]
