"""The phase loop of DESIGN 4.2, with its decisions pure and its I/O at the edges.

    RunStart -> [StepStart -> BeforeInference -> inference -> AfterInference ->
                 (BeforeToolExecute -> execute -> AfterToolExecute per call) -> StepEnd]* -> RunEnd

Three layers, so that verified replay (next issue) can re-run the same code against a recorded log:

- `RunContext` + `apply_event`: the run's working state is a *fold* of events. The loop stages
  every event through `apply_event` before committing it, and a resumed run builds the same
  context by folding the log: one function, both paths.
- Pure decisions: `plan_call`, `resolve_gate`, `build_request`, `classify_result`,
  `stop.evaluate_stop` -- functions of (AgentSpec, RunContext, latest inputs) only.
- `RunLoop`: the driver. It is the only place that touches the store, the model, the tools and the
  live sink, and the only place that reads the `Entropy` (ids, timestamps).

Commit points (each one eventlog commit under per-thread OCC, see `RunLoop._flush`):
run start; after inference (step start, assistant message, inference record, plus gate verdicts
and `ToolCallStarted` of the calls that start now); at each tool call's completion (its result,
message, state patch; the next sequential call's start rides along); and the run end, which rides
in the last commit when nothing else happens in between. A finished tool's completion is committed
as it finishes, so it never runs again after a crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from agentlog.log.errors import AgentlogError, StoreUnavailable, VersionConflict
from agentlog.log.events import (
    AnyEvent,
    Commit,
    ContextCompacted,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    StatePatched,
    StateReplaced,
    StepFinished,
    StepStarted,
    StoredCommit,
    SuspendTicket,
    Termination,
    ThreadCreated,
    ThreadMetadataUpdated,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallGated,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
    Usage,
)
from agentlog.log.store import EventStore
from agentlog.views.errors import InvalidPatch
from agentlog.views.state import validate_patch, validate_state

from .agent import AgentSpec, ModelRegistry
from .context import ModelSummarizer, Summarizer, context_tokens, fit, plan_summary, summary_request
from .entropy import Entropy
from .frontend import frontend_specs, frontend_ticket
from .hitl import ready_calls, unstarted_calls
from .live import LiveSink
from .models.base import (
    ModelDone,
    ModelError,
    ModelProtocolError,
    ModelRequest,
    ModelResponse,
    SelfRetrying,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from .outage import OutagePolicy, through_outage
from .plugins import (
    Action,
    AddContext,
    AddUserMessage,
    Block,
    ExcludeTools,
    Gate,
    IncludeOnlyTools,
    OverrideInference,
    PatchState,
    PhaseContext,
    SetResult,
    Suspend,
    Terminate,
    overrides,
    run_hook,
)
from .stop import StopInput, evaluate_stop
from .tools import InvalidToolArguments, Tool, ToolContext, ToolResult

_json = msgspec.json.Encoder()


class SafeLog:
    """A structlog logger whose failures (a closed stream, a broken processor) are swallowed:
    logging is a side channel and must never end a run."""

    __slots__ = ("_log",)

    def __init__(self, log: Any) -> None:
        self._log = log

    def bind(self, **kw: Any) -> SafeLog:
        return SafeLog(self._log.bind(**kw))

    def __getattr__(self, level: str) -> Callable[..., None]:
        method = getattr(self._log, level)

        def call(*args: Any, **kw: Any) -> None:
            try:
                method(*args, **kw)
            except Exception:  # noqa: BLE001
                pass

        return call


def get_logger(name: str = "agentlog.runtime", **bind: Any) -> SafeLog:
    """A lazy logger: `structlog.get_logger` with initial values resolves the configuration at
    the first log call, so a module-level logger created at import still honours the logging
    set up later by the CLI or the server (calling `.bind()` here would freeze it at import)."""
    return SafeLog(structlog.get_logger(name, **bind))


class RunConflict(AgentlogError):
    """Another writer changed the thread under a running run (not a cancel request). Nothing of
    ours was written by the failed append; a worker can re-read the log and re-evaluate."""

    code = "run_conflict"


# == the run context: a fold ======================================================================


@dataclass(slots=True)
class RunContext:
    """Everything the loop's decisions read, built only by folding events (`apply_event`).

    Thread-wide parts (messages, state, version) come from the whole thread; run-scoped parts are
    reset by the run's `RunStarted`.
    """

    thread_id: str
    run_id: str
    thread_exists: bool = False
    messages: list[Message] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    # run-scoped
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
    cancel_requested: bool = False
    waiting: bool = False
    #: Between a `RunResumed` and the end of that resume (the run waits again, finishes, or
    #: starts its next step): a resume from the log finishes the decision's resume first.
    resume_open: bool = False
    finished: Termination | None = None
    #: This run's frontend tools (name -> spec), from its `RunStarted`: offered to the model, and
    #: a call to one suspends for the client instead of running here (`agentlog.runtime.frontend`).
    frontend_tools: dict[str, ToolSpec] = field(default_factory=dict)
    #: The thread's latest `ContextCompacted` (the model sees its summary instead of the
    #: messages up to its `upto_message_id`; `agentlog.runtime.context`).
    compaction: ContextCompacted | None = None


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
        msg = event.message  # type: ignore[union-attr]
        if thread_scope:
            ctx.messages.append(msg)
        if ours and msg.role == "assistant":
            ctx.step_text = msg.content
            calls = msg.tool_calls or []
            ctx.step_calls = [c.id for c in calls]
            ctx.step_tool_calls = list(calls)
            ctx.answered = set()
            if calls:
                ctx.round_tools.append(tuple(c.name for c in calls))
    elif t is StatePatched:
        if event.scope == "thread" and thread_scope:  # type: ignore[union-attr]
            ctx.state = validate_patch(ctx.state, event.ops)  # type: ignore[union-attr]
    elif t is ContextCompacted:
        if thread_scope:
            ctx.compaction = event  # type: ignore[assignment]
    elif not ours:
        if t is ThreadCreated:
            ctx.thread_exists = True
        elif t is StateReplaced and event.scope == "thread" and thread_scope:  # type: ignore[union-attr]
            ctx.state = validate_state(event.state)  # type: ignore[union-attr]
    elif t is ToolCallCompleted:
        call_id = event.call_id  # type: ignore[union-attr]
        ctx.running.pop(call_id, None)
        ctx.suspended.pop(call_id, None)
        ctx.decisions.pop(call_id, None)
        ctx.resuming.pop(call_id, None)
        ctx.resume_modes.pop(call_id, None)
        ctx.answered.add(call_id)
        if event.outcome == "succeeded":  # type: ignore[union-attr]
            ctx.step_succeeded += 1
        else:
            ctx.step_failed += 1
    elif t is ToolCallStarted:
        ctx.running[event.call_id] = event.name  # type: ignore[union-attr]
    elif t is StepStarted:
        ctx.step = event.step  # type: ignore[union-attr]
        ctx.step_open = True
        ctx.resume_open = False
        ctx.step_text = ""
        ctx.step_calls = []
        ctx.answered = set()
        ctx.step_failed = ctx.step_succeeded = 0
    elif t is InferenceCompleted:
        ctx.usage = ctx.usage + event.usage  # type: ignore[union-attr]
    elif t is StepFinished:
        ctx.step_open = False
        if ctx.step_failed or ctx.step_succeeded:
            ctx.consecutive_errors = ctx.consecutive_errors + 1 if not ctx.step_succeeded else 0
    elif t is ToolCallSuspended:
        ctx.running.pop(event.call_id, None)  # type: ignore[union-attr]
        ctx.resuming.pop(event.call_id, None)  # type: ignore[union-attr]
        ctx.resume_modes.pop(event.call_id, None)  # type: ignore[union-attr]
        ctx.suspended[event.call_id] = event.ticket  # type: ignore[union-attr]
    elif t is ToolCallDecided:
        decision = event.decision  # type: ignore[union-attr]
        ctx.decisions[event.call_id] = decision  # type: ignore[union-attr]
        ctx.decision_ids.add(decision.decision_id)
    elif t is ToolCallResuming:
        call_id = event.call_id  # type: ignore[union-attr]
        ctx.suspended.pop(call_id, None)
        decision = ctx.decisions.pop(call_id, None)
        if decision is not None:
            ctx.resuming[call_id] = decision
            ctx.resume_modes[call_id] = event.mode  # type: ignore[union-attr]
    elif t is RunResumed:
        ctx.waiting = False
        ctx.resume_open = True
    elif t is ThreadCreated:
        ctx.thread_exists = True
    elif t is RunStarted:
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
        ctx.waiting = False
        ctx.resume_open = False
        ctx.cancel_requested = False
        ctx.finished = None
        ctx.frontend_tools = frontend_specs(event.frontend_tools)  # type: ignore[union-attr]
    elif t is RunCancelRequested:
        ctx.cancel_requested = True
    elif t is RunSuspended:
        ctx.waiting = True
        ctx.resume_open = False
    elif t is RunFinished:
        ctx.finished = event.termination  # type: ignore[union-attr]
        ctx.waiting = False
        ctx.resume_open = False
    elif t is StateReplaced and event.scope == "thread" and thread_scope:  # type: ignore[union-attr]
        ctx.state = validate_state(event.state)  # type: ignore[union-attr]


def fold_context(ctx: RunContext, commits: Sequence[StoredCommit], *, thread_scope: bool = True) -> RunContext:
    for sc in commits:
        for ev in sc.commit.events:
            apply_event(ctx, ev, sc.commit.ts, sc.commit.run_id, thread_scope=thread_scope)
    return ctx


# == pure decisions ===============================================================================


@dataclass(frozen=True, slots=True)
class CallPlan:
    """A requested call, checked: `failure` says why it cannot run (unknown tool, bad args).
    `frontend`: a call to one of the run's frontend tools (no backend `tool`; it suspends for
    the client once its gate lets it through)."""

    call: ToolCall
    tool: Tool | None
    failure: str | None = None
    frontend: bool = False


def plan_call(call: ToolCall, tools: Mapping[str, Tool], frontend: Mapping[str, ToolSpec] | None = None) -> CallPlan:
    """Check a requested call against the agent's tools, then the run's frontend tools (whose
    arguments go to the client as given: the client validates them)."""
    tool = tools.get(call.name)
    if tool is None and frontend and call.name in frontend:
        return CallPlan(call, None, frontend=True)
    if tool is None:
        available = ", ".join(sorted([*tools, *(frontend or ())])) or "none"
        return CallPlan(call, None, f"unknown tool {call.name!r}; available tools: {available}")
    try:
        tool.validate(call.arguments)
    except InvalidToolArguments as exc:
        return CallPlan(call, tool, str(exc))
    return CallPlan(call, tool)


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What BeforeToolExecute decided for one call: `run`, `fail`, `result` or `suspend`."""

    kind: str
    events: tuple[AnyEvent, ...] = ()
    reason: str | None = None
    result: ToolResult | None = None
    ticket: SuspendTicket | None = None


