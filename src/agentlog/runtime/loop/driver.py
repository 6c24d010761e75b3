"""The phase loop of DESIGN 4.2, with its decisions pure and its I/O at the edges.

    RunStart -> [StepStart -> BeforeInference -> inference -> AfterInference ->
                 (BeforeToolExecute -> execute -> AfterToolExecute per call) -> StepEnd]* -> RunEnd

Three layers, so that verified replay can re-run the same code against a recorded log:

- `RunContext` + `apply_event` (`agentlog.runtime.loop.run_context`): the run's working state is a *fold* of
  events. The loop stages every event through `apply_event` before committing it, and a resumed
  run builds the same context by folding the log: one function, both paths.
- Pure decisions (`agentlog.runtime.loop.decisions`): `plan_call`, `resolve_gate`, `build_request`,
  `classify_result`, `stop.evaluate_stop` -- functions of (AgentSpec, RunContext, latest inputs).
- `RunLoop`: the driver, this module plus its parts (`loop_staging`: staging and commits,
  `loop_inference`: model calls, `loop_rounds`: tool rounds and the step end, `loop_resume`:
  human in the loop and continuing from the log). It is the only place that touches the store,
  the model, the tools and the live sink, and the only place that reads the `Entropy`.

Commit points (each one eventlog commit under per-thread OCC, see `StagingBase._flush`):
run start; after inference (step start, assistant message, inference record, plus gate verdicts
and `ToolCallStarted` of the calls that start now); at each tool call's completion (its result,
message, state patch; the next sequential call's start rides along); and the run end, which rides
in the last commit when nothing else happens in between. A finished tool's completion is committed
as it finishes, so it never runs again after a crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import (
    AgentHandedOff,
    AnyEvent,
    AppRef,
    Commit,
    ContextCompacted,
    InferenceCompleted,
    Message,
    MessageAppended,
    RunFinished,
    RunStarted,
    StatePatched,
    StepFinished,
    StepStarted,
    StoredCommit,
    Termination,
    ThreadCreated,
    ToolCallCompleted,
    ToolCallDecision,
)
from agentlog.eventlog.store import EventStore
from agentlog.runtime.agent import AgentSpec, ModelRegistry
from agentlog.runtime.context_policy import (
    ModelSummarizer,
    Summarizer,
    context_tokens,
    overflow_policy,
    plan_summary,
    summary_request,
)
from agentlog.runtime.errors import RunConflict
from agentlog.runtime.live import LiveSink
from agentlog.runtime.logs import SafeLog, get_logger
from agentlog.runtime.loop.decisions import (
    CallPlan,
    GateDecision,
    build_request,
    classify_result,
    digest_of,
    part_digests_of,
    plan_call,
    resolve_gate,
    stop_input,
    tool_specs,
)
from agentlog.runtime.loop.entropy import Entropy
from agentlog.runtime.loop.inference import Inference
from agentlog.runtime.loop.resume import Resume
from agentlog.runtime.loop.run_context import (
    RunContext,
    apply_event,
    copy_context,
    due_messages,
    fold_context,
)
from agentlog.runtime.loop.staging import Requeue, _Cancelled, _Running
from agentlog.runtime.models.base import ContextOverflow, ModelError, ModelResponse, is_truncated
from agentlog.runtime.outage import OutagePolicy
from agentlog.runtime.plugins import (
    Action,
    Emit,
    ExcludeTools,
    HandOff,
    IncludeOnlyTools,
    PatchState,
    PhaseContext,
    PluginError,
    Terminate,
    overrides,
    run_hook,
)
from agentlog.runtime.run_input import CLIENT_STATE_SOURCE, RunInput, client_state_ops
from agentlog.runtime.stop import evaluate_stop
from agentlog.runtime.tools import Tool

# The loop's public names stay importable from here (their homes since the split: run_context,
# decisions, loop_staging, logs).
__all__ = [
    "CallPlan", "GateDecision", "RunConflict", "RunContext", "RunLoop", "SafeLog", "apply_event", "build_request",
    "classify_result", "fold_context", "get_logger", "plan_call", "resolve_gate", "stop_input", "tool_specs",
]


#: The internal user message that asks a model cut off by its output limit to go on.
CONTINUE_PROMPT = "Your answer was cut off by the output token limit. Continue exactly where it stopped."


class RunLoop(Resume, Inference):
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
    ) -> None:
        #: How long a store operation waits through a NATS outage (see `agentlog.runtime.outage`).
        self.outage = outage
        self.ctx = ctx
        self.version = version
        self.store = store
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
        self._finishing = False
        #: Resolves an agent id to its spec and tools, for handoffs (`agentlog.runtime.handoff`);
        #: None: this loop cannot change agents (a `HandOff` then ends the run `error`).
        self.agents = agents
        self._use_agent(spec, tools)
        self._entry = "start"
        #: Calls the last `begin_resume` resumed (empty: decisions recorded, still waiting).
        self.resumed: list[str] = []
        self._start_termination: Termination | None = None
        self._live_on = live.enabled
        #: The id of the assistant message being streamed live (drawn at its first delta, see
        #: `_message_id`), so live deltas and the committed message share one id.
        self._streaming_message_id: str | None = None
        #: A context folded from a snapshot lacks the messages before it: they are loaded by
        #: this (started early by `prefetch_messages`, awaited before anything reads them).
        self._older_factory = older_messages
        self._older: asyncio.Future[list[Message]] | None = None
        self.summarizer = summarizer or ModelSummarizer(models)
        # a run resumed after a handoff: the agent of the open step's calls, else the active one
        self._follow_handoff(ctx.step_agent or ctx.agent_id)

    # -- the active agent (handoffs) -------------------------------------------------------------

    def _use_agent(self, spec: AgentSpec, tools: Mapping[str, Tool]) -> None:
        """Make `spec` the agent this loop drives: its tools, plugins and stop conditions."""
        self.spec = spec
        self.tools = tools
        self._stop_conditions = spec.effective_stop_conditions()
        self._hooks = {
            hook: [p for p in spec.plugins if overrides(p, hook)]
            for hook in (
                "run_start", "step_start", "before_inference", "after_inference",
                "before_tool_execute", "after_tool_execute", "step_end", "run_end",
            )
        }
        self._agent_tools = {n: tools[n] for n in spec.tools if n in tools}
        self._base_tool_specs = tool_specs(spec, self._agent_tools, (), self.ctx.frontend_tools)

    def _follow_handoff(self, agent_id: str | None = None) -> None:
        """Switch to the run's active agent (or `agent_id`) if it is another one. Called only
        where no call of the current step is left to plan (a step's calls belong to the agent
        whose inference asked for them), so a handoff takes effect at the next step."""
        want = agent_id or self.ctx.agent_id
        if want is None or want == self.spec.id or self.agents is None:
            return
        spec, tools = self.agents(want)
        self.log.info("run.agent_switched", from_agent=self.spec.id, to_agent=want)
        self._use_agent(spec, tools)

    def _hand_off(self, action: HandOff) -> None:
        if action.agent == self.ctx.agent_id:
            return
        if self.agents is None:
            raise PluginError(f"a handoff to {action.agent!r} needs a loop that can resolve agents")
        self.agents(action.agent)  # an unknown agent fails here, before anything is staged
        self._emit(AgentHandedOff(from_agent=self.ctx.agent_id or self.spec.id, to_agent=action.agent,
                                  reason=action.reason, call_id=action.call_id))

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
            elif isinstance(action, Emit):
                self._emit(action.event)
            elif isinstance(action, HandOff):
                self._hand_off(action)

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
                    frontend_tools: Sequence[dict[str, Any]] = (), parent_thread_id: str | None = None,
                    app: AppRef | None = None, run_input: RunInput | None = None) -> None:
        """The run-start commit: [ThreadCreated] + RunStarted (with the run's frontend tools,
        already normalised by the caller, the app starting it, and the client's overrides,
        context and forwarded props, already checked) + the new messages + the client's state
        merged into the thread's (`StatePatched`, source `client`) (+ RunStart plugin patches).
        `parent_thread_id`: a sub-agent run's parent thread (lineage in both events).
        Raises VersionConflict if the thread moved since it was folded."""
        if not self.ctx.thread_exists:
            self._emit(ThreadCreated(resource_id=resource_id, parent_thread_id=parent_thread_id,
                                     metadata=thread_metadata or {}))
        pool = self.spec.pool
        given = run_input or RunInput()
        self._emit(RunStarted(run_id=self.ctx.run_id, agent_id=self.spec.id, parent_run_id=parent_run_id,
                              parent_thread_id=parent_thread_id, origin=origin, frontend_tools=list(frontend_tools),
                              app=app,
                              model=None if pool is None else pool.choose(self.ctx.thread_id, self.ctx.run_id),
                              overrides=given.overrides, context=list(given.context),
                              forwarded_props=given.forwarded_props))
        # the run's frontend tools are folded now: offer them from the first inference on
        self._base_tool_specs = tool_specs(self.spec, self._agent_tools, (), self.ctx.frontend_tools)
        for m in messages:
            self._emit(MessageAppended(message=m))
        ops = client_state_ops(self.ctx.state, given.state)
        if ops:
            self._emit(StatePatched(ops=ops, source=CLIENT_STATE_SOURCE))
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
            self._follow_handoff()
            step = self.ctx.step + 1
            self._emit(StepStarted(step=step))
            actions = await self._hook("step_start")
            self._apply_patches(actions, "plugin")
            term = self._terminate(actions)
            if term is not None:
                return await self._finish(term)
            self._follow_handoff()
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
            continuations = 0
            while True:
                try:
                    response = await self._inference(specs, actions)
                except ModelError as exc:
                    self._streaming_message_id = None  # nothing of that stream is committed
                    self.log.warning("run.model_error", error=str(exc))
                    return await self._finish(Termination(type="error", code=exc.code, detail=str(exc)))
                if not is_truncated(response) or continuations >= self.spec.max_continuations:
                    break
                # cut off by the output limit: keep the part, ask for the rest (recorded, so a
                # replay, answering the same stop reason from the log, asks again identically)
                continuations += 1
                self.log.info("inference.continued", stop_reason=response.stop_reason, continuation=continuations)
                self._emit(MessageAppended(message=Message(
                    id=self.entropy.new_id(), role="user", content=CONTINUE_PROMPT, visibility="internal",
                )))
            actions = await self._hook("after_inference", response)
            self._apply_patches(actions, "plugin")
            term = self._terminate(actions)
            if term is not None:
                return await self._finish(term)
            if not response.tool_calls:
                if await self._natural_end():
                    return
                continue
            plans = [self._plan(c) for c in response.tool_calls]
            if self.spec.tool_execution_mode == "sequential":
                await self._round_sequential(plans)
            else:
                await self._round_parallel(plans)
            if await self._step_end():
                return

    async def _inference(self, specs: list[Any], actions: Sequence[Action]) -> ModelResponse:
        """One inference, staged (assistant message + `InferenceCompleted`). A provider refusing
        the request as too long (`ContextOverflow`) gets the conversation compacted once (a
        recorded `ContextCompacted`, reason "overflow") and the request sent again."""
        request = build_request(self.spec, self.ctx, specs, actions)
        t0 = self.entropy.now_ms()
        try:
            response = await self._race(self._infer(request))
        except ContextOverflow as exc:
            self._streaming_message_id = None
            if not await self._compact(force=True):
                raise
            self.log.warning("inference.overflow_compacted", error=str(exc))
            request = build_request(self.spec, self.ctx, specs, actions)
            t0 = self.entropy.now_ms()
            response = await self._race(self._infer(request))
        message = Message(
            id=self._message_id(take=True), role="assistant", content=response.text,
            tool_calls=list(response.tool_calls) or None, reasoning=list(response.reasoning) or None,
        )
        self._emit(MessageAppended(message=message))
        self._emit(InferenceCompleted(
            model=response.model, usage=response.usage, duration_ms=self.entropy.now_ms() - t0,
            stop_reason=response.stop_reason, message_id=message.id,
            request_digest=digest_of(request), request_digests=part_digests_of(request), cost=response.cost,
        ))
        return response

    async def _compact(self, *, force: bool = False) -> bool:
        """Context compaction (`agentlog.runtime.context_policy`): when the agent's policy asks for a summary
        now, get one and stage it as `ContextCompacted` (it commits with the inference, so a
        resume or replay folds it and sends the same context). A failed summary is logged and
        the step goes on with truncation only."""
        policy = self.spec.context
        if force:
            policy = overflow_policy(policy, self.ctx.messages, self.ctx.compaction)
        elif policy is None or not policy.summarize:
            return False
        older = plan_summary(policy, self.ctx.messages, self.ctx.compaction)
        if older is None:
            return False
        model = policy.summary_model or self.spec.model
        name = model if isinstance(model, str) else self.spec.model_name
        request = summary_request(policy, name, older, self.ctx.compaction)
        try:
            res = await self._race(self.summarizer.summarize(model, request))
        except ModelError as exc:
            self.log.warning("context.summary_failed", error=str(exc))
            return False
        before = context_tokens(policy, self.ctx.messages, self.ctx.compaction)
        event = ContextCompacted(summary=res.text, upto_message_id=older[-1].id, model=res.model, usage=res.usage,
                                 tokens_before=before, reason="overflow" if force else None)
        after = context_tokens(policy, self.ctx.messages, event)
        self._emit(msgspec.structs.replace(event, tokens_after=after))
        self.log.info("context.compacted", upto=event.upto_message_id, tokens_before=before, tokens_after=after)
        return True

    # -- tool rounds ---------------------------------------------------------------------------

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
        self._emit(RunFinished(termination=termination, usage=ctx.usage, cost=ctx.cost))
        await self._flush()

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
        await self._drain()
        await self._absorb_poke()
        if not due_messages(self.ctx, ending=True):
            saved, mark = copy_context(self.ctx), len(self._pending)
            self._finishing = True
            try:
                await self._finish(Termination(type="natural_end"))
                return True
            except Requeue as requeue:
                self._finishing = False
                self.ctx = saved
                for sc in requeue.absorbed:
                    for ev in sc.commit.events:
                        apply_event(self.ctx, ev, sc.commit.ts, sc.commit.run_id)
                commit = requeue.commit
                self._pending = []
                await self._append(Commit(commit_id=commit.commit_id, thread_id=commit.thread_id,
                                          run_id=commit.run_id, ts=commit.ts, events=commit.events[:mark]))
            finally:
                self._finishing = False
        self._emit(StepFinished(step=self.ctx.step))
        # going on is a step like any other that goes on: the stop conditions apply
        term = evaluate_stop(self._stop_conditions, stop_input(self.ctx, self.entropy.now_ms()))
        if term is not None and self._over_budget(term):
            if await self._suspend_for_budget(term):
                return True
        elif term is not None:  # the queued messages stay untaken: the run stops as it would have
            await self._finish(term)
            return True
        self._take_queued(ending=True)
        await self._flush(wait=False)
        return False

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

