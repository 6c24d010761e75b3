"""Human in the loop and continuing from the log, for the run loop (DESIGN 4.3).

The decision commit (`begin`), cancelling a waiting run, and `continue_run`: go on from whatever
the last commit point was (after a crash, on another worker, or after a decision). Its own part
because it is the one that starts from a folded context instead of from the run start; it
re-drives the tool rounds (`ToolRounds`) and hands the next steps back to its owner (`steps`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agentlog.eventlog.events import (
    RunCancelRequested,
    RunFinished,
    RunSuspended,
    StepFinished,
    Termination,
    ToolCallDecided,
    ToolCallDecision,
)
from agentlog.runtime.loop.active_agent import ActiveAgent
from agentlog.runtime.loop.decisions import CallPlan, stop_input
from agentlog.runtime.loop.hitl import ready_calls, unstarted_calls
from agentlog.runtime.loop.rounds import Replay, ToolRounds
from agentlog.runtime.loop.run_context import run_cleanup
from agentlog.runtime.loop.staging import Cancelled, Staging
from agentlog.runtime.stop import evaluate_stop


class Resume:
    """The run loop's resumes: decisions, continuing from the log, cancelling a wait."""

    def __init__(self, staging: Staging, agent: ActiveAgent, rounds: ToolRounds,
                 steps: Callable[[], Awaitable[None]]) -> None:
        self.staging = staging
        self.agent = agent
        self.rounds = rounds
        #: The run's step loop (`agentlog.runtime.loop.driver.RunLoop`), where a resume goes on.
        self._steps = steps

    async def begin(self, decisions: Sequence[ToolCallDecision]) -> list[str]:
        """The decision commit (a commit point): `ToolCallDecided` per new decision and, when the
        execution mode lets decided calls resume now (`hitl.ready_calls`), `RunResumed`,
        `ToolCallResuming{mode}` and the outcomes that need no tool run (cancel decisions,
        use_decision_as_tool_result). Returns the calls it resumed (empty: still waiting).
        Raises VersionConflict if the thread moved since the context was folded."""
        staging = self.staging
        for d in decisions:
            staging.emit(ToolCallDecided(call_id=d.target_id, decision=d))
        ready = ready_calls(self.agent.spec.tool_execution_mode, staging.ctx)
        if ready:
            await self.rounds.stage_resumes(ready, run_resumed=True)
        seq = await staging.append_once()
        staging.log.info("run.decided", decisions=[d.decision_id for d in decisions], resumed=ready, seq=seq)
        return ready

    def _pending_calls(self) -> tuple[list[CallPlan], dict[str, Replay], dict[str, ToolCallDecision | None]]:
        """The current step's calls with work left at the last commit point, in the model's
        order: started but not completed (run again, `started`), and resuming after a decision
        but not yet started (gate + start per resume mode, `replays`). In-doubt calls are no
        longer running: `_resume_calls` suspended them first."""
        ctx = self.staging.ctx
        order = [c.id for c in ctx.step_tool_calls]
        order += [cid for cid in (*ctx.running, *ctx.resuming) if cid not in order]
        plans: list[CallPlan] = []
        replays: dict[str, Replay] = {}
        started: dict[str, ToolCallDecision | None] = {}
        for cid in order:
            if cid in ctx.answered or (cid not in ctx.running and cid not in ctx.resuming):
                continue
            if cid in ctx.running:
                plan = self.rounds.plan_for(cid)
                started[cid] = self.rounds.running_decision(cid)
            else:
                replays[cid] = self.rounds.replay_of(cid)
                plan = replays[cid].plan
            plans.append(plan)
        return plans, replays, started

    async def continue_run(self) -> None:
        """Go on from the last commit point, whatever it was: a cancel request finishes the run;
        calls in flight run again, decided calls are re-driven, un-started sequential calls
        start; then the step ends as it would have (mid-step), or the decision's resume finishes
        (step already closed at the suspension), and the run steps on. An open step with
        nothing left in flight just ends; a closed one goes to the next inference (an
        inference that was not committed is redone)."""
        ctx = self.staging.ctx
        if ctx.cancel_requested:
            raise Cancelled()
        if ctx.step_open or ctx.resume_open:
            mid_step = ctx.step_open
            if not await self._resume_calls():
                return
            if mid_step:
                if await self.rounds.step_end():
                    return
            elif not await self._after_resume():
                return
        # else: the last commit closed a step (or started the run): the next inference
        await self._steps()

    async def _resume_calls(self) -> bool:
        """Suspend the interrupted calls that must not run again (`ToolRounds.suspend_in_doubt`),
        run the calls with work left (see `_pending_calls`), in the execution mode's manner, then
        the calls a sequential round left un-started. Returns False if the run ended."""
        rounds = self.rounds
        rounds.suspend_in_doubt()
        plans, replays, started = self._pending_calls()
        sequential = self.agent.spec.tool_execution_mode == "sequential"
        # decisions recorded mid-step (live) that no loop applied yet: the round applies them
        if plans or (self.staging.ctx.step_open and rounds.live_ready()):
            if sequential:
                await rounds.round_sequential(plans, replays, started)
            else:
                await rounds.round_parallel(plans, replays, started)
        if sequential and not self.staging.ctx.suspended:
            rest = [rounds.plan(c) for c in unstarted_calls(self.staging.ctx)]
            if rest:
                await rounds.round_sequential(rest)
        return self.staging.ctx.finished is None

    async def _after_resume(self) -> bool:
        """After the decided calls of a closed step: wait again (suspended calls left), finish
        (stop condition) or return True to go on with the next step."""
        staging, rounds = self.staging, self.rounds
        rounds.stage_user_messages()
        ctx = staging.ctx
        if ctx.suspended and not ctx.running:
            staging.emit(RunSuspended(call_ids=list(ctx.suspended)))
            await staging.flush()
            return not await rounds.resume_if_decided()
        term = evaluate_stop(self.agent.stop_conditions, stop_input(ctx, staging.entropy.now_ms()))
        if term is not None and rounds.over_budget(term):
            await rounds.suspend_for_budget(term)
            return False
        if term is not None:
            await rounds.finish(term)
            return False
        await staging.absorb_poke()
        staging.take_queued(ending=False)
        await staging.flush(wait=False)
        return True

    async def cancel_waiting(self, reason: str | None) -> int:
        """Cancel a run that waits for decisions, as one commit: `RunCancelRequested`, every
        suspended (and un-started) call of the step `cancelled`, `RunFinished{cancelled}`.
        Raises VersionConflict if the thread moved since the context was folded."""
        staging = self.staging
        ctx = staging.ctx
        staging.emit(RunCancelRequested(reason=reason))
        for call_id in ctx.step_calls:
            if call_id not in ctx.answered:
                self.rounds.emit_cancelled(call_id, "cancelled: the run was cancelled while it waited for a decision")
        if ctx.step_open:
            staging.emit(StepFinished(step=ctx.step))
        actions = await self.agent.hook("run_end")
        self.agent.apply_patches(actions, "plugin")
        for cleared in run_cleanup(ctx):
            staging.emit(cleared)
        staging.emit(RunFinished(termination=Termination(type="cancelled", detail=reason or "cancel requested"),
                                 usage=ctx.usage))
        return await staging.append_once()
