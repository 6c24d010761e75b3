"""Runs as A2A tasks (pure): task id = run id, context id = thread id.

A run's status maps onto the A2A task state: running -> working, waiting (suspended calls) ->
input-required (the status message lists the calls and tickets a decision can answer), done ->
completed / canceled / failed by termination. The task's history is the run's user and agent
messages; a finished run's last answer is the `answer` artifact.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from a2a.types.a2a_pb2 import (
    Artifact,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.types.a2a_pb2 import (
    Message as A2AMessage,
)
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Struct, Value

from agentlog.eventlog.events import Message, MessageAppended, StoredCommit
from agentlog.projections.views import RunView

_TERMINATION_STATE = {
    "natural_end": TaskState.TASK_STATE_COMPLETED,
    "behavior_requested": TaskState.TASK_STATE_COMPLETED,
    "stopped": TaskState.TASK_STATE_COMPLETED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
    "blocked": TaskState.TASK_STATE_FAILED,
    "error": TaskState.TASK_STATE_FAILED,
}

FINAL_STATES = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_CANCELED,
                          TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_INPUT_REQUIRED})


def task_state(view: RunView) -> TaskState:
    if view.status == "running":
        return TaskState.TASK_STATE_WORKING
    if view.status == "waiting":
        return TaskState.TASK_STATE_INPUT_REQUIRED
    return _TERMINATION_STATE.get(view.termination.type if view.termination else "", TaskState.TASK_STATE_FAILED)


def data_part(value: Any) -> Part:
    v = Value()
    ParseDict(value, v)
    return Part(data=v)


def a2a_message(m: Message, task_id: str, context_id: str) -> A2AMessage:
    return A2AMessage(message_id=m.id, task_id=task_id, context_id=context_id,
                      role=Role.ROLE_USER if m.role == "user" else Role.ROLE_AGENT, parts=a2a_parts(m))


def a2a_parts(m: Message) -> list[Part]:
    """A message's A2A parts: its text, or each part (an image/file as `raw` bytes, or `url`)."""
    if not m.parts:
        return [Part(text=m.content)]
    out: list[Part] = []
    for p in m.parts:
        if p.type == "text":
            out.append(Part(text=p.text))
            continue
        part = Part(raw=base64.b64decode(p.data)) if p.data is not None else Part(url=p.url or "")
        if p.media_type:
            part.media_type = p.media_type
        if p.filename:
            part.filename = p.filename
        out.append(part)
    return out


def _run_messages(view: RunView, commits: Sequence[StoredCommit]) -> list[Message]:
    return [e.message for sc in commits if sc.commit.run_id == view.run_id for e in sc.commit.events
            if type(e) is MessageAppended and e.message.role in ("user", "assistant") and e.message.content]


def _requested(commits: Sequence[StoredCommit]) -> dict[str, Any]:
    """call id -> the model's requested call (a call suspended by its gate has no start event)."""
    return {c.id: c for sc in commits for e in sc.commit.events
            if type(e) is MessageAppended for c in e.message.tool_calls or ()}


def status_message(view: RunView, commits: Sequence[StoredCommit] = ()) -> A2AMessage | None:
    """For input-required: what the run waits for (the data a decision needs: each suspended
    call and its ticket, whose `response_schema` the result of a `resume` must validate against)."""
    if view.status != "waiting":
        if view.termination is not None and view.termination.detail and view.termination.type != "natural_end":
            return A2AMessage(message_id=f"{view.run_id}-status", task_id=view.run_id, context_id=view.thread_id,
                              role=Role.ROLE_AGENT, parts=[Part(text=view.termination.detail)])
        return None
    requested = _requested(commits)

    def name(c: Any) -> str | None:
        return c.name or (requested[c.call_id].name if c.call_id in requested else None)

    def args(c: Any) -> Any:
        return c.arguments or (requested[c.call_id].arguments if c.call_id in requested else {})

    calls = [{"call_id": c.call_id, "tool": name(c), "arguments": args(c),
              "ticket": None if c.ticket is None else {"id": c.ticket.id, "action": c.ticket.action,
                                                       "message": c.ticket.message,
                                                       "response_schema": c.ticket.response_schema}}
             for c in view.calls.values() if c.status == "suspended"]
    text = "waiting for a decision on: " + ", ".join(f"{c['tool']} ({c['call_id']})" for c in calls)
    return A2AMessage(message_id=f"{view.run_id}-waiting-{view.last_seq}", task_id=view.run_id,
                      context_id=view.thread_id, role=Role.ROLE_AGENT,
                      parts=[Part(text=text), data_part({"suspended": calls})])


def answer_artifact(view: RunView, commits: Sequence[StoredCommit]) -> Artifact | None:
    answers = [m for m in _run_messages(view, commits) if m.role == "assistant"]
    if not view.finished or not answers:
        return None
    return Artifact(artifact_id=f"{view.run_id}-answer", name="answer", parts=[Part(text=answers[-1].content)])


def run_task(view: RunView, commits: Sequence[StoredCommit], history_length: int | None = None) -> Task:
    """The A2A task of a run (its view and its commits)."""
    history = [a2a_message(m, view.run_id, view.thread_id) for m in _run_messages(view, commits)]
    if history_length is not None:
        history = history[-history_length:] if history_length > 0 else []
    status = TaskStatus(state=task_state(view))
    msg = status_message(view, commits)
    if msg is not None:
        status.message.CopyFrom(msg)
    status.timestamp.FromMilliseconds(view.updated or view.created)
    task = Task(id=view.run_id, context_id=view.thread_id, status=status, history=history)
    artifact = answer_artifact(view, commits)
    if artifact is not None:
        task.artifacts.append(artifact)
    meta = Struct()
    meta.update({"agent_id": view.agent_id or "", "run_status": view.status})
    task.metadata.CopyFrom(meta)
    return task


def message_inputs(message: A2AMessage) -> tuple[str, list[dict[str, Any]]]:
    """(text, decisions) of an incoming A2A message: its text parts joined, and the decisions
    its data parts carry (`{"decisions": [...]}` or one decision `{"target_id", "action", ...}`)."""
    content, decisions = message_content(message)
    if isinstance(content, str):
        return content, decisions
    return "\n".join(p["text"] for p in content if p["type"] == "text" and p["text"]), decisions


def message_content(message: A2AMessage) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """(content, decisions) of an incoming A2A message: its text parts joined (a string), or,
    when it carries files (`raw` bytes or a `url`, with `media_type` / `filename`), agentlog
    content parts (an image when the media type says so); and the decisions its data parts
    carry (`{"decisions": [...]}` or one decision `{"target_id", "action", ...}`)."""
    from google.protobuf.json_format import MessageToDict

    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
            parts.append({"type": "text", "text": part.text})
        elif kind in ("raw", "url"):
            media = part.media_type or None
            out: dict[str, Any] = {"type": "image" if (media or "").startswith("image/") else "file"}
            if kind == "raw":
                out.update(data=base64.b64encode(part.raw).decode(), media_type=media or "application/octet-stream")
            else:
                out["url"] = part.url
                if media:
                    out["media_type"] = media
            if part.filename and out["type"] == "file":
                out["filename"] = part.filename
            parts.append(out)
        elif kind == "data":
            data = MessageToDict(part.data)
            if isinstance(data, dict) and isinstance(data.get("decisions"), list):
                decisions.extend(data["decisions"])
            elif isinstance(data, dict) and "target_id" in data:
                decisions.append(data)
    if all(p["type"] == "text" for p in parts):
        return "\n".join(t for t in texts if t), decisions
    return parts, decisions
