"""Forking a thread: the events that start a new thread from another's history as of one event.

A fork is one commit on a new thread: `ThreadCreated` with its lineage (`forked_from`), the
source's messages as of the position (`timetravel.messages_at`), and its thread state as of the
position (`timetravel.state_at`) as a `StateReplaced`, optionally edited (replaced, or patched
with RFC 6902 ops) and with one message replaced, like LangGraph's `update_state` + fork. A run
started on the fork folds that commit like any thread history (`runtime.run_context`), so it
needs nothing of the source thread, and `replay --verify` of it reads only the fork's log.

Pure: the caller reads the source's commits and appends the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from agentlog.eventlog.events import (
    AnyEvent,
    ForkOrigin,
    Message,
    MessageAppended,
    Position,
    StateReplaced,
    StoredCommit,
    ThreadCreated,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.fold import merge_metadata
from agentlog.projections.state import validate_patch, validate_state
from agentlog.projections.timetravel import messages_at, thread_at


class InvalidFork(ValueError):
    """The fork cannot be made from this input (`code` says why); nothing is written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: Content of the tool message that answers a call the fork cut off before its result: a
#: provider refuses a conversation with an unanswered call, and the runtime closes cancelled
#: calls the same way.
CUT_OFF = "Error: the call was cancelled (the thread was forked before its result)"


def is_event_of(commits: Sequence[StoredCommit], position: Position) -> bool:
    """Whether `position` names an event of `commits` (not a gap between them, not past the end)."""
    for stored in commits:
        if stored.seq == position.seq:
            return position.index < len(stored.commit.events)
    return False


def _replace(messages: list[Message], replacement: Mapping[str, Any]) -> list[Message]:
    message_id = replacement.get("id")
    for i, message in enumerate(messages):
        if message.id == message_id:
            changes = {k: v for k, v in replacement.items() if k in ("content", "role") and v is not None}
            if "content" in changes:
                changes["content_ref"] = None
            out = list(messages)
            out[i] = msgspec.structs.replace(message, **changes)
            return out
    raise InvalidFork("message_not_found",
                      f"replace_message: no message {message_id!r} in the thread as of the fork position")


def _close_calls(messages: list[Message], new_id: Any) -> list[Message]:
    """Answer every tool call left without a result (the fork cut its run mid-step)."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    out: list[Message] = []
    for message in messages:
        out.append(message)
        for call in message.tool_calls or ():
            if call.id not in answered:
                out.append(Message(id=new_id(), role="tool", content=CUT_OFF, tool_call_id=call.id))
    return out


def fork_events(commits: Sequence[StoredCommit], thread_id: str, position: Position, *,
                new_id: Any, state: Mapping[str, Any] | None = None,
                state_patch: Sequence[Mapping[str, Any]] | None = None,
                replace_message: Mapping[str, Any] | None = None,
                metadata: Mapping[str, Any] | None = None) -> list[AnyEvent]:
    """The events of the commit that creates a fork of `thread_id` (whose `commits` are given,
    in log order) as of `position`. `new_id()` makes ids of added messages. Raises `InvalidFork`
    for a position that is no event of the thread, a patch that does not apply, or a replaced
    message that is not in the history."""
    if not is_event_of(commits, position):
        raise InvalidFork("position_not_found", f"no event {position} in thread {thread_id!r}")
    if state is not None and state_patch is not None:
        raise InvalidFork("invalid_fork", "give state (a replacement) or state_patch (RFC 6902 ops), not both")
    source = thread_at(commits, thread_id, position)
    new_state: dict[str, Any] = source.state
    try:
        if state is not None:
            new_state = validate_state(state)
    except InvalidPatch as exc:
        raise InvalidFork("invalid_state", str(exc)) from None
    if state_patch is not None:
        try:
            new_state = validate_patch(new_state, [dict(op) for op in state_patch])
        except InvalidPatch as exc:
            raise InvalidFork("invalid_patch", f"state_patch does not apply: {exc}") from None
    messages = messages_at(commits, thread_id, position)
    if replace_message is not None:
        messages = _replace(messages, replace_message)
    messages = _close_calls(messages, new_id)
    events: list[AnyEvent] = [ThreadCreated(
        resource_id=source.resource_id, metadata=merge_metadata(source.metadata, dict(metadata or {})),
        forked_from=ForkOrigin(thread_id=thread_id, position=str(position)))]
    events += [MessageAppended(message=m) for m in messages]
    if new_state:
        events.append(StateReplaced(state=new_state))
    return events


__all__ = ["CUT_OFF", "InvalidFork", "fork_events", "is_event_of"]
