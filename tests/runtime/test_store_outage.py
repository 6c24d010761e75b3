"""A NATS outage is never a run outcome.

The real nats-server is stopped (same data dir, same port) while runs have tool calls in flight;
the calls then complete into a store that is down. The loop must wait for the store (bounded by
the Runtime's outage deadline) instead of finishing the run `error/store_unavailable` with its
running calls recorded `cancelled`; past the deadline it stops without committing anything, and
the worker redelivers the command, which resumes the run once NATS is back.

The outage is held deterministically: the server stays down until every run's loop has been
seen failing to append (`FailureProbe`, a thin counter around the real store), which with the
store's default 5 s request timeout makes every outage here longer than 5 s in the first case.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentlog.cli.demo import follow_run
from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.errors import StoreUnavailable
from agentlog.eventlog.events import RunFinished, StoredCommit, ToolCallCompleted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections.fold import fold_commits
from agentlog.runtime import AgentSpec, Runtime, ToolContext, tool
from agentlog.runtime.inputs.commands import StartRun
from agentlog.runtime.models.scripted import ScriptedModel, Turn
from agentlog.runtime.outage import OutagePolicy
from agentlog.runtime.workers.commands import CommandClient
from agentlog.runtime.workers.worker import Worker

LIMIT = 60
RUNS = 3

class Gate:
    """Holds `gate(k)` calls until `open[k]` is set; counts the calls that entered, per thread.
    One per test (asyncio primitives belong to the test's event loop)."""

    def __init__(self) -> None:
        self.open = {1: asyncio.Event(), 2: asyncio.Event()}
        self.entered: Counter[str] = Counter()
        self.changed = asyncio.Condition()

    async def until_entered(self, threads: list[str], calls: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: all(self.entered[t] >= calls for t in threads))


_current: Gate | None = None


@tool
async def gate(k: int, ctx: ToolContext) -> str:
    """Hold the call until the test opens the gate."""
    g = _current
    assert g is not None
    async with g.changed:
        g.entered[ctx.thread_id] += 1
        g.changed.notify_all()
    await g.open[k].wait()
    return f"passed {k}"


class FailureProbe:
    """The real store, with a count of appends that raised `StoreUnavailable`, per thread."""

    def __init__(self, store: JetStreamEventStore) -> None:
        self._store = store
        self.failed: Counter[str] = Counter()
        self.changed = asyncio.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, commit: Any, expected_version: Any) -> Any:
        try:
            return await self._store.append(commit, expected_version)
        except StoreUnavailable:
            async with self.changed:
                self.failed[commit.thread_id] += 1
                self.changed.notify_all()
            raise

    async def until_failed(self, threads: list[str], times: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: all(self.failed[t] >= times for t in threads))


def _runtime(store: Any, deadline: float) -> Runtime:
    spec = AgentSpec(id="gated", model="gated", tools=["gate"], max_rounds=5, tool_execution_mode="parallel_streaming")
    model = ScriptedModel([Turn.tools(("gate", {"k": 1}), ("gate", {"k": 2}), text="two gates"), Turn.text("done")],
                          loop=True, position="conversation")
    return Runtime(store, agents=[spec], tools=[gate], models={"gated": model}, store_outage_deadline=deadline)


def _new_gate() -> Gate:
    global _current
    _current = Gate()
    return _current


def _assert_clean(commits: list[StoredCommit], run_id: str) -> None:
    """Finished naturally, once; every call completed exactly once and succeeded; no commit twice."""
    ids = [sc.commit.commit_id for sc in commits]
    assert len(ids) == len(set(ids)), "a commit was written twice"
    events = [e for sc in commits for e in sc.commit.events]
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert [f.termination.type for f in finished] == ["natural_end"], finished
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert Counter(e.call_id for e in completed) == {"call_0_0": 1, "call_0_1": 1}
    assert {e.outcome for e in completed} == {"succeeded"}
    assert fold_commits(commits).runs[run_id].status == "done"


