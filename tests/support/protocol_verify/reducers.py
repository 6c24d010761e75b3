"""Client-side reducers: what the official clients make of a stream, ported from their sources
(`@ag-ui/client` 1.0.0 `defaultApplyEvents`, `ai` 6.x `processUIMessageStream` +
`AbstractChat`), reduced to the parts that decide the final messages and state. The property
and route tests apply a stream with these and compare with the server's GET views; the Node
check (`test_protocol_clients.py`) runs the real packages for the same comparison.

Where a client only logs a warning (a delta for an unknown message, a patch that does not
apply), the reducers record it in `problems`: for our streams that is always a defect.

`normalise_agui` / `normalise_aisdk` define what "equal" means (documented here once):
* AG-UI: activity messages are client-only (tool progress) and dropped; an assistant message's
  empty content / empty toolCalls are absent; tool call arguments compare as parsed JSON.
* AI SDK: `providerExecuted`/`title`/`rawInput`/`preliminary`/`providerMetadata` and undefined
  fields are dropped; text parts compare by text; a tool part's `approval` compares by `id`
  only, and not at all once the call has its output (`output-available`/`output-error`): no
  stream part carries the human's `approved`/`reason`, so only the client that answered and
  the server's history know them, and a replayed (resume-stream) message has none.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

# -- AG-UI ---------------------------------------------------------------------------------------


@dataclass
class AguiClient:
    """`@ag-ui/client` state after applying events: `messages` (wire dicts) and `state`."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    state: Any = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    pending_interrupts: list[dict[str, Any]] = field(default_factory=list)
    pending_tool_call_ids: list[str] = field(default_factory=list)

    def _find(self, mid: str) -> dict[str, Any] | None:
        return next((m for m in self.messages if m.get("id") == mid), None)

    def _holder(self, call_id: str) -> dict[str, Any] | None:
        return next((m for m in self.messages
                     if any(c["id"] == call_id for c in m.get("toolCalls") or ())), None)

    def apply(self, event: Any, *, snapshots: bool = True) -> None:
        """One event (model or wire dict). `snapshots=False` skips MESSAGES_SNAPSHOT, to check
        what the client shows while the run streams (before the snapshot repairs anything)."""
        e = event if isinstance(event, dict) else event.model_dump(mode="json", by_alias=True, exclude_none=True)
        t = e["type"]
        if t == "RUN_STARTED":
            for m in (e.get("input") or {}).get("messages") or ():
                if self._find(m["id"]) is None:
                    self.messages.append(copy.deepcopy(m))
        elif t == "TEXT_MESSAGE_START":
            if self._find(e["messageId"]) is None:
                self.messages.append({"id": e["messageId"], "role": e.get("role", "assistant"), "content": ""})
        elif t == "TEXT_MESSAGE_CONTENT":
            m = self._find(e["messageId"])
            if m is None:
                self.problems.append(f"TEXT_MESSAGE_CONTENT: no message {e['messageId']}")
            else:
                m["content"] = (m.get("content") or "") + e["delta"]
        elif t == "REASONING_MESSAGE_START":
            if self._find(e["messageId"]) is None:
                self.messages.append({"id": e["messageId"], "role": "reasoning", "content": ""})
        elif t == "REASONING_MESSAGE_CONTENT":
            m = self._find(e["messageId"])
            if m is None:
                self.problems.append(f"REASONING_MESSAGE_CONTENT: no message {e['messageId']}")
            else:
                m["content"] = (m.get("content") or "") + e["delta"]
        elif t == "TOOL_CALL_START":
            if self._holder(e["toolCallId"]) is not None:
                return
            parent = e.get("parentMessageId")
            holder = self._find(parent) if parent else None
            if holder is None or holder.get("role") != "assistant":
                holder = {"id": parent if parent and holder is None else e["toolCallId"],
                          "role": "assistant", "toolCalls": []}
                self.messages.append(holder)
            holder.setdefault("toolCalls", []).append(
                {"id": e["toolCallId"], "type": "function",
                 "function": {"name": e["toolCallName"], "arguments": ""}})
        elif t == "TOOL_CALL_ARGS":
            m = self._holder(e["toolCallId"])
            if m is None:
                self.problems.append(f"TOOL_CALL_ARGS: no tool call {e['toolCallId']}")
                return
            call = next(c for c in m["toolCalls"] if c["id"] == e["toolCallId"])
            call["function"]["arguments"] += e["delta"]
        elif t == "TOOL_CALL_RESULT":
            msg = {"id": e["messageId"], "toolCallId": e["toolCallId"], "role": e.get("role") or "tool",
                   "content": e["content"]}
            at = next((i for i, m in enumerate(self.messages) if m.get("role") == "assistant"
                       and any(c["id"] == e["toolCallId"] for c in m.get("toolCalls") or ())), None)
            if at is None:
                self.messages.append(msg)
            else:
                j = at + 1
                while j < len(self.messages) and self.messages[j].get("role") == "tool":
                    j += 1
                self.messages.insert(j, msg)
        elif t == "STATE_SNAPSHOT":
            self.state = copy.deepcopy(e["snapshot"])
        elif t == "STATE_DELTA":
            try:
                self.state = jsonpatch.apply_patch(self.state, e["delta"])
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                self.problems.append(f"STATE_DELTA does not apply: {exc}")
        elif t == "MESSAGES_SNAPSHOT" and snapshots:
            snap = {m["id"]: m for m in e["messages"]}
            # the client keeps its reasoning messages only when the snapshot carries none
            has_reasoning = any(m.get("role") == "reasoning" for m in e["messages"])
            kept = [copy.deepcopy(snap.get(m["id"], m)) for m in self.messages
                    if m["id"] in snap or m.get("role") == "activity"
                    or (m.get("role") == "reasoning" and not has_reasoning)]
            have = {m["id"] for m in kept}
            self.messages = kept + [copy.deepcopy(m) for m in e["messages"] if m["id"] not in have]
        elif t == "ACTIVITY_SNAPSHOT":
            m = self._find(e["messageId"])
            if m is None:
                self.messages.append({"id": e["messageId"], "role": "activity", "content": e["content"]})
            else:
                m["content"] = e["content"]
        elif t == "RUN_FINISHED":
            outcome = e.get("outcome") or {}
            self.pending_interrupts = list(outcome.get("interrupts") or ()) if outcome.get("type") == "interrupt" else []
            self.pending_tool_call_ids = list(outcome.get("pendingToolCallIds") or ())

    def apply_all(self, events: list[Any], *, snapshots: bool = True) -> AguiClient:
        for ev in events:
            self.apply(ev, snapshots=snapshots)
        return self


