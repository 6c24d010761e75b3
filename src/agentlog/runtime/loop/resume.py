"""Human in the loop and continuing from the log, for the run loop (DESIGN 4.3).

The decision commit (`begin_resume`), live decisions applied mid-round, cancelling a waiting
run, and `_continue`: go on from whatever the last commit point was (after a crash, on another
worker, or after a decision). Split from `agentlog.runtime.loop.driver` because it is the one part that starts
from a folded context instead of from the run start.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentlog.eventlog.events import (
    Message,
    MessageAppended,
    Outcome,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunSuspended,
    StepFinished,
    Termination,
    ToolCall,
    ToolCallCompleted,
    ToolCallDecided,
    ToolCallDecision,
    ToolCallResuming,
)
from agentlog.runtime.loop.decisions import CallPlan, stop_input
from agentlog.runtime.loop.hitl import ready_calls, unstarted_calls
from agentlog.runtime.loop.rounds import ToolRounds
from agentlog.runtime.loop.staging import _Cancelled, _Replay, _Running
from agentlog.runtime.stop import evaluate_stop, is_budget_call
from agentlog.runtime.tools import ToolResult


class Resume(ToolRounds):
    """RunLoop's resumes (a part of `agentlog.runtime.loop.driver.RunLoop`; built on the tool rounds, which a
    resume re-drives)."""

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
            if is_budget_call(cid):  # a budget ticket: extended or declined, no tool message
                outcome: Outcome = "cancelled" if decision.action == "cancel" else "succeeded"
                self._emit(ToolCallCompleted(call_id=cid, outcome=outcome, result=decision.result))
            elif decision.action == "cancel":
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
        if term is not None and self._over_budget(term):
            await self._suspend_for_budget(term)
            return False
        if term is not None:
            await self._finish(term)
            return False
        await self._absorb_poke()
        self._take_queued(ending=False)
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

