"""The run's working context as a fold of events: `RunContext`, `apply_event`, `fold_context`.

Pure: no I/O, no clock, no ids. The loop stages every event through `apply_event` before it
commits it, and a resumed run (or a verified replay, or the gateway's admission checks) builds
the same context by folding the log: one function, every path. It lives apart from the driver
(`agentlog.runtime.loop.driver`) so that readers of a folded context need not import the async machinery.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentlog.eventlog.events import (
    IN_DOUBT_ACTION,
    ActionScheduled,
    AgentHandedOff,
    AnyEvent,
    ContextCompacted,
    ContextEntry,
    ContextMessageSet,
    InferenceCompleted,
    InferenceReplaced,
    InputFiltered,
    Message,
    MessageAppended,
    MessageQueued,
    ReplacedAnswer,
    RunCancelRequested,
    RunFinished,
    RunOverrides,
    RunResumed,
    RunStarted,
    RunSuspended,
    ScheduledActionsRan,
    StateCleared,
    StatePatched,
    StateReplaced,
    StateWritten,
    StepFinished,
    StepStarted,
    StoredCommit,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.projections.fold import key_ops_valid, without_keys
from agentlog.projections.state import apply_ops, validate_patch, validate_state
from agentlog.runtime.inputs.frontend import frontend_specs
from agentlog.runtime.models.base import ToolSpec
from agentlog.runtime.stop import BUDGET_CALL_PREFIX


@dataclass(slots=True)
class RunContext:
    """Everything the loop's decisions read, built only by folding events (`apply_event`).

    Thread-wide parts (messages, state, version) come from the whole thread; run-scoped parts are
    reset by the run's `RunStarted`.
    """

    thread_id: str
    run_id: str
    thread_exists: bool = False
    #: The thread's owner (`ThreadCreated.resource_id`): the id of its profile.
    resource_id: str | None = None
    messages: list[Message] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    # run-scoped
    #: The run's `run` scope state (typed keys of scope run), cleared when the run ends.
    run_state: dict[str, Any] = field(default_factory=dict)
    #: Each call's `tool_call` scope state (call_id -> document), cleared when the call completes.
    call_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Thread keys this run wrote that are not persistent: cleared when the run ends.
    transient_keys: list[str] = field(default_factory=list)
    started_ms: int = 0
    step: int = 0
    step_open: bool = False
    usage: Usage = Usage()
    step_text: str = ""
    #: Call ids of the current step's assistant message, and those that got a completion.
    step_calls: list[str] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    step_failed: int = 0
    step_succeeded: int = 0
    round_tools: list[tuple[str, ...]] = field(default_factory=list)
    consecutive_errors: int = 0
    #: Started, not yet completed calls (call_id -> tool name).
    running: dict[str, str] = field(default_factory=dict)
    suspended: dict[str, SuspendTicket] = field(default_factory=dict)
    #: The current step's requested calls (to replay a suspended call, or start the calls a
    #: sequential round left un-started).
    step_tool_calls: list[ToolCall] = field(default_factory=list)
    #: Recorded decisions not yet applied (call_id -> decision): partial batch decisions wait here.
    decisions: dict[str, ToolCallDecision] = field(default_factory=dict)
    #: Every decision_id recorded in this run (idempotency of `decide`).
    decision_ids: set[str] = field(default_factory=set)
    #: Calls between ToolCallResuming and their outcome (call_id -> the decision applied).
    resuming: dict[str, ToolCallDecision] = field(default_factory=dict)
    #: The resume mode of each `resuming` call (from its ToolCallResuming), to re-drive it.
    resume_modes: dict[str, str] = field(default_factory=dict)
    #: Calls that went in doubt (an in-doubt `ToolCallSuspended`) and have no outcome yet
    #: (call_id -> the decision they first ran with, None for none): a `retry` runs the call with
    #: that decision again (`agentlog.runtime.loop.in_doubt`).
    in_doubt: dict[str, ToolCallDecision | None] = field(default_factory=dict)
    cancel_requested: bool = False
    waiting: bool = False
    #: Between a `RunResumed` and the end of that resume (the run waits again, finishes, or
    #: starts its next step): a resume from the log finishes the decision's resume first.
    resume_open: bool = False
    finished: Termination | None = None
    #: This run's frontend tools (name -> spec), from its `RunStarted`: offered to the model, and
    #: a call to one suspends for the client instead of running here (`agentlog.runtime.inputs.frontend`).
    frontend_tools: dict[str, ToolSpec] = field(default_factory=dict)
    #: The thread's latest `ContextCompacted` (the model sees its summary instead of the
    #: messages up to its `upto_message_id`; `agentlog.runtime.context_policy`).
    compaction: ContextCompacted | None = None
    #: The run's summed `InferenceCompleted.cost` (None: no priced inference yet).
    cost: float | None = None
    #: The run's model: a request's override, else the one a pool chose (its `RunStarted`), else None.
    model: str | None = None
    #: The run's recorded overrides and client context (`RunStarted`, `agentlog.runtime.inputs.run_input`).
    overrides: RunOverrides | None = None
    client_context: list[ContextEntry] = field(default_factory=list)
    #: Budget suspensions a human extended (each grants one more budget), and whether one was
    #: declined (the run then ends `stopped`/budget); see `agentlog.runtime.stop.Budget`.
    budget_extensions: int = 0
    budget_declined: bool = False
    #: Messages queued for this run (`MessageQueued`, steer or follow-up) and not taken yet, in
    #: log order; taking one is the run's `MessageAppended` of the same message id.
    queued: list[MessageQueued] = field(default_factory=list)
    #: The run's active agent: its `RunStarted.agent_id`, then each `AgentHandedOff.to_agent`
    #: (`agentlog.runtime.agents.handoff`). None before the run starts.
    agent_id: str | None = None
    #: The agent whose inference asked for the current step's calls (the active agent at the
    #: step's `InferenceCompleted`): a resume plans those calls with that agent's tools even
    #: when the step handed off.
    step_agent: str | None = None
    #: The run's inferences so far (its `InferenceCompleted`s and `InferenceReplaced`s).
    inferences: int = 0
    #: Answers the run takes instead of its model's, by step (`RunStarted.answers`).
    replaced_answers: list[ReplacedAnswer] = field(default_factory=list)
    #: Plugins' keyed context messages (`ContextMessageSet`, by key) and, per key, the inference
    #: (1-based) that last showed one (`due_context`).
    context_messages: dict[str, ContextMessageSet] = field(default_factory=dict)
    context_last: dict[str, int] = field(default_factory=dict)
    #: Scheduled actions waiting for their phase (`ActionScheduled`), in log order.
    scheduled: list[ActionScheduled] = field(default_factory=list)
    #: What input filters warned about (`InputFiltered`, verdict warn), shown to the model.
    input_warnings: list[str] = field(default_factory=list)


def apply_event(ctx: RunContext, event: AnyEvent, ts: int, run_id: str | None, *, thread_scope: bool = True) -> None:
    """Fold one event (of a commit of `run_id`, committed at `ts`) into `ctx`.

    Raises `InvalidPatch` for a state patch that does not apply: the loop stages its own events
    through here, so that check runs before anything is appended.

    `thread_scope=False` folds only the run-scoped parts (no messages, no thread state): a cold
    resume uses it for the run's commits already covered by a thread-view snapshot.
    """
    t = type(event)
    ours = run_id == ctx.run_id
    if t is MessageAppended:
        msg = cast(MessageAppended, event).message
        if thread_scope:
            ctx.messages.append(msg)
        if ours and ctx.queued and msg.role == "user":
            ctx.queued = [q for q in ctx.queued if q.message.id != msg.id]
        if ours and msg.role == "assistant":
            ctx.step_text = msg.content
            calls = msg.tool_calls or []
            ctx.step_calls = [c.id for c in calls]
            ctx.step_tool_calls = list(calls)
            ctx.answered = set()
            if calls:
                ctx.round_tools.append(tuple(c.name for c in calls))
    elif t is StatePatched:
        patched = cast(StatePatched, event)
        if patched.scope == "thread":
            if thread_scope:
                ctx.state = validate_patch(ctx.state, patched.ops)
        elif ours:
            _scoped_ops(ctx, patched.scope, patched.call_id, patched.ops, validate_patch)
    elif t is StateWritten:
        written = cast(StateWritten, event)
        if not key_ops_valid(written.ops, written.key):
            raise InvalidPatch(f"a write of key {written.key!r} may only change /{written.key}")
        if written.scope == "thread":
            if thread_scope:
                ctx.state = apply_ops(ctx.state, written.ops)
            if ours and written.transient and written.key not in ctx.transient_keys:
                ctx.transient_keys.append(written.key)
        elif ours and written.scope != "profile":  # a profile lives in its own stream
            _scoped_ops(ctx, written.scope, written.call_id, written.ops, apply_ops)
    elif t is StateCleared:
        cleared = cast(StateCleared, event)
        if cleared.scope == "thread":
            if thread_scope:
                ctx.state = without_keys(ctx.state, cleared.keys)
            if ours:
                ctx.transient_keys = [k for k in ctx.transient_keys if k not in cleared.keys]
        elif ours and cleared.scope == "run":
            ctx.run_state = without_keys(ctx.run_state, cleared.keys)
        elif ours and cleared.call_id is not None:
            left = without_keys(ctx.call_states.get(cleared.call_id, {}), cleared.keys)
            if left:
                ctx.call_states[cleared.call_id] = left
            else:
                ctx.call_states.pop(cleared.call_id, None)
    elif t is ContextCompacted:
        if thread_scope:
            ctx.compaction = cast(ContextCompacted, event)
    elif not ours:
        if t is ThreadCreated:
            ctx.thread_exists = True
            ctx.resource_id = cast(ThreadCreated, event).resource_id
        elif t is StateReplaced and cast(StateReplaced, event).scope == "thread" and thread_scope:
            ctx.state = validate_state(cast(StateReplaced, event).state)
    elif t is ToolCallCompleted:
        completed = cast(ToolCallCompleted, event)
        call_id = completed.call_id
        ctx.running.pop(call_id, None)
        ctx.suspended.pop(call_id, None)
        ctx.decisions.pop(call_id, None)
        ctx.resuming.pop(call_id, None)
        ctx.resume_modes.pop(call_id, None)
        ctx.in_doubt.pop(call_id, None)
        ctx.answered.add(call_id)
        if call_id.startswith(BUDGET_CALL_PREFIX):  # a budget ticket answered, not a tool's outcome
            if completed.outcome == "succeeded":
                ctx.budget_extensions += 1
            else:
                ctx.budget_declined = True
            return
        if completed.outcome == "succeeded":
            ctx.step_succeeded += 1
        else:
            ctx.step_failed += 1
    elif t is ToolCallStarted:
        started = cast(ToolCallStarted, event)
        ctx.running[started.call_id] = started.name
    elif t is StepStarted:
        ctx.step = cast(StepStarted, event).step
        ctx.step_open = True
        ctx.resume_open = False
        ctx.step_text = ""
        ctx.step_calls = []
        ctx.answered = set()
        ctx.step_failed = ctx.step_succeeded = 0
    elif t is InferenceCompleted or t is InferenceReplaced:
        if ctx.context_messages:
            shown = ctx.inferences + 1
            for key in due_context(ctx):
                ctx.context_last[key] = shown
            ctx.context_messages = {k: m for k, m in ctx.context_messages.items() if m.persistent}
        ctx.inferences += 1
        ctx.step_agent = ctx.agent_id
        if t is InferenceCompleted:
            inference = cast(InferenceCompleted, event)
            ctx.usage = ctx.usage + inference.usage
            if inference.cost is not None:
                ctx.cost = inference.cost if ctx.cost is None else ctx.cost + inference.cost
    elif t is StepFinished:
        ctx.step_open = False
        if ctx.step_failed or ctx.step_succeeded:
            ctx.consecutive_errors = ctx.consecutive_errors + 1 if not ctx.step_succeeded else 0
    elif t is ToolCallSuspended:
        suspended = cast(ToolCallSuspended, event)
        if suspended.ticket.action == IN_DOUBT_ACTION and suspended.call_id not in ctx.in_doubt:
            ctx.in_doubt[suspended.call_id] = ctx.resuming.get(suspended.call_id)
        ctx.running.pop(suspended.call_id, None)
        ctx.resuming.pop(suspended.call_id, None)
        ctx.resume_modes.pop(suspended.call_id, None)
        ctx.suspended[suspended.call_id] = suspended.ticket
    elif t is ToolCallDecided:
        decided = cast(ToolCallDecided, event)
        decision = decided.decision
        ctx.decisions[decided.call_id] = decision
        ctx.decision_ids.add(decision.decision_id)
    elif t is ToolCallResuming:
        resuming = cast(ToolCallResuming, event)
        call_id = resuming.call_id
        ctx.suspended.pop(call_id, None)
        applied = ctx.decisions.pop(call_id, None)
        if applied is not None:
            ctx.resuming[call_id] = applied
            ctx.resume_modes[call_id] = resuming.mode
    elif t is RunResumed:
        ctx.waiting = False
        ctx.resume_open = True
    elif t is ThreadCreated:
        ctx.thread_exists = True
        ctx.resource_id = cast(ThreadCreated, event).resource_id
    elif t is RunStarted:
        ctx.run_state = {}
        ctx.call_states = {}
        ctx.transient_keys = []
        ctx.started_ms = ts
        ctx.step = 0
        ctx.usage = Usage()
        ctx.round_tools = []
        ctx.consecutive_errors = 0
        ctx.running = {}
        ctx.suspended = {}
        ctx.step_tool_calls = []
        ctx.decisions = {}
        ctx.decision_ids = set()
        ctx.resuming = {}
        ctx.resume_modes = {}
        ctx.in_doubt = {}
        ctx.waiting = False
        ctx.resume_open = False
        ctx.cancel_requested = False
        ctx.finished = None
        ctx.frontend_tools = frontend_specs(cast(RunStarted, event).frontend_tools)
        run_started = cast(RunStarted, event)
        ctx.overrides = run_started.overrides
        ctx.client_context = list(run_started.context)
        override_model = run_started.overrides.model if run_started.overrides is not None else None
        ctx.model = override_model or run_started.model
        ctx.cost = None
        ctx.budget_extensions = 0
        ctx.budget_declined = False
        ctx.queued = []
        ctx.agent_id = cast(RunStarted, event).agent_id
        ctx.replaced_answers = list(run_started.answers)
        ctx.step_agent = None
        ctx.inferences = 0
        ctx.context_messages = {}
        ctx.context_last = {}
        ctx.scheduled = []
        ctx.input_warnings = []
    elif t is AgentHandedOff:
        ctx.agent_id = cast(AgentHandedOff, event).to_agent
    elif t is ContextMessageSet:
        message = cast(ContextMessageSet, event)
        if message.text is None:
            ctx.context_messages.pop(message.key, None)
        else:
            ctx.context_messages = {**ctx.context_messages, message.key: message}  # in place of the old one
    elif t is ActionScheduled:
        ctx.scheduled = [*ctx.scheduled, cast(ActionScheduled, event)]
    elif t is ScheduledActionsRan:
        phase = cast(ScheduledActionsRan, event).phase
        ctx.scheduled = [a for a in ctx.scheduled if a.phase != phase]
    elif t is InputFiltered:
        filtered = cast(InputFiltered, event)
        if filtered.verdict == "warn":
            ctx.input_warnings = [*ctx.input_warnings, filtered.reason]
    elif t is RunCancelRequested:
        ctx.cancel_requested = True
    elif t is MessageQueued:
        queued = cast(MessageQueued, event)
        if all(q.message.id != queued.message.id for q in ctx.queued):
            ctx.queued = [*ctx.queued, queued]
    elif t is RunSuspended:
        ctx.waiting = True
        ctx.resume_open = False
    elif t is RunFinished:
        ctx.finished = cast(RunFinished, event).termination
        ctx.waiting = False
        ctx.resume_open = False
    elif t is StateReplaced:
        replaced = cast(StateReplaced, event)
        if replaced.scope == "thread":
            if thread_scope:
                ctx.state = validate_state(replaced.state)
        elif replaced.scope == "run":
            ctx.run_state = validate_state(replaced.state)
        elif replaced.call_id is not None:
            ctx.call_states[replaced.call_id] = validate_state(replaced.state)

def _scoped_ops(ctx: RunContext, scope: str, call_id: str | None, ops: Any, apply: Any) -> None:
    """Fold ops of the run's `run` or a call's `tool_call` scope into the context."""
    if scope == "run":
        ctx.run_state = apply(ctx.run_state, ops)
    elif call_id is not None:
        ctx.call_states[call_id] = apply(ctx.call_states.get(call_id, {}), ops)


def call_cleanup(ctx: RunContext, call_id: str) -> StateCleared | None:
    """The event ending a completing call's tool_call scope, or None when it holds nothing."""
    state = ctx.call_states.get(call_id)
    if not state:
        return None
    return StateCleared(scope="tool_call", keys=sorted(state), call_id=call_id)


