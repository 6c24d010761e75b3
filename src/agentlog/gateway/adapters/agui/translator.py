"""AG-UI adapter: canonical run events -> AG-UI events, and `RunAgentInput` -> a run request.

`AguiTranslator` is stateful but pure: `feed()` takes one committed log event (or a live delta
from `agentlog.live.<thread>.<run>`) and returns the AG-UI events it implies; `finish()` closes
the stream when the source ends early. The route only merges its two sources and encodes
(`EventEncoder().encode(ev)`), so one translator serves SSE, NATS replies and stored replays.

Why the shapes are what they are:
* Text streams from live deltas when the route forwards them (low latency); otherwise the
  committed assistant `MessageAppended` is synthesised into START + one CONTENT + END. Live
  deltas carry the id the committed message will have (`message_id`, drawn by the loop at the
  first delta), so live and committed events share one id scheme and the client's reducer
  builds exactly the server's messages; only deltas of an older runtime
  without it fall back to a provisional `<run>-s<step>-text`.
* A streamed text message stays open while the same message's tool calls stream (AG-UI allows
  both at once; TOOL_CALL_START names it as `parentMessageId`): it is closed when its commit
  arrives, after catching up on dropped deltas, and never re-emitted.
* Steps open at the first sign of them (a live delta of step N, or `StepStarted`), because the
  loop commits `StepStarted` with the inference result, after the deltas of that step.
* A call's TOOL_CALL_RESULT comes before the next step's text: the live link outruns the log,
  so the next inference's deltas often arrive before the commit of the results they follow.
  Deltas of a step after one with a call whose result (or suspension) is not committed yet are
  held until it is. Otherwise the result lands inside the next text message, and a client that
  reconnects mid-text keeps the messages in another order than the server.
* A suspended run is an AG-UI interrupt (upstream contract, `RunFinishedInterruptOutcome`):
  STATE_SNAPSHOT, MESSAGES_SNAPSHOT, then RUN_FINISHED with every open interrupt. Interrupt id
  is the call id: it is what a decision targets, and unique on the thread (ticket ids are not).
* A resumed stream (decisions forwarded into a waiting run) starts mid-run: RUN_STARTED is sent
  on the first item whatever it is, and results arrive as TOOL_CALL_RESULT on the original
  toolCallId without START/ARGS/END, as the interrupt contract asks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pydantic
from ag_ui import core as ag

from agentlog.eventlog.events import (
    AgentHandedOff,
    ContentPart,
    Emitted,
    Event,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    RunSuspended,
    StateCleared,
    StatePatched,
    StateReplaced,
    StateWritten,
    StepFinished,
    StepStarted,
    SuspendTicket,
    ToolCallCompleted,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
)
from agentlog.eventlog.ids import is_valid_id
from agentlog.gateway.adapters.common import (
    HANDOFF_EVENT,
    AdapterInputError,
    Decision,
    LiveCalls,
    as_item,
    check_decisions,
    decision_id,
    handoff_value,
    int_or,
    interrupt_reason,
    is_frontend_ticket,
    json_text,
    live_message_id,
    reasoning_id,
    reasoning_text,
    request_overrides,
    safe_id,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.state import apply_ops
from agentlog.runtime.inputs import as_parts
from agentlog.runtime.models import ToolSpec

#: `Content-Type` of the SSE encoding (`ag_ui.encoder.EventEncoder().get_content_type()`).
CONTENT_TYPE = "text/event-stream"
#: ACTIVITY_* type used for live tool progress (Tirea/Awaken `tool-call-progress.v1`).
PROGRESS_ACTIVITY = "tool-call-progress"


def step_name(step: int) -> str:
    return f"step-{step}"


# -- messages ----------------------------------------------------------------------------------


def to_agui_reasoning(m: Message) -> ag.ReasoningMessage | None:
    """An assistant message's shown reasoning as the AG-UI `reasoning` message before it (the
    one `REASONING_MESSAGE_*` builds in the client), or None when it has none."""
    text = reasoning_text(m) if m.role == "assistant" else ""
    return ag.ReasoningMessage(id=reasoning_id(m.id), content=text) if text else None


def to_agui_message(m: Message) -> Any:
    """One log message as an AG-UI message (tool arguments become a JSON-encoded string)."""
    if m.role == "user":
        return ag.UserMessage(id=m.id, content=agui_parts(m.parts) if m.parts else m.content)
    if m.role == "system":
        return ag.SystemMessage(id=m.id, content=m.content)
    if m.role == "tool":
        return ag.ToolMessage(id=m.id, content=m.content, tool_call_id=m.tool_call_id or "")
    calls = [
        ag.ToolCall(id=c.id, function=ag.FunctionCall(name=c.name, arguments=json_text(c.arguments)))
        for c in m.tool_calls or ()
    ]
    return ag.AssistantMessage(
        id=m.id, content=m.content if (m.content or not calls) else None, tool_calls=calls or None,
    )


def agui_parts(parts: Sequence[ContentPart]) -> list[Any]:
    """Message parts as AG-UI 1.0 input content: text, image, and document for a file, with a
    `data` (base64) or `url` source."""
    out: list[Any] = []
    for p in parts:
        if p.type == "text":
            out.append(ag.TextInputContent(text=p.text))
            continue
        source = ({"type": "data", "value": p.data, "mimeType": p.media_type or "application/octet-stream"}
                  if p.data is not None else {"type": "url", "value": p.url or "", "mimeType": p.media_type})
        kind = ag.ImageInputContent if p.type == "image" else ag.DocumentInputContent
        out.append(kind.model_validate({"source": {k: v for k, v in source.items() if v is not None}}))
    return out


def args_rest(arguments: Any, streamed: str) -> str:
    """What completes a tool call's streamed argument text (some of its deltas were dropped):
    the rest of the committed arguments in the first common JSON spelling the streamed text is a
    prefix of (compact; `json.dumps`'s default, which providers stream; sorted). Empty when none
    fits: the snapshot then carries the arguments."""
    for text in (json_text(arguments), json.dumps(arguments),
                 json.dumps(arguments, sort_keys=True, separators=(", ", ": "))):
        if text.startswith(streamed) and len(text) > len(streamed):
            return text[len(streamed):]
    return ""


def to_agui_messages(messages: Iterable[Message]) -> list[Any]:
    """The conversation as AG-UI shows it: internal messages (plugin context) stay hidden; an
    assistant message's reasoning is a `reasoning` message just before it."""
    out: list[Any] = []
    for m in messages:
        if m.visibility != "all":
            continue
        reasoning = to_agui_reasoning(m)
        if reasoning is not None:
            out.append(reasoning)
        out.append(to_agui_message(m))
    return out


# -- what tools and plugins emit ------------------------------------------------------------------


def emitted_events(ev: Emitted) -> list[Any]:
    """An `Emitted` log event as its AG-UI event: CUSTOM, RAW, ACTIVITY_SNAPSHOT (content is an
    object; anything else is wrapped as `{"value": ...}`) or ACTIVITY_DELTA (JSON patch ops; a
    patch AG-UI cannot carry is dropped rather than failing the stream)."""
    if ev.kind == "custom":
        return [ag.CustomEvent(name=ev.name, value=ev.value)]
    if ev.kind == "raw":
        return [ag.RawEvent(event=ev.value, source=ev.name or None)]
    mid = ev.message_id or f"activity-{ev.name}"
    if ev.kind == "activity_snapshot":
        content = ev.value if isinstance(ev.value, dict) else {"value": ev.value}
        return [ag.ActivitySnapshotEvent(message_id=mid, activity_type=ev.name, content=content)]
    try:
        return [ag.ActivityDeltaEvent.model_validate(
            {"message_id": mid, "activity_type": ev.name, "patch": ev.patch or []})]
    except pydantic.ValidationError:
        return []


def handoff_event(ev: AgentHandedOff) -> Any:
    """A handoff as AG-UI `CUSTOM` `agentlog.handoff` (AG-UI has no agent-change event; the
    value names both agents, so a client can follow the thread to the new agent's route)."""
    return ag.CustomEvent(name=HANDOFF_EVENT, value=handoff_value(ev))


# -- interrupts --------------------------------------------------------------------------------


def make_interrupt(
    call_id: str, ticket: SuspendTicket | None, name: str | None = None, arguments: Any = None
) -> ag.Interrupt:
    """A suspended call as an AG-UI interrupt; agentlog details go under metadata `agentlog`
    (the `ag-ui` key is reserved upstream)."""
    meta: dict[str, Any] = {}
    if ticket is not None:
        meta.update(ticketId=ticket.id, action=ticket.action, resumeMode=ticket.resume_mode)
        if ticket.parameters:
            meta["parameters"] = ticket.parameters
    if name is not None:
        meta["toolName"] = name
    if arguments is not None:
        meta["arguments"] = arguments
    return ag.Interrupt(
        id=call_id,
        reason=interrupt_reason(ticket),
        tool_call_id=call_id,
        message=ticket.message if ticket else None,
        response_schema=ticket.response_schema if ticket else None,
        metadata={"agentlog": meta} if meta else None,
    )


def open_interrupts(run: Any) -> list[ag.Interrupt]:
    """The open interrupts of a run view (`agentlog.projections.views.RunView`): its suspended calls,
    except frontend tool calls (pending tool calls the client answers with tool messages)."""
    return [
        make_interrupt(c.call_id, c.ticket, c.name, c.arguments)
        for c in run.calls.values() if c.status == "suspended" and not is_frontend_ticket(c.ticket)
    ]


# -- the translator ----------------------------------------------------------------------------


@dataclass
class _Text:
    message_id: str
    step: int
    text: str = ""


#: The name of the CUSTOM event that carries the log position a stream ended at (`with_position`).
POSITION = "agentlog.position"


class AguiTranslator:
    """Canonical run events (committed or live) -> AG-UI events, for one AG-UI run.

    `thread_id`/`run_id` are the AG-UI ids of the stream (a resume stream has a new AG-UI run id
    while it follows the same agentlog run). `state` and `messages` are the thread's state and
    messages as of the start of what is fed (for snapshots); with `state=None` no initial
    STATE_SNAPSHOT is sent. `echo_user_messages` streams committed user messages too (replays).
    """

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        *,
        state: dict[str, Any] | None = None,
        messages: Sequence[Message] = (),
        parent_run_id: str | None = None,
        input: ag.RunAgentInput | None = None,
        echo_user_messages: bool = False,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self.input = input
        self.echo_user_messages = echo_user_messages
        self.state: dict[str, Any] = copy.deepcopy(state) if state is not None else {}
        self._send_initial_state = state is not None
        self.messages: list[Message] = list(messages)
        self.started = False
        self.done = False
        self._step: int | None = None            # the open step
        self._max_step = 0
        self._text: _Text | None = None          # the open live text message
        self._reasoning: _Text | None = None     # the open live reasoning (id = reasoning id)
        self._streamed: dict[str, str] = {}      # live text message id -> text streamed so far
        self._live_calls = LiveCalls()
        self._calls: dict[str, tuple[str, Any]] = {}          # call id -> (name, arguments)
        self._announced: set[str] = set()        # call ids whose committed message was translated
        # Message and tool call ids the client already holds (the request's `messages`): a
        # retried resume replays a run the client may have seen, and the official client
        # appends a TOOL_CALL_RESULT / TEXT_MESSAGE_CONTENT / TOOL_CALL_ARGS for an id it has
        # (a second tool message under one id, doubled text), which no snapshot repairs.
        self._client_has: set[str] = set()
        for held in (input.messages if input is not None else ()):
            self._client_has.add(held.id)
            self._client_has.update(c.id for c in getattr(held, "tool_calls", None) or ())
        self._ended: set[str] = set()            # text message ids whose TEXT_MESSAGE_END was sent
        self._tickets: dict[str, SuspendTicket] = {}
        self._progress: set[str] = set()
        self._usage = Usage()
        self._models: list[str] = []
        #: Calls whose result (or suspension) is not committed yet -> their step; and calls whose
        #: is. Live deltas of a later step wait in `_held` (see the module doc).
        self._unresolved: dict[str, int] = {}
        self._resolved: set[str] = set()
        self._committed_calls: set[str] = set()
        self._held: list[dict[str, Any]] = []

    # -- public ----------------------------------------------------------------------------------

    def start(self) -> list[Any]:
        """RUN_STARTED (+ STATE_SNAPSHOT of the initial state). Called by `feed` if needed."""
        if self.started:
            return []
        self.started = True
        out: list[Any] = [ag.RunStartedEvent(
            thread_id=self.thread_id, run_id=self.run_id, parent_run_id=self.parent_run_id,
            input=self.input,
        )]
        if self._send_initial_state:
            out.append(ag.StateSnapshotEvent(snapshot=copy.deepcopy(self.state)))
        return out

    def feed(self, item: Any) -> list[Any]:
        """Translate one committed event (`CommittedEvent`, bare event) or live dict."""
        if self.done:
            return []
        it = as_item(item)
        if it.event is not None and type(it.event) is RunStarted and not self.started:
            self.parent_run_id = self.parent_run_id or it.event.parent_run_id
        out = self.start()
        if it.live is not None:
            if self._held or self._blocked(it.live):
                self._held.append(it.live)  # after the results of the step before (module doc)
                return out
            out += self._live(it.live)
        elif it.event is not None:  # as_item gives one of the two
            out += self._event(it.event, it.ts)
            # a completion's result message comes with the next event (same commit): release after it
            if self._held and not self.done and type(it.event) is not ToolCallCompleted:
                out += self._release_held()
        return out

    def _blocked(self, p: dict[str, Any]) -> bool:
        """Is live delta `p` of a step after one whose calls' results are not all committed?"""
        if p.get("type") not in ("text_delta", "reasoning_delta", "tool_call_delta"):
            return False
        step = int_or(p.get("step"), self._max_step)
        return any(s < step for s in self._unresolved.values())

    def _release_held(self) -> list[Any]:
        """The held live deltas that may go now, in their order (the rest stay held)."""
        held, self._held = self._held, []
        out: list[Any] = []
        for p in held:
            if self._held or self._blocked(p):
                self._held.append(p)
            else:
                out += self._live(p)
        return out

    def _unresolve(self, call_id: str, step: int) -> None:
        if call_id not in self._resolved:
            self._unresolved.setdefault(call_id, step)

    def _resolve(self, call_id: str) -> None:
        self._unresolved.pop(call_id, None)
        self._resolved.add(call_id)

    def rewind(self, state: dict[str, Any], messages: list[Message]) -> None:
        """Start from this state and these messages (a retried answer replays from where it was
        recorded: the state then, or the client applies the replayed deltas twice); no-op once
        the snapshot went out."""
        if not self.started:
            self.state, self.messages = state, messages

    def with_position(self, out: list[Any], seq: int) -> list[Any]:
        """`out` with a CUSTOM `agentlog.position` event `{"seq": seq}` before its terminal event:
        the log position the stream ended at, which a client passes as `min_seq` to read its
        run's effects (the official clients give CUSTOM events to subscribers only)."""
        at = next((i for i, ev in enumerate(out) if isinstance(ev, (ag.RunFinishedEvent, ag.RunErrorEvent))), None)
        event = ag.CustomEvent(name=POSITION, value={"seq": seq})
        return out if at is None else [*out[:at], event, *out[at:]]

    def finish(self, error: BaseException | str | None = None, code: str | None = None) -> list[Any]:
        """Close the stream when the source ended without a terminal event (or failed):
        everything open is closed and RUN_ERROR says why. No-op after a terminal event."""
        if self.done:
            return []
        out = self.start() + self._close_all()
        if error is None:
            message, code = "the run's event stream ended before the run finished", code or "incomplete"
        elif isinstance(error, BaseException):
            message = str(error) or type(error).__name__
            code = code or getattr(error, "code", None) or type(error).__name__
        else:
            message = error
        self.done = True
        return out + [ag.RunErrorEvent(message=message, code=code)]

    # -- live ------------------------------------------------------------------------------------

    def _live(self, p: dict[str, Any]) -> list[Any]:
        kind = p.get("type")
        out: list[Any] = []
        if kind in ("text_delta", "tool_call_delta"):
            out += self._close_reasoning()  # the model answers: its reasoning is over
        if kind == "reasoning_delta":
            out += self._live_reasoning(p)
        elif kind == "text_delta":
            step = int_or(p.get("step"), self._max_step)
            text = p.get("text")
            if not isinstance(text, str) or not text:
                return []
            mid = live_message_id(p, self.run_id, step)
            if mid in self._ended or mid in self._client_has:
                return []  # a message is started once; the commit and the snapshot carry the rest
            out += self._open_step(step)
            if self._text is None or self._text.message_id != mid:
                out += self._close_text()
                self._text = _Text(mid, step, self._streamed.get(mid, ""))
                out.append(ag.TextMessageStartEvent(message_id=mid, role="assistant"))
            self._text.text += text
            self._streamed[mid] = self._text.text
            out.append(ag.TextMessageContentEvent(message_id=mid, delta=text))
        elif kind == "tool_call_delta":
            step = int_or(p.get("step"), self._max_step)
            out += self._open_step(step)
            # seen otherwise: its commit was translated, or the client holds it
            d = self._live_calls.feed(p, step, lambda c: c in self._announced or c in self._client_has)
            if d is None:
                return out
            if d.started:
                self._unresolve(d.call.call_id, step)
                out.append(ag.ToolCallStartEvent(tool_call_id=d.call.call_id, tool_call_name=d.call.name,
                                                 parent_message_id=live_message_id(p, self.run_id, step)))
            if d.args:
                out.append(ag.ToolCallArgsEvent(tool_call_id=d.call.call_id, delta=d.args))
        elif kind == "tool_progress":
            call_id = p.get("call_id")
            if isinstance(call_id, str):
                self._progress.add(call_id)
                out.append(self._activity(call_id, "running", p.get("data")))
        return out

    def _live_reasoning(self, p: dict[str, Any]) -> list[Any]:
        """A reasoning delta: opens the message's reasoning (REASONING_START + a `reasoning`
        message) once, then streams its content; the commit closes it or catches it up."""
        step = int_or(p.get("step"), self._max_step)
        text = p.get("text")
        if not isinstance(text, str) or not text:
            return []
        mid = live_message_id(p, self.run_id, step)
        rid = reasoning_id(mid)
        if rid in self._ended or mid in self._client_has or rid in self._client_has:
            return []
        out = self._open_step(step)
        if self._reasoning is None or self._reasoning.message_id != rid:
            out += self._close_reasoning() + self._close_text()
            self._reasoning = _Text(rid, step, self._streamed.get(rid, ""))
            out += [ag.ReasoningStartEvent(message_id=rid),
                    ag.ReasoningMessageStartEvent(message_id=rid, role="reasoning")]
        self._reasoning.text += text
        self._streamed[rid] = self._reasoning.text
        out.append(ag.ReasoningMessageContentEvent(message_id=rid, delta=text))
        return out

    def _committed_reasoning(self, m: Message) -> list[Any]:
        """The reasoning of a committed assistant message, given what was streamed live: the
        open reasoning gets the rest and is closed; one never streamed is synthesised; one
        already closed is never started again."""
        text, rid = reasoning_text(m), reasoning_id(m.id)
        if self._reasoning is not None and self._reasoning.message_id == rid:
            streamed = self._reasoning.text
            out: list[Any] = []
            if text.startswith(streamed) and len(text) > len(streamed):
                out.append(ag.ReasoningMessageContentEvent(message_id=rid, delta=text[len(streamed):]))
            return out + self._close_reasoning()
        if not text or rid in self._ended or rid in self._client_has:
            return []
        self._ended.add(rid)
        return [ag.ReasoningStartEvent(message_id=rid),
                ag.ReasoningMessageStartEvent(message_id=rid, role="reasoning"),
                ag.ReasoningMessageContentEvent(message_id=rid, delta=text),
                ag.ReasoningMessageEndEvent(message_id=rid),
                ag.ReasoningEndEvent(message_id=rid)]

    def _activity(self, call_id: str, status: str, data: Any = None) -> ag.ActivitySnapshotEvent:
        content: dict[str, Any] = {
            "type": PROGRESS_ACTIVITY, "schema": "tool-call-progress.v1", "call_id": call_id,
            "status": status, "run_id": self.run_id, "thread_id": self.thread_id,
        }
        name = self._calls.get(call_id, (None, None))[0]
        if name:
            content["tool_name"] = name
        if isinstance(data, dict):
            for key in ("progress", "total", "message"):
                if key in data:
                    content[key] = data[key]
        if data is not None:
            content["data"] = data
        return ag.ActivitySnapshotEvent(
            message_id=f"tool_call:{call_id}", activity_type=PROGRESS_ACTIVITY, content=content,
        )

    # -- committed -------------------------------------------------------------------------------

    def _event(self, ev: Event, ts: int | None) -> list[Any]:
        out = self._translate(ev)
        if ts is not None:
            for e in out:
                if e.timestamp is None:
                    e.timestamp = ts
        return out

    def _translate(self, ev: Event) -> list[Any]:
        # isinstance narrows `ev` for mypy; event classes have no subclasses, so it is `type(ev) is`
        if isinstance(ev, StepStarted):
            return self._open_step(ev.step)
        if isinstance(ev, StepFinished):
            if self._step == ev.step:
                return self._close_step()
            return []
        if isinstance(ev, MessageAppended):
            return self._message(ev.message)
        if isinstance(ev, ToolCallStarted):
            self._calls.setdefault(ev.call_id, (ev.name, ev.arguments))
            return []
        if isinstance(ev, ToolCallSuspended):
            self._tickets[ev.call_id] = ev.ticket
            self._resolve(ev.call_id)
            return []
        if isinstance(ev, ToolCallResuming):  # its result is to come again
            self._resolved.discard(ev.call_id)
            self._unresolve(ev.call_id, self._max_step)
            return []
        if isinstance(ev, ToolCallCompleted):
            self._resolve(ev.call_id)
            if ev.call_id in self._progress:
                self._progress.discard(ev.call_id)
                status = "done" if ev.outcome == "succeeded" else ev.outcome
                return [self._activity(ev.call_id, status)]
            return []
        if isinstance(ev, InferenceCompleted):
            self._usage = self._usage + ev.usage
            if ev.model not in self._models:
                self._models.append(ev.model)
            return []
        if isinstance(ev, StatePatched) and ev.scope == "thread":
            try:
                self.state = jsonpatch.apply_patch(self.state, ev.ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
                pass  # our copy lacked the base state; the delta is still the log's truth
            # validated into ag-ui's operation models (what the keyword form does too; its
            # signature asks for those models, the log holds the JSON)
            return [ag.StateDeltaEvent.model_validate({"delta": ev.ops})]
        if isinstance(ev, StateReplaced) and ev.scope == "thread":
            self.state = copy.deepcopy(ev.state)
            return [ag.StateSnapshotEvent(snapshot=copy.deepcopy(self.state))]
        if isinstance(ev, StateWritten) and ev.scope == "thread":
            return self._typed_write(ev)
        if isinstance(ev, StateCleared) and ev.scope == "thread":
            gone = [k for k in ev.keys if k in self.state]
            self.state = {k: v for k, v in self.state.items() if k not in ev.keys}
            ops = [{"op": "remove", "path": "/" + k.replace("~", "~0").replace("/", "~1")} for k in gone]
            return [ag.StateDeltaEvent.model_validate({"delta": ops})] if ops else []
        if isinstance(ev, RunSuspended):
            return self._suspended(ev.call_ids)
        if isinstance(ev, RunFinished):
            return self._finished(ev)
        if isinstance(ev, Emitted):
            return emitted_events(ev)
        if isinstance(ev, AgentHandedOff):
            return [handoff_event(ev)]
        return []

    def _message(self, m: Message) -> list[Any]:
        self.messages.append(m)
        if m.role == "assistant" and m.tool_calls:
            self._calls_committed(m)
        if m.visibility != "all":
            return []
        if m.id in self._client_has:  # the client has it: only the snapshots carry it
            self._announced.update(c.id for c in m.tool_calls or ())
            return self._close_calls() if m.role == "assistant" else []
        out: list[Any] = []
        if m.role == "assistant":
            out += self._committed_reasoning(m)
            out += self._committed_text(m)
            for call in m.tool_calls or ():
                if call.id in self._announced:
                    continue  # already started, streamed and ended: one TOOL_CALL_START per call
                self._announced.add(call.id)
                self._calls[call.id] = (call.name, call.arguments)
                args = json_text(call.arguments)
                streamed_call = self._live_calls.get(call.id)
                if streamed_call is not None:
                    if streamed_call.open:
                        rest = args_rest(call.arguments, streamed_call.args)
                        if rest:
                            out.append(ag.ToolCallArgsEvent(tool_call_id=call.id, delta=rest))
                        streamed_call.open = False
                        out.append(ag.ToolCallEndEvent(tool_call_id=call.id))
                    continue
                out += [
                    ag.ToolCallStartEvent(tool_call_id=call.id, tool_call_name=call.name, parent_message_id=m.id),
                    ag.ToolCallArgsEvent(tool_call_id=call.id, delta=args),
                    ag.ToolCallEndEvent(tool_call_id=call.id),
                ]
            out += self._close_calls()
        elif m.role == "tool":
            out.append(ag.ToolCallResultEvent(
                message_id=m.id, tool_call_id=m.tool_call_id or "", content=m.content, role="tool",
            ))
        elif m.role == "user" and self.echo_user_messages and m.content:
            out += [
                ag.TextMessageStartEvent(message_id=m.id, role="user"),
                ag.TextMessageContentEvent(message_id=m.id, delta=m.content),
                ag.TextMessageEndEvent(message_id=m.id),
            ]
        return out

    def _calls_committed(self, m: Message) -> None:
        """The calls of a committed assistant message await their results; calls seen only live
        in its step and not in it (a model attempt that was retried) never will."""
        step = self._step if self._step is not None else self._max_step
        ids = {c.id for c in m.tool_calls or ()}
        for cid, at in list(self._unresolved.items()):
            if at == step and cid not in ids and cid not in self._committed_calls:
                del self._unresolved[cid]
        for cid in ids:
            self._committed_calls.add(cid)
            self._unresolve(cid, step)

    def _committed_text(self, m: Message) -> list[Any]:
        """The text of a committed assistant message, given what was streamed live: catch up on
        deltas the live link dropped (core NATS is best effort) and close it; a message streamed
        under its own id and already closed only gets the missing rest; one never streamed is
        synthesised. Text is never sent twice."""
        out: list[Any] = []
        streamed = self._streamed.pop(m.id, None)
        if self._text is not None and (self._text.message_id == m.id or streamed is None):
            streamed, mid = self._text.text, self._text.message_id
            if m.content.startswith(streamed) and len(m.content) > len(streamed):
                out.append(ag.TextMessageContentEvent(message_id=mid, delta=m.content[len(streamed):]))
            self._streamed.pop(mid, None)
            return out + self._close_text()
        if m.id in self._ended:
            return out  # started and ended already: a second START would double the client's text
        sent = streamed or ""
        rest = m.content[len(sent):] if m.content.startswith(sent) else ""
        if rest:
            self._ended.add(m.id)
            out += [ag.TextMessageStartEvent(message_id=m.id, role="assistant"),
                    ag.TextMessageContentEvent(message_id=m.id, delta=rest),
                    ag.TextMessageEndEvent(message_id=m.id)]
        return out

    # -- open/close bookkeeping ------------------------------------------------------------------

    def _open_step(self, step: int) -> list[Any]:
        if self._step == step or step < self._max_step:
            return []
        out = self._close_step() if self._step is not None else []
        self._step = step
        self._max_step = max(self._max_step, step)
        out.append(ag.StepStartedEvent(step_name=step_name(step)))
        return out

    def _close_text(self) -> list[Any]:
        if self._text is None:
            return []
        mid, self._text = self._text.message_id, None
        self._ended.add(mid)
        return [ag.TextMessageEndEvent(message_id=mid)]

    def _close_reasoning(self) -> list[Any]:
        if self._reasoning is None:
            return []
        rid, self._reasoning = self._reasoning.message_id, None
        self._ended.add(rid)
        self._streamed.pop(rid, None)
        return [ag.ReasoningMessageEndEvent(message_id=rid), ag.ReasoningEndEvent(message_id=rid)]

    def _close_calls(self) -> list[Any]:
        return [ag.ToolCallEndEvent(tool_call_id=call.call_id) for call in self._live_calls.close_all()]

    def _close_step(self) -> list[Any]:
        out = self._close_reasoning() + self._close_text() + self._close_calls()
        if self._step is not None:
            out.append(ag.StepFinishedEvent(step_name=step_name(self._step)))
            self._step = None
        return out

    def _close_all(self) -> list[Any]:
        return self._close_step()

    # -- the end ---------------------------------------------------------------------------------

    def _token_usage(self, usage: Usage) -> list[ag.TokenUsage] | None:
        if usage.total_tokens == 0:
            return None
        model = self._models[0] if len(self._models) == 1 else None
        return [ag.TokenUsage(model=model, input_tokens=usage.input_tokens,
                              output_tokens=usage.output_tokens, total_tokens=usage.total_tokens)]

    def _snapshot_messages(self) -> ag.MessagesSnapshotEvent:
        return ag.MessagesSnapshotEvent(messages=to_agui_messages(self.messages))

    def feed_suspended(self, run: Any) -> list[Any]:
        """The waiting end of a run read from its view (`RunView`), not from its events: its
        open calls' tickets, then STATE/MESSAGES snapshots and RUN_FINISHED with the interrupts."""
        open_calls = [c for c in run.calls.values() if c.status == "suspended"]
        for c in open_calls:
            if c.ticket is not None:
                self._tickets[c.call_id] = c.ticket
            self._calls.setdefault(c.call_id, (c.name, c.arguments))
        return self.start() + self._suspended([c.call_id for c in open_calls])

    def reconnect(self) -> list[Any]:
        """What a client reconnecting to the run gets first: RUN_STARTED, then the thread's
        state and messages as of where the stream resumes (snapshots replace what the client
        holds, so nothing it already has is added twice)."""
        self._send_initial_state = True
        return [*self.start(), self._snapshot_messages()]

    def _typed_write(self, ev: StateWritten) -> list[Any]:
        """A typed write as AG-UI's JSON Patch: the key's new value (`add` replaces), or its
        removal; its ops (which AG-UI does not know: increments, lattice joins) are applied to
        our copy of the state. A copy that lacks the base state sends nothing: a client that
        reconnects gets the state as a snapshot."""
        try:
            state = apply_ops(self.state, ev.ops)
        except InvalidPatch:
            return []
        self.state = state
        path = "/" + ev.key.replace("~", "~0").replace("/", "~1")
        op = {"op": "add", "path": path, "value": state[ev.key]} if ev.key in state else {"op": "remove", "path": path}
        return [ag.StateDeltaEvent.model_validate({"delta": [op]})]

    def _suspended(self, call_ids: list[str]) -> list[Any]:
        """A waiting run ends the AG-UI run. Frontend tool calls are NOT interrupts (AG-UI 1.0:
        the run finishes successfully with `pendingToolCallIds`, the client runs the tools and
        answers with `role: tool` messages in its next request, which the official client only
        sends with no pending interrupt). Approvals and other human input stay interrupts."""
        pending = [cid for cid in call_ids if is_frontend_ticket(self._tickets.get(cid))]
        interrupts = [
            make_interrupt(cid, self._tickets.get(cid), *self._calls.get(cid, (None, None)))
            for cid in call_ids if cid not in pending
        ]
        out = self._close_all()
        out += [ag.StateSnapshotEvent(snapshot=copy.deepcopy(self.state)), self._snapshot_messages()]
        outcome: Any = (ag.RunFinishedInterruptOutcome(interrupts=interrupts) if interrupts
                        else ag.RunFinishedSuccessOutcome(pending_tool_call_ids=pending or None))
        out.append(ag.RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id, outcome=outcome,
            usage=self._token_usage(self._usage),
        ))
        self.done = True
        return out

    def _finished(self, ev: RunFinished) -> list[Any]:
        term = ev.termination
        usage = self._token_usage(ev.usage if ev.usage.total_tokens else self._usage)
        out = self._close_all()
        self.done = True
        if term.type == "error":
            return out + [ag.RunErrorEvent(message=term.detail or term.code or "the run failed",
                                           code=term.code, usage=usage)]
        out.append(self._snapshot_messages())
        result = None
        if term.type != "natural_end":
            result = {"termination": {k: v for k, v in
                                      (("type", term.type), ("code", term.code), ("detail", term.detail))
                                      if v is not None}}
        outcome: Any = (ag.RunFinishedCancelledOutcome() if term.type == "cancelled"
                        else ag.RunFinishedSuccessOutcome())
        out.append(ag.RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id, outcome=outcome, result=result, usage=usage,
        ))
        return out


