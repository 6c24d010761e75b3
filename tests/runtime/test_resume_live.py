"""Live decisions (DESIGN 4.3, parallel_streaming): a decision for a suspended call of a run that
is still executing other calls is applied as it arrives, not when the run next waits.

Two calls: c1 suspends (pending), c2 blocks on an `asyncio.Event` the test holds. c1 is decided
while c2 is still blocked; c1's replay must be committed BEFORE c2 is released. No sleeps: the
test follows the run's committed events.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models.scripted import ScriptedCall, ScriptedModel, Turn
from agentlog.runtime.runs.handle import CommittedEvent

from tests.support.runtime import shape, store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio


class App:
    def __init__(self, mode: str, calls: tuple[str, ...] = ("c1", "c2"), pending: tuple[str, ...] = ("c1",),
                 blocked: str = "c2") -> None:
        self.release = asyncio.Event()
        self.runs: Counter[str] = Counter()

        @tool
        async def work(n: int, ctx: ToolContext) -> Any:
            """Pending until decided (the pending calls), blocked until released (the blocked one)."""
            self.runs[ctx.call_id] += 1
            if ctx.call_id in pending and ctx.decision is None:
                return ToolResult.pending(f"t-{ctx.call_id}")
            if ctx.call_id == blocked:
                await self.release.wait()
            return n

        def script(req: Any) -> Turn:
            if req.messages[-1].role != "user":
                return Turn.text("done")
            return Turn.tools(*(ScriptedCall("work", {"n": i}, id=c) for i, c in enumerate(calls)))

        self.tool = work
        self.spec = AgentSpec(id="w", model=ScriptedModel([script], loop=True), tools=["work"],
                              tool_execution_mode=mode)  # type: ignore[arg-type]

    def runtime(self, store: Any, prefix: str = "id") -> Runtime:
        return Runtime(store, agents=[self.spec], tools=[self.tool], entropy=DeterministicEntropy(prefix=prefix))


async def until(events: AsyncIterator[CommittedEvent], kind: str, call_id: str) -> CommittedEvent:
    async for ce in events:
        if type(ce.event).__name__ == kind and getattr(ce.event, "call_id", None) == call_id:
            return ce
    raise AssertionError(f"the run ended without {kind}({call_id})")


def decision(call_id: str, decision_id: str) -> dict[str, Any]:
    return {"target_id": call_id, "decision_id": decision_id, "action": "resume", "updated_at": 1}


async def test_in_process_decision_is_replayed_while_another_call_is_in_flight(store: Any) -> None:
    app = App("parallel_streaming")
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("w", "go")
        events = handle.events()
        await until(events, "ToolCallSuspended", "c1")
        res = await rt.decide(handle.run_id, [decision("c1", "d1")])
        assert not res.duplicate and res.handle is handle, "the running loop takes it, no second loop"
        done = await until(events, "ToolCallCompleted", "c1")
        assert not app.release.is_set() and app.runs["c2"] == 1, "c2 is still blocked"
        app.release.set()
        result = await handle.result()
    assert result.status == "done"
    log = await thread_log(store, handle.thread_id)
    completed = {e.call_id: sc.seq for sc in log for e in sc.commit.events if type(e).__name__ == "ToolCallCompleted"}
    assert completed["c1"] == done.position.seq < completed["c2"]
    assert app.runs == Counter({"c1": 2, "c2": 1})  # c1: pending, then its replay
    kinds = [k for commit in shape(log) for k in commit]
    assert "RunSuspended" not in kinds, "the run never waited: the decision arrived while it ran"
    assert kinds.index("ToolCallDecided") < kinds.index("ToolCallResuming") < kinds.index("RunFinished")
    # the decision commit is decide()'s own (ToolCallDecided only); the loop's resume follows it
    assert ["ToolCallDecided"] in shape(log)


async def test_decision_from_another_process_is_folded_through_the_conflict_path(store: Any) -> None:
    app = App("parallel_streaming")
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("w", "go")
        events = handle.events()
        await until(events, "ToolCallSuspended", "c1")
        other = App("parallel_streaming").runtime(store, prefix="x")  # another process: no poke
        res = await other.decide(handle.run_id, [decision("c1", "d1")], thread_id=handle.thread_id)
        assert res.handle is None and res.resumed == []
        app.release.set()  # c2's completion append conflicts with the decision commit
        result = await handle.result()
    assert result.status == "done"
    log = await thread_log(store, handle.thread_id)
    kinds = [k for commit in shape(log) for k in commit]
    # the loop learned of it at its next append (c2's completion, which also closed the step):
    # that commit may already say RunSuspended; the same loop then resumes c1 itself
    assert kinds.count("ToolCallCompleted") == 2 and kinds.count("ToolCallResuming") == 1
    assert kinds.index("ToolCallDecided") < kinds.index("ToolCallResuming")
    assert app.runs == Counter({"c1": 2, "c2": 1})


async def test_batch_approval_waits_for_the_whole_batch_while_calls_run(store: Any) -> None:
    app = App("parallel_batch_approval", calls=("c1", "c2", "c3"), pending=("c1", "c2"), blocked="c3")
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("w", "go")
        events = handle.events()
        await until(events, "ToolCallSuspended", "c2")
        await rt.decide(handle.run_id, [decision("c1", "d1")])
        await until(events, "ToolCallDecided", "c1")
        await rt.decide(handle.run_id, [decision("c2", "d2")])
        await until(events, "ToolCallCompleted", "c2")
        assert not app.release.is_set() and app.runs["c3"] == 1
        app.release.set()
        result = await handle.result()
    assert result.status == "done"
    log = await thread_log(store, handle.thread_id)
    resuming = [sc.seq for sc in log for e in sc.commit.events if type(e).__name__ == "ToolCallResuming"]
    decided = [sc.seq for sc in log for e in sc.commit.events if type(e).__name__ == "ToolCallDecided"]
    assert len(resuming) == 2 and len(set(resuming)) == 1, "both resume together"
    assert resuming[0] > max(decided), "only once the whole batch was decided"


class _Dies:
    """Lets `after` appends through, then fails every append: the process died."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.after, self.appended = inner, after, 0

    async def append(self, commit: Any, expected_version: int | None) -> Any:
        if self.appended >= self.after:
            raise RuntimeError("the process died")
        self.appended += 1
        return await self.inner.append(commit, expected_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_resume_applies_a_live_decision_its_dead_worker_never_saw(store: Any) -> None:
    """Decided mid-step, then the worker died before it folded the decision: resume re-runs the
    in-flight call and applies the decision (the step is still open: no RunSuspended)."""
    app = App("parallel_streaming")
    dying = Runtime(_Dies(store, 3), agents=[app.spec], tools=[app.tool], entropy=DeterministicEntropy())
    async with asyncio.timeout(30):
        handle = await dying.start("w", "go")  # 1 start, 2 inference + starts, 3 c1 suspended
        events = handle.events()
        await until(events, "ToolCallSuspended", "c1")
        other = App("parallel_streaming")
        await other.runtime(store, prefix="x").decide(handle.run_id, [decision("c1", "d1")], thread_id=handle.thread_id)
        app.release.set()
        with pytest.raises(Exception):  # noqa: B017  (any failure: the process "died")
            await handle.result()
        fresh = App("parallel_streaming")
        fresh.release.set()
        resumed = await fresh.runtime(store, prefix="y").resume(handle.run_id)
        assert resumed is not None
        result = await resumed.result()
    assert result.status == "done"
    log = await thread_log(store, handle.thread_id)
    kinds = [k for commit in shape(log) for k in commit]
    assert "RunSuspended" not in kinds and kinds.count("ToolCallCompleted") == 2
    assert fresh.runs == Counter({"c1": 1, "c2": 1}), "c2 re-run (never committed), c1 replayed"


async def test_signal_cancel_stops_an_in_process_run_without_appending_a_request(store: Any) -> None:
    app = App("parallel_streaming", pending=())
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        handle = await rt.start("w", "go")
        events = handle.events()
        await until(events, "ToolCallStarted", "c2")
        assert rt.signal_cancel(handle.run_id) is True
        result = await handle.result()
        assert rt.signal_cancel(handle.run_id) is False and handle.request_cancel() is False
    assert result.status == "done" and result.termination is not None and result.termination.type == "cancelled"
    kinds = [k for commit in shape(await thread_log(store, handle.thread_id)) for k in commit]
    assert "RunCancelRequested" not in kinds and kinds[-1] == "RunFinished"
