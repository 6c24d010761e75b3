"""The AG-UI session: one `RunAgentInput` -> the run it starts, decides, queues into or
reconnects to -> AG-UI events (`agentlog.gateway.adapters.session` for the order of every
session). Served by `routes` (HTTP) and `nats_routes` (NATS), and used by the MCP and ACP
adapters."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ag_ui import core as ag

from agentlog.eventlog.events import RunFinished
from agentlog.gateway.adapters.agui import translator as agui
from agentlog.gateway.adapters.common import (
    AdapterInputError,
    Decision,
    MissingToolResult,
    ResumeError,
    decision_id,
    error_text,
    is_frontend_ticket,
    queue_mode,
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
from agentlog.gateway.operations.json_input import InvalidJson, parse_json
from agentlog.projections.views import RunView
from agentlog.runtime.inputs import PlaceholderIds, as_messages


def parse(body: Any) -> agui.AguiRunRequest:
    """Step 1 (raises `AdapterInputError`)."""
    return agui.parse_run_input(body)


def _tool_result_decisions(req: agui.AguiRunRequest, open_ids: set[str]) -> list[Decision]:
    """Frontend tool results sent as `role: tool` messages -> decisions on their open calls
    (the result is the JSON the content holds, or the text)."""
    out: list[Decision] = []
    for r in req.tool_results:
        call_id = r.get("tool_call_id")
        if call_id not in open_ids:
            continue
        content = r.get("content")
        try:  # the request decoder's rules (no lone surrogates, bounded nesting), else the text
            value: Any = parse_json(content) if isinstance(content, str) else content
        except InvalidJson:
            value = content
        out.append(Decision(target_id=call_id, action="cancel" if r.get("error") else "resume",
                            decision_id=decision_id(req.thread_id, call_id, "tool", content),
                            result=value))
    return out


def _check_tool_results(waiting: RunView, decisions: list[Decision]) -> None:
    """A run that waits only on frontend tool calls ended its AG-UI run with
    `pendingToolCallIds`, not interrupts: a request that does not answer them is refused
    naming those calls and the `role: tool` answer they need (`MissingToolResult`)."""
    answered = {d["target_id"] for d in decisions}
    pending = sorted(c.call_id for c in waiting.calls.values()
                     if c.status == "suspended" and is_frontend_ticket(c.ticket) and c.call_id not in answered)
    if pending:
        raise MissingToolResult(
            f"the run waits for the client's result of frontend tool call(s) {', '.join(pending)} "
            "(pendingToolCallIds): send each as a role: tool message with its toolCallId before new input",
            pending)


async def events(backend: Backend, agent_id: str, req: agui.AguiRunRequest, who: Any = None,
                      ) -> AsyncGenerator[Any, None]:
    """Steps 2-4 for a parsed `RunAgentInput`: yields `ag_ui.core` events, ending with
    RUN_FINISHED (success or interrupt outcome) or RUN_ERROR."""
    thread = await load_thread(backend.store, req.thread_id, who)
    known = {m.id for m in thread.messages}
    req = agui.parse_run_input(req.input.model_dump(mode="json", by_alias=True, exclude_none=True),
                               known_ids=known)
    tr = agui.AguiTranslator(req.thread_id, req.run_id, state=thread.state, messages=thread.messages,
                             parent_run_id=req.parent_run_id, input=req.input)
    waiting = thread.waiting
    action: Action
    try:
        if waiting is not None:
            open_ids = {c.call_id for c in waiting.calls.values() if c.status == "suspended"}
            decisions = list(req.decisions) + [
                d for d in _tool_result_decisions(req, open_ids)
                if d["target_id"] not in {x["target_id"] for x in req.decisions}]
            _check_tool_results(waiting, decisions)
            agui.check_resume(decisions, sorted(open_ids))
            if req.messages:
                raise AdapterInputError("send new messages after the resumed run has finished "
                                        "(a resume request carries only resume[] / tool results)", "messages")
            run_id, after, action = waiting.run_id, thread.version, ("decide", decisions)
        elif req.decisions:
            ids = {d["decision_id"] for d in req.decisions}
            seen = thread.decision_commit(ids)
            if seen is None:
                agui.check_resume(req.decisions, [])  # raises UnknownInterrupt
                raise AdapterInputError("no open interrupt to resume", "resume")
            run_id, after, action = seen[0], seen[1] - 1, ("replay", None)
            # a retried resume replays from the decision: its snapshot is the state THEN, or the
            # client applies the replayed deltas twice
            state, messages = thread.as_of(after)
            tr = agui.AguiTranslator(req.thread_id, req.run_id, state=state, messages=messages,
                                     parent_run_id=req.parent_run_id, input=req.input)
        else:
            if not req.messages:
                raise AdapterInputError("no new user message to run on", "messages")
            mode = queue_mode(req.forwarded_props, "forwardedProps")
            running = thread.last_run if thread.last_run is not None and thread.last_run.status == "running" else None
            if mode is not None and running is not None:
                # queued on the running run, whose rest this stream then carries (as `connect`
                # does): the snapshot holds the new message already, so it is not sent twice
                run_id, after, action = running.run_id, thread.version, ("queue", mode)
                tr = agui.AguiTranslator(req.thread_id, running.run_id, state=thread.state,
                                         messages=[*thread.messages, *as_messages(req.messages, PlaceholderIds())],
                                         parent_run_id=running.parent_run_id, input=req.input)
            else:
                parent = req.parent_run_id if req.parent_run_id in thread.runs else (
                    thread.last_run.run_id if thread.last_run is not None else None)
                run_id, after, action = req.run_id, thread.version, ("start", parent)
                tr.parent_run_id = parent
    except (ResumeError, AdapterInputError) as exc:  # RUN_STARTED + RUN_ERROR, nothing written
        bare = agui.AguiTranslator(req.thread_id, req.run_id, parent_run_id=req.parent_run_id, input=req.input)
        for ev in bare.finish(exc, code=exc.code):
            yield ev
        return
    # A new run records the request's tools as its frontend tools (resume requests carry them
    # too, but the waiting run has its own in its RunStarted: they are not needed there).
    frontend = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in req.tools]
    if action[0] == "queue":
        for ev in tr.reconnect():
            yield ev
    async for ev in drive(backend, tr, thread, agent_id, req.messages, run_id, after, action, who,
                           frontend_tools=frontend, run_input=req.run_input):
        yield ev


async def connect(backend: Backend, agent_id: str, req: agui.AguiRunRequest, who: Any = None,
                       ) -> AsyncGenerator[Any, None]:
    """A client reconnecting to the thread's run (AG-UI `connect`): RUN_STARTED, the state and
    messages as of the log's position now, then the rest of the run from that position (live
    deltas included), so the client ends with the run's messages once each. A run that is no
    longer going ends at once, as its stream did (finished, or waiting with its interrupts)."""
    thread = await load_thread(backend.store, req.thread_id, who)
    run = thread.last_run
    if thread.view is None or run is None:
        raise NotVisible(f"thread {req.thread_id!r} has no run to connect to")
    tr = agui.AguiTranslator(req.thread_id, run.run_id, state=thread.state, messages=thread.messages,
                             parent_run_id=run.parent_run_id, input=req.input)
    for ev in tr.reconnect():
        yield ev
    if run.status == "waiting":
        for ev in tr.feed_suspended(run):
            yield ev
        return
    if run.finished:
        commits = await run_commits(backend.store, run.run_id)
        finished = [e for sc in commits for e in sc.commit.events if isinstance(e, RunFinished)]
        for ev in tr.feed(finished[-1]) if finished else tr.finish():
            yield ev
        return
    async for ev in drive(backend, tr, thread, agent_id, [], run.run_id, thread.version, ("replay", None), who):
        yield ev


def history(thread: ThreadLog) -> list[dict[str, Any]]:
    """The thread's conversation as AG-UI messages (wire dicts)."""
    return [m.model_dump(mode="json", by_alias=True, exclude_none=True)
            for m in agui.to_agui_messages(thread.messages)]


def error_event(exc: BaseException) -> ag.RunErrorEvent:
    """The event that ends a refused or failed stream (`common.guarded`)."""
    code = getattr(exc, "code", None)
    return ag.RunErrorEvent(message=error_text(exc), code=code if isinstance(code, str) else "internal_error")


__all__ = ["connect", "error_event", "events", "history", "parse"]
