"""Crash-resume: a worker subprocess is SIGKILLed at a deterministic point of a 20-step run
(`worker_app`'s `long` agent: 20 inferences, 28 tool calls with parallel pairs/triples throughout
(parallel_streaming), a `deploy` that waits for an approval at step 9) and a second worker completes
it from the log.

For every kill point: the final messages and thread state equal an uninterrupted control run's,
no commit id appears twice, every call completes exactly once, every tool ran at least once and
no tool whose completion was committed before the crash ran again.

Kill points are hooks of `worker_app` (env `WORKER_APP_CRASH`): the worker kills itself with
SIGKILL inside an inference, inside a tool, or right after a given commit is acked. Each kill
point gets its own nats-server, so they run a few at a time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.runtime.inputs.commands import Decide, StartRun
from agentlog.runtime.workers.commands import CommandClient

from tests.apps import worker_app
from tests.support.worker import Watch, kill_all, message_list, read_lines, spawn_worker, thread_state

pytestmark = pytest.mark.asyncio

AGENT = "long"
STEPS = len(worker_app.LONG_SCRIPT)  # 20 inferences
CALLS = worker_app.LONG_CALLS  # call_<step>_<i>, 28 calls
APPROVAL_CALL = f"call_{worker_app.LONG_APPROVAL_STEP}_1"  # the deploy of step 9
APPROVE = {"target_id": APPROVAL_CALL, "decision_id": "approve-deploy", "action": "resume", "result": {"approved": True}}

#: Kill points over the 20 steps: early, middle, around the approval (step 9), late.
KILL_POINTS = [
    "model:0",                              # step 0: in the first inference, before its commit
    "after:InferenceCompleted:1",           # step 0: inference committed, two parallel calls started
    "tool:call_2_1",                        # step 2: inside the middle one of three parallel calls
    "after:ToolCallCompleted:call_6_0",     # step 6: a completion committed, before step 7
    "after:RunSuspended:1",                 # step 9: waiting for the approval (start not yet acked)
    "after:ToolCallResuming:1",             # step 9: decision committed, replay not started
    f"tool:{APPROVAL_CALL}",                # step 9: inside the approved (replayed) call
    "model:10",                             # step 10: in the inference after the resume
    "tool:call_17_1",                       # step 17: inside the second of two parallel calls
    f"after:InferenceCompleted:{STEPS}",    # step 19: the final answer committed with RunFinished
]


async def control_run(store: Any) -> tuple[list[Any], Any]:
    rt = worker_app.app(store)
    h = await rt.start(AGENT, "go", thread_id="control", run_id="control-run")
    assert (await h.result()).status == "waiting"
    res = await rt.decide("control-run", [APPROVE])
    result = await res.handle.result()
    assert result.status == "done" and result.termination.type == "natural_end"
    commits = [sc async for sc in store.read_thread("control")]
    kinds = Counter(type(e).__name__ for sc in commits for e in sc.commit.events)
    assert kinds["InferenceCompleted"] == STEPS == 20 and kinds["RunSuspended"] == 1, kinds
    assert kinds["ToolCallCompleted"] == len(CALLS), kinds
    return message_list(commits, "control"), thread_state(commits, "control")


async def one_kill_point(tmp: Path, point: str, control: tuple[list[Any], Any]) -> None:
    server = EmbeddedNatsServer(tmp / "nats")
    server.start()
    procs: list[asyncio.subprocess.Process] = []
    store = await JetStreamEventStore.connect(server.url)
    watch = Watch(store, "t1")
    exec_log, commit_log = tmp / "exec.log", tmp / "commits.log"
    env = {"WORKER_APP_EXEC_LOG": str(exec_log), "WORKER_APP_COMMIT_LOG": str(commit_log)}
    try:
        async with asyncio.timeout(60):
            client = CommandClient(store.nc)
            w1 = await spawn_worker(server.url, tmp, "w1", env={**env, "WORKER_APP_CRASH": point})
            procs.append(w1)
            await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id=AGENT, messages=["go"]))
            died = asyncio.ensure_future(w1.wait())
            waiting = asyncio.ensure_future(watch.status_in("r1", {"waiting", "done"}))
            await asyncio.wait((died, waiting), return_when=asyncio.FIRST_COMPLETED)
            decided = False
            if not died.done():
                assert watch.run_status("r1") == "waiting", point
                await client.submit(Decide(thread_id="t1", run_id="r1", decisions=[APPROVE], command_id="d1"))
                decided = True
                await died
            waiting.cancel()
            assert w1.returncode == -9, f"{point}: w1 exited with {w1.returncode}, not by its SIGKILL hook"
            w2 = await spawn_worker(server.url, tmp, "w2", env=env)
            procs.append(w2)
            if not decided:
                await watch.status_in("r1", {"waiting"})
                await client.submit(Decide(thread_id="t1", run_id="r1", decisions=[APPROVE], command_id="d1"))
            await watch.status_in("r1", {"done"})
        commits = [sc async for sc in store.read_thread("t1")]
        # same outcome as the uninterrupted run
        assert message_list(commits, "t1") == control[0], point
        assert thread_state(commits, "t1") == control[1], point
        # nothing twice
        ids = [sc.commit.commit_id for sc in commits]
        assert len(ids) == len(set(ids)), point
        events = [(type(e).__name__, getattr(e, "call_id", None)) for sc in commits for e in sc.commit.events]
        counts = Counter(events)
        for call in CALLS:
            assert counts[("ToolCallCompleted", call)] == 1, (point, call, counts)
        assert counts[("RunFinished", None)] == 1 and counts[("RunStarted", None)] == 1, point
        # tools: each ran at least once; a call completed in the log before the crash never again
        runs = read_lines(exec_log)
        ran = Counter(call for _pid, call in runs)
        assert set(ran) == set(CALLS), (point, ran)
        w1_last = max((seq for pid, seq in read_lines(commit_log) if pid == w1.pid), default=0, key=int)
        completed_seq = {
            e.call_id: sc.seq for sc in commits for e in sc.commit.events if type(e).__name__ == "ToolCallCompleted"
        }
        for call, n in ran.items():
            if completed_seq[call] <= int(w1_last):
                assert n == 1, f"{point}: {call} completed at seq {completed_seq[call]} but ran {n} times"
        if point.startswith("tool:"):
            assert ran[point.split(":", 1)[1]] == 2, (point, ran)  # killed mid-call: ran again
    finally:
        await kill_all(procs)
        await watch.close()
        await store.close()
        server.stop()


async def test_crash_at_every_kill_point_then_another_worker_completes(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        async with asyncio.timeout(30):
            control = await control_run(store)
    finally:
        await store.close()
    # user, 20 assistant, 28 tool results; state from the tools
    assert len(control[0]) == 1 + STEPS + len(CALLS) and len(control[0]) == 49 and control[1]
    limit = asyncio.Semaphore(3)

    async def guarded(i: int, point: str) -> None:
        async with limit:
            d = tmp_path / f"kp{i}"
            d.mkdir()
            await one_kill_point(d, point, control)

    results = await asyncio.gather(*(guarded(i, p) for i, p in enumerate(KILL_POINTS)), return_exceptions=True)
    failures = [(p, r) for p, r in zip(KILL_POINTS, results, strict=True) if isinstance(r, BaseException)]
    if failures:
        raise AssertionError("\n".join(f"{p}: {type(r).__name__}: {r}" for p, r in failures)) from failures[0][1]
