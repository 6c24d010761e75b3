"""Start admission: what a run start can be refused for, checked before its first write.

    request = check_request(request, max_payload=store.max_payload)   # the input: pure
    history, thread = await admit_thread(store, thread_id, run_id=..., parent_run_id=...)  # the log

Both the runtime that records a start and a gateway that queues it for a worker call these, so
both refuse the same input with the same typed error and neither leaves anything behind. The
agent's own tools and models are the runtime's to check.

The size check builds the run-start commit as the loop will ([ThreadCreated] + RunStarted + the
messages, with ids as long as real ones) and refuses it with the store's own `CommitTooLarge`
(413) when it cannot fit the server's max payload. Plugin patches at run start are not known
here: a start that only they push over the limit is refused by the store at append.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import Any

import msgspec

from agentlog.eventlog.errors import CommitTooLarge, InvalidCommit
from agentlog.eventlog.events import (
    Commit,
    ContentPart,
    Message,
    MessageAppended,
    QueueMode,
    RunStarted,
    StatePatched,
    StoredCommit,
    ThreadCreated,
)
from agentlog.eventlog.ids import validate_id, validate_run_id
from agentlog.eventlog.jetstream.payloads import without_binaries
from agentlog.eventlog.store import EventStore, as_generator, encode_checked
from agentlog.projections.views import ThreadView
from agentlog.runtime.errors import RunConflict, RunNotFound, ThreadNotFound
from agentlog.runtime.inputs.frontend import normalize_frontend_tools
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.inputs.run_input import (
    CLIENT_STATE_SOURCE,
    InvalidRunInput,
    OverrideScope,
    RunInput,
    check_overrides,
    client_state_ops,
)
from agentlog.runtime.inputs.thread_folds import Fold, ThreadFolds, ThreadViews

#: Bytes the store adds around a commit's payload (NATS headers: msg id, expected sequence and
#: subject), over-estimated so the check never passes what the append would refuse.
HEADER_ALLOWANCE = 512


def as_parts(content: Sequence[Any]) -> list[ContentPart]:
    """Content parts as a route receives them: `{"type": "text", "text"}`, `{"type": "image" |
    "file", "media_type", "data" (base64)}` or `{..., "url"}` (plus `filename` for files).
    Raises `ValueError` naming the part for anything else."""
    out: list[ContentPart] = []
    for j, p in enumerate(content):
        if isinstance(p, ContentPart):
            out.append(p)
            continue
        if not isinstance(p, Mapping) or p.get("type") not in ("text", "image", "file"):
            raise ValueError(f"content[{j}]: a part is an object of type text, image or file")
        try:
            part = msgspec.convert({k: v for k, v in p.items() if k != "data_ref"}, ContentPart)
        except msgspec.ValidationError as exc:
            raise ValueError(f"content[{j}]: {exc}") from None
        if part.type != "text":
            if (part.data is None) == (part.url is None):
                raise ValueError(f"content[{j}]: an {part.type} part has either data (base64) or a url")
            if part.data is not None:
                if not part.media_type:
                    raise ValueError(f"content[{j}]: media_type is required with data")
                try:
                    base64.b64decode(part.data, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"content[{j}]: data is not base64") from None
        out.append(part)
    return out


def message_of(id: str, role: Any, content: Any, **fields: Any) -> Message:
    """A message from its content: a string stays a string; a list of parts keeps them in
    `parts`, with their text joined in `content` (a text-only list becomes plain text)."""
    if isinstance(content, (list, tuple)):
        parts = as_parts(content)
        text = "".join(p.text for p in parts if p.type == "text")
        if all(p.type == "text" for p in parts):
            return Message(id=id, role=role, content=text, **fields)
        return Message(id=id, role=role, content=text, parts=parts, **fields)
    return Message(id=id, role=role, content=str(content), **fields)


def as_messages(messages: str | Message | Mapping[str, Any] | Sequence[Any], entropy: Any) -> list[Message]:
    """Input messages: a string (one user message), `Message`s, or `{"role", "content"}` dicts,
    whose content may be a list of parts (`as_parts`)."""
    if isinstance(messages, (str, Message, Mapping)):
        messages = [messages]
    out: list[Message] = []
    for m in messages:
        if isinstance(m, str):
            out.append(Message(id=entropy.new_id(), role="user", content=m))
        elif isinstance(m, Message):
            out.append(m)
        elif isinstance(m, Mapping):
            role = m.get("role", "user")
            if role not in ("user", "system", "assistant", "tool"):
                raise ValueError(f"invalid message role {role!r}")
            out.append(message_of(
                m.get("id") or entropy.new_id(), role, m.get("content", ""),
                tool_call_id=m.get("tool_call_id"), visibility=m.get("visibility", "all"),
            ))
        else:
            raise TypeError(f"a message must be a str, Message or dict, not {type(m).__name__}")
    return out


class PlaceholderIds:
    """Entropy stand-in for validating input without drawing real ids (the ids a run draws, and
    their order, are part of what replay reproduces). Its ids are as long as real ones (32 hex),
    so a commit built with them has the real commit's size."""

    def new_id(self) -> str:
        return "0" * 32

    def now_ms(self) -> int:
        return 0


