"""Verified replay (DESIGN 4.4): re-execute a recorded run against its own log and prove the loop
still writes exactly what it wrote then.

The loop is a deterministic function of (AgentSpec, log) plus what enters through its injection
points, so replay is built purely from those points -- nothing in `loop.py`/`runtime.py` knows it
is being replayed:

- `VerifyingStore` (store): instead of appending, compares each commit the loop would write with
  the next commit the loop recorded for that run, event by event, and answers with the recorded
  seq, so OCC versions, positions and `on_commit` are exactly as they were. Reads answer from the
  recorded thread up to the current point. Commits another party wrote in between (a cancel
  request, decisions recorded on their own, metadata edits) are made visible right after the
  loop commit they followed, so the loop meets them as it did: on its next append's
  `VersionConflict`, or -- when the recording shows the loop was idle until the cancel (its next
  commit is the bare cancel finish) -- through `Runtime.signal_cancel` (no append).
- Sessions (human in the loop): when the replayed loop stops short of the recording's end
  (waiting), replay applies what the recording shows came next through the runtime's own API on
  the verifying store: `decide()` with the recorded decisions (the decision commit, with what the
  runtime derived from it, is verified), `cancel()` with the recorded reason, `resume()` for
  decisions recorded alone. A run resumed after its process died needs no seam: `resume()` writes
  what the uninterrupted loop would have, ids and timestamps included.
- `ReplayModel` (models): answers the k-th inference from the recorded assistant message +
  `InferenceCompleted`; it also checks the *request* (system prompt, plugin context, tools,
  options, conversation) against the recorded `InferenceCompleted.request_digest`, because those
  change what the model was asked without changing any other committed event. (Logs written
  before the digest existed: pass `requests=`, e.g. from `RecordingModel`.)
- `ReplayEntropy` (entropy): ids and timestamps from the log, in the order the loop asks for them.
- tools (tools): answered from their recorded results by default, like Temporal activities (a
  replay never repeats a side effect); `tools_from_log=False` (or a list of the tools to answer
  from the log) re-executes the others for real, so a tool that now returns another value
  diverges at its `ToolCallCompleted`. Either way a finished result is held
  until its recorded turn: in parallel modes the recording proves the calls were in flight
  together, so completion order is timing, and replay reproduces the recorded timing instead of
  tolerating a different order.

The first difference raises `NonDeterminismError(position, expected, actual)`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from agentlog.log.errors import AgentlogError, VersionConflict
from agentlog.log.events import (
    AnyEvent,
    AppendResult,
    Commit,
    ContextCompacted,
    InferenceCompleted,
    Message,
    MessageAppended,
    Position,
    RunCancelRequested,
    RunFinished,
    RunStarted,
    RunSuspended,
    StatePatched,
    StoredCommit,
    Termination,
    ThreadCreated,
    ThreadMetadataUpdated,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.log.store import EventStore

from .agent import AgentRegistry, AgentSpec, ModelRegistry
from .context import RecordedSummaries
from .models.base import Model, ModelChunk, ModelDone, ModelError, ModelRequest, ModelResponse
from .tools import Tool, ToolContext, ToolRegistry, ToolResult

if TYPE_CHECKING:  # imported lazily: loop.py imports `request_digest` from here, runtime.py imports loop.py
    from .runtime import RunResult, Runtime

__all__ = [
    "AgentsAndTools", "NonDeterminismError", "RecordingModel", "ReplayApp", "ReplayEntropy", "ReplayModel", "ReplayPlan",
    "ReplayReport", "ReplayThroughput", "UnknownReplayRun", "VerifyingStore", "plan_replay", "replay_throughput",
    "REQUEST_PARTS", "differing_parts", "request_digest", "request_part_digests", "verify_run",
]

#: Event types other parties write beside the loop (cancel requests, metadata edits, decisions). A
#: commit made only of these is not the loop's, even when it carries the run's id: replay makes it
#: visible where it was recorded. A decision commit that also holds what the runtime derived from
#: the decisions (`RunResumed`, `ToolCallResuming`, outcomes needing no tool run) *is* the loop's:
#: replay re-drives it through `Runtime.decide()` with the recorded decisions and verifies it.
EXTERNAL_EVENT_TYPES: tuple[type, ...] = (RunCancelRequested, ToolCallDecided, ThreadMetadataUpdated)

_enc = msgspec.json.Encoder(order="deterministic")


# == errors =======================================================================================


def describe(event: AnyEvent | None, limit: int = 240) -> str:
    """`Type{fields}` of an event as JSON, bounded: enough to see what differs in a message."""
    if event is None:
        return "nothing"
    text = _enc.encode(event).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class NonDeterminismError(AgentlogError):
    """Replay diverged from the recording. `position` is where (in the recorded log, or one past
    the run's last commit for an extra one), `expected` the recorded event (None: the loop wrote
    more than was recorded), `actual` the event the loop would write (None: it wrote less, or the
    divergence is in something not committed, e.g. the model request)."""

    code = "non_determinism"

    def __init__(
        self, position: Position, expected: AnyEvent | None, actual: AnyEvent | None,
        detail: str | None = None, *, run_id: str | None = None,
    ) -> None:
        self.position = position
        self.expected = expected
        self.actual = actual
        self.detail = detail
        self.run_id = run_id
        run = f"run {run_id!r} " if run_id else ""
        text = (
            f"{run}replay diverged at {position}: expected {describe(expected)}, "
            f"actual {describe(actual)}"
        )
        super().__init__(text + (f" ({detail})" if detail else ""))


class UnknownReplayRun(AgentlogError, LookupError):
    code = "run_not_found"


class _EndOfRecording(Exception):
    """The replayed loop reached the end of an open recording (`ReplayPlan.open`): stop it."""


# == request digests ==============================================================================


def request_digest(request: ModelRequest) -> str:
    """sha256 of the canonical JSON of a model request (model, messages incl. system prompt,
    tools, options). What `InferenceCompleted.request_digest` should hold (see module notes)."""
    return hashlib.sha256(_enc.encode(request)).hexdigest()


#: The parts of a model request `request_part_digests` digests, with the words an error uses.
REQUEST_PARTS: dict[str, str] = {
    "model": "model", "system": "system prompt (incl. plugin context)", "messages": "conversation",
    "tools": "tool list", "options": "model options",
}


def request_part_digests(request: ModelRequest) -> dict[str, str]:
    """Short (64-bit) digest of each part of a request, for `InferenceCompleted.request_digests`.
    They only *name* what changed; the full `request_digest` decides whether anything did. The
    system message is built from the agent's prompt and plugins' `AddContext`, so it is one part."""
    system = [m for m in request.messages if m.role == "system"]
    parts: dict[str, Any] = {
        "model": request.model, "system": system,
        "messages": [m for m in request.messages if m.role != "system"],
        "tools": request.tools, "options": request.options,
    }
    return {k: hashlib.sha256(_enc.encode(v)).hexdigest()[:16] for k, v in parts.items()}


def differing_parts(recorded: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """The parts (as `REQUEST_PARTS` words) whose digests differ; pure."""
    return [word for key, word in REQUEST_PARTS.items() if key in recorded and recorded[key] != actual.get(key)]


class RecordingModel:
    """Wraps a model and keeps the request of every inference that completed, in order.

    For logs without `InferenceCompleted.request_digest`, and for tests that want the full
    request in the error: pass `requests=recorder.requests` to `verify_run` (a recorded digest
    still decides; the full request only names what differs)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        async for chunk in self.inner.stream(request):
            if isinstance(chunk, ModelDone):
                self.requests.append(request)
            yield chunk


