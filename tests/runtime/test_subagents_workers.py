"""Sub-agents across real worker processes: the worker running a child is SIGKILLed inside the
child's tool; another worker recovers parent and child from the log (the parent's call is run
again with the same call id, finds its child, and waits for it; the child is resumed from its
redelivered start command), and the parent ends with the child's answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunStarted
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections.fold import fold_commits
from agentlog.runtime.inputs.commands import Decide, StartRun
from agentlog.runtime.toolkits.subagents import child_ids
from agentlog.runtime.workers.commands import CommandClient

from tests.support.worker import Watch, kill_all, read_lines, spawn_worker

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def watched(server: EmbeddedNatsServer, tmp_path: Path, parent_thread: str,
                  child_thread: str) -> AsyncIterator[tuple[Any, Watch, Watch, list[Any]]]:
    """A store, watches on the parent's and the child's threads, and a list to put worker
    processes in; on failure the workers' logs are printed; everything is stopped after."""
    store = await JetStreamEventStore.connect(server.url)
    parent, child = Watch(store, parent_thread), Watch(store, child_thread)
    procs: list[asyncio.subprocess.Process] = []
    try:
        yield store, parent, child, procs
    except BaseException:
        for name in ("w1", "w2"):  # what the workers said, for the failure report
            log = tmp_path / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log (tail) ---\n" + log.read_text(errors="replace")[-4000:])
        raise
    finally:
        await kill_all(procs)
        async with asyncio.timeout(20):
            await parent.close()
            await child.close()
            await store.close()


@pytest.mark.timeout(150)
async def test_worker_crash_mid_child_recovers_from_the_log(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    child_thread, child_run = child_ids("br", "boss_call")
    exec_log = tmp_path / "exec.log"
    async with watched(nats_server, tmp_path, "bt", child_thread) as (store, parent, child, procs):
        async with asyncio.timeout(90):
            w1 = await spawn_worker(nats_server.url, tmp_path, "w1", env={
                "WORKER_APP_EXEC_LOG": str(exec_log), "WORKER_APP_CRASH": "tool:child_work"})
            procs.append(w1)
            await CommandClient(store.nc).submit(StartRun(thread_id="bt", run_id="br", agent_id="boss",
                                                          messages=["delegate"]))
            assert await w1.wait() == -9  # killed inside the child's tool
            # the watchers follow the log: wait for them to reach what the dead worker committed
            assert await parent.status_in("br", {"running"}) == "running"
            assert await child.status_in(child_run, {"running"}) == "running"
            w2 = await spawn_worker(nats_server.url, tmp_path, "w2", env={"WORKER_APP_EXEC_LOG": str(exec_log)})
            procs.append(w2)
            await parent.status_in("br", {"done"})
            await child.status_in(child_run, {"done"})
        runs = fold_commits(parent.commits).runs
        assert runs["br"].termination.type == "natural_end"
        call = runs["br"].calls["boss_call"]
        assert call.status == "succeeded" and call.result["output"] == "helper done"
        child_view = fold_commits(child.commits).runs[child_run]
        assert (child_view.parent_run_id, child_view.parent_thread_id) == ("br", "bt")
        # one child, started once; its interrupted tool ran again (at-least-once), nothing else did
        started = [e for sc in child.commits for e in sc.commit.events if type(e) is RunStarted]
        assert len(started) == 1
        assert Counter(call for _pid, call in read_lines(exec_log)) == {"child_work": 2}


@pytest.mark.timeout(150)
async def test_worker_dies_between_a_waiting_childs_end_and_its_parents_decision(
    nats_server: EmbeddedNatsServer, tmp_path: Path,
) -> None:
    """The child waited for a human, so its parent's call suspended. The worker that finishes
    the child dies right after the child's RunFinished is committed, before the parent's
    decision is recorded. Another worker takes the redelivered command, re-derives the missed
    effect from the log, and the parent finishes with the child's answer."""
    child_thread, child_run = child_ids("b2r", "boss2_call")
    async with watched(nats_server, tmp_path, "b2t", child_thread) as (store, parent, child, procs):
        async with asyncio.timeout(90):
            w1 = await spawn_worker(nats_server.url, tmp_path, "w1", env={"WORKER_APP_CRASH": "after:RunFinished:1"})
            procs.append(w1)
            client = CommandClient(store.nc)
            await client.submit(StartRun(thread_id="b2t", run_id="b2r", agent_id="boss2", messages=["go"]))
            await parent.status_in("b2r", {"waiting"})
            await child.status_in(child_run, {"waiting"})
            await client.submit(Decide(thread_id=child_thread, run_id=child_run, command_id="ok-deploy",
                                       decisions=[{"target_id": "ops_deploy", "decision_id": "ok",
                                                   "action": "resume", "result": {"approved": True}}]))
            assert await w1.wait() == -9  # right after the child's RunFinished
            await child.status_in(child_run, {"done"})  # the watcher may still be reading that commit
            assert parent.run_status("b2r") == "waiting"
            w2 = await spawn_worker(nats_server.url, tmp_path, "w2")
            procs.append(w2)
            await parent.status_in("b2r", {"done"})
        run = fold_commits(parent.commits).runs["b2r"]
        assert run.termination.type == "natural_end"
        call = run.calls["boss2_call"]
        assert call.result["output"] == "ops shipped" and call.decision.decision_id == f"d-{child_run}"
