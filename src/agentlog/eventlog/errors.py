"""Typed errors of the log.

Every failure a caller can act on has its own class and a message that names what was wrong and
what to do, so the gateway can map it to a status/code without parsing strings.
"""

from __future__ import annotations


class AgentlogError(Exception):
    """Base of every error agentlog raises on purpose. `code` is the machine code used by the APIs;
    `run_id` the run it concerns, when there is one (the APIs answer it as a field of the error)."""

    code = "agentlog_error"
    run_id: str | None = None

    def about_run(self, run_id: str | None) -> AgentlogError:
        """This error, saying which run it concerns (unless it already says); returns itself."""
        if self.run_id is None and run_id is not None:
            self.run_id = run_id
        return self


class InvalidId(AgentlogError, ValueError):
    code = "invalid_id"

    def __init__(self, kind: str, value: object) -> None:
        self.kind = kind
        self.value = value
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(
            f"invalid {kind} {shown}: ids must be 1-128 characters of A-Z, a-z, 0-9, '_' or '-'"
        )


class InvalidCommit(AgentlogError, ValueError):
    """A commit that breaks an invariant of the envelope (no events, events of another run...)."""

    code = "invalid_commit"


class VersionConflict(AgentlogError):
    """Optimistic concurrency failed: another writer appended to the thread first. Nothing was written."""

    code = "version_conflict"

    def __init__(self, thread_id: str, expected: int, actual: int | None) -> None:
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"thread {thread_id!r} is at version {actual if actual is not None else 'unknown'}, "
            f"not the expected {expected}: another writer appended first; re-read and retry"
        )


class CommitTooLarge(AgentlogError):
    code = "commit_too_large"

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"commit is {size} bytes encoded, over the server's max payload of {limit} bytes; "
            "split it or store large values out of band"
        )


class StoreUnavailable(AgentlogError):
    """NATS/JetStream cannot be reached (or did not answer in time). Safe to retry the same commit."""

    code = "store_unavailable"


class NoAnswer(StoreUnavailable):
    """A request NATS took but nobody answered in time (the server down or overloaded, or a
    JetStream stream that stopped answering its writes, as after a full disk)."""


class NotAuthorized(StoreUnavailable):
    """NATS refused the login (no, wrong or revoked credentials). Retrying will not help."""

    code = "nats_unauthorized"


class PermissionDenied(AgentlogError):
    """NATS denied a publish of this connection's user (e.g. the readonly role appending)."""

    code = "permission_denied"


class ServerTooOld(AgentlogError):
    code = "server_too_old"

    def __init__(self, found: str, needed: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f"nats-server {found} is too old: agentlog needs {needed} or newer "
            "(for Nats-Expected-Last-Subject-Sequence-Subject per-thread concurrency control)"
        )


class NatsServerNotFound(AgentlogError):
    code = "nats_server_not_found"


class CodecError(AgentlogError, ValueError):
    """Bytes that are not a valid commit of a schema version this build understands."""

    code = "codec_error"


class UnknownEventType(CodecError):
    code = "unknown_event_type"


class UnsupportedSchemaVersion(CodecError):
    code = "unsupported_schema_version"
