"""AI SDK v6 adapter: canonical run events -> UI message stream parts, and the `useChat` request
body -> a run request (new user text, tool approval decisions).

Wire facts (checked against vercel/ai `ui-message-chunks.ts` `uiMessageChunkSchema` and
`ui-message-stream-headers.ts` / `json-to-sse-transform-stream.ts`): each part is one SSE frame
`data: <json>\n\n`, the stream ends with `data: [DONE]\n\n`, the response carries
`x-vercel-ai-ui-message-stream: v1`. Parts are strict objects, so we never add fields.

Mapping, and why:
* one run = one assistant UI message (`start{messageId}` ... `finish`); a resumed stream passes
  the same `message_id` so the client keeps adding to the message it already shows;
* steps -> `start-step`/`finish-step`, opened at the first sign of a step (live deltas come
  before the loop commits `StepStarted`);
* text from live deltas when present, else synthesised from the committed assistant message;
  live deltas carry the committed message's id (`message_id`), used as the text part id, and
  the text part stays open while that message's tool calls stream, so the committed text is
  never emitted a second time (a duplicated text part would show the text twice);
* reasoning -> one `reasoning-start`/`reasoning-delta`/`reasoning-end` part per assistant
  message (id `<message id>-reasoning`), streamed from live `reasoning_delta`s and closed when
  the answer starts, else synthesised from the committed message's reasoning;
* tool calls -> `tool-input-start` (+ `tool-input-delta` from live) + `tool-input-available`,
  results -> `tool-output-available` / `tool-output-error`, a denied call (permission deny or a
  human's cancel) -> `tool-output-denied`;
* a suspended call that a yes/no settles -> `tool-approval-request` with `approvalId` = the call
  id (what a decision targets); one that needs input -> a `data-agentlog-interrupt` part;
  a suspended turn ends with `finish{finishReason: "tool-calls"}`;
* error termination -> `error{errorText}` then `finish{finishReason: "error"}`; cancelled ->
  `abort`; tool progress -> transient `data-tool-progress`; thread state edits -> transient
  `data-state-delta` (RFC 6902 ops), so neither lands in the persisted UI message;
* a handoff (`AgentHandedOff`) -> `data-agentlog-handoff` `{from_agent, to_agent, reason?,
  call_id?}`, kept in the UI message (the conversation changed hands there) and in the history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import pydantic

from agentlog.eventlog.events import (
    AgentHandedOff,
    Event,
    Message,
    MessageAppended,
    RunFinished,
    RunSuspended,
    StateCleared,
    StatePatched,
    StateReplaced,
    StateWritten,
    StepFinished,
    StepStarted,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.eventlog.ids import is_valid_id
from agentlog.gateway.adapters.common import (
    AdapterInputError,
    Decision,
    LiveCalls,
    as_item,
    check_decisions,
    data_url_part,
    decision_id,
    handoff_value,
    int_or,
    interrupt_reason,
    is_frontend_ticket,
    live_message_id,
    needs_approval,
    queue_mode,
    reasoning_id,
    reasoning_text,
    request_overrides,
    safe_id,
)
from agentlog.runtime.inputs import as_parts

#: Response headers of a UI message stream (AI SDK `uiMessageStreamHeaders`).
HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
#: The SSE frame that ends every stream.
DONE = "data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode


def encode(part: Mapping[str, Any]) -> str:
    """One part as an SSE frame, as the AI SDK's `JsonToSseTransformStream` writes it."""
    return f"data: {_encode(part).decode()}\n\n"


def acted_on_approvals(events: Iterable[Event]) -> list[str]:
    """The suspensions of a run's log (in order) that the run went on from with an approval:
    one call id per `ToolCallSuspended` followed by a `ToolCallResuming` of that call whose
    decision was `resume`. What `AiSdkTranslator.approved_later` takes."""
    suspended: Counter[str] = Counter()
    approved: dict[str, bool] = {}
    out: list[str] = []
    for ev in events:
        if isinstance(ev, ToolCallSuspended):
            suspended[ev.call_id] += 1
        elif isinstance(ev, ToolCallDecided):
            approved[ev.call_id] = ev.decision.action == "resume"
        elif isinstance(ev, ToolCallResuming) and suspended[ev.call_id] > 0:
            suspended[ev.call_id] -= 1
            if approved.get(ev.call_id):
                out.append(ev.call_id)
    return out


