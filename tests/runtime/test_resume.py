"""`Runtime.resume`: a crashed or handed-over run continues from the log alone.

Kill points are simulated by building the log a crash would leave: the run is driven through a
store wrapper that lets the first k commits through and then fails every append (the process
"dies" after commit k). A brand-new Runtime (new tools, new model, nothing in memory) then
resumes the run on the real JetStream store. The resulting log must equal, commit for commit
(ids and timestamps included), the log of an uninterrupted control run of the same agent with
`DeterministicEntropy`; no commit appears twice; no tool whose completion was committed runs
again; every tool runs at least once.

The resumer's entropy continues where the crashed process's *committed* draws ended: the last
id drawn before a commit is that commit's id, so its counter is the highest committed id.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from agentlog.eventlog.events import Commit, StoredCommit
from agentlog.eventlog.memory import MemoryEventStore
from agentlog.runtime import AgentSpec, DeterministicEntropy, Runtime, ToolContext, ToolResult, tool
from agentlog.runtime.models.scripted import ScriptedCall, ScriptedModel, Turn

from tests.support.runtime import shape, store, thread_log  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio

THREAD, RUN = "t-resume", "r-resume"


class Crash(Exception):
    """The simulated death of the process that drove the run."""


class AppStore:
    """Passes through to the real store; tells the app when c1's completion is committed, and
    with `after` set, lets that many appends through and then fails every append (a crash)."""

    def __init__(self, inner: Any, app: App, after: int | None = None) -> None:
        self.inner = inner
        self.app = app
        self.after = after
        self.appended = 0

    async def append(self, commit: Commit, expected_version: int | None) -> Any:
        if self.after is not None and self.appended >= self.after:
            raise Crash(f"crashed after commit {self.after}")
        res = await self.inner.append(commit, expected_version)
        self.appended += 1
        if "c1" in completed_in([StoredCommit(res.seq, commit)]):
            self.app.c1_committed.set()
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class App:
    """One process's worth of agent wiring: its own tools (counting executions), model, entropy."""

    def __init__(self, mode: str, *, pending: bool = False) -> None:
        self.runs: Counter[str] = Counter()
        self.pending = pending
        #: In parallel modes c2 finishes only once c1's completion is committed, so that the
        #: commit points do not depend on timing (two completions in one wake-up share a commit).
        self.c1_committed = asyncio.Event()
        parallel = mode != "sequential"

        @tool
        async def add(a: int, b: int, ctx: ToolContext) -> Any:
            """Add two integers (suspends first when the app says so)."""
            self.runs[ctx.call_id] += 1
            if parallel and ctx.call_id == "c2":
                await self.c1_committed.wait()
            if self.pending and ctx.call_id == "c1" and ctx.decision is None:
                return ToolResult.pending(f"t-{ctx.call_id}")
            ctx.set(f"/sum_{ctx.call_id}", a + b)
            return a + b

        self.requests: list[Any] = []

        def script(req: Any) -> Turn:
            self.requests.append(req)
            if req.messages[-1].role != "user":
                return Turn.text("done")
            return Turn.tools(ScriptedCall("add", {"a": 1, "b": 2}, id="c1"),
                              ScriptedCall("add", {"a": 3, "b": 4}, id="c2"))

        self.tool = add
        self.spec = AgentSpec(id="calc", model=ScriptedModel([script], loop=True), tools=["add"],
                              tool_execution_mode=mode)  # type: ignore[arg-type]

    def runtime(self, store: Any, entropy: DeterministicEntropy | None = None, crash_after: int | None = None) -> Runtime:
        return Runtime(AppStore(store, self, crash_after), agents=[self.spec], tools=[self.tool],
                       entropy=entropy or DeterministicEntropy())


def entropy_after(commits: list[StoredCommit]) -> DeterministicEntropy:
    entropy = DeterministicEntropy()
    entropy._counter = max(int(sc.commit.commit_id[2:]) for sc in commits)  # noqa: SLF001
    return entropy


async def control(mode: str, *, pending: bool = False) -> tuple[list[StoredCommit], App]:
    """The uninterrupted run (memory store: the same code, the same ids, seqs from 1)."""
    app = App(mode, pending=pending)
    mem = MemoryEventStore()
    rt = app.runtime(mem)
    result = await rt.run("calc", "add please", thread_id=THREAD, run_id=RUN)
    if pending:
        assert result.status == "waiting"
        res = await rt.decide(RUN, [{"target_id": "c1", "decision_id": "d1", "action": "resume", "updated_at": 1}])
        assert res.handle is not None
        result = await res.handle.result()
    assert result.status == "done", result
    return await thread_log(mem, THREAD), app


