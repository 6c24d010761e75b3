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
  commit is the bare cancel finish) -- through `Runtime.signal_cancel` (no append). A message
  queued for the run that the loop took in its very next commit reaches it as the poke it got
  live (`Runtime.poke`).
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
  before the digest existed: pass `requests=`, e.g. from `agentlog.testing.RecordingModel`.)
- `ReplayEntropy` (entropy): ids and timestamps from the log, in the order the loop asks for them.
- tools (tools): answered from their recorded results by default, like Temporal activities (a
  replay never repeats a side effect); `tools_from_log=False` (or a list of the tools to answer
  from the log) re-executes the others for real, so a tool that now returns another value
  diverges at its `ToolCallCompleted`. Either way a finished result is held
  until its recorded turn: in parallel modes the recording proves the calls were in flight
  together, so completion order is timing, and replay reproduces the recorded timing instead of
  tolerating a different order.

The first difference raises `NonDeterminismError(position, expected, actual)`.

This module is the entry point (`verify_run`, its `ReplayReport`, the bench hook); the pure
reading of a recording is `agentlog.runtime.replay.plan`, the doubles at the injection points are
`agentlog.runtime.replay.answer`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agentlog.eventlog.events import ContextCompacted, Position, StoredCommit, Termination
from agentlog.eventlog.store import EventStore, first_commit
from agentlog.projections.fold import fold_commits
from agentlog.runtime.agents.catalog import AgentApp
from agentlog.runtime.agents.spec import AgentRegistry, derived_tools
from agentlog.runtime.context_policy import RecordedSummaries
from agentlog.runtime.digest import REQUEST_PARTS, differing_parts, request_digest, request_part_digests
from agentlog.runtime.facade import Runtime
from agentlog.runtime.models.base import ModelRequest
from agentlog.runtime.replay.answer import (
    ReplayBreakers,
    ReplayEntropy,
    ReplayModel,
    ReplayModels,
    ReplaySession,
    ReplayTool,
    VerifyingStore,
)
from agentlog.runtime.replay.plan import (
    EXTERNAL_EVENT_TYPES,
    EndOfRecording,
    NonDeterminismError,
    RecordedInference,
    RecordedOutcome,
    ReplayPlan,
    UnknownReplayRun,
    describe,
    is_external,
    next_session,
    plan_replay,
)
from agentlog.runtime.runs.handle import RunHandle, RunResult
from agentlog.runtime.tools import Tool

__all__ = [
    "NonDeterminismError", "ReplayEntropy", "ReplayModel", "ReplayPlan",
    "ReplayReport", "ReplayThroughput", "UnknownReplayRun", "VerifyingStore", "plan_replay", "replay_throughput",
    "REQUEST_PARTS", "differing_parts", "replay_app_digest", "request_digest", "request_part_digests", "verify_run",
    "EXTERNAL_EVENT_TYPES", "RecordedInference", "RecordedOutcome", "describe", "is_external", "next_session",
]


# == the entry point ==============================================================================


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
    first = await first_commit(store.read_run(run_id))
    if first is None:
        raise UnknownReplayRun(f"unknown run {run_id!r}")
    return [sc async for sc in store.read_thread(first.commit.thread_id)]


def _agents_and_tools(app: AgentApp) -> tuple[AgentRegistry, list[Tool]]:
    agents = app.agents if isinstance(app.agents, AgentRegistry) else AgentRegistry(app.agents)
    tools = list(app.tools)
    # the tools a `Runtime` registers for its agents (handoffs, tool_search: an app given as
    # agents + tools lacks them), so that replay answers them like every other tool
    names = {t.name for t in tools}
    tools += [t for t in derived_tools(agents, {a.id: a.description for a in agents}) if t.name not in names]
    return agents, tools


def replay_app_digest(app: AgentApp) -> str:
    """The `agentlog.runtime.digest.app_digest` of `app` as a `Runtime` built from it records it
    (`RunStarted.app.digest`): equal to a recorded run's digest when the app is unchanged."""
    from agentlog.runtime.digest import app_digest

    return app_digest(*_agents_and_tools(app))


