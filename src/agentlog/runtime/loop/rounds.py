"""Tool rounds and the step end for the run loop.

Gate (BeforeToolExecute), start, execute, complete (AfterToolExecute) each call of a step,
sequentially or in parallel per the agent's execution mode, committing each completion as it
finishes; then StepEnd decides finish / wait / go on. The pure parts (plans, gate verdicts,
results) are in `agentlog.runtime.loop.decisions`; this is their async driver, split from `agentlog.runtime.loop.driver` to
keep each part of the loop readable on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    RunSuspended,
    StatePatched,
    StepFinished,
    SuspendTicket,
    Termination,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecision,
    ToolCallStarted,
    ToolCallSuspended,
)
from agentlog.projections.errors import InvalidPatch
from agentlog.runtime.frontend import frontend_ticket
from agentlog.runtime.loop.decisions import (
    CallPlan,
    GateDecision,
    classify_result,
    plan_call,
    resolve_gate,
    stop_input,
)
from agentlog.runtime.loop.staging import StagingBase, _Cancelled, _Replay, _Running
from agentlog.runtime.plugins import AddUserMessage
from agentlog.runtime.stop import BUDGET_CALL_PREFIX, evaluate_stop
from agentlog.runtime.tools import ToolContext, ToolResult


class ToolRounds(StagingBase):
    """RunLoop's tool rounds (a part of `agentlog.runtime.loop.driver.RunLoop`)."""

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
        decided = replay.decision if replay is not None else None
        actions = await self._hook("before_tool_execute", plan.call, decision=decided)
        gate = resolve_gate(plan.call.id, actions)
        for ev in gate.events:
            self._emit(ev)
        self._apply_patches(actions, "plugin")
        return gate

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
        running = self._running.pop(call.id, None)
        for emitted in running.ctx.emitted if running is not None and running.ctx is not None else ():
            self._emit(emitted)
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
            if term is not None and self._over_budget(term):
                return await self._suspend_for_budget(term)
        if term is not None:
            await self._finish(term)
            return True
        # the step boundary: steering messages queued meanwhile join the conversation now,
        # before the next model call (a poke says one was recorded since the last commit)
        await self._absorb_poke()
        self._take_queued(ending=False)
        await self._flush(wait=False)  # the round trip overlaps the next inference
        return False

    def _over_budget(self, term: Termination | None) -> bool:
        """A `budget` stop suspends the run for a human instead of ending it, unless a human
        already declined to extend it (then it ends `stopped`/budget)."""
        return term is not None and term.code == "budget" and not self.ctx.budget_declined

    async def _suspend_for_budget(self, term: Termination) -> bool:
        """Stage a budget ticket (a suspension of no tool call: `stop.BUDGET_CALL_PREFIX`) and
        wait for a human, as an approval waits: `resume` extends the budget, `cancel` ends the
        run. The step is already closed; the next one starts after the decision."""
        ctx = self.ctx
        call_id = f"{BUDGET_CALL_PREFIX}{ctx.budget_extensions + 1}"  # the run's n-th ticket: each is answered first
        self._emit(ToolCallSuspended(call_id=call_id, ticket=SuspendTicket(
            id=call_id, action="budget", message=f"The run reached its budget ({term.detail}). Extend it?",
            parameters={"tokens": ctx.usage.total_tokens, "cost": ctx.cost, "extensions": ctx.budget_extensions},
            response_schema={"type": "object"}, resume_mode="use_decision_as_tool_result",
        )))
        self._emit(RunSuspended(call_ids=[call_id]))
        self.log.info("run.budget_suspended", detail=term.detail, call_id=call_id)
        await self._flush()
        return await self._resume_if_decided()

    if TYPE_CHECKING:  # `agentlog.runtime.loop.resume.Resume`'s methods a round calls
        def _live_ready(self) -> list[str]: ...
        async def _live_replays(self) -> list[_Running]: ...
        async def _resume_if_decided(self) -> bool: ...