@pytest.mark.parametrize(("request_timeout", "deadline", "failures"), [
    pytest.param(5.0, 60.0, 1, id="waits-through-a-5s-plus-outage"),
    pytest.param(1.0, 0.3, 2, id="past-the-deadline-the-worker-redelivers"),
])
async def test_outage_mid_run_is_not_a_run_outcome(tmp_path: Path, request_timeout: float, deadline: float,
                                                   failures: int) -> None:
    """Call 1 of each run completes during the outage while call 2 still runs (the old code then
    finished the run `error` with call 2 recorded `cancelled` as soon as NATS was back).
    `failures`: how many failed appends per run the outage is held for. With a 60 s deadline the
    first (after the 5 s request timeout) shows the loop waiting; with a 0.3 s deadline the second
    is the loop's last try before it lets go of the run (uncommitted, resumed on redelivery)."""
    g = _new_gate()
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    store = await JetStreamEventStore.connect(server.url, request_timeout=request_timeout)
    probe = FailureProbe(store)
    worker = Worker(probe, runtime=_runtime(probe, deadline), concurrency=RUNS, ack_wait=30)
    threads = [f"t{i}" for i in range(RUNS)]
    try:
        async with asyncio.timeout(LIMIT):
            await worker.start()
            client = CommandClient(store.nc)
            for t in threads:
                await client.submit(StartRun(thread_id=t, run_id=f"r{t}", agent_id="gated", messages=["go"]))
            await g.until_entered(threads, 2)  # every run has both calls in flight
            await server.astop()
            g.open[1].set()  # one call completes into a store that is down, the other still runs
            await probe.until_failed(threads, failures)
            await server.astart()  # same port, same data dir
            g.open[2].set()
            for t in threads:
                await follow_run(store, t, f"r{t}", 0, lambda _c: None)
        for t in threads:
            _assert_clean([sc async for sc in store.read_thread(t)], f"r{t}")
    finally:
        await worker.stop(timeout=2)
        await store.close()
        server.stop()


async def test_past_the_deadline_the_run_is_left_resumable(tmp_path: Path) -> None:
    """No worker: the run's task ends with `StoreUnavailable`, and the log holds no finish and no
    cancelled call; `resume` (what a redelivered command does) then finishes it naturally."""
    g = _new_gate()
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    store = await JetStreamEventStore.connect(server.url, request_timeout=1.0)
    rt = _runtime(store, 0.2)
    try:
        async with asyncio.timeout(LIMIT):
            handle = await rt.start("gated", "go", thread_id="d1", run_id="rd1")
            await g.until_entered(["d1"], 2)
            await server.astop()
            g.open[1].set()
            with pytest.raises(StoreUnavailable):
                await handle.result()
            await server.astart()
            g.open[2].set()
            commits = [sc async for sc in store.read_thread("d1")]
            events = [e for sc in commits for e in sc.commit.events]
            assert not any(isinstance(e, RunFinished) for e in events)
            assert not any(isinstance(e, ToolCallCompleted) for e in events)
            assert fold_commits(commits).runs["rd1"].status == "running"
            resumed = await rt.resume("rd1", thread_id="d1")
            assert resumed is not None
            result = await resumed.result()
        assert result.termination is not None and result.termination.type == "natural_end"
        _assert_clean([sc async for sc in store.read_thread("d1")], "rd1")
    finally:
        await store.close()
        server.stop()


def test_outage_policy_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLOG_STORE_OUTAGE_DEADLINE", raising=False)
    assert OutagePolicy.from_env().deadline == 60.0
    assert OutagePolicy.from_env(2.5).deadline == 2.5
    monkeypatch.setenv("AGENTLOG_STORE_OUTAGE_DEADLINE", "7")
    assert OutagePolicy.from_env().deadline == 7.0
    monkeypatch.setenv("AGENTLOG_STORE_OUTAGE_DEADLINE", "soon")
    with pytest.raises(ValueError, match="AGENTLOG_STORE_OUTAGE_DEADLINE"):
        OutagePolicy.from_env()
    with pytest.raises(ValueError):
        OutagePolicy.from_env(-1)


async def test_through_outage_retries_the_same_operation_until_the_deadline() -> None:
    """The retry helper alone (no NATS): an operation failing `StoreUnavailable` is called again
    until it answers; past the deadline the last error is raised; other errors pass at once."""
    from agentlog.runtime.logs import get_logger
    from agentlog.runtime.outage import through_outage

    log = get_logger("test")
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise StoreUnavailable(f"down {len(calls)}")
        return "ok"

    assert await through_outage(flaky, OutagePolicy(deadline=30, first_retry=0.001, max_retry=0.002), log) == "ok"
    assert len(calls) == 4

    calls.clear()
    with pytest.raises(StoreUnavailable, match="down 1"):
        await through_outage(flaky, OutagePolicy(deadline=0), log)
    assert len(calls) == 1

    async def broken() -> str:
        calls.append(1)
        raise ValueError("a bug, not an outage")

    calls.clear()
    with pytest.raises(ValueError):
        await through_outage(broken, OutagePolicy(deadline=30), log)
    assert len(calls) == 1