def resolve_gate(call_id: str, actions: Sequence[Action]) -> GateDecision:
    """Combine BeforeToolExecute actions: block/deny > suspend/ask > set result > run. Every gate
    verdict is recorded (`ToolCallGated`), whichever wins."""
    gated: list[AnyEvent] = []
    block: str | None = None
    ticket: SuspendTicket | None = None
    result: ToolResult | None = None
    for action in actions:
        if isinstance(action, Gate):
            gated.append(ToolCallGated(call_id=call_id, verdict=action.verdict, rule=action.rule))
            if action.verdict == "deny" and block is None:
                block = action.reason or f"denied by permission rule {action.rule or 'default'}"
            elif action.verdict == "ask" and ticket is None:
                ticket = action.ticket or SuspendTicket(id=call_id, message=action.reason)
        elif isinstance(action, Block) and block is None:
            block = action.reason
        elif isinstance(action, Suspend) and ticket is None:
            ticket = action.ticket
        elif isinstance(action, SetResult) and result is None:
            result = action.result
    events = tuple(gated)
    if block is not None:
        return GateDecision("fail", events, reason=block)
    if ticket is not None:
        return GateDecision("suspend", events, ticket=ticket)
    if result is not None:
        return GateDecision("result", events, result=result)
    return GateDecision("run", events)


def tool_specs(spec: AgentSpec, tools: Mapping[str, Tool], actions: Sequence[Action],
               frontend: Mapping[str, ToolSpec] | None = None) -> list[ToolSpec]:
    """The tools offered to the model: the agent's, then the run's frontend tools (recorded
    order), both filtered by the plugins' exclude / include-only actions."""
    frontend = frontend or {}
    names = [*spec.tools, *(n for n in frontend if n not in tools)]
    for action in actions:
        if isinstance(action, ExcludeTools):
            names = [n for n in names if n not in action.names]
        elif isinstance(action, IncludeOnlyTools):
            names = [n for n in names if n in action.names]
    return [tools[n].spec if n in tools else frontend[n] for n in names if n in tools or n in frontend]


def build_request(
    spec: AgentSpec, ctx: RunContext, tools: list[ToolSpec], actions: Sequence[Action]
) -> ModelRequest:
    """The model request for this step: system prompt (+ plugin context), the thread's
    conversation, the tools on offer, options (+ overrides)."""
    system = spec.system_prompt
    options = spec.model_options
    model_name = spec.model_name
    for action in actions:
        if isinstance(action, AddContext):
            system = f"{system}\n\n{action.text}" if system else action.text
        elif isinstance(action, OverrideInference):
            if action.model:
                model_name = action.model
            if action.options:
                options = {**options, **action.options}
    conversation = ctx.messages
    if spec.context is not None or ctx.compaction is not None:
        conversation = fit(spec.context, conversation, ctx.compaction)
    messages = [Message(id="system", role="system", content=system), *conversation] if system else list(conversation)
    return ModelRequest(model=model_name, messages=messages, tools=tools, options=options)


