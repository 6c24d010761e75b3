"""In-doubt tool calls: which interrupted calls must not run again, their ticket, its answers.

A call whose `ToolCallStarted` is in the log without its outcome was interrupted (its worker was
killed, its process stopped, its lease expired). A resumed run runs such a call again with the
same `call_id` when its tool is idempotent (the default). A tool declared `idempotent=False`
(`agentlog.runtime.tools.tool`) has an effect outside the log that must not happen twice, and
nobody knows whether it happened: the resumed run does not run it, it suspends it with an
in-doubt ticket (`SuspendTicket.action == "in_doubt"`) and the run waits for a human, who
answers with one of `IN_DOUBT_SCHEMA`'s three shapes:

- `{"action": "mark_done", "result": ...}`: the effect happened; `result` is recorded as the
  call's result and the run goes on;
- `{"action": "retry"}`: run it again, with the same `call_id` (the idempotency key the tool
  hands to whatever it calls);
- `{"action": "cancel"}`: the call completes cancelled and the model is told.

Pure: functions of a folded `RunContext` and the tools' declarations, so every process that
folds the same log takes the same path (DESIGN 4.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from agentlog.eventlog.events import IN_DOUBT_ACTION, JSON, SuspendTicket, ToolCallDecision
from agentlog.runtime.loop.run_context import RunContext
from agentlog.runtime.tools import Tool

#: The response schema of an in-doubt ticket: exactly one of the three answers.
IN_DOUBT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "object", "properties": {"action": {"const": "mark_done"}, "result": {}},
         "required": ["action", "result"], "additionalProperties": False},
        {"type": "object", "properties": {"action": {"const": "retry"}},
         "required": ["action"], "additionalProperties": False},
        {"type": "object", "properties": {"action": {"const": "cancel"}},
         "required": ["action"], "additionalProperties": False},
    ],
}

Resolution = Literal["mark_done", "retry", "cancel"]


def is_idempotent(tool: Tool | None) -> bool:
    """Whether a call of `tool` may run again after an interruption (unknown tools: yes, they
    never run anyway)."""
    return tool is None or tool.idempotent


def in_doubt_calls(ctx: RunContext, tools: Mapping[str, Tool]) -> list[str]:
    """The calls a run resumed from the log must not run again, in the model's order: started
    (`ctx.running`, every one of which a previous loop started) and not idempotent."""
    order = [c.id for c in ctx.step_tool_calls if c.id in ctx.running]
    order += [cid for cid in ctx.running if cid not in order]
    return [cid for cid in order if not is_idempotent(tools.get(ctx.running[cid]))]


def in_doubt_ticket(call_id: str, name: str, arguments: Mapping[str, JSON]) -> SuspendTicket:
    """The ticket of an in-doubt call: what was running, and the three answers it takes."""
    return SuspendTicket(
        id=call_id, action=IN_DOUBT_ACTION,
        message=(f"Tool {name!r} was running when its worker stopped, and it is not idempotent: whether its "
                 "effect happened is unknown. Answer mark_done (with its result), retry or cancel."),
        parameters={"tool": name, "arguments": dict(arguments)},
        response_schema=IN_DOUBT_SCHEMA, resume_mode="pass_decision_to_tool",
    )


def is_in_doubt(ticket: SuspendTicket | None) -> bool:
    return ticket is not None and ticket.action == IN_DOUBT_ACTION


def resolution(decision: ToolCallDecision) -> tuple[Resolution, JSON]:
    """What a decision on an in-doubt ticket asks for: ("mark_done", the result), ("retry",
    None) or ("cancel", None). A `cancel` decision (or anything not answering the ticket, which
    `hitl.check_result` refuses before it is recorded) cancels."""
    answer = decision.result
    if decision.action == "resume" and isinstance(answer, Mapping):
        if answer.get("action") == "mark_done":
            return "mark_done", answer.get("result")
        if answer.get("action") == "retry":
            return "retry", None
    return "cancel", None


__all__ = ["IN_DOUBT_SCHEMA", "Resolution", "in_doubt_calls", "in_doubt_ticket", "is_idempotent", "is_in_doubt",
           "resolution"]
