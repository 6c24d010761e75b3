"""An undecodable message on an event subject (anyone with `worker` or `gateway` NATS credentials
can publish one) is quarantined by every reader: a `CommitQuarantined` stand-in at its seq, folded
the same way everywhere, counted by OCC; listings, the thread and new runs on it keep working."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from agentlog.eventlog import JetStreamEventStore
from agentlog.eventlog.errors import InvalidCommit
from agentlog.eventlog.events import (
    Commit,
    CommitQuarantined,
    Message,
    MessageAppended,
    RunStarted,
    ThreadCreated,
)
from agentlog.eventlog.quarantine import is_quarantined
from agentlog.eventlog.subjects import event_subject
from agentlog.projections import fold_commits
from agentlog.projections.kv import KVViewStore
from agentlog.projections.rebuild import rebuild
from agentlog.projections.runner import ProjectionRunner

from tests.support import forkserver
from tests.support.topology import Deployment

POISONS = [b"{not json", b'{"v": 99, "commit_id": "x", "thread_id": "t", "ts": 1, "events": []}', b"\x00\xff"]


def _commit(n: int, thread: str, run: str | None, events: list[Any]) -> Commit:
    return Commit(commit_id=f"c{n}", thread_id=thread, run_id=run, ts=1000 + n, events=events)


async def test_every_reader_quarantines_the_same_way(nats_server) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    try:
        await store.append(_commit(0, "t1", None, [ThreadCreated()]), 0)
        await store.append(_commit(1, "t1", "r1", [RunStarted(run_id="r1", agent_id="a")]), 1)
        await js.publish(event_subject("t1", None), POISONS[0])  # seq 3, thread level
        await js.publish(event_subject("t1", "r1"), POISONS[1])  # seq 4, on the run's subject
        await js.publish("agentlog.ev.t1.r1.extra", POISONS[2])  # seq 5, an odd subject of the thread
        # OCC counts the quarantined messages: the thread's version is the last one's seq
        assert await store.thread_version("t1") == 5
        res = await store.append(_commit(2, "t1", "r1", [MessageAppended(message=Message(id="m", role="user"))]), 5)
        assert res.seq == 6

        thread = [sc async for sc in store.read_thread("t1")]
        assert [sc.seq for sc in thread] == [1, 2, 3, 4, 5, 6]
        markers = [sc for sc in thread if is_quarantined(sc.commit)]
        assert [sc.seq for sc in markers] == [3, 4, 5]
        first = markers[0].commit.events[0]
        assert isinstance(first, CommitQuarantined) and first.code == "codec_error"
        assert first.subject == "agentlog.ev.t1._" and first.size == len(POISONS[0])
        assert markers[1].commit.events[0].code == "unsupported_schema_version"  # type: ignore[union-attr]
        assert all(sc.commit.thread_id == "t1" and sc.commit.run_id is None for sc in markers)
        assert all(sc.commit.ts > 0 for sc in markers)
        assert store.quarantine.total == 3

        run = [sc.seq async for sc in store.read_run("r1")]
        assert run == [2, 4, 6]  # the run's subject holds the message quarantined at 4
        async with asyncio.timeout(10):
            followed = []
            async for sc in store.follow("t1"):
                followed.append(sc)
                if sc.seq == 6:
                    break
        assert [sc.commit for sc in followed] == [sc.commit for sc in thread]  # same stand-ins, same time

        by_store = fold_commits(thread)
        assert by_store.threads["t1"].version == 6 and by_store.runs["r1"].last_seq == 6
        assert set(by_store.runs) == {"r1"}  # a quarantined message makes no run

        views = await KVViewStore.open(nc)
        runner = ProjectionRunner(nc, views)
        await runner.open()
        async with asyncio.timeout(20):
            while runner.applied_seq < 6:
                await runner.step()
        assert [seq for seq, _ in runner.skipped] == [3, 4, 5]
        assert await views.get_thread("t1") == by_store.threads["t1"]
        assert await views.get_run("r1") == by_store.runs["r1"]
        await runner.stop()

        result = await rebuild(nc)
        assert result.skipped == 3
        rebuilt = await KVViewStore.open(nc)
        assert await rebuilt.get_thread("t1") == by_store.threads["t1"]
        assert await rebuilt.get_run("r1") == by_store.runs["r1"]
    finally:
        await nc.close()
        await store.close()


async def test_no_writer_may_append_a_quarantine_marker(nats_server) -> None:
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        marker = CommitQuarantined(code="codec_error", reason="forged")
        with pytest.raises(InvalidCommit):
            await store.append(_commit(0, "t1", None, [marker]), 0)
    finally:
        await store.close()


# -- through what users run ------------------------------------------------------------------------


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    hold = tmp_path / "hold"
    hold.mkdir()
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(hold)}}


async def _finished(http: aiohttp.ClientSession, url: str, run_id: str, seq: int) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            async with http.get(f"{url}/v1/runs/{run_id}", params={"min_seq": str(seq)}) as resp:
                view = await resp.json()
            if resp.status == 200 and view["status"] == "done":
                return view
            async with http.get(f"{url}/v1/runs/{run_id}/events", params={"follow": "true"}) as events:
                await events.read()  # ends when the run finishes or pauses


async def _start(http: aiohttp.ClientSession, url: str, thread: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/runs", json={"agent_id": "held", "messages": "go", "thread_id": thread}) as resp:
        assert resp.status == 202, await resp.text()
        return await resp.json()


def _cli(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return forkserver.run([*args, "--nats", deployment.nats_url, "--json"], cwd=os.getcwd(), timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})


async def test_a_poisoned_thread_keeps_working(deployment: Deployment, deployment_options: dict[str, Any]) -> None:
    hold = Path(deployment_options["env"]["SERVE_APP_HOLD_DIR"])
    url = deployment.http_url
    (hold / "poisoned").touch()
    async with aiohttp.ClientSession() as http:
        first = await _start(http, url, "poisoned")
        await _finished(http, url, first["run_id"], first["seq"])
        nc = await nats.connect(deployment.nats_url)
        try:
            js = nc.jetstream()
            bad = (await js.publish(event_subject("poisoned", first["run_id"]), b"\x00 not a commit")).seq
        finally:
            await nc.close()

        for listing in (("runs",), ("threads",)):
            done = _cli(deployment, *listing)
            assert done.returncode == 0, done.stderr
            assert "poisoned" in done.stdout

        async with http.get(f"{url}/v1/threads/poisoned/messages") as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{url}/v1/runs/{first['run_id']}/timeline") as resp:
            assert resp.status == 200, await resp.text()
            timeline = await resp.json()
        shown = [e for g in timeline["steps"] for e in g["events"] if e["type"] == "CommitQuarantined"]
        assert [e["id"] for e in shown] == [f"{bad}:0"], timeline
        assert "QUARANTINED" in shown[0]["summary"]

        # a new run on the thread goes past the quarantined message (docs: commits, quarantine)
        second = await _start(http, url, "poisoned")
        assert second["seq"] > bad
        view = await _finished(http, url, second["run_id"], second["seq"])
        assert view["termination"]["type"] == "natural_end", view

        for run_id in (first["run_id"], second["run_id"]):  # verified replay: the marker changes nothing
            verified = forkserver.run(
                ["replay", run_id, "--verify", "--app", "tests.apps.serve_app:app", "--nats", deployment.nats_url],
                cwd=os.getcwd(), timeout=120, env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(Path(__file__).parents[2]),
                                                   "SERVE_APP_HOLD_DIR": str(hold)})
            assert verified.returncode == 0, verified.stdout + verified.stderr
        async with http.get(f"{url}/v1/threads/poisoned", params={"min_seq": str(second["seq"])}) as resp:
            assert resp.status == 200
            assert len((await resp.json())["run_ids"]) == 2
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
        counted = [line for line in text.splitlines() if line.startswith("agentlog_commits_quarantined_total")]
        assert counted and float(counted[0].split()[-1]) >= 1, text