def classify_result(result: ToolResult) -> tuple[str, Any, str]:
    """(outcome, recorded result, message content for the model) of a finished call."""
    if result.status == "success":
        value = result.value
        return "succeeded", value, value if isinstance(value, str) else _json.encode(value).decode()
    if result.status == "error":
        error = result.error or "tool failed"
        recorded: dict[str, Any] = {"error": error}
        if result.value is not None:
            recorded["value"] = result.value
        return "failed", recorded, f"Error: {error}"
    raise ValueError(f"a {result.status!r} result does not complete a call")


def digest_of(request: ModelRequest) -> str:
    """sha256 of the canonical encoding of the model request, for
    `InferenceCompleted.request_digest`. The one implementation lives in `agentlog.runtime.replay` (verified
    replay compares against it); imported on first use because replay imports this module.

    The digest is of the request the loop built (`build_request`), not of a fallback model's
    copy: the two differ only by the model name, which `InferenceCompleted.model` records, and a
    replay (whose first attempt always answers) rebuilds exactly this one."""
    global _request_digest
    if _request_digest is None:
        from .replay import request_digest

        _request_digest = request_digest
    return _request_digest(request)


_request_digest: Callable[[ModelRequest], str] | None = None


def part_digests_of(request: ModelRequest) -> dict[str, str]:
    """Per-part digests for `InferenceCompleted.request_digests` (agentlog.runtime.replay names the
    changed part with them); imported on first use, as `digest_of`."""
    from .replay import request_part_digests

    return request_part_digests(request)


def stop_input(ctx: RunContext, now_ms: int) -> StopInput:
    return StopInput(
        rounds=ctx.step,
        elapsed_ms=now_ms - ctx.started_ms,
        total_tokens=ctx.usage.total_tokens,
        consecutive_errors=ctx.consecutive_errors,
        round_tools=ctx.round_tools,
        text=ctx.step_text,
    )


# == the driver ===================================================================================


class _Cancelled(Exception):
    """Internal: the run was cancelled (signal or a RunCancelRequested found in the log)."""


@dataclass(slots=True)
class _Running:
    plan: CallPlan
    cancel: asyncio.Event
    ctx: ToolContext | None = None
    #: Set when the call runs again after a human decision (replay / pass_decision_to_tool).
    decision: ToolCallDecision | None = None


@dataclass(frozen=True, slots=True)
class _Replay:
    """A decided call to run again: its plan, the decision, and the ticket's resume mode."""

    plan: CallPlan
    decision: ToolCallDecision
    mode: str


