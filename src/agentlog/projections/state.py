"""Thread/run/tool-call/profile state: a JSON object changed by RFC 6902 ops (the `jsonpatch`
library) and, for typed state keys, by the extended ops of `apply_ops` (Tirea's `Op` vocabulary
and self-describing lattice joins).

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
from agentlog.projections.lattice import LATTICES, LatticeError, canonical
from agentlog.projections.lattice import join as lattice_join

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


# -- the extended op vocabulary (typed state keys) --------------------------------------------------

#: Ops beyond RFC 6902, as in Tirea's `Op` (snake_case names), plus `lattice`. `StateWritten`
#: events carry them, mixed with RFC 6902 ops if a writer likes.
EXTENDED_OPS = frozenset({"set", "delete", "increment", "decrement", "merge", "append", "insert", "remove_value",
                          "lattice"})
#: Ops whose effect does not depend on the order they are applied in with each other: two parallel
#: writers' sequences of these give one state in any interleaving (`commutative` keys take only
#: these; a property test proves the claim).
COMMUTATIVE_OPS = frozenset({"increment", "decrement", "lattice"})
ALL_OPS = _OPS | EXTENDED_OPS


def is_commutative(op: Mapping[str, Any]) -> bool:
    return op.get("op") in COMMUTATIVE_OPS


def _check_extended(index: int, op: Any) -> None:
    if not isinstance(op, Mapping):
        raise InvalidPatch("an op must be a JSON object", op_index=index, op=op)
    kind = op.get("op")
    if kind in _OPS:
        _check_op(index, op)
        return
    if kind not in EXTENDED_OPS:
        raise InvalidPatch(f"unknown op {kind!r}; expected one of {sorted(ALL_OPS)}", op_index=index, op=op)
    path = op.get("path")
    if not isinstance(path, str) or (path and path[0] != "/"):
        raise InvalidPatch("'path' must be a JSON pointer string", op_index=index, op=op)
    if kind != "delete" and "value" not in op:
        raise InvalidPatch(f"'{kind}' needs a 'value'", op_index=index, op=op)
    if kind in ("increment", "decrement"):
        amount = op["value"]
        if not isinstance(amount, (int, float)) or isinstance(amount, bool):
            raise InvalidPatch(f"'{kind}' needs a numeric 'value'", op_index=index, op=op)
    if kind == "merge" and not isinstance(op["value"], Mapping):
        raise InvalidPatch("'merge' needs an object 'value'", op_index=index, op=op)
    if kind == "insert":
        where = op.get("index")
        if not isinstance(where, int) or isinstance(where, bool) or where < 0:
            raise InvalidPatch("'insert' needs an 'index' >= 0", op_index=index, op=op)
    if kind == "lattice" and op.get("kind") not in LATTICES:
        raise InvalidPatch(f"'lattice' needs a 'kind', one of {sorted(LATTICES)}", op_index=index, op=op)


def pointer_tokens(path: str) -> list[str]:
    """The unescaped reference tokens of a JSON pointer ("" is the whole document: no token)."""
    if path == "":
        return []
    if path[0] != "/":
        raise ValueError(f"not a JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def pointer(tokens: Sequence[str]) -> str:
    """The JSON pointer of `tokens` (escaped)."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _step(node: Any, token: str, create: bool, path: str) -> Any:
    if type(node) is dict:
        if token not in node:
            if not create:
                return _MISSING
            node[token] = {}
        return node[token]
    if type(node) is list:
        if _INDEX.fullmatch(token) and int(token) < len(node):
            return node[int(token)]
        raise InvalidPatch(f"path {path!r}: no index {token!r} in an array of {len(node)}")
    raise InvalidPatch(f"path {path!r}: {token!r} is inside a {type(node).__name__}, not an object or array")


_MISSING: Any = object()


def _locate(doc: dict[str, Any], path: str, create: bool) -> tuple[Any, str | None]:
    """(parent container, last token) of `path` in `doc`; (doc, None) for the whole document;
    (_MISSING, None) when an ancestor is absent and `create` is false. `create` makes absent
    ancestors objects."""
    tokens = pointer_tokens(path)
    if not tokens:
        return doc, None
    node: Any = doc
    for token in tokens[:-1]:
        node = _step(node, token, create, path)
        if node is _MISSING:
            return _MISSING, None
    if type(node) not in (dict, list):
        raise InvalidPatch(f"path {path!r}: its parent is a {type(node).__name__}, not an object or array")
    return node, tokens[-1]


def _get_at(parent: Any, last: str | None, path: str) -> Any:
    if last is None:
        return parent
    if type(parent) is dict:
        return parent.get(last, _MISSING)
    if _INDEX.fullmatch(last) and int(last) < len(parent):
        return parent[int(last)]
    if last == "-":
        return _MISSING
    raise InvalidPatch(f"path {path!r}: no index {last!r} in an array of {len(parent)}")


def _put_at(doc: dict[str, Any], parent: Any, last: str | None, value: Any, path: str) -> dict[str, Any]:
    if last is None:
        if not isinstance(value, dict):
            raise InvalidPatch(f"the state must stay a JSON object; {path!r} would make it a {type(value).__name__}")
        return value
    if type(parent) is dict:
        parent[last] = value
    elif last == "-":
        parent.append(value)
    elif _INDEX.fullmatch(last) and int(last) < len(parent):
        parent[int(last)] = value
    else:
        raise InvalidPatch(f"path {path!r}: no index {last!r} in an array of {len(parent)}")
    return doc


