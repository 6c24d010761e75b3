"""Verified replay, the answering side: what stands in for the store, models, entropy and tools.

Each injection point of the loop gets a replay double that answers from the `ReplayPlan`:
`VerifyingStore` compares each commit with the recorded one instead of appending, `ReplayModel`
answers inferences (after checking the request digest), `ReplayEntropy` hands out the recorded ids
and timestamps, and `ReplayTool` answers tool calls from the log (or re-executes them) and holds
each result until its recorded turn. `ReplaySession` is the state they share. Apart from the entry
point (`agentlog.runtime.replay.verify`) so that the doubles, which are the subtle part, read on their own.
"""


from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from agentlog.eventlog.errors import VersionConflict
from agentlog.eventlog.events import (
    AnyEvent,
    AppendResult,
    CircuitBreakerChanged,
    Commit,
    Position,
    ProfileCommit,
    StoredCommit,
    StoredProfileCommit,
)
from agentlog.runtime.agents.spec import ModelRegistry
from agentlog.runtime.digest import differing_parts, request_digest, request_part_digests
from agentlog.runtime.models.base import (
    ContextOverflow,
    Model,
    ModelChunk,
    ModelDone,
    ModelError,
    ModelRequest,
    ModelResponse,
)
from agentlog.runtime.replay.plan import (
    EndOfRecording,
    NonDeterminismError,
    RecordedOutcome,
    ReplayPlan,
    as_recorded,
    is_external,
    request_difference,
    signals_cancel,
    signals_queued,
)
from agentlog.runtime.tools import Tool, ToolContext, ToolResult

# == the session: shared replay state =============================================================


class ReplaySession:
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
        #: Stops the replayed loop as its process stopped: fenced, its task cancelled, nothing
        #: written (set by `verify_run`: `Runtime.abandon_runs`).
        self.on_interrupt: Callable[[], object] | None = None
        #: How many recorded interruptions the replay reproduced.
        self.interrupts = 0

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

    def forget_execution(self, call_id: str) -> None:
        """An execution stopped with its loop (another call's interruption): the next
        execution of the call is the one the recording holds, not the one after it."""
        self._executions[call_id] -= 1

    async def interrupt(self, outcome: RecordedOutcome) -> None:
        """An execution the recording shows interrupted (`RecordedOutcome.interrupted`): wait
        for its turn (every loop commit before the in-doubt one verified), then stop the loop
        as its process stopped. The run's next session (`next_session`: a resume) writes the
        in-doubt commit."""
        event = self._released.setdefault(outcome.loop_index, asyncio.Event())
        self._maybe_release(outcome.loop_index, frozenset())
        await event.wait()
        if self.error is None and self.on_interrupt is not None:
            self.interrupts += 1
            self.on_interrupt()

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
        # added up: a commit may hold several inferences (an answer cut off by its output limit
        # and continued), each timed from the clock the previous one left
        self._offset += duration_ms


# == model ========================================================================================


class _RecordedModelError(ModelError):
    """The recorded run's inference failed: fail the same way (code and message)."""

    def __init__(self, code: str | None, detail: str | None) -> None:
        super().__init__(detail or "model failed")
        self.code = code or "model_error"


class ReplayModel:
    """Answers every inference from the recording, in order, after checking its request."""

    def __init__(
        self, plan: ReplayPlan, session: ReplaySession, entropy: ReplayEntropy,
        requests: Sequence[ModelRequest | str] | None = None, name: str = "replay",
    ) -> None:
        self.plan = plan
        self.session = session
        self.entropy = entropy
        self.requests = requests
        self.name = name
        self.calls = 0
        self._overflowed: set[int] = set()

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
            detail += ": " + request_difference(given, request)
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
            rec = plan.inferences[index]
            if rec.overflowed and index not in self._overflowed:
                self._overflowed.add(index)  # refused as too long first, as recorded
                raise ContextOverflow("replay: the recorded request overflowed the model's context")
            self._check(index, request)
            self.calls += 1
            self.entropy.inference(rec.record.duration_ms)
            yield ModelDone(ModelResponse(
                model=rec.record.model, text=rec.message.content, tool_calls=list(rec.message.tool_calls or []),
                usage=rec.record.usage, stop_reason=rec.record.stop_reason, cost=rec.record.cost,
                reasoning=list(rec.message.reasoning or []),
            ))
            return
        if plan.open:
            raise EndOfRecording()
        term = plan.termination
        if term is not None and term.type == "error":
            if term.code == ContextOverflow.code:
                raise ContextOverflow(term.detail or "context overflow")
            raise _RecordedModelError(term.code, term.detail)
        if plan.has_cancel:  # the recorded run was cancelled during this inference
            await self.session.diverged.wait()
            raise self.session.error or ModelError("replay ended")
        raise ModelError(f"replay: the log records no inference #{index + 1} for run {plan.run_id!r}")


class ReplayModels(ModelRegistry):
    """Every model name (and model instance in a spec) resolves to the replay model."""

    def __init__(self, model: ReplayModel) -> None:
        super().__init__()
        self.model = model

    def resolve(self, model: str | Model) -> Model:
        return self.model


