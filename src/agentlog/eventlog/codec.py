"""JSON codec for commits, with schema-version handling.

The fast path is one typed msgspec decode. Anything else becomes a `CodecError` subclass:
unknown event types (written by a newer agentlog) and unknown schema versions are named
explicitly; older versions go through the upcasters registered in `UPCASTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from agentlog.eventlog.errors import CodecError, UnknownEventType, UnsupportedSchemaVersion
from agentlog.eventlog.events import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Commit, ProfileCommit

_encoder = msgspec.json.Encoder()
_commit_decoder = msgspec.json.Decoder(Commit)
_event_decoder = msgspec.json.Decoder(AnyEvent)
_raw_decoder = msgspec.json.Decoder()
_profile_decoder = msgspec.json.Decoder(ProfileCommit)

#: version -> function turning a raw commit dict of that version into one of version + 1.
UPCASTERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def encode_commit(commit: Commit) -> bytes:
    return _encoder.encode(commit)


def encode_event(event: AnyEvent) -> bytes:
    return _encoder.encode(event)


def decode_event(data: bytes) -> AnyEvent:
    try:
        return _event_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _explain(exc, data) from None


def decode_commit(data: bytes | bytearray | memoryview) -> Commit:
    """Decode a commit, upcasting older schema versions; raise a `CodecError` for anything else."""
    try:
        commit = _commit_decoder.decode(data)
    except msgspec.DecodeError as exc:
        return _decode_slow(bytes(data), exc)
    if commit.v != SCHEMA_VERSION:
        return _decode_slow(bytes(data), None)
    return commit


def encode_profile_commit(commit: ProfileCommit) -> bytes:
    return _encoder.encode(commit)


def decode_profile_commit(data: bytes | bytearray | memoryview) -> ProfileCommit:
    """Decode a profile commit (`ProfileCommit`); a `CodecError` for anything else, or for one
    written by a newer schema."""
    try:
        commit = _profile_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CodecError(f"not a profile commit: {exc}") from None
    if commit.v > SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(
            f"profile commit {commit.commit_id!r} has schema version {commit.v}; this build reads up to "
            f"{SCHEMA_VERSION}: upgrade agentlog to read it"
        )
    return commit


def _decode_slow(data: bytes, first_error: msgspec.DecodeError | None) -> Commit:
    try:
        raw = _raw_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CodecError(f"not a commit: invalid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CodecError(f"not a commit: expected a JSON object, got {type(raw).__name__}")
    version = raw.get("v", SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CodecError(f"not a commit: schema version {version!r} is not a positive integer")
    if version > SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(
            f"commit {raw.get('commit_id')!r} has schema version {version}; this build reads up to "
            f"{SCHEMA_VERSION}: upgrade agentlog to read it"
        )
    while version < SCHEMA_VERSION:
        upcast = UPCASTERS.get(version)
        if upcast is None:
            raise UnsupportedSchemaVersion(f"no upcaster from schema version {version}")
        try:
            raw = upcast(raw)
        except CodecError:
            raise
        except Exception as exc:  # a broken upcaster must surface as a codec error, not a crash
            raise CodecError(f"upcaster from schema version {version} failed: {exc!r}") from exc
        if not isinstance(raw, dict):
            raise CodecError(f"upcaster from schema version {version} returned {type(raw).__name__}")
        version += 1
        raw["v"] = version
    try:
        return msgspec.convert(raw, Commit)
    except msgspec.ValidationError as exc:
        raise _explain(exc, raw) from None
    except Exception as exc:  # msgspec.convert can raise TypeError on exotic input
        raise CodecError(f"not a commit: {exc}") from None


def _explain(exc: msgspec.DecodeError, data: Any) -> CodecError:
    events = data.get("events") if isinstance(data, dict) else None
    if isinstance(events, list):
        for ev in events:
            if isinstance(ev, dict) and isinstance(ev.get("type"), str) and ev["type"] not in EVENT_TYPES:
                return UnknownEventType(
                    f"unknown event type {ev['type']!r} (written by a newer agentlog?): {exc}"
                )
    return CodecError(f"not a valid commit: {exc}")
