"""agentlog's log: events, commits, codecs, ids, subjects and the stores that keep them."""

from .codec import decode_commit, decode_event, encode_commit, encode_event
from .errors import (
    AgentlogError,
    CodecError,
    CommitTooLarge,
    InvalidCommit,
    InvalidId,
    NatsServerNotFound,
    ServerTooOld,
    StoreUnavailable,
    UnknownEventType,
    UnsupportedSchemaVersion,
    VersionConflict,
)
from .events import *  # noqa: F403  (the vocabulary is the public surface)
from .events import AppendResult, Commit, Position, StoredCommit
from .ids import is_valid_id, new_id, now_ms, validate_id, validate_run_id
from .jetstream import JetStreamEventStore
from .memory import MemoryEventStore
from .server import EmbeddedNatsServer
from .store import EventStore, collect

__all__ = [
    "AgentlogError", "AppendResult", "CodecError", "Commit", "CommitTooLarge", "EmbeddedNatsServer",
    "EventStore", "InvalidCommit", "InvalidId", "JetStreamEventStore", "MemoryEventStore", "NatsServerNotFound", "Position",
    "ServerTooOld", "StoreUnavailable", "StoredCommit", "UnknownEventType", "UnsupportedSchemaVersion",
    "VersionConflict", "collect", "decode_commit", "decode_event", "encode_commit", "encode_event",
    "is_valid_id", "new_id", "now_ms", "validate_id", "validate_run_id",
]
