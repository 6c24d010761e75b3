"""State patches: every RFC 6902 op kind, typed rejection of bad patches, no input mutation."""

from __future__ import annotations

import copy

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlog.eventlog.errors import AgentlogError
from agentlog.projections import InvalidPatch, validate_patch, validate_state

BASE = {"a": 1, "b": [1, 2, 3], "c": {"d": "x"}}


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/e", "value": {"f": 1}}], {**BASE, "e": {"f": 1}}),
        ([{"op": "add", "path": "/b/-", "value": 4}], {**BASE, "b": [1, 2, 3, 4]}),
        ([{"op": "add", "path": "/b/0", "value": 0}], {**BASE, "b": [0, 1, 2, 3]}),
        ([{"op": "remove", "path": "/a"}], {"b": [1, 2, 3], "c": {"d": "x"}}),
        ([{"op": "remove", "path": "/b/1"}], {**BASE, "b": [1, 3]}),
        ([{"op": "replace", "path": "/c/d", "value": "y"}], {**BASE, "c": {"d": "y"}}),
        ([{"op": "move", "from": "/a", "path": "/z"}], {"z": 1, "b": [1, 2, 3], "c": {"d": "x"}}),
        ([{"op": "copy", "from": "/c", "path": "/c2"}], {**BASE, "c2": {"d": "x"}}),
        ([{"op": "test", "path": "/b", "value": [1, 2, 3]}], BASE),
        (
            [{"op": "test", "path": "/a", "value": 1}, {"op": "replace", "path": "/a", "value": 2}],
            {**BASE, "a": 2},
        ),
        ([], BASE),
    ],
    ids=["add", "add-append", "add-insert", "remove", "remove-index", "replace", "move", "copy",
         "test", "test-then-replace", "empty"],
)
def test_every_op_kind_applies(ops, expected):
    before = copy.deepcopy(BASE)
    ops_before = copy.deepcopy(ops)
    assert validate_patch(BASE, ops) == expected
    assert BASE == before, "the input state must not be mutated"
    assert ops == ops_before, "the ops must not be mutated"


def test_result_shares_nothing_with_inputs():
    value = {"nested": [1]}
    state = {"keep": {"x": [1]}}
    out = validate_patch(state, [{"op": "add", "path": "/v", "value": value}])
    out["v"]["nested"].append(2)
    out["keep"]["x"].append(2)
    assert value == {"nested": [1]}
    assert state == {"keep": {"x": [1]}}


def test_none_state_is_empty_object():
    assert validate_patch(None, [{"op": "add", "path": "/a", "value": 1}]) == {"a": 1}


@pytest.mark.parametrize(
    ("ops", "index"),
    [
        ([{"op": "add", "path": "/x"}], 0),  # no value
        ([{"op": "bogus", "path": "/x"}], 0),
        ([{"path": "/x", "value": 1}], 0),  # no op
        ([{"op": "add", "value": 1}], 0),  # no path
        ([{"op": "move", "path": "/x"}], 0),  # no from
        (["add"], 0),  # not an object
        ([{"op": "remove", "path": "/missing"}], 0),
        ([{"op": "replace", "path": "/missing", "value": 1}], 0),
        ([{"op": "add", "path": "/a/b", "value": 1}], 0),  # /a is an int
        ([{"op": "add", "path": "no-slash", "value": 1}], 0),
        ([{"op": "add", "path": "/b/9", "value": 1}], 0),  # outside the list
        ([{"op": "move", "from": "/c", "path": "/c/e"}], 0),  # into its own child
        ([{"op": "add", "path": "/ok", "value": 1}, {"op": "test", "path": "/a", "value": 2}], 1),
        ([{"op": "copy", "from": "/nope", "path": "/x"}], 0),
    ],
)
def test_invalid_patches_are_rejected_with_a_typed_error(ops, index):
    with pytest.raises(InvalidPatch) as info:
        validate_patch(BASE, ops)
    err = info.value
    assert isinstance(err, AgentlogError)
    assert err.code == "invalid_patch"
    assert err.op_index == index
    assert BASE == {"a": 1, "b": [1, 2, 3], "c": {"d": "x"}}


@pytest.mark.parametrize("ops", ["not a list", b"bytes", 3, None, {"op": "add"}])
def test_ops_must_be_a_list(ops):
    with pytest.raises(InvalidPatch):
        validate_patch(BASE, ops)


def test_state_must_stay_an_object():
    with pytest.raises(InvalidPatch, match="JSON object"):
        validate_patch(BASE, [{"op": "replace", "path": "", "value": [1]}])
    assert validate_patch(BASE, [{"op": "replace", "path": "", "value": {"n": 1}}]) == {"n": 1}


def test_non_json_values_are_rejected():
    with pytest.raises(InvalidPatch, match="JSON"):
        validate_patch(BASE, [{"op": "add", "path": "/s", "value": object()}])


def test_validate_state():
    assert validate_state({"a": [1]}) == {"a": [1]}
    with pytest.raises(InvalidPatch):
        validate_state([1, 2])
    with pytest.raises(InvalidPatch):
        validate_state({"a": object()})


# -- the fast path equals the library ------------------------------------------------------------

_TOKENS = st.sampled_from(["a", "b", "0", "1", "2", "-", "01", "~0x", "~1y", "", "c"])
_JSON = st.recursive(st.none() | st.integers(-3, 3) | st.text("xy", max_size=2),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TOKENS, inner, max_size=3),
                     max_leaves=8)
_POINTERS = st.lists(_TOKENS, min_size=0, max_size=3).map(lambda ts: "".join("/" + t for t in ts))
_OPS = st.lists(st.fixed_dictionaries({
    "op": st.sampled_from(["add", "replace", "remove", "test", "move", "copy"]),
    "path": _POINTERS,
    "from": _POINTERS,
    "value": _JSON,
}), min_size=1, max_size=4)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(_TOKENS, _JSON, max_size=4), _OPS)
def test_patches_match_the_reference_library(state, ops):
    """validate_patch applies the plain cases of every op itself; the answers must be the
    jsonpatch library's (RFC 6902): the same document, or a refusal where the library refuses."""
    try:
        expected = jsonpatch.JsonPatch(copy.deepcopy(ops)).apply(copy.deepcopy(state))
    except Exception:  # noqa: BLE001 - any refusal of the library
        expected = None
    if expected is not None and not isinstance(expected, dict):
        expected = None  # the state must stay an object
    before = copy.deepcopy(state)
    try:
        got = validate_patch(state, ops)
    except InvalidPatch:
        got = None
    assert got == expected
    assert state == before