def completed_in(commits: list[StoredCommit]) -> set[str]:
    return {e.call_id for sc in commits for e in sc.commit.events if type(e).__name__ == "ToolCallCompleted"}


async def crash_then_resume(store: Any, mode: str, after: int, *, pending: bool = False) -> None:
    want, control_app = await control(mode, pending=pending)
    assert 0 < after < len(want)
    crashed_app = App(mode, pending=pending)
    rt = crashed_app.runtime(store, crash_after=after)
    async with asyncio.timeout(30):
        if pending and after > 2:  # the crash comes after the suspension: decide, then crash
            waiting = await rt.run("calc", "add please", thread_id=THREAD, run_id=RUN)
            assert waiting.status == "waiting"
            try:
                res = await rt.decide(RUN, [{"target_id": "c1", "decision_id": "d1", "action": "resume",
                                             "updated_at": 1}])
                assert res.handle is not None
                await res.handle.result()
            except Crash:
                pass
        else:
            with pytest.raises(Crash):
                await rt.run("calc", "add please", thread_id=THREAD, run_id=RUN)
    prefix = await thread_log(store, THREAD)
    assert prefix == want[:after], "the crash left exactly the first k commits"
    done_before = completed_in(prefix)

    fresh_app = App(mode, pending=pending)
    if "c1" in done_before:
        fresh_app.c1_committed.set()
    fresh = fresh_app.runtime(store, entropy_after(prefix))
    async with asyncio.timeout(30):
        handle = await fresh.resume(RUN)
        if handle is None:  # died right after the suspension: waiting, nothing to resume
            assert pending and after == 3
            result = None
        else:
            result = await handle.result()
        if result is None or result.status == "waiting":  # crashed before the decision: decide now
            res = await fresh.decide(RUN, [{"target_id": "c1", "decision_id": "d1", "action": "resume",
                                            "updated_at": 1}])
            assert res.handle is not None
            result = await res.handle.result()
    assert result.status == "done"
    got = await thread_log(store, THREAD)
    assert shape(got) == shape(want)
    assert got == want, "the resumed log equals the uninterrupted one, ids and timestamps included"
    assert len({sc.commit.commit_id for sc in got}) == len(got), "no commit twice"
    assert not done_before & set(fresh_app.runs), "a tool whose completion was committed never runs again"
    every = crashed_app.runs + fresh_app.runs
    assert set(every) == set(control_app.runs) == {"c1", "c2"}, "every tool ran at least once"
    assert await fresh.resume(RUN) is None, "a finished run has nothing to resume"


@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming"])
async def test_crash_after_the_run_start_commit(store: Any, mode: str) -> None:
    await crash_then_resume(store, mode, 1)


@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming", "parallel_batch_approval"])
async def test_crash_after_the_inference_commit_with_tools_started(store: Any, mode: str) -> None:
    await crash_then_resume(store, mode, 2)


async def test_crash_between_two_tool_completions_sequential(store: Any) -> None:
    # commit 3 = c1 completed + c2 started; c2's completion never made it
    await crash_then_resume(store, "sequential", 3)


async def test_crash_between_two_tool_completions_parallel(store: Any) -> None:
    # both started at commit 2; the first completion (commit 3) is in, the second is not
    await crash_then_resume(store, "parallel_streaming", 3)


@pytest.mark.parametrize("after", [3, 4])
async def test_crash_mid_resume(store: Any, after: int) -> None:
    # sequential, c1 returns pending: 1 start, 2 inference + start c1, 3 suspended + waiting;
    # decide: 4 decision commit (ToolCallDecided + RunResumed + ToolCallResuming), 5 replay start...
    # after=3: the process dies right after the suspension (the resumer decides);
    # after=4: it dies right after the decision commit (the resumer re-drives the resuming call)
    await crash_then_resume(store, "sequential", after, pending=True)


async def test_crash_after_the_replayed_call_started(store: Any) -> None:
    await crash_then_resume(store, "sequential", 5, pending=True)