def _request_difference(expected: ModelRequest, actual: ModelRequest) -> str:
    """Name the first part of two requests that differs (for the error message)."""
    if expected.model != actual.model:
        return f"model {expected.model!r} != {actual.model!r}"
    exp_sys = [m.content for m in expected.messages if m.role == "system"]
    act_sys = [m.content for m in actual.messages if m.role == "system"]
    if exp_sys != act_sys:
        return f"system prompt {exp_sys!r} != {act_sys!r}"
    for i, (a, b) in enumerate(zip(expected.messages, actual.messages, strict=False)):
        if a != b:
            return f"messages[{i}] {describe(a)} != {describe(b)}"  # type: ignore[arg-type]
    if len(expected.messages) != len(actual.messages):
        return f"{len(expected.messages)} messages != {len(actual.messages)}"
    if expected.tools != actual.tools:
        return f"tools {[t.name for t in expected.tools]} != {[t.name for t in actual.tools]}"
    return f"options {expected.options!r} != {actual.options!r}"


# == the plan: a pure reading of the recorded log =================================================


@dataclass(frozen=True, slots=True)
class RecordedOutcome:
    """How one execution of a call ended in the recording: in loop commit `loop_index`."""

    loop_index: int
    event: ToolCallCompleted | ToolCallSuspended
    ops: tuple[dict[str, Any], ...] = ()

    @property
    def cancelled(self) -> bool:
        return isinstance(self.event, ToolCallCompleted) and self.event.outcome == "cancelled"

    def as_result(self) -> ToolResult:
        ev = self.event
        if isinstance(ev, ToolCallSuspended):
            t = ev.ticket
            return ToolResult(status="pending", ticket=t)
        if ev.outcome == "succeeded":
            return ToolResult.success(ev.result)
        res = ev.result if isinstance(ev.result, dict) else {"error": str(ev.result)}
        return ToolResult.failure(str(res.get("error", "tool failed")), value=res.get("value"))


@dataclass(frozen=True, slots=True)
class RecordedInference:
    position: Position
    message: Message
    record: InferenceCompleted


