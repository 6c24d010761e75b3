"""Retention end to end, as users run it: runs made by a real deployment (`agentlog serve`, and
`agentlog gateway` + `agentlog worker`), archived by the `agentlog retention` command, are gone
from the stream (JetStream says so) and still answer everything: `agentlog replay --verify`, the
timeline and time travel (`state?at=`), the inspector's verify, messages, listings. A new run on
an archived thread continues it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.js.api import ObjectMeta

from agentlog.eventlog.embedded.server import EmbeddedNatsServer
from agentlog.eventlog.events import RunFinished
from agentlog.eventlog.jetstream.archive import ARCHIVE_BUCKET, marker_of
from agentlog.eventlog.jetstream.store import JetStreamEventStore
from agentlog.eventlog.subjects import EVENTS_STREAM, thread_filter

from tests.support import forkserver
from tests.support.topology import PYTHONPATH, REPO, TOPOLOGIES, Deployment, Kind, deploy

LIMIT = 90


@pytest.fixture
def deployment_options(tmp_path: Path) -> dict[str, object]:
    hold = tmp_path / "hold"
    hold.mkdir()
    for thread in ("ta", "tb"):
        (hold / thread).touch()  # serve_app's `hold` tool returns at once on these threads
    return {"app": "tests.apps.serve_app:app", "env": {"SERVE_APP_HOLD_DIR": str(hold)}}


def agentlog(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as users run it (its own process, forked from the fork server: tests/support/forkserver.py)."""
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}
    return forkserver.run(args, env=env, cwd=str(REPO), timeout=LIMIT)


async def run_to_end(http: aiohttp.ClientSession, store: JetStreamEventStore, thread_id: str) -> str:
    async with http.post("/v1/runs", json={"agent_id": "held", "messages": "go", "thread_id": thread_id}) as r:
        assert r.status == 202, await r.text()
        run_id = (await r.json())["run_id"]
    async for sc in store.follow(thread_id):
        if sc.commit.run_id == run_id and any(isinstance(e, RunFinished) for e in sc.commit.events):
            return str(run_id)
    raise AssertionError("follow ended")


async def get(http: aiohttp.ClientSession, path: str) -> Any:
    async with http.get(path) as r:
        assert r.status == 200, f"{path}: {r.status} {await r.text()}"
        return await r.json()


async def views(http: aiohttp.ClientSession, thread_id: str, run_id: str, at: str) -> dict[str, Any]:
    """What a user sees of a thread and run through the API."""
    timeline = await get(http, f"/v1/runs/{run_id}/timeline")
    return {
        "timeline": timeline,
        "timeline_to": await get(http, f"/v1/runs/{run_id}/timeline?to={at}"),
        "state_at": await get(http, f"/v1/threads/{thread_id}/state?at={at}"),
        "messages": await get(http, f"/v1/threads/{thread_id}/messages"),
    }


async def stream_count(store: JetStreamEventStore, subject_filter: str) -> int:
    body = json.dumps({"subjects_filter": subject_filter}).encode()
    reply = await store.nc.request(f"$JS.API.STREAM.INFO.{EVENTS_STREAM}", body, timeout=5)
    return sum((json.loads(reply.data)["state"].get("subjects") or {}).values())


async def test_archived_runs_stay_replayable_through_cli_and_api(deployment: Deployment) -> None:
    store = await JetStreamEventStore.connect(deployment.nats_url)
    try:
        async with asyncio.timeout(LIMIT), aiohttp.ClientSession(deployment.http_url) as http:
            run_a = await run_to_end(http, store, "ta")
            run_b = await run_to_end(http, store, "ta")  # two runs on one thread
            history = [sc async for sc in store.read_thread("ta")]
            at = f"{history[2].seq}:0"
            before = await views(http, "ta", run_a, at)
            before_b = await get(http, f"/v1/runs/{run_b}/timeline")
            cli_before = [agentlog("replay", run_a, *to, "--json", "--nats", deployment.nats_url)
                          for to in ((), ("--to", at))]
            assert all(r.returncode == 0 for r in cli_before), [r.stderr for r in cli_before]
            assert await stream_count(store, thread_filter("ta")) == len(history)

            dry = agentlog("retention", "--older-than", "0", "--dry-run", "--json", "--nats", deployment.nats_url)
            assert dry.returncode == 0, dry.stderr
            assert [json.loads(line)["result"] for line in dry.stdout.splitlines()] == ["due"]
            assert await stream_count(store, thread_filter("ta")) == len(history)

            done = agentlog("retention", "--older-than", "0", "--json", "--nats", deployment.nats_url)
            assert done.returncode == 0, done.stderr
            outcome = json.loads(done.stdout)
            assert (outcome["thread_id"], outcome["result"], outcome["removed"]) == ("ta", "archived", len(history))
            assert await stream_count(store, thread_filter("ta")) == 1  # only the marker is left

            for run in (run_a, run_b):
                replay = agentlog("replay", run, "--verify", "--app", "tests.apps.serve_app:app", "--nats", deployment.nats_url)
                assert replay.returncode == 0, replay.stdout + replay.stderr
            cli_after = [agentlog("replay", run_a, *to, "--json", "--nats", deployment.nats_url)
                         for to in ((), ("--to", at))]
            assert [r.stdout for r in cli_after] == [r.stdout for r in cli_before]  # CLI timeline, time travel
            after = await views(http, "ta", run_a, at)
            # the thread's version is now its marker's (the one commit archiving added)
            assert after["state_at"].pop("version") == history[-1].seq + 1
            before["state_at"].pop("version")
            assert after == before
            assert await get(http, f"/v1/runs/{run_b}/timeline") == before_b
            async with http.post(f"/v1/runs/{run_a}/verify", json={}) as r:  # the inspector's verify
                answer = await r.json()
                if deployment.kind == "serve":
                    assert (r.status, answer["ok"]) == (200, True), answer
                else:  # a gateway runs no app: verify is the CLI's (checked above)
                    assert (r.status, answer["code"]) == (409, "verify_unavailable"), answer
            marker_seq = history[-1].seq + 1
            listed = await get(http, f"/v1/threads?min_seq={marker_seq}")
            assert "ta" in [t["thread_id"] for t in listed["threads"]]
            thread = await get(http, f"/v1/threads/ta?min_seq={marker_seq}")
            assert thread["metadata"]["agentlog.archived"]["upto"] == history[-1].seq
            assert (await get(http, f"/v1/runs/{run_a}"))["status"] == "done"

            # a new run continues the archived thread: its history is all there
            run_c = await run_to_end(http, store, "ta")
            messages = await get(http, "/v1/threads/ta/messages")
            assert len(messages["messages"]) > len(before["messages"]["messages"])
            assert messages["messages"][: len(before["messages"]["messages"])] == before["messages"]["messages"]
            replay = agentlog("replay", run_c, "--verify", "--app", "tests.apps.serve_app:app", "--nats", deployment.nats_url)
            assert replay.returncode == 0, replay.stdout + replay.stderr

            # a corrupted archive is caught by its checksum, never read as a different history
            obs = await store.nc.jetstream().object_store(ARCHIVE_BUCKET)
            info = await obs.get_info("ta")
            data = bytes((await obs.get("ta")).data or b"")
            await obs.put("ta", data.replace(b'"go"', b'"GO"'), meta=ObjectMeta(name="ta", headers=info.headers))
            replay = agentlog("replay", run_a, "--json", "--nats", deployment.nats_url)
            assert replay.returncode == 1 and "error [archive_corrupt]" in replay.stderr, replay.stderr
            assert "checksum" in replay.stderr
            await obs.delete("ta")  # and a lost one, through the API: a typed error, not a short history
            async with http.get(f"/v1/runs/{run_a}/timeline") as r:
                assert (r.status, (await r.json())["code"]) == (500, "archive_corrupt")
    finally:
        await store.close()


