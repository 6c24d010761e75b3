"""The extended op vocabulary, lattice joins and merge strategies, pure: op semantics, the lattice
laws, any interleaving of parallel commutative writers giving one state, the conflict rules, and
folds that apply `StateWritten` without the app."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.events import Commit, StateCleared, StateWritten, StoredCommit
from agentlog.projections import InvalidPatch
from agentlog.projections.fold import fold_commits
from agentlog.projections.lattice import LATTICES, canonical, join, or_set_members
from agentlog.projections.state import apply_ops, is_commutative, paths_overlap, touched_paths
from agentlog.runtime.state.batch import Touch, conflicts, plan_merge

BASE = {"n": 1, "list": [1, 2, 2], "obj": {"a": 1}, "s": "x"}


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ({"op": "set", "path": "/deep/er/x", "value": 1}, {**BASE, "deep": {"er": {"x": 1}}}),
        ({"op": "delete", "path": "/n"}, {k: v for k, v in BASE.items() if k != "n"}),
        ({"op": "delete", "path": "/missing/x"}, BASE),
        ({"op": "increment", "path": "/n", "value": 2}, {**BASE, "n": 3}),
        ({"op": "decrement", "path": "/fresh", "value": 2.5}, {**BASE, "fresh": -2.5}),
        ({"op": "merge", "path": "/obj", "value": {"b": 2, "a": 0}}, {**BASE, "obj": {"a": 0, "b": 2}}),
        ({"op": "merge", "path": "/new", "value": {"b": 2}}, {**BASE, "new": {"b": 2}}),
        ({"op": "append", "path": "/list", "value": 3}, {**BASE, "list": [1, 2, 2, 3]}),
        ({"op": "append", "path": "/made", "value": 3}, {**BASE, "made": [3]}),
        ({"op": "insert", "path": "/list", "index": 0, "value": 0}, {**BASE, "list": [0, 1, 2, 2]}),
        ({"op": "insert", "path": "/list", "index": 3, "value": 9}, {**BASE, "list": [1, 2, 2, 9]}),
        ({"op": "remove_value", "path": "/list", "value": 2}, {**BASE, "list": [1, 2]}),
        ({"op": "remove_value", "path": "/list", "value": 7}, BASE),
        ({"op": "lattice", "path": "/c", "kind": "g_counter", "value": {"w": 2}}, {**BASE, "c": {"w": 2}}),
        ({"op": "add", "path": "/rfc", "value": True}, {**BASE, "rfc": True}),
    ],
    ids=["set-creates", "delete", "delete-absent", "increment", "decrement-absent", "merge", "merge-absent",
         "append", "append-absent", "insert-front", "insert-end", "remove-first-equal", "remove-none",
         "lattice", "rfc6902-mixed"],
)
def test_merge_strategy_extended_ops_apply_as_tireas_op(op: dict[str, Any], expected: dict[str, Any]) -> None:
    before = canonical(BASE)
    assert apply_ops(BASE, [op]) == expected
    assert canonical(BASE) == before, "the input is never changed"


@pytest.mark.parametrize(
    "op",
    [
        {"op": "increment", "path": "/s", "value": 1},
        {"op": "increment", "path": "/n", "value": True},
        {"op": "merge", "path": "/list", "value": {"a": 1}},
        {"op": "append", "path": "/obj", "value": 1},
        {"op": "insert", "path": "/list", "index": 4, "value": 1},
        {"op": "remove_value", "path": "/absent", "value": 1},
        {"op": "remove_value", "path": "/obj", "value": 1},
        {"op": "lattice", "path": "/n", "kind": "nope", "value": 1},
        {"op": "lattice", "path": "/s", "kind": "max", "value": 1},
        {"op": "set", "path": "", "value": [1]},
        {"op": "teleport", "path": "/n"},
    ],
)
def test_merge_strategy_ops_that_cannot_apply_are_typed_errors(op: dict[str, Any]) -> None:
    with pytest.raises(InvalidPatch) as err:
        apply_ops(BASE, [op])
    assert err.value.code == "invalid_patch"


def test_merge_strategy_conflict_paths_overlap_by_prefix() -> None:
    assert paths_overlap("/a", "/a/b") and paths_overlap("/a/b", "/a") and paths_overlap("/a", "/a")
    assert not paths_overlap("/a/b", "/a/c") and not paths_overlap("/ab", "/a")
    assert paths_overlap("", "/anything")
    assert touched_paths([{"op": "move", "from": "/x", "path": "/y"}, {"op": "test", "path": "/z", "value": 1}]) \
        == ["/y", "/x"]
    ex = Touch("thread", "", "/k/a", "exclusive", "k")
    assert conflicts(ex, Touch("thread", "", "/k", "exclusive", "k"))
    assert not conflicts(ex, Touch("thread", "", "/k/b", "exclusive", "k"))
    assert not conflicts(ex, Touch("run", "", "/k/a", "exclusive", "k")), "another scope is another document"
    assert not conflicts(Touch("tool_call", "c1", "/k", "exclusive", "k"), Touch("tool_call", "c2", "/k", "exclusive", "k"))
    com = Touch("thread", "", "/n", "commutative", "n")
    assert not conflicts(com, Touch("thread", "", "/n", "commutative", "n"))
    assert not conflicts(Touch("thread", "", "/l", "lattice", "l"), Touch("thread", "", "/l", "lattice", "l"))
    assert conflicts(com, Touch("thread", "", "/n/x", "untyped")), "an untyped overwrite of a typed value"
    assert not conflicts(Touch("thread", "", "/u", "untyped"), Touch("thread", "", "/u", "untyped"))


def test_merge_strategy_plan_merge_defers_exclusive_overlaps_in_registration_order() -> None:
    a = [Touch("thread", "", "/k/x", "exclusive", "k")]
    b = [Touch("thread", "", "/k", "exclusive", "k")]
    c = [Touch("thread", "", "/n", "commutative", "n")]
    d = [Touch("thread", "", "/n", "commutative", "n"), Touch("thread", "", "/k/y", "exclusive", "k")]
    plan = plan_merge([a, b, c, d])
    assert plan.merged == [0, 2, 3] and plan.deferred == [1]
    assert plan.conflicts[1] == (b[0], a[0])


# -- lattices ---------------------------------------------------------------------------------------

_scalars = st.one_of(st.integers(-5, 5), st.text(max_size=2), st.booleans())
_values: dict[str, st.SearchStrategy[Any]] = {
    "g_counter": st.dictionaries(st.sampled_from("abc"), st.integers(0, 5), max_size=3),
    "max": st.integers(-10, 10) | st.floats(-10, 10, allow_nan=False),
    "min": st.integers(-10, 10) | st.floats(-10, 10, allow_nan=False),
    "flag": st.booleans(),
    "g_set": st.lists(_scalars, max_size=4),
    "or_set": st.fixed_dictionaries({"adds": st.dictionaries(st.sampled_from(["t1", "t2", "t3"]), st.sampled_from("xy"),
                                                             max_size=3),
                                     "removed": st.lists(st.sampled_from(["t1", "t2", "t3"]), max_size=2)}),
}


@settings(max_examples=60)
@given(kind=st.sampled_from(sorted(LATTICES)), data=st.data())
def test_lattice_join_is_commutative_associative_idempotent(kind: str, data: st.DataObject) -> None:
    a, b, c = (data.draw(_values[kind]) for _ in range(3))
    ab = join(kind, join(kind, None, a), b)
    ba = join(kind, join(kind, None, b), a)
    assert canonical(ab) == canonical(ba), "commutative"
    left = join(kind, join(kind, join(kind, None, a), b), c)
    right = join(kind, join(kind, None, a), join(kind, join(kind, None, b), c))
    assert canonical(left) == canonical(right), "associative"
    assert canonical(join(kind, ab, b)) == canonical(ab), "idempotent"


def test_lattice_values_read_as_their_kind() -> None:
    assert LATTICES["g_counter"].value({"a": 2, "b": 3}) == 5
    state = join("or_set", None, {"adds": {"w#1": "x", "w#2": "y"}})
    state = join("or_set", state, {"removed": ["w#1"]})
    concurrent = join("or_set", state, {"adds": {"v#1": "x"}})  # an add the remove did not see
    assert or_set_members(state) == ["y"] and or_set_members(concurrent) == ["x", "y"]
    assert join("g_set", ["b", "a"], ["a", "c"]) == ["a", "b", "c"]
    assert join("flag", False, True) is True and join("max", 3, 1) == 3 and join("min", 3, 1) == 1


# -- parallel commutative writers: any interleaving, one state ---------------------------------------

_paths = st.sampled_from(["/hits", "/stats/calls", "/stats/best", "/tags"])


@st.composite
def _commutative_op(draw: st.DrawFn, writer: str) -> dict[str, Any]:
    path = draw(_paths)
    if path == "/hits":
        return {"op": draw(st.sampled_from(["increment", "decrement"])), "path": path, "value": draw(st.integers(0, 9))}
    if path == "/stats/calls":
        return {"op": "lattice", "path": path, "kind": "g_counter", "value": {writer: draw(st.integers(0, 9))}}
    if path == "/stats/best":
        return {"op": "lattice", "path": path, "kind": "max", "value": draw(st.integers(0, 99))}
    return {"op": "lattice", "path": path, "kind": "g_set", "value": draw(st.lists(st.sampled_from("abcd"), max_size=2))}


@st.composite
def _parallel_writers(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    n = draw(st.integers(2, 4))
    return [draw(st.lists(_commutative_op(f"call{i}"), min_size=1, max_size=4)) for i in range(n)]


@settings(max_examples=80)
@given(writers=_parallel_writers(), data=st.data())
def test_merge_strategy_commutative_any_interleaving_of_parallel_calls_gives_one_state(
    writers: list[list[dict[str, Any]]], data: st.DataObject,
) -> None:
    """Each call's ops in its own order, the calls interleaved any way (how completions and
    their commits may fall): the folded state is the same."""
    assert all(is_commutative(op) for ops in writers for op in ops)
    base = {"hits": 3, "stats": {"best": 1}}
    reference = apply_ops(base, [op for ops in writers for op in ops])
    for _ in range(4):
        queues = [list(ops) for ops in writers]
        order: list[dict[str, Any]] = []
        while any(queues):
            pick = data.draw(st.sampled_from([i for i, q in enumerate(queues) if q]))
            order.append(queues[pick].pop(0))
        assert canonical(apply_ops(base, order)) == canonical(reference)
    # and whole calls in every order (the per-call commits of a parallel round)
    for perm in itertools.permutations(range(len(writers))):
        assert canonical(apply_ops(base, [op for i in perm for op in writers[i]])) == canonical(reference)


# -- folds apply typed writes without the app -------------------------------------------------------


def _commit(seq: int, events: list[Any], run_id: str | None = None) -> StoredCommit:
    return StoredCommit(seq, Commit(commit_id=f"c{seq}", thread_id="t", run_id=run_id, ts=seq, events=events))


def test_state_key_writes_fold_without_the_app_and_bad_ones_are_skipped() -> None:
    log = [
        _commit(1, [StateWritten(key="k", ops=[{"op": "set", "path": "/k", "value": {"a": 1}}])]),
        _commit(2, [StateWritten(key="k", ops=[{"op": "set", "path": "/other", "value": 1}])]),  # leaves its key
        _commit(3, [StateWritten(key="k", ops=[{"op": "increment", "path": "/k", "value": 1}])]),  # not a number
        _commit(4, [StateWritten(key="n", ops=[{"op": "increment", "path": "/n", "value": 2}], merge="commutative")]),
        _commit(5, [StateWritten(key="r", scope="run", ops=[{"op": "set", "path": "/r", "value": 1}])], "run1"),
        _commit(6, [StateWritten(key="p", scope="profile", profile_id="u", ops=[{"op": "set", "path": "/p", "value": 1}])]),
    ]
    views = fold_commits(log)
    thread = views.threads["t"]
    assert thread.state == {"k": {"a": 1}, "n": 2} and thread.rejected_patches == 2
    assert views.runs["run1"].state == {"r": 1}
    cleared = fold_commits([*log, _commit(7, [StateCleared(scope="run", keys=["r"])], "run1")])
    assert cleared.runs["run1"].state == {}