@dataclass(frozen=True)
class ReplayPlan:
    """Everything replay needs, read once from the recorded thread. Pure and immutable."""

    run_id: str
    thread_id: str
    agent_id: str
    parent_run_id: str | None
    origin: str
    resource_id: str | None
    #: The run's input messages (from its start commit), passed back as-is (ids included).
    messages: tuple[Message, ...]
    #: Thread commits before the run's start: what the loop folds before it begins.
    history: tuple[StoredCommit, ...]
    #: Thread commits from the run's start to its last loop commit (loop + external), in order.
    segment: tuple[StoredCommit, ...]
    #: The commits the loop wrote, in order.
    loop: tuple[StoredCommit, ...]
    inferences: tuple[RecordedInference, ...]
    #: Per call id, its recorded executions' outcomes, in order.
    outcomes: Mapping[str, tuple[RecordedOutcome, ...]]
    #: Per loop-commit index, the started calls whose outcome it holds (completion groups).
    groups: Mapping[int, frozenset[str]]
    #: Ids in the order the loop asks its entropy for them, and commit id -> next commit's ts.
    ids: tuple[str, ...]
    next_ts: Mapping[str, int]
    termination: Termination | None
    has_cancel: bool
    #: The run's frontend tools as recorded in its `RunStarted` (passed back to `start`).
    frontend_tools: tuple[dict[str, Any], ...] = ()
    #: A sub-agent run's parent thread, and its thread's metadata (`agentlog.runtime.subagents`).
    parent_thread_id: str | None = None
    thread_metadata: Mapping[str, Any] | None = None

    @property
    def events(self) -> int:
        return sum(len(sc.commit.events) for sc in self.loop)

    @property
    def open(self) -> bool:
        """The recording stops mid-run: not finished and not waiting (the run is going on
        elsewhere, or its process died and nobody resumed it yet). Replay verifies what is
        recorded and stops where the recording does; going on would be guessing."""
        return self.termination is None and not any(isinstance(e, RunSuspended) for e in self.loop[-1].commit.events)


def is_external(sc: StoredCommit, run_id: str) -> bool:
    """A commit of the run's segment the loop did not write."""
    if sc.commit.run_id != run_id:
        return True
    return all(isinstance(e, EXTERNAL_EVENT_TYPES) for e in sc.commit.events)


def plan_replay(commits: Sequence[StoredCommit], run_id: str) -> ReplayPlan:
    """Read a run's recording out of its thread's commits (any superset of them in log order)."""
    start = next(
        (i for i, sc in enumerate(commits)
         if sc.commit.run_id == run_id and any(isinstance(e, RunStarted) for e in sc.commit.events)),
        None,
    )
    if start is None:
        raise UnknownReplayRun(f"no RunStarted for run {run_id!r} in the log")
    thread_id = commits[start].commit.thread_id
    thread = [sc for sc in commits if sc.commit.thread_id == thread_id]
    start = next(i for i, sc in enumerate(thread) if sc is commits[start])
    last = max(i for i, sc in enumerate(thread) if sc.commit.run_id == run_id and not is_external(sc, run_id))
    segment = tuple(thread[start:last + 1])
    loop = tuple(sc for sc in segment if not is_external(sc, run_id))

    first = loop[0].commit
    started = next(e for e in first.events if isinstance(e, RunStarted))
    created = next((e for e in first.events if isinstance(e, ThreadCreated)), None)
    messages = tuple(e.message for e in first.events if isinstance(e, MessageAppended))

    ids: list[str] = [first.commit_id]
    next_ts: dict[str, int] = {}
    inferences: list[RecordedInference] = []
    outcomes: dict[str, list[RecordedOutcome]] = {}
    groups: dict[int, set[str]] = {}
    in_flight: set[str] = set()
    for k, sc in enumerate(loop):
        if k:
            for ev in sc.commit.events:
                mid = (ev.message.id if isinstance(ev, MessageAppended)
                       else ev.message_id if isinstance(ev, ToolCallCompleted) else None)
                if mid is not None and (not ids or ids[-1] != mid):
                    ids.append(mid)
            ids.append(sc.commit.commit_id)
        if k + 1 < len(loop):
            next_ts[sc.commit.commit_id] = loop[k + 1].commit.ts
        tool_ops: list[dict[str, Any]] = []
        assistant: Message | None = None
        for i, ev in enumerate(sc.commit.events):
            if isinstance(ev, MessageAppended) and ev.message.role == "assistant":
                assistant = ev.message
            elif isinstance(ev, InferenceCompleted) and assistant is not None:
                inferences.append(RecordedInference(Position(sc.seq, i), assistant, ev))
            elif isinstance(ev, ToolCallStarted):
                in_flight.add(ev.call_id)
            elif isinstance(ev, StatePatched) and (ev.source or "").startswith("tool:"):
                tool_ops = list(ev.ops)
            elif isinstance(ev, (ToolCallCompleted, ToolCallSuspended)):
                # Only the outcome of an execution (a start before it) answers a tool run: a
                # permission `ask` suspension, a denial or a decision-made result runs no tool.
                if ev.call_id in in_flight:
                    in_flight.discard(ev.call_id)
                    outcomes.setdefault(ev.call_id, []).append(RecordedOutcome(k, ev, tuple(tool_ops)))
                    if not (isinstance(ev, ToolCallCompleted) and ev.outcome == "cancelled"):
                        groups.setdefault(k, set()).add(ev.call_id)
                tool_ops = []
    termination = next(
        (e.termination for sc in loop for e in sc.commit.events if isinstance(e, RunFinished)), None
    )
    has_cancel = any(
        isinstance(e, RunCancelRequested) for sc in segment if sc.commit.run_id == run_id for e in sc.commit.events
    )
    return ReplayPlan(
        run_id=run_id, thread_id=thread_id, agent_id=started.agent_id, parent_run_id=started.parent_run_id,
        origin=started.origin, resource_id=created.resource_id if created else None, messages=messages,
        history=tuple(thread[:start]), segment=segment, loop=loop, inferences=tuple(inferences),
        outcomes={k: tuple(v) for k, v in outcomes.items()},
        groups={k: frozenset(v) for k, v in groups.items()}, ids=tuple(ids), next_ts=next_ts,
        termination=termination, has_cancel=has_cancel, frontend_tools=tuple(started.frontend_tools),
        parent_thread_id=started.parent_thread_id, thread_metadata=created.metadata if created else None,
    )


