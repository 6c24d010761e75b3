"""Pure views for humans and scripts: one-line event summaries and the `replay` report of a run.

No I/O here: everything is computed from the `StoredCommit`s the caller read from the log, so the
report of a run is a function of the log alone (the point of `agentlog replay`), and the tests can
check it without a terminal. Rendering (rich, JSON) lives in `agentlog.cli.core`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import msgspec

from agentlog.eventlog.errors import AgentlogError
from agentlog.eventlog.events import (
    AgentHandedOff,
    AnyEvent,
    CommitQuarantined,
    InferenceCompleted,
    InferenceReplaced,
    MessageAppended,
    MessageQueued,
    Position,
    RunFinished,
    StateCleared,
    StateConflicted,
    StatePatched,
    StateReplaced,
    StateWritten,
    StepFinished,
    StepStarted,
    StoredCommit,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallGated,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.eventlog.quarantine import is_quarantined, quarantined_run
from agentlog.projections.fold import fold_commits
from agentlog.projections.timetravel import run_at, states_along
from agentlog.projections.views import RunView

#: An index past the end of any commit: `Position(seq, END)` means "all of commit seq".
_END = 2**31


class UnknownRun(AgentlogError, LookupError):
    """The log holds no commit of this run."""

    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}: the log holds no commit of it")


class InvalidEventId(AgentlogError, ValueError):
    """An event id that is not `<seq>:<index>` (or a bare `<seq>`)."""

    code = "invalid_event_id"


def parse_event_id(text: str) -> Position:
    """`Position.parse` with the typed error the CLI maps to a usage error."""
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise InvalidEventId(str(exc)) from None


#: `warning.code` of an answer given as of the end because the asked position is after it.
POSITION_PAST_END = "position_past_end"


def last_position(commits: Sequence[StoredCommit]) -> Position | None:
    """The position of the last event of `commits` (None: no event)."""
    for stored in reversed(commits):
        if stored.commit.events:
            return Position(stored.seq, len(stored.commit.events) - 1)
    return None


def within(commits: Sequence[StoredCommit], position: Position) -> tuple[Position, dict[str, str] | None]:
    """`position`, or the last event of `commits` when `position` is after it, with the warning
    the answer then carries.

    Why the end and not a 400: time travel past the last event has one true answer, the state
    as of the end (nothing happened since), so a client that asks for "now" with a large id gets
    it, and the warning tells it the answer is not for the position it named. Every time-travel read (`replay --to`, the inspector's timeline `to`, a thread's `state?at=`)
    goes through here, so they all answer the same way; a malformed id stays a 400."""
    last = last_position(commits)
    if last is None or position <= last:
        return position, None
    return last, {"code": POSITION_PAST_END, "requested": str(position), "end": str(last),
                  "message": f"event id {position} is after the last event of the thread ({last}): "
                             "answered as of that event"}


# -- one event ------------------------------------------------------------------------------------


def excerpt(value: Any, limit: int = 80) -> str:
    """A short single-line rendering of any JSON value (strings unquoted)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_data(event: AnyEvent) -> dict[str, Any]:
    """The event as plain JSON (its wire form, with the `type` tag)."""
    return msgspec.to_builtins(event)


def learn_call_names(event: AnyEvent, names: dict[str, str]) -> None:
    """Remember tool names by call id, so gate verdicts, suspensions, decisions and outcomes
    (which carry only the call id) can be shown with the tool they are about."""
    if isinstance(event, ToolCallStarted):
        names[event.call_id] = event.name
    elif isinstance(event, MessageAppended) and event.message.tool_calls:
        for call in event.message.tool_calls:
            names.setdefault(call.id, call.name)


def one_line(text: str) -> str:
    """`text` on one line (whitespace runs collapsed), whole."""
    return " ".join(text.split())


