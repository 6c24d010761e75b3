"""`RunRequest`: one request to start a run, built at the door it comes in by and passed whole.

    request = RunRequest(agent_id="calc", messages=["what is 2+3?"], thread_id="t1")
    handle = await runtime.start(request)           # in the process that runs it
    accepted = await dispatcher.start_run(request)  # a gateway: checked, then queued for a worker

Every way of starting a run builds one: the HTTP body and the NATS request, each protocol adapter,
a sub-agent tool, verified replay. It is checked once before anything is written
(`agentlog.runtime.inputs.admission.check_request`); the worker command that carries it is a
`RunRequest` too (`agentlog.runtime.workers.commands.StartRun`), and the loop records it in the
run-start commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from agentlog.eventlog.events import Message
from agentlog.runtime.inputs.run_input import RunInput, as_run_input


class RunRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A run to start. Ids left None are generated; defaults are omitted on the wire."""

    #: The agent to run.
    agent_id: str
    #: Its input: a string (one user message), `Message`s, or `{role, content[, id]}` objects
    #: (content may be a list of parts). A lone string or object is taken as a list of one.
    messages: list[Any] = []
    #: The thread: a new one when None. A continuation runs on its parent's thread.
    thread_id: str | None = None
    #: Chosen by the caller, so that a retry names the same run (and runs it once).
    run_id: str | None = None
    #: The run this one continues on its thread, or (with `parent_thread_id`) the run whose
    #: sub-agent this is.
    parent_run_id: str | None = None
    #: A sub-agent run: its parent's thread. The run starts on a new child thread.
    parent_thread_id: str | None = None
    #: The owner of a new thread (tenancy); ignored for an existing one.
    resource_id: str | None = None
    #: Who asked for the run, recorded in `RunStarted` (`user`, `subagent`, ...).
    origin: str = "user"
    #: Decisions for the waiting parent's suspended calls, applied before this run starts.
    decisions: list[Any] = []
    #: Tools the client runs itself, for this run only (`agentlog.runtime.inputs.frontend`).
    frontend_tools: list[Any] = []
    #: The metadata of a new thread.
    thread_metadata: dict[str, Any] = {}
    #: Overrides, context, forwarded props and client state (`agentlog.runtime.inputs.run_input`);
    #: its JSON form is converted.
    run_input: RunInput | None = None
    #: A continuation whose parent may still be running: the parent is cancelled first.
    interrupt: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.messages, (str, Message, Mapping)):
            self.messages = [self.messages]
        elif not isinstance(self.messages, list):
            self.messages = list(self.messages)
        if self.run_input is not None and not isinstance(self.run_input, RunInput):
            self.run_input = as_run_input(self.run_input)

    @property
    def continues(self) -> str | None:
        """The run this one continues on the same thread (None for a new conversation or a
        sub-agent run, whose parent is on another thread)."""
        return self.parent_run_id if self.parent_thread_id is None else None

    def replace(self, **changes: Any) -> RunRequest:
        """A copy with `changes` (the request's class kept)."""
        return msgspec.structs.replace(self, **changes)


__all__ = ["RunRequest"]