def run_cleanup(ctx: RunContext) -> list[StateCleared]:
    """The events ending the run's scoped state as it finishes: what is left of its calls'
    tool_call scopes, its run scope, its transient thread keys."""
    out = [StateCleared(scope="tool_call", keys=sorted(state), call_id=call_id)
           for call_id, state in sorted(ctx.call_states.items()) if state]
    if ctx.run_state:
        out.append(StateCleared(scope="run", keys=sorted(ctx.run_state)))
    transient = [k for k in ctx.transient_keys if k in ctx.state]
    if transient:
        out.append(StateCleared(scope="thread", keys=sorted(transient)))
    return out


def replaced_answer(ctx: RunContext) -> Message | None:
    """The answer the run takes at its current step instead of asking its model, if any."""
    return next((a.message for a in ctx.replaced_answers if a.step == ctx.step), None)


def copy_context(ctx: RunContext) -> RunContext:
    """A copy `apply_event` on the original cannot change (its containers copied, the values
    they hold shared: events and messages are immutable)."""
    out = copy.copy(ctx)
    for name in RunContext.__slots__:
        value = getattr(ctx, name)
        if isinstance(value, (list, dict, set)):
            setattr(out, name, copy.copy(value))
    return out


def due_context(ctx: RunContext) -> list[str]:
    """The keys of the keyed context messages the next inference shows (pure): each whose last
    showing is more than its `cooldown` inferences ago, or that was never shown, in the order
    they were set."""
    upcoming = ctx.inferences + 1
    return [key for key, m in ctx.context_messages.items()
            if (last := ctx.context_last.get(key)) is None or upcoming - last > m.cooldown]


def due_messages(ctx: RunContext, *, ending: bool) -> list[Message]:
    """The queued messages the loop takes now (pure): at a step boundary the steering ones; when
    the run would end naturally (`ending`) every one, follow-ups included, in log order."""
    return [q.message for q in ctx.queued if ending or q.mode == "steer"]


def fold_context(ctx: RunContext, commits: Sequence[StoredCommit], *, thread_scope: bool = True) -> RunContext:
    for sc in commits:
        for ev in sc.commit.events:
            apply_event(ctx, ev, sc.commit.ts, sc.commit.run_id, thread_scope=thread_scope)
    return ctx

