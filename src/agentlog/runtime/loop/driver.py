"""The phase loop of DESIGN 4.2, with its decisions pure and its I/O at the edges.

    RunStart -> [StepStart -> BeforeInference -> inference -> AfterInference ->
                 (BeforeToolExecute -> execute -> AfterToolExecute per call) -> StepEnd]* -> RunEnd

Three layers, so that verified replay can re-run the same code against a recorded log:

- `RunContext` + `apply_event` (`agentlog.runtime.loop.run_context`): the run's working state is a *fold* of
  events. The loop stages every event through `apply_event` before committing it, and a resumed
  run builds the same context by folding the log: one function, both paths.
- Pure decisions (`agentlog.runtime.loop.decisions`): `plan_call`, `resolve_gate`, `build_request`,
  `classify_result`, `stop.evaluate_stop` -- functions of (AgentSpec, RunContext, latest inputs).
- `RunLoop`: the driver, this module, composed of its parts, each an object it holds:
  `Staging` (`staging`: the run's state, staging and commits), `ActiveAgent` (`active_agent`:
  the agent driven now and its plugins), `Inference` (`inference`: model calls), `ToolRounds`
  (`rounds`: tool rounds, the step end and the run end) and `Resume` (`resume`: human in the
  loop and continuing from the log). Together they are the only place that touches the store,
  the model, the tools and the live sink, and the only place that reads the `Entropy`.

Commit points (each one eventlog commit under per-thread OCC, see `Staging.flush`):
run start; after inference (step start, assistant message, inference record, plus gate verdicts
and `ToolCallStarted` of the calls that start now); at each tool call's completion (its result,
message, state patch; the next sequential call's start rides along); and the run end, which rides
in the last commit when nothing else happens in between. A finished tool's completion is committed
as it finishes, so it never runs again after a crash.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import (
    AppRef,
    Commit,
    EffectEmitted,
    Message,
    MessageAppended,
    RunStarted,
    StatePatched,
    StepFinished,
    StepStarted,
    StoredCommit,
    Termination,
    ThreadCreated,
    ToolCallDecision,
)
from agentlog.eventlog.store import EventStore
from agentlog.runtime.agents.spec import AgentSpec, ModelRegistry
from agentlog.runtime.context_policy import ModelSummarizer, Summarizer
from agentlog.runtime.errors import RunConflict
from agentlog.runtime.inputs.request import RunRequest
from agentlog.runtime.inputs.run_input import CLIENT_STATE_SOURCE, RunInput, client_state_ops
from agentlog.runtime.live import LiveSink
from agentlog.runtime.logs import get_logger
from agentlog.runtime.loop.active_agent import ActiveAgent
from agentlog.runtime.loop.decisions import (
    stop_input,
    tool_specs,
)
from agentlog.runtime.loop.entropy import Entropy
from agentlog.runtime.loop.inference import Inference
from agentlog.runtime.loop.resume import Resume
from agentlog.runtime.loop.rounds import ToolRounds
from agentlog.runtime.loop.run_context import (
    RunContext,
    apply_event,
    copy_context,
    due_messages,
)
from agentlog.runtime.loop.staging import Cancelled, Requeue, Staging
from agentlog.runtime.models.base import ModelError, is_truncated
from agentlog.runtime.models.breaker import Breakers
from agentlog.runtime.outage import OutagePolicy
from agentlog.runtime.plugins import EffectSpec, ExcludeTools, IncludeOnlyTools, as_payload
from agentlog.runtime.stop import evaluate_stop
from agentlog.runtime.tools import Tool

__all__ = ["RunLoop"]


#: The internal user message that asks a model cut off by its output limit to go on.
CONTINUE_PROMPT = "Your answer was cut off by the output token limit. Continue exactly where it stopped."


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
        agents: Callable[[str], tuple[AgentSpec, Mapping[str, Tool]]] | None = None,
        breakers: Breakers | None = None,
        effects: bool = True,
    ) -> None:
        self.log = get_logger(thread_id=ctx.thread_id, run_id=ctx.run_id)
        if effects:
            on_commit = self._with_effects(on_commit)
        self.staging = Staging(ctx=ctx, version=version, store=store, entropy=entropy, on_commit=on_commit,
                               log=self.log, outage=outage, older_messages=older_messages)
        self.agent = ActiveAgent(self.staging, spec, tools, agents)
        self.inference = Inference(self.staging, self.agent, models, live,
                                   summarizer or ModelSummarizer(models), breakers)
        self.rounds = ToolRounds(self.staging, self.agent, live, continue_run=self._continue)
        self.resume = Resume(self.staging, self.agent, self.rounds, steps=self._steps)
        self._entry = "start"
        #: Calls the last `begin_resume` resumed (empty: decisions recorded, still waiting).
        self.resumed: list[str] = []
        self._start_termination: Termination | None = None

    # -- post-commit effects ---------------------------------------------------------------------

    def _with_effects(self, on_commit: Callable[[StoredCommit], None]) -> Callable[[StoredCommit], None]:
        """`on_commit`, then the handlers of the commit's `EffectEmitted` events (in order, each
        once; verified replay builds its loops with `effects=False`)."""
        self._effect_tasks: set[asyncio.Task[Any]] = set()

        def committed(stored: StoredCommit) -> None:
            on_commit(stored)
            for ev in stored.commit.events:
                if type(ev) is EffectEmitted:
                    self._run_effect(ev)

        return committed

    def _run_effect(self, ev: EffectEmitted) -> None:
        handler = self.agent.effect_handlers.get(ev.key)
        if handler is None:  # the agent changed (a handoff) after the effect was staged
            self.log.warning("effect.unhandled", key=ev.key)
            return
        state = copy.deepcopy(self.staging.ctx.state)
        try:
            if isinstance(handler, EffectSpec):
                result = handler.handle(as_payload(handler.payload, ev.payload), state)
            else:
                result = handler(ev.payload, state)
        except Exception:  # noqa: BLE001 - an effect's failure is logged, never the run's
            self.log.exception("effect.failed", key=ev.key)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._effect_tasks.add(task)

            def done(t: asyncio.Task[Any]) -> None:
                self._effect_tasks.discard(t)
                if not t.cancelled() and t.exception() is not None:
                    self.log.error("effect.failed", key=ev.key, error=repr(t.exception()))

            task.add_done_callback(done)

    # -- what the Runtime reads ------------------------------------------------------------------

    @property
    def ctx(self) -> RunContext:
        """The run's context: the fold of the thread up to `version`, plus what is staged."""
        return self.staging.ctx

    @property
    def version(self) -> int:
        """The thread version (seq) of the loop's last commit, or the last one it read."""
        return self.staging.version

    @property
    def spec(self) -> AgentSpec:
        """The agent driven now (another one after a handoff)."""
        return self.agent.spec

    @property
    def entropy(self) -> Entropy:
        return self.staging.entropy

    @property
    def snapshot_ready(self) -> bool:
        """True when `ctx` is exactly the fold of the thread up to `version` (nothing staged or
        in flight, every message loaded): only then may it be saved as a run snapshot."""
        return self.staging.settled

    def prefetch_messages(self) -> None:
        """Start loading the messages older than the snapshot (see `Staging.prefetch_messages`)."""
        self.staging.prefetch_messages()

    # -- cancellation --------------------------------------------------------------------------

    def request_cancel(self) -> None:
        self.staging.cancel.set()

    def fence(self) -> None:
        """Write nothing more for this run (`Staging.fence`): its process hands it back."""
        self.staging.fence()

    def poke(self) -> None:
        """Tell the loop the thread has new commits for it (a decision recorded in this process
        for one of its suspended calls): it reads them at once instead of at its next append."""
        self.staging.poked.set()

    # -- the run -------------------------------------------------------------------------------

    async def begin(self, request: RunRequest, messages: Sequence[Message], *, app: AppRef | None = None) -> None:
        """The run-start commit of `request` (checked by the caller, its ids chosen, its frontend
        tools normalised), whose input `messages` are: [ThreadCreated] + RunStarted (with the
        app starting it) + the messages + the client's state merged into the thread's
        (`StatePatched`, source `client`) (+ RunStart plugin patches). Raises VersionConflict
        if the thread moved since it was folded."""
        staging, agent = self.staging, self.agent
        ctx, spec = staging.ctx, agent.spec
        parent_run_id, parent_thread_id = request.parent_run_id, request.parent_thread_id
        if not ctx.thread_exists:
            staging.emit(ThreadCreated(resource_id=request.resource_id, parent_thread_id=parent_thread_id,
                                       metadata=dict(request.thread_metadata)))
        pool = spec.pool
        given = request.run_input or RunInput()
        staging.emit(RunStarted(run_id=ctx.run_id, agent_id=spec.id, parent_run_id=parent_run_id,
                                parent_thread_id=parent_thread_id, origin=request.origin,
                                frontend_tools=list(request.frontend_tools),
                                app=app,
                                model=None if pool is None else pool.choose(ctx.thread_id, ctx.run_id),
                                overrides=given.overrides, context=list(given.context),
                                forwarded_props=given.forwarded_props, answers=list(given.answers)))
        # the run's frontend tools are folded now: offer them from the first inference on
        agent.base_tool_specs = tool_specs(spec, agent.agent_tools, (), ctx)
        for m in messages:
            staging.emit(MessageAppended(message=m))
        ops = client_state_ops(ctx.state, given.state)
        if ops:
            staging.emit(StatePatched(ops=ops, source=CLIENT_STATE_SOURCE))
        rejected = await agent.filter_input(messages)  # before any model call, recorded
        if rejected is not None:
            self._start_termination = rejected
        else:
            actions = await agent.hook("run_start")
            agent.apply_patches(actions, "plugin")
            self._start_termination = agent.terminate(actions)
        seq = await staging.append_once()  # a conflict here fails the start
        self.log.info("run.started", agent_id=spec.id, parent_run_id=parent_run_id, seq=seq)

    async def begin_resume(self, decisions: Sequence[ToolCallDecision]) -> int:
        """The decision commit (`Resume.begin`): `run()` then replays the rest. Returns the
        commit's seq. Raises VersionConflict if the thread moved since the context was folded."""
        ready = await self.resume.begin(decisions)
        self.resumed = list(ready)
        self._entry = "continue" if ready else "idle"
        return self.staging.version

    def prepare_continue(self) -> None:
        """Make `run()` continue the run from its folded context (a resume from the log, after a
        crash or on another worker): nothing is appended before the loop's next commit point."""
        self._entry = "continue"

    async def cancel_waiting(self, reason: str | None) -> int:
        """Cancel a run that waits for decisions, as one commit (`Resume.cancel_waiting`).
        Raises VersionConflict if the thread moved since the context was folded."""
        return await self.resume.cancel_waiting(reason)

    async def run(self) -> RunContext:
        """Run to the end (or to `waiting`). Returns the final context; raises RunConflict."""
        staging = self.staging
        try:
            try:
                if self._entry == "continue":
                    await self._continue()
                elif self._entry == "idle":
                    pass  # decisions recorded, nothing resumes yet (partial batch)
                elif self._start_termination is not None:
                    await self.rounds.finish(self._start_termination)
                else:
                    await self._steps()
            except Cancelled:
                await self.rounds.finish_cancelled()
            except StoreUnavailable:
                # Still down past the outage deadline (`agentlog.runtime.outage`), or whether the failed
                # commit landed is unknown (a cluster losing its stream leader): the context already
                # holds its events, so finishing here could commit e.g. the cancel of a call whose
                # start never reached the log. Stop WITHOUT committing (no error finish, no call
                # recorded cancelled): the run stays resumable, the worker's command is redelivered
                # and the run resumes from what the log really holds.
                self.log.warning("run.store_unavailable_left_resumable", seq=staging.version)
                raise
            except (RunConflict, asyncio.CancelledError):
                raise
            except Exception as exc:  # plugin bugs, invalid plugin patches, other errors...
                if staging.ctx.finished is not None:
                    raise
                self.log.exception("run.error")
                code = getattr(exc, "code", None) or "internal_error"
                # staged events stay: an invalid event never gets staged (the fold raises first)
                await self.rounds.finish(Termination(type="error", code=code, detail=f"{type(exc).__name__}: {exc}"))
        finally:
            await staging.close()
        ctx = staging.ctx
        term = ctx.finished
        self.log.info(
            "run.waiting" if term is None else "run.finished",
            termination=None if term is None else term.type, code=None if term is None else term.code,
            steps=ctx.step, seq=staging.version,
        )
        return ctx

    async def _continue(self) -> None:
        await self.resume.continue_run()

    async def _steps(self) -> None:
        staging, agent, rounds, inference = self.staging, self.agent, self.rounds, self.inference
        while True:
            agent.follow_handoff()
            step = staging.ctx.step + 1
            staging.emit(StepStarted(step=step))
            actions = await agent.hook("step_start")
            agent.apply_patches(actions, "plugin")
            term = agent.terminate(actions)
            if term is not None:
                return await rounds.finish(term)
            agent.follow_handoff()
            actions = await agent.hook("before_inference")
            agent.apply_patches(actions, "plugin")
            term = agent.terminate(actions)
            if term is not None:
                return await rounds.finish(term)
            specs = agent.base_tool_specs
            # plugins' filters, and deferred tools promoted since (a state patch) change the offer
            if agent.spec.deferred_tools or any(isinstance(a, (ExcludeTools, IncludeOnlyTools)) for a in actions):
                specs = tool_specs(agent.spec, agent.agent_tools, actions, staging.ctx)
            await staging.messages_ready()
            await inference.compact()
            continuations = 0
            while True:
                try:
                    response = await inference.infer(specs, actions)
                except ModelError as exc:
                    inference.drop_stream()  # nothing of that stream is committed
                    self.log.warning("run.model_error", error=str(exc))
                    return await rounds.finish(Termination(type="error", code=exc.code, detail=str(exc)))
                if not is_truncated(response) or continuations >= agent.spec.max_continuations:
                    break
                # cut off by the output limit: keep the part, ask for the rest (recorded, so a
                # replay, answering the same stop reason from the log, asks again identically)
                continuations += 1
                self.log.info("inference.continued", stop_reason=response.stop_reason, continuation=continuations)
                staging.emit(MessageAppended(message=Message(
                    id=staging.entropy.new_id(), role="user", content=CONTINUE_PROMPT, visibility="internal",
                )))
            actions = await agent.hook("after_inference", response)
            agent.apply_patches(actions, "plugin")
            term = agent.terminate(actions)
            if term is not None:
                return await rounds.finish(term)
            if not response.tool_calls:
                if await self._natural_end():
                    return
                continue
            plans = [rounds.plan(c) for c in response.tool_calls]
            if agent.spec.tool_execution_mode == "sequential":
                await rounds.round_sequential(plans)
            else:
                await rounds.round_parallel(plans)
            if await rounds.step_end():
                return

    async def _natural_end(self) -> bool:
        """The model answered without tool calls: end the run, unless messages are queued for
        it (`MessageQueued`): then the step closes, they become user messages and the run goes
        on (returns False). A message queued while the end commit is on its way makes that
        commit conflict: the end is undone (`Requeue`: the context from before it, the step's
        own events committed alone under the commit id already drawn) and the run goes on, so
        a queued message is never left behind by a run that ended naturally (RunEnd hooks ran
        for the undone end; what they staged is dropped with it, and they run again at the real
        end). A resume or a verified replay meets the same conflict at the same commit, so they
        take the same path."""
        staging, rounds = self.staging, self.rounds
        await staging.drain()
        await staging.absorb_poke()
        if not due_messages(staging.ctx, ending=True):
            saved, mark = copy_context(staging.ctx), len(staging.pending)
            staging.finishing = True
            try:
                await rounds.finish(Termination(type="natural_end"))
                return True
            except Requeue as requeue:
                staging.finishing = False
                staging.ctx = saved
                for sc in requeue.absorbed:
                    for ev in sc.commit.events:
                        apply_event(saved, ev, sc.commit.ts, sc.commit.run_id)
                commit = requeue.commit
                staging.pending = []
                await staging.append(Commit(commit_id=commit.commit_id, thread_id=commit.thread_id,
                                            run_id=commit.run_id, ts=commit.ts, events=commit.events[:mark]))
            finally:
                staging.finishing = False
        ctx = staging.ctx
        staging.emit(StepFinished(step=ctx.step))
        # going on is a step like any other that goes on: the stop conditions apply
        term = evaluate_stop(self.agent.stop_conditions, stop_input(ctx, staging.entropy.now_ms()))
        if term is not None and rounds.over_budget(term):
            if await rounds.suspend_for_budget(term):
                return True
        elif term is not None:  # the queued messages stay untaken: the run stops as it would have
            await rounds.finish(term)
            return True
        staging.take_queued(ending=True)
        await staging.flush(wait=False)
        return False