async def test_resume_applies_a_decision_recorded_by_another_process(store: Any) -> None:
    """A decision appended without resuming (an API process that died before it resumed): a
    fresh Runtime's resume applies it as decide() would have."""
    want, _ = await control("sequential", pending=True)
    app = App("sequential", pending=True)
    rt = app.runtime(store)
    async with asyncio.timeout(30):
        waiting = await rt.run("calc", "add please", thread_id=THREAD, run_id=RUN)
        assert waiting.status == "waiting"
        # the decision commit as decide() writes it, minus the resume: only ToolCallDecided
        decided = [e for e in want[3].commit.events if type(e).__name__ == "ToolCallDecided"]
        log = await thread_log(store, THREAD)
        await store.append(Commit(commit_id="ext-1", thread_id=THREAD, run_id=RUN, ts=1, events=decided), log[-1].seq)
        fresh = App("sequential", pending=True)
        handle = await fresh.runtime(store, DeterministicEntropy(prefix="x")).resume(RUN)
        assert handle is not None
        result = await handle.result()
    assert result.status == "done"
    got = await thread_log(store, THREAD)
    assert shape(got)[4][:2] == ["RunResumed", "ToolCallResuming"]
    assert shape(got)[5:] == shape(want)[4:]
    assert fresh.runs["c1"] == 1 and fresh.runs["c2"] == 1


async def test_resume_of_a_waiting_run_without_decisions_is_none(store: Any) -> None:
    app = App("sequential", pending=True)
    async with asyncio.timeout(30):
        waiting = await app.runtime(store).run("calc", "add please", thread_id=THREAD, run_id=RUN)
        assert waiting.status == "waiting"
        before = await thread_log(store, THREAD)
        assert await App("sequential", pending=True).runtime(store).resume(RUN) is None
    assert await thread_log(store, THREAD) == before, "resume appends nothing when there is nothing to do"


async def test_cold_resume_from_a_views_snapshot_writes_the_same_log(store: Any) -> None:
    """With `views`, resume folds the thread view snapshot + the run's commits + the tail; the
    older messages arrive concurrently. The log (incl. the next inference's request digest,
    which covers every message) equals what a resume folding the whole thread writes."""
    from agentlog.projections.fold import fold_commits
    from agentlog.projections.kv import KVViewStore

    views = await KVViewStore.open(store.nc)

    async def scenario(thread: str, run: str, with_views: bool) -> list[StoredCommit]:
        app = App("sequential", pending=True)
        rt = app.runtime(store, DeterministicEntropy(prefix=f"p{run[2:]}"))  # commit ids are dedup keys
        first = await rt.run("calc", "earlier question", thread_id=thread, run_id=f"{run}-0")
        assert first.status == "waiting"
        await rt.cancel(first.run_id)
        prior = await thread_log(store, thread)
        await views.put_views(fold_commits(prior).threads.values(), [])  # the projector caught up here
        waiting = await rt.run("calc", "add please", thread_id=thread, run_id=run, parent_run_id=f"{run}-0")
        assert waiting.status == "waiting"
        fresh_app = App("sequential", pending=True)
        fresh = fresh_app.runtime(store, DeterministicEntropy(prefix=f"q{run[2:]}"))
        if with_views:
            fresh.views = views
        res = await fresh.decide(run, [{"target_id": "c1", "decision_id": "d1", "action": "resume", "updated_at": 1}],
                                 thread_id=thread)
        assert res.handle is not None
        assert (await res.handle.result()).status == "done"
        seen.append([(m.role, m.content, m.tool_call_id) for r in fresh_app.requests for m in r.messages])
        return await thread_log(store, thread)

    seen: list[Any] = []

    async with asyncio.timeout(30):
        plain = await scenario("t-plain", "r-plain", False)
        snap = await scenario("t-snap", "r-snap", True)

    def strip(commits: list[StoredCommit]) -> list[Any]:
        import msgspec
        out = []
        for sc in commits:
            text = msgspec.json.encode([
                msgspec.structs.replace(e, request_digest=None, request_digests=None) if type(e).__name__ == "InferenceCompleted" else e
                for e in sc.commit.events
            ]).decode()
            for a, b in (("t-plain", "T"), ("t-snap", "T"), ("r-plain", "R"), ("r-snap", "R"), ("pplain", "P"),
                         ("psnap", "P"), ("qplain", "Q"), ("qsnap", "Q")):
                text = text.replace(a, b)
            out.append(text)
        return out

    assert strip(snap) == strip(plain)
    assert seen[0] == seen[1] and len(seen[1]) >= 7, "the next inference saw the whole conversation"
    digests = [e.request_digest for sc in snap for e in sc.commit.events if type(e).__name__ == "InferenceCompleted"]
    assert len(digests) == 3 and all(digests)


@pytest.mark.parametrize("mode", ["sequential", "parallel_streaming"])
async def test_crash_after_the_step_end_commit_redoes_the_uncommitted_inference(store: Any, mode: str) -> None:
    # commit 4 = c2's completion + StepFinished; the final inference (commit 5) never made it
    await crash_then_resume(store, mode, 4)
