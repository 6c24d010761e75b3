"""Property tests of the commit codec: every event type round-trips, hostile bytes only ever give
a `CodecError`, and schema versions are handled explicitly (upcast, or a typed error)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlog.eventlog import codec
from agentlog.eventlog.codec import decode_commit, decode_event, encode_commit, encode_event
from agentlog.eventlog.errors import CodecError, UnknownEventType, UnsupportedSchemaVersion
from agentlog.eventlog.events import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Commit, StepStarted

ids = st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def strategy_for(info: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    """A strategy for any msgspec type, derived from the structs themselves, so a new event type
    or field is covered without touching this file."""
    mi = msgspec.inspect
    if isinstance(info, mi.AnyType):
        return json_values
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.IntType):
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if isinstance(info, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(info, mi.StrType):
        return st.text(max_size=30)
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.UnionType):
        return st.one_of([strategy_for(t) for t in info.types])
    if isinstance(info, mi.ListType):
        return st.lists(strategy_for(info.item_type), max_size=3)
    if isinstance(info, mi.DictType):
        return st.dictionaries(strategy_for(info.key_type), strategy_for(info.value_type), max_size=3)
    if isinstance(info, mi.StructType):
        required = {f.name: strategy_for(f.type) for f in info.fields if f.required}
        optional = {f.name: strategy_for(f.type) for f in info.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: info.cls(**kw))
    raise NotImplementedError(f"no strategy for {info!r}: extend strategy_for")


def event_strategy(cls: type) -> st.SearchStrategy[AnyEvent]:
    return strategy_for(msgspec.inspect.type_info(cls))


any_event = st.one_of([event_strategy(cls) for cls in EVENT_TYPES.values()])


def commits(events: st.SearchStrategy[AnyEvent] = any_event) -> st.SearchStrategy[Commit]:
    return st.builds(
        Commit,
        commit_id=ids,
        thread_id=ids,
        run_id=st.none() | ids,
        ts=st.integers(min_value=0, max_value=2**48),
        events=st.lists(events, min_size=1, max_size=4),
    )


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_event_type_round_trips(name: str, data: st.DataObject) -> None:
    event = data.draw(event_strategy(EVENT_TYPES[name]))
    commit = data.draw(commits(st.just(event)))
    decoded = decode_commit(encode_commit(commit))
    assert decoded == commit
    assert type(decoded.events[0]) is EVENT_TYPES[name]
    assert decode_event(encode_event(event)) == event


@given(commits())
def test_mixed_commits_round_trip(commit: Commit) -> None:
    data = encode_commit(commit)
    assert decode_commit(data) == commit
    assert decode_commit(bytearray(data)) == commit
    assert decode_commit(memoryview(data)) == commit


def test_the_strategy_covers_every_event_type() -> None:
    assert set(EVENT_TYPES) == {cls.__name__ for cls in AnyEvent.__args__}  # type: ignore[attr-defined]
    for cls in EVENT_TYPES.values():
        event_strategy(cls)  # built eagerly: raises if some field type has no strategy


def _decodes_or_codec_error(data: bytes) -> None:
    try:
        result = decode_commit(data)
    except CodecError:
        return
    assert isinstance(result, Commit)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_only_codec_errors(data: bytes) -> None:
    _decodes_or_codec_error(data)
    try:
        decode_event(data)
    except CodecError:
        pass


@given(json_values)
def test_arbitrary_json_gives_only_codec_errors(value: Any) -> None:
    _decodes_or_codec_error(msgspec.json.encode(value))


commit_shaped = st.fixed_dictionaries(
    {},
    optional={
        "commit_id": json_values | ids,
        "thread_id": json_values | ids,
        "run_id": json_values | ids,
        "ts": json_values,
        "v": json_values | st.integers(-3, 5),
        "events": st.lists(
            st.dictionaries(st.text(max_size=8), json_values, max_size=3).flatmap(
                lambda d: st.sampled_from([*EVENT_TYPES, "Nope", ""]).map(lambda t: {**d, "type": t})
            )
            | json_values,
            max_size=3,
        ),
    },
)


@given(commit_shaped)
def test_almost_commits_give_only_codec_errors(value: dict[str, Any]) -> None:
    _decodes_or_codec_error(msgspec.json.encode(value))


def _raw_commit(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"commit_id": "c1", "thread_id": "t1", "ts": 1, "v": SCHEMA_VERSION,
                           "events": [{"type": "StepStarted", "step": 1}]}
    raw.update(overrides)
    return raw


def test_unknown_event_type_is_named() -> None:
    data = msgspec.json.encode(_raw_commit(events=[{"type": "TeleportedToMars", "x": 1}]))
    with pytest.raises(UnknownEventType, match="TeleportedToMars"):
        decode_commit(data)
    with pytest.raises(UnknownEventType):
        decode_commit(msgspec.json.encode(_raw_commit(v=SCHEMA_VERSION, events=[{"type": "Later"}])))


def test_newer_schema_version_is_refused_with_a_clear_error() -> None:
    with pytest.raises(UnsupportedSchemaVersion, match="upgrade"):
        decode_commit(msgspec.json.encode(_raw_commit(v=SCHEMA_VERSION + 1)))


@pytest.mark.parametrize("bad", [0, -1, "1", True, None, 1.5])
def test_malformed_schema_version_is_a_codec_error(bad: Any) -> None:
    with pytest.raises(CodecError):
        decode_commit(msgspec.json.encode(_raw_commit(v=bad)))


# -- upcasting: simulate a build at schema version N+1 that reads commits written at N ------------


@pytest.fixture
def next_version(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pretend this build writes SCHEMA_VERSION + 1; commits at SCHEMA_VERSION become 'old'."""
    new = SCHEMA_VERSION + 1
    monkeypatch.setattr(codec, "SCHEMA_VERSION", new)
    return new


def _rename_step_began(raw: dict[str, Any]) -> dict[str, Any]:
    """The kind of change an upcaster exists for: an old event renamed, a field renamed."""
    events = []
    for ev in raw["events"]:
        if ev.get("type") == "StepBegan":
            ev = {"type": "StepStarted", "step": ev["n"]}
        events.append(ev)
    return {**raw, "events": events}


def test_registered_upcaster_is_applied_to_older_commits(
    next_version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(codec.UPCASTERS, SCHEMA_VERSION, _rename_step_began)
    old = _raw_commit(v=SCHEMA_VERSION, events=[{"type": "StepBegan", "n": 7}, {"type": "StepStarted", "step": 8}])
    decoded = decode_commit(msgspec.json.encode(old))
    assert decoded.events == [StepStarted(step=7), StepStarted(step=8)]
    assert decoded.v == next_version
    # A commit already at the new version is read as is.
    assert decode_commit(msgspec.json.encode(_raw_commit(v=next_version))).v == next_version


def test_missing_upcaster_is_a_typed_error(next_version: int) -> None:
    with pytest.raises(UnsupportedSchemaVersion, match=f"version {SCHEMA_VERSION}"):
        decode_commit(msgspec.json.encode(_raw_commit(v=SCHEMA_VERSION)))


def test_failing_upcaster_is_a_codec_error(next_version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(raw: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("n")

    monkeypatch.setitem(codec.UPCASTERS, SCHEMA_VERSION, broken)
    with pytest.raises(CodecError, match="upcaster"):
        decode_commit(msgspec.json.encode(_raw_commit(v=SCHEMA_VERSION)))
