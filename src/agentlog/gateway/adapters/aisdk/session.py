"""The AI SDK session: one `useChat` request -> the run it starts, decides, queues into or
regenerates (a fork: `regenerate`) -> UI message stream parts, and a run's message replayed from
the log (`replay`, the resume-stream endpoint) (`agentlog.gateway.adapters.session` for the order
of every session). Served by `routes` (HTTP) and `nats_routes` (NATS)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from agentlog.eventlog.events import (
    AgentHandedOff,
    Message,
    MessageAppended,
    RunResumed,
    RunSuspended,
)
from agentlog.eventlog.ids import new_id
from agentlog.eventlog.store import EventStore
from agentlog.gateway.adapters.aisdk import regenerate
from agentlog.gateway.adapters.aisdk import translator as aisdk
from agentlog.gateway.adapters.common import (
    AdapterInputError,
    ResumeError,
    error_text,
    handoff_value,
    needs_approval,
    part_url,
    reasoning_text,
)
from agentlog.gateway.adapters.session import (
    Action,
    Backend,
    NotVisible,
    ThreadLog,
    drive,
    load_thread,
    run_commits,
)
from agentlog.gateway.operations.auth import Principal
from agentlog.projections.views import RunView
from agentlog.runtime import CommittedEvent, RunRequest
from agentlog.runtime.inputs import as_run_input


async def chat_branch(store: EventStore, chat: ThreadLog, who: Principal | None = None) -> ThreadLog:
    """The thread that carries a chat now: the chat's own, or the fork its last AI SDK
    regeneration made (`agentlog.gateway.adapters.aisdk.regenerate`)."""
    fork = regenerate.branch_of(chat.view.metadata if chat.view is not None else None)
    return chat if fork is None else await load_thread(store, fork, who)


async def events(backend: Backend, agent_id: str, req: aisdk.AiSdkRequest, who: Any = None,
                       ) -> AsyncGenerator[dict[str, Any], None]:
    """A parsed `useChat` request -> UI message stream parts (without the `[DONE]` frame)."""
    chat = await load_thread(backend.store, req.thread_id, who)
    thread = await chat_branch(backend.store, chat, who)
    waiting = thread.waiting
    messages = [req.message] if req.message is not None else []
    action: Action
    try:
        if req.trigger == "regenerate-message":
            # overrides first: a refused request must not leave a fork behind
            backend.dispatcher.check(RunRequest(agent_id=agent_id, run_input=as_run_input(req.run_input)))
            # a fork before the answer, which now carries the chat (`agentlog.gateway.adapters.aisdk.regenerate`)
            fork = await regenerate.fork_for_regenerate(
                backend.store, chat.thread_id, chat.version, thread.thread_id, thread.commits,
                thread.last_run.run_id if thread.last_run is not None else None, req.message_id or "")
            thread = await load_thread(backend.store, fork, who)
            messages = []
        open_ids = [c.call_id for c in waiting.calls.values() if c.status == "suspended"] if waiting else []
        outputs = [d for d in req.tool_outputs if d["target_id"] in open_ids]
        if waiting is not None and (req.decisions or outputs) and not messages:
            decisions = aisdk.check_approvals(req, open_ids) + outputs
            run_id, after, action = waiting.run_id, thread.version, ("decide", decisions)
        elif (req.decisions or req.tool_outputs) and not messages:
            recorded = thread.decision_ids()
            answers = req.decisions + [d for d in req.tool_outputs if d["decision_id"] in recorded]
            seen = thread.decision_commit({d["decision_id"] for d in answers})
            if seen is None:
                aisdk.check_approvals(req, [])  # raises UnknownInterrupt
                raise AdapterInputError("no open tool approval to answer", "messages")
            run_id, after, action = seen[0], seen[1] - 1, ("replay", None)
        elif req.mode is not None and messages and thread.last_run is not None \
                and thread.last_run.status == "running":
            # queued on the running run (body `agentlog.mode`): this stream carries its rest
            run_id, after, action = thread.last_run.run_id, thread.version, ("queue", req.mode)
        else:
            parent = thread.last_run.run_id if thread.last_run is not None else None
            run_id, after = req.run_id or new_id(), thread.version
            action = ("start", parent)
    except (ResumeError, AdapterInputError) as exc:
        tr0 = aisdk.AiSdkTranslator(req.thread_id, req.run_id or req.thread_id)
        for p in tr0.finish(exc):
            yield p
        return
    # a resumed turn continues the assistant message the client already shows (the run's id)
    tr = aisdk.AiSdkTranslator(req.thread_id, run_id)
    if action[0] == "decide":
        tr.expect_results(d["target_id"] for d in action[1])
    async for p in drive(backend, tr, thread, agent_id, messages, run_id, after, action, who,
                          run_input=req.run_input if action[0] == "start" else None):
        yield p


async def replay(backend: Backend, run_id: str, who: Any = None) -> AsyncGenerator[dict[str, Any], None]:
    """The run's whole assistant message replayed from the log, following it live if it is
    still going: the AI SDK resume-stream endpoint."""
    from agentlog.runtime import RunNotFound

    # Unknown, deleted-thread and other-tenant runs get one and the same answer (the 404 of
    # `GET /v1/runs/{id}`): naming the run's thread here would tell another tenant its id.
    unknown = RunNotFound(f"run {run_id!r} not found")
    commits = await run_commits(backend.store, run_id)
    if not commits:
        raise unknown
    thread_id = commits[0].commit.thread_id
    try:
        await load_thread(backend.store, thread_id, who)  # tenant check
    except NotVisible:
        raise unknown from None
    # the whole assistant message (one per run): the client's resume-stream replaces the message
    # it shows with what this stream builds. What came before the last resume
    # is fed from the log without its intermediate stops; the rest is followed (live if running).
    resumed = [sc.seq for sc in commits if any(type(e) is RunResumed for e in sc.commit.events)]
    tr = aisdk.AiSdkTranslator(thread_id, run_id)
    tr.approved_later(aisdk.acted_on_approvals(e for sc in commits for e in sc.commit.events))
    head: list[dict[str, Any]] = []
    if resumed:
        for sc in commits:
            if sc.seq >= resumed[-1]:
                break
            for position, event in sc.positioned():
                if type(event) is not RunSuspended:
                    head += tr.feed(CommittedEvent(position, event, sc.commit.ts))
    after = (resumed[-1] if resumed else commits[0].seq) - 1
    for p in head:
        yield p
    thread = ThreadLog(thread_id, [], None, {})
    async for p in drive(backend, tr, thread, "", [], run_id, after, ("replay", None), who):
        yield p


def history(thread: ThreadLog) -> list[dict[str, Any]]:
    """The thread as AI SDK UI messages: user messages as they were sent, one assistant message
    per run (id = run id, as the stream's `start.messageId`) with reasoning, text and tool parts
    (and a `data-agentlog-handoff` part where the run handed off)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for sc in thread.commits:
        run = thread.runs.get(sc.commit.run_id or "")
        for e in sc.commit.events:
            if type(e) is AgentHandedOff and current is not None and run is not None and current["id"] == run.run_id:
                # the stream's part, kept in the message: the history shows it where it was
                current["parts"].append({"type": "data-agentlog-handoff", "data": handoff_value(e)})
                continue
            if type(e) is not MessageAppended or e.message.visibility != "all":
                continue
            m = e.message
            if m.role == "user":
                current = None
                out.append({"id": m.id, "role": "user", "parts": user_parts(m)})
            elif m.role == "assistant" and run is not None:
                if current is None or current["id"] != run.run_id:
                    current = {"id": run.run_id, "role": "assistant", "parts": []}
                    out.append(current)
                current["parts"].append({"type": "step-start"})
                if reasoning_text(m):
                    current["parts"].append({"type": "reasoning", "text": reasoning_text(m), "state": "done"})
                if m.content:
                    current["parts"].append({"type": "text", "text": m.content, "state": "done"})
                for c in m.tool_calls or ():
                    current["parts"].append(_tool_part(c.id, c.name, c.arguments, run))
    return out


def user_parts(m: Message) -> list[dict[str, Any]]:
    """A user message's UI parts: text, and `file` parts (`data:` URLs) for images and files."""
    if not m.parts:
        return [{"type": "text", "text": m.content}]
    out: list[dict[str, Any]] = []
    for p in m.parts:
        if p.type == "text":
            out.append({"type": "text", "text": p.text})
        else:
            part = {"type": "file", "mediaType": p.media_type or "application/octet-stream", "url": part_url(p)}
            out.append({**part, "filename": p.filename} if p.filename else part)
    return out


def _tool_part(call_id: str, name: str, arguments: Any, run: RunView) -> dict[str, Any]:
    """One tool part as the client ends up with it (and `validateUIMessages` accepts): a call a
    human approved or denied keeps its `approval{id, approved, reason?}`; a denial (the human's
    or the permission gate's) is `output-denied`, not an error."""
    call = run.calls.get(call_id)
    part: dict[str, Any] = {"type": f"tool-{name}", "toolCallId": call_id, "input": arguments}
    if call is None:
        return part | {"state": "input-available"}
    asked = call.ticket is not None and needs_approval(call.ticket)
    decision = call.decision if asked else None
    approval: dict[str, Any] | None = None
    if decision is not None:
        approval = {"id": call_id, "approved": decision.action == "resume"}
        if decision.reason:
            approval["reason"] = decision.reason
    denied = call.verdict == "deny" or (decision is not None and decision.action == "cancel")
    if denied and call.status in ("failed", "cancelled"):
        part.update(state="output-denied", approval=approval or {"id": call_id, "approved": False})
    elif call.status == "succeeded":
        part.update(state="output-available", output=call.result)
    elif call.status in ("failed", "cancelled"):
        err = call.result.get("error") if isinstance(call.result, dict) else None
        part.update(state="output-error", errorText=err if isinstance(err, str) else f"tool call {call.status}")
    elif call.status == "suspended" and asked:
        part.update(state="approval-requested", approval={"id": call_id})
    else:
        part.update(state="input-available")
    if approval is not None and part["state"] != "output-denied":
        part["approval"] = approval
    return part


def error_part(exc: BaseException) -> dict[str, Any]:
    return {"type": "error", "errorText": error_text(exc)}


__all__ = ["chat_branch", "error_part", "events", "history", "replay", "user_parts"]