def check_messages(messages: Any) -> list[Message]:
    """Reject input messages that could not be committed: bad role, visibility or id."""
    out = as_messages(messages, PlaceholderIds())
    for m in out:
        try:
            msgspec.convert(msgspec.to_builtins(m), Message)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid message: {exc}") from None
        validate_id(m.id, "message id")
        if m.tool_call_id is not None:
            validate_id(m.tool_call_id, "tool_call_id")
    return out


#: How a message for a running run is taken: at its next step boundary, or when it would end.
QUEUE_MODES: tuple[QueueMode, ...] = ("steer", "follow_up")


def queue_input(messages: str | Message | Mapping[str, Any] | Sequence[Any], mode: str,
                entropy: Any) -> list[Message]:
    """Validated messages to queue (ids drawn from `entropy` where not given): user messages
    only (a steer is the user speaking), at least one; `ValueError` otherwise."""
    if mode not in QUEUE_MODES:
        raise ValueError(f"unknown queue mode {mode!r} (one of {', '.join(QUEUE_MODES)})")
    check_messages(messages)
    out = as_messages(messages, entropy)
    if not out:
        raise ValueError("give at least one message to queue")
    for m in out:
        if m.role != "user":
            raise ValueError(f"a queued message is a user message, not {m.role!r}")
    return out


def check_storable(value: Any, what: str) -> None:
    """`value` can be written to the log as JSON text (no lone surrogate, no absurd nesting);
    raises `InvalidRunInput`. For input that rides in commits the caller does not build here
    (decisions, a cancel reason). Values of other types are the runtime's to judge."""
    try:
        msgspec.json.encode(value)
    except TypeError:
        return
    except (UnicodeError, RecursionError) as exc:
        raise InvalidRunInput(f"{what} cannot be stored: {exc}") from None


def check_ids(request: RunRequest) -> None:
    """The ids a request names are NATS-safe tokens (`InvalidId`); `None` ones are generated."""
    validate_id(request.agent_id, "agent_id")
    if request.thread_id is not None:
        validate_id(request.thread_id, "thread_id")
    if request.run_id is not None:
        validate_run_id(request.run_id)
    if request.parent_run_id is not None:
        validate_run_id(request.parent_run_id)
    if request.parent_thread_id is not None:
        validate_id(request.parent_thread_id, "parent_thread_id")


def check_request(request: RunRequest, *, max_payload: int | None = None,
                  overrides: OverrideScope | None = None) -> RunRequest:
    """The request as it is recorded (its frontend tools normalised), or the typed error it must
    get before anything is written: `InvalidId`, `InvalidFrontendTools`, `OverrideNotAllowed`
    (against `overrides`, when the caller knows the agent),
    `ValueError`/`TypeError` (shapes), `InvalidRunInput` (not encodable), `CommitTooLarge` (the
    run-start commit over `max_payload`)."""
    check_ids(request)
    if request.parent_thread_id is not None:
        if request.parent_run_id is None or request.decisions:
            raise ValueError("a sub-agent run (parent_thread_id) needs parent_run_id and takes no decisions")
    frontend = normalize_frontend_tools(request.frontend_tools)
    given = request.run_input
    if overrides is not None and given is not None:
        check_overrides(given.overrides, overrides.policy, overrides.model_name, overrides.tools)
    if request.decisions and request.parent_run_id is None:
        raise ValueError("decisions on a new run need parent_run_id (the run that waits for them)")
    check_storable(list(request.decisions), "decisions")
    msgs = check_messages(request.messages)
    placeholder = PlaceholderIds().new_id()
    events: list[Any] = [] if request.continues is not None else [ThreadCreated(resource_id=request.resource_id)]
    given = given or RunInput()
    events.append(RunStarted(run_id=request.run_id or placeholder, agent_id=request.agent_id,
                             parent_run_id=request.parent_run_id, frontend_tools=frontend,
                             overrides=given.overrides, context=list(given.context),
                             forwarded_props=given.forwarded_props))
    events.extend(MessageAppended(message=m) for m in msgs)
    if given.state:  # at most this patch (only changed keys are recorded)
        events.append(StatePatched(ops=client_state_ops({}, given.state), source=CLIENT_STATE_SOURCE))
    commit = Commit(commit_id=placeholder, thread_id=request.thread_id or placeholder,
                    run_id=request.run_id or placeholder, ts=0, events=events)
    try:
        data = encode_checked(without_binaries(commit))  # large binaries go to the Object Store
    except InvalidCommit as exc:
        raise InvalidRunInput(f"the run's input cannot be stored: {exc}") from None
    if max_payload is not None and len(data) + HEADER_ALLOWANCE > max_payload:
        raise CommitTooLarge(len(data) + HEADER_ALLOWANCE, max_payload)
    return request if frontend == request.frontend_tools else request.replace(frontend_tools=frontend)


