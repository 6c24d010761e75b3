"""Tool rounds, live decisions and the end of a step or run, for the run loop.

Gate (BeforeToolExecute), start, execute, complete (AfterToolExecute) each call of a step,
sequentially or in parallel per the agent's execution mode, committing each completion as it
finishes; decisions that arrive while a round runs are applied by it; then StepEnd decides
finish / wait / go on, and RunEnd closes the run. The pure parts (plans, gate verdicts, results)
are in `agentlog.runtime.loop.decisions`; this is their async driver. It stages through the
run's `Staging` and reads the agent from `ActiveAgent`; going on after a wait whose decision
already arrived is the one thing it hands back to its owner (`continue_run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    Outcome,
    RunFinished,
    RunResumed,
    RunSuspended,
    StateConflicted,
    StatePatched,
    StepFinished,
    SuspendTicket,
    Termination,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecision,
    ToolCallResuming,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.runtime.inputs.frontend import frontend_ticket
from agentlog.runtime.live import LiveSink
from agentlog.runtime.loop.active_agent import ActiveAgent
from agentlog.runtime.loop.decisions import (
    CallPlan,
    GateDecision,
    classify_result,
    plan_call,
    resolve_gate,
    stop_input,
)
from agentlog.runtime.loop.hitl import APPROVAL_SCHEMA, is_approved, ready_calls
from agentlog.runtime.loop.in_doubt import in_doubt_calls, in_doubt_ticket, is_in_doubt, resolution
from agentlog.runtime.loop.run_context import apply_event as fold_event
from agentlog.runtime.loop.run_context import call_cleanup, copy_context, run_cleanup
from agentlog.runtime.loop.staging import Cancelled, Staging
from agentlog.runtime.plugins import AddUserMessage
from agentlog.runtime.state.batch import StateWrite, Touch, find_conflict, untyped_touches
from agentlog.runtime.state.keys import StateError
from agentlog.runtime.stop import BUDGET_CALL_PREFIX, evaluate_stop, is_budget_call
from agentlog.runtime.tools import ToolContext, ToolResult


@dataclass(slots=True)
class Running:
    """A call being executed: its plan and its cancel signal (set when the run is cancelled)."""

    plan: CallPlan
    cancel: asyncio.Event
    ctx: ToolContext | None = None
    #: Set when the call runs again after a human decision (replay / pass_decision_to_tool).
    decision: ToolCallDecision | None = None
    #: How many of the round's state writes (`ToolRounds.round_writes`) the call's snapshot holds.
    seen: int = 0


@dataclass(frozen=True, slots=True)
class Replay:
    """A decided call to run again: its plan, the decision it runs with (None: none, an in-doubt
    call retried that first ran without one), and the ticket's resume mode."""

    plan: CallPlan
    decision: ToolCallDecision | None
    mode: str


