"""AI SDK `regenerate-message` as a fork: the answer to regenerate is never erased (the log is
append-only), the conversation branches before it instead.

`useChat().regenerate()` drops the last assistant message on the client and posts the chat
again. Here that forks the chat's thread at the input of the run that produced the answer (the
run's last input message; `agentlog.projections.fork`), so the new run sees exactly what the old one
saw, and starts a run on the fork. The chat keeps its id (the client has no way to learn a new
one), so the chat's thread records which thread now carries it: metadata `agentlog.branch` on
the chat's ORIGINAL thread names the latest fork (one hop, however many regenerations), and
every AI SDK request and read of the chat follows it. The old answer stays in the original
thread's log, readable and replayable; `forked_from` on the fork says where it branched.
"""

from __future__ import annotations

from typing import Any

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import (
    AnyEvent,
    Commit,
    MessageAppended,
    Position,
    StepStarted,
    StoredCommit,
    ThreadMetadataUpdated,
)
from agentlog.eventlog.ids import new_id, now_ms
from agentlog.eventlog.store import EventStore
from agentlog.gateway.adapters.common import AdapterInputError
from agentlog.projections.fork import fork_events

#: Metadata key of a chat's original thread: the thread that carries the chat since its last
#: regeneration.
BRANCH = "agentlog.branch"


def branch_of(metadata: dict[str, Any] | None) -> str | None:
    value = (metadata or {}).get(BRANCH)
    return value if isinstance(value, str) else None


def input_position(commits: list[StoredCommit], run_id: str) -> Position:
    """Where the conversation stood when `run_id` began: its last input message (in its first
    commit, before its first step), else the event before that commit."""
    previous: Position | None = None
    for stored in commits:
        if stored.commit.run_id != run_id:
            if stored.commit.events:
                previous = Position(stored.seq, len(stored.commit.events) - 1)
            continue
        at = previous
        for index, event in enumerate(stored.commit.events):
            if type(event) is StepStarted:
                break
            if type(event) is MessageAppended:
                at = Position(stored.seq, index)
        if at is None:
            raise AdapterInputError(f"run {run_id!r} has nothing before it to regenerate from", "messageId")
        return at
    raise AdapterInputError(f"no run {run_id!r} on this chat", "messageId")


async def fork_for_regenerate(store: EventStore, chat_thread_id: str, chat_version: int, thread_id: str,
                              commits: list[StoredCommit], last_run_id: str | None, message_id: str) -> str:
    """Fork `thread_id` (the thread carrying the chat, whose `commits` are given) before the run
    whose answer `message_id` is (an assistant message's id is its run's id), and point the
    chat's original thread at the fork. Only the last answer can be regenerated. Returns the
    fork's id; the caller starts the run on it."""
    if message_id != last_run_id:
        raise AdapterInputError("only the last assistant message can be regenerated (its id is its run id)",
                                "messageId")
    position = input_position(commits, message_id)
    fork_id = new_id()
    events: list[AnyEvent] = fork_events(commits, thread_id, position, new_id=new_id, metadata={BRANCH: None})
    await store.append(Commit(commit_id=new_id(), thread_id=fork_id, ts=now_ms(), events=events),
                       expected_version=0)
    try:
        await store.append(Commit(commit_id=new_id(), thread_id=chat_thread_id, ts=now_ms(),
                                  events=[ThreadMetadataUpdated(metadata={BRANCH: fork_id})]),
                           expected_version=chat_version)
    except VersionConflict:
        raise AdapterInputError("the chat changed while regenerating: try again", "messageId") from None
    return fork_id


__all__ = ["BRANCH", "branch_of", "fork_for_regenerate", "input_position"]