@pytest.mark.parametrize("command", ["serve", "gateway", "worker"])
async def test_a_stream_whose_limits_drop_commits_is_refused_at_start(command: str, nats_server: EmbeddedNatsServer) -> None:
    """Every process of both topologies refuses such a stream, with the fix in its one error line."""
    store = await JetStreamEventStore.connect(nats_server.url)
    try:
        config = {**store.desired_stream_config(), "max_age": 30 * 86_400 * 10**9}
        await store.nc.request(f"$JS.API.STREAM.UPDATE.{EVENTS_STREAM}", json.dumps(config).encode(), timeout=5)
    finally:
        await store.close()
    args = ["--port", "0", "--tokens", ""] if command != "worker" else []
    done = await asyncio.to_thread(agentlog, command, "--nats", nats_server.url, "--app", "tests.apps.serve_app:app", *args)
    assert done.returncode == 1
    assert "error [lossy_stream_limits]" in done.stderr and "max_age" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", TOPOLOGIES)
async def test_the_server_policy_archives_finished_threads_and_they_stay_replayable(
        kind: Kind, tmp_path: Path) -> None:
    """`--archive-after` (here AGENTLOG_ARCHIVE_AFTER=0, a pass every 0.2 s) on `serve` / `gateway`."""
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "tp").touch()
    env = {"SERVE_APP_HOLD_DIR": str(hold), "AGENTLOG_ARCHIVE_AFTER": "0", "AGENTLOG_ARCHIVE_INTERVAL": "0.2"}
    with deploy(kind, tmp_path / "d", app="tests.apps.serve_app:app", env=env) as running:
        store = await JetStreamEventStore.connect(running.nats_url)
        try:
            async with asyncio.timeout(LIMIT), aiohttp.ClientSession(running.http_url) as http:
                run_a = await run_to_end(http, store, "tp")
                count = len([sc async for sc in store.read_thread("tp")])
                first = await archived(store, "tp")
                replay = agentlog("replay", run_a, "--verify", "--app", "tests.apps.serve_app:app", "--nats", running.nats_url)
                assert replay.returncode == 0, replay.stdout + replay.stderr
                timeline = await get(http, f"/v1/runs/{run_a}/timeline")
                assert timeline["run_id"] == run_a and timeline["steps"]
                # a new run continues the thread; once it is finished it is archived again, whole
                run_b = await run_to_end(http, store, "tp")
                second = await archived(store, "tp", after=first)
                seqs = [sc.seq async for sc in store.read_thread("tp")]
                assert seqs == sorted(seqs) and len(seqs) > count + 1 and seqs[-1] == second
                assert {sc.commit.run_id async for sc in store.read_thread("tp")} >= {run_a, run_b}
        finally:
            await store.close()


async def archived(store: JetStreamEventStore, thread_id: str, after: int = 0) -> int:
    """Wait until the thread's archive marker (one past `after`) is in the log and the stream
    holds nothing of the thread but it: follow the thread for the marker, then ask JetStream."""
    async for sc in store.follow(thread_id, after):
        if marker_of(sc.commit) is not None:
            break
    while await stream_count(store, thread_filter(thread_id)) != 1:
        await asyncio.sleep(0.05)  # the purge follows the marker: a bounded wait for that condition
    return sc.seq