# == circuit breakers =============================================================================


class ReplayBreakers:
    """The models' circuit breakers, from the log: every model is asked (the replay model answers
    as recorded), and each inference records the breaker changes the recording holds for it."""

    def __init__(self, plan: ReplayPlan) -> None:
        self._recorded = deque(plan.breaker_changes)

    def admit(self, model: str) -> tuple[bool, list[CircuitBreakerChanged]]:
        return True, []

    def report(self, model: str, ok: bool) -> list[CircuitBreakerChanged]:
        return []

    def settle(self, changes: list[CircuitBreakerChanged]) -> list[CircuitBreakerChanged]:
        return list(self._recorded.popleft()) if self._recorded else []


# == tools ========================================================================================


class ReplayTool(Tool):
    """The app's tool, re-executed (or answered from the log), its result held until its turn."""

    _inner: Tool
    _session: ReplaySession
    _from_log: bool

    @classmethod
    def wrap(cls, inner: Tool, session: ReplaySession, from_log: bool) -> ReplayTool:
        obj = cls.__new__(cls)
        obj.__dict__.update(inner.__dict__)
        obj.__dict__.pop("bind_runtime", None)  # a replay acts on no run (agentlog.runtime.toolkits.subagents)
        obj._inner, obj._session, obj._from_log = inner, session, from_log
        return obj

    def validate(self, arguments: Any) -> dict[str, Any]:
        # the app tool's own check (a remote MCP tool validates by JSON Schema, not a model)
        return self._inner.validate(arguments)

    async def invoke(self, arguments: Any, ctx: ToolContext) -> ToolResult:
        session = self._session
        outcome = session.next_outcome(ctx.call_id)
        if outcome is None and session.plan.open:
            raise EndOfRecording()  # never run a tool past the end of the recording
        if outcome is not None and outcome.interrupted:  # never run, also when re-executing tools
            await session.interrupt(outcome)
            return ToolResult.failure("replay: the recorded process stopped during this call")  # dropped: fenced
        try:
            return await self._answer(arguments, ctx, outcome)
        except asyncio.CancelledError:
            session.forget_execution(ctx.call_id)
            raise

    async def _answer(self, arguments: Any, ctx: ToolContext, outcome: RecordedOutcome | None) -> ToolResult:
        session = self._session
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
                ctx.emitted.extend(outcome.emitted)
                for write in outcome.writes:  # a reducer's action is reduced again
                    ctx.batch.replay(write, ctx.keys.get(write.key))
                result = outcome.as_result()
        else:
            session.executed += 1
            result = await self._inner.invoke(arguments, ctx)
        await session.hold(ctx.call_id, outcome)
        return result


# == the verifying store ==========================================================================


class VerifyingStore:
    """An `EventStore` over one recorded run that verifies instead of appending.

    `append` compares the commit with the next recorded loop commit (events one by one, then the
    envelope: commit id, ts, run) and answers the recorded seq. Reads see the thread as it was at
    that point: the history before the run, the verified commits, and the external commits that
    followed them (so OCC sends the loop down its recorded `VersionConflict` path).
    """

    def __init__(self, plan: ReplayPlan, session: ReplaySession) -> None:
        self.plan = plan
        self.session = session
        self.visible: list[StoredCommit] = list(plan.history)
        self.version = plan.history[-1].seq if plan.history else 0
        self.events_verified = 0
        self._segment_at = 0
        #: Called with the run id when a recorded cancel must reach the loop in-process.
        self.on_cancel: Any = None
        #: Called when a recorded queued message must reach the loop as the live poke it got.
        self.on_poke: Any = None
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
                raise EndOfRecording()
            after = plan.segment[-1].seq + 1
            raise self._diverge(Position(after, 0), None, commit.events[0] if commit.events else None,
                                f"the loop wrote {index - len(plan.loop) + 1} commit(s) more than recorded")
        rec = plan.loop[index]
        expected = rec.commit
        for i in range(max(len(expected.events), len(commit.events))):
            want = expected.events[i] if i < len(expected.events) else None
            got = as_recorded(want, commit.events[i] if i < len(commit.events) else None)
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
            if signals_cancel(self.plan, ext, next_loop) and self.on_cancel is not None:
                self.on_cancel()
            if signals_queued(self.plan, ext, next_loop) and self.on_poke is not None:
                self.on_poke()

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

    # profiles: the recording holds each write (`StateWritten` of scope profile, compared with
    # the loop's commits); nothing is appended, and a tool re-executed here reads no profile
    #: Tells `Staging.append_profile` not to check a recorded write against the profile again.
    replaying = True

    async def append_profile(self, commit: ProfileCommit, expected_version: int | None) -> AppendResult:
        return AppendResult(0)

    async def read_profile(self, profile_id: str, after: int = 0) -> AsyncIterator[StoredProfileCommit]:
        none: tuple[StoredProfileCommit, ...] = ()
        for sc in none:
            yield sc

