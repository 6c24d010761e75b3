"""AG-UI stream verifier, shared by the adapter, route and property tests.

Mirrors the upstream TS `verify.ts` rules and the interrupt contract, a little stricter where our
producer can afford it (a stream is one run; ids are never reused; deltas are never empty):
* the first event is RUN_STARTED (or RUN_ERROR); nothing follows RUN_FINISHED / RUN_ERROR;
* TEXT_MESSAGE_* / REASONING_MESSAGE_* / REASONING_START..END per messageId and TOOL_CALL_* per toolCallId: START before CONTENT/ARGS/END,
  no START while the same id is open; TOOL_CALL_RESULT never while its call's args are open;
* STEP_FINISHED needs a started step of that name;
* RUN_FINISHED only with no open message, tool call or step, and with the RUN_STARTED ids;
* an interrupt outcome comes after STATE_SNAPSHOT and MESSAGES_SNAPSHOT (taken after the last
  STATE_DELTA), with unique interrupt ids and `toolCallId` on every `tool_call` interrupt;
* STATE_DELTA patches apply to the state known from the last snapshot;
* every payload validates against the installed ag-ui-protocol models, with no unknown fields.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import jsonpatch
import pydantic
from ag_ui import core as ag

_EVENT = pydantic.TypeAdapter(ag.Event)


class AguiStreamError(AssertionError):
    """The stream breaks a rule; names the event index and type."""

    def __init__(self, index: int, kind: str, message: str) -> None:
        self.index = index
        self.kind = kind
        super().__init__(f"event {index} ({kind}): {message}")


def parse_sse(text: str) -> list[dict[str, Any]]:
    """`data: <json>` frames (as `EventEncoder.encode` writes them) back to dicts."""
    out: list[dict[str, Any]] = []
    for frame in text.split("\n\n"):
        data = [line[5:].lstrip(" ") for line in frame.split("\n") if line.startswith("data:")]
        if data:
            out.append(json.loads("\n".join(data)))
    return out


def _validate(index: int, ev: Any) -> Any:
    raw = ev.model_dump(mode="json", by_alias=True) if isinstance(ev, pydantic.BaseModel) else ev
    kind = raw.get("type", "?") if isinstance(raw, dict) else "?"
    try:
        model = _EVENT.validate_python(raw)
    except pydantic.ValidationError as exc:
        raise AguiStreamError(index, kind, f"does not validate: {exc.errors()[0]}") from None
    extra = set(model.model_extra or ())
    if extra:
        raise AguiStreamError(index, kind, f"unknown field(s) {sorted(extra)}")
    return model


def verify_agui_stream(events: Iterable[Any], *, require_end: bool = True) -> list[Any]:
    """Check one run's AG-UI events (models or wire dicts); return them as validated models.
    Raises `AguiStreamError` at the first broken rule."""
    out: list[Any] = []
    ids: tuple[str, str] | None = None
    ended = False
    messages_open: set[str] = set()
    messages_seen: set[str] = set()
    calls_open: set[str] = set()
    calls_seen: set[str] = set()
    steps_open: set[str] = set()
    reasoning_open: set[str] = set()       # REASONING_START..END spans
    reasoning_msgs_open: set[str] = set()  # REASONING_MESSAGE_START..END
    reasoning_seen: set[str] = set()
    state: Any = None
    state_known = False
    fresh_state = fresh_messages = False
    T = ag.EventType
    for i, raw in enumerate(events):
        ev = _validate(i, raw)
        out.append(ev)
        t = ev.type
        name = t.value

        def fail(msg: str) -> None:
            raise AguiStreamError(i, name, msg)  # noqa: B023  (used within this iteration)

        if ended:
            fail("nothing may follow RUN_FINISHED / RUN_ERROR")
        if i == 0 and t not in (T.RUN_STARTED, T.RUN_ERROR):
            fail("the first event must be RUN_STARTED")
        if t == T.RUN_STARTED:
            if ids is not None:
                fail("RUN_STARTED while a run is active")
            ids = (ev.thread_id, ev.run_id)
        elif t == T.TEXT_MESSAGE_START:
            if ev.message_id in messages_seen:
                fail(f"message {ev.message_id!r} started twice")
            messages_open.add(ev.message_id)
            messages_seen.add(ev.message_id)
        elif t in (T.TEXT_MESSAGE_CONTENT, T.TEXT_MESSAGE_END):
            if ev.message_id not in messages_open:
                fail(f"message {ev.message_id!r} is not open (no TEXT_MESSAGE_START, or ended)")
            if t == T.TEXT_MESSAGE_CONTENT and not ev.delta:
                fail("empty delta")
            if t == T.TEXT_MESSAGE_END:
                messages_open.discard(ev.message_id)
        elif t == T.REASONING_START:
            if ev.message_id in reasoning_seen:
                fail(f"reasoning {ev.message_id!r} started twice")
            reasoning_open.add(ev.message_id)
            reasoning_seen.add(ev.message_id)
        elif t == T.REASONING_MESSAGE_START:
            if ev.message_id not in reasoning_open or ev.message_id in reasoning_msgs_open:
                fail(f"reasoning message {ev.message_id!r} outside its span, or started twice")
            reasoning_msgs_open.add(ev.message_id)
        elif t in (T.REASONING_MESSAGE_CONTENT, T.REASONING_MESSAGE_END):
            if ev.message_id not in reasoning_msgs_open:
                fail(f"reasoning message {ev.message_id!r} is not open")
            if t == T.REASONING_MESSAGE_CONTENT and not ev.delta:
                fail("empty delta")
            if t == T.REASONING_MESSAGE_END:
                reasoning_msgs_open.discard(ev.message_id)
        elif t == T.REASONING_END:
            if ev.message_id not in reasoning_open or ev.message_id in reasoning_msgs_open:
                fail(f"reasoning {ev.message_id!r} is not open, or its message is")
            reasoning_open.discard(ev.message_id)
        elif t == T.TOOL_CALL_START:
            if ev.tool_call_id in calls_seen:
                fail(f"tool call {ev.tool_call_id!r} started twice")
            calls_open.add(ev.tool_call_id)
            calls_seen.add(ev.tool_call_id)
        elif t in (T.TOOL_CALL_ARGS, T.TOOL_CALL_END):
            if ev.tool_call_id not in calls_open:
                fail(f"tool call {ev.tool_call_id!r} is not open (no TOOL_CALL_START, or ended)")
            if t == T.TOOL_CALL_END:
                calls_open.discard(ev.tool_call_id)
        elif t == T.TOOL_CALL_RESULT:
            if ev.tool_call_id in calls_open:
                fail(f"result for tool call {ev.tool_call_id!r} before its TOOL_CALL_END")
        elif t == T.STEP_STARTED:
            if ev.step_name in steps_open:
                fail(f"step {ev.step_name!r} is already running")
            steps_open.add(ev.step_name)
        elif t == T.STEP_FINISHED:
            if ev.step_name not in steps_open:
                fail(f"step {ev.step_name!r} was not started")
            steps_open.discard(ev.step_name)
        elif t == T.STATE_SNAPSHOT:
            state, state_known, fresh_state = copy.deepcopy(ev.snapshot), True, True
        elif t == T.STATE_DELTA:
            fresh_state = False
            if state_known:
                ops = [op.model_dump(mode="json", by_alias=True) for op in ev.delta]
                try:
                    state = jsonpatch.apply_patch(state, ops)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    fail(f"patch does not apply to the state: {exc}")
        elif t == T.MESSAGES_SNAPSHOT:
            fresh_messages = True
        elif t in (T.RUN_FINISHED, T.RUN_ERROR):
            if t == T.RUN_FINISHED:
                if messages_open or calls_open or steps_open or reasoning_open:
                    fail(f"run finished with open messages {sorted(messages_open)}, tool calls "
                         f"{sorted(calls_open)}, steps {sorted(steps_open)}")
                if ids is not None and (ev.thread_id, ev.run_id) != ids:
                    fail(f"ids {(ev.thread_id, ev.run_id)} differ from RUN_STARTED's {ids}")
                outcome = ev.outcome
                if outcome is not None and outcome.model_extra:
                    fail(f"unknown outcome field(s) {sorted(outcome.model_extra)}")
                if outcome is not None and outcome.type == "interrupt":
                    if not (fresh_state and fresh_messages):
                        fail("an interrupt must follow STATE_SNAPSHOT and MESSAGES_SNAPSHOT")
                    seen: set[str] = set()
                    for it in outcome.interrupts:
                        if it.id in seen:
                            fail(f"interrupt id {it.id!r} twice")
                        seen.add(it.id)
                        if it.reason == "tool_call" and not it.tool_call_id:
                            fail(f"tool_call interrupt {it.id!r} has no toolCallId")
                        if it.reason.startswith("core:"):
                            fail(f"reason {it.reason!r}: the core: prefix is reserved")
                        if it.model_extra:
                            fail(f"unknown interrupt field(s) {sorted(it.model_extra)}")
            ended = True
    if not out:
        raise AguiStreamError(0, "-", "empty stream")
    if require_end and not ended:
        raise AguiStreamError(len(out) - 1, out[-1].type.value, "the stream ends without RUN_FINISHED / RUN_ERROR")
    return out


def event_types(events: Iterable[Any]) -> list[str]:
    """The wire type names of a stream (for exact-sequence assertions)."""
    return [(e["type"] if isinstance(e, dict) else e.type.value) for e in events]