class ToolRounds:
    """The run loop's tool rounds, live decisions, step end and run end."""

    def __init__(self, staging: Staging, agent: ActiveAgent, live: LiveSink,
                 continue_run: Callable[[], Awaitable[None]]) -> None:
        self.staging = staging
        self.agent = agent
        self.live = live
        self._live_on = live.enabled
        #: Goes on from the log's last commit point (`agentlog.runtime.loop.resume.Resume`).
        self._continue_run = continue_run
        self.running: dict[str, Running] = {}
        #: User messages plugins asked for (AddUserMessage), staged at the step's end.
        self.queued_user: list[str] = []
        #: The state writes of the calls completed while others ran (writer, touches), in order:
        #: what a call that started before them did not see (parallel merge checks).
        self.round_writes: list[tuple[str, list[Touch]]] = []

    # -- plans ---------------------------------------------------------------------------------

    def plan(self, call: ToolCall) -> CallPlan:
        return plan_call(call, self.agent.agent_tools, self.staging.ctx.frontend_tools, self.staging.ctx.overrides)

    def plan_for(self, call_id: str) -> CallPlan:
        for call in self.staging.ctx.step_tool_calls:
            if call.id == call_id:
                return self.plan(call)
        # a suspended call outside the current step's message cannot happen through this loop;
        # fail it clearly rather than guess its arguments
        return CallPlan(ToolCall(id=call_id, name="unknown"), None, f"tool call {call_id!r} not found in the run's step")

    def running_decision(self, call_id: str) -> ToolCallDecision | None:
        """The decision a call runs with when it runs again: the one it first ran with when it
        went in doubt (a `retry` runs it as it ran), else the decision it is resuming with."""
        ctx = self.staging.ctx
        if call_id in ctx.in_doubt:
            return ctx.in_doubt[call_id]
        return ctx.resuming.get(call_id)

    def replay_of(self, call_id: str) -> Replay:
        """A `resuming` call to re-drive. An in-doubt call resumes only on `retry` (its other
        answers complete it in the decision commit): it runs again as it ran, ungated (its gate
        already let it run), with the decision it first ran with."""
        ctx = self.staging.ctx
        if call_id in ctx.in_doubt:
            return Replay(self.plan_for(call_id), ctx.in_doubt[call_id], "pass_decision_to_tool")
        return Replay(self.plan_for(call_id), ctx.resuming[call_id], ctx.resume_modes.get(call_id, "replay_tool_call"))

    def suspend_in_doubt(self) -> list[str]:
        """Stage an in-doubt suspension for each interrupted call that must not run again
        (`in_doubt.in_doubt_calls`: started by a previous loop, its tool not idempotent), instead
        of running it again. Returns their ids."""
        staging = self.staging
        doubted = in_doubt_calls(staging.ctx, self.agent.agent_tools)
        for cid in doubted:
            call = self.plan_for(cid).call
            staging.emit(ToolCallSuspended(call_id=cid, ticket=in_doubt_ticket(cid, call.name, call.arguments)))
        if doubted:
            staging.log.warning("run.calls_in_doubt", call_ids=doubted)
        return doubted

    # -- one call ------------------------------------------------------------------------------

    async def gate(self, plan: CallPlan, replay: Replay | None = None) -> GateDecision:
        """BeforeToolExecute, then: a frontend tool call the gate lets run never runs here: it
        suspends for the client (`frontend_ticket`), whose result the decision carries. So
        permission rules (deny / ask) apply to frontend tools too, and an approved `ask` on
        one (replay_tool_call) comes back here and suspends for the client."""
        decision = await self._gate_hooks(plan, replay)
        if plan.frontend and decision.kind == "run":
            return GateDecision("suspend", decision.events, ticket=frontend_ticket(plan.call))
        return decision

    async def _gate_hooks(self, plan: CallPlan, replay: Replay | None = None) -> GateDecision:
        """BeforeToolExecute for one call, staged. Pre-failed calls get no hooks. A replayed call
        (replay_tool_call) goes through the hooks again with the decision in the phase context;
        pass_decision_to_tool hands the decision straight to the tool (no gate)."""
        if plan.failure is not None:
            return GateDecision("fail", reason=plan.failure)
        if replay is not None and replay.mode == "pass_decision_to_tool":
            return GateDecision("run")
        decided = replay.decision if replay is not None else None
        actions = await self.agent.hook("before_tool_execute", plan.call, decision=decided)
        gate = resolve_gate(plan.call.id, actions)
        for ev in gate.events:
            self.staging.emit(ev)
        self.agent.apply_patches(actions, "plugin")
        return gate

    async def settle(self, plan: CallPlan, decision: GateDecision) -> bool:
        """Stage the outcome of a call that does not run. Returns True if it suspended."""
        if decision.kind == "suspend":
            self.staging.emit(ToolCallSuspended(call_id=plan.call.id, ticket=decision.ticket))  # type: ignore[arg-type]
            return True
        result = decision.result if decision.kind == "result" else ToolResult.failure(decision.reason or "blocked")
        await self.complete(plan, result, [])  # type: ignore[arg-type]
        return False

    def start(self, plan: CallPlan, replay: Replay | None = None) -> Running:
        self.staging.emit(ToolCallStarted(call_id=plan.call.id, name=plan.call.name, arguments=plan.call.arguments))
        running = Running(plan, asyncio.Event(), decision=replay.decision if replay is not None else None)
        self.running[plan.call.id] = running
        return running

    def _rerun(self, plan: CallPlan, decision: ToolCallDecision | None) -> Running:
        """A call whose `ToolCallStarted` is committed but whose outcome is not (its worker died):
        it runs again under the same call_id, with no new event, so the log reads as if it ran
        once (at-least-once execution; the call_id is the tool's idempotency key)."""
        running = Running(plan, asyncio.Event(), decision=decision)
        self.running[plan.call.id] = running
        return running

    async def _execute(self, running: Running) -> tuple[ToolResult, list[dict[str, Any]]]:
        plan = running.plan
        call_id = plan.call.id
        staging = self.staging
        ctx = staging.ctx
        progress = None
        if self._live_on:
            thread_id, run_id, live = ctx.thread_id, ctx.run_id, self.live

            def progress(data: Any) -> None:
                live.publish(thread_id, run_id, {"type": "tool_progress", "call_id": call_id, "data": data})

        if not self.running or all(r.ctx is None for r in self.running.values() if r is not running):
            self.round_writes = []  # nothing else runs: no earlier write can be unseen
        tctx = ToolContext(
            thread_id=ctx.thread_id, run_id=ctx.run_id, call_id=call_id, agent_id=self.agent.spec.id,
            tool_name=plan.call.name, state=ctx.state, progress=progress, cancelled=running.cancel,
            decision=running.decision, run_state=ctx.run_state, call_state=ctx.call_states.get(call_id, {}),
            keys=self.agent.keys, profile_id=ctx.resource_id, profile_loader=staging.profile_loader(),
            agent=self.agent.spec, agent_tools=self.agent.agent_tools,
        )
        running.ctx = tctx
        running.seen = len(self.round_writes)
        if staging.older_factory is not None and staging.older is None:
            # after a snapshot resume: the older messages load while the tool runs (not before
            # it starts: their read and decode would compete with the replay's start)
            invocation = asyncio.ensure_future(plan.tool.invoke(plan.call.arguments, tctx))  # type: ignore[union-attr]
            staging.prefetch_messages()
            result = await invocation
        else:
            result = await plan.tool.invoke(plan.call.arguments, tctx)  # type: ignore[union-attr]
        return result, tctx.ops

    async def complete(self, plan: CallPlan, result: ToolResult, ops: list[dict[str, Any]]) -> bool:
        """Stage a finished call: its state edits (validated; typed writes merged with the
        round's by their keys' strategies, profile writes appended to the profile's stream),
        AfterToolExecute actions, the end of its tool_call scope, completion and result message.
        A pending result suspends the call instead (its tool_call scope stays). Returns True if
        it suspended."""
        staging = self.staging
        call = plan.call
        running = self.running.pop(call.id, None)
        tctx = running.ctx if running is not None else None
        for emitted in tctx.emitted if tctx is not None else ():
            staging.emit(emitted)
        writes = list(tctx.batch.writes) if tctx is not None else []
        if ops or writes:
            result = await self._stage_state(call, result, ops, writes, running.seen if running is not None else 0)
        if result.status != "pending":
            self.queued_user.extend(result.follow_up)  # the tool's own, then its plugins'
        actions = await self.agent.hook("after_tool_execute", call, result)
        self.agent.apply_patches(actions, "plugin")
        self.queued_user.extend(a.text for a in actions if isinstance(a, AddUserMessage))
        if result.status == "pending":
            staging.emit(ToolCallSuspended(call_id=call.id, ticket=result.ticket))  # type: ignore[arg-type]
            return True
        cleared = call_cleanup(staging.ctx, call.id)
        if cleared is not None:
            staging.emit(cleared)
        outcome, value, content = classify_result(result)
        message_id = staging.entropy.new_id()
        staging.emit(ToolCallCompleted(call_id=call.id, outcome=outcome, result=value, message_id=message_id,  # type: ignore[arg-type]
                                       details=result.details, follow_up=list(result.follow_up) or None))
        staging.emit(MessageAppended(message=Message(id=message_id, role="tool", content=content, tool_call_id=call.id)))
        return False

    async def _stage_state(self, call: ToolCall, result: ToolResult, ops: list[dict[str, Any]],
                           writes: list[StateWrite], seen: int) -> ToolResult:
        """Stage a call's untyped ops and typed writes, all or nothing; the result to record
        (a failure when they conflict with a write the call did not see, or do not apply)."""
        staging = self.staging
        writer = f"tool:{call.id}"
        touches = untyped_touches(ops) + [t for w in writes for t in _write_touches(w)]
        source = f"tool:{call.name}"
        for other, theirs in self.round_writes[seen:]:
            hit = find_conflict(touches, theirs)
            if hit is not None:
                mine, against = hit
                staging.emit(StateConflicted(
                    key=mine.key or against.key or "", path=mine.path, writer=writer, with_writer=other,
                    resolution="failed", scope=mine.scope, call_id=call.id, ops=ops,  # type: ignore[arg-type]
                    writes=[w.event(source=source, call_id=call.id) for w in writes],
                ))
                staging.log.info("run.state_conflict", call_id=call.id, key=mine.key or against.key, path=mine.path,
                                 with_writer=other)
                return ToolResult.failure(
                    f"state conflict: this call changed {mine.path!r} of state key {mine.key or against.key!r}, "
                    f"which {other} changed while it ran (the key is exclusive); nothing it wrote was kept. "
                    "Call it again to work on the current state.")
        events: list[Any] = []
        if ops:
            events.append(StatePatched(ops=ops, source=source))
        events.extend(w.event(source=source, call_id=call.id) for w in writes)
        trial = copy_context(staging.ctx)
        try:
            for event in events:  # all or nothing: validate on a copy before staging any
                fold_event(trial, event, 0, trial.run_id)
        except InvalidPatch as exc:
            return ToolResult.failure(f"tool {call.name!r} made an invalid state edit: {exc}")
        profile = [w for w in writes if w.key.scope == "profile"]
        if profile:
            try:
                await staging.append_profile(profile, call.id)
            except (InvalidPatch, StateError) as exc:
                return ToolResult.failure(f"tool {call.name!r} could not write its profile state: {exc}")
        for event in events:
            staging.emit(event)
        self.round_writes.append((writer, touches))
        return result

    def emit_cancelled(self, call_id: str, why: str = "cancelled") -> None:
        cleared = call_cleanup(self.staging.ctx, call_id)
        if cleared is not None:
            self.staging.emit(cleared)
        message_id = self.staging.entropy.new_id()
        self.staging.emit(ToolCallCompleted(call_id=call_id, outcome="cancelled", result={"error": why},
                                            message_id=message_id))
        content = "Error: the call was cancelled" if why == "cancelled" else f"Error: the call was {why}"
        self.staging.emit(MessageAppended(message=Message(
            id=message_id, role="tool", content=content, tool_call_id=call_id,
        )))

    # -- rounds --------------------------------------------------------------------------------

    async def round_sequential(
        self, plans: list[CallPlan], replays: Mapping[str, Replay] | None = None,
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
                decision = await self.gate(plan, replay)
                if decision.kind != "run":
                    if await self.settle(plan, decision):
                        return True
                    continue
                running = self.start(plan, replay)
            await self.staging.flush()
            result, ops = await self.staging.race(self._execute(running), running.cancel)
            if await self.complete(plan, result, ops):
                return True
        return False

    async def round_parallel(
        self, plans: list[CallPlan], replays: Mapping[str, Replay] | None = None,
        started: Mapping[str, ToolCallDecision | None] | None = None,
    ) -> None:
        """All calls of the step at once; each completion is committed as it finishes (the last
        one carries the step end). Simultaneous completions are staged in call order.
        `started`: as in `round_sequential`."""
        staging = self.staging
        replays = replays or {}
        started = started or {}
        to_run: list[Running] = []
        for plan in plans:
            if plan.call.id in started:
                to_run.append(self._rerun(plan, started[plan.call.id]))
                continue
            replay = replays.get(plan.call.id)
            decision = await self.gate(plan, replay)
            if decision.kind == "run":
                to_run.append(self.start(plan, replay))
            else:
                await self.settle(plan, decision)
        to_run += await self._live_replays()
        if not to_run:
            return
        await staging.flush()
        order = {r.plan.call.id: i for i, r in enumerate(to_run)}
        tasks = {asyncio.ensure_future(self._execute(r)): r for r in to_run}
        waiter = staging.waiter()
        poked: asyncio.Future[Any] | None = None
        try:
            while tasks:
                if staging.cancel.is_set():
                    raise Cancelled()
                if poked is None or poked.done():
                    poked = asyncio.ensure_future(staging.poked.wait())
                done, _ = await asyncio.wait((*tasks, waiter, poked), return_when=asyncio.FIRST_COMPLETED)
                if staging.cancel.is_set():
                    raise Cancelled()
                finished = sorted((t for t in done if t in tasks), key=lambda t: order[tasks[t].plan.call.id])
                for task in finished:
                    running = tasks.pop(task)
                    result, ops = task.result()
                    await self.complete(running.plan, result, ops)
                if poked in done:
                    await staging.absorb_poke()
                # decisions that arrived (poke, or folded by a flush's conflict) start now
                for running in await self._live_replays():
                    order[running.plan.call.id] = len(order)
                    tasks[asyncio.ensure_future(self._execute(running))] = running
                if tasks:
                    await staging.flush()
        except BaseException:
            for task, running in tasks.items():
                running.cancel.set()
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if poked is not None and not poked.done():
                poked.cancel()

    # -- decisions -----------------------------------------------------------------------------

    async def stage_resumes(self, ready: Sequence[str], *, run_resumed: bool) -> None:
        """Apply recorded decisions: [`RunResumed` when the run waited] + `ToolCallResuming{mode}`
        per call, and the outcomes that need no tool run (cancel decisions,
        use_decision_as_tool_result). replay_tool_call / pass_decision_to_tool calls stay
        `resuming` in the context: the loop re-drives them from there (`Resume` reads them as
        pending calls), the same way a resume from the log does."""
        staging = self.staging
        ctx = staging.ctx
        tickets = {cid: ctx.suspended[cid] for cid in ready}
        modes = {cid: ticket.resume_mode for cid, ticket in tickets.items()}
        if run_resumed:
            staging.emit(RunResumed(call_ids=list(ready)))
        for cid in ready:
            staging.emit(ToolCallResuming(call_id=cid, mode=modes[cid]))
        for cid in ready:
            decision = staging.ctx.resuming[cid]
            if is_budget_call(cid):  # a budget ticket: extended or declined, no tool message
                extended = decision.action == "resume" and is_approved(decision.result)
                outcome: Outcome = "succeeded" if extended else "cancelled"
                staging.emit(ToolCallCompleted(call_id=cid, outcome=outcome, result=decision.result))
            elif decision.action == "cancel":
                why = "cancelled by a human" + (f": {decision.reason}" if decision.reason else "")
                self.emit_cancelled(cid, why)
            elif is_in_doubt(tickets[cid]):
                answer, value = resolution(decision)
                if answer == "mark_done":
                    await self.complete(self.plan_for(cid), ToolResult.success(value), [])
                elif answer == "cancel":
                    self.emit_cancelled(cid, "cancelled by a human after it was interrupted "
                                             "(whether it took effect is unknown)")
                # retry: stays resuming, re-driven as it first ran (`replay_of`)
            elif modes[cid] == "use_decision_as_tool_result":
                await self.complete(self.plan_for(cid), ToolResult.success(decision.result), [])

    def live_ready(self) -> list[str]:
        """Decided calls a running (not waiting) run applies now: parallel_streaming each as it
        arrives, parallel_batch_approval once the whole batch is decided (`ready_calls`);
        sequential never has a call in flight next to a suspended one."""
        mode = self.agent.spec.tool_execution_mode
        if mode == "sequential":
            return []
        return ready_calls(mode, self.staging.ctx)

    async def _live_replays(self) -> list[Running]:
        """Stage the live decisions' resumes and start the decided calls that need a tool run
        (gated again for replay_tool_call). Their commit is the caller's next flush."""
        ready = self.live_ready()
        if not ready:
            return []
        await self.stage_resumes(ready, run_resumed=False)
        started: list[Running] = []
        ctx = self.staging.ctx
        for cid in ready:
            if cid not in ctx.resuming:
                continue  # answered by the decision itself
            replay = self.replay_of(cid)
            plan = replay.plan
            gate = await self.gate(plan, replay)
            if gate.kind == "run":
                started.append(self.start(plan, replay))
            else:
                await self.settle(plan, gate)
        self.staging.log.info("run.live_decisions", resumed=ready)
        return started

    async def resume_if_decided(self) -> bool:
        """After the commit that made the run wait: a decision folded in by that commit's
        conflict (recorded just before it) is applied here, as a resume from the log would.
        Returns True (the loop exits: the run waits, or was driven to its end here)."""
        ctx = self.staging.ctx
        ready = ready_calls(self.agent.spec.tool_execution_mode, ctx)
        if ready and ctx.waiting:
            await self.stage_resumes(ready, run_resumed=True)
            await self._continue_run()
        return True

    # -- the step's end ------------------------------------------------------------------------

    def stage_user_messages(self) -> None:
        """Stage the user messages plugins asked for during the step."""
        staging = self.staging
        for text in self.queued_user:
            staging.emit(MessageAppended(message=Message(id=staging.entropy.new_id(), role="user", content=text)))
        self.queued_user = []

    async def step_end(self) -> bool:
        """StepEnd: queued user messages, plugin actions, StepFinished, then the verdict: finish
        (terminate / stop condition), wait (suspended calls), or go on. Returns True when the
        run loop should exit. Everything rides in the commit of the step's last completion."""
        staging = self.staging
        self.stage_user_messages()
        actions = await self.agent.hook("step_end")
        self.agent.apply_patches(actions, "plugin")
        if staging.ctx.suspended and not staging.ctx.running:
            await staging.absorb_poke()
            while staging.ctx.suspended and self.live_ready():  # decided while the others ran
                await self.round_parallel([])
        ctx = staging.ctx
        if ctx.suspended and not ctx.running:
            staging.emit(StepFinished(step=ctx.step))
            staging.emit(RunSuspended(call_ids=list(ctx.suspended)))
            await staging.flush()
            return await self.resume_if_decided()
        term = self.agent.terminate(actions)
        if term is None:
            staging.emit(StepFinished(step=ctx.step))
            term = evaluate_stop(self.agent.stop_conditions, stop_input(ctx, staging.entropy.now_ms()))
            if term is not None and self.over_budget(term):
                return await self.suspend_for_budget(term)
        if term is not None:
            await self.finish(term)
            return True
        # the step boundary: steering messages queued meanwhile join the conversation now,
        # before the next model call (a poke says one was recorded since the last commit)
        await staging.absorb_poke()
        staging.take_queued(ending=False)
        await staging.flush(wait=False)  # the round trip overlaps the next inference
        return False

    def over_budget(self, term: Termination | None) -> bool:
        """A `budget` stop suspends the run for a human instead of ending it, unless a human
        already declined to extend it (then it ends `stopped`/budget)."""
        return term is not None and term.code == "budget" and not self.staging.ctx.budget_declined

    async def suspend_for_budget(self, term: Termination) -> bool:
        """Stage a budget ticket (a suspension of no tool call: `stop.BUDGET_CALL_PREFIX`) and
        wait for a human, as an approval waits: a `resume` with `approved: true` extends the
        budget; `approved: false` or a `cancel` ends the run. The step is already closed; the next one starts after the decision."""
        staging = self.staging
        ctx = staging.ctx
        call_id = f"{BUDGET_CALL_PREFIX}{ctx.budget_extensions + 1}"  # the run's n-th ticket: each is answered first
        staging.emit(ToolCallSuspended(call_id=call_id, ticket=SuspendTicket(
            id=call_id, action="budget", message=f"The run reached its budget ({term.detail}). Extend it?",
            parameters={"tokens": ctx.usage.total_tokens, "cost": ctx.cost, "extensions": ctx.budget_extensions},
            response_schema=APPROVAL_SCHEMA, resume_mode="use_decision_as_tool_result",
        )))
        staging.emit(RunSuspended(call_ids=[call_id]))
        staging.log.info("run.budget_suspended", detail=term.detail, call_id=call_id)
        await staging.flush()
        return await self.resume_if_decided()

    # -- the run's end -------------------------------------------------------------------------

    async def finish(self, termination: Termination) -> None:
        """RunEnd: answer any unanswered call of the current step (cancelled), close the step,
        RunFinished with the summed usage; one commit with whatever is still staged."""
        staging = self.staging
        ctx = staging.ctx
        for call_id in ctx.step_calls:
            if call_id not in ctx.answered:
                self.emit_cancelled(call_id)
        if ctx.step_open:
            staging.emit(StepFinished(step=ctx.step))
        actions = await self.agent.hook("run_end")
        self.agent.apply_patches(actions, "plugin")
        for cleared in run_cleanup(ctx):
            staging.emit(cleared)
        staging.emit(RunFinished(termination=termination, usage=ctx.usage, cost=ctx.cost))
        await staging.flush()

    async def finish_cancelled(self) -> None:
        for running in self.running.values():
            running.cancel.set()
        self.running.clear()
        if self.staging.ctx.finished is None:
            await self.finish(Termination(type="cancelled", detail="cancel requested"))


def _write_touches(write: StateWrite) -> list[Touch]:
    from agentlog.projections.state import touched_paths

    key = write.key
    return [Touch(key.scope, write.owner or "", path, key.merge, key.name) for path in touched_paths(write.ops)]
