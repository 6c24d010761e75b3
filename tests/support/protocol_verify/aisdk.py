"""AI SDK v6 UI message stream verifier, shared by the adapter, route and property tests.

Part shapes mirror `uiMessageChunkSchema` (vercel/ai `ui-message-chunks.ts`): strict objects, so
an unknown field is an error, as it is for the client's zod parse. Ordering mirrors what
`processUIMessageStream` needs: `start` first; text deltas/ends only for an open text id; tool
input before its approval request or output; `finish-step` with no open text; nothing after
`finish`/`abort` (an `error` may only be followed by `finish`); SSE ends with `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

_ANY = object()
_OBJ = dict
_FINISH_REASONS = ("stop", "length", "content-filter", "tool-calls", "error", "other")

#: type -> (required fields, optional fields); value = python type, or _ANY for `unknown`.
SCHEMA: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "text-start": ({"id": str}, {"providerMetadata": _OBJ}),
    "text-delta": ({"id": str, "delta": str}, {"providerMetadata": _OBJ}),
    "text-end": ({"id": str}, {"providerMetadata": _OBJ}),
    "reasoning-start": ({"id": str}, {"providerMetadata": _OBJ}),
    "reasoning-delta": ({"id": str, "delta": str}, {"providerMetadata": _OBJ}),
    "reasoning-end": ({"id": str}, {"providerMetadata": _OBJ}),
    "error": ({"errorText": str}, {}),
    "tool-input-start": ({"toolCallId": str, "toolName": str},
                         {"providerExecuted": bool, "providerMetadata": _OBJ, "dynamic": bool,
                          "title": str, "_meta": _OBJ}),
    "tool-input-delta": ({"toolCallId": str, "inputTextDelta": str}, {}),
    "tool-input-available": ({"toolCallId": str, "toolName": str, "input": _ANY},
                             {"providerExecuted": bool, "providerMetadata": _OBJ, "dynamic": bool,
                              "title": str, "_meta": _OBJ}),
    "tool-input-error": ({"toolCallId": str, "toolName": str, "input": _ANY, "errorText": str},
                         {"providerExecuted": bool, "providerMetadata": _OBJ, "dynamic": bool, "title": str}),
    "tool-approval-request": ({"approvalId": str, "toolCallId": str}, {}),
    "tool-output-available": ({"toolCallId": str, "output": _ANY},
                              {"providerExecuted": bool, "dynamic": bool, "preliminary": bool}),
    "tool-output-error": ({"toolCallId": str, "errorText": str}, {"providerExecuted": bool, "dynamic": bool}),
    "tool-output-denied": ({"toolCallId": str}, {}),
    "source-url": ({"sourceId": str, "url": str}, {"title": str, "providerMetadata": _OBJ}),
    "source-document": ({"sourceId": str, "mediaType": str, "title": str},
                        {"filename": str, "providerMetadata": _OBJ}),
    "file": ({"url": str, "mediaType": str}, {"providerMetadata": _OBJ}),
    "start-step": ({}, {}),
    "finish-step": ({}, {}),
    "start": ({}, {"messageId": str, "messageMetadata": _ANY}),
    "finish": ({}, {"finishReason": str, "messageMetadata": _ANY}),
    "abort": ({}, {"reason": str}),
    "message-metadata": ({"messageMetadata": _ANY}, {}),
}
_DATA = ({"data": _ANY}, {"id": str, "transient": bool})


class UiStreamError(AssertionError):
    def __init__(self, index: int, kind: str, message: str) -> None:
        self.index = index
        self.kind = kind
        super().__init__(f"part {index} ({kind}): {message}")


def parse_ui_sse(text: str) -> tuple[list[dict[str, Any]], bool]:
    """SSE frames -> (parts, ended_with_done). `[DONE]` anywhere but last is an error."""
    parts: list[dict[str, Any]] = []
    done = False
    for frame in text.split("\n\n"):
        lines = [ln[5:].lstrip(" ") for ln in frame.split("\n") if ln.startswith("data:")]
        if not lines:
            continue
        if done:
            raise UiStreamError(len(parts), "-", "data after [DONE]")
        data = "\n".join(lines)
        if data == "[DONE]":
            done = True
            continue
        parts.append(json.loads(data))
    return parts, done


def check_part(index: int, part: Any) -> None:
    """One part against the v6 chunk schema (strict)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise UiStreamError(index, "?", "a part is an object with a string type")
    kind = part["type"]
    if kind.startswith("data-"):
        required, optional = _DATA
    elif kind in SCHEMA:
        required, optional = SCHEMA[kind]
    else:
        raise UiStreamError(index, kind, "unknown part type")
    for key in required:
        if key not in part:
            raise UiStreamError(index, kind, f"missing {key!r}")
    for key, value in part.items():
        if key == "type":
            continue
        typ = required.get(key, optional.get(key))
        if typ is None:
            raise UiStreamError(index, kind, f"unknown field {key!r} (the schema is strict)")
        if typ is not _ANY and not (isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))):
            raise UiStreamError(index, kind, f"{key!r} must be {typ.__name__}")
    if kind == "finish" and "finishReason" in part and part["finishReason"] not in _FINISH_REASONS:
        raise UiStreamError(index, kind, f"finishReason must be one of {_FINISH_REASONS}")


