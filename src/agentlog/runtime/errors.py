"""The runtime's typed errors about runs and threads, in one place below everything that raises
them (the loop, the start admission, the runtime facade, the gateway's dispatchers), so a check
moved from one of those to another keeps its error and so its HTTP status / NATS code."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentlog.eventlog.errors import AgentlogError, VersionConflict

T = TypeVar("T")

#: How many times a write under OCC re-reads the log and tries again before it gives up.
CONFLICT_ATTEMPTS = 20


class RunNotFound(AgentlogError, LookupError):
    code = "run_not_found"


class ThreadNotFound(AgentlogError, LookupError):
    """Unknown or deleted thread (a deleted thread takes no runs)."""

    code = "thread_not_found"


class RunConflict(AgentlogError):
    """The run cannot start or go on as asked because of what the log holds: its id is taken,
    the thread has a running run, or another writer changed the thread under a running run (not a
    cancel request). Nothing of ours was written by the failed append; a worker can re-read the
    log and re-evaluate."""

    code = "run_conflict"


class RunEnded(AgentlogError):
    """Input for a running run (a queued message) that has already finished: nothing was
    written. Its code is the API's `run_finished` (409)."""

    code = "run_finished"


class CommandRejected(AgentlogError):
    """A command that can never be carried out (an unknown agent, a decision for a finished run,
    input the runtime refuses): nothing of it was written. `code` is the refusal's own."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail

    @classmethod
    def of(cls, exc: BaseException, default: str = "command_rejected") -> CommandRejected:
        """The rejection that `exc` (the runtime's refusal) amounts to."""
        return cls(getattr(exc, "code", None) or default, f"{type(exc).__name__}: {exc}")


async def retry_on_conflict(attempt: Callable[[int], Awaitable[T]], what: str, *,
                            attempts: int = CONFLICT_ATTEMPTS,
                            conflicts: tuple[type[Exception], ...] = (VersionConflict,)) -> T:
    """`await attempt(i)` for i = 0, 1, ... until it returns without a conflict (`VersionConflict`,
    or the `conflicts` given).

    Every append under OCC follows the same shape: read the log, decide, append at the version
    read; a conflict means another writer moved the thread, so the decision is made again from
    a fresh read. `attempt` receives its index (the first one may use a cached snapshot, later
    ones re-read). After `attempts` conflicts in a row: `RunConflict("could not <what>: ...")`."""
    for i in range(attempts):
        try:
            return await attempt(i)
        except conflicts:
            continue
    raise RunConflict(f"could not {what}: the thread keeps moving")


__all__ = ["CONFLICT_ATTEMPTS", "CommandRejected", "RunConflict", "RunEnded", "RunNotFound", "ThreadNotFound", "retry_on_conflict"]