async def _drive(rt: Runtime, plan: ReplayPlan, session: ReplaySession, handle: RunHandle) -> None:
    """Drive the run through every session the recording holds, the way the recording's parties
    did: each time the loop stops short of the recorded end (waiting, or its process stopped
    during a call that then went in doubt: `ReplaySession.interrupt`), apply what came next
    through the runtime's public API -- `decide()` with the recorded decisions, `cancel()` with
    the recorded reason, or `resume()` -- against the verifying store, so the commits they write
    are verified like any other (nothing is appended anywhere).

    A run whose process died and was continued by `Runtime.resume` needs nothing else: resume
    writes exactly the commits the uninterrupted loop would have (same ids, same timestamps), so
    the one replayed loop verifies them as it goes; only an in-doubt call shows where it stopped."""
    current: RunHandle | None = handle
    while session.error is None and current is not None:
        result = await _settled(current, session)
        if result is not None and result.termination is not None:
            return
        step = next_session(plan, session.verified)
        if step is None:
            return
        kind, arg = step
        if kind == "decide":
            current = (await rt.decide(plan.run_id, arg, thread_id=plan.thread_id)).handle
        elif kind == "cancel":
            await rt.cancel(plan.run_id, reason=arg)
            return
        else:
            resume = getattr(rt, "resume", None)
            current = await resume(plan.run_id, thread_id=plan.thread_id) if resume is not None else None


async def _settled(handle: RunHandle, session: ReplaySession) -> RunResult | None:
    """The run's result, or None when the replay stopped its loop as the recorded process
    stopped (`ReplaySession.interrupt`)."""
    interrupts = session.interrupts
    try:
        return await handle.result()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if session.interrupts == interrupts or (task is not None and task.cancelling()):
            raise
        return None


async def verify_run(
    log: EventStore | Sequence[StoredCommit],
    run_id: str,
    app: AgentApp,
    *,
    tools_from_log: bool | Iterable[str] = True,
    requests: Sequence[ModelRequest | str] | None = None,
    raise_on_divergence: bool = True,
    timeout_s: float = 60.0,
) -> ReplayReport:
    """Re-execute run `run_id` of `log` with the app's agents and tools and verify every commit.

    `app`: the user's `Runtime` (only its agents and tools are used), an `App`, or anything
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
    commits = await load_run_log(log, run_id) if not isinstance(log, Sequence) else list(log)
    plan = plan_replay(commits, run_id)
    agents, app_tools = _agents_and_tools(app)
    spec = agents.get(plan.agent_id)
    session = ReplaySession(plan, parallel=spec.tool_execution_mode != "sequential")
    entropy = ReplayEntropy(plan)
    model = ReplayModel(plan, session, entropy, requests, name=spec.model_name)
    store = VerifyingStore(plan, session)
    names = set(t.name for t in app_tools) if tools_from_log is True else set(tools_from_log or ())
    # tools that start other runs (sub-agents) always answer from the log: replay never acts
    names |= {t.name for t in app_tools if getattr(t, "replay_from_log", False)}
    tools = [ReplayTool.wrap(t, session, t.name in names) for t in app_tools]
    # context summaries are inputs from the log, like the model's answers
    summaries = RecordedSummaries([e for sc in plan.loop for e in sc.commit.events if type(e) is ContextCompacted])
    # every agent: a run that hands off goes on with another one
    rt = Runtime(store, agents=list(agents), tools=tools, models=ReplayModels(model), entropy=entropy,
                 summarizer=summaries, breakers=ReplayBreakers(plan), effects=False)

    pending_cancel: list[bool] = []

    def signal_cancel() -> None:
        # The recorded cancel request is already in the (verifying) log: signal the loop without
        # appending one (`Runtime.cancel` would append another, with fresh entropy).
        if not rt.signal_cancel(plan.run_id):
            pending_cancel.append(True)  # during begin(): signalled as soon as start returns

    pending_poke: list[bool] = []

    def poke() -> None:
        # a recorded queued message the loop read on its live poke: poke the replayed loop
        if not rt.poke(plan.run_id):
            pending_poke.append(True)  # during begin(): poked as soon as start returns

    session.on_interrupt = rt.abandon_runs
    store.on_cancel = signal_cancel
    store.on_poke = poke
    rt.app = plan.app
    try:
        async with asyncio.timeout(timeout_s):
            handle = await rt.start(plan.request)
            if pending_cancel:
                signal_cancel()
            if pending_poke:
                poke()
            await _drive(rt, plan, session, handle)
    except TimeoutError:
        if session.error is None:
            k = session.verified
            want = plan.loop[k].commit.events[0] if k < len(plan.loop) else None
            session.diverge(NonDeterminismError(
                Position(plan.loop[k].seq if k < len(plan.loop) else plan.segment[-1].seq + 1, 0), want, None,
                f"the loop made no progress for {timeout_s}s after {k} verified commit(s)", run_id=run_id,
            ))
    except EndOfRecording:
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
    log: EventStore | Sequence[StoredCommit], run_ids: Sequence[str], app: AgentApp,
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
