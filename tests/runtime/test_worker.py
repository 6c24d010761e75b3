"""Worker commands and workers on a real nats-server: codec, queue dedup, live cancel, a NATS
restart mid-run, and scale-out over three worker processes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import ToolCallDecision
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.projections.fold import fold_commits
from agentlog.runtime.inputs.commands import (
    Cancel,
    ContinueRun,
    Decide,
    InvalidCommand,
    StartRun,
    decode_command,
    encode_command,
)
from agentlog.runtime.workers.commands import COMMANDS_STREAM, CommandClient
from agentlog.runtime.workers.worker import Worker

from tests.apps import worker_app
from tests.support.worker import Watch, kill_all, message_list, read_lines, spawn_worker

pytestmark = pytest.mark.asyncio


# -- commands --------------------------------------------------------------------------------------


async def test_codec_round_trip_and_typed_errors() -> None:
    cmds = [
        StartRun(thread_id="t", run_id="r", agent_id="a", messages=["hi", {"role": "user", "content": "x"}]),
        ContinueRun(thread_id="t", run_id="r2", agent_id="a", parent_run_id="r",
                    decisions=[{"target_id": "c", "decision_id": "d", "action": "resume", "result": True}]),
        Decide(thread_id="t", run_id="r", decisions=[ToolCallDecision(target_id="c", decision_id="d", action="cancel")]),
        Cancel(thread_id="t", run_id="r", reason="bye"),
    ]
    for cmd in cmds:
        assert decode_command(encode_command(cmd)) == cmd
    bad = [
        b"not json", b"{}", b'{"type":"start","thread_id":"t"}', b'{"type":"nope","thread_id":"t"}',
        b'{"type":"cancel","thread_id":"a.b","run_id":"r"}', b'{"type":"decide","thread_id":"t","run_id":"r","decisions":[]}',
        b'{"type":"continue","thread_id":"t","run_id":"r","agent_id":"a"}',
        b'{"type":"cancel","thread_id":"t","run_id":"r","extra":1}',
    ]
    for data in bad:
        with pytest.raises(InvalidCommand):
            decode_command(data)
    with pytest.raises(InvalidCommand):
        encode_command(StartRun(thread_id="t", agent_id="a", decisions=[{"x": 1}]))


async def test_submit_is_deduplicated_on_a_work_queue(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        client = CommandClient(store.nc)
        cmd = StartRun(thread_id="t1", run_id="r1", agent_id="quick", messages=["hi"])
        first = await client.submit(cmd)
        again = await client.submit(cmd)
        assert (first.run_id, first.thread_id, first.duplicate) == ("r1", "t1", False)
        assert again.duplicate and again.seq == first.seq
        await CommandClient(store.nc).ensure_stream()  # idempotent
        info = await store.nc.jetstream().stream_info(COMMANDS_STREAM)
        assert str(getattr(info.config.retention, "value", info.config.retention)) == "workqueue"
        assert str(getattr(info.config.storage, "value", info.config.storage)) == "file"
        assert info.state.messages == 1
    finally:
        await store.close()


# -- in-process worker -----------------------------------------------------------------------------


async def test_cancel_reaches_a_run_blocked_in_a_tool_live(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    worker = Worker(store, app=worker_app.app, concurrency=2, ack_wait=5)
    watch = Watch(store, "t1")
    try:
        async with asyncio.timeout(30):
            await worker.start()
            client = CommandClient(store.nc)
            await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="held", messages=["go"]))
            await watch.until(lambda w: any(type(e).__name__ == "ToolCallStarted" for sc in w.commits for e in sc.commit.events))
            await client.submit(Cancel(thread_id="t1", run_id="r1", reason="stop"))
            await watch.status_in("r1", {"done"})
            run = fold_commits(watch.commits).runs["r1"]
            assert run.termination.type == "cancelled"
            # the call blocked in `hold` never completed: cancelling the run cancels it
            assert list(run.calls) == ["call_0_0"]
            assert (run.calls["call_0_0"].name, run.calls["call_0_0"].status) == ("hold", "cancelled")
            # a second start on the thread now runs (the queue moved on)
            await client.submit(StartRun(thread_id="t1", run_id="r2", agent_id="quick", messages=["next"]))
            await watch.status_in("r2", {"done"})
        assert worker.stats["termed"] == 0
    finally:
        await watch.close()
        await worker.stop(timeout=2)
        await store.close()


async def test_decide_on_waiting_run_and_continuation_in_order(nats_server: EmbeddedNatsServer) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    worker = Worker(store, app=worker_app.app, concurrency=4, ack_wait=5)
    watch = Watch(store, "t1")
    try:
        async with asyncio.timeout(30):
            await worker.start()
            client = CommandClient(store.nc)
            # submitted back to back: the decision and the continuation wait for their turn
            await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="crashy", messages=["go"]))
            await watch.status_in("r1", {"waiting"})
            decision = {"target_id": "call_2_1", "decision_id": "d1", "action": "resume", "result": {"approved": True}}
            await client.submit(Decide(thread_id="t1", run_id="r1", decisions=[decision]))
            await client.submit(Decide(thread_id="t1", run_id="r1", decisions=[decision], command_id="dup"))
            await client.submit(ContinueRun(thread_id="t1", run_id="r2", agent_id="quick", parent_run_id="r1", messages=["more"]))
            await watch.status_in("r2", {"done"})
        views = fold_commits(watch.commits)
        assert views.runs["r1"].termination.type == "natural_end"
        assert (views.runs["r2"].parent_run_id, views.runs["r2"].thread_id) == ("r1", "t1")
        decided = [e for sc in watch.commits for e in sc.commit.events if type(e).__name__ == "ToolCallDecided"]
        assert len(decided) == 1
    finally:
        await watch.close()
        await worker.stop(timeout=2)
        await store.close()


# -- NATS restart ----------------------------------------------------------------------------------


async def test_nats_restart_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    procs: list[Any] = []
    exec_log = tmp_path / "exec.log"
    store = await JetStreamEventStore.connect(server.url)
    watch = Watch(store, "t1")
    try:
        async with asyncio.timeout(60):
            procs.append(await spawn_worker(server.url, tmp_path, "w1", env={"WORKER_APP_EXEC_LOG": str(exec_log)}, ack_wait=2))
            client = CommandClient(store.nc)
            await client.submit(StartRun(thread_id="t1", run_id="r1", agent_id="held", messages=["go"]))
            await watch.until(lambda w: any(type(e).__name__ == "ToolCallStarted" for sc in w.commits for e in sc.commit.events))
            await watch.close()
            server.stop()
            server.start()  # same port, same data dir
            # release the held call once the worker's subscription is back (request retries)
            while True:
                try:
                    await store.nc.request("worker_app.release.call_0_0", b"", timeout=0.5)
                    break
                except Exception:  # noqa: BLE001 - not reconnected yet: ask again
                    continue
            watch = Watch(store, "t1")
            await watch.status_in("r1", {"done"})
        commits = [sc async for sc in store.read_thread("t1")]
        assert message_list(commits, "t1") == [
            ("user", "go", None, ()),
            ("assistant", "", None, (("call_0_0", "hold", "{}"),)),
            ("tool", "released", "call_0_0", ()),
            ("assistant", "after hold", None, ()),
        ]
        ids = [sc.commit.commit_id for sc in commits]
        assert len(ids) == len(set(ids))
        counts = Counter(type(e).__name__ for sc in commits for e in sc.commit.events)
        assert counts["RunFinished"] == 1 and counts["ToolCallCompleted"] == 1 and counts["ToolCallStarted"] == 1
        assert fold_commits(commits).runs["r1"].termination.type == "natural_end"
        assert [c for _p, c in read_lines(exec_log)] == ["call_0_0"]
    finally:
        await kill_all(procs)
        await watch.close()
        await store.close()
        server.stop()


# -- scale-out -------------------------------------------------------------------------------------


async def test_three_workers_200_runs_over_50_threads(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    threads, per_thread = 50, 4
    store = await JetStreamEventStore.connect(nats_server.url)
    procs: list[Any] = []
    finished: Counter[str] = Counter()
    all_done = asyncio.Event()

    async def count() -> None:
        async for sc in store.follow():
            for e in sc.commit.events:
                if type(e).__name__ == "RunFinished":
                    finished[sc.commit.run_id] += 1
            if len(finished) >= threads * per_thread:
                all_done.set()

    counter = asyncio.get_running_loop().create_task(count())
    try:
        async with asyncio.timeout(80):
            for i in range(3):
                procs.append(await spawn_worker(nats_server.url, tmp_path, f"w{i}", ack_wait=5, concurrency=8))
            client = CommandClient(store.nc)
            await client.ensure_stream()

            async def submit_thread(t: int) -> None:
                for r in range(per_thread):
                    await client.submit(StartRun(thread_id=f"t{t}", run_id=f"t{t}-r{r}", agent_id="quick", messages=[f"m{r}"]))

            await asyncio.gather(*(submit_thread(t) for t in range(threads)))
            await all_done.wait()
        assert all(n == 1 for n in finished.values())
        for t in range(threads):
            commits = [sc async for sc in store.read_thread(f"t{t}")]
            views = fold_commits(commits)
            started = [sc.commit.run_id for sc in commits for e in sc.commit.events if type(e).__name__ == "RunStarted"]
            assert started == [f"t{t}-r{r}" for r in range(per_thread)]  # per-thread order
            for r in range(per_thread):
                run = views.runs[f"t{t}-r{r}"]
                assert run.termination.type == "natural_end", (t, r, run.termination)
            # runs never interleave: each run's commits are contiguous
            order = [sc.commit.run_id for sc in commits]
            assert [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k] == started
    finally:
        counter.cancel()
        await asyncio.gather(counter, return_exceptions=True)
        await kill_all(procs)
        await store.close()
    logs = "".join((tmp_path / f"w{i}.log").read_text() for i in range(3))
    assert "command.rejected" not in logs and "command.failed" not in logs
