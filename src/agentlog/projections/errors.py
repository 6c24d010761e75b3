"""Typed errors of the projections layer.

They subclass `agentlog.eventlog.errors.AgentlogError` so the gateway maps them to a status/code the same
way as the log's own errors, without parsing messages.
"""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.errors import AgentlogError


class InvalidPatch(AgentlogError, ValueError):
    """A state patch that is malformed (not RFC 6902) or cannot be applied to the current state.

    The runtime validates every patch with `validate_patch` before appending, so the log never
    holds one; `op_index` names the failing op when known.
    """

    code = "invalid_patch"

    def __init__(self, message: str, *, op_index: int | None = None, op: Any = None) -> None:
        self.op_index = op_index
        self.op = op
        where = f" (op {op_index}: {op!r})" if op_index is not None else ""
        super().__init__(f"invalid state patch{where}: {message}")


class ProjectionTimeout(AgentlogError, TimeoutError):
    """`wait_for(seq)` did not see the projection reach `seq` in time (read-your-writes bound)."""

    code = "projection_timeout"

    def __init__(self, wanted: int, applied: int, timeout: float) -> None:
        self.wanted = wanted
        self.applied = applied
        self.timeout = timeout
        super().__init__(
            f"projection is at seq {applied}, not yet at {wanted}, after waiting {timeout:.3g}s; "
            "retry later or read without min_seq"
        )


class ProjectionError(AgentlogError):
    """The view store or runner failed in a way a caller can act on (bucket config, NATS errors)."""

    code = "projection_error"


class WriterFenced(ProjectionError):
    """A view write was refused because someone else wrote the bucket (or the position key) since
    this writer last did: another process holds the projections' writer lease now. The writer
    drops what it cached and writes nothing more until it holds the lease again
    (`agentlog.projections.lease`)."""

    code = "writer_fenced"


class ListingBusy(ProjectionError):
    """A listing read kept racing writes of its list (each write replaced a page it was about to
    read) and gave up: retry. Never seen in practice; it needs dozens of writes during one read."""

    code = "listing_busy"