def normalise_agui(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "activity":
            continue
        n: dict[str, Any] = {"id": m["id"], "role": m["role"]}
        if m.get("content"):
            n["content"] = m["content"]
        if m.get("toolCalls"):
            n["toolCalls"] = [{"id": c["id"], "name": c["function"]["name"],
                               "arguments": _json_or_text(c["function"]["arguments"])} for c in m["toolCalls"]]
        if m.get("toolCallId"):
            n["toolCallId"] = m["toolCallId"]
        out.append(n)
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- AI SDK --------------------------------------------------------------------------------------


class UiStreamFailure(AssertionError):
    """What `processUIMessageStream` throws (e.g. "No tool invocation found")."""


@dataclass
class AiSdkChat:
    """`AbstractChat` messages after requests: each response stream continues the last message
    when it is the assistant's (same id), else adds one; `resume=True` (resume-stream with a
    replaying transport) resets the message at the first `start`."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def receive(self, parts: list[dict[str, Any]], *, new_id: str = "client-generated",
                resume: bool = False) -> None:
        last = self.messages[-1] if self.messages else None
        message = copy.deepcopy(last) if last is not None and last["role"] == "assistant" else \
            {"id": new_id, "role": "assistant", "parts": []}
        active: dict[str, dict[str, Any]] = {}
        written = False
        first_start = True
        step_from = _last_step_start(message["parts"])
        for p in parts:
            t = p["type"]
            if t == "start":
                if resume and first_start:
                    message = {"id": p.get("messageId") or message["id"], "role": "assistant", "parts": []}
                    step_from, active, written = 0, {}, True
                first_start = False
                if p.get("messageId"):
                    message["id"] = p["messageId"]
                    written = True
            elif t == "start-step":
                message["parts"].append({"type": "step-start"})
                step_from = len(message["parts"]) - 1
            elif t == "finish-step":
                active = {}
            elif t == "text-start":
                part = {"type": "text", "text": "", "state": "streaming"}
                active[p["id"]] = part
                message["parts"].append(part)
                written = True
            elif t == "reasoning-start":
                part = {"type": "reasoning", "text": "", "state": "streaming"}
                active[p["id"]] = part
                message["parts"].append(part)
                written = True
            elif t in ("text-delta", "text-end", "reasoning-delta", "reasoning-end"):
                part = active.get(p["id"])
                if part is None:
                    raise UiStreamFailure(f"{t} for missing {t.split('-')[0]} part {p['id']}")
                if t.endswith("-delta"):
                    part["text"] += p["delta"]
                else:
                    part["state"] = "done"
                    del active[p["id"]]
            elif t in ("tool-input-start", "tool-input-available"):
                tool = _tool(message, step_from, p["toolCallId"])
                if tool is None:
                    tool = {"type": f"tool-{p['toolName']}", "toolCallId": p["toolCallId"]}
                    message["parts"].append(tool)
                tool["state"] = "input-streaming" if t == "tool-input-start" else "input-available"
                tool["input"] = p.get("input")
                written = True
            elif t in ("tool-approval-request", "tool-output-denied", "tool-output-available", "tool-output-error"):
                tool = _tool(message, step_from, p["toolCallId"])
                if tool is None:
                    raise UiStreamFailure(f"No tool invocation found for tool call ID {p['toolCallId']}")
                if t == "tool-approval-request":
                    tool.update(state="approval-requested", approval={"id": p["approvalId"]})
                elif t == "tool-output-denied":
                    tool["state"] = "output-denied"
                elif t == "tool-output-available":
                    tool.update(state="output-available", output=p["output"])
                else:
                    tool.update(state="output-error", errorText=p["errorText"])
            elif t == "error":
                self.errors.append(p["errorText"])
            elif t.startswith("data-") and not p.get("transient"):
                message["parts"].append(copy.deepcopy(p))
                written = True
        if not written:
            return
        if last is not None and last["id"] == message["id"]:
            self.messages[-1] = message
        else:
            self.messages.append(message)


def _last_step_start(parts: list[dict[str, Any]]) -> int:
    idx = [i for i, p in enumerate(parts) if p["type"] == "step-start"]
    return idx[-1] if idx else 0


def _tool(message: dict[str, Any], step_from: int, call_id: str) -> dict[str, Any] | None:
    """Tool parts are looked up in the current step only (as `getCurrentStepParts()` does)."""
    return next((p for p in message["parts"][step_from:] if p.get("toolCallId") == call_id), None)


_TOOL_KEYS = ("type", "toolCallId", "state", "input", "output", "errorText")


def normalise_aisdk(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        for p in m["parts"]:
            if p["type"] in ("text", "reasoning"):
                parts.append({"type": p["type"], "text": p["text"]})
            elif p["type"] == "step-start":
                parts.append({"type": "step-start"})
            elif "toolCallId" in p:
                n = {k: p[k] for k in _TOOL_KEYS if p.get(k) is not None}
                if p.get("approval") and p.get("state") not in ("output-available", "output-error"):
                    n["approval"] = p["approval"]["id"]
                parts.append(n)
            else:
                parts.append({k: v for k, v in p.items() if k != "transient"})
        out.append({"id": m["id"], "role": m["role"], "parts": parts})
    return out


__all__ = ["AguiClient", "AiSdkChat", "UiStreamFailure", "normalise_agui", "normalise_aisdk"]
