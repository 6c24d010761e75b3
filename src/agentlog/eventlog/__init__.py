"""agentlog's log: events, commits, codecs, ids, subjects and the stores that keep them."""

from agentlog.eventlog.codec import decode_commit, decode_event, encode_commit, encode_event
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.errors import (
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
from agentlog.eventlog.events import *  # noqa: F403  (the vocabulary is the public surface)
from agentlog.eventlog.events import AppendResult, Commit, Position, StoredCommit
from agentlog.eventlog.ids import is_valid_id, new_id, now_ms, validate_id, validate_run_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.eventlog.store import EventStore, collect

__all__ = [
    "AgentlogError", "AppendResult", "CodecError", "Commit", "CommitTooLarge", "EmbeddedNatsServer",
    "EventStore", "InvalidCommit", "InvalidId", "JetStreamEventStore", "MemoryEventStore", "NatsServerNotFound", "Position",
    "ServerTooOld", "StoreUnavailable", "StoredCommit", "UnknownEventType", "UnsupportedSchemaVersion",
    "VersionConflict", "collect", "decode_commit", "decode_event", "encode_commit", "encode_event",
    "is_valid_id", "new_id", "now_ms", "validate_id", "validate_run_id",
]
