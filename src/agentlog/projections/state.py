"""Thread/run/tool-call state: a JSON object changed by RFC 6902 ops (the `jsonpatch` library).

`validate_patch` is the single implementation used both by the runtime (before it appends a
`StatePatched`, so the log never holds a patch that cannot be applied) and by the folds. It never
mutates its input: the document is copied (a msgspec JSON round trip, cheaper than deepcopy and
a proof that the document is JSON) and the ops are applied in place to the copy, one by one, so a
failure names the op that failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch
import jsonpointer
import msgspec

from agentlog.projections.errors import InvalidPatch

JSONDoc = dict[str, Any]

_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def json_copy(doc: Any) -> Any:
    """Deep copy of a JSON value (raises msgspec.EncodeError/TypeError if it is not JSON)."""
    return _decoder.decode(_encoder.encode(doc))


def _check_op(index: int, op: Any) -> None:
    if not isinstance(op, Mapping):
        raise InvalidPatch("an op must be a JSON object", op_index=index, op=op)
    kind = op.get("op")
    if kind not in _OPS:
        raise InvalidPatch(f"unknown op {kind!r}; expected one of {sorted(_OPS)}", op_index=index, op=op)
    path = op.get("path")
    if not isinstance(path, str):
        raise InvalidPatch("'path' must be a JSON pointer string", op_index=index, op=op)
    if kind in ("add", "replace", "test") and "value" not in op:
        raise InvalidPatch(f"'{kind}' needs a 'value'", op_index=index, op=op)
    if kind in ("move", "copy") and not isinstance(op.get("from"), str):
        raise InvalidPatch(f"'{kind}' needs a 'from' JSON pointer string", op_index=index, op=op)


def validate_patch(state: Mapping[str, Any] | None, ops: Sequence[Any]) -> JSONDoc:
    """Return the state after applying `ops` (RFC 6902) to `state`, or raise `InvalidPatch`.

    `state` (None means `{}`) is not modified. The result must still be a JSON object: state
    documents are objects so that scopes and views can hold them uniformly.
    """
    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
        raise InvalidPatch(f"ops must be a list of RFC 6902 operations, got {type(ops).__name__}")
    for index, op in enumerate(ops):
        _check_op(index, op)
    try:
        # One round trip copies both (the ops' values end up inside the new document, so they
        # must be private too) and proves they are JSON.
        doc, op_list = json_copy((state if state is not None else {}, ops))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidPatch(f"state and ops must be JSON: {exc}") from None
    applied = _apply_simple(doc, op_list)
    if applied is not _NOT_SIMPLE:
        doc = applied
    else:
        doc, op_list = json_copy((state if state is not None else {}, ops))  # the fast path may have begun
        doc = _apply_library(doc, op_list, state, ops)
    if not isinstance(doc, dict):
        raise InvalidPatch(f"the state must stay a JSON object, the patch made it a {type(doc).__name__}")
    return doc


def _apply_library(doc: Any, op_list: list[Any], state: Mapping[str, Any] | None, ops: Sequence[Any]) -> Any:
    try:
        return jsonpatch.JsonPatch(op_list).apply(doc, in_place=True)
    except Exception:
        # Slow path, only for bad patches: replay op by op on a fresh copy to name the failing op.
        _diagnose(state, ops)
        raise InvalidPatch("the patch cannot be applied") from None


#: `_apply_simple` could not apply the ops itself: the library applies them (and names any error).
_NOT_SIMPLE: Any = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")


def _tokens(path: Any) -> list[str] | None:
    """The reference tokens of a pointer to a member (not the whole document), unescaped."""
    if not isinstance(path, str) or not path or path[0] != "/":
        return None
    return [t.replace("~1", "/").replace("~0", "~") if "~" in t else t for t in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> Any:
    """The container the pointer's last token is in, or `_NOT_SIMPLE`."""
    node = doc
    for token in tokens[:-1]:
        if type(node) is dict and token in node:
            node = node[token]
        elif type(node) is list and _INDEX.fullmatch(token) and int(token) < len(node):
            node = node[int(token)]
        else:
            return _NOT_SIMPLE
    return node