def translate(
    thread_id: str, run_id: str, items: Iterable[Any], **kwargs: Any
) -> list[Any]:
    """A whole recorded run at once (replays, tests): feed everything, then `finish()`."""
    tr = AguiTranslator(thread_id, run_id, **kwargs)
    out: list[Any] = []
    for item in items:
        out += tr.feed(item)
    return out + tr.finish()


# -- input -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AguiRunRequest:
    """A parsed `RunAgentInput`, in agentlog terms.

    `messages`: the new user messages (the trailing user messages of the input, or those whose
    id is not in `known_ids`), as dicts `Runtime.start` accepts. `tool_results`: trailing
    `role: tool` messages (answers to frontend tool calls). `decisions`: the `resume[]` entries.
    """

    thread_id: str
    run_id: str
    parent_run_id: str | None
    messages: list[dict[str, Any]]
    tool_results: list[dict[str, Any]]
    tools: list[ToolSpec]
    context: list[tuple[str, str]]
    state: Any
    forwarded_props: Any
    decisions: list[Decision]
    input: ag.RunAgentInput = field(repr=False)
    #: What a started run records of the request besides its messages and tools
    #: (`agentlog.runtime.inputs.run_input`, JSON form): overrides, context, forwarded props, state.
    run_input: dict[str, Any] | None = None


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_run_input(body: Any, *, known_ids: Iterable[str] | None = None) -> AguiRunRequest:
    """Validate a request body as the official `RunAgentInput` and extract what agentlog needs.
    Raises `AdapterInputError` (field + reason) for anything else; never anything untyped."""
    if not isinstance(body, dict):
        raise AdapterInputError(f"the body must be a JSON object (RunAgentInput), not {_kind(body)}")
    try:
        inp = ag.RunAgentInput.model_validate(body)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        raise AdapterInputError(err.get("msg", "invalid"), _loc(err.get("loc", ())) or None) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise AdapterInputError(f"not a RunAgentInput: {type(exc).__name__}") from None
    for name, value in (("threadId", inp.thread_id), ("runId", inp.run_id)):
        if not is_valid_id(value):
            raise AdapterInputError("ids must be 1-128 characters of A-Z, a-z, 0-9, '_' or '-'", name)
    if inp.parent_run_id is not None and not is_valid_id(inp.parent_run_id):
        raise AdapterInputError("not a valid run id", "parentRunId")

    known = set(known_ids) if known_ids is not None else None
    msgs = list(inp.messages)
    if known is not None:
        fresh = [(i, m) for i, m in enumerate(msgs) if m.id not in known]
    else:  # the trailing run of user/tool messages after the last assistant/system turn
        start = len(msgs)
        while start > 0 and msgs[start - 1].role in ("user", "tool"):
            start -= 1
        fresh = list(enumerate(msgs))[start:]
    new_messages: list[dict[str, Any]] = []
    tool_results: list[dict[str, Any]] = []
    for i, m in fresh:
        if m.role == "user":
            msg: dict[str, Any] = {"role": "user", "content": _user_content(m.content, f"messages[{i}].content")}
            if safe_id(m.id):
                msg["id"] = m.id
            new_messages.append(msg)
        elif m.role == "tool":
            tool_results.append({
                "tool_call_id": m.tool_call_id, "message_id": m.id,
                "content": _text_content(m.content, f"messages[{i}].content"),
                "error": m.error,
            })
    tools = [
        ToolSpec(name=t.name, description=t.description,
                 parameters=t.parameters if isinstance(t.parameters, dict)
                 else {"type": "object", "properties": {}})
        for t in inp.tools or ()
    ]
    names = [t.name for t in tools]
    for i, name in enumerate(names):  # they become recorded frontend tool names: ids
        if not is_valid_id(name):
            raise AdapterInputError("tool names must be 1-128 characters of A-Z, a-z, 0-9, '_' or '-'",
                                    f"tools[{i}].name")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AdapterInputError(f"duplicate tool name(s) {', '.join(dup)}", "tools")
    decisions: list[Decision] = []
    for i, entry in enumerate(inp.resume or ()):
        if not is_valid_id(entry.interrupt_id):
            raise AdapterInputError("not a known interrupt id (interrupt ids are tool call ids)",
                                    f"resume[{i}].interruptId")
        decisions.append(Decision(
            target_id=entry.interrupt_id,
            decision_id=decision_id(inp.thread_id, entry.interrupt_id, entry.status, entry.payload),
            action="resume" if entry.status == "resolved" else "cancel",
            result=entry.payload,
        ))
    context = [(c.description, c.value) for c in inp.context or ()]
    return AguiRunRequest(
        thread_id=inp.thread_id, run_id=inp.run_id, parent_run_id=inp.parent_run_id,
        messages=new_messages, tool_results=tool_results, tools=tools, context=context,
        state=inp.state, forwarded_props=inp.forwarded_props, decisions=decisions, input=inp,
        run_input=agui_run_input(context, inp.state, inp.forwarded_props),
    )