class RunLoop:
    """Drives one run. Build it with a context folded from the thread's log, call `begin()`
    (the run-start commit) and then `run()`; `request_cancel()` from anywhere."""

    def __init__(
        self,
        *,
        spec: AgentSpec,
        ctx: RunContext,
        version: int,
        store: EventStore,
        tools: Mapping[str, Tool],
        models: ModelRegistry,
        live: LiveSink,
        entropy: Entropy,
        on_commit: Callable[[StoredCommit], None] = lambda sc: None,
        older_messages: Callable[[], Awaitable[list[Message]]] | None = None,
        outage: OutagePolicy = OutagePolicy(),
        summarizer: Summarizer | None = None,
    ) -> None:
        self.spec = spec
        #: How long a store operation waits through a NATS outage (see `agentlog.runtime.outage`).
        self.outage = outage
        self.ctx = ctx
        self.version = version
        self.store = store
        self.tools = tools
        self.models = models
        self.live = live
        self.entropy = entropy
        self.on_commit = on_commit
        self.log = get_logger(thread_id=ctx.thread_id, run_id=ctx.run_id)
        self._pending: list[AnyEvent] = []
        self._pending_ts = 0
        self._inflight: asyncio.Future[None] | None = None
        self._cancel = asyncio.Event()
        self._poked = asyncio.Event()
        self._cancel_waiter: asyncio.Future[Any] | None = None
        self._running: dict[str, _Running] = {}
        self._queued_user: list[str] = []
        self._stop_conditions = spec.effective_stop_conditions()
        self._hooks = {
            hook: [p for p in spec.plugins if overrides(p, hook)]
            for hook in (
                "run_start", "step_start", "before_inference", "after_inference",
                "before_tool_execute", "after_tool_execute", "step_end", "run_end",
            )
        }
        self._entry = "start"
        #: Calls the last `begin_resume` resumed (empty: decisions recorded, still waiting).
        self.resumed: list[str] = []
        self._start_termination: Termination | None = None
        self._agent_tools = {n: tools[n] for n in spec.tools if n in tools}
        self._base_tool_specs = tool_specs(spec, self._agent_tools, (), ctx.frontend_tools)
        self._live_on = live.enabled
        #: The id of the assistant message being streamed live (drawn at its first delta, see
        #: `_message_id`), so live deltas and the committed message share one id.
        self._streaming_message_id: str | None = None
        #: A context folded from a snapshot lacks the messages before it: they are loaded by
        #: this (started early by `prefetch_messages`, awaited before anything reads them).
        self._older_factory = older_messages
        self._older: asyncio.Future[list[Message]] | None = None
        self.summarizer = summarizer or ModelSummarizer(models)

    @property
    def snapshot_ready(self) -> bool:
        """True when `ctx` is exactly the fold of the thread up to `version` (nothing staged or
        in flight, every message loaded): only then may it be saved as a run snapshot."""
        return not self._pending and self._inflight is None and self._older_factory is None

    # -- messages from before a snapshot ---------------------------------------------------------

    def prefetch_messages(self) -> None:
        """Start loading the messages older than the snapshot, concurrently with the first tool
        run (a replayed tool does not need them; the next inference does)."""
        if self._older_factory is not None and self._older is None:
            self._older = asyncio.ensure_future(self._older_factory())

    async def _messages_ready(self) -> None:
        """Make `ctx.messages` the whole conversation (older + folded tail) before it is read."""
        if self._older_factory is None:
            return
        self.prefetch_messages()
        older = await self._older  # type: ignore[misc]
        self._older_factory = None
        self._older = None
        self.ctx.messages[:0] = older

    async def _drop_prefetch(self) -> None:
        task, self._older = self._older, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- staging and committing ----------------------------------------------------------------

    def _emit(self, event: AnyEvent) -> None:
        """Stage an event: fold it into the context now (so decisions see it; raises
        InvalidPatch before anything is appended), commit it at the next flush."""
        if not self._pending:
            self._pending_ts = self.entropy.now_ms()
        apply_event(self.ctx, event, self._pending_ts, self.ctx.run_id)
        self._pending.append(event)

    async def _flush(self, wait: bool = True) -> None:
        """Append the staged events as one commit at the thread version we hold.

        `wait=False` pipelines: the append is sent now and its ack awaited at the next flush, so
        a step-end commit's round trip overlaps the next inference. Safe because nothing outside
        the process depends on that ack before then: the next commit (and any tool run) waits
        for it, and a failed append surfaces there and ends the run as it would have here.
        """
        await self._drain()
        if not self._pending:
            return
        commit = Commit(
            commit_id=self.entropy.new_id(),
            thread_id=self.ctx.thread_id,
            run_id=self.ctx.run_id,
            ts=self._pending_ts,
            events=self._pending,
        )
        self._pending = []
        if wait:
            await self._append(commit)
        else:
            self._inflight = asyncio.ensure_future(self._append(commit))

    async def _drain(self) -> None:
        task = self._inflight
        if task is not None:
            self._inflight = None
            await task

    async def _append(self, commit: Commit) -> None:
        cancelled = False
        while True:
            try:
                res = await self._store_append(commit)
                break
            except VersionConflict:
                cancelled = await self._absorb_conflict() or cancelled
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        if cancelled and self.ctx.finished is None:
            raise _Cancelled()

    async def _store_append(self, commit: Commit) -> Any:
        """Append at the version we hold, waiting through a store outage (bounded by
        `self.outage`); the retried commit is the same one, so it lands at most once."""
        version = self.version
        return await through_outage(lambda: self.store.append(commit, version), self.outage, self.log)

    async def _absorb_conflict(self) -> bool:
        """Read what others appended; fold in what we can live with. Returns True if it holds a
        cancel request for this run; raises RunConflict for anything else."""
        async def read() -> list[StoredCommit]:
            return [sc async for sc in self.store.read_thread(self.ctx.thread_id, after=self.version)]

        new = await through_outage(read, self.outage, self.log, "read")
        cancel = False
        for sc in new:
            ours = sc.commit.run_id == self.ctx.run_id
            for ev in sc.commit.events:
                if type(ev) is RunCancelRequested and ours:
                    cancel = True
                elif type(ev) is ToolCallDecided and ours and ev.call_id in self.ctx.suspended:
                    pass  # a live decision (DESIGN 4.3): folded below, applied by the round
                elif type(ev) is not ThreadMetadataUpdated:
                    raise RunConflict(
                        f"thread {self.ctx.thread_id!r} changed under run {self.ctx.run_id!r}: "
                        f"commit {sc.commit.commit_id!r} (seq {sc.seq}, run {sc.commit.run_id!r}) "
                        f"appended {type(ev).__name__}; re-read the log and re-evaluate"
                    )
        for sc in new:
            for ev in sc.commit.events:
                apply_event(self.ctx, ev, sc.commit.ts, sc.commit.run_id)
            if sc.commit.run_id == self.ctx.run_id:
                self.on_commit(sc)
        if new:
            self.version = new[-1].seq
        if cancel:
            self.log.info("run.cancel_seen_in_log")
            self._cancel.set()
        return cancel

    # -- plugins -------------------------------------------------------------------------------

    def _phase(self, decision: ToolCallDecision | None = None) -> PhaseContext:
        return PhaseContext(
            agent=self.spec, thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
            step=self.ctx.step, state=self.ctx.state, messages=self.ctx.messages, decision=decision,
        )

    async def _hook(self, hook: str, *args: Any, decision: ToolCallDecision | None = None) -> list[Action]:
        plugins = self._hooks[hook]
        if not plugins:
            return []
        await self._messages_ready()
        return await run_hook(plugins, hook, self._phase(decision), *args)

    def _apply_patches(self, actions: Sequence[Action], source: str) -> None:
        for action in actions:
            if isinstance(action, PatchState):
                self._emit(StatePatched(ops=list(action.ops), source=source))

    @staticmethod
    def _terminate(actions: Sequence[Action]) -> Termination | None:
        for action in actions:
            if isinstance(action, Terminate):
                return Termination(type="behavior_requested", code=action.code, detail=action.detail)
        return None

    # -- cancellation --------------------------------------------------------------------------

    def request_cancel(self) -> None:
        self._cancel.set()

    def poke(self) -> None:
        """Tell the loop the thread has new commits for it (a decision recorded in this process
        for one of its suspended calls): it reads them at once instead of at its next append."""
        self._poked.set()

    async def _absorb_poke(self) -> None:
        if self._poked.is_set():
            self._poked.clear()
            await self._drain()
            if await self._absorb_conflict() and self.ctx.finished is None:
                raise _Cancelled()

    def _waiter(self) -> asyncio.Future[Any]:
        if self._cancel_waiter is None:
            self._cancel_waiter = asyncio.ensure_future(self._cancel.wait())
        return self._cancel_waiter

    async def _race(self, coro: Any, on_cancel: asyncio.Event | None = None) -> Any:
        """Await `coro` unless the run is cancelled first (then set `on_cancel` so a cooperative
        tool sees it, cancel the task, raise _Cancelled)."""
        if self._cancel.is_set():
            coro.close()
            raise _Cancelled()
        task = asyncio.ensure_future(coro)
        waiter = self._waiter()
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if on_cancel is not None:
            on_cancel.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _Cancelled()

    # -- the run -------------------------------------------------------------------------------

    async def begin(self, messages: Sequence[Message], *, parent_run_id: str | None, origin: str,
                    thread_metadata: dict[str, Any] | None = None, resource_id: str | None = None,
                    frontend_tools: Sequence[dict[str, Any]] = (), parent_thread_id: str | None = None) -> None:
        """The run-start commit: [ThreadCreated] + RunStarted (with the run's frontend tools,
        already normalised by the caller) + the new messages (+ RunStart plugin patches).
        `parent_thread_id`: a sub-agent run's parent thread (lineage in both events).
        Raises VersionConflict if the thread moved since it was folded."""
        if not self.ctx.thread_exists:
            self._emit(ThreadCreated(resource_id=resource_id, parent_thread_id=parent_thread_id,
                                     metadata=thread_metadata or {}))
        self._emit(RunStarted(run_id=self.ctx.run_id, agent_id=self.spec.id, parent_run_id=parent_run_id,
                              parent_thread_id=parent_thread_id, origin=origin, frontend_tools=list(frontend_tools)))
        # the run's frontend tools are folded now: offer them from the first inference on
        self._base_tool_specs = tool_specs(self.spec, self._agent_tools, (), self.ctx.frontend_tools)
        for m in messages:
            self._emit(MessageAppended(message=m))
        actions = await self._hook("run_start")
        self._apply_patches(actions, "plugin")
        self._start_termination = self._terminate(actions)
        commit = Commit(
            commit_id=self.entropy.new_id(), thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
            ts=self._pending_ts, events=self._pending,
        )
        self._pending = []
        res = await self.store.append(commit, self.version)  # a conflict here fails the start
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        self.log.info("run.started", agent_id=self.spec.id, parent_run_id=parent_run_id, seq=res.seq)

    async def run(self) -> RunContext:
        """Run to the end (or to `waiting`). Returns the final context; raises RunConflict."""
        try:
            try:
                if self._entry == "continue":
                    await self._continue()
                elif self._entry == "idle":
                    pass  # decisions recorded, nothing resumes yet (partial batch)
                elif self._start_termination is not None:
                    await self._finish(self._start_termination)
                else:
                    await self._steps()
            except _Cancelled:
                await self._finish_cancelled()
            except StoreUnavailable:
                # Still down past the outage deadline (`agentlog.runtime.outage`), or whether the failed
                # commit landed is unknown (a cluster losing its stream leader): the context already
                # holds its events, so finishing here could commit e.g. the cancel of a call whose
                # start never reached the log. Stop WITHOUT committing (no error finish, no call
                # recorded cancelled): the run stays resumable, the worker's command is redelivered
                # and the run resumes from what the log really holds.
                self.log.warning("run.store_unavailable_left_resumable", seq=self.version)
                raise
            except (RunConflict, asyncio.CancelledError):
                raise
            except Exception as exc:  # plugin bugs, invalid plugin patches, other errors...
                if self.ctx.finished is not None:
                    raise
                self.log.exception("run.error")
                code = getattr(exc, "code", None) or "internal_error"
                # staged events stay: an invalid event never gets staged (the fold raises first)
                await self._finish(Termination(type="error", code=code, detail=f"{type(exc).__name__}: {exc}"))
        finally:
            if self._inflight is not None:  # only left over when an exception escaped
                self._inflight.cancel()
                await asyncio.gather(self._inflight, return_exceptions=True)
            if self._cancel_waiter is not None:
                self._cancel_waiter.cancel()
            await self._drop_prefetch()
        term = self.ctx.finished
        self.log.info(
            "run.waiting" if term is None else "run.finished",
            termination=None if term is None else term.type, code=None if term is None else term.code,
            steps=self.ctx.step, seq=self.version,
        )
        return self.ctx

    async def _steps(self) -> None:
        while True:
            step = self.ctx.step + 1
            self._emit(StepStarted(step=step))
            actions = await self._hook("step_start")
            self._apply_patches(actions, "plugin")
            term = self._terminate(actions)
            if term is not None:
                return await self._finish(term)
            actions = await self._hook("before_inference")
            self._apply_patches(actions, "plugin")
            term = self._terminate(actions)
            if term is not None:
                return await self._finish(term)
            specs = self._base_tool_specs
            if any(isinstance(a, (ExcludeTools, IncludeOnlyTools)) for a in actions):
                specs = tool_specs(self.spec, self._agent_tools, actions, self.ctx.frontend_tools)
            await self._messages_ready()
            await self._compact()
            request = build_request(self.spec, self.ctx, specs, actions)
            t0 = self.entropy.now_ms()
            try:
                response = await self._race(self._infer(request))
            except ModelError as exc:
                self._streaming_message_id = None  # nothing of that stream is committed
                self.log.warning("run.model_error", error=str(exc))
                return await self._finish(Termination(type="error", code=exc.code, detail=str(exc)))
            message = Message(
                id=self._message_id(take=True), role="assistant", content=response.text,
                tool_calls=list(response.tool_calls) or None,
            )
            self._emit(MessageAppended(message=message))
            self._emit(InferenceCompleted(
                model=response.model, usage=response.usage, duration_ms=self.entropy.now_ms() - t0,
                stop_reason=response.stop_reason, message_id=message.id,
                request_digest=digest_of(request), request_digests=part_digests_of(request),
            ))
            actions = await self._hook("after_inference", response)
            self._apply_patches(actions, "plugin")
            term = self._terminate(actions)
            if term is not None:
                return await self._finish(term)
            if not response.tool_calls:
                return await self._finish(Termination(type="natural_end"))
            plans = [self._plan(c) for c in response.tool_calls]
            if self.spec.tool_execution_mode == "sequential":
                await self._round_sequential(plans)
            else:
                await self._round_parallel(plans)
            if await self._step_end():
                return

    async def _compact(self) -> None:
        """Context compaction (`agentlog.runtime.context`): when the agent's policy asks for a summary
        now, get one and stage it as `ContextCompacted` (it commits with the inference, so a
        resume or replay folds it and sends the same context). A failed summary is logged and
        the step goes on with truncation only."""
        policy = self.spec.context
        if policy is None or not policy.summarize:
            return
        older = plan_summary(policy, self.ctx.messages, self.ctx.compaction)
        if older is None:
            return
        model = policy.summary_model or self.spec.model
        name = model if isinstance(model, str) else self.spec.model_name
        request = summary_request(policy, name, older, self.ctx.compaction)
        try:
            res = await self._race(self.summarizer.summarize(model, request))
        except ModelError as exc:
            self.log.warning("context.summary_failed", error=str(exc))
            return
        before = context_tokens(policy, self.ctx.messages, self.ctx.compaction)
        event = ContextCompacted(summary=res.text, upto_message_id=older[-1].id, model=res.model, usage=res.usage,
                                 tokens_before=before)
        after = context_tokens(policy, self.ctx.messages, event)
        self._emit(msgspec.structs.replace(event, tokens_after=after))
        self.log.info("context.compacted", upto=event.upto_message_id, tokens_before=before, tokens_after=after)

    # -- tool rounds ---------------------------------------------------------------------------

    def _plan(self, call: ToolCall) -> CallPlan:
        return plan_call(call, self._agent_tools, self.ctx.frontend_tools)

    async def _gate(self, plan: CallPlan, replay: _Replay | None = None) -> GateDecision:
        """BeforeToolExecute, then: a frontend tool call the gate lets run never runs here: it
        suspends for the client (`frontend_ticket`), whose result the decision carries. So
        permission rules (deny / ask) apply to frontend tools too, and an approved `ask` on
        one (replay_tool_call) comes back here and suspends for the client."""
        decision = await self._gate_hooks(plan, replay)
        if plan.frontend and decision.kind == "run":
            return GateDecision("suspend", decision.events, ticket=frontend_ticket(plan.call))
        return decision

    async def _gate_hooks(self, plan: CallPlan, replay: _Replay | None = None) -> GateDecision:
        """BeforeToolExecute for one call, staged. Pre-failed calls get no hooks. A replayed call
        (replay_tool_call) goes through the hooks again with the decision in the phase context;
        pass_decision_to_tool hands the decision straight to the tool (no gate)."""
        if plan.failure is not None:
            return GateDecision("fail", reason=plan.failure)
        if replay is not None and replay.mode == "pass_decision_to_tool":
            return GateDecision("run")
        decision = replay.decision if replay is not None else None
        actions = await self._hook("before_tool_execute", plan.call, decision=decision)
        decision = resolve_gate(plan.call.id, actions)
        for ev in decision.events:
            self._emit(ev)
        self._apply_patches(actions, "plugin")
        return decision

    async def _settle(self, plan: CallPlan, decision: GateDecision) -> bool:
        """Stage the outcome of a call that does not run. Returns True if it suspended."""
        if decision.kind == "suspend":
            self._emit(ToolCallSuspended(call_id=plan.call.id, ticket=decision.ticket))  # type: ignore[arg-type]
            return True
        result = decision.result if decision.kind == "result" else ToolResult.failure(decision.reason or "blocked")
        await self._complete(plan, result, [])  # type: ignore[arg-type]
        return False

    def _start(self, plan: CallPlan, replay: _Replay | None = None) -> _Running:
        self._emit(ToolCallStarted(call_id=plan.call.id, name=plan.call.name, arguments=plan.call.arguments))
        running = _Running(plan, asyncio.Event(), decision=replay.decision if replay is not None else None)
        self._running[plan.call.id] = running
        return running

    def _rerun(self, plan: CallPlan, decision: ToolCallDecision | None) -> _Running:
        """A call whose `ToolCallStarted` is committed but whose outcome is not (its worker died):
        it runs again under the same call_id, with no new event, so the log reads as if it ran
        once (at-least-once execution; the call_id is the tool's idempotency key)."""
        running = _Running(plan, asyncio.Event(), decision=decision)
        self._running[plan.call.id] = running
        return running

    async def _execute(self, running: _Running) -> tuple[ToolResult, list[dict[str, Any]]]:
        plan = running.plan
        call_id = plan.call.id
        progress = None
        if self._live_on:
            thread_id, run_id, live = self.ctx.thread_id, self.ctx.run_id, self.live

            def progress(data: Any) -> None:
                live.publish(thread_id, run_id, {"type": "tool_progress", "call_id": call_id, "data": data})

        tctx = ToolContext(
            thread_id=self.ctx.thread_id, run_id=self.ctx.run_id, call_id=call_id, agent_id=self.spec.id,
            tool_name=plan.call.name, state=self.ctx.state, progress=progress, cancelled=running.cancel,
            decision=running.decision,
        )
        running.ctx = tctx
        if self._older_factory is not None and self._older is None:
            # after a snapshot resume: the older messages load while the tool runs (not before
            # it starts: their read and decode would compete with the replay's start)
            invocation = asyncio.ensure_future(plan.tool.invoke(plan.call.arguments, tctx))  # type: ignore[union-attr]
            self.prefetch_messages()
            result = await invocation
        else:
            result = await plan.tool.invoke(plan.call.arguments, tctx)  # type: ignore[union-attr]
        return result, tctx.ops

    async def _complete(self, plan: CallPlan, result: ToolResult, ops: list[dict[str, Any]]) -> bool:
        """Stage a finished call: its state edits (validated), completion and result message,
        AfterToolExecute actions. A pending result suspends the call instead. Returns True if
        it suspended."""
        call = plan.call
        self._running.pop(call.id, None)
        if ops:
            try:
                self._emit(StatePatched(ops=ops, source=f"tool:{call.name}"))
            except InvalidPatch as exc:
                result = ToolResult.failure(f"tool {call.name!r} made an invalid state edit: {exc}")
        actions = await self._hook("after_tool_execute", call, result)
        self._apply_patches(actions, "plugin")
        self._queued_user.extend(a.text for a in actions if isinstance(a, AddUserMessage))
        if result.status == "pending":
            self._emit(ToolCallSuspended(call_id=call.id, ticket=result.ticket))  # type: ignore[arg-type]
            return True
        outcome, value, content = classify_result(result)
        message_id = self.entropy.new_id()
        self._emit(ToolCallCompleted(call_id=call.id, outcome=outcome, result=value, message_id=message_id))  # type: ignore[arg-type]
        self._emit(MessageAppended(message=Message(id=message_id, role="tool", content=content, tool_call_id=call.id)))
        return False

    async def _round_sequential(
        self, plans: list[CallPlan], replays: Mapping[str, _Replay] | None = None,
        started: Mapping[str, ToolCallDecision | None] | None = None,
    ) -> bool:
        """One call at a time, in order; each completion commits with the next call's start.
        Stops at the first suspension (the rest stay unstarted until it is decided): returns
        True if it stopped there. `started`: calls whose start is already committed (a resume
        after a crash) run again without gate or new event."""
        replays = replays or {}
        started = started or {}
        for plan in plans:
            if plan.call.id in started:
                running = self._rerun(plan, started[plan.call.id])
            else:
                replay = replays.get(plan.call.id)
                decision = await self._gate(plan, replay)
                if decision.kind != "run":
                    if await self._settle(plan, decision):
                        return True
                    continue
                running = self._start(plan, replay)
            await self._flush()
            result, ops = await self._race(self._execute(running), running.cancel)
            if await self._complete(plan, result, ops):
                return True
        return False

    async def _round_parallel(
        self, plans: list[CallPlan], replays: Mapping[str, _Replay] | None = None,
        started: Mapping[str, ToolCallDecision | None] | None = None,
    ) -> None:
        """All calls of the step at once; each completion is committed as it finishes (the last
        one carries the step end). Simultaneous completions are staged in call order.
        `started`: as in `_round_sequential`."""
        replays = replays or {}
        started = started or {}
        to_run: list[_Running] = []
        for plan in plans:
            if plan.call.id in started:
                to_run.append(self._rerun(plan, started[plan.call.id]))
                continue
            replay = replays.get(plan.call.id)
            decision = await self._gate(plan, replay)
            if decision.kind == "run":
                to_run.append(self._start(plan, replay))
            else:
                await self._settle(plan, decision)
        to_run += await self._live_replays()
        if not to_run:
            return
        await self._flush()
        order = {r.plan.call.id: i for i, r in enumerate(to_run)}
        tasks = {asyncio.ensure_future(self._execute(r)): r for r in to_run}
        waiter = self._waiter()
        poked: asyncio.Future[Any] | None = None
        try:
            while tasks:
                if self._cancel.is_set():
                    raise _Cancelled()
                if poked is None or poked.done():
                    poked = asyncio.ensure_future(self._poked.wait())
                done, _ = await asyncio.wait((*tasks, waiter, poked), return_when=asyncio.FIRST_COMPLETED)
                if self._cancel.is_set():
                    raise _Cancelled()
                finished = sorted((t for t in done if t in tasks), key=lambda t: order[tasks[t].plan.call.id])
                for task in finished:
                    running = tasks.pop(task)
                    result, ops = task.result()
                    await self._complete(running.plan, result, ops)
                if poked in done:
                    await self._absorb_poke()
                # decisions that arrived (poke, or folded by a flush's conflict) start now
                for running in await self._live_replays():
                    order[running.plan.call.id] = len(order)
                    tasks[asyncio.ensure_future(self._execute(running))] = running
                if tasks:
                    await self._flush()
        except BaseException:
            for task, running in tasks.items():
                running.cancel.set()
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if poked is not None and not poked.done():
                poked.cancel()

    async def _step_end(self) -> bool:
        """StepEnd: queued user messages, plugin actions, StepFinished, then the verdict: finish
        (terminate / stop condition), wait (suspended calls), or go on. Returns True when the
        run loop should exit. Everything rides in the commit of the step's last completion."""
        for text in self._queued_user:
            self._emit(MessageAppended(message=Message(id=self.entropy.new_id(), role="user", content=text)))
        self._queued_user = []
        actions = await self._hook("step_end")
        self._apply_patches(actions, "plugin")
        if self.ctx.suspended and not self.ctx.running:
            await self._absorb_poke()
            while self.ctx.suspended and self._live_ready():  # decided while the others ran
                await self._round_parallel([])
        if self.ctx.suspended and not self.ctx.running:
            self._emit(StepFinished(step=self.ctx.step))
            self._emit(RunSuspended(call_ids=list(self.ctx.suspended)))
            await self._flush()
            return await self._resume_if_decided()
        term = self._terminate(actions)
        if term is None:
            self._emit(StepFinished(step=self.ctx.step))
            term = evaluate_stop(self._stop_conditions, stop_input(self.ctx, self.entropy.now_ms()))
        if term is not None:
            await self._finish(term)
            return True
        await self._flush(wait=False)  # the round trip overlaps the next inference
        return False

    # -- the end -------------------------------------------------------------------------------

    async def _finish(self, termination: Termination) -> None:
        """RunEnd: answer any unanswered call of the current step (cancelled), close the step,
        RunFinished with the summed usage; one commit with whatever is still staged."""
        ctx = self.ctx
        for call_id in ctx.step_calls:
            if call_id not in ctx.answered:
                self._emit_cancelled(call_id)
        if ctx.step_open:
            self._emit(StepFinished(step=ctx.step))
        actions = await self._hook("run_end")
        self._apply_patches(actions, "plugin")
        self._emit(RunFinished(termination=termination, usage=ctx.usage))
        await self._flush()

    def _emit_cancelled(self, call_id: str, why: str = "cancelled") -> None:
        message_id = self.entropy.new_id()
        self._emit(ToolCallCompleted(call_id=call_id, outcome="cancelled", result={"error": why}, message_id=message_id))
        content = "Error: the call was cancelled" if why == "cancelled" else f"Error: the call was {why}"
        self._emit(MessageAppended(message=Message(
            id=message_id, role="tool", content=content, tool_call_id=call_id,
        )))

    async def _finish_cancelled(self) -> None:
        for running in self._running.values():
            running.cancel.set()
        self._running.clear()
        if self.ctx.finished is None:
            await self._finish(Termination(type="cancelled", detail="cancel requested"))

    # -- human in the loop (DESIGN 4.3) ---------------------------------------------------------

    def _commit_now(self) -> Commit:
        commit = Commit(
            commit_id=self.entropy.new_id(), thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
            ts=self._pending_ts, events=self._pending,
        )
        self._pending = []
        return commit

    async def _append_once(self) -> int:
        """Append what is staged at the version the context was folded at, without absorbing a
        conflict: a `VersionConflict` propagates so the caller re-folds and re-validates (what it
        decided may no longer hold). Used by the commits that open a resume or cancel a wait."""
        commit = self._commit_now()
        res = await self.store.append(commit, self.version)
        self.version = res.seq
        self.on_commit(StoredCommit(res.seq, commit))
        return res.seq

    def _plan_for(self, call_id: str) -> CallPlan:
        for call in self.ctx.step_tool_calls:
            if call.id == call_id:
                return self._plan(call)
        # a suspended call outside the current step's message cannot happen through this loop;
        # fail it clearly rather than guess its arguments
        return CallPlan(ToolCall(id=call_id, name="unknown"), None, f"tool call {call_id!r} not found in the run's step")

    async def begin_resume(self, decisions: Sequence[ToolCallDecision]) -> int:
        """The decision commit (a commit point): `ToolCallDecided` per new decision and, when the
        execution mode lets decided calls resume now (`hitl.ready_calls`), `RunResumed`,
        `ToolCallResuming{mode}` and the outcomes that need no tool run (cancel decisions,
        use_decision_as_tool_result). Returns the commit's seq; `run()` then replays the rest.
        Raises VersionConflict if the thread moved since the context was folded."""
        for d in decisions:
            self._emit(ToolCallDecided(call_id=d.target_id, decision=d))
        ready = ready_calls(self.spec.tool_execution_mode, self.ctx)
        self.resumed = list(ready)
        self._entry = "continue" if ready else "idle"
        if ready:
            await self._stage_resumes(ready, run_resumed=True)
        seq = await self._append_once()
        self.log.info("run.decided", decisions=[d.decision_id for d in decisions], resumed=ready, seq=seq)
        return seq

    async def _stage_resumes(self, ready: Sequence[str], *, run_resumed: bool) -> None:
        """Apply recorded decisions: [`RunResumed` when the run waited] + `ToolCallResuming{mode}`
        per call, and the outcomes that need no tool run (cancel decisions,
        use_decision_as_tool_result). replay_tool_call / pass_decision_to_tool calls stay
        `resuming` in the context: the loop re-drives them from there (`_pending_calls`), the
        same way a resume from the log does."""
        modes = {cid: self.ctx.suspended[cid].resume_mode for cid in ready}
        if run_resumed:
            self._emit(RunResumed(call_ids=list(ready)))
        for cid in ready:
            self._emit(ToolCallResuming(call_id=cid, mode=modes[cid]))
        for cid in ready:
            decision = self.ctx.resuming[cid]
            if decision.action == "cancel":
                why = "cancelled by a human" + (f": {decision.reason}" if decision.reason else "")
                self._emit_cancelled(cid, why)
            elif modes[cid] == "use_decision_as_tool_result":
                await self._complete(self._plan_for(cid), ToolResult.success(decision.result), [])

    def _live_ready(self) -> list[str]:
        """Decided calls a running (not waiting) run applies now: parallel_streaming each as it
        arrives, parallel_batch_approval once the whole batch is decided (`ready_calls`);
        sequential never has a call in flight next to a suspended one."""
        if self.spec.tool_execution_mode == "sequential":
            return []
        return ready_calls(self.spec.tool_execution_mode, self.ctx)

    async def _live_replays(self) -> list[_Running]:
        """Stage the live decisions' resumes and start the decided calls that need a tool run
        (gated again for replay_tool_call). Their commit is the caller's next flush."""
        ready = self._live_ready()
        if not ready:
            return []
        await self._stage_resumes(ready, run_resumed=False)
        started: list[_Running] = []
        for cid in ready:
            if cid not in self.ctx.resuming:
                continue  # answered by the decision itself
            plan = self._plan_for(cid)
            replay = _Replay(plan, self.ctx.resuming[cid], self.ctx.resume_modes.get(cid, "replay_tool_call"))
            gate = await self._gate(plan, replay)
            if gate.kind == "run":
                started.append(self._start(plan, replay))
            else:
                await self._settle(plan, gate)
        self.log.info("run.live_decisions", resumed=ready)
        return started

    def prepare_continue(self) -> None:
        """Make `run()` continue the run from its folded context (a resume from the log, after a
        crash or on another worker): nothing is appended before the loop's next commit point."""
        self._entry = "continue"

    def _pending_calls(self) -> tuple[list[CallPlan], dict[str, _Replay], dict[str, ToolCallDecision | None]]:
        """The current step's calls with work left at the last commit point, in the model's
        order: started but not completed (run again, `started`), and resuming after a decision
        but not yet started (gate + start per resume mode, `replays`)."""
        ctx = self.ctx
        order = [c.id for c in ctx.step_tool_calls]
        order += [cid for cid in (*ctx.running, *ctx.resuming) if cid not in order]
        plans: list[CallPlan] = []
        replays: dict[str, _Replay] = {}
        started: dict[str, ToolCallDecision | None] = {}
        for cid in order:
            if cid in ctx.answered or (cid not in ctx.running and cid not in ctx.resuming):
                continue
            plan = self._plan_for(cid)
            if cid in ctx.running:
                started[cid] = ctx.resuming.get(cid)
            else:
                replays[cid] = _Replay(plan, ctx.resuming[cid], ctx.resume_modes.get(cid, "replay_tool_call"))
            plans.append(plan)
        return plans, replays, started

    async def _continue(self) -> None:
        """Go on from the last commit point, whatever it was: a cancel request finishes the run;
        calls in flight run again, decided calls are re-driven, un-started sequential calls
        start; then the step ends as it would have (mid-step), or the decision's resume finishes
        (step already closed at the suspension), and the run steps on. An open step with
        nothing left in flight just ends; a closed one goes to the next inference (an
        inference that was not committed is redone)."""
        ctx = self.ctx
        if ctx.cancel_requested:
            raise _Cancelled()
        if ctx.step_open or ctx.resume_open:
            mid_step = ctx.step_open
            if not await self._resume_calls():
                return
            if mid_step:
                if await self._step_end():
                    return
            elif not await self._after_resume():
                return
        # else: the last commit closed a step (or started the run): the next inference
        await self._steps()

    async def _resume_if_decided(self) -> bool:
        """After the commit that made the run wait: a decision folded in by that commit's
        conflict (recorded just before it) is applied here, as a resume from the log would.
        Returns True (the loop exits: the run waits, or was driven to its end here)."""
        ready = ready_calls(self.spec.tool_execution_mode, self.ctx)
        if ready and self.ctx.waiting:
            await self._stage_resumes(ready, run_resumed=True)
            await self._continue()
        return True

    async def _resume_calls(self) -> bool:
        """Run the calls with work left (see `_pending_calls`), in the execution mode's manner,
        then the calls a sequential round left un-started. Returns False if the run ended."""
        plans, replays, started = self._pending_calls()
        sequential = self.spec.tool_execution_mode == "sequential"
        # decisions recorded mid-step (live) that no loop applied yet: the round applies them
        if plans or (self.ctx.step_open and self._live_ready()):
            if sequential:
                await self._round_sequential(plans, replays, started)
            else:
                await self._round_parallel(plans, replays, started)
        if sequential and not self.ctx.suspended:
            rest = [self._plan(c) for c in unstarted_calls(self.ctx)]
            if rest:
                await self._round_sequential(rest)
        return self.ctx.finished is None

    async def _after_resume(self) -> bool:
        """After the decided calls of a closed step: wait again (suspended calls left), finish
        (stop condition) or return True to go on with the next step."""
        for text in self._queued_user:
            self._emit(MessageAppended(message=Message(id=self.entropy.new_id(), role="user", content=text)))
        self._queued_user = []
        if self.ctx.suspended and not self.ctx.running:
            self._emit(RunSuspended(call_ids=list(self.ctx.suspended)))
            await self._flush()
            return not await self._resume_if_decided()
        term = evaluate_stop(self._stop_conditions, stop_input(self.ctx, self.entropy.now_ms()))
        if term is not None:
            await self._finish(term)
            return False
        await self._flush(wait=False)
        return True

    async def cancel_waiting(self, reason: str | None) -> int:
        """Cancel a run that waits for decisions, as one commit: `RunCancelRequested`, every
        suspended (and un-started) call of the step `cancelled`, `RunFinished{cancelled}`.
        Raises VersionConflict if the thread moved since the context was folded."""
        self._emit(RunCancelRequested(reason=reason))
        for call_id in self.ctx.step_calls:
            if call_id not in self.ctx.answered:
                self._emit_cancelled(call_id, "cancelled: the run was cancelled while it waited for a decision")
        if self.ctx.step_open:
            self._emit(StepFinished(step=self.ctx.step))
        actions = await self._hook("run_end")
        self._apply_patches(actions, "plugin")
        self._emit(RunFinished(termination=Termination(type="cancelled", detail=reason or "cancel requested"), usage=self.ctx.usage))
        return await self._append_once()

    # -- inference -----------------------------------------------------------------------------

    async def _infer(self, request: ModelRequest) -> ModelResponse:
        """Primary model with retries of retryable errors, then each fallback model in turn."""
        retry = self.spec.retry
        names: list[Any] = [request.model if request.model != self.spec.model_name else self.spec.model]
        names += self.spec.fallback_models
        last: ModelError | None = None
        for name in names:
            model = self.models.resolve(name)
            if isinstance(model, SelfRetrying):
                model = model.single_attempt()  # this policy owns retries: they must not multiply
            req = request if name is names[0] else msgspec.structs.replace(request, model=str(name))
            for attempt in range(retry.max_attempts):
                try:
                    return await self._stream(model, req)
                except ModelError as exc:
                    last = exc
                    self.log.warning("model.failed", model=req.model, attempt=attempt + 1, error=str(exc))
                    if not exc.retryable:
                        break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a broken model is a model error, not a crash
                    last = ModelError(f"model {req.model!r} failed: {type(exc).__name__}: {exc}")
                    break
                if attempt + 1 < retry.max_attempts:
                    delay = retry.delay_s(attempt + 1, getattr(last, "retry_after", None))
                    await asyncio.sleep(delay)  # backoff between provider attempts, not synchronisation
        assert last is not None
        raise last

    def _message_id(self, *, take: bool = False) -> str:
        """The assistant message id of this inference: drawn once, at the first live delta (so
        the deltas carry the id the commit will have: AG-UI / AI SDK clients then see one
        message, not a provisional one and the committed one) or at the commit. The draw happens
        in the same entropy order as before (nothing else draws ids during inference), so
        recorded logs replay unchanged; `take` hands it to the commit and resets."""
        mid = self._streaming_message_id or self.entropy.new_id()
        self._streaming_message_id = None if take else mid
        return mid

    async def _stream(self, model: Any, request: ModelRequest) -> ModelResponse:
        live_on = self._live_on
        step = self.ctx.step
        for_live = (self.ctx.thread_id, self.ctx.run_id)
        async for chunk in model.stream(request):
            t = type(chunk)
            if t is ModelDone:
                return chunk.response
            if live_on:
                if t is TextDelta:
                    self.live.publish(*for_live, {"type": "text_delta", "step": step, "text": chunk.text,
                                                  "message_id": self._message_id()})
                elif t is ToolCallDelta:
                    self.live.publish(*for_live, {
                        "type": "tool_call_delta", "step": step, "index": chunk.index,
                        "message_id": self._message_id(),
                        "call_id": chunk.call_id, "name": chunk.name, "arguments_delta": chunk.arguments_delta,
                    })
        raise ModelProtocolError(f"model {request.model!r} ended its stream without a final response")
