"""Human in the loop (DESIGN 4.3): decisions, their validation and which calls resume when.

Everything here is pure: functions of the decisions given and of a `RunContext` folded from the
log. The I/O (reading the log, appending `ToolCallDecided`, replaying tools) lives in
`Runtime.decide` and `RunLoop.begin_resume`, so any worker in any process that folds the same log
and receives the same decisions takes the same path.

Decision lifecycle, as events of the run:

    ToolCallSuspended ... ToolCallDecided (recorded; the call stays `suspended`)
        ... RunResumed{call_ids} ToolCallResuming{call_id, mode} -> outcome per resume mode

Which recorded decisions are applied is `ready_calls(mode, ctx)`: sequential and
parallel_streaming apply each decided call at once; parallel_batch_approval only once every
suspended call of the run is decided (earlier decisions wait, recorded, in `ctx.decisions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonschema
import msgspec
from jsonschema.exceptions import best_match

from agentlog.eventlog.errors import AgentlogError, InvalidId
from agentlog.eventlog.events import StoredCommit, SuspendTicket, ToolCallDecided, ToolCallDecision
from agentlog.eventlog.ids import validate_id

DecisionInput = ToolCallDecision | Mapping[str, Any]


class HitlError(AgentlogError):
    """Base of the decision errors. Raised before anything is appended: the log is unchanged."""

    code = "hitl_error"


class InvalidDecision(HitlError, ValueError):
    """A decision that is not a well-formed `ToolCallDecision` (missing/bad fields), or whose
    result does not answer its ticket (`check_result`). `detail`: the failing fields, as the
    APIs answer them (`[{"field", "message", "type"}]`), when known."""

    code = "invalid_decision"

    def __init__(self, message: str, detail: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class UnknownCall(HitlError, LookupError):
    """The decision targets a call id the run never had."""

    code = "unknown_call"


class CallNotSuspended(HitlError):
    """The decision targets a call of the run that is not waiting for a decision (it ran, was
    already decided by another decision id, or was never suspended)."""

    code = "call_not_suspended"


class RunNotWaiting(HitlError):
    """The run is finished, or has no suspended call to decide."""

    code = "run_not_waiting"


_FIELDS = set(ToolCallDecision.__struct_fields__)


def parse_decision(item: DecisionInput, now_ms: int) -> ToolCallDecision:
    """A `ToolCallDecision` from a struct or a JSON-like dict (the wire shape of DESIGN 4.3),
    with `updated_at` filled from the clock when absent. Raises `InvalidDecision`."""
    if isinstance(item, ToolCallDecision):
        decision = item
    elif isinstance(item, Mapping):
        extra = set(item) - _FIELDS
        if extra:
            raise InvalidDecision(f"unknown decision field(s): {', '.join(sorted(map(str, extra)))}")
        try:
            decision = msgspec.convert(dict(item), ToolCallDecision)
        except msgspec.ValidationError as exc:
            raise InvalidDecision(f"invalid decision: {exc}") from None
    else:
        raise InvalidDecision(f"a decision must be a ToolCallDecision or a dict, not {type(item).__name__}")
    try:
        validate_id(decision.target_id, "target_id")
        validate_id(decision.decision_id, "decision_id")
    except InvalidId as exc:
        raise InvalidDecision(str(exc)) from None
    if decision.action not in ("resume", "cancel"):
        raise InvalidDecision(f"decision action must be 'resume' or 'cancel', not {decision.action!r}")
    if decision.updated_at < 0:
        raise InvalidDecision("updated_at must be unix milliseconds >= 0")
    if decision.updated_at == 0:
        decision = msgspec.structs.replace(decision, updated_at=now_ms)
    return decision


def parse_decisions(items: Iterable[DecisionInput] | DecisionInput, now_ms: int) -> list[ToolCallDecision]:
    """Parse a batch; two decisions with the same decision_id but different content, or two
    different decisions for one call, make the batch invalid (nothing is recorded)."""
    if isinstance(items, (ToolCallDecision, Mapping)):
        items = [items]
    out: list[ToolCallDecision] = []
    by_id: dict[str, ToolCallDecision] = {}
    targets: dict[str, str] = {}
    for item in items:
        d = parse_decision(item, now_ms)
        seen = by_id.get(d.decision_id)
        if seen is not None:
            if seen.target_id != d.target_id or seen.action != d.action or seen.result != d.result:
                raise InvalidDecision(f"decision_id {d.decision_id!r} is used for two different decisions")
            continue
        if d.target_id in targets:
            raise InvalidDecision(
                f"two decisions ({targets[d.target_id]!r}, {d.decision_id!r}) for call {d.target_id!r}"
            )
        by_id[d.decision_id] = d
        targets[d.target_id] = d.decision_id
        out.append(d)
    if not out:
        raise InvalidDecision("no decisions given")
    return out


def decision_seqs(commits: Iterable[StoredCommit]) -> dict[str, int]:
    """decision_id -> seq of the commit that recorded it (the answer to a duplicate)."""
    out: dict[str, int] = {}
    for sc in commits:
        for ev in sc.commit.events:
            if type(ev) is ToolCallDecided:
                out.setdefault(ev.decision.decision_id, sc.seq)
    return out


def check_decisions(
    ctx: Any, decisions: Sequence[ToolCallDecision], known_calls: Iterable[str]
) -> tuple[list[ToolCallDecision], list[ToolCallDecision]]:
    """Split into (new, duplicates) or raise: the run must not be finished and must have a
    suspended call; each new decision must target a suspended, not yet decided call.

    `ctx` is a `loop.RunContext` (typed loosely to keep this module free of the loop)."""
    dups = [d for d in decisions if d.decision_id in ctx.decision_ids]
    new = [d for d in decisions if d.decision_id not in ctx.decision_ids]
    if new and ctx.finished is not None:
        raise RunNotWaiting(f"run {ctx.run_id!r} is finished ({ctx.finished.type}); it takes no decisions")
    if new and not ctx.suspended:
        raise RunNotWaiting(f"run {ctx.run_id!r} has no suspended call waiting for a decision")
    known = set(known_calls)
    for d in new:
        if d.target_id not in ctx.suspended:
            if d.target_id not in known:
                raise UnknownCall(f"run {ctx.run_id!r} has no tool call {d.target_id!r}")
            raise CallNotSuspended(f"tool call {d.target_id!r} of run {ctx.run_id!r} is not suspended")
        if d.target_id in ctx.decisions:
            prior = ctx.decisions[d.target_id].decision_id
            raise CallNotSuspended(
                f"tool call {d.target_id!r} already has decision {prior!r}; it is waiting for the rest of its batch"
            )
        check_result(ctx.suspended[d.target_id], d)
    return new, dups


def check_result(ticket: SuspendTicket, decision: ToolCallDecision) -> None:
    """Raise `InvalidDecision` unless `decision` answers `ticket`: a `resume` decision's result
    (null when absent) must validate against the ticket's `response_schema` (JSON Schema, its
    declared draft, else 2020-12). A ticket without a schema takes any result. A `cancel` is not
    checked: the call does not run, and its result is recorded as given, never used as an
    answer. The error names the first failing field (`result.<path>`)."""
    schema = ticket.response_schema
    if decision.action != "resume" or schema is None:
        return
    where = f"decision {decision.decision_id!r} for call {decision.target_id!r}"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidDecision(f"{where}: the ticket's response_schema is not a valid JSON Schema ({exc.message}); "
                              "the call can only be cancelled") from None
    error = best_match(cls(schema).iter_errors(decision.result))
    if error is None:
        return
    field = "result" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [str(p) for p in error.validator_value if p not in error.instance]
        field += f".{missing[0]}" if missing else ""
    why = error.message if decision.result is not None else "missing (a resume of this call must carry one)"
    message = f"{where}: {field}: {why} (the ticket's response_schema: {_brief(schema)})"
    raise InvalidDecision(message, [{"field": field, "message": why, "type": "invalid_decision",
                                     "target_id": decision.target_id, "decision_id": decision.decision_id}])


def _brief(schema: Any) -> str:
    text = msgspec.json.encode(schema).decode()
    return text if len(text) <= 200 else text[:197] + "..."


def ready_calls(mode: str, ctx: Any) -> list[str]:
    """Decided calls to apply now, in the order the model asked for them.

    parallel_batch_approval: all of them once no suspended call is left undecided, else none.
    sequential / parallel_streaming: every decided call at once (sequential has at most one
    suspended call per step: it stops at the first suspension)."""
    decided = [c.id for c in ctx.step_tool_calls if c.id in ctx.decisions and c.id in ctx.suspended]
    decided += [cid for cid in ctx.decisions if cid in ctx.suspended and cid not in decided]
    if mode == "parallel_batch_approval" and any(cid not in ctx.decisions for cid in ctx.suspended):
        return []
    return decided


def unstarted_calls(ctx: Any) -> list[Any]:
    """Calls of the current step with no event yet (a sequential round stopped before them)."""
    touched = ctx.answered | set(ctx.suspended) | set(ctx.running) | set(ctx.resuming)
    return [c for c in ctx.step_tool_calls if c.id not in touched]


#: What an approval answer looks like: the response schema of a permission `ask` and of a budget
#: ticket.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}


def is_approved(result: Any) -> bool:
    """How an approval (a permission `ask`, a budget ticket) reads a resume decision's result:
    approved only when it says `approved: true`; anything else is a denial."""
    return isinstance(result, Mapping) and result.get("approved") is True


__all__ = [
    "APPROVAL_SCHEMA", "CallNotSuspended", "DecisionInput", "HitlError", "InvalidDecision", "RunNotWaiting", "UnknownCall",
    "check_decisions", "check_result", "decision_seqs", "is_approved", "parse_decision", "parse_decisions", "ready_calls",
    "unstarted_calls",
]