def agui_overrides(forwarded: Any) -> dict[str, Any] | None:
    """`forwardedProps.model`, `.systemPrompt` and `.config` as run overrides (CopilotKit-style:
    the provider's `properties` arrive as `forwardedProps`); other keys are only recorded."""
    return request_overrides(forwarded, "forwardedProps.") if isinstance(forwarded, dict) else None


def agui_run_input(context: Sequence[tuple[str, str]], state: Any, forwarded: Any) -> dict[str, Any] | None:
    """The run input a `RunAgentInput` carries: its context, its state (an object; null and `{}`
    add nothing), its `forwardedProps` (recorded unless empty) and the overrides they hold."""
    if state is not None and not isinstance(state, dict):
        raise AdapterInputError(f"state must be an object (it is merged into the thread's state), not {_kind(state)}",
                                "state")
    out: dict[str, Any] = {}
    overrides = agui_overrides(forwarded)
    if overrides:
        out["overrides"] = overrides
    if context:
        out["context"] = [{"description": d, "value": v} for d, v in context]
    if forwarded not in (None, {}):
        out["forwarded_props"] = forwarded
    if state:
        out["state"] = state
    return out or None


def check_resume(request: AguiRunRequest | Sequence[Decision], open: Iterable[Any]) -> list[Decision]:
    """Check `resume[]` against the open interrupts of the waiting run (`ag.Interrupt`s, call
    ids, or a `RunView`): every open interrupt answered, every answer to an open one. Raises
    `MissingResume` / `UnknownInterrupt` / `DuplicateResume` (route: RUN_ERROR, nothing written)."""
    decisions = request.decisions if isinstance(request, AguiRunRequest) else list(request)
    if hasattr(open, "calls"):
        open = open_interrupts(open)
    ids = [o.id if isinstance(o, ag.Interrupt) else str(o) for o in open]
    check_decisions(decisions, ids, require_all=True)
    return decisions


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, part in enumerate(content):
        if getattr(part, "type", None) != "text":
            raise AdapterInputError(
                f"content part type {getattr(part, 'type', '?')!r} is not supported (text only)", f"{where}[{j}]")
        parts.append(part.text)
    return "".join(parts)