def event_summary(event: AnyEvent, call_names: dict[str, str] | None = None) -> str:
    """The key fields of an event on one line: what a human scans for in a timeline. Long values
    are cut (`excerpt`), except a run's termination: why a run failed is shown whole."""
    names = call_names or {}
    match event:
        case MessageAppended(message=m):
            parts = [f"{m.role}: {excerpt(m.content)!s}" if m.content else m.role]
            if m.tool_calls:
                parts.append("calls " + ", ".join(f"{c.name}({excerpt(c.arguments, 40)})" for c in m.tool_calls))
            if m.tool_call_id:
                parts.append(f"for {m.tool_call_id}")
            if m.visibility != "all":
                parts.append(f"[{m.visibility}]")
            return " ".join(parts)
        case MessageQueued(message=m, mode=mode):
            return f"{mode} queued: {m.role}: {excerpt(m.content)!s} id={m.id}"
        case ToolCallStarted(call_id=cid, name=name, arguments=args):
            return f"{name}({excerpt(args, 60)}) call={cid}"
        case ToolCallCompleted(call_id=cid, outcome=outcome, result=result):
            name = names.get(cid, "?")
            return f"{name} {outcome}: {excerpt(result, 60)} call={cid}"
        case ToolCallGated(call_id=cid, verdict=verdict, rule=rule):
            return f"{names.get(cid, '?')} gate={verdict}" + (f" rule={rule}" if rule else "") + f" call={cid}"
        case ToolCallSuspended(call_id=cid, ticket=ticket):
            msg = f" {excerpt(ticket.message, 50)!s}" if ticket.message else ""
            return f"{names.get(cid, '?')} suspended: {ticket.action}{msg} ticket={ticket.id} call={cid}"
        case ToolCallDecided(call_id=cid, decision=d):
            reason = f" reason={excerpt(d.reason, 40)}" if d.reason else ""
            return f"{names.get(cid, '?')} decided {d.action}: {excerpt(d.result, 40)}{reason} call={cid}"
        case InferenceReplaced(message_id=mid, step=step):
            return f"answer replaced (no model asked) step={step} message={mid}"
        case InferenceCompleted(model=model, usage=usage, stop_reason=stop):
            return f"{model} in={usage.input_tokens} out={usage.output_tokens}" + (f" stop={stop}" if stop else "")
        case RunFinished(termination=t, usage=usage):
            detail = "".join(f" {k}={one_line(v)}" for k, v in (("code", t.code), ("detail", t.detail)) if v)
            return f"{t.type}{detail} in={usage.input_tokens} out={usage.output_tokens}"
        case AgentHandedOff(from_agent=src, to_agent=dst, reason=reason):
            return f"handoff {src} -> {dst}" + (f": {excerpt(reason, 60)}" if reason else "")
        case CommitQuarantined(code=code, reason=reason, size=size, sha256=digest):
            return f"QUARANTINED undecodable message ({code}, {size} bytes, sha256 {digest[:12]}): {excerpt(reason, 80)}"
        case StatePatched(ops=ops, scope=scope):
            shown = "; ".join(
                f"{op.get('op')} {op.get('path')}" + (f"={excerpt(op['value'], 30)}" if "value" in op else "")
                for op in ops
            )
            return f"{scope}: {shown}"
        case StateWritten(key=key, ops=ops, scope=scope, merge=merge, action=action):
            shown = "; ".join(
                f"{op.get('op')} {op.get('path')}" + (f"={excerpt(op['value'], 30)}" if "value" in op else "")
                for op in ops
            )
            reduced = f" action={excerpt(action, 40)}" if action is not None else ""
            return f"{scope} key {key} ({merge}){reduced}: {shown}"
        case StateCleared(scope=scope, keys=keys, call_id=cid):
            return f"{scope} cleared: {', '.join(keys)}" + (f" call={cid}" if cid else "")
        case StateConflicted(key=key, path=path, writer=writer, with_writer=other, resolution=resolution):
            return f"conflict on {key} {path}: {writer} vs {other} -> {resolution}"
        case _:
            data = event_data(event)
            data.pop("type", None)
            return " ".join(f"{k}={excerpt(v, 60)}" for k, v in data.items())


# -- replay ---------------------------------------------------------------------------------------


@dataclass
class TimelineEvent:
    position: Position
    event: AnyEvent
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {"id": str(self.position), "type": type(self.event).__name__, "summary": self.summary,
                "event": event_data(self.event)}


@dataclass
class StepGroup:
    """Consecutive events of the run: `start` (before the first step), `step N`, or
    `after step N` (decisions, resumption and the finish that come between/after steps)."""

    label: str
    step: int | None
    events: list[TimelineEvent] = field(default_factory=list)
    state_diff: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "step": self.step,
                "first_event": str(self.events[0].position), "last_event": str(self.events[-1].position),
                "events": [e.to_json() for e in self.events], "state_diff": self.state_diff}


@dataclass
class ReplayReport:
    run: RunView  # the whole run (lineage never changes)
    run_as_of: RunView | None  # the run as of `to` (None if it had not started yet)
    to: Position | None
    groups: list[StepGroup]
    state: dict[str, Any]  # {"thread": ..., "run": ...} as of `to` (or the end)
    continued_by: list[str]
    #: Set when the asked `to` was after the thread's last event (`within`): `to` is that event.
    warning: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        run, now = self.run, self.run_as_of
        out: dict[str, Any] = {
            "run_id": run.run_id,
            "thread_id": run.thread_id,
            "lineage": {"agent_id": run.agent_id, "parent_run_id": run.parent_run_id,
                        "parent_thread_id": run.parent_thread_id, "origin": run.origin,
                        "continued_by": self.continued_by},
            "to": str(self.to) if self.to else None,
            "status": now.status if now else "not_started",
            "termination": msgspec.to_builtins(now.termination) if now and now.termination else None,
            "usage": msgspec.to_builtins(now.usage) if now else None,
            "steps": [g.to_json() for g in self.groups],
            "state": self.state,
        }
        if self.warning is not None:
            out["warning"] = self.warning
        return out