def _signals_cancel(plan: ReplayPlan, external: StoredCommit, next_loop: StoredCommit | None) -> bool:
    """Must the loop get the in-process cancel signal for this external commit, or only meet it on
    its next append? The recording tells: if the loop's next commit is the bare cancel finish (no
    inference, no tool result), the loop was idle (awaiting a tool or the model) until signalled;
    otherwise it kept working and saw the request on its append's VersionConflict."""
    if not any(isinstance(e, RunCancelRequested) for e in external.commit.events):
        return False
    if external.commit.run_id != plan.run_id or next_loop is None:
        return False
    evs = next_loop.commit.events
    finished = any(isinstance(e, RunFinished) and e.termination.type == "cancelled" for e in evs)
    worked = any(
        isinstance(e, InferenceCompleted)
        or (isinstance(e, ToolCallCompleted) and e.outcome != "cancelled")
        or isinstance(e, ToolCallSuspended)
        for e in evs
    )
    return finished and not worked


# == the session: shared replay state =============================================================


class _Session:
    """What the store, model, entropy and tools share: progress, the first divergence, and the
    release events that hold tool results until their recorded turn."""

    def __init__(self, plan: ReplayPlan, parallel: bool) -> None:
        self.plan = plan
        self.parallel = parallel
        self.verified = 0  # loop commits verified
        self.error: NonDeterminismError | None = None
        self.diverged = asyncio.Event()
        self.ready: set[str] = set()
        self._released: dict[int, asyncio.Event] = {}
        self._executions: dict[str, int] = {}
        self.executed = 0
        self.from_log = 0

    def diverge(self, error: NonDeterminismError) -> NonDeterminismError:
        if self.error is None:
            self.error = error
            self.diverged.set()
            for ev in self._released.values():
                ev.set()
        return self.error

    def next_outcome(self, call_id: str) -> RecordedOutcome | None:
        n = self._executions.get(call_id, 0)
        self._executions[call_id] = n + 1
        recorded = self.plan.outcomes.get(call_id, ())
        return recorded[n] if n < len(recorded) else None

    def _group(self, outcome: RecordedOutcome, call_id: str) -> frozenset[str]:
        if not self.parallel:
            return frozenset((call_id,))
        return self.plan.groups.get(outcome.loop_index, frozenset((call_id,)))

    def _maybe_release(self, index: int, group: frozenset[str]) -> None:
        event = self._released.setdefault(index, asyncio.Event())
        if not event.is_set() and self.verified >= index and group <= self.ready:
            # call_soon: every member is awaiting by then, so all wake in one loop iteration and
            # the loop's asyncio.wait sees them complete together, as recorded
            asyncio.get_running_loop().call_soon(event.set)

    def on_verified(self) -> None:
        self.verified += 1
        for index, event in list(self._released.items()):
            if not event.is_set():
                self._maybe_release(index, self.plan.groups.get(index, frozenset()) if self.parallel
                                    else frozenset())

    async def hold(self, call_id: str, outcome: RecordedOutcome | None) -> None:
        """Hold a finished call's result until its recorded turn: after the loop commit before
        its completion is verified and, in parallel modes, with the calls it completed with."""
        if outcome is None or outcome.cancelled:
            if self.plan.has_cancel:  # it was still running when the run was cancelled
                await self.diverged.wait()
            return
        group = self._group(outcome, call_id)
        self.ready.add(call_id)
        event = self._released.setdefault(outcome.loop_index, asyncio.Event())
        self._maybe_release(outcome.loop_index, group)
        await event.wait()


# == entropy ======================================================================================