def encode_stream(parts: Iterable[Mapping[str, Any]]) -> str:
    """A whole stream, `[DONE]` included (replays, tests)."""
    return "".join(encode(p) for p in parts) + DONE


#: The type of the transient data part that carries the log position a stream ended at (`with_position`).
POSITION = "data-agentlog-position"


class AiSdkTranslator:
    """Canonical run events (committed or live) -> AI SDK v6 UI message stream parts."""

    def __init__(self, thread_id: str, run_id: str, *, message_id: str | None = None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.message_id = message_id or run_id
        self.started = False
        self.done = False
        self._step: int | None = None
        self._max_step = 0
        self._text: tuple[str, int, str] | None = None          # (id, step, text so far)
        self._reasoning: tuple[str, str] | None = None           # open reasoning (id, text so far)
        self._streamed: set[str] = set()                         # text ids streamed live
        self._ended: set[str] = set()                            # text ids whose text-end was sent
        self._live_calls = LiveCalls()
        self._calls: dict[str, tuple[str, Any]] = {}
        self._available: set[str] = set()
        self._denied: set[str] = set()
        self._running: set[str] = set()            # calls whose result is still to be committed
        self._held: list[dict[str, Any]] = []      # live deltas of the next step, until then
        self._approved_later: Counter[str] = Counter()

    def approved_later(self, call_ids: Iterable[str]) -> None:
        """Suspensions a replay knows the run went on from with an approval, one call id per
        suspension (`acted_on_approvals`): their approval request is not replayed (no stream part
        carries the human's `approved`, and an `output-available` part with an unanswered
        `approval` fails `validateUIMessages`). A call suspended again after that, or approved
        but not resumed yet (the rest of its batch unanswered), still gets its request."""
        self._approved_later.update(call_ids)

    def expect_results(self, call_ids: Iterable[str]) -> None:
        """Calls whose results the stream will carry before the run's next step (the decisions
        this request forwards): the next step's live deltas wait for them (see `feed`)."""
        self._running.update(call_ids)

    def start(self, *, announce: bool = True) -> list[dict[str, Any]]:
        """`start{messageId}`; without `announce`, a bare `start` (the client then creates no
        message: used when a stream fails before anything of the run was sent)."""
        if self.started:
            return []
        self.started = True
        return [{"type": "start", "messageId": self.message_id} if announce else {"type": "start"}]

    def feed(self, item: Any) -> list[dict[str, Any]]:
        """Live text/tool deltas that arrive while calls of the step before are still running
        are held until those calls' results are committed: the live link outruns the log, and
        the client only finds a tool part in the CURRENT step (`getCurrentStepParts`), so a
        result sent after the next `start-step` fails with "No tool invocation found"."""
        if self.done:
            return []
        it = as_item(item)
        out = self.start()
        if it.live is not None:
            if self._running and it.live.get("type") in ("text_delta", "reasoning_delta", "tool_call_delta"):
                self._held.append(it.live)
                return out
            return out + self._live(it.live)
        if it.event is not None:  # as_item gives one of the two
            out += self._event(it.event)
        if self._held and not self._running and not self.done:
            held, self._held = self._held, []
            for p in held:
                out += self._live(p)
        return out

    def rewind(self, state: dict[str, Any], messages: list[Message]) -> None:
        """A UI message stream carries no snapshot: nothing to start from."""

    def with_position(self, out: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
        """`out` with a transient `data-agentlog-position` part `{"seq": seq}` before its terminal
        part: the log position the stream ended at, which a client passes as `min_seq` to read
        its run's effects (a transient part is not kept in the message)."""
        at = next((i for i, p in enumerate(out) if p.get("type") in ("error", "finish", "abort")), None)
        part = {"type": POSITION, "transient": True, "data": {"seq": seq}}
        return out if at is None else [*out[:at], part, *out[at:]]

    def finish(self, error: BaseException | str | None = None) -> list[dict[str, Any]]:
        """Close a stream whose source ended without a terminal event (or failed)."""
        if self.done:
            return []
        text = ("the run's event stream ended before the run finished" if error is None
                else error if isinstance(error, str) else (str(error) or type(error).__name__))
        self.done = True
        # an error before any part of the run: no messageId, or the client shows an empty
        # assistant message under an id the thread does not have
        return self.start(announce=False) + self._close_step() + [
            {"type": "error", "errorText": text}, {"type": "finish", "finishReason": "error"}]

    # -- live ------------------------------------------------------------------------------------

    def _live(self, p: dict[str, Any]) -> list[dict[str, Any]]:
        kind = p.get("type")
        out: list[dict[str, Any]] = []
        if kind in ("text_delta", "tool_call_delta"):
            out += self._close_reasoning()  # the model answers: its reasoning is over
        if kind == "reasoning_delta":
            out += self._live_reasoning(p)
        elif kind == "text_delta":
            text = p.get("text")
            step = int_or(p.get("step"), self._max_step)
            if not isinstance(text, str) or not text:
                return []
            mid = live_message_id(p, self.run_id, step)
            if mid in self._ended:
                return []  # a text part is started once
            out += self._open_step(step)
            if self._text is None or self._text[0] != mid:
                out += self._close_text()
                self._text = (mid, step, "")
                out.append({"type": "text-start", "id": mid})
            self._text = (mid, step, self._text[2] + text)
            self._streamed.add(mid)
            out.append({"type": "text-delta", "id": mid, "delta": text})
        elif kind == "tool_call_delta":
            step = int_or(p.get("step"), self._max_step)
            out += self._open_step(step)
            d = self._live_calls.feed(p, step, self._available.__contains__)  # seen: its commit announced it
            if d is None:
                return out
            if d.started:
                out.append({"type": "tool-input-start", "toolCallId": d.call.call_id, "toolName": d.call.name})
            if d.args:
                out.append({"type": "tool-input-delta", "toolCallId": d.call.call_id, "inputTextDelta": d.args})
        elif kind == "tool_progress":
            call_id = p.get("call_id")
            if isinstance(call_id, str):
                out.append({"type": "data-tool-progress", "id": call_id, "transient": True,
                            "data": {"callId": call_id, "status": "running", "data": p.get("data")}})
        return out

    def _live_reasoning(self, p: dict[str, Any]) -> list[dict[str, Any]]:
        text = p.get("text")
        step = int_or(p.get("step"), self._max_step)
        if not isinstance(text, str) or not text:
            return []
        rid = reasoning_id(live_message_id(p, self.run_id, step))
        if rid in self._ended:
            return []  # a reasoning part is started once
        out = self._open_step(step)
        if self._reasoning is None or self._reasoning[0] != rid:
            out += self._close_reasoning() + self._close_text()
            self._reasoning = (rid, "")
            out.append({"type": "reasoning-start", "id": rid})
        self._reasoning = (rid, self._reasoning[1] + text)
        out.append({"type": "reasoning-delta", "id": rid, "delta": text})
        return out

    def _committed_reasoning(self, m: Message) -> list[dict[str, Any]]:
        text, rid = reasoning_text(m), reasoning_id(m.id)
        if self._reasoning is not None and self._reasoning[0] == rid:
            streamed = self._reasoning[1]
            out: list[dict[str, Any]] = []
            if text.startswith(streamed) and len(text) > len(streamed):
                out.append({"type": "reasoning-delta", "id": rid, "delta": text[len(streamed):]})
            return out + self._close_reasoning()
        if not text or rid in self._ended:
            return []
        self._ended.add(rid)
        return [{"type": "reasoning-start", "id": rid}, {"type": "reasoning-delta", "id": rid, "delta": text},
                {"type": "reasoning-end", "id": rid}]

    # -- committed -------------------------------------------------------------------------------

    def _event(self, ev: Event) -> list[dict[str, Any]]:
        # isinstance narrows `ev` for mypy; event classes have no subclasses, so it is `type(ev) is`
        if isinstance(ev, StepStarted):
            return self._open_step(ev.step)
        if isinstance(ev, StepFinished):
            return self._close_step() if self._step == ev.step else []
        if isinstance(ev, MessageAppended):
            return self._message(ev.message)
        if isinstance(ev, ToolCallStarted):
            self._calls.setdefault(ev.call_id, (ev.name, ev.arguments))
            return []
        if isinstance(ev, ToolCallGated):
            if ev.verdict == "deny":
                self._denied.add(ev.call_id)
            return []
        if isinstance(ev, ToolCallDecided):
            if ev.decision.action == "cancel":
                self._denied.add(ev.call_id)
            self._running.add(ev.call_id)
            return []
        if isinstance(ev, ToolCallSuspended):
            self._running.discard(ev.call_id)
            return self._suspend(ev.call_id, ev.ticket)
        if isinstance(ev, ToolCallCompleted):
            self._running.discard(ev.call_id)
            return self._completed(ev)
        if isinstance(ev, StatePatched) and ev.scope == "thread":
            return [{"type": "data-state-delta", "transient": True, "data": ev.ops}]
        if isinstance(ev, StateReplaced) and ev.scope == "thread":
            return [{"type": "data-state-snapshot", "transient": True, "data": ev.state}]
        if isinstance(ev, StateWritten) and ev.scope == "thread":  # typed: its key and extended ops
            return [{"type": "data-state-written", "transient": True, "data": {"key": ev.key, "ops": ev.ops}}]
        if isinstance(ev, StateCleared) and ev.scope == "thread":
            return [{"type": "data-state-cleared", "transient": True, "data": {"keys": ev.keys}}]
        if isinstance(ev, RunSuspended):
            self.done = True
            return self._close_step() + [{"type": "finish", "finishReason": "tool-calls"}]
        if isinstance(ev, RunFinished):
            return self._finished(ev)
        if isinstance(ev, AgentHandedOff):
            return [{"type": "data-agentlog-handoff", "data": handoff_value(ev)}]
        return []

    def _message(self, m: Message) -> list[dict[str, Any]]:
        if m.visibility != "all" or m.role != "assistant":
            return []  # tool results come from ToolCallCompleted (structured output)
        out: list[dict[str, Any]] = self._committed_reasoning(m)
        if self._text is not None and (self._text[0] == m.id or m.id not in self._streamed):
            tid, _, streamed = self._text
            if m.content.startswith(streamed) and len(m.content) > len(streamed):
                out.append({"type": "text-delta", "id": tid, "delta": m.content[len(streamed):]})
            out += self._close_text()
        elif m.content and m.id not in self._streamed and m.id not in self._ended:
            self._ended.add(m.id)
            out += [{"type": "text-start", "id": m.id},
                    {"type": "text-delta", "id": m.id, "delta": m.content},
                    {"type": "text-end", "id": m.id}]
        for call in m.tool_calls or ():
            if call.id in self._available:
                continue  # already announced (a replayed commit): one tool part per call
            self._calls[call.id] = (call.name, call.arguments)
            streamed_call = self._live_calls.get(call.id)
            if streamed_call is not None:
                streamed_call.open = False
            else:
                out.append({"type": "tool-input-start", "toolCallId": call.id, "toolName": call.name})
            self._available.add(call.id)
            self._running.add(call.id)
            out.append({"type": "tool-input-available", "toolCallId": call.id, "toolName": call.name,
                        "input": call.arguments})
        return out

    def _suspend(self, call_id: str, ticket: Any) -> list[dict[str, Any]]:
        if is_frontend_ticket(ticket):
            return []  # the client runs it on `tool-input-available` and answers with addToolOutput
        if needs_approval(ticket):
            if self._approved_later[call_id] > 0:
                self._approved_later[call_id] -= 1
                return []
            return [{"type": "tool-approval-request", "approvalId": call_id, "toolCallId": call_id}]
        data: dict[str, Any] = {"id": call_id, "toolCallId": call_id, "reason": interrupt_reason(ticket)}
        if ticket is not None:
            data.update(action=ticket.action, message=ticket.message, responseSchema=ticket.response_schema)
        return [{"type": "data-agentlog-interrupt", "id": call_id,
                 "data": {k: v for k, v in data.items() if v is not None}}]

    def _completed(self, ev: ToolCallCompleted) -> list[dict[str, Any]]:
        cid = ev.call_id
        if cid in self._denied:
            return [{"type": "tool-output-denied", "toolCallId": cid}]
        if ev.outcome == "succeeded":
            return [{"type": "tool-output-available", "toolCallId": cid, "output": ev.result}]
        err = ev.result.get("error") if isinstance(ev.result, dict) else None
        return [{"type": "tool-output-error", "toolCallId": cid,
                 "errorText": err if isinstance(err, str) else f"tool call {ev.outcome}"}]

    def _finished(self, ev: RunFinished) -> list[dict[str, Any]]:
        term = ev.termination
        out = self._close_step()
        self.done = True
        if term.type == "error":
            return out + [{"type": "error", "errorText": term.detail or term.code or "the run failed"},
                          {"type": "finish", "finishReason": "error"}]
        if term.type == "cancelled":
            return out + [{"type": "abort", "reason": term.detail or "cancelled"}]
        reason = "stop" if term.type == "natural_end" else "other"
        return out + [{"type": "finish", "finishReason": reason}]

    # -- bookkeeping -----------------------------------------------------------------------------

    def _open_step(self, step: int) -> list[dict[str, Any]]:
        if self._step == step or step < self._max_step:
            return []
        out = self._close_step()
        self._step = step
        self._max_step = max(self._max_step, step)
        return out + [{"type": "start-step"}]

    def _close_text(self) -> list[dict[str, Any]]:
        if self._text is None:
            return []
        tid, self._text = self._text[0], None
        self._ended.add(tid)
        return [{"type": "text-end", "id": tid}]

    def _close_reasoning(self) -> list[dict[str, Any]]:
        if self._reasoning is None:
            return []
        rid, self._reasoning = self._reasoning[0], None
        self._ended.add(rid)
        return [{"type": "reasoning-end", "id": rid}]

    def _close_step(self) -> list[dict[str, Any]]:
        out = self._close_reasoning() + self._close_text()
        if self._step is not None:
            out.append({"type": "finish-step"})
            self._step = None
        return out


def translate(thread_id: str, run_id: str, items: Iterable[Any], **kwargs: Any) -> list[dict[str, Any]]:
    """A whole recorded run at once (replays, tests)."""
    tr = AiSdkTranslator(thread_id, run_id, **kwargs)
    out: list[dict[str, Any]] = []
    for item in items:
        out += tr.feed(item)
    return out + tr.finish()


# -- input -------------------------------------------------------------------------------------

TRIGGERS = ("submit-message", "regenerate-message")


class UiMessageBody(pydantic.BaseModel):
    """A UI message as `DefaultChatTransport` sends it (parts are documented, not modelled)."""

    model_config = pydantic.ConfigDict(extra="allow")
    id: str
    role: Literal["user", "assistant", "system"]
    parts: list[dict[str, Any]] = []
    metadata: Any = None


class ChatRequestBody(pydantic.BaseModel):
    """The request body of `POST /v1/ai-sdk/agents/{agent_id}/runs`, for /openapi.json only:
    `parse_chat_request` is what validates (with field paths in its 400s)."""

    model_config = pydantic.ConfigDict(extra="allow")
    id: str = pydantic.Field(description="the chat id: the thread id", pattern=r"^[A-Za-z0-9_-]{1,128}$")
    messages: list[UiMessageBody]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    runId: str | None = pydantic.Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,128}$")
_STRING_FIELDS = ("runId", "messageId", "trigger")


@dataclass(frozen=True)
class AiSdkRequest:
    """A parsed `useChat` body. `message`: the new user message (dict for `Runtime.start`), or
    None for a decision-only or regenerate request. `decisions`: tool approval answers."""

    thread_id: str
    run_id: str | None
    trigger: str
    message_id: str | None
    message: dict[str, Any] | None
    decisions: list[Decision]
    #: Client-side tool results (`addToolOutput`: tool parts in state `output-available` /
    #: `output-error`) as decisions. The last message repeats results the server already has
    #: (backend tools), so the session keeps only those for open calls.
    tool_outputs: list[Decision] = field(default_factory=list)
    #: `steer` / `follow_up` (body `agentlog.mode`): the new message is queued on the thread's
    #: running run instead of interrupting it (`agentlog.gateway.adapters.common.queue_mode`).
    mode: str | None = None
    #: The body's `model` / `systemPrompt` / `config` as a run input (`agentlog.runtime.inputs.run_input`),
    #: recorded by a run it starts; None when it has none.
    run_input: dict[str, Any] | None = None


def parse_chat_request(body: Any) -> AiSdkRequest:
    """Validate a v6 chat request body (`id`, `messages` of UIMessages with `parts`, `trigger`,
    `messageId`, optional `runId`) and extract the new user text and the approval responses
    (explicit `tool-approval-response` parts, or tool parts in state `approval-responded` /
    `output-denied` with `approval{id, approved, reason}`), and the run overrides `model`,
    `systemPrompt`, `config` (extra body fields, as `sendMessage(..., {body})` sends them).
    `AdapterInputError` otherwise."""
    if not isinstance(body, dict):
        raise AdapterInputError("the body must be a JSON object")
    if "id" not in body and ("sessionId" in body or "input" in body):
        raise AdapterInputError("legacy AI SDK payload shape (sessionId/input) is not supported; use id/messages")
    thread_id = body.get("id")
    if not isinstance(thread_id, str) or not thread_id:
        raise AdapterInputError("required: the chat id (the thread id)", "id")
    if not is_valid_id(thread_id):
        raise AdapterInputError("ids must be 1-128 characters of A-Z, a-z, 0-9, '_' or '-'", "id")
    for name in _STRING_FIELDS:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise AdapterInputError("must be a string", name)
    run_id = body.get("runId")
    if run_id is not None and not is_valid_id(run_id):
        raise AdapterInputError("not a valid run id", "runId")
    trigger = body.get("trigger") or "submit-message"
    if trigger not in TRIGGERS:
        raise AdapterInputError(f"must be one of {', '.join(TRIGGERS)}", "trigger")
    message_id = body.get("messageId") or None
    if trigger == "regenerate-message" and not message_id:
        raise AdapterInputError("required when trigger is regenerate-message", "messageId")
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise AdapterInputError("must be an array of UI messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise AdapterInputError("must be an object", f"messages[{i}]")
        if m.get("role") not in ("user", "assistant", "system"):
            raise AdapterInputError("role must be user, assistant or system", f"messages[{i}].role")
        parts = m.get("parts", [])
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise AdapterInputError("must be an array of objects", f"messages[{i}].parts")

    message: dict[str, Any] | None = None
    decisions: list[Decision] = []
    if messages:
        i = len(messages) - 1
        last = messages[i]
        if last["role"] == "user" and trigger == "submit-message":
            content = _user_content(last, f"messages[{i}]")
            if content:
                message = {"role": "user", "content": content}
                if safe_id(last.get("id")):
                    message["id"] = last["id"]
        decisions = _approvals(thread_id, last, f"messages[{i}]")
        outputs = _tool_outputs(thread_id, last, f"messages[{i}]", {d["target_id"] for d in decisions})
    else:
        outputs = []
    if message is None and not decisions and not outputs and trigger != "regenerate-message":
        raise AdapterInputError("request must include user input, tool approval responses or tool outputs",
                                "messages")
    overrides = request_overrides(body)
    return AiSdkRequest(thread_id, run_id, trigger, message_id, message, decisions, outputs,
                        mode=queue_mode(body, "body"), run_input={"overrides": overrides} if overrides else None)


def _tool_outputs(thread_id: str, m: dict[str, Any], where: str, approved: set[str]) -> list[Decision]:
    """Tool parts with a client-side result (`addToolOutput`) -> decisions whose payload is the
    tool result (frontend tools resume with `use_decision_as_tool_result`); `output-error` ->
    a cancel with the error text. Parts already answered as approvals are left to those."""
    if m.get("role") != "assistant":
        return []
    out: list[Decision] = []
    for j, p in enumerate(m.get("parts", [])):
        kind, state = p.get("type"), p.get("state")
        if not (isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")) \
                or state not in ("output-available", "output-error"):
            continue
        target = p.get("toolCallId")
        if not is_valid_id(target) or target in approved:
            continue
        if state == "output-available":
            d = Decision(target_id=target, action="resume", result=p.get("output"),
                         decision_id=decision_id(thread_id, target, "output", p.get("output")))
        else:
            text = p.get("errorText")
            if not isinstance(text, str):
                raise AdapterInputError("errorText must be a string", f"{where}.parts[{j}].errorText")
            d = Decision(target_id=target, action="cancel", result={"error": text}, reason=text,
                         decision_id=decision_id(thread_id, target, "output-error", text))
        out.append(d)
    return out


def _user_content(m: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    """The new user message's content: its text, or (with `file` parts: `{mediaType, url,
    filename?}`, the url a `data:` URL or a link) agentlog content parts."""
    if isinstance(m.get("content"), str) and not m.get("parts"):
        return m["content"]  # the older `{role, content}` shape some transports still send
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(m.get("parts", [])):
        kind = p.get("type")
        if kind == "text":
            if not isinstance(p.get("text"), str):
                raise AdapterInputError("text must be a string", f"{where}.parts[{j}].text")
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "file":
            url, media, name = p.get("url"), p.get("mediaType"), p.get("filename")
            if not isinstance(url, str) or not isinstance(media, str) or not isinstance(name, (str, type(None))):
                raise AdapterInputError("a file part has a string url and mediaType", f"{where}.parts[{j}]")
            try:
                parts.append(data_url_part(url, media, name))
            except AdapterInputError as exc:
                raise AdapterInputError(str(exc), f"{where}.parts[{j}].url") from None
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    try:
        as_parts(parts)
    except ValueError as exc:
        raise AdapterInputError(str(exc), f"{where}.parts") from None
    return parts


def _approvals(thread_id: str, m: dict[str, Any], where: str) -> list[Decision]:
    found: dict[str, Decision] = {}
    for j, p in enumerate(m.get("parts", [])):
        kind = p.get("type")
        here = f"{where}.parts[{j}]"
        if kind == "tool-approval-response":
            target, approved, reason = p.get("approvalId"), p.get("approved"), p.get("reason")
        elif isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool") \
                and p.get("state") in ("approval-responded", "output-denied") \
                and isinstance(p.get("approval"), dict) and "approved" in p["approval"]:
            approval = p["approval"]
            target = p.get("toolCallId") if is_valid_id(p.get("toolCallId")) else approval.get("id")
            approved, reason = approval.get("approved"), approval.get("reason")
        else:
            continue
        if not is_valid_id(target):
            raise AdapterInputError("not a known approval id (approval ids are tool call ids)", here)
        if not isinstance(approved, bool):
            raise AdapterInputError("approved must be true or false", here)
        if reason is not None and not isinstance(reason, str):
            raise AdapterInputError("reason must be a string", here)
        d = Decision(target_id=target, decision_id=decision_id(thread_id, target, approved, reason),
                     action="resume" if approved else "cancel",
                     result={"approved": approved, **({"reason": reason} if reason else {})})
        if reason:
            d["reason"] = reason
        if target in found and found[target]["action"] != d["action"]:
            raise AdapterInputError(f"contradicting approvals for {target!r}", here)
        found[target] = d
    return list(found.values())


def check_approvals(request: AiSdkRequest, open_ids: Iterable[str]) -> list[Decision]:
    """Approvals must target open interrupts of the waiting run; a partial set is fine (the
    run replays what it can and keeps waiting for the rest, DESIGN 4.3)."""
    check_decisions(request.decisions, open_ids, require_all=False)
    return request.decisions