def _before(position: Position) -> Position:
    if position.index > 0:
        return Position(position.seq, position.index - 1)
    return Position(position.seq - 1, _END)


def _run_span(run_id: str, thread_commits: Sequence[StoredCommit]) -> tuple[int, int]:
    """(first, last) seq of the run's own commits in its thread."""
    seqs = [sc.seq for sc in thread_commits if sc.commit.run_id == run_id]
    return (seqs[0], seqs[-1]) if seqs else (0, 0)


def _shown_quarantined(stored: StoredCommit, run_id: str, span: tuple[int, int]) -> bool:
    """A quarantine marker belongs in a run's timeline if it was published on the run's subject
    or sits between the run's first and last commit."""
    commit = stored.commit
    return is_quarantined(commit) and (span[0] < stored.seq < span[1] or quarantined_run(commit) == run_id)


def build_replay(run_id: str, thread_commits: Sequence[StoredCommit], to: Position | None = None) -> ReplayReport:
    """The replay report of `run_id` from all commits of its thread, in log order.

    Thread commits (not just the run's) are folded because the thread-scope state a step changed
    is the result of everything before it, earlier runs included. Each group's `state_diff` is
    `jsonpatch.make_patch(state before its first event, state after its last event)` over
    `{"thread": ..., "run": ...}` so ops read like `/thread/todo/0`.

    The events are the run's, plus the quarantine markers (`CommitQuarantined`) published on the
    run's subject or sitting between its first and last commit: what the run's readers skipped
    is shown where it was.
    """
    views = fold_commits(thread_commits)
    run = views.runs.get(run_id)
    if run is None:
        raise UnknownRun(run_id)
    warning = None
    if to is not None:
        to, warning = within(thread_commits, to)
    limit = to or Position(thread_commits[-1].seq, _END)
    call_names: dict[str, str] = {}
    groups: list[StepGroup] = []
    current = StepGroup("start", None)
    span = _run_span(run_id, thread_commits)
    for stored in thread_commits:
        if stored.commit.run_id != run_id and not _shown_quarantined(stored, run_id, span):
            continue
        for position, event in stored.positioned():
            if position > limit:
                break
            learn_call_names(event, call_names)
            if isinstance(event, StepStarted):
                if current.events:
                    groups.append(current)
                current = StepGroup(f"step {event.step}", event.step)
            current.events.append(TimelineEvent(position, event, event_summary(event, call_names)))
            if isinstance(event, StepFinished):
                groups.append(current)
                current = StepGroup(f"after step {event.step}", None)
    if current.events:
        groups.append(current)
    thread_id = run.thread_id
    bounds = [(_before(group.events[0].position), group.events[-1].position) for group in groups]
    states = states_along(thread_commits, thread_id, run_id, [limit, *(p for pair in bounds for p in pair)])
    for group, (first, last) in zip(groups, bounds, strict=True):
        group.state_diff = jsonpatch.make_patch(states[first], states[last]).patch
    return ReplayReport(
        run=run,
        run_as_of=run_at(thread_commits, run_id, limit),
        to=to,
        groups=groups,
        state=states[limit],
        continued_by=sorted(r.run_id for r in views.runs.values() if r.parent_run_id == run_id),
        warning=warning,
    )


#: The only events a fold turns into state changes (thread, run or tool-call scope).
_STATE_EVENTS = (StatePatched, StateReplaced, StateWritten, StateCleared)


def event_state_diffs(report: ReplayReport,
                      thread_commits: Sequence[StoredCommit]) -> dict[str, list[dict[str, Any]]]:
    """Per-event time travel for the run inspector: event id -> the RFC 6902 diff of
    `{"thread": ..., "run": ...}` state across that one event, for every event of `report` that
    changed it (the step groups' `state_diff` is the same diff over a whole group).

    Only state events are diffed (everything else leaves state alone), and the states around
    them all come from one fold (`states_along`), so a long run costs one fold, not two per
    state change."""
    run_id, thread_id = report.run.run_id, report.run.thread_id
    diffs: dict[str, list[dict[str, Any]]] = {}
    items = [item for group in report.groups for item in group.events if isinstance(item.event, _STATE_EVENTS)]
    states = states_along(thread_commits, thread_id, run_id,
                          [p for item in items for p in (_before(item.position), item.position)])
    for item in items:
        patch = jsonpatch.make_patch(states[_before(item.position)], states[item.position]).patch
        if patch:
            diffs[str(item.position)] = patch
    return diffs