class ReplayEntropy:
    """Ids and timestamps from the log.

    Ids: a queue of the recorded ids in the order the loop asks for them, which the loop fixes
    per commit: the ids of the commit's new messages (assistant, tool results, queued user
    messages) in event order, then its commit id at flush. The run's own ids (thread, run, input
    messages) are passed to `Runtime.start` instead. A different asking pattern is not hidden: the
    handed-out ids then land in other fields and the commit comparison reports it.

    Clock: the ts of the commit being built. Handing out commit k's id moves the clock to commit
    k+1's ts; an inference moves it by its recorded `duration_ms` (the model is called between the
    two readings the loop takes around it), so durations and stop-condition clocks come back as
    recorded. A stop condition read after an inference in the same commit sees ts + duration.
    """

    def __init__(self, plan: ReplayPlan) -> None:
        self._ids = deque(plan.ids)
        self._next_ts = plan.next_ts
        self._base = plan.loop[0].commit.ts
        self._offset = 0
        self._extra = 0

    def new_id(self) -> str:
        if not self._ids:
            self._extra += 1
            return f"unrecorded-{self._extra}"
        value = self._ids.popleft()
        ts = self._next_ts.get(value)
        if ts is not None:
            self._base, self._offset = ts, 0
        return value

    def now_ms(self) -> int:
        return self._base + self._offset

    def inference(self, duration_ms: int) -> None:
        self._offset = duration_ms


# == model ========================================================================================


class _RecordedModelError(ModelError):
    """The recorded run's inference failed: fail the same way (code and message)."""

    def __init__(self, code: str | None, detail: str | None) -> None:
        super().__init__(detail or "model failed")
        self.code = code or "model_error"


class ReplayModel:
    """Answers every inference from the recording, in order, after checking its request."""

    def __init__(
        self, plan: ReplayPlan, session: _Session, entropy: ReplayEntropy,
        requests: Sequence[ModelRequest | str] | None = None, name: str = "replay",
    ) -> None:
        self.plan = plan
        self.session = session
        self.entropy = entropy
        self.requests = requests
        self.name = name
        self.calls = 0

    def _check(self, index: int, request: ModelRequest) -> None:
        """The request must match the recorded `InferenceCompleted.request_digest` (or, for logs
        from before it existed, the caller's `requests`). A full recorded request, when given,
        only serves to name what differs."""
        rec = self.plan.inferences[index]
        given = self.requests[index] if self.requests is not None and index < len(self.requests) else None
        want = rec.record.request_digest
        if want is None and given is not None:
            want = given if isinstance(given, str) else request_digest(given)
        if want is None or want == request_digest(request):
            return
        detail = "the model request differs from the recorded one"
        if isinstance(given, ModelRequest):
            detail += ": " + _request_difference(given, request)
        elif rec.record.request_digests:
            parts = differing_parts(rec.record.request_digests, request_part_digests(request))
            detail += ": " + (", ".join(parts) + " changed" if parts else "a part not digested on its own changed")
        raise self.session.diverge(NonDeterminismError(
            rec.position, rec.record, None, detail, run_id=self.plan.run_id,
        ))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        index = self.calls
        plan = self.plan
        if self.session.error is not None:
            raise self.session.error
        if index < len(plan.inferences):
            self._check(index, request)
            self.calls += 1
            rec = plan.inferences[index]
            self.entropy.inference(rec.record.duration_ms)
            yield ModelDone(ModelResponse(
                model=rec.record.model, text=rec.message.content, tool_calls=list(rec.message.tool_calls or []),
                usage=rec.record.usage, stop_reason=rec.record.stop_reason,
            ))
            return
        if plan.open:
            raise _EndOfRecording()
        term = plan.termination
        if term is not None and term.type == "error":
            raise _RecordedModelError(term.code, term.detail)
        if plan.has_cancel:  # the recorded run was cancelled during this inference
            await self.session.diverged.wait()
            raise self.session.error or ModelError("replay ended")
        raise ModelError(f"replay: the log records no inference #{index + 1} for run {plan.run_id!r}")


class _ReplayModels(ModelRegistry):
    """Every model name (and model instance in a spec) resolves to the replay model."""

    def __init__(self, model: ReplayModel) -> None:
        super().__init__()
        self.model = model

    def resolve(self, model: str | Model) -> Model:
        return self.model


# == tools ========================================================================================


class _ReplayTool(Tool):
    """The app's tool, re-executed (or answered from the log), its result held until its turn."""

    _inner: Tool
    _session: _Session
    _from_log: bool

    @classmethod
    def wrap(cls, inner: Tool, session: _Session, from_log: bool) -> _ReplayTool:
        obj = cls.__new__(cls)
        obj.__dict__.update(inner.__dict__)
        obj.__dict__.pop("bind_runtime", None)  # a replay acts on no run (agentlog.runtime.subagents)
        obj._inner, obj._session, obj._from_log = inner, session, from_log
        return obj

    def validate(self, arguments: Any) -> dict[str, Any]:
        # the app tool's own check (a remote MCP tool validates by JSON Schema, not a model)
        return self._inner.validate(arguments)

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        session = self._session
        outcome = session.next_outcome(ctx.call_id)
        if outcome is None and session.plan.open:
            raise _EndOfRecording()  # never run a tool past the end of the recording
        if self._from_log:
            self.validate(arguments)
            session.from_log += 1
            if outcome is None:
                result = ToolResult.failure(f"replay: no recorded result for call {ctx.call_id!r}")
            elif outcome.cancelled:
                await session.diverged.wait()  # it ran until the run was cancelled
                result = ToolResult.failure("replay ended")
            else:
                ctx.patch(outcome.ops)
                result = outcome.as_result()
        else:
            session.executed += 1
            result = await self._inner.invoke(arguments, ctx)
        await session.hold(ctx.call_id, outcome)
        return result


