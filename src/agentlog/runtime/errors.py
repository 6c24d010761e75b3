"""The runtime's typed errors about runs and threads, in one place below everything that raises
them (the loop, the start admission, the runtime facade, the gateway's dispatchers), so a check
moved from one of those to another keeps its error and so its HTTP status / NATS code."""

from __future__ import annotations

from agentlog.eventlog.errors import AgentlogError


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


__all__ = ["RunConflict", "RunEnded", "RunNotFound", "ThreadNotFound"]
