"""Transport-neutral protocol sessions: one AG-UI or AI SDK request -> the run it starts, decides
or replays -> the protocol events of that run. HTTP (`routes`) and NATS (`nats_routes`) only
encode and deliver what these generators yield, so both transports behave identically.

The order of every session, and why:
1. parse the body (`AdapterInputError` before anything else: the transport answers 400 / one
   error event);
2. fold the thread from the log (exact, not the lagging views) and decide what the request is:
   a new run (continuation of the thread's last run), decisions for the thread's waiting run,
   or a retried resume whose decisions are already recorded (idempotent: replay, write nothing);
3. check resume entries / approvals against the open interrupts BEFORE writing; a mismatch ends
   the stream with an error and nothing is written;
4. subscribe to the run's live subject, note the thread's last seq, then start/decide through
   the `Dispatcher`, then follow the log from that seq (`source.RunSource`) until the run
   finishes or suspends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ag_ui import core as ag
from nats.aio.client import Client as NATS

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import (
    AgentHandedOff,
    Message,
    MessageAppended,
    Position,
    RunFinished,
    RunResumed,
    RunSuspended,
    StoredCommit,
    ToolCallDecided,
)
from agentlog.eventlog.ids import new_id
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.store import EventStore
from agentlog.gateway.adapters import agui, aisdk, regenerate
from agentlog.gateway.adapters.common import (
    AdapterInputError,
    Decision,
    MissingToolResult,
    ResumeError,
    decision_id,
    error_text,
    handoff_value,
    is_frontend_ticket,
    needs_approval,
    part_url,
    queue_mode,
    reasoning_text,
)
from agentlog.gateway.adapters.source import RunSource
from agentlog.gateway.operations.auth import Principal
from agentlog.gateway.operations.dispatch import Dispatcher
from agentlog.gateway.operations.json_input import InvalidJson, parse_json
from agentlog.projections.fold import fold_commits
from agentlog.projections.timetravel import messages_at, state_at
from agentlog.projections.views import RunView, ThreadView
from agentlog.runtime import CommittedEvent, RunRequest
from agentlog.runtime.inputs import OverrideNotAllowed, PlaceholderIds, as_messages, as_run_input


class NotVisible(AgentlogError, LookupError):
    """The thread exists but belongs to another tenant (answered like an unknown thread)."""

    code = "thread_not_found"


@dataclass
class Backend:
    """What a session needs: the log (`store`), a `agentlog.gateway.operations.dispatch.Dispatcher`, and the NATS
    connection for live deltas (None: no live deltas, text comes from the commits)."""

    store: JetStreamEventStore
    dispatcher: Dispatcher
    nc: NATS | None = None


def backend_of(store: JetStreamEventStore, dispatcher: Dispatcher | None) -> Backend:
    """A Backend from what the HTTP app holds in `services(request).dispatcher`; an error on a
    read-only gateway (no dispatcher)."""
    if dispatcher is None:
        raise AgentlogError("this gateway has no runtime (read-only): adapter runs are not available")
    return Backend(store=store, dispatcher=dispatcher, nc=store.nc)


# -- the thread, from the log --------------------------------------------------------------------


@dataclass
class ThreadLog:
    thread_id: str
    commits: list[StoredCommit]
    view: ThreadView | None
    runs: dict[str, RunView]

    @property
    def version(self) -> int:
        return self.commits[-1].seq if self.commits else 0

    @property
    def messages(self) -> list[Message]:
        return [e.message for sc in self.commits for e in sc.commit.events if type(e) is MessageAppended]

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.view.state) if self.view is not None else {}

    @property
    def last_run(self) -> RunView | None:
        if self.view is None or not self.view.run_ids:
            return None
        return self.runs.get(self.view.run_ids[-1])

    @property
    def waiting(self) -> RunView | None:
        run = self.last_run
        return run if run is not None and run.status == "waiting" else None

    def as_of(self, seq: int) -> tuple[dict[str, Any], list[Message]]:
        """The thread's state and messages as of seq `seq` (a fold of the commits up to it):
        what a replay from `seq` must start from, not the state after everything since."""
        end = Position(seq, 2**31)  # all events of the commit at `seq`, none after
        return dict(state_at(self.commits, self.thread_id, end)), messages_at(self.commits, self.thread_id, end)

    def decision_ids(self) -> set[str]:
        """Every decision id recorded on the thread (retried answers are recognised by these)."""
        return {e.decision.decision_id for sc in self.commits for e in sc.commit.events
                if type(e) is ToolCallDecided}

    def decision_commit(self, ids: set[str]) -> tuple[str, int] | None:
        """(run, seq) of the commit that recorded all of `ids` (a retried answer), else None."""
        found: dict[str, tuple[str, int]] = {}
        for sc in self.commits:
            for e in sc.commit.events:
                if type(e) is ToolCallDecided and e.decision.decision_id in ids:
                    found.setdefault(e.decision.decision_id, (sc.commit.run_id or "", sc.seq))
        if not ids or set(found) != ids:
            return None
        runs = {r for r, _ in found.values()}
        return (runs.pop(), min(s for _, s in found.values())) if len(runs) == 1 else None


async def load_thread(store: EventStore, thread_id: str, who: Principal | None = None) -> ThreadLog:
    commits = [sc async for sc in store.read_thread(thread_id)]
    views = fold_commits(commits) if commits else None
    view = views.threads.get(thread_id) if views else None
    if view is not None and view.deleted:
        raise NotVisible(f"thread {thread_id!r} not found")
    if view is not None and who is not None and not who.can_see(view.resource_id):
        raise NotVisible(f"thread {thread_id!r} not found")
    runs = {r: v for r, v in views.runs.items() if v.thread_id == thread_id} if views else {}
    return ThreadLog(thread_id, commits, view, runs)


async def chat_branch(store: EventStore, chat: ThreadLog, who: Principal | None = None) -> ThreadLog:
    """The thread that carries a chat now: the chat's own, or the fork its last AI SDK
    regeneration made (`agentlog.gateway.adapters.regenerate`)."""
    fork = regenerate.branch_of(chat.view.metadata if chat.view is not None else None)
    return chat if fork is None else await load_thread(store, fork, who)


async def run_commits(store: EventStore, run_id: str) -> list[StoredCommit]:
    return [sc async for sc in store.read_run(run_id)]


def resumed_now(commits: Sequence[StoredCommit], seq: int) -> bool:
    """Did the decision commit at `seq` resume calls (`RunResumed`), or only record decisions
    (a partial answer in parallel_batch_approval: the run keeps waiting)?"""
    return any(type(e) is RunResumed for sc in commits if sc.seq == seq for e in sc.commit.events)


# -- AG-UI ---------------------------------------------------------------------------------------


def agui_parse(body: Any) -> agui.AguiRunRequest:
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


async def agui_events(backend: Backend, agent_id: str, req: agui.AguiRunRequest, who: Any = None,
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
    async for ev in _drive(backend, tr, thread, agent_id, req.messages, run_id, after, action, who,
                           frontend_tools=frontend, run_input=req.run_input):
        yield ev


async def agui_connect(backend: Backend, agent_id: str, req: agui.AguiRunRequest, who: Any = None,
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
    async for ev in _drive(backend, tr, thread, agent_id, [], run.run_id, thread.version, ("replay", None), who):
        yield ev


#: What `_drive` does: record decisions, nothing (replay a recorded answer's run from the log), or
#: start a run (with this parent run, if any).
Action = (
    tuple[Literal["decide"], list[Decision]]
    | tuple[Literal["replay"], None]
    | tuple[Literal["start"], str | None]
    | tuple[Literal["queue"], str]
)


async def _drive(backend: Backend, tr: Any, thread: ThreadLog, agent_id: str, messages: list[Any],
                 run_id: str, after: int, action: Action, who: Any,
                 frontend_tools: list[dict[str, Any]] | None = None,
                 run_input: dict[str, Any] | None = None) -> AsyncIterator[Any]:
    """Subscribe live, act (start / decide / nothing for a replay), follow, translate.
    `frontend_tools`, `run_input`: recorded with a started run (AG-UI `tools`; overrides,
    context, forwarded props, state). An override the agent does not allow is raised before
    the first event, so the transport answers it as a refused request (HTTP 400), not a stream."""
    src = RunSource(backend.store, backend.nc, thread.thread_id, run_id)
    try:
        await src.subscribe()
        try:
            if action[0] == "start":
                tenant = getattr(who, "tenant", None)
                # a new message while the thread's last run still runs: "stop, then send" (the
                # client stopped its stream; the run went on): one interrupting command
                last = thread.last_run
                interrupt = last is not None and last.run_id == action[1] and last.status == "running"
                await backend.dispatcher.start_run(RunRequest(
                    agent_id=agent_id, messages=messages, thread_id=thread.thread_id, run_id=run_id,
                    parent_run_id=action[1], resource_id=tenant if thread.view is None else None,
                    frontend_tools=frontend_tools or [], run_input=as_run_input(run_input), interrupt=interrupt))
            elif action[0] == "queue":  # steer / follow_up: the running run takes the messages
                await backend.dispatcher.submit_inputs(run_id, messages=messages, mode=action[1])
            elif action[0] == "decide":
                accepted = await backend.dispatcher.submit_inputs(run_id, decisions=action[1])
                if accepted.duplicate:  # a retried answer: replay from where it was recorded,
                    after = accepted.seq - 1  # from the state as of then (see agui_events)
                    if isinstance(tr, agui.AguiTranslator) and not tr.started:
                        tr.state, tr.messages = thread.as_of(after)
                commits = await run_commits(backend.store, run_id)
                if not resumed_now(commits, accepted.seq):
                    # recorded, but the run still waits for the rest (a partial answer)
                    run = fold_commits(commits).runs[run_id]
                    still = [c.call_id for c in run.calls.values() if c.status == "suspended"]
                    for ev in with_position(tr, tr.feed(RunSuspended(call_ids=still)), commits[-1].seq):
                        yield ev
                    return
        except AgentlogError as exc:
            if exc.code == OverrideNotAllowed.code:
                raise
            for ev in tr.finish(exc, **({"code": exc.code} if isinstance(tr, agui.AguiTranslator) else {})):
                yield ev
            return
        src.follow(after)
        try:
            async for item in src.items():
                out = tr.feed(item)
                if tr.done and isinstance(item, CommittedEvent):
                    out = with_position(tr, out, item.position.seq)
                for ev in out:
                    yield ev
                if tr.done:
                    return
        except AgentlogError as exc:
            for ev in tr.finish(exc):
                yield ev
            return
        for ev in tr.finish():
            yield ev
    finally:
        await src.close()


#: The name of the AG-UI CUSTOM event / the type of the AI SDK data part that carries the log
#: position a stream ended at (see `with_position`).
POSITION = "agentlog.position"
AISDK_POSITION = "data-agentlog-position"


def with_position(tr: Any, out: list[Any], seq: int) -> list[Any]:
    """`out` (a translator's last events) with the log position the stream ended at just before
    the terminal event: an AG-UI CUSTOM `agentlog.position` / a transient AI SDK
    `data-agentlog-position` part, `{"seq": seq}`. A client passes it as `min_seq` to read its
    run's effects where the read cannot know the thread (listings); the official clients ignore
    both (CUSTOM goes to subscribers, a transient part is not kept in the message)."""
    if isinstance(tr, agui.AguiTranslator):
        at = next((i for i, ev in enumerate(out) if isinstance(ev, (ag.RunFinishedEvent, ag.RunErrorEvent))), None)
        event: Any = ag.CustomEvent(name=POSITION, value={"seq": seq})
    else:
        at = next((i for i, p in enumerate(out) if p.get("type") in ("error", "finish", "abort")), None)
        event = {"type": AISDK_POSITION, "transient": True, "data": {"seq": seq}}
    return out if at is None else [*out[:at], event, *out[at:]]


def agui_history(thread: ThreadLog) -> list[dict[str, Any]]:
    """The thread's conversation as AG-UI messages (wire dicts)."""
    return [m.model_dump(mode="json", by_alias=True, exclude_none=True)
            for m in agui.to_agui_messages(thread.messages)]


def agui_error_event(exc: BaseException) -> ag.RunErrorEvent:
    """The event that ends a refused or failed stream (`common.guarded`)."""
    code = getattr(exc, "code", None)
    return ag.RunErrorEvent(message=error_text(exc), code=code if isinstance(code, str) else "internal_error")


# -- AI SDK --------------------------------------------------------------------------------------


async def aisdk_events(backend: Backend, agent_id: str, req: aisdk.AiSdkRequest, who: Any = None,
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
            # a fork before the answer, which now carries the chat (`agentlog.gateway.adapters.regenerate`)
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
    async for p in _drive(backend, tr, thread, agent_id, messages, run_id, after, action, who,
                          run_input=req.run_input if action[0] == "start" else None):
        yield p


async def aisdk_replay(backend: Backend, run_id: str, who: Any = None) -> AsyncGenerator[dict[str, Any], None]:
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
    async for p in _drive(backend, tr, thread, "", [], run_id, after, ("replay", None), who):
        yield p


def aisdk_history(thread: ThreadLog) -> list[dict[str, Any]]:
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
                out.append({"id": m.id, "role": "user", "parts": aisdk_user_parts(m)})
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


def aisdk_user_parts(m: Message) -> list[dict[str, Any]]:
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


def aisdk_error_part(exc: BaseException) -> dict[str, Any]:
    return {"type": "error", "errorText": error_text(exc)}


__all__ = ["AISDK_POSITION", "POSITION", "Backend", "NotVisible", "ThreadLog", "agui_connect", "agui_error_event",
           "agui_events", "agui_history", "agui_parse", "aisdk_error_part", "aisdk_events", "aisdk_history",
           "aisdk_replay", "backend_of", "chat_branch", "load_thread"]