# == the verifying store ==========================================================================


def _as_recorded(want: AnyEvent | None, got: AnyEvent | None) -> AnyEvent | None:
    """A log written before `InferenceCompleted.request_digests` existed records none: the
    replayed event is compared without it (the full `request_digest` is still checked)."""
    if (isinstance(want, InferenceCompleted) and want.request_digests is None
            and isinstance(got, InferenceCompleted) and got.request_digests is not None):
        return msgspec.structs.replace(got, request_digests=None)
    return got


class VerifyingStore:
    """An `EventStore` over one recorded run that verifies instead of appending.

    `append` compares the commit with the next recorded loop commit (events one by one, then the
    envelope: commit id, ts, run) and answers the recorded seq. Reads see the thread as it was at
    that point: the history before the run, the verified commits, and the external commits that
    followed them (so OCC sends the loop down its recorded `VersionConflict` path).
    """

    def __init__(self, plan: ReplayPlan, session: _Session) -> None:
        self.plan = plan
        self.session = session
        self.visible: list[StoredCommit] = list(plan.history)
        self.version = plan.history[-1].seq if plan.history else 0
        self.events_verified = 0
        self._segment_at = 0
        #: Called with the run id when a recorded cancel must reach the loop in-process.
        self.on_cancel: Any = None
        self.external = 0

    @property
    def verified(self) -> int:
        return self.session.verified

    def _diverge(self, position: Position, expected: AnyEvent | None, actual: AnyEvent | None,
                 detail: str | None = None) -> NonDeterminismError:
        return self.session.diverge(NonDeterminismError(position, expected, actual, detail, run_id=self.plan.run_id))

    async def append(self, commit: Commit, expected_version: int | None) -> AppendResult:
        if self.session.error is not None:
            raise self.session.error
        if expected_version is not None and expected_version != self.version:
            raise VersionConflict(commit.thread_id, expected_version, self.version)
        plan = self.plan
        index = self.session.verified
        if index >= len(plan.loop):
            if plan.open:
                raise _EndOfRecording()
            after = plan.segment[-1].seq + 1
            raise self._diverge(Position(after, 0), None, commit.events[0] if commit.events else None,
                                f"the loop wrote {index - len(plan.loop) + 1} commit(s) more than recorded")
        rec = plan.loop[index]
        expected = rec.commit
        for i in range(max(len(expected.events), len(commit.events))):
            want = expected.events[i] if i < len(expected.events) else None
            got = _as_recorded(want, commit.events[i] if i < len(commit.events) else None)
            if want != got:
                raise self._diverge(Position(rec.seq, i), want, got)
        for name in ("thread_id", "run_id", "commit_id", "ts"):
            if getattr(expected, name) != getattr(commit, name):
                raise self._diverge(
                    Position(rec.seq, 0), expected.events[0], commit.events[0],
                    f"commit {name} {getattr(expected, name)!r} != {getattr(commit, name)!r}",
                )
        self.visible.append(rec)
        self.version = rec.seq
        self.events_verified += len(expected.events)
        self.session.on_verified()
        self._reveal_external(rec)
        return AppendResult(rec.seq)

    def _reveal_external(self, after: StoredCommit) -> None:
        """Make the external commits recorded right after `after` visible, as they were."""
        segment = self.plan.segment
        while self._segment_at < len(segment) and segment[self._segment_at].seq <= after.seq:
            self._segment_at += 1
        while self._segment_at < len(segment) and is_external(segment[self._segment_at], self.plan.run_id):
            ext = segment[self._segment_at]
            self._segment_at += 1
            self.visible.append(ext)
            self.version = ext.seq
            self.external += 1
            nxt = self.session.verified
            next_loop = self.plan.loop[nxt] if nxt < len(self.plan.loop) else None
            if _signals_cancel(self.plan, ext, next_loop) and self.on_cancel is not None:
                self.on_cancel()

    async def read_thread(self, thread_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        for sc in list(self.visible):
            if sc.seq > after and sc.commit.thread_id == thread_id:
                yield sc

    async def read_run(self, run_id: str, after: int = 0) -> AsyncIterator[StoredCommit]:
        for sc in list(self.visible):
            if sc.seq > after and sc.commit.run_id == run_id:
                yield sc

    async def follow(self, thread_id: str | None = None, after: int = 0) -> AsyncIterator[StoredCommit]:
        """Replay has no live tail: the visible commits, then nothing (a reader must not wait)."""
        for sc in list(self.visible):
            if sc.seq > after and (thread_id is None or sc.commit.thread_id == thread_id):
                yield sc

    async def thread_version(self, thread_id: str) -> int:
        return self.version if thread_id == self.plan.thread_id else 0

    async def last_seq(self) -> int:
        return self.version


# == the entry point ==============================================================================


@dataclass(frozen=True)
class ReplayApp:
    """What replay needs from the user's app: its agents and tools (models, store, entropy and
    live sink always come from the replay)."""

    agents: Iterable[AgentSpec] | AgentRegistry
    tools: Iterable[Tool] | ToolRegistry = ()


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of a verified replay. `ok` is False only with `raise_on_divergence=False`."""

    run_id: str
    thread_id: str
    agent_id: str
    commits_verified: int
    events_verified: int
    commits_recorded: int
    external_commits: int
    inferences: int
    tools_executed: int
    tools_from_log: int
    termination: Termination | None
    status: str
    ok: bool = True
    divergence: NonDeterminismError | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "run_id", "thread_id", "agent_id", "commits_verified", "events_verified", "commits_recorded",
            "external_commits", "inferences", "tools_executed", "tools_from_log", "status", "ok")}
        out["termination"] = msgspec.to_builtins(self.termination)
        if self.divergence is not None:
            d = self.divergence
            out["divergence"] = {"position": str(d.position), "expected": msgspec.to_builtins(d.expected),
                                 "actual": msgspec.to_builtins(d.actual), "detail": d.detail, "message": str(d)}
        return out


async def load_run_log(store: EventStore, run_id: str) -> list[StoredCommit]:
    """The commits of the thread holding `run_id`, in log order."""
    thread_id = None
    async for sc in store.read_run(run_id):
        thread_id = sc.commit.thread_id
        break
    if thread_id is None:
        raise UnknownReplayRun(f"unknown run {run_id!r}")
    return [sc async for sc in store.read_thread(thread_id)]


class AgentsAndTools(Protocol):
    """The part of an app replay uses: a `Runtime`, a `ReplayApp`, `agentlog.api.app_loader.App`."""

    @property
    def agents(self) -> Any: ...

    @property
    def tools(self) -> Any: ...


def _agents_and_tools(app: AgentsAndTools) -> tuple[AgentRegistry, list[Tool]]:
    agents = app.agents if isinstance(app.agents, AgentRegistry) else AgentRegistry(app.agents)
    tools = list(app.tools)
    return agents, tools


def next_session(plan: ReplayPlan, verified: int) -> tuple[str, Any] | None:
    """What restarted the recorded run after its loop stopped (waiting, or gone), read from the
    next recorded loop commit: ("decide", decisions) for a decision commit that resumed calls,
    ("cancel", reason) for a cancel while waiting, ("resume", None) for anything else: decisions
    recorded on their own (a partial batch, or another process's) applied by `Runtime.resume`, or
    a run continued from the log after its process went away. None: nothing left to verify."""
    if verified >= len(plan.loop):
        return None
    events = plan.loop[verified].commit.events
    decisions = [e.decision for e in events if isinstance(e, ToolCallDecided)]
    if decisions:
        return "decide", decisions
    if events and isinstance(events[0], RunCancelRequested):
        return "cancel", events[0].reason
    return "resume", None


async def _drive(rt: Runtime, plan: ReplayPlan, session: _Session, first: RunResult) -> None:
    """Drive the run through every session the recording holds, the way the recording's parties
    did: each time the loop stops short of the recorded end (waiting), apply what came next
    through the runtime's public API -- `decide()` with the recorded decisions, `cancel()` with
    the recorded reason, or `resume()` -- against the verifying store, so the commits they write
    are verified like any other (nothing is appended anywhere).

    A run whose process died and was continued by `Runtime.resume` needs nothing here: resume
    writes exactly the commits the uninterrupted loop would have (same ids, same timestamps), so
    the one replayed loop verifies them as it goes."""
    result: RunResult | None = first
    while session.error is None and result is not None and result.termination is None:
        step = next_session(plan, session.verified)
        if step is None:
            return
        kind, arg = step
        if kind == "decide":
            res = await rt.decide(plan.run_id, arg, thread_id=plan.thread_id)
            result = await res.handle.result() if res.handle is not None else None
        elif kind == "cancel":
            await rt.cancel(plan.run_id, reason=arg)
            return
        else:
            resume = getattr(rt, "resume", None)
            handle = await resume(plan.run_id, thread_id=plan.thread_id) if resume is not None else None
            result = await handle.result() if handle is not None else None


async def verify_run(
    log: EventStore | Sequence[StoredCommit],
    run_id: str,
    app: AgentsAndTools,
    *,
    tools_from_log: bool | Iterable[str] = True,
    requests: Sequence[ModelRequest | str] | None = None,
    raise_on_divergence: bool = True,
    timeout_s: float = 60.0,
) -> ReplayReport:
    """Re-execute run `run_id` of `log` with the app's agents and tools and verify every commit.

    `app`: the user's `Runtime` (only its agents and tools are used), a `ReplayApp`, or anything
    with `agents` and `tools`. `tools_from_log`: True (the default: every tool, as Temporal never
    re-runs activities), False, or names of tools, to answer from the recorded results instead of
    running them; the others are re-executed for real (a changed tool value then diverges). `requests`: the recorded
    model requests (or their digests) in inference order, for logs written before
    `InferenceCompleted.request_digest` existed (a recorded digest wins).

    Human in the loop: a run that waited is verified across its decisions, a cancel while it
    waited, and continuations from the log (see `_drive`); a continuation run (`parent_run_id`)
    is verified on its own, its parent's decisions belong to the parent's verification.
    Raises `NonDeterminismError` at the first difference (or returns a report with `ok=False`).
    """
    from agentlog.views.fold import fold_commits

    from .runtime import Runtime

    commits = await load_run_log(log, run_id) if not isinstance(log, Sequence) else list(log)
    plan = plan_replay(commits, run_id)
    agents, app_tools = _agents_and_tools(app)
    spec = agents.get(plan.agent_id)
    session = _Session(plan, parallel=spec.tool_execution_mode != "sequential")
    entropy = ReplayEntropy(plan)
    model = ReplayModel(plan, session, entropy, requests, name=spec.model_name)
    store = VerifyingStore(plan, session)
    names = set(t.name for t in app_tools) if tools_from_log is True else set(tools_from_log or ())
    # tools that start other runs (sub-agents) always answer from the log: replay never acts
    names |= {t.name for t in app_tools if getattr(t, "replay_from_log", False)}
    tools = [_ReplayTool.wrap(t, session, t.name in names) for t in app_tools]
    # context summaries are inputs from the log, like the model's answers
    summaries = RecordedSummaries([e for sc in plan.loop for e in sc.commit.events if type(e) is ContextCompacted])
    rt = Runtime(store, agents=[spec], tools=tools, models=_ReplayModels(model), entropy=entropy,
                 summarizer=summaries)

    pending_cancel: list[bool] = []

    def signal_cancel() -> None:
        # The recorded cancel request is already in the (verifying) log: signal the loop without
        # appending one (`Runtime.cancel` would append another, with fresh entropy).
        signal = getattr(rt, "signal_cancel", None)
        if signal is not None:
            if not signal(plan.run_id):
                pending_cancel.append(True)  # during begin(): signalled as soon as start returns
            return
        active = rt._active.get(plan.run_id)  # noqa: SLF001 - runtimes without signal_cancel()
        if active is None:
            pending_cancel.append(True)
        else:
            active[0].request_cancel()

    store.on_cancel = signal_cancel
    try:
        async with asyncio.timeout(timeout_s):
            handle = await rt.start(
                plan.agent_id, list(plan.messages), thread_id=plan.thread_id, run_id=plan.run_id,
                parent_run_id=plan.parent_run_id, resource_id=plan.resource_id, origin=plan.origin,
                frontend_tools=list(plan.frontend_tools), parent_thread_id=plan.parent_thread_id,
                thread_metadata=plan.thread_metadata,
            )
            if pending_cancel:
                signal_cancel()
            await _drive(rt, plan, session, await handle.result())
    except TimeoutError:
        if session.error is None:
            k = session.verified
            want = plan.loop[k].commit.events[0] if k < len(plan.loop) else None
            session.diverge(NonDeterminismError(
                Position(plan.loop[k].seq if k < len(plan.loop) else plan.segment[-1].seq + 1, 0), want, None,
                f"the loop made no progress for {timeout_s}s after {k} verified commit(s)", run_id=run_id,
            ))
    except _EndOfRecording:
        pass  # an open recording fully verified; the loop was stopped where it ends
    except Exception:  # noqa: BLE001 - a divergence surfaces as whatever the loop made of it
        if session.error is None:
            raise
    if session.error is None and session.verified < len(plan.loop):
        nxt = plan.loop[session.verified]
        session.diverge(NonDeterminismError(
            Position(nxt.seq, 0), nxt.commit.events[0], None,
            f"the loop stopped after {session.verified} of {len(plan.loop)} recorded commits", run_id=run_id,
        ))
    error = session.error
    if error is not None and raise_on_divergence:
        raise error
    status = "diverged"
    if error is None:
        view = fold_commits(store.visible).runs.get(run_id)
        status = view.status if view is not None else "diverged"
    return ReplayReport(
        run_id=run_id, thread_id=plan.thread_id, agent_id=plan.agent_id, commits_verified=session.verified,
        events_verified=store.events_verified, commits_recorded=len(plan.loop), external_commits=store.external,
        inferences=model.calls, tools_executed=session.executed, tools_from_log=session.from_log,
        termination=plan.termination, status=status, ok=error is None, divergence=error,
    )


# == bench hook ===================================================================================


@dataclass(frozen=True)
class ReplayThroughput:
    runs: int
    commits: int
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


async def replay_throughput(
    log: EventStore | Sequence[StoredCommit], run_ids: Sequence[str], app: AgentsAndTools,
    **options: Any,
) -> ReplayThroughput:
    """Verify `run_ids` one after another and time it (for scripts/bench_replay.py). Raises the
    first divergence: a benchmark of a replay that does not verify measures nothing."""
    import time

    commits = events = 0
    t0 = time.perf_counter()
    for run_id in run_ids:
        report = await verify_run(log, run_id, app, **options)
        commits += report.commits_verified
        events += report.events_verified
    return ReplayThroughput(len(run_ids), commits, events, time.perf_counter() - t0)