#: AG-UI media part types -> agentlog part types (audio and video ride as files).
_MEDIA = {"image": "image", "document": "file", "audio": "file", "video": "file"}


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user message's content: a string, or its parts as agentlog content parts (text, and
    image / document / audio / video with a `data` or `url` source). A `file` source (a handle
    only one provider can read) is refused: the run may go to any model."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = getattr(part, "type", None)
        if kind == "text":
            parts.append({"type": "text", "text": part.text})
            continue
        if kind not in _MEDIA:
            raise AdapterInputError(f"content part type {kind!r} is not supported", f"{where}[{j}]")
        source = part.source
        out: dict[str, Any] = {"type": _MEDIA[kind]}
        if getattr(source, "mime_type", None):
            out["media_type"] = source.mime_type
        if source.type == "data":
            out["data"] = source.value
        elif source.type == "url":
            out["url"] = source.value
        else:
            raise AdapterInputError("a provider file handle cannot be used here: send the bytes (data) or a url",
                                    f"{where}[{j}].source")
        if kind != "image" and isinstance((part.metadata or {}), dict) and (part.metadata or {}).get("filename"):
            out["filename"] = str(part.metadata["filename"])
        parts.append(out)
    try:
        as_parts(parts)
    except ValueError as exc:
        raise AdapterInputError(str(exc), where) from None
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)