def check_thread(
    thread_id: str, history: Sequence[StoredCommit], *, run_id: str | None, parent_run_id: str | None = None,
) -> ThreadView | None:
    """`check_fold` over the thread's log (`history`, all its commits)."""
    return check_fold(ThreadViews.of(thread_id, history), run_id=run_id, parent_run_id=parent_run_id)


def check_fold(fold: ThreadViews, *, run_id: str | None, parent_run_id: str | None = None) -> ThreadView | None:
    """The part of start admission that needs the thread's log (`fold`: folded up to its last
    commit), for a run `run_id` (None: not chosen yet, so new) that continues `parent_run_id`
    (None: a new conversation; a child run on another thread passes None too). Returns the
    thread's view (None for a new thread) or raises: `ThreadNotFound` (deleted), `RunConflict`
    (the run id is taken, or another run of the thread is running), `RunNotFound` (the parent is
    not on this thread)."""
    thread_id = fold.thread_id
    if fold.seq == 0:
        if parent_run_id is not None:
            raise RunNotFound(f"parent run {parent_run_id!r} is not on thread {thread_id!r}")
        return None
    thread = fold.thread
    if thread is None:  # commits without a thread (never written by agentlog): nothing to check
        return None
    if thread.deleted:
        raise ThreadNotFound(f"thread {thread_id!r} is deleted")
    if run_id is not None and run_id in thread.run_ids:
        raise RunConflict(f"run {run_id!r} already exists on thread {thread_id!r}")
    active = thread.active_run_id
    if active is not None and (view := fold.runs.get(active)) is not None and view.status == "running":
        raise RunConflict(f"thread {thread_id!r} has an active run {active!r}; cancel it or wait")
    if parent_run_id is not None and parent_run_id not in thread.run_ids:
        raise RunNotFound(f"parent run {parent_run_id!r} is not on thread {thread_id!r}")
    return thread


async def admit_thread(
    store: EventStore, thread_id: str, *, run_id: str | None, parent_run_id: str | None = None,
    folds: ThreadFolds[Fold],
) -> tuple[Fold, ThreadView | None]:
    """`check_fold` over the thread as the store holds it now (read through `folds`, the
    process's kept folds: only the commits after its kept one), plus the one check a new thread
    cannot answer from its own log: a run id the caller chose must not name a run of another
    thread. The one rule every way of starting a run applies before its first write
    (`Runtime.start` in the process that drives the run, the gateway's `QueueDispatcher` before it
    queues the command), so both refuse the same starts with the same typed errors. Returns the
    thread's fold and its view."""
    fold = await folds.read(store, thread_id)
    if fold.seq == 0 and run_id is not None:
        async with aclosing(as_generator(store.read_run(run_id))) as taken:
            async for _ in taken:
                raise RunConflict(f"run {run_id!r} already exists")
    return fold, check_fold(fold, run_id=run_id, parent_run_id=parent_run_id)


__all__ = ["HEADER_ALLOWANCE", "QUEUE_MODES", "InvalidRunInput", "PlaceholderIds", "admit_thread", "as_messages", "as_parts",
           "check_fold", "check_ids", "check_messages", "check_request", "check_storable", "check_thread",
           "queue_input"]