def verify_ui_stream(
    parts: Iterable[Any] | str, *, require_end: bool = True, known_tool_calls: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Check a UI message stream (parts, or the SSE text, which must end with `[DONE]`).
    `known_tool_calls`: calls the client already has from an earlier stream (a resumed turn)."""
    if isinstance(parts, str):
        parts, done = parse_ui_sse(parts)
        if not done:
            raise UiStreamError(len(parts), "-", "the SSE stream does not end with data: [DONE]")
    out = list(parts)
    open_text: set[str] = set()
    used_text: set[str] = set()
    open_reasoning: set[str] = set()
    used_reasoning: set[str] = set()
    started_calls: set[str] = set()
    available: set[str] = set(known_tool_calls)
    answered: set[str] = set()
    in_step = False
    ended = False
    errored = False
    for i, p in enumerate(out):
        check_part(i, p)
        kind = p["type"]

        def fail(msg: str) -> None:
            raise UiStreamError(i, kind, msg)  # noqa: B023  (used within this iteration)

        if ended:
            fail("nothing may follow finish / abort")
        if errored and kind != "finish":
            fail("only finish may follow error")
        if i == 0 and kind != "start":
            fail("the first part must be start")
        if kind == "start" and i != 0:
            fail("start twice")
        elif kind == "start-step":
            if in_step:
                fail("start-step inside an open step")
            in_step = True
        elif kind == "finish-step":
            if not in_step:
                fail("finish-step without start-step")
            if open_text or open_reasoning:
                fail(f"finish-step with open text {sorted(open_text)} / reasoning {sorted(open_reasoning)}")
            in_step = False
        elif kind == "text-start":
            if p["id"] in used_text:
                fail(f"text id {p['id']!r} reused")
            open_text.add(p["id"])
            used_text.add(p["id"])
        elif kind in ("text-delta", "text-end"):
            if p["id"] not in open_text:
                fail(f"text {p['id']!r} is not open")
            if kind == "text-end":
                open_text.discard(p["id"])
        elif kind == "reasoning-start":
            if p["id"] in used_reasoning:
                fail(f"reasoning id {p['id']!r} reused")
            open_reasoning.add(p["id"])
            used_reasoning.add(p["id"])
        elif kind in ("reasoning-delta", "reasoning-end"):
            if p["id"] not in open_reasoning:
                fail(f"reasoning {p['id']!r} is not open")
            if kind == "reasoning-end":
                open_reasoning.discard(p["id"])
        elif kind == "tool-input-start":
            if p["toolCallId"] in started_calls or p["toolCallId"] in available:
                fail(f"tool call {p['toolCallId']!r} started twice")
            started_calls.add(p["toolCallId"])
        elif kind == "tool-input-delta":
            if p["toolCallId"] not in started_calls or p["toolCallId"] in available:
                fail(f"input delta for {p['toolCallId']!r} outside tool-input-start..available")
        elif kind == "tool-input-available":
            if p["toolCallId"] in available:
                fail(f"input of {p['toolCallId']!r} available twice")
            available.add(p["toolCallId"])
        elif kind in ("tool-approval-request", "tool-output-available", "tool-output-error", "tool-output-denied"):
            if p["toolCallId"] not in available:
                fail(f"tool call {p['toolCallId']!r} has no tool-input-available before this")
            if kind != "tool-approval-request":
                if p["toolCallId"] in answered:
                    fail(f"tool call {p['toolCallId']!r} has two outputs")
                answered.add(p["toolCallId"])
        elif kind == "error":
            errored = True
        elif kind in ("finish", "abort"):
            if open_text:
                fail(f"{kind} with open text {sorted(open_text)}")
            if in_step and kind == "finish":
                fail("finish inside an open step")
            ended = True
    if not out:
        raise UiStreamError(0, "-", "empty stream")
    if require_end and not ended:
        raise UiStreamError(len(out) - 1, out[-1].get("type", "?"), "the stream ends without finish / abort")
    return out


def part_types(parts: Iterable[dict[str, Any]]) -> list[str]:
    return [p["type"] for p in parts]
