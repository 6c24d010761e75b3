"""Typed state keys: `StateKey[T]`, their errors, and the registry of an agent's keys.

A key declares a name, a value type (a pydantic model or any type pydantic validates), a scope
(`thread`, `run`, `tool_call`, `profile`) and a merge strategy (`exclusive`, `commutative`,
`lattice`); a reducer key also an action type and a pure `reduce(value, action)`. Its value lives
at `/<name>` of its scope's document, so the untyped state API and every reader of the JSON see
it too. The key only describes: writes are staged by a `MutationBatch`
(`agentlog.runtime.state.batch`) and recorded as `StateWritten` events, folded without the app.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast, get_args

import msgspec
import pydantic

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import JSON, KeyScope, MergeStrategy
from agentlog.projections.state import pointer
from agentlog.runtime.state.lattice import lattice_fields

T = TypeVar("T")
A = TypeVar("A")

#: Key names: one JSON pointer token of safe characters (awaken's `my_plugin.counter` style).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SCOPES: tuple[str, ...] = get_args(KeyScope)
_MERGES: tuple[str, ...] = get_args(MergeStrategy)
_MISSING: Any = object()


class StateError(AgentlogError):
    """Base of the typed state errors."""

    code = "state_error"


class StateValidationError(StateError, ValueError):
    """A write whose value does not validate against its key's type, or an action against its
    action type: nothing is staged for it. `key`: the key; `errors`: pydantic's, each with
    `loc` and `msg`."""

    code = "state_invalid"

    def __init__(self, key: str, errors: Sequence[dict[str, Any]], what: str = "value") -> None:
        self.key = key
        self.errors = list(errors)
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or '<root>'}: {e.get('msg')}"
                           for e in self.errors)
        super().__init__(f"state key {key!r}: invalid {what}: {detail}")


class StateWriteRefused(StateError):
    """A write the key's declaration does not allow (a `set` on a commutative key, a non-lattice
    op on a lattice key, a write of a key in a scope the context has not got)."""

    code = "state_write_refused"


class StateKeyConflict(StateError):
    """Two declarations of one key name that differ (type, scope, merge, reducer)."""

    code = "state_key_conflict"


class StateKey(Generic[T]):
    """A typed state key. `StateKey("counter", Counter)`; options as keywords:

    * `scope`: `thread` (default: persists across the thread's runs), `run` (cleared when the
      run ends), `tool_call` (one document per call, cleared when the call completes),
      `profile` (shared by the threads of one `resource_id`, kept in the profile's stream).
    * `merge`: `exclusive` (default: two calls of one parallel round writing overlapping paths
      conflict), `commutative` (only increment/decrement and lattice ops, which parallel calls
      concatenate), `lattice` (only lattice ops: joins).
    * `default`: the value read while the key was never written (default: the type called
      without arguments, when that validates; else None).
    * `action` + `reduce`: the reducer form. `reduce(value, action)` is pure and returns the new
      value, or `ops.changes(...)` (ops with paths relative to the value): a commutative reducer
      returns increments. The action is recorded with the ops it gave.
    * `persistent`: False clears a thread key when the run that wrote it ends (awaken's
      `StateKeyOptions.persistent`); the value is still in the log, for replay.
    """

    def __init__(
        self,
        name: str,
        type: Any = Any,
        *,
        scope: KeyScope = "thread",
        merge: MergeStrategy = "exclusive",
        default: Any = _MISSING,
        action: Any = None,
        reduce: Callable[[T, Any], Any] | None = None,
        persistent: bool = True,
        description: str = "",
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"state key name {name!r}: 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'")
        if scope not in _SCOPES:
            raise ValueError(f"state key {name!r}: scope {scope!r} is not one of {_SCOPES}")
        if merge not in _MERGES:
            raise ValueError(f"state key {name!r}: merge {merge!r} is not one of {_MERGES}")
        if (action is None) != (reduce is None):
            raise ValueError(f"state key {name!r}: a reducer key needs both `action` and `reduce`")
        if scope == "profile" and not persistent:
            raise ValueError(f"state key {name!r}: a profile key is always persistent")
        self.name = name
        self.type = type
        self.scope: KeyScope = scope
        self.merge: MergeStrategy = merge
        self.action_type = action
        self.reducer = reduce
        self.persistent = persistent
        self.description = description
        self.path = pointer([name])
        self._adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(type)
        self._actions: pydantic.TypeAdapter[Any] | None = pydantic.TypeAdapter(action) if action is not None else None
        #: The lattice fields of the value type: relative path -> lattice kind.
        self.lattice_fields = lattice_fields(type)
        if merge == "lattice" and not self.lattice_fields:
            raise ValueError(f"state key {name!r}: merge 'lattice' needs a lattice type or a model with lattice "
                             "fields (GCounter, MaxRegister, GSet, ...)")
        self.default = self._default() if default is _MISSING else default

    def _default(self) -> Any:
        factory = getattr(self.type, "__origin__", None) or self.type
        if not callable(factory):
            return None
        try:
            return self._adapter.validate_python(factory())
        except Exception:  # noqa: BLE001 - no usable zero value: the key reads None until written
            return None

    def __repr__(self) -> str:
        return f"StateKey({self.name!r}, scope={self.scope!r}, merge={self.merge!r})"

    @property
    def is_reducer(self) -> bool:
        return self.reducer is not None

    def signature(self) -> tuple[Any, ...]:
        """What two declarations of one name must agree on."""
        return (self.name, self.scope, self.merge, self.persistent, _type_name(self.type),
                _type_name(self.action_type), self.reducer)

    # -- values ----------------------------------------------------------------------------------

    def load(self, raw: JSON) -> T:
        """The typed value of the JSON stored for the key (its default when absent: `raw` is
        `_ABSENT`)."""
        if raw is ABSENT:
            return cast(T, self.default)
        try:
            return cast(T, self._adapter.validate_python(raw))
        except pydantic.ValidationError as exc:
            raise StateValidationError(self.name, _errors(exc), "stored value") from None

    def dump(self, value: Any) -> JSON:
        """The JSON of a typed value, validated first (`StateValidationError`)."""
        try:
            checked = self._adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            raise StateValidationError(self.name, _errors(exc)) from None
        return self._adapter.dump_python(checked, mode="json")

    def check(self, raw: JSON) -> None:
        """Raise `StateValidationError` unless `raw` (the JSON a write leaves) is a valid value,
        strictly (no coercion: the stored JSON must already be the type's)."""
        try:
            self._adapter.validate_json(_json.encode(raw), strict=True)
        except pydantic.ValidationError as exc:
            raise StateValidationError(self.name, _errors(exc)) from None

    def parse_action(self, action: Any) -> Any:
        """The typed action (validated: `StateValidationError`)."""
        if self._actions is None:
            raise StateWriteRefused(f"state key {self.name!r} has no reducer")
        try:
            return self._actions.validate_python(action)
        except pydantic.ValidationError as exc:
            raise StateValidationError(self.name, _errors(exc), "action") from None

    def dump_action(self, action: Any) -> JSON:
        assert self._actions is not None
        return self._actions.dump_python(self.parse_action(action), mode="json")


#: What `StateKey.load` is given for a key that was never written.
ABSENT: Any = object()
_json = msgspec.json.Encoder()


def _errors(exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    return [{"loc": tuple(e["loc"]), "msg": e["msg"]} for e in exc.errors()]


def _type_name(t: Any) -> str:
    return "" if t is None else getattr(t, "__qualname__", None) or repr(t)


class StateKeys:
    """The keys an agent's state is declared by: its own, its plugins' and its tools'. One
    declaration per name (the same object, or one with the same signature); another is a
    `StateKeyConflict`."""

    def __init__(self, keys: Iterable[StateKey[Any]] = ()) -> None:
        self._keys: dict[str, StateKey[Any]] = {}
        for key in keys:
            self.add(key)

    def add(self, key: StateKey[Any], where: str = "") -> StateKey[Any]:
        if not isinstance(key, StateKey):
            raise TypeError(f"not a StateKey: {key!r}")
        known = self._keys.get(key.name)
        if known is not None and known is not key and known.signature() != key.signature():
            raise StateKeyConflict(f"state key {key.name!r} is declared twice, differently{where}: "
                                   f"{known!r} and {key!r}")
        self._keys.setdefault(key.name, key)
        return key

    def get(self, name: str) -> StateKey[Any] | None:
        return self._keys.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __iter__(self) -> Iterator[StateKey[Any]]:
        return iter(list(self._keys.values()))

    def __len__(self) -> int:
        return len(self._keys)


def collect_keys(own: Iterable[StateKey[Any]], plugins: Iterable[Any] = (), tools: Iterable[Any] = ()) -> StateKeys:
    """The registry of an agent: `own` keys, then each plugin's and tool's `state_keys`."""
    keys = StateKeys(own)
    for owner in (*plugins, *tools):
        for key in getattr(owner, "state_keys", ()) or ():
            keys.add(key, f" (by {getattr(owner, 'id', None) or getattr(owner, 'name', owner)!r})")
    return keys


__all__ = ["ABSENT", "StateError", "StateKey", "StateKeyConflict", "StateKeys", "StateValidationError",
           "StateWriteRefused", "collect_keys"]
