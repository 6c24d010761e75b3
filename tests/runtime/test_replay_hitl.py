"""Verified replay of human-in-the-loop runs, and of runs resumed after a crash, recorded on a
real nats-server.

Each HITL scenario (`tests.support.hitl.SCENARIOS`: ask approve/deny, every resume mode, two calls
per execution mode, cancel while waiting, continuation carrying decisions) is recorded exactly as
`test_hitl_scenarios` records it -- every phase applied by a freshly built Runtime -- and then every
run on the thread is verified against the log: replay re-drives the recorded decisions and
cancels through `Runtime.decide()` / `Runtime.cancel()` on the verifying store, so the decision
commits are checked too. A tampered tool in a HITL run diverges where its result is committed.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from agentlog.eventlog.events import ToolCallCompleted
from agentlog.runtime import (
    AgentSpec,
    App,
    DeterministicEntropy,
    PermissionPlugin,
    Runtime,
    ToolContext,
    tool,
)
from agentlog.runtime.models import ScriptedModel, Turn
from agentlog.runtime.replay.verify import (
    NonDeterminismError,
    next_session,
    plan_replay,
    verify_run,
)

from tests.runtime.test_hitl_scenarios import resume_in_process, start_waiting
from tests.support import hitl as S
from tests.support.runtime import store, thread_log  # noqa: F401  (fixture)

#: These tests prove re-executed tools are checked: opt in to re-execution (the default answers
#: every tool from the log, see tests/cli/test_cli_replay.py); an explicit `tools_from_log=` still wins.
verify_run = functools.partial(verify_run, tools_from_log=False)

pytestmark = pytest.mark.asyncio


async def record(store: Any, name: str) -> list[Any]:
    await start_waiting(store, name)
    await resume_in_process(store, name)
    return await thread_log(store, S.THREAD)


@pytest.mark.parametrize("name", list(S.SCENARIOS))
async def test_every_hitl_scenario_verifies(store: Any, name: str) -> None:
    log = await record(store, name)
    runs = list(dict.fromkeys(sc.commit.run_id for sc in log if sc.commit.run_id))
    assert runs == ([S.RUN, "r2"] if name == "continuation" else [S.RUN])
    for run_id in runs:
        plan = plan_replay(log, run_id)
        async with asyncio.timeout(30):
            report = await verify_run(store, run_id, S.build(store, name, 0))
        assert report.ok, report.divergence
        assert report.commits_verified == report.commits_recorded == len(plan.loop)
        assert report.events_verified == plan.events
        assert report.termination == plan.termination and report.status == "done"
        # the phases were all re-driven: decision and cancel commits are among the verified ones
        assert next_session(plan, len(plan.loop)) is None


async def test_a_decision_commit_is_verified_not_trusted(store: Any) -> None:
    """The decision commit holds what the runtime derived from the decision (RunResumed,
    ToolCallResuming, a cancelled call's completion): verified like any loop commit."""
    log = await record(store, "cancel_decision")
    plan = plan_replay(log, S.RUN)
    kinds = [next_session(plan, k) for k in range(len(plan.loop))]
    decided = [k for k, s in enumerate(kinds) if s is not None and s[0] == "decide"]
    assert len(decided) == 1 and [type(e).__name__ for e in plan.loop[decided[0]].commit.events][:3] == [
        "ToolCallDecided", "RunResumed", "ToolCallResuming"]
    async with asyncio.timeout(30):
        report = await verify_run(log, S.RUN, S.build(store, "cancel_decision", 0))
    assert report.ok and report.tools_executed == 0  # a cancel decision runs no tool


@tool(name="deploy")
def deploy_elsewhere(env: str) -> str:
    """Deploy to an environment (guarded by a permission `ask` rule)."""
    return f"deployed {env} (staging)"


def tampered(name: str) -> App:
    sc = S.SCENARIOS[name]
    tools = [deploy_elsewhere, *(t for t in S.TOOLS if t.name != "deploy")]
    agent = AgentSpec(id="agent", model=ScriptedModel(sc.script, position="conversation"),
                      tools=[t.name for t in S.TOOLS], plugins=[PermissionPlugin(ask=sc.ask)],
                      tool_execution_mode=sc.mode, max_rounds=10)
    return App(agents=[agent], tools=tools)


@pytest.mark.parametrize("name", ["ask_approve", "two_batch", "two_streaming", "continuation"])
async def test_a_tampered_tool_in_a_hitl_run_diverges_after_the_decision(store: Any, name: str) -> None:
    log = await record(store, name)
    completed = next((p, e) for sc in log if sc.commit.run_id == S.RUN for p, e in sc.positioned()
                     if isinstance(e, ToolCallCompleted) and e.outcome == "succeeded")
    with pytest.raises(NonDeterminismError) as info:
        async with asyncio.timeout(30):
            await verify_run(store, S.RUN, tampered(name))
    err = info.value
    assert err.position == completed[0] and err.expected == completed[1]
    assert isinstance(err.actual, ToolCallCompleted) and "(staging)" in str(err.actual.result)
    # answered from the log, the tampered tool does not matter
    async with asyncio.timeout(30):
        assert (await verify_run(store, S.RUN, tampered(name), tools_from_log=["deploy"])).ok


# == runs continued after their process died ======================================================


class Crash(Exception):
    """The simulated death of the process driving the run."""


class CrashingStore:
    """Lets `after` appends through to the real store, then fails every append: the process
    "dies" after commit `after` (what it had in flight is lost)."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.after, self.appended = inner, after, 0

    async def append(self, commit: Any, expected_version: int | None) -> Any:
        if self.appended >= self.after:
            raise Crash(f"died after commit {self.after}")
        self.appended += 1
        return await self.inner.append(commit, expected_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@tool
def double(x: int, ctx: ToolContext) -> int:
    """Double a number and remember it."""
    ctx.set(f"/double_{x}", 2 * x)
    return 2 * x


def crash_agent() -> AgentSpec:
    script = [Turn.tool("double", {"x": 1}), Turn.tools(("double", {"x": 2}), ("double", {"x": 3})), "done"]
    return AgentSpec(id="agent", model=ScriptedModel(script, position="conversation"), tools=["double"],
                     tool_execution_mode="sequential", max_rounds=10)


@pytest.mark.parametrize("after", [1, 2, 3, 4, 5])
async def test_a_run_resumed_after_its_process_died_verifies(store: Any, after: int) -> None:
    rt = Runtime(CrashingStore(store, after), agents=[crash_agent()], tools=[double], entropy=DeterministicEntropy())
    with pytest.raises(Crash):
        async with asyncio.timeout(30):
            await rt.run("agent", "double things", thread_id="tc", run_id="rc")
    prefix = await thread_log(store, "tc")
    assert len(prefix) == after
    # before anyone resumes it, the run's recording is open: verified as far as it goes
    runs: list[int] = []

    @tool(name="double")
    def counted(x: int, ctx: ToolContext) -> int:
        """Double a number and remember it."""
        runs.append(x)
        ctx.set(f"/double_{x}", 2 * x)
        return 2 * x

    async with asyncio.timeout(30):
        report = await verify_run(store, "rc", App(agents=[crash_agent()], tools=[counted]))
    assert report.ok and report.commits_verified == after and report.status == "running"
    assert report.termination is None
    completed = sum(isinstance(e, ToolCallCompleted) for sc in prefix for e in sc.commit.events)
    assert len(runs) == completed, "no tool runs past the end of the recording"
    entropy = DeterministicEntropy()
    entropy._counter = max(int(sc.commit.commit_id[2:]) for sc in prefix)  # noqa: SLF001 - go on from the log
    fresh = Runtime(store, agents=[crash_agent()], tools=[double], entropy=entropy)
    async with asyncio.timeout(30):
        handle = await fresh.resume("rc")
        assert handle is not None and (await handle.result()).status == "done"
    log = await thread_log(store, "tc")
    assert len(log) > after
    async with asyncio.timeout(30):
        report = await verify_run(store, "rc", App(agents=[crash_agent()], tools=[double]))
    assert report.ok and report.commits_verified == len(log) and report.termination.type == "natural_end"
    # and a changed tool still diverges in a resumed run
    with pytest.raises(NonDeterminismError):
        async with asyncio.timeout(30):
            await verify_run(store, "rc", App(agents=[crash_agent()], tools=[triple]))


@tool(name="double")
def triple(x: int, ctx: ToolContext) -> int:
    """Double a number and remember it."""
    ctx.set(f"/double_{x}", 3 * x)
    return 3 * x


async def test_a_decision_recorded_alone_then_resumed_verifies(store: Any) -> None:
    """Decisions appended by one process (which died before resuming), applied by another's
    `Runtime.resume`: replay reveals the decision commit where it was recorded and resumes."""
    from agentlog.eventlog.events import Commit, ToolCallDecided, ToolCallDecision

    await start_waiting(store, "ask_approve")
    log = await thread_log(store, S.THREAD)
    decision = ToolCallDecision(target_id="call_0_0", decision_id="d1", action="resume", result=S.YES, updated_at=7)
    await store.append(Commit(commit_id="ext-1", thread_id=S.THREAD, run_id=S.RUN, ts=log[-1].commit.ts + 5,
                              events=[ToolCallDecided(call_id="call_0_0", decision=decision)]), log[-1].seq)
    async with asyncio.timeout(30):
        handle = await S.build(store, "ask_approve", 1).resume(S.RUN)
        assert handle is not None and (await handle.result()).status == "done"
    log = await thread_log(store, S.THREAD)
    assert [type(e).__name__ for e in log[3].commit.events][:2] == ["RunResumed", "ToolCallResuming"]
    async with asyncio.timeout(30):
        report = await verify_run(store, S.RUN, S.build(store, "ask_approve", 0))
    assert report.ok and report.external_commits == 1 and report.commits_verified == len(log) - 1
    with pytest.raises(NonDeterminismError):
        async with asyncio.timeout(30):
            await verify_run(store, S.RUN, tampered("ask_approve"))