def _apply_extended(doc: dict[str, Any], op: Mapping[str, Any]) -> dict[str, Any]:
    """Apply one extended op to `doc` (a private copy, changed in place); the new document."""
    kind, path = op["op"], op["path"]
    if kind == "delete":
        parent, last = _locate(doc, path, create=False)
        if parent is _MISSING:
            return doc
        if last is None:
            return {}
        current = _get_at(parent, last, path)
        if current is not _MISSING:
            del parent[last if type(parent) is dict else int(last)]
        return doc
    creates = kind != "remove_value"
    parent, last = _locate(doc, path, create=creates)
    current = _MISSING if parent is _MISSING else _get_at(parent, last, path)
    value = op["value"]
    if kind == "set":
        return _put_at(doc, parent, last, value, path)
    if kind in ("increment", "decrement"):
        base = 0 if current is _MISSING else current
        if not isinstance(base, (int, float)) or isinstance(base, bool):
            raise InvalidPatch(f"'{kind}' of {path!r}: the value there is a {type(base).__name__}, not a number")
        return _put_at(doc, parent, last, base + value if kind == "increment" else base - value, path)
    if kind == "merge":
        base = {} if current is _MISSING else current
        if not isinstance(base, dict):
            raise InvalidPatch(f"'merge' into {path!r}: the value there is a {type(base).__name__}, not an object")
        return _put_at(doc, parent, last, {**base, **value}, path)
    if kind in ("append", "insert"):
        base = [] if current is _MISSING else current
        if not isinstance(base, list):
            raise InvalidPatch(f"'{kind}' to {path!r}: the value there is a {type(base).__name__}, not an array")
        if kind == "append":
            return _put_at(doc, parent, last, [*base, value], path)
        where = op["index"]
        if where > len(base):
            raise InvalidPatch(f"'insert' at {path!r}: index {where} is out of bounds (length {len(base)})")
        return _put_at(doc, parent, last, [*base[:where], value, *base[where:]], path)
    if kind == "remove_value":
        if current is _MISSING:
            raise InvalidPatch(f"'remove_value' from {path!r}: the path does not exist")
        if not isinstance(current, list):
            raise InvalidPatch(f"'remove_value' from {path!r}: the value there is a {type(current).__name__}, "
                               "not an array")
        want = canonical(value)
        for i, item in enumerate(current):
            if canonical(item) == want:
                return _put_at(doc, parent, last, [*current[:i], *current[i + 1:]], path)
        return doc
    # lattice
    try:
        joined = lattice_join(op["kind"], None if current is _MISSING else current, value)
    except LatticeError as exc:
        raise InvalidPatch(f"'lattice' at {path!r}: {exc}") from None
    return _put_at(doc, parent, last, joined, path)


def apply_ops(state: Mapping[str, Any] | None, ops: Sequence[Any]) -> JSONDoc:
    """The state after `ops` (RFC 6902 and the extended vocabulary, in order), or `InvalidPatch`
    naming the failing op. `state` (None means `{}`) is not modified; the result is a JSON object.

    Extended ops (Tirea's `Op`): `set` (creates absent parent objects), `delete` (a no-op when
    absent), `increment` / `decrement` by a number (an absent target counts as 0), `merge` (a
    shallow merge into an object, created when absent), `append` (to an array, created when
    absent), `insert` at `index` (0..len), `remove_value` (the first equal member of an array;
    none equal: no-op; an absent array is an error), `lattice` (join `value` into the value there
    under lattice `kind`, `agentlog.projections.lattice`)."""
    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
        raise InvalidPatch(f"ops must be a list of operations, got {type(ops).__name__}")
    for index, op in enumerate(ops):
        _check_extended(index, op)
    if all(op["op"] in _OPS for op in ops):
        return validate_patch(state, ops)
    try:
        doc, op_list = json_copy((state if state is not None else {}, ops))
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidPatch(f"state and ops must be JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidPatch(f"a state is a JSON object, got {type(doc).__name__}")
    for index, op in enumerate(op_list):
        try:
            if op["op"] in _OPS:
                doc = jsonpatch.apply_patch(doc, [op], in_place=True)
            else:
                doc = _apply_extended(doc, op)
        except InvalidPatch as exc:
            raise InvalidPatch(str(exc).removeprefix("invalid state patch: "), op_index=index, op=op) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise InvalidPatch(str(exc), op_index=index, op=op) from None
        except Exception as exc:  # jsonpatch lets some KeyError/TypeError/IndexError through
            raise InvalidPatch(f"{type(exc).__name__}: {exc}", op_index=index, op=op) from None
        if not isinstance(doc, dict):
            raise InvalidPatch(f"the state must stay a JSON object, op {index} made it a {type(doc).__name__}")
    return doc


def touched_paths(ops: Sequence[Mapping[str, Any]]) -> list[str]:
    """The paths `ops` write (and a move's source), in order: what parallel writers are compared
    by. A `test` writes nothing."""
    out: list[str] = []
    for op in ops:
        if op.get("op") == "test":
            continue
        out.append(str(op.get("path", "")))
        if op.get("op") == "move":
            out.append(str(op.get("from", "")))
    return out


def paths_overlap(a: str, b: str) -> bool:
    """Whether two JSON pointers name the same value or one lies inside the other (prefix
    overlap: writing `/a` touches `/a/b`)."""
    ta, tb = pointer_tokens(a), pointer_tokens(b)
    n = min(len(ta), len(tb))
    return ta[:n] == tb[:n]