def _get(parent: Any, last: str) -> Any:
    if type(parent) is dict:
        return parent.get(last, _NOT_SIMPLE)
    if type(parent) is list and _INDEX.fullmatch(last) and int(last) < len(parent):
        return parent[int(last)]
    return _NOT_SIMPLE


def _add(parent: Any, last: str, value: Any) -> bool:
    if type(parent) is dict:
        parent[last] = value
    elif type(parent) is list and last == "-":
        parent.append(value)
    elif type(parent) is list and _INDEX.fullmatch(last) and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        return False
    return True


def _apply_simple(doc: Any, ops: list[Any]) -> Any:
    """The ops applied in place to `doc` (a private copy) when each is one the RFC defines
    plainly here: add, replace and remove of an existing path, move and copy between distinct
    existing paths, a test whose values encode alike. The ops the runtime and tools write almost
    always are. Anything else, or any doubt, answers `_NOT_SIMPLE` and the library (the
    reference) applies the whole patch again from a fresh copy: same result, only faster here
    (the folds apply every patch of the log)."""
    for op in ops:
        kind = op["op"]
        tokens = _tokens(op["path"])
        if tokens is None:
            return _NOT_SIMPLE
        parent = _parent(doc, tokens)
        if parent is _NOT_SIMPLE:
            return _NOT_SIMPLE
        last = tokens[-1]
        if kind == "add":
            if not _add(parent, last, op["value"]):
                return _NOT_SIMPLE
        elif kind == "test":
            current = _get(parent, last)
            if current is _NOT_SIMPLE or _encoder.encode(current) != _encoder.encode(op["value"]):
                return _NOT_SIMPLE  # missing or unequal: the library says how the test failed
        elif kind in ("replace", "remove"):
            if _get(parent, last) is _NOT_SIMPLE:
                return _NOT_SIMPLE
            key: Any = last if type(parent) is dict else int(last)
            if kind == "replace":
                parent[key] = op["value"]
            else:
                del parent[key]
        elif kind in ("move", "copy"):
            source = _tokens(op.get("from"))
            if source is None or (kind == "move" and tokens[: len(source)] == source):
                return _NOT_SIMPLE  # onto itself or into its own child: the library's call
            source_parent = _parent(doc, source)
            value = _get(source_parent, source[-1]) if source_parent is not _NOT_SIMPLE else _NOT_SIMPLE
            if value is _NOT_SIMPLE:
                return _NOT_SIMPLE
            if kind == "copy":
                value = json_copy(value)
            else:
                del source_parent[source[-1] if type(source_parent) is dict else int(source[-1])]
                parent = _parent(doc, tokens)  # the removal may have shifted the target's path
                if parent is _NOT_SIMPLE:
                    return _NOT_SIMPLE
            if not _add(parent, last, value):
                return _NOT_SIMPLE
        else:
            return _NOT_SIMPLE
    return doc


def _diagnose(state: Mapping[str, Any] | None, ops: Sequence[Any]) -> None:
    doc, op_list = json_copy((state if state is not None else {}, ops))
    for index, op in enumerate(op_list):
        try:
            doc = jsonpatch.apply_patch(doc, [op], in_place=True)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise InvalidPatch(f"test failed: {exc}", op_index=index, op=op) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise InvalidPatch(str(exc), op_index=index, op=op) from None
        except Exception as exc:  # jsonpatch lets some KeyError/TypeError/IndexError through
            raise InvalidPatch(f"{type(exc).__name__}: {exc}", op_index=index, op=op) from None


def validate_state(state: Any) -> JSONDoc:
    """Check a whole replacement state (`StateReplaced`): a JSON object. Returns a private copy."""
    if not isinstance(state, Mapping):
        raise InvalidPatch(f"a replacement state must be a JSON object, got {type(state).__name__}")
    try:
        return json_copy(dict(state))
    except (msgspec.EncodeError, TypeError, ValueError) as exc:
        raise InvalidPatch(f"a replacement state must be JSON: {exc}") from None
